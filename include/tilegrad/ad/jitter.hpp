// Rounding jitter of a float64 reference run (check_backward's second look). A hand-written
// backward recomputes what the forward computed (scores q k^T, exp(s - lse)) with roundings of
// its own, which do not cancel against the values the forward saved, as the reference's own
// roundings cancel against each other. In a jittered run every value the forward computes
// carries an estimate of the rounding error a float computation of it has (u sum |a||b| for a
// dot, u |y| for a rounded elementwise result, what its operands' errors move it by), and every
// operation that reads a value reads it moved by a random fraction of that error, drawn anew for
// each reader: how far the gradient moves then is how far roundings that do not cancel move it.
// Float64 adjoint tiles only; off unless rounding_jitter() is set (ad/context.hpp).
#pragma once

#include "tilegrad/ad/context.hpp"
#include "tilegrad/ad/expr.hpp"
#include "tilegrad/ad/tape.hpp"
#include "tilegrad/tile/eval.hpp"

#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace tilegrad::ad {

/// Whether adjoint tiles of T record with rounding jitter on this thread now.
template <class T>
inline bool jitter_active() {
  if constexpr (std::is_same_v<T, double>)
    return rounding_jitter().seed != 0 && current_state() != nullptr;
  else
    return false;
}

/// Whether values move by their whole errors, each once (jitter_settings::whole): a value's error
/// is then its own rounding only, its operands' having moved it already.
inline bool whole_moves() { return rounding_jitter().whole; }

/// The error estimates of values on the tape (null: none, an exact value).
inline double const* errors_of(tape& tp, double const* values) {
  return static_cast<double const*>(tp.errors_of(values));
}

/// n values moved by a random fraction of their errors (times the settings' scale: a reader's
/// move), or (Sign) by their errors up or down at random (how an error estimate is propagated), on
/// the tape and keeping those errors; the values themselves where they have none.
template <bool Sign = false>
inline double const* jittered(tape& tp, double const* values, int n) {
  double const* e = errors_of(tp, values);
  if (!e)
    return values;
  double const scale = rounding_jitter().scale;
  // Whole moves: one draw per value, which every reader reads (a float computation rounds a
  // value once); kept on the tape beside the errors, under the values' address plus one (never
  // another values' address: they are 8-byte aligned).
  bool const whole = !Sign && rounding_jitter().whole;
  void const* const key = reinterpret_cast<char const*>(values) + 1;
  if (whole)
    if (void const* moved = tp.errors_of(key))
      return static_cast<double const*>(moved);
  double* v = tp.alloc<double>(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    double const r = jitter_draw();
    double const s = whole ? (r < 0 ? -scale : scale) : scale * r;
    v[i] = values[i] + (Sign ? (r < 0 ? -e[i] : e[i]) : s * e[i]);
  }
  tp.set_errors(v, e);
  if (whole)
    tp.set_errors(key, v);
  return v;
}

/// Records e (n elements, made finite: an error of inf or NaN is none) as the errors of values.
inline void keep_errors(tape& tp, double const* values, double* e, int n) {
  bool any = false;
  for (int i = 0; i < n; ++i) {
    if (!std::isfinite(e[i]))
      e[i] = 0;
    any |= e[i] != 0;
  }
  if (any)
    tp.set_errors(values, e);
}

/// The error of y = f(x): |f(x + moved) - f(x)| (the operands' errors, moved by +-1 at random)
/// plus unit |y| where f rounds (not in the lanes `exact` marks, if given); written over `moved`.
inline void errors_from(double* moved, double const* y, int n, double unit,
                        bool const* exact = nullptr) {
  for (int i = 0; i < n; ++i)
    moved[i] = std::abs(moved[i] - y[i]) + (exact && exact[i] ? 0.0 : unit) * std::abs(y[i]);
}

// Whether an expression rounds: an elementwise op on floating values other than a selection, a
// sign or a bf16 rounding (which the kernel makes where the forward does).
template <class Op>
inline constexpr bool exact_op =
    std::is_same_v<Op, ops::abs_op> || std::is_same_v<Op, ops::neg_op> ||
    std::is_same_v<Op, ops::where_op> || std::is_same_v<Op, ops::maximum_op> ||
    std::is_same_v<Op, ops::minimum_op> || std::is_same_v<Op, ops::round_bf16_op> ||
    !Op::differentiable;
template <class N>
struct rounds : std::false_type {};
template <class E, class S>
struct rounds<broadcast_node<E, S>> : rounds<E> {};
template <class E, class S>
struct rounds<reshape_node<E, S>> : rounds<E> {};
template <class E, int... P>
struct rounds<permute_node<E, P...>> : rounds<E> {};
template <class To, class E>
struct rounds<convert_node<To, E>> : rounds<E> {};
template <class Op, class... Es>
struct rounds<map_node<Op, Es...>>
    : std::bool_constant<(!exact_op<Op> && is_floating_v<value_of_t<map_node<Op, Es...>>>) ||
                         (rounds<Es>::value || ...)> {};

/// Whether x times or over a power of two (or zero) is exact in float: x a power of two or zero.
inline bool power_of_two_or_zero(double x) {
  // On the bits (frexp, a library call, was a twentieth of a check's time): a normal number
  // with no fraction bits, or a subnormal one with a single bit; not infinity or NaN.
  std::uint64_t const b = std::bit_cast<std::uint64_t>(x) & ~(std::uint64_t{1} << 63);
  std::uint64_t const exponent = b >> 52, fraction = b & ((std::uint64_t{1} << 52) - 1);
  if (exponent == 0x7ff)
    return false;
  return exponent != 0 ? fraction == 0 : (fraction & (fraction - 1)) == 0;
}

/// The lanes where p, a product or quotient whose operands do not round, is exact (a factor or the
/// divisor a power of two: a scale of 0.125 or 2); null when p is no such node or none is exact.
template <class S, class P>
bool const* exact_lanes(P const& p, tape& tp) {
  if constexpr (requires { p.es; typename P::operand_type; }) {
    using Op = std::remove_cvref_t<decltype(p.op)>;
    constexpr bool product = std::is_same_v<Op, ops::mul_op> || std::is_same_v<Op, ops::div_op>;
    if constexpr (product && std::is_same_v<typename P::operand_type, double>) {
      return p.es.apply([&](auto const& a, auto const& b) -> bool const* {
        using A = std::remove_cvref_t<decltype(a)>;
        using B = std::remove_cvref_t<decltype(b)>;
        if constexpr (rounds<A>::value || rounds<B>::value) {
          return nullptr;
        } else {
          constexpr int n = S::size;
          double* x = tp.alloc<double>(n);
          double* y = tp.alloc<double>(n);
          detail::assign<S>(x, a);
          detail::assign<S>(y, b);
          bool* exact = tp.alloc<bool>(n);
          bool any = false;
          for (int i = 0; i < n; ++i) {
            exact[i] = power_of_two_or_zero(y[i]) ||
                       (std::is_same_v<Op, ops::mul_op> && power_of_two_or_zero(x[i]));
            any |= exact[i];
          }
          return any ? exact : nullptr;
        }
      });
    }
  }
  return nullptr;
}

/// Replaces the values of p's leaves that carry errors by moved copies (one copy per leaf: a
/// tile read twice by one expression is read as the same numbers); whether any did.
template <bool Sign, class N>
bool move_leaves(N& n, tape& tp, double const** from, double const** to, int& count) {
  using D = std::remove_cvref_t<N>;
  if constexpr (requires { n.adj; n.values; }) {
    if constexpr (std::is_same_v<value_of_t<D>, double>) {
      for (int i = 0; i < count; ++i)
        if (from[i] == n.values) {
          n.values = to[i];
          return true;
        }
      double const* moved = jittered<Sign>(tp, n.values, shape_of_t<D>::size);
      if (moved == n.values)
        return false;
      if (count < 8) {
        from[count] = n.values;
        to[count++] = moved;
      }
      n.values = moved;
      return true;
    }
    return false;
  } else if constexpr (requires { n.es; }) {
    return n.es.apply(
        [&](auto&... e) { return (false | ... | move_leaves<Sign>(e, tp, from, to, count)); });
  } else if constexpr (requires { n.e; }) {
    return move_leaves<Sign>(n.e, tp, from, to, count);
  } else {
    return false;
  }
}

template <bool Sign, class N>
bool move_leaves(N& n, tape& tp) {
  double const* from[8];
  double const* to[8];
  int count = 0;
  return move_leaves<Sign>(n, tp, from, to, count);
}

/// Evaluates the primal expression p of shape S into v as its reader sees it (leaves moved), keeps
/// the errors of v, and leaves p reading the moved leaves (for its record).
template <class S, class P>
void assign_jittered(P& p, double* v, tape& tp) {
  constexpr int n = S::size;
  double const unit = rounds<P>::value ? rounding_jitter().unit : 0.0;
  bool const* const exact = unit != 0 ? exact_lanes<S>(p, tp) : nullptr;
  auto const own = [&](int i) { return exact && exact[i] ? 0.0 : unit * std::abs(v[i]); };
  if (rounding_jitter().whole) {
    // Whole moves: computed from the moved operands, the value carries their errors already; its
    // own is its rounding's.
    move_leaves<false>(p, tp);
    detail::assign<S>(v, p);
    double* e = tp.alloc<double>(n);
    for (int i = 0; i < n; ++i) e[i] = own(i);
    keep_errors(tp, v, e, n);
    return;
  }
  P signs = p;
  bool const moved = move_leaves<true>(signs, tp);
  double* e = tp.alloc<double>(n);
  if (moved) {
    detail::assign<S>(e, signs); // f(x + errors), then |that - f(x)|: what the errors move it by
    detail::assign<S>(v, p);
    errors_from(e, v, n, unit, exact);
    move_leaves<false>(p, tp);
  } else {
    for (int i = 0; i < n; ++i) e[i] = 0;
  }
  detail::assign<S>(v, p);
  if (!moved)
    for (int i = 0; i < n; ++i) e[i] = own(i);
  keep_errors(tp, v, e, n);
}

} // namespace tilegrad::ad
