// Checked memory access: the switch, and the error an out-of-bounds access throws (naming the
// program, the tensor, the element, the extent and the source line of the load or store), and
// the error a race between two programs throws.
#pragma once

#include "tilegrad/core/config.hpp"
#include "tilegrad/grid/program.hpp"
#include "tilegrad/memory/access_error.hpp"
#include "tilegrad/memory/tensor.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <source_location>
#include <stdexcept>
#include <string>

namespace tilegrad {

namespace detail {
inline std::atomic<bool>& checked_flag() {
#if defined(TILEGRAD_CHECKED)
  static std::atomic<bool> on{TILEGRAD_CHECKED != 0};
#elif defined(NDEBUG)
  static std::atomic<bool> on{false};
#else
  static std::atomic<bool> on{true};
#endif
  return on;
}
} // namespace detail

/// Whether loads, stores and atomics check their addresses: on by default in debug builds
/// (without NDEBUG), off in release builds; TILEGRAD_CHECKED=0/1 sets the default.
inline bool checked() { return detail::checked_flag().load(std::memory_order_relaxed); }
inline void set_checked(bool on) { detail::checked_flag().store(on, std::memory_order_relaxed); }

/// Turns checking on (or off) for a scope.
class checked_scope {
public:
  explicit checked_scope(bool on = true) : saved_(checked()) { set_checked(on); }
  ~checked_scope() { set_checked(saved_); }
  checked_scope(checked_scope const&) = delete;
  checked_scope& operator=(checked_scope const&) = delete;

private:
  bool saved_;
};

namespace detail {

TILEGRAD_MACHINERY std::string where_string(std::source_location const& loc)
#if TILEGRAD_MACHINERY_BODIES
{
  return std::string(loc.file_name()) + ":" + std::to_string(loc.line());
}
#else
;
#endif

TILEGRAD_MACHINERY std::string tensor_label(char const* name)
#if TILEGRAD_MACHINERY_BODIES
{
  return name && *name ? std::string("'") + name + "'" : std::string("(unnamed)");
}
#else
;
#endif

/// Throws access_error for an access of `what` ("load", "store", ...) at `offset` elements
/// from the start of the tensor whose layout is t, which lies outside it.
[[noreturn]] TILEGRAD_MACHINERY void out_of_bounds_of(tensor<std::byte const> const& t,
                                                      std::int64_t offset, char const* what,
                                                      std::source_location const& loc)
#if TILEGRAD_MACHINERY_BODIES
{
  program const* p = current_program();
  std::string const prog = p ? p->describe() : std::string("host code");
  std::string const elem = t.coordinates(offset);
  std::string const head = "tilegrad: out-of-bounds " + std::string(what) + " by " + prog +
                           ": tensor " + tensor_label(t.name()) + " has shape " + t.shape_string();
  if (offset >= 0 && t.element_at_or_before(offset) >= 0) {
    // Between two elements of the view (a stride left out of an offset).
    std::string strides = "(";
    for (int a = 0; a < t.rank(); ++a)
      strides += (a ? ", " : "") + std::to_string(t.stride(a));
    throw access_error(head + " and strides " + strides + "), offset " + std::to_string(offset) +
                           " lies between its elements (after element " + elem +
                           "): was an offset not multiplied by its stride? At " +
                           where_string(loc),
                       prog, t.name(), elem, loc);
  }
  throw access_error(head + ", element " + elem + " (offset " + std::to_string(offset) +
                         ") is outside it, at " + where_string(loc),
                     prog, t.name(), elem, loc);
}
#else
;
#endif

/// out_of_bounds_of for tensor t; only the layout matters, so one function serves every type.
template <class T>
[[noreturn]] void out_of_bounds(tensor<T> const& t, std::int64_t offset, char const* what,
                                std::source_location const& loc) {
  out_of_bounds_of(tensor<std::byte const>(reinterpret_cast<std::byte const*>(t.data()), t.rank(),
                                           t.shape(), t.strides(), t.name()),
                   offset, what, loc);
}

/// Checks one offset (when checking is on).
template <class T>
TILEGRAD_INLINE void check_offset(tensor<T> const& t, std::int64_t offset, char const* what,
                                  std::source_location const& loc) {
  if (!t.contains(offset)) out_of_bounds(t, offset, what, loc);
}

/// Checks a contiguous run of n offsets from e; reports the first one outside.
template <class T>
TILEGRAD_INLINE void check_run(tensor<T> const& t, std::int64_t e, int n, char const* what,
                               std::source_location const& loc) {
  if (e < 0 || e + n > t.span() || !t.is_contiguous())
    for (int l = 0; l < n; ++l) check_offset(t, e + l, what, loc);
}

} // namespace detail
} // namespace tilegrad
