// Elementwise operations on tiles: operators, comparisons, logic, the math table, where, fma.
// Each is a thin wrapper that broadcasts and promotes its operands and builds a map_node over
// an op of ops.hpp; nothing is computed until the expression is assigned.
#pragma once

#include "tilegrad/core/shape.hpp"
#include "tilegrad/core/types.hpp"
#include "tilegrad/tile/expr.hpp"
#include "tilegrad/tile/ops.hpp"
#include "tilegrad/tile/tile.hpp"

#include <type_traits>

namespace tilegrad {

namespace detail {

template <class X>
using elem_t = value_of_t<node_t<X>>;

// Element type a plain number takes when it meets a tile of T (Triton: the tile's type wins,
// except that a float constant makes an integer tile float). A number that carries derivatives
// (a dual, an adjoint item) keeps them: the two promote.
template <class TileT, class ScalarT>
using scalar_meets_t = std::conditional_t<
    !is_builtin_v<ScalarT> && is_builtin_v<TileT>, promote_t<TileT, ScalarT>,
    std::conditional_t<!is_builtin_v<TileT>, TileT,
                       std::conditional_t<std::is_floating_point_v<ScalarT> && !is_floating_v<TileT>,
                                          float, std::conditional_t<std::is_same_v<TileT, bool>,
                                                                    promote_t<bool, bool>, TileT>>>>;

// The element type two operands compute in.
template <class A, class B>
struct operand_type {
  using type = promote_t<elem_t<A>, elem_t<B>>;
};
template <class A, class B>
  requires(!tile_expression<A> && tile_expression<B>)
struct operand_type<A, B> {
  using type = scalar_meets_t<elem_t<B>, elem_t<A>>;
};
template <class A, class B>
  requires(tile_expression<A> && !tile_expression<B>)
struct operand_type<A, B> {
  using type = scalar_meets_t<elem_t<A>, elem_t<B>>;
};

template <class T>
inline constexpr bool computable_v = !std::is_same_v<T, bf16>;

// Binary map with broadcasting and promotion; T overrides the computation type.
template <class Op, class T = void, class A, class B>
TILEGRAD_INLINE auto binary(A&& a, B&& b) {
  using U = std::conditional_t<std::is_void_v<T>, typename operand_type<A, B>::type, T>;
  static_assert(computable_v<U>, "tilegrad: bf16 is a storage type: convert with to<float>(x) "
                                 "before computing");
  using S = broadcast_shape_t<shape_of_t<node_t<A>>, shape_of_t<node_t<B>>>;
  return make_map<Op>(broadcast_as<S>(convert_as<U>(as_node(std::forward<A>(a)))),
                      broadcast_as<S>(convert_as<U>(as_node(std::forward<B>(b)))));
}

template <class Op, class A>
TILEGRAD_INLINE auto unary(A&& a) {
  using T = elem_t<A>;
  static_assert(computable_v<T>, "tilegrad: bf16 is a storage type: convert with to<float>(x) "
                                 "before computing");
  if constexpr (requires { Op::floating_only; }) {
    static_assert(!Op::floating_only || is_floating_v<T>,
                  "tilegrad: this math function needs a floating tile: convert with "
                  "to<float>(x) first");
  }
  return make_map<Op>(as_node(std::forward<A>(a)));
}

template <class A, class B>
concept binary_operands = (tile_expression<A> || tile_expression<B>) &&
                          (tile_expression<A> || scalar_operand<A>) &&
                          (tile_expression<B> || scalar_operand<B>);

template <class A, class B>
concept integer_operands =
    binary_operands<A, B> && !is_floating_v<elem_t<A>> && !is_floating_v<elem_t<B>>;

} // namespace detail

// Arithmetic ---------------------------------------------------------------------------------

#define TILEGRAD_BINARY_OPERATOR(OP, OPNAME, CONCEPT)                                              \
  template <class A, class B>                                                                      \
    requires detail::CONCEPT<A, B>                                                                 \
  TILEGRAD_INLINE auto operator OP(A&& a, B&& b) {                                                 \
    return detail::binary<ops::OPNAME>(std::forward<A>(a), std::forward<B>(b));                    \
  }
TILEGRAD_BINARY_OPERATOR(+, add_op, binary_operands)
TILEGRAD_BINARY_OPERATOR(-, sub_op, binary_operands)
TILEGRAD_BINARY_OPERATOR(*, mul_op, binary_operands)
TILEGRAD_BINARY_OPERATOR(/, div_op, binary_operands)
TILEGRAD_BINARY_OPERATOR(%, mod_op, binary_operands)
TILEGRAD_BINARY_OPERATOR(==, eq_op, binary_operands)
TILEGRAD_BINARY_OPERATOR(!=, ne_op, binary_operands)
TILEGRAD_BINARY_OPERATOR(<, lt_op, binary_operands)
TILEGRAD_BINARY_OPERATOR(<=, le_op, binary_operands)
TILEGRAD_BINARY_OPERATOR(>, gt_op, binary_operands)
TILEGRAD_BINARY_OPERATOR(>=, ge_op, binary_operands)
// Bitwise on integer tiles, logical on bool tiles (Triton's & | ^ on masks).
TILEGRAD_BINARY_OPERATOR(<<, shl_op, integer_operands)
TILEGRAD_BINARY_OPERATOR(>>, shr_op, integer_operands)
#undef TILEGRAD_BINARY_OPERATOR

#define TILEGRAD_LOGIC_OPERATOR(OP, OPNAME)                                                        \
  template <class A, class B>                                                                      \
    requires detail::integer_operands<A, B>                                                        \
  TILEGRAD_INLINE auto operator OP(A&& a, B&& b) {                                                 \
    using TA = detail::elem_t<A>;                                                                  \
    using TB = detail::elem_t<B>;                                                                  \
    using T = std::conditional_t<std::is_same_v<TA, bool> && std::is_same_v<TB, bool>, bool,      \
                                 typename detail::operand_type<A, B>::type>;                       \
    return detail::binary<ops::OPNAME, T>(std::forward<A>(a), std::forward<B>(b));                 \
  }
TILEGRAD_LOGIC_OPERATOR(&, and_op)
TILEGRAD_LOGIC_OPERATOR(|, or_op)
TILEGRAD_LOGIC_OPERATOR(^, xor_op)
#undef TILEGRAD_LOGIC_OPERATOR

template <tile_expression A>
TILEGRAD_INLINE auto operator-(A&& a) {
  return detail::unary<ops::neg_op>(std::forward<A>(a));
}
template <tile_expression A>
  requires(!is_floating_v<value_of_t<A>>)
TILEGRAD_INLINE auto operator~(A&& a) {
  return detail::unary<ops::invert_op>(std::forward<A>(a));
}
template <tile_expression A>
  requires std::is_same_v<value_of_t<A>, bool>
TILEGRAD_INLINE auto operator!(A&& a) {
  return detail::unary<ops::invert_op>(std::forward<A>(a));
}

// Compound assignment evaluates in place, in one pass.
#define TILEGRAD_COMPOUND(OP)                                                                      \
  template <class T, int... Ns, class B>                                                           \
    requires detail::binary_operands<tile<T, Ns...>&, B>                                           \
  TILEGRAD_INLINE tile<T, Ns...>& operator OP##=(tile<T, Ns...>& t, B&& b) {                      \
    return t = (t OP std::forward<B>(b));                                                          \
  }
TILEGRAD_COMPOUND(+)
TILEGRAD_COMPOUND(-)
TILEGRAD_COMPOUND(*)
TILEGRAD_COMPOUND(/)
TILEGRAD_COMPOUND(%)
#undef TILEGRAD_COMPOUND

// The math table ------------------------------------------------------------------------------

#define TILEGRAD_MATH(NAME)                                                                        \
  template <tile_expression A>                                                                     \
  TILEGRAD_INLINE auto NAME(A&& a) {                                                               \
    return detail::unary<ops::NAME##_op>(std::forward<A>(a));                                      \
  }
TILEGRAD_MATH(exp)
TILEGRAD_MATH(exp2)
TILEGRAD_MATH(log)
TILEGRAD_MATH(log2)
TILEGRAD_MATH(sqrt)
TILEGRAD_MATH(rsqrt)
TILEGRAD_MATH(abs)
TILEGRAD_MATH(sin)
TILEGRAD_MATH(cos)
TILEGRAD_MATH(sigmoid)
TILEGRAD_MATH(tanh)
TILEGRAD_MATH(erf)
#undef TILEGRAD_MATH

template <class A, class B>
  requires detail::binary_operands<A, B>
TILEGRAD_INLINE auto maximum(A&& a, B&& b) {
  return detail::binary<ops::maximum_op>(std::forward<A>(a), std::forward<B>(b));
}
template <class A, class B>
  requires detail::binary_operands<A, B>
TILEGRAD_INLINE auto minimum(A&& a, B&& b) {
  return detail::binary<ops::minimum_op>(std::forward<A>(a), std::forward<B>(b));
}

/// where(c, a, b): a where the bool tile c holds, else b; all three broadcast together.
namespace detail {
// Element type where(c, a, b) selects in: that of a binary op on a and b when either is a tile,
// else the promotion of the two numbers. (A class template, so that only the branch that
// applies is instantiated: promote_t of two expression node types does not exist.)
template <class A, class B>
struct where_type {
  using type = promote_t<std::remove_cvref_t<A>, std::remove_cvref_t<B>>;
};
template <class A, class B>
  requires(tile_expression<A> || tile_expression<B>)
struct where_type<A, B> {
  using type = typename operand_type<std::conditional_t<tile_expression<A>, A, B>,
                                     std::conditional_t<tile_expression<A>, B, A>>::type;
};
} // namespace detail

template <tile_expression C, class A, class B>
  requires std::is_same_v<value_of_t<C>, bool> &&
           (tile_expression<A> || scalar_operand<A>) && (tile_expression<B> || scalar_operand<B>)
TILEGRAD_INLINE auto where(C&& c, A&& a, B&& b) {
  using T = typename detail::where_type<A, B>::type;
  using S = broadcast_shape_t<
      shape_of_t<detail::node_t<C>>,
      broadcast_shape_t<shape_of_t<detail::node_t<A>>, shape_of_t<detail::node_t<B>>>>;
  return make_map<ops::where_op>(
      detail::broadcast_as<S>(detail::as_node(std::forward<C>(c))),
      detail::broadcast_as<S>(detail::convert_as<T>(detail::as_node(std::forward<A>(a)))),
      detail::broadcast_as<S>(detail::convert_as<T>(detail::as_node(std::forward<B>(b)))));
}

namespace detail {
// Element type of an op on several operands, as binary ops have it: the tile operands' types
// promote together, then each plain number meets that type (a double constant keeps a float
// tile float).
template <class Acc, class X, bool IsTile = tile_expression<X>>
struct fold_tile_type {
  using type = Acc; // a number: skipped here
};
template <class X>
struct fold_tile_type<void, X, true> {
  using type = elem_t<X>;
};
template <class Acc, class X>
  requires(!std::is_void_v<Acc>)
struct fold_tile_type<Acc, X, true> {
  using type = promote_t<Acc, elem_t<X>>;
};
template <class T, class X, bool IsTile = tile_expression<X>>
struct fold_scalar_type {
  using type = T;
};
template <class T, class X>
struct fold_scalar_type<T, X, false> {
  using type = scalar_meets_t<T, elem_t<X>>;
};
template <class A, class B, class C>
using ternary_type_t = typename fold_scalar_type<
    typename fold_scalar_type<
        typename fold_scalar_type<
            typename fold_tile_type<
                typename fold_tile_type<typename fold_tile_type<void, A>::type, B>::type,
                C>::type,
            A>::type,
        B>::type,
    C>::type;
} // namespace detail

/// fma(a, b, c) = a * b + c (fused on the SIMD path).
template <class A, class B, class C>
  requires(tile_expression<A> || tile_expression<B> || tile_expression<C>)
TILEGRAD_INLINE auto fma(A&& a, B&& b, C&& c) {
  using T = detail::ternary_type_t<A, B, C>;
  using S = broadcast_shape_t<
      shape_of_t<detail::node_t<A>>,
      broadcast_shape_t<shape_of_t<detail::node_t<B>>, shape_of_t<detail::node_t<C>>>>;
  return make_map<ops::fma_op>(
      detail::broadcast_as<S>(detail::convert_as<T>(detail::as_node(std::forward<A>(a)))),
      detail::broadcast_as<S>(detail::convert_as<T>(detail::as_node(std::forward<B>(b)))),
      detail::broadcast_as<S>(detail::convert_as<T>(detail::as_node(std::forward<C>(c)))));
}

/// to<U>(x): element-type conversion (Triton's x.to(U)). Float to bf16 rounds to nearest
/// even; float to integer truncates toward zero. On tiles that carry derivatives (dual,
/// adjoint), a float type names that width in the same mode: to<double> of adjoint<float> is
/// adjoint<double>, to<float> keeps the derivatives, and to<bf16> rounds the value to bf16
/// precision at its own width (the rounding is differentiated as the identity).
template <class U, tile_expression A>
TILEGRAD_INLINE auto to(A&& a) {
  using From = detail::elem_t<A>;
  if constexpr (!detail::rebindable_scalar<From> ||
                !(std::is_floating_point_v<U> || std::is_same_v<U, bf16>))
    return detail::convert_as<U>(detail::as_node(std::forward<A>(a)));
  else if constexpr (std::is_same_v<U, bf16>)
    return make_map<ops::round_bf16_op>(detail::as_node(std::forward<A>(a)));
  else
    return detail::convert_as<rebind_scalar_t<From, U>>(detail::as_node(std::forward<A>(a)));
}

} // namespace tilegrad
