// The program context a kernel receives: its id on the launch grid and the grid's extent
// (Triton's tl.program_id / tl.num_programs).
#pragma once

#include "tilegrad/core/config.hpp"
#include "tilegrad/core/reference.hpp"

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

/// A kernel narrowing a float64 value to float (to<float> of a double tile) inside a float64
/// reference would give the reference float32 round-off, and fail the checks of a correct
/// backward with a wrong diagnosis (measured: "the reference disagrees with forward mode" for a
/// softmax written with Triton's `.to(tl.float32)` spelled to<float>). Throws, naming the program
/// and the line, outside nothing: the fast path and plain double launches narrow as written.
TILEGRAD_MACHINERY void refuse_float64_narrowing(std::source_location const& where)
#if TILEGRAD_MACHINERY_BODIES
{
  float64_run const* const run = float64_reference();
  if (!run)
    return;
  program const* const p = current_program();
  throw std::invalid_argument(
      std::string("tilegrad::to<float> (") + (p ? p->describe() + ", " : std::string()) + "at " +
      where.file_name() + ":" + std::to_string(where.line()) +
      "): the kernel narrows a float64 value to float inside " + run->who +
      ", which promises float64 arithmetic: its results would carry float32 round-off, and a "
      "correct backward would fail. Name the kernel's float types through its mode: "
      "to<tg::fp32<T>>(x) (Triton's tl.float32: float on the fast path, double in the "
      "reference), and to<tg::fp64<T>>(x) for float64 intermediates");
}
#else
    ;
#endif

/// to<bf16> of a float64 value in taylor_test's runs: the rounding makes the float64 objective a
/// staircase of steps 2^-8 |x|, whose central differences are anything (measured: residuals 1.5
/// to 155 times <g, u> for a correct gradient). Triton's p.to(v.dtype) is to<T>(p): bf16 where
/// the tensors are bf16, nothing at float64. Throws, naming the program and the line.
TILEGRAD_MACHINERY void refuse_float64_bf16(std::source_location const& where)
#if TILEGRAD_MACHINERY_BODIES
{
  float64_run const* const run = float64_reference();
  if (!run || !run->refuse_bf16)
    return;
  program const* const p = current_program();
  throw std::invalid_argument(
      std::string("tilegrad::to<bf16> (") + (p ? p->describe() + ", " : std::string()) + "at " +
      where.file_name() + ":" + std::to_string(where.line()) +
      "): the kernel rounds a float64 value to bf16 inside " + run->who +
      ": the rounding makes the objective a staircase, whose central differences say nothing of "
      "the gradient. Round to the tensors' type, to<T>(x) (Triton's x.to(v.dtype)): bf16 where "
      "the kernel runs on bf16 tensors, nothing at float64");
}
#else
    ;
#endif

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
