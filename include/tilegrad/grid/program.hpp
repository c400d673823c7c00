// The program context a kernel receives: its id on the launch grid and the grid's extent
// (Triton's tl.program_id / tl.num_programs).
#pragma once

#include "tilegrad/core/config.hpp"

#include <array>
#include <concepts>
#include <cstdint>
#include <limits>
#include <source_location>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace tilegrad {

/// Grid extents of a launch: 1 to 3 axes, each 0 or more (a grid with an extent 0 has no program).
/// Extents take any integer type (a size of a tensor is int64): one past 2^31 - 1 throws
/// std::invalid_argument naming the axis, when the grid is made; a negative one throws at launch.
struct grid {
  std::array<int, 3> dims{1, 1, 1};
  int rank = 1;

  grid() = default;
  template <std::integral X>
  grid(X x) : dims{extent(x, 0), 1, 1}, rank(1) {} // NOLINT: launch(n, ...) reads well
  template <std::integral X, std::integral Y>
  grid(X x, Y y) : dims{extent(x, 0), extent(y, 1), 1}, rank(2) {}
  template <std::integral X, std::integral Y, std::integral Z>
  grid(X x, Y y, Z z) : dims{extent(x, 0), extent(y, 1), extent(z, 2)}, rank(3) {
    // (Two int extents multiply within int64; three may not, and size() wrapped to a negative
    // count: a launch that ran no program and said nothing.)
    std::int64_t const xy = std::int64_t{dims[0]} * dims[1];
    if (xy > 0 && dims[2] > 0 && xy > std::numeric_limits<std::int64_t>::max() / dims[2])
      throw std::invalid_argument("tilegrad::grid: (" + std::to_string(dims[0]) + ", " +
                                  std::to_string(dims[1]) + ", " + std::to_string(dims[2]) +
                                  ") programs are more than a 64-bit count holds");
  }

  std::int64_t size() const {
    return std::int64_t{dims[0]} * dims[1] * dims[2];
  }

private:
  template <class I>
  static int extent(I n, int axis) {
    static_assert(!std::is_same_v<I, bool>, "tilegrad::grid: an extent is a number of programs");
    if (!std::in_range<int>(n))
      throw std::invalid_argument("tilegrad::grid: extent " + std::to_string(axis) + " is " +
                                  std::to_string(n) + ", outside the int range of a grid axis");
    return static_cast<int>(n);
  }
};

/// One program of a launch. Programs of one launch run in any order, possibly in parallel.
class program {
public:
  program(std::array<int, 3> id, std::array<int, 3> num) : id_(id), num_(num) {}

  /// @pre 0 <= axis <= 2 (else std::out_of_range naming the program and the line, as Triton
  /// refuses another axis)
  int program_id(int axis = 0, std::source_location where = std::source_location::current()) const {
    return id_[checked_axis(axis, "program_id", where)];
  }
  int num_programs(int axis = 0,
                   std::source_location where = std::source_location::current()) const {
    return num_[checked_axis(axis, "num_programs", where)];
  }

  /// Linear index of this program on its grid (axis 0 fastest).
  std::int64_t linear_id() const {
    return id_[0] + std::int64_t{num_[0]} * (id_[1] + std::int64_t{num_[1]} * id_[2]);
  }

  /// "program (x, y, z)" for error messages.
  TILEGRAD_MACHINERY_MEMBER std::string describe() const
#if TILEGRAD_MACHINERY_BODIES
  {
    return "program (" + std::to_string(id_[0]) + ", " + std::to_string(id_[1]) + ", " +
           std::to_string(id_[2]) + ")";
  }
#else
  ;
#endif

private:
  std::size_t checked_axis(int axis, char const* what, std::source_location const& where) const {
    if (static_cast<unsigned>(axis) > 2u) [[unlikely]]
      axis_error(axis, what, where);
    return static_cast<std::size_t>(axis);
  }
  [[noreturn]] void axis_error(int axis, char const* what,
                               std::source_location const& where) const {
    throw std::out_of_range(std::string("tilegrad: ") + what + "(" + std::to_string(axis) +
                            "): a grid has axes 0, 1 and 2 (" + describe() + ", at " +
                            where.file_name() + ":" + std::to_string(where.line()) + ")");
  }

  std::array<int, 3> id_;
  std::array<int, 3> num_;
};

namespace detail {
/// The program running on this thread (null outside a launch): lets memory operations name
/// the program in their errors without the kernel passing it along.
inline program const*& current_program() {
  thread_local program const* p = nullptr;
  return p;
}

struct access_hooks; // memory/tracking.hpp

/// The access hooks of the program running on this thread: null in a plain launch, where loads
/// and stores take their fast path; set, they check bounds whatever checked() says, and record
/// the accesses of a launch that checks for races. One pointer read per load or store call.
inline access_hooks*& current_hooks() {
  thread_local access_hooks* h = nullptr;
  return h;
}

/// Sets the current program, and its access hooks (none by default: a launch nested in a
/// tracked program is not recorded as part of it), for the lifetime of the guard.
struct program_scope {
  program const* saved;
  access_hooks* saved_hooks;
  explicit program_scope(program const& p, access_hooks* hooks = nullptr)
      : saved(current_program()), saved_hooks(current_hooks()) {
    current_program() = &p;
    current_hooks() = hooks;
  }
  ~program_scope() {
    current_program() = saved;
    current_hooks() = saved_hooks;
  }
  program_scope(program_scope const&) = delete;
  program_scope& operator=(program_scope const&) = delete;
};
} // namespace detail

} // namespace tilegrad
