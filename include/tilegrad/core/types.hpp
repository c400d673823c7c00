// Element-type rules: promotion between tile element types (Triton's rules), and the map from
// a kernel's scalar type to "fp32 in the current mode".
#pragma once

#include "tilegrad/core/bf16.hpp"

#include <cstdint>
#include <type_traits>

namespace tilegrad {

/// Element types that are plain machine numbers (every other type is a "custom scalar").
template <class T>
inline constexpr bool is_builtin_v = std::is_arithmetic_v<T> || std::is_same_v<T, bf16>;

template <class T>
inline constexpr bool is_integer_v = std::is_integral_v<T> && !std::is_same_v<T, bool>;

/// Floating element types: float, double, bf16 and every custom scalar (dual, adjoint, ...).
template <class T>
inline constexpr bool is_floating_v = std::is_floating_point_v<T> || !is_builtin_v<T>;

namespace detail {
/// False, but only once the template is instantiated: the condition of a static_assert in an
/// overload that exists to refuse a misuse with a message.
template <class...>
inline constexpr bool dependent_false = false;

/// Whether storing values of type V into a tensor of element type T drops forward-mode tangents:
/// V is a dual number and T a float type that is not (an unmarked bf16 or double tensor in a jvp
/// of a float launch), where what is loaded back would count as a constant. (An integer takes a
/// dual's value, as it takes any float's.)
template <class T, class V>
inline constexpr bool drops_tangents_v = requires {
  typename V::dual_tag;
}
&&!requires {
  typename std::remove_cv_t<T>::dual_tag;
}
&&!std::is_integral_v<std::remove_cv_t<T>>;

/// A custom scalar that names its number type (`primal_type`) and itself at another float
/// width (`rebind<U>`: adjoint<float>::rebind<double> is adjoint<double>).
template <class T>
concept rebindable_scalar = requires {
  typename T::primal_type;
  typename T::template rebind<double>;
};
template <class T, class U>
struct rebind_scalar {
  using type = U;
};
template <rebindable_scalar T, class U>
struct rebind_scalar<T, U> {
  using type = typename T::template rebind<U>;
};
} // namespace detail

/// `T` at the float width of `U`, in T's mode: `U` itself for plain numbers.
template <class T, class U>
using rebind_scalar_t = typename detail::rebind_scalar<T, U>::type;

namespace detail {
template <class A, class B>
struct promote {
  using type = std::common_type_t<A, B>;
};
// Two widths of one mode meet at the wider: adjoint<float> * adjoint<double> is adjoint<double>.
template <rebindable_scalar A, rebindable_scalar B>
  requires(!std::is_same_v<A, B> &&
           std::is_same_v<rebind_scalar_t<A, float>, rebind_scalar_t<B, float>>)
struct promote<A, B> {
  using type =
      rebind_scalar_t<A, std::common_type_t<typename A::primal_type, typename B::primal_type>>;
};
// A custom scalar absorbs builtin numbers (dual<float> with an int32 tile stays dual<float>),
// except that a wider float widens it within its mode, as float with double gives double on the
// fast path: adjoint<float> with a double tile is adjoint<double>.
template <class A, class B>
struct absorb {
  using type = A;
};
template <rebindable_scalar A, class B>
  requires(std::is_floating_point_v<B> && sizeof(B) > sizeof(typename A::primal_type))
struct absorb<A, B> {
  using type = rebind_scalar_t<A, std::common_type_t<typename A::primal_type, B>>;
};
template <class A, class B>
  requires(!is_builtin_v<A> && is_builtin_v<B>)
struct promote<A, B> {
  using type = typename absorb<A, B>::type;
};
template <class A, class B>
  requires(is_builtin_v<A> && !is_builtin_v<B>)
struct promote<A, B> {
  using type = typename absorb<B, A>::type;
};
template <class A>
  requires(!is_builtin_v<A>)
struct promote<A, A> {
  using type = A;
};
// bf16 meets another builtin type as float does (bf16 computes in float): Triton's bf16 + fp32 is
// fp32. (bf16 with bf16 stays bf16, which elementwise operations refuse with a message.)
template <class A, class B>
requires(is_builtin_v<A>&& is_builtin_v<B> &&
         (std::is_same_v<A, bf16> != std::is_same_v<B, bf16>)) struct promote<A, B> {
  using type = typename promote<float, std::conditional_t<std::is_same_v<A, bf16>, B, A>>::type;
};
// bool participates in arithmetic as int32, as in Triton.
template <>
struct promote<bool, bool> {
  using type = std::int32_t;
};
} // namespace detail

namespace detail {
/// The first of Ts that is not void (void if none).
template <class... Ts>
struct first_non_void {
  using type = void;
};
template <class T, class... Rest>
struct first_non_void<T, Rest...> {
  using type = std::conditional_t<!std::is_void_v<T>, T, typename first_non_void<Rest...>::type>;
};
} // namespace detail

/// Result element type of a binary arithmetic op on tiles of A and B (Triton's promotion:
/// int32 op int64 -> int64, integer op float -> float, float op double -> double).
template <class A, class B>
using promote_t = typename detail::promote<A, B>::type;

namespace detail {
template <class T>
struct fp32_of {
  using type = float; // integers, bool and bf16 compute in float
};
template <>
struct fp32_of<double> {
  using type = double; // the fp64 instantiation of a kernel stays fp64
};
template <class T>
  requires(!is_builtin_v<T>)
struct fp32_of<T> {
  using type = T; // custom scalars name themselves (they specialise this to refine it)
};
} // namespace detail

/// "fp32 in the current mode" (Triton's tl.float32): float on the fast path, double in the
/// fp64 reference, the mode's own scalar for dual and adjoint numbers.
template <class T>
using fp32 = typename detail::fp32_of<std::remove_cv_t<T>>::type;

/// "fp64 in the current mode" (Triton's tl.float64): double on the fast path, the mode's double
/// scalar for dual and adjoint numbers (adjoint<double> for adjoint<float>).
template <class T>
using fp64 = rebind_scalar_t<std::remove_cv_t<T>, double>;

/// Accumulator type of reductions and dot: fp32 for floats, int32 for small integers.
template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, bool>, std::int32_t,
                                 std::conditional_t<std::is_same_v<T, bf16>, float, T>>;

/// Triton's cdiv: ceiling division of positive integers, in their common type (a tensor's
/// int64 size by an int block is int64; a grid takes it as it is).
template <class I, class J>
constexpr std::common_type_t<I, J> cdiv(I a, J b) {
  using C = std::common_type_t<I, J>;
  return (C(a) + C(b) - 1) / C(b);
}

/// Smallest power of two >= n (1 for n <= 1).
template <class I>
constexpr I next_power_of_2(I n) {
  I p = 1;
  while (p < n) p <<= 1;
  return p;
}

} // namespace tilegrad
