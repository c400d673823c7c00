// tg::loop: a counted loop whose body updates the values it carries, Triton's
// `for i in range(begin, end, step)` with loop-carried variables. On the fast path and in forward
// mode it is the plain for loop; in reverse mode (ad/loop.hpp) it is a checkpointed scan: the
// tape keeps the carried values of each iteration, not each iteration's records, and the sweep
// runs one iteration at a time again.
//
//   auto m = full<F, BQ>(-inf);  auto l = zeros<F, BQ>();  auto acc = zeros<F, BQ, D>();
//   loop(0, n_k, BK, m, l, acc, [=](int k0, auto& m, auto& l, auto& acc) { ... });
//   // m, l and acc hold their values after the last iteration
#pragma once

#include "tilegrad/core/config.hpp"

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <source_location>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace tilegrad {

namespace detail {

/// The loop's first index, and where the loop is written (the default argument of an implicit
/// conversion is taken at the call: `loop(0, ...)` records the caller's line).
struct loop_begin {
  std::int64_t value;
  std::source_location where;
  template <std::integral I>
  loop_begin(I v, std::source_location w = std::source_location::current()) // NOLINT: implicit
      : value(static_cast<std::int64_t>(v)), where(w) {
    static_assert(!std::is_same_v<I, bool>, "tilegrad::loop: begin is an index");
    if (!std::in_range<std::int64_t>(v))
      value = std::numeric_limits<std::int64_t>::max(); // refused with end and step (to_index)
  }
};

/// A bound or step of a loop as the int index the body takes: sizes come as int64
/// (x.size(1)), and one past the int range would make the loop's trip count silently wrong.
template <class I>
int to_index(I v, char const* what, std::source_location const& where) {
  static_assert(std::is_integral_v<I> && !std::is_same_v<I, bool>,
                "tilegrad::loop: begin, end and step are integers");
  if (!std::in_range<int>(v))
    throw std::invalid_argument(std::string("tilegrad::loop at ") + where.file_name() + ":" +
                                std::to_string(where.line()) + ": " + what + " " +
                                std::to_string(v) + " is outside the int range of a loop index");
  return static_cast<int>(v);
}

/// A loop of step 0 never ends: refused, naming the loop.
[[noreturn]] TILEGRAD_NOINLINE inline void zero_step(std::source_location const& where) {
  throw std::invalid_argument(std::string("tilegrad::loop at ") + where.file_name() + ":" +
                              std::to_string(where.line()) + ": the step is 0");
}

/// The number of iterations of `for (i = begin; i < end (i > end for step < 0); i += step)`.
inline int trip_count(int begin, int end, int step, std::source_location const& where) {
  if (step == 0)
    zero_step(where);
  std::int64_t const span = step > 0 ? std::int64_t{end} - begin : std::int64_t{begin} - end;
  std::int64_t const s = step > 0 ? step : -std::int64_t{step};
  return span <= 0 ? 0 : static_cast<int>((span + s - 1) / s);
}

/// A tile of adjoint<T>: carried through a loop, it is checkpointed in reverse mode.
template <class C>
inline constexpr bool is_adjoint_tile_v = requires {
  typename C::shape_type;
  typename C::value_type::adjoint_tag;
};

/// Whether the body takes the carried value at position J by value or const reference (it
/// would accept an rvalue there): its updates would be lost.
template <class Body, std::size_t J, class Carried, std::size_t... I>
constexpr bool takes_by_value(std::index_sequence<I...>) {
  return std::is_invocable_v<Body const&, int,
                             std::conditional_t<I == J, std::tuple_element_t<I, Carried>&&,
                                                std::tuple_element_t<I, Carried>&>...>;
}
template <class Body, class Carried, std::size_t... J>
constexpr bool any_by_value(std::index_sequence<J...> s) {
  return (takes_by_value<Body, J, Carried>(s) || ...);
}

/// Whether the first sizeof...(I) arguments (all but the body) are non-const lvalues.
template <class... A, std::size_t... I>
constexpr bool carried_are_variables(std::index_sequence<I...>) {
  using all = std::tuple<A...>;
  return ((std::is_lvalue_reference_v<std::tuple_element_t<I, all>> &&
           !std::is_const_v<std::remove_reference_t<std::tuple_element_t<I, all>>>)&&...);
}

} // namespace detail

template <class T, class Off>
struct ptr_tile; // memory/pointer.hpp

namespace ad {
// Reverse mode of tg::loop (ad/loop.hpp).
template <class Body, class... C>
void checkpointed_loop(int begin, int end, int step, Body const& body,
                       std::source_location const& where, C&... carried);
} // namespace ad

namespace detail {

template <class C>
inline constexpr bool is_pointer_tile_v = false;
template <class T, class Off>
inline constexpr bool is_pointer_tile_v<ptr_tile<T, Off>> = true;

template <class Body, class... C>
TILEGRAD_INLINE void run_loop(int first, std::source_location const& where, int end, int step,
                              Body const& body, C&... carried) {
  static_assert(std::is_invocable_v<Body const&, int, C&...>,
                "tilegrad::loop: the body must be callable as body(int index, carried&...), "
                "with the carried values in the order given, and const (not a mutable lambda)");
  static_assert(std::is_void_v<std::invoke_result_t<Body const&, int, C&...>>,
                "tilegrad::loop: the body updates the carried values in place and returns nothing");
  static_assert(!any_by_value<Body, std::tuple<C...>>(std::index_sequence_for<C...>{}),
                "tilegrad::loop: take every carried value by reference (auto& acc): a value "
                "taken by copy or const& would not carry its update to the next iteration");
  // (In every mode, so that a kernel compiles in every mode or in none.)
  static_assert(!(is_pointer_tile_v<C> || ...),
                "tilegrad::loop: a tile of pointers cannot be carried (in reverse mode the loop "
                "keeps the carried values of every iteration, and a pointer tile's offsets may "
                "refer to the kernel's locals): carry the integer offset instead (k0) and make "
                "the pointers in the body (a + k0 * a.stride(1) + offs), or carry a block "
                "pointer and advance it");
  if constexpr ((is_adjoint_tile_v<C> || ...)) {
    ad::checkpointed_loop(first, end, step, body, where, carried...);
  } else {
    if (step == 0) [[unlikely]]
      zero_step(where);
    // One call site, so that the body is inlined as a loop body written out would be. (The
    // index in 64 bits: i + step past the int range ends the loop, as the trip count says.)
    for (std::int64_t i = first; step > 0 ? i < end : i > end; i += step)
      body(static_cast<int>(i), carried...);
  }
}

/// The N-th of the arguments. (Not a std::tuple of them: its assignment operators ask whether
/// the body is assignable, and g++ then no longer takes the closure for trivially copyable,
/// which the capture check of the reverse mode needs, ad/loop.hpp.)
template <std::size_t N, class A0, class... A>
TILEGRAD_INLINE constexpr auto&& nth(A0&& a0, A&&... a) {
  if constexpr (N == 0)
    return std::forward<A0>(a0);
  else
    return nth<N - 1>(std::forward<A>(a)...);
}

template <std::size_t... I, class... A>
TILEGRAD_INLINE void split_loop(int first, std::source_location const& where, int end, int step,
                                std::index_sequence<I...>, A&&... args) {
  run_loop(first, where, end, step, nth<sizeof...(I)>(args...), nth<I>(args...)...);
}

} // namespace detail

/// loop(begin, end, step, carried..., body): runs body(i, carried...) for
/// i = begin, begin + step, ... while i < end (i > end for a negative step); the body updates the
/// carried values (tiles, numbers, block pointers) in place, taking each as `auto&`.
///
/// In reverse mode the body runs again in the reverse sweep, after the kernel returned: it must
/// capture by value ([=]; tiles, tensors and block pointers are small handles or values), may
/// load but not store, and every value it changes from one iteration to the next must be among
/// the carried ones. See docs/reverse_mode.md, "Loops in bounded memory".
/// begin, end and step may be any integers (sizes are int64); each must fit the int index the
/// body takes (else std::invalid_argument naming the loop).
template <class End, class Step, class... A>
TILEGRAD_INLINE void loop(detail::loop_begin begin, End end, Step step, A&&... args) {
  static_assert(sizeof...(A) >= 1,
                "tilegrad::loop: write loop(begin, end, step, carried..., body)");
  static_assert(detail::carried_are_variables<A...>(std::make_index_sequence<sizeof...(A) - 1>{}),
                "tilegrad::loop: the carried values are variables (non-const lvalues) that the "
                "loop updates; the body comes last");
  detail::split_loop(detail::to_index(begin.value, "begin", begin.where), begin.where,
                     detail::to_index(end, "end", begin.where),
                     detail::to_index(step, "step", begin.where),
                     std::make_index_sequence<sizeof...(A) - 1>{}, args...);
}

} // namespace tilegrad
