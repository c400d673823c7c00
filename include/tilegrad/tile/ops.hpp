// The op table: one functor per elementwise operation, with its value rule (one generic body
// that serves plain scalars, xsimd batches and custom scalar types alike, found by ADL) and,
// beside it, its reverse-mode rule. Everything elementwise in tilegrad goes through here.
//
// Reverse rules take the operands, the result and the result's adjoint `g`, and return the
// adjoint contribution to one operand: unary `grad(x, y, g)`, binary `grad0/grad1(a, b, y, g)`.
#pragma once

#include "tilegrad/core/config.hpp"
#include "tilegrad/core/simd.hpp"
#include "tilegrad/core/types.hpp"

#include <cmath>
#include <limits>
#include <numbers>
#include <type_traits>

namespace tilegrad::ops {

namespace detail {
// Brings std:: and xsimd:: math into overload resolution next to ADL, so one body serves
// float, batch<float> and a custom scalar's own exp().
using std::abs, std::cos, std::erf, std::exp, std::exp2, std::fma, std::fmod, std::log,
    std::log2, std::sin, std::sqrt, std::tanh;
#if TILEGRAD_USE_XSIMD
using xsimd::abs, xsimd::cos, xsimd::erf, xsimd::exp, xsimd::exp2, xsimd::fma, xsimd::fmod,
    xsimd::log, xsimd::log2, xsimd::sin, xsimd::sqrt, xsimd::tanh;
#if defined(__AVX512F__)
// 16 floats take simd::exp16 (faster than xsimd's, and exact near the ends of the float range).
template <class A>
  requires(xsimd::batch<float, A>::size == 16)
TILEGRAD_INLINE xsimd::batch<float, A> exp(xsimd::batch<float, A> const& x) {
  return xsimd::batch<float, A>(simd::exp16(x));
}
#endif
// xsimd's exp2 overflows one binade early (2^127.5 is inf in float, 2^1023.5 in double), and on
// AVX-512 flushes subnormal results to 0 (2^-130 in float): the top binade goes through
// 2 * exp2(x - 1), which is exact, and results below the smallest normal through
// exp2(x + digits) * 2^-digits (one more rounding, into the subnormal).
template <class T, class A>
  requires std::is_floating_point_v<T>
TILEGRAD_INLINE xsimd::batch<T, A> exp2(xsimd::batch<T, A> const& x) {
  using L = std::numeric_limits<T>;
  xsimd::batch<T, A> const top(static_cast<T>(L::max_exponent - 1));
  xsimd::batch<T, A> const bottom(static_cast<T>(L::min_exponent - 1));
  auto const high = x >= top, low = x < bottom;
  if (xsimd::none(high || low))
    return xsimd::exp2(x);
  auto const r = xsimd::select(high, xsimd::exp2(x - T(1)) * T(2), xsimd::exp2(x));
  return xsimd::select(low, xsimd::exp2(x + T(L::digits)) * std::ldexp(T(1), -L::digits), r);
}
#endif

#if TILEGRAD_USE_XSIMD
// The lanes of r where `redo` holds, computed again one at a time by the C library's `f`.
template <class T, class A, class M, class F>
TILEGRAD_INLINE xsimd::batch<T, A> lanes_again(xsimd::batch<T, A> const& r,
                                                xsimd::batch<T, A> const& x, M const& redo, F f) {
  if (xsimd::none(redo))
    return r;
  constexpr std::size_t n = xsimd::batch<T, A>::size;
  alignas(64) T xs[n], rs[n], which[n];
  x.store_aligned(xs);
  r.store_aligned(rs);
  xsimd::select(redo, xsimd::batch<T, A>(T(1)), xsimd::batch<T, A>(T(0))).store_aligned(which);
  for (std::size_t i = 0; i < n; ++i)
    if (which[i] != T(0))
      rs[i] = f(xs[i]);
  return xsimd::batch<T, A>::load_aligned(rs);
}
// xsimd's float exp, on batches other than 16 lanes (a float expression inside a double one,
// which runs 8 lanes at a time; every float batch without AVX-512), overflows at 88.4 (exp(88.5)
// is 2.7e38) and flushes subnormal results to 0 (exp(-88) is 6.05e-39): those lanes are computed
// by the C library, as the tail lanes are.
template <class A>
#if defined(__AVX512F__)
requires(xsimd::batch<float, A>::size != 16)
#endif
    TILEGRAD_INLINE xsimd::batch<float, A> exp(xsimd::batch<float, A> const& x) {
  return lanes_again(xsimd::exp(x), x, (x > 88.0f) || (x < -87.0f),
                     [](float v) { return std::exp(v); });
}
// Double erf, lane by lane by the C library (within an ulp): xsimd's is up to 68 ulp off near
// |x| = 2.2 (24 near 0.48; NaN past about 9.6e61), and the float64 reference and the finite
// differences inherited that, failing a correct float64 backward that used std::erf. About 12 ns
// a lane where xsimd's took 2; the double path is where accuracy matters. (Float: xsimd's is
// within 1.6 ulp.)
template <class A>
TILEGRAD_INLINE xsimd::batch<double, A> erf(xsimd::batch<double, A> const& x) {
  constexpr std::size_t n = xsimd::batch<double, A>::size;
  alignas(64) double xs[n];
  x.store_aligned(xs);
  for (double& v : xs)
    v = std::erf(v);
  return xsimd::batch<double, A>::load_aligned(xs);
}
// xsimd's double exp overflows before the end of the double range (exp(709.7) is inf, where the
// result is 1.65e308) and flushes the subnormal results to 0 (exp(-709)); its log and log2 of
// subnormals are off by tens (log(1e-310) -746.5 where it is -713.8). Those lanes are computed
// by the C library. (Floats are right there: exp16, and xsimd's float log.)
template <class A>
TILEGRAD_INLINE xsimd::batch<double, A> exp(xsimd::batch<double, A> const& x) {
  return lanes_again(xsimd::exp(x), x, (x > 709.0) || (x < -708.0),
                     [](double v) { return std::exp(v); });
}
template <class A>
TILEGRAD_INLINE xsimd::batch<double, A> log(xsimd::batch<double, A> const& x) {
  using L = std::numeric_limits<double>;
  return lanes_again(xsimd::log(x), x, (x > 0.0) && (x < L::min()),
                     [](double v) { return std::log(v); });
}
template <class A>
TILEGRAD_INLINE xsimd::batch<double, A> log2(xsimd::batch<double, A> const& x) {
  using L = std::numeric_limits<double>;
  return lanes_again(xsimd::log2(x), x, (x > 0.0) && (x < L::min()),
                     [](double v) { return std::log2(v); });
}
#endif

/// Whether V is a batch of float or double lanes.
template <class V>
inline constexpr bool is_float_batch_v = false;
#if TILEGRAD_USE_XSIMD
template <class T, class A>
inline constexpr bool is_float_batch_v<xsimd::batch<T, A>> = std::is_floating_point_v<T>;
#endif

template <class V>
TILEGRAD_INLINE V one() {
  return V(1);
}

template <class M, class V>
TILEGRAD_INLINE V select(M const& m, V const& a, V const& b) {
#if TILEGRAD_USE_XSIMD
  if constexpr (simd::is_batch_v<V>) return xsimd::select(m, a, b);
#endif
  if constexpr (!simd::is_batch_v<V>) return m ? a : b;
}

/// 1 / (1 + exp(-x)), as r = 1 / (1 + e) for x >= 0 and e r below, e = exp(-|x|): exp never
/// overflows, and below -87 the result is subnormal (2.2e-39 at x = -89) instead of 0. A dual
/// number takes its own sigmoid (ad/dual.hpp), by the same formulas.
template <class V>
TILEGRAD_INLINE V sigmoid_value(V const& x) {
  V const e = exp(-abs(x));
  V const r = one<V>() / (one<V>() + e);
  return select(x >= V(0), r, e * r);
}

/// sigmoid's derivative y (1 - y), as e / (1 + e)^2 with e = exp(-|x|): y (1 - y) loses every
/// digit where y rounds to 1 (in float, 3.6e-7 for 3.1e-7 at x = 15, 0 from x = 17).
template <class V>
TILEGRAD_INLINE V sigmoid_slope(V const& x) {
  V const e = exp(-abs(x));
  V const r = one<V>() / (one<V>() + e);
  return e * r * r;
}

/// tanh's derivative 1 - y^2, as 4 e / (1 + e)^2 with e = exp(-2 |x|) (tanh(x) = 2 sigmoid(2x)
/// - 1): 1 - y^2 loses every digit where y rounds to 1 (in float, 1.2e-7 for 6.1e-8 at x = 9, 0
/// from x = 10).
template <class V>
TILEGRAD_INLINE V tanh_slope(V const& x) {
  return V(4) * sigmoid_slope(V(2) * x);
}

/// b where b > a, else a, lane by lane (Max) or with < (!Max). x86's max and min instructions of
/// (b, a) compute exactly that, NaN in either operand giving a: one instruction where the compare
/// and the blend were two, in the latency chain of a reduction.
template <bool Max, class V>
TILEGRAD_INLINE V pick_over(V const& a, V const& b) {
#if TILEGRAD_USE_XSIMD && (defined(__x86_64__) || defined(__i386__))
  if constexpr (simd::is_batch_v<V>)
    if constexpr (std::is_floating_point_v<typename V::value_type>)
      return Max ? xsimd::max(b, a) : xsimd::min(b, a);
#endif
  if constexpr (Max)
    return select(b > a, b, a);
  else
    return select(b < a, b, a);
}
} // namespace detail

/// Ops whose results are bool (comparisons, logic) derive this; they have no reverse rule.
struct predicate {
  static constexpr bool differentiable = false;
  template <class T>
  using result = bool;
};
/// Ops that keep their operands' element type.
struct same_type {
  static constexpr bool differentiable = true;
  /// Whether every reverse rule is +-g or a select of g and 0, so that a zero adjoint gives a
  /// zero contribution whatever the operands (others are guarded in reverse mode).
  static constexpr bool passes_adjoint = false;
  template <class T>
  using result = T;
  template <class T>
  static constexpr bool vectorizes = true;
};

// ---------------------------------------------------------------------------------------------
// Unary ops
// ---------------------------------------------------------------------------------------------

#define TILEGRAD_UNARY_MATH(NAME, VALUE, GRAD)                                                     \
  struct NAME : same_type {                                                                        \
    static constexpr char const* name = #NAME;                                                     \
    static constexpr bool floating_only = true;                                                    \
    template <class V>                                                                             \
    TILEGRAD_INLINE static V apply(V const& x) {                                                   \
      using namespace detail;                                                                      \
      return VALUE;                                                                                \
    }                                                                                              \
    template <class V>                                                                             \
    TILEGRAD_INLINE static V grad([[maybe_unused]] V const& x, [[maybe_unused]] V const& y,        \
                                  V const& g) {                                                    \
      using namespace detail;                                                                      \
      return GRAD;                                                                                 \
    }                                                                                              \
  };

// name     value                          d/dx expressed with x, y = f(x) and upstream g
TILEGRAD_UNARY_MATH(exp_op, exp(x), g* y)
TILEGRAD_UNARY_MATH(exp2_op, exp2(x), g* y * V(std::numbers::ln2))
TILEGRAD_UNARY_MATH(log_op, log(x), g / x)
TILEGRAD_UNARY_MATH(log2_op, log2(x), g / (x * V(std::numbers::ln2)))
TILEGRAD_UNARY_MATH(sqrt_op, sqrt(x), g / (V(2) * y))
TILEGRAD_UNARY_MATH(rsqrt_op, one<V>() / sqrt(x), g * V(-0.5) * y * y * y)
TILEGRAD_UNARY_MATH(sin_op, sin(x), g* cos(x))
TILEGRAD_UNARY_MATH(cos_op, cos(x), -(g * sin(x)))
TILEGRAD_UNARY_MATH(sigmoid_op, sigmoid_value(x), g* sigmoid_slope(x))
TILEGRAD_UNARY_MATH(tanh_op, tanh(x), g* tanh_slope(x))
TILEGRAD_UNARY_MATH(erf_op, erf(x), g* V(std::numbers::inv_sqrtpi * 2) * exp(-(x * x)))
#undef TILEGRAD_UNARY_MATH

struct abs_op : same_type {
  static constexpr bool passes_adjoint = true;
  static constexpr char const* name = "abs";
  static constexpr bool floating_only = false;
  template <class V>
  TILEGRAD_INLINE static V apply(V const& x) {
    using namespace detail;
    if constexpr (std::is_unsigned_v<V>)
      return x; // (std::abs of an unsigned number is ambiguous)
    else if constexpr (std::is_integral_v<V> && sizeof(V) < sizeof(int))
      return static_cast<V>(abs(static_cast<int>(x)));
#if TILEGRAD_USE_XSIMD
    else if constexpr (simd::is_batch_v<V>) {
      if constexpr (std::is_unsigned_v<typename V::value_type>)
        return x;
      else
        return abs(x);
    }
#endif
    else
      return abs(x);
  }
  // Subgradient 0 at x == 0, as in PyTorch and JAX.
  template <class V>
  TILEGRAD_INLINE static V grad(V const& x, V const&, V const& g) {
    return detail::select(x > V(0), g, detail::select(x < V(0), -g, V(0)));
  }
};

struct neg_op : same_type {
  static constexpr bool passes_adjoint = true;
  static constexpr char const* name = "neg";
  static constexpr bool floating_only = false;
  // The sign flipped, on vector lanes too (xsimd's -x of a float batch is 0 - x on some targets,
  // which gives +0 for +0: a tile's lanes disagreed with its scalar tail).
  template <class V>
  TILEGRAD_INLINE static V apply(V const& x) {
    if constexpr (detail::is_float_batch_v<V>)
      return x ^ V(typename V::value_type(-0.0));
    else
      return -x;
  }
  template <class V>
  TILEGRAD_INLINE static V grad(V const&, V const&, V const& g) {
    return apply(g);
  }
};

namespace detail {
TILEGRAD_INLINE float round_bf16(float x) { return static_cast<float>(bf16(x)); }
TILEGRAD_INLINE double round_bf16(double x) { return static_cast<double>(bf16(x)); }
#if TILEGRAD_USE_XSIMD
template <class T, class A>
TILEGRAD_INLINE xsimd::batch<T, A> round_bf16(xsimd::batch<T, A> const& x) {
  constexpr std::size_t w = xsimd::batch<T, A>::size;
  alignas(64) T l[w];
  x.store_unaligned(l);
  for (std::size_t i = 0; i < w; ++i) l[i] = round_bf16(l[i]);
  return xsimd::batch<T, A>::load_unaligned(l);
}
#endif
} // namespace detail

/// to<bf16> inside a mode that carries derivatives: the value rounded to bf16 precision, kept
/// at its own width; the rounding is differentiated as the identity.
struct round_bf16_op : same_type {
  static constexpr bool passes_adjoint = true;
  static constexpr char const* name = "round_bf16";
  static constexpr bool floating_only = true;
  template <class V>
  TILEGRAD_INLINE static V apply(V const& x) {
    using namespace detail;
    return round_bf16(x);
  }
  template <class V>
  TILEGRAD_INLINE static V grad(V const&, V const&, V const& g) {
    return g;
  }
};

/// Bitwise complement on integers, logical not on bool tiles.
struct invert_op : same_type {
  static constexpr char const* name = "invert";
  static constexpr bool differentiable = false;
  static constexpr bool floating_only = false;
  template <class V>
  TILEGRAD_INLINE static V apply(V const& x) {
    if constexpr (std::is_same_v<V, bool>)
      return !x;
    else
      return ~x; // batch_bool's ~ is logical not as well
  }
};

// ---------------------------------------------------------------------------------------------
// Binary ops
// ---------------------------------------------------------------------------------------------

struct add_op : same_type {
  static constexpr bool passes_adjoint = true;
  static constexpr char const* name = "add";
  template <class V>
  TILEGRAD_INLINE static V apply(V const& a, V const& b) {
    return a + b;
  }
  template <class V>
  TILEGRAD_INLINE static V grad0(V const&, V const&, V const&, V const& g) {
    return g;
  }
  template <class V>
  TILEGRAD_INLINE static V grad1(V const&, V const&, V const&, V const& g) {
    return g;
  }
};

struct sub_op : same_type {
  static constexpr bool passes_adjoint = true;
  static constexpr char const* name = "sub";
  template <class V>
  TILEGRAD_INLINE static V apply(V const& a, V const& b) {
    return a - b;
  }
  template <class V>
  TILEGRAD_INLINE static V grad0(V const&, V const&, V const&, V const& g) {
    return g;
  }
  template <class V>
  TILEGRAD_INLINE static V grad1(V const&, V const&, V const&, V const& g) {
    return -g;
  }
};

struct mul_op : same_type {
  static constexpr char const* name = "mul";
  template <class V>
  TILEGRAD_INLINE static V apply(V const& a, V const& b) {
    return a * b;
  }
  template <class V>
  TILEGRAD_INLINE static V grad0(V const&, V const& b, V const&, V const& g) {
    return g * b;
  }
  template <class V>
  TILEGRAD_INLINE static V grad1(V const& a, V const&, V const&, V const& g) {
    return g * a;
  }
};

/// Division: true division on floats; on integers C's truncating division, which is Triton's
/// `//` on integer tensors.
struct div_op : same_type {
  static constexpr char const* name = "div";
  template <class T>
  static constexpr bool vectorizes = !std::is_integral_v<T>; // no SIMD integer division
  template <class V>
  TILEGRAD_INLINE static V apply(V const& a, V const& b) {
    return a / b;
  }
  template <class V>
  TILEGRAD_INLINE static V grad0(V const&, V const& b, V const&, V const& g) {
    return g / b;
  }
  template <class V>
  TILEGRAD_INLINE static V grad1(V const&, V const& b, V const& y, V const& g) {
    return -(g * y / b);
  }
};

/// Remainder with the sign of the dividend (C's `%` and fmod; Triton's `%`).
struct mod_op : same_type {
  static constexpr char const* name = "mod";
  template <class T>
  static constexpr bool vectorizes = false;
  template <class V>
  TILEGRAD_INLINE static V apply(V const& a, V const& b) {
    using namespace detail;
    if constexpr (std::is_integral_v<V>)
      return a % b;
    else
      return fmod(a, b);
  }
  // d/da = 1, d/db = -trunc(a / b): piecewise, with y = a - trunc(a/b) * b.
  template <class V>
  TILEGRAD_INLINE static V grad0(V const&, V const&, V const&, V const& g) {
    return g;
  }
  template <class V>
  TILEGRAD_INLINE static V grad1(V const& a, V const& b, V const& y, V const& g) {
    return -(g * ((a - y) / b));
  }
};

/// maximum/minimum: on ties the gradient goes to the first operand (documented, deterministic).
struct maximum_op : same_type {
  static constexpr bool passes_adjoint = true;
  static constexpr char const* name = "maximum";
  template <class V>
  TILEGRAD_INLINE static V apply(V const& a, V const& b) {
    return detail::pick_over<true>(a, b);
  }
  template <class V>
  TILEGRAD_INLINE static V grad0(V const& a, V const& b, V const&, V const& g) {
    return detail::select(b > a, V(0), g);
  }
  template <class V>
  TILEGRAD_INLINE static V grad1(V const& a, V const& b, V const&, V const& g) {
    return detail::select(b > a, g, V(0));
  }
};

struct minimum_op : same_type {
  static constexpr bool passes_adjoint = true;
  static constexpr char const* name = "minimum";
  template <class V>
  TILEGRAD_INLINE static V apply(V const& a, V const& b) {
    return detail::pick_over<false>(a, b);
  }
  template <class V>
  TILEGRAD_INLINE static V grad0(V const& a, V const& b, V const&, V const& g) {
    return detail::select(b < a, V(0), g);
  }
  template <class V>
  TILEGRAD_INLINE static V grad1(V const& a, V const& b, V const&, V const& g) {
    return detail::select(b < a, g, V(0));
  }
};

#define TILEGRAD_INTEGER_BINARY(NAME, EXPR, VEC)                                                   \
  struct NAME : same_type {                                                                        \
    static constexpr char const* name = #NAME;                                                     \
    static constexpr bool differentiable = false;                                                  \
    template <class T>                                                                             \
    static constexpr bool vectorizes = VEC;                                                        \
    template <class V>                                                                             \
    TILEGRAD_INLINE static V apply(V const& a, V const& b) {                                       \
      return EXPR;                                                                                 \
    }                                                                                              \
  };
// On bool tiles &, |, ^ are the logical operations.
TILEGRAD_INTEGER_BINARY(and_op, a& b, true)
TILEGRAD_INTEGER_BINARY(or_op, a | b, true)
// Masks xor as (a | b) & ~(a & b): xsimd 8's AVX-512 mask xor computes an or.
TILEGRAD_INTEGER_BINARY(xor_op, (simd::is_mask_v<V> ? V((a | b) & ~(a & b)) : V(a ^ b)), true)
TILEGRAD_INTEGER_BINARY(shl_op, a << b, false)
TILEGRAD_INTEGER_BINARY(shr_op, a >> b, false)
#undef TILEGRAD_INTEGER_BINARY

#define TILEGRAD_COMPARISON(NAME, OP)                                                              \
  struct NAME : predicate {                                                                        \
    static constexpr char const* name = #NAME;                                                     \
    template <class T>                                                                             \
    static constexpr bool vectorizes = true;                                                       \
    template <class V>                                                                             \
    TILEGRAD_INLINE static auto apply(V const& a, V const& b) {                                    \
      return a OP b;                                                                               \
    }                                                                                              \
  };
TILEGRAD_COMPARISON(eq_op, ==)
/// a != b, true where either is NaN (`x != x` finds NaN, as in Triton and C++). Float batches
/// take it as !(a == b): xsimd 8 computes != of AVX and AVX-512 float batches as an ordered
/// comparison, false for NaN (and SSE2's as an unordered one), so the vector lanes of a tile said
/// NaN != NaN is false and its scalar tail lanes said true.
struct ne_op : predicate {
  static constexpr char const* name = "ne_op";
  template <class T>
  static constexpr bool vectorizes = true;
  template <class V>
  TILEGRAD_INLINE static auto apply(V const& a, V const& b) {
#if TILEGRAD_USE_XSIMD
    if constexpr (simd::is_batch_v<V>)
      if constexpr (std::is_floating_point_v<typename V::value_type>)
        return !(a == b);
#endif
    return a != b;
  }
};
TILEGRAD_COMPARISON(lt_op, <)
TILEGRAD_COMPARISON(le_op, <=)
TILEGRAD_COMPARISON(gt_op, >)
TILEGRAD_COMPARISON(ge_op, >=)
#undef TILEGRAD_COMPARISON

// ---------------------------------------------------------------------------------------------
// Ternary ops
// ---------------------------------------------------------------------------------------------

/// where(c, a, b): a where c holds, else b. The mask gets no gradient.
struct where_op : same_type {
  static constexpr bool passes_adjoint = true;
  static constexpr char const* name = "where";
  template <class M, class V>
  TILEGRAD_INLINE static V apply(M const& c, V const& a, V const& b) {
    if constexpr (simd::is_batch_v<V>)
      return detail::select(simd::mask_for<typename V::value_type, int(V::size)>(c), a, b);
    else
      return c ? a : b;
  }
  template <class M, class V>
  TILEGRAD_INLINE static V grad1(M const& c, V const& g) {
    return detail::select(c, g, V(0));
  }
  template <class M, class V>
  TILEGRAD_INLINE static V grad2(M const& c, V const& g) {
    return detail::select(c, V(0), g);
  }
};

/// fma(a, b, c) = a * b + c, fused where the hardware has it.
struct fma_op : same_type {
  static constexpr char const* name = "fma";
  template <class V>
  TILEGRAD_INLINE static V apply(V const& a, V const& b, V const& c) {
    using namespace detail;
#if TILEGRAD_USE_XSIMD
    if constexpr (simd::is_batch_v<V>)
      return simd::fused_multiply_add(a, b, c);
    else
#endif
        if constexpr (std::is_arithmetic_v<V>)
      return fma(a, b, c);
    else if constexpr (requires { typename V::dual_tag; })
      return fma(a, b, c); // dual's own: the value rounded once, as on the fast path
    else
      return a * b + c;
  }
  template <class V>
  TILEGRAD_INLINE static V grad0(V const&, V const& b, V const&, V const& g) {
    return g * b;
  }
  template <class V>
  TILEGRAD_INLINE static V grad1(V const& a, V const&, V const&, V const& g) {
    return g * a;
  }
  template <class V>
  TILEGRAD_INLINE static V grad2(V const&, V const&, V const&, V const& g) {
    return g;
  }
};

} // namespace tilegrad::ops
