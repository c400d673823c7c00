// dual<T, N>: the element type of a kernel's tensors in forward mode. A value and N tangents
// (directional derivatives); every operation and math function carries the tangents along.
#pragma once

#include "tilegrad/core/types.hpp"

#include <cmath>
#include <limits>
#include <numbers>
#include <type_traits>

namespace tilegrad {

namespace detail {
/// One term of a tangent, `tangent * partial`: exactly zero where either is zero (a constant's
/// tangent times an infinite partial, or an infinite tangent times a partial of zero), as reverse
/// mode passes a zero adjoint on.
template <class T>
constexpr T term(T tangent, T partial) {
  return tangent == T(0) || partial == T(0) ? T(0) : tangent * partial;
}
} // namespace detail

/// A value `v` with N tangents `d[0..N)`. Trivially copyable and, like a float, uninitialised
/// when default-constructed as `dual x;` (`dual{}` is zero). Plain numbers convert implicitly
/// (with zero tangents); converting back to a number, or from dual<double> to dual<float>, is
/// explicit. Comparisons compare values; tangents never decide control flow.
template <class T, int N = 1>
struct dual {
  static_assert(std::is_floating_point_v<T>, "tilegrad: dual<T, N> wants float or double");
  static_assert(N >= 1, "tilegrad: dual<T, N> needs N >= 1 tangent directions");
  using scalar_tag = void; // meets a tile as a plain number does
  using dual_tag = void;
  using primal_type = T;
  template <class U>
  using rebind = dual<U, N>; // the same mode at another float width (to<double>, fp64<T>)
  static constexpr int directions = N;

  T v;
  T d[N];

  dual() = default;
  template <class U>
    requires is_builtin_v<U>
  constexpr dual(U x) : v(static_cast<T>(x)), d{} {} // NOLINT: a constant has zero tangent
  /// float -> double widens implicitly; double -> float narrows and must be spelled out.
  template <class U>
  constexpr explicit(sizeof(U) > sizeof(T)) dual(dual<U, N> const& x) : v(static_cast<T>(x.v)) {
    for (int k = 0; k < N; ++k)
      d[k] = static_cast<T>(x.d[k]);
  }

  /// The value alone (the tangents are dropped).
  template <class U>
    requires is_builtin_v<U>
  constexpr explicit operator U() const { return static_cast<U>(v); }

  friend constexpr dual operator+(dual const& a) { return a; }
  friend constexpr dual operator-(dual const& a) {
    dual r;
    r.v = -a.v;
    for (int k = 0; k < N; ++k)
      r.d[k] = -a.d[k];
    return r;
  }
  friend constexpr dual operator+(dual const& a, dual const& b) {
    dual r;
    r.v = a.v + b.v;
    for (int k = 0; k < N; ++k)
      r.d[k] = a.d[k] + b.d[k];
    return r;
  }
  friend constexpr dual operator-(dual const& a, dual const& b) {
    dual r;
    r.v = a.v - b.v;
    for (int k = 0; k < N; ++k)
      r.d[k] = a.d[k] - b.d[k];
    return r;
  }
  // A zero tangent contributes exactly zero, as a zero adjoint does in reverse mode: a masked
  // lane's -inf `other` (tangent 0) times a weight that has a tangent is a constant, whose
  // tangent is 0, not (-inf) * 0. So does a tangent times a partial derivative of exactly zero,
  // as reverse mode passes a zero adjoint on: a float mask's 0 times sqrt(x) at x = 0 (tangent
  // inf) has tangent 0, not 0 * inf.
  friend constexpr dual operator*(dual const& a, dual const& b) {
    dual r;
    r.v = a.v * b.v;
    for (int k = 0; k < N; ++k)
      r.d[k] = detail::term(a.d[k], b.v) + detail::term(b.d[k], a.v);
    return r;
  }
  friend constexpr dual operator/(dual const& a, dual const& b) {
    dual r;
    r.v = a.v / b.v;
    for (int k = 0; k < N; ++k)
      r.d[k] = a.d[k] == T(0) && b.d[k] == T(0) ? T(0) : (a.d[k] - detail::term(b.d[k], r.v)) / b.v;
    return r;
  }
  friend constexpr dual& operator+=(dual& a, dual const& b) { return a = a + b; }
  friend constexpr dual& operator-=(dual& a, dual const& b) { return a = a - b; }
  friend constexpr dual& operator*=(dual& a, dual const& b) { return a = a * b; }
  friend constexpr dual& operator/=(dual& a, dual const& b) { return a = a / b; }

  friend constexpr bool operator==(dual const& a, dual const& b) { return a.v == b.v; }
  friend constexpr bool operator!=(dual const& a, dual const& b) { return a.v != b.v; }
  friend constexpr bool operator<(dual const& a, dual const& b) { return a.v < b.v; }
  friend constexpr bool operator<=(dual const& a, dual const& b) { return a.v <= b.v; }
  friend constexpr bool operator>(dual const& a, dual const& b) { return a.v > b.v; }
  friend constexpr bool operator>=(dual const& a, dual const& b) { return a.v >= b.v; }
};

static_assert(std::is_trivially_copyable_v<dual<float, 3>> && sizeof(dual<float, 3>) == 16);

template <class T>
concept dual_scalar = requires {
  typename std::remove_cvref_t<T>::dual_tag;
};

namespace detail {
// The chain rule for a unary function: value y, derivative dy/dx at x; a zero tangent stays
// zero where dy/dx is infinite or NaN (log at 0, sqrt at 0, a masked lane's -inf).
template <class T, int N>
constexpr dual<T, N> chain(dual<T, N> const& x, T y, T dydx) {
  dual<T, N> r;
  r.v = y;
  for (int k = 0; k < N; ++k)
    r.d[k] = term(x.d[k], dydx);
  return r;
}
} // namespace detail

// Math functions, found by argument-dependent lookup from the op table (tile/ops.hpp). Each
// computes the value with the standard function and applies its exact derivative.

template <class T, int N>
dual<T, N> exp(dual<T, N> const& x) {
  T const y = std::exp(x.v);
  return detail::chain(x, y, y);
}
template <class T, int N>
dual<T, N> exp2(dual<T, N> const& x) {
  T const y = std::exp2(x.v);
  return detail::chain(x, y, y * std::numbers::ln2_v<T>);
}
template <class T, int N>
dual<T, N> log(dual<T, N> const& x) {
  return detail::chain(x, std::log(x.v), T(1) / x.v);
}
template <class T, int N>
dual<T, N> log2(dual<T, N> const& x) {
  return detail::chain(x, std::log2(x.v), T(1) / (x.v * std::numbers::ln2_v<T>));
}
template <class T, int N>
dual<T, N> sqrt(dual<T, N> const& x) {
  T const y = std::sqrt(x.v);
  return detail::chain(x, y, T(0.5) / y);
}
template <class T, int N>
dual<T, N> rsqrt(dual<T, N> const& x) {
  T const y = T(1) / std::sqrt(x.v);
  return detail::chain(x, y, T(-0.5) * y * y * y);
}
/// Derivative 0 at x == 0 (the subgradient reverse mode uses too).
template <class T, int N>
dual<T, N> abs(dual<T, N> const& x) {
  return detail::chain(x, std::abs(x.v), x.v > 0 ? T(1) : x.v < 0 ? T(-1) : T(0));
}
template <class T, int N>
dual<T, N> sin(dual<T, N> const& x) {
  return detail::chain(x, std::sin(x.v), std::cos(x.v));
}
template <class T, int N>
dual<T, N> cos(dual<T, N> const& x) {
  return detail::chain(x, std::cos(x.v), -std::sin(x.v));
}
/// The slope 4 e / (1 + e)^2 with e = exp(-2 |x|), as tg::tanh's op (tile/ops.hpp): 1 - y^2
/// rounds to 0 where y rounds to 1.
template <class T, int N>
dual<T, N> tanh(dual<T, N> const& x) {
  T const e = std::exp(T(-2) * std::abs(x.v)), r = T(1) / (T(1) + e);
  return detail::chain(x, std::tanh(x.v), T(4) * e * r * r);
}
/// With e = exp(-|x|): the value 1 / (1 + e) or e / (1 + e), the slope e / (1 + e)^2 (as
/// tg::sigmoid's op, tile/ops.hpp: no overflow, no rounding of y to 1 in the slope).
template <class T, int N>
dual<T, N> sigmoid(dual<T, N> const& x) {
  T const e = std::exp(-std::abs(x.v)), r = T(1) / (T(1) + e);
  return detail::chain(x, x.v >= T(0) ? r : e * r, e * r * r);
}
/// The value of tg::sigmoid's op (tile/ops.hpp) for a dual number.
template <class T, int N>
dual<T, N> sigmoid_value(dual<T, N> const& x) {
  return sigmoid(x);
}
template <class T, int N>
dual<T, N> erf(dual<T, N> const& x) {
  return detail::chain(x, std::erf(x.v),
                       T(2) * std::numbers::inv_sqrtpi_v<T> * std::exp(-(x.v * x.v)));
}

/// Remainder with the sign of a: a - q b with q = trunc(a / b), so d/da = 1 and d/db = -q. q is
/// taken as (a - r) / b, from the remainder, as reverse mode's rule (tile/ops.hpp) takes it: trunc
/// of the rounded quotient is one too many where a / b rounds up to a whole number (a = 1,
/// b = 0.1: r = 0.1 - 5.6e-17 = a - 9 b, and trunc(a / b) = 10).
template <class T, int N>
dual<T, N> fmod(dual<T, N> const& a, dual<T, N> const& b) {
  dual<T, N> r;
  r.v = std::fmod(a.v, b.v);
  T const q = (a.v - r.v) / b.v;
  for (int k = 0; k < N; ++k)
    r.d[k] = a.d[k] - detail::term(b.d[k], q);
  return r;
}
/// a * b + c, the value fused.
template <class T, int N>
dual<T, N> fma(dual<T, N> const& a, dual<T, N> const& b, dual<T, N> const& c) {
  dual<T, N> r;
  r.v = std::fma(a.v, b.v, c.v);
  for (int k = 0; k < N; ++k)
    r.d[k] = detail::term(a.d[k], b.v) + detail::term(b.d[k], a.v) + c.d[k];
  return r;
}
/// On ties the first operand (and its tangent) wins, as the tile ops have it.
template <class T, int N>
constexpr dual<T, N> maximum(dual<T, N> const& a, dual<T, N> const& b) {
  return b > a ? b : a;
}
template <class T, int N>
constexpr dual<T, N> minimum(dual<T, N> const& a, dual<T, N> const& b) {
  return b < a ? b : a;
}
/// The value rounded to bf16 precision, the tangents unchanged (to<bf16> of a dual: bf16
/// rounding is differentiated as the identity).
template <class T, int N>
constexpr dual<T, N> round_bf16(dual<T, N> x) {
  x.v = static_cast<T>(static_cast<float>(bf16(x.v)));
  return x;
}
template <class T, int N>
constexpr dual<T, N> where(bool c, dual<T, N> const& a, dual<T, N> const& b) {
  return c ? a : b;
}

} // namespace tilegrad

/// NaN and infinities of a dual carry zero tangents (block-pointer padding, `other` values).
namespace std {
template <class T, int N>
class numeric_limits<tilegrad::dual<T, N>> : public numeric_limits<T> {
  using D = tilegrad::dual<T, N>;
  using L = std::numeric_limits<T>;

public:
  static constexpr D min() noexcept { return L::min(); }
  static constexpr D max() noexcept { return L::max(); }
  static constexpr D lowest() noexcept { return L::lowest(); }
  static constexpr D epsilon() noexcept { return L::epsilon(); }
  static constexpr D round_error() noexcept { return L::round_error(); }
  static constexpr D infinity() noexcept { return L::infinity(); }
  static constexpr D quiet_NaN() noexcept { return L::quiet_NaN(); }
  static constexpr D signaling_NaN() noexcept { return L::signaling_NaN(); }
  static constexpr D denorm_min() noexcept { return L::denorm_min(); }
};
} // namespace std
