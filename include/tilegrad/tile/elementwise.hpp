// Elementwise operations on tiles: operators, comparisons, logic, the math table, where, fma.
// Each is a thin wrapper that broadcasts and promotes its operands and builds a map_node over
// an op of ops.hpp; nothing is computed until the expression is assigned.
#pragma once

#include "tilegrad/core/shape.hpp"
#include "tilegrad/core/types.hpp"
#include "tilegrad/grid/program.hpp"
#include "tilegrad/tile/expr.hpp"
#include "tilegrad/tile/ops.hpp"
#include "tilegrad/tile/tile.hpp"

#include <cstdint>
#include <limits>
#include <source_location>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace tilegrad {

namespace detail {

template <class X>
using elem_t = value_of_t<node_t<X>>;

// Element type a plain number takes when it meets a tile of T. As for Triton's literals, the
// tile's type wins, with two exceptions: a float number makes an integer tile float, and a
// 64-bit integer number (a size, stride or numel; Triton's int64 scalars) makes a narrower
// integer tile int64, so that `col(rows) * x.stride(0)` does not wrap at 2^31. A number that
// carries derivatives (a dual, an adjoint item) keeps them: the two promote.
template <class TileT, class ScalarT>
struct scalar_meets {
  using type = TileT;
};
template <class TileT, class ScalarT>
  requires is_builtin_v<TileT> && (!is_builtin_v<ScalarT>)
struct scalar_meets<TileT, ScalarT> {
  using type = promote_t<TileT, ScalarT>;
};
template <class TileT, class ScalarT>
  requires is_builtin_v<TileT> && is_builtin_v<ScalarT>
struct scalar_meets<TileT, ScalarT> {
  static constexpr bool widens_int =
      is_integer_v<ScalarT> && sizeof(ScalarT) == 8 && !is_floating_v<TileT> && sizeof(TileT) < 8;
  using type = std::conditional_t<
      std::is_floating_point_v<ScalarT> && !is_floating_v<TileT>, float,
      std::conditional_t<widens_int, std::int64_t,
                         std::conditional_t<std::is_same_v<TileT, bool>, promote_t<bool, bool>,
                                            TileT>>>;
};
template <class TileT, class ScalarT>
using scalar_meets_t = typename scalar_meets<TileT, ScalarT>::type;

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
                                 "before computing (to<fp32<T>>(x) in a kernel generic over T: "
                                 "it stays float64 in the checker's reference)");
  using S = broadcast_shape_t<shape_of_t<node_t<A>>, shape_of_t<node_t<B>>>;
  return make_map<Op>(broadcast_as<S>(convert_as<U>(as_node(std::forward<A>(a)))),
                      broadcast_as<S>(convert_as<U>(as_node(std::forward<B>(b)))));
}

template <class Op, class A>
TILEGRAD_INLINE auto unary(A&& a) {
  using T = elem_t<A>;
  static_assert(computable_v<T>, "tilegrad: bf16 is a storage type: convert with to<float>(x) "
                                 "before computing (to<fp32<T>>(x) in a kernel generic over T: "
                                 "it stays float64 in the checker's reference)");
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

// The comparison with its operands swapped: n < x is x > n.
template <class Op>
struct mirrored;
template <>
struct mirrored<ops::lt_op> {
  using type = ops::gt_op;
};
template <>
struct mirrored<ops::gt_op> {
  using type = ops::lt_op;
};
template <>
struct mirrored<ops::le_op> {
  using type = ops::ge_op;
};
template <>
struct mirrored<ops::ge_op> {
  using type = ops::le_op;
};

template <class Op>
inline constexpr bool is_ordering_v =
    std::is_same_v<Op, ops::lt_op> || std::is_same_v<Op, ops::le_op> ||
    std::is_same_v<Op, ops::gt_op> || std::is_same_v<Op, ops::ge_op>;

// Whether ordering tile X against number Y stays at X's width (narrowed_order).
template <class X, class Y>
concept narrowed_comparison =
    tile_expression<X> && !tile_expression<Y> && is_integer_v<elem_t<X>> &&
    std::is_signed_v<elem_t<X>> && sizeof(elem_t<X>) < 8 && is_integer_v<elem_t<Y>> &&
    sizeof(elem_t<Y>) == 8;

/// x Op n for a signed integer tile x narrower than the 64-bit integer n (`offs < n` with n a
/// size): the answer of int64 arithmetic, computed at x's own width, so that a mask keeps the
/// vector width of the floats it selects (no register holds as many int64 lanes, and masked
/// loads would go lane by lane). x < n is x <= n - 1 and x >= n is x > n - 1, the bound clamped
/// to x's type: a bound above every value of x gives each lane the answer of int64 arithmetic.
/// A bound below every value of x has no such form: that throws, and so does x < n or x >= n
/// with n the smallest value of x's type (n - 1 is below them all).
template <class Op, class X, class N>
TILEGRAD_INLINE auto narrowed_order(X&& x, N n) {
  using I = elem_t<X>;
  using lim = std::numeric_limits<I>;
  constexpr bool strict = std::is_same_v<Op, ops::lt_op> || std::is_same_v<Op, ops::ge_op>;
  using form = std::conditional_t<std::is_same_v<Op, ops::lt_op> || std::is_same_v<Op, ops::le_op>,
                                  ops::le_op, ops::gt_op>;
  if (std::cmp_less(n, strict ? lim::min() + 1 : lim::min()))
    throw std::out_of_range(
        "tilegrad: an integer tile of " + std::to_string(sizeof(I) * 8) + " bits compared with " +
        std::to_string(n) +
        (std::cmp_less(n, lim::min())
             ? ", below every value it holds"
             : std::string(" by ") + (std::is_same_v<Op, ops::lt_op> ? "<" : ">=") +
                   ", its type's smallest value (the comparison is x <= n - 1 or x > n - 1 at "
                   "the tile's width, and n - 1 is below every value it holds)") +
        ": widen it first (to<std::int64_t>(x) < n)");
  I const bound = std::cmp_greater(n, lim::max())
                      ? lim::max()
                      : static_cast<I>(static_cast<I>(n) - (strict ? 1 : 0));
  return binary<form>(std::forward<X>(x), bound);
}

template <class Op, class A, class B>
TILEGRAD_INLINE auto compare(A&& a, B&& b) {
  if constexpr (is_ordering_v<Op> && narrowed_comparison<A, B>)
    return narrowed_order<Op>(std::forward<A>(a), b);
  else if constexpr (is_ordering_v<Op> && narrowed_comparison<B, A>)
    return narrowed_order<typename mirrored<Op>::type>(std::forward<B>(b), a);
  else
    return binary<Op>(std::forward<A>(a), std::forward<B>(b));
}

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
// Bitwise on integer tiles, logical on bool tiles (Triton's & | ^ on masks).
TILEGRAD_BINARY_OPERATOR(<<, shl_op, integer_operands)
TILEGRAD_BINARY_OPERATOR(>>, shr_op, integer_operands)
#undef TILEGRAD_BINARY_OPERATOR

// Comparisons: an integer tile ordered against a 64-bit number stays at its own width (exactly,
// see narrowed_order); other operands promote as arithmetic does.
#define TILEGRAD_COMPARISON_OPERATOR(OP, OPNAME)                                                   \
  template <class A, class B>                                                                      \
    requires detail::binary_operands<A, B>                                                         \
  TILEGRAD_INLINE auto operator OP(A&& a, B&& b) {                                                 \
    return detail::compare<ops::OPNAME>(std::forward<A>(a), std::forward<B>(b));                   \
  }
TILEGRAD_COMPARISON_OPERATOR(==, eq_op)
TILEGRAD_COMPARISON_OPERATOR(!=, ne_op)
TILEGRAD_COMPARISON_OPERATOR(<, lt_op)
TILEGRAD_COMPARISON_OPERATOR(<=, le_op)
TILEGRAD_COMPARISON_OPERATOR(>, gt_op)
TILEGRAD_COMPARISON_OPERATOR(>=, ge_op)
#undef TILEGRAD_COMPARISON_OPERATOR

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
// A number that enters expressions as a node of its own (an item of a reverse-mode tile, whose
// derivative flows back to it) selects as that rank-0 node does.
template <class X>
using where_operand_t = std::conditional_t < !tile_expression<X> && requires(X const& x) {
  x.as_expr_node();
}
, node_t<X>, X > ;
} // namespace detail

template <tile_expression C, class A, class B>
  requires std::is_same_v<value_of_t<C>, bool> &&
           (tile_expression<A> || scalar_operand<A>) && (tile_expression<B> || scalar_operand<B>)
TILEGRAD_INLINE auto where(C&& c, A&& a, B&& b) {
    using T =
        typename detail::where_type<detail::where_operand_t<A>, detail::where_operand_t<B>>::type;
    using S = broadcast_shape_t<
        shape_of_t<detail::node_t<C>>,
        broadcast_shape_t<shape_of_t<detail::node_t<A>>, shape_of_t<detail::node_t<B>>>>;
    return make_map<ops::where_op>(
        detail::broadcast_as<S>(detail::as_node(std::forward<C>(c))),
        detail::broadcast_as<S>(detail::convert_as<T>(detail::as_node(std::forward<A>(a)))),
        detail::broadcast_as<S>(detail::convert_as<T>(detail::as_node(std::forward<B>(b)))));
}

/// where(c, a, b) with a bool number for c (tl.where broadcasts a scalar condition): the same as
/// a rank-0 bool tile.
template <class C, class A, class B>
requires std::is_same_v < std::remove_cvref_t<C>,
bool > &&(tile_expression<A> || tile_expression<B>)&&(tile_expression<A> || scalar_operand<A>)&&(
           tile_expression<B> || scalar_operand<B>)TILEGRAD_INLINE auto where(C c, A&& a, B&& b) {
  return where(tile<bool>(c), std::forward<A>(a), std::forward<B>(b));
}

/// A condition tile of another type than bool: a message that says what to write.
template <tile_expression C, class A, class B>
requires(!std::is_same_v<value_of_t<C>, bool>) void where(C&&, A&&, B&&) {
  static_assert(detail::dependent_false<C>,
                "tilegrad::where: the condition is a bool tile (a comparison such as x > 0, or a "
                "mask); for a tile of numbers write where(c != 0, a, b)");
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

namespace detail {
template <class T>
struct number_of {
  using type = T;
};
template <rebindable_scalar T>
struct number_of<T> {
  using type = typename T::primal_type;
};
/// The number type of an element: double for double, dual<double, N> and adjoint<double>.
template <class T>
using number_of_t = typename number_of<std::remove_cv_t<T>>::type;
} // namespace detail

/// to<U>(x): element-type conversion (Triton's x.to(U)). Float to bf16 rounds to nearest
/// even; float to integer truncates toward zero. On tiles that carry derivatives (dual,
/// adjoint), a float type names that width in the same mode: to<double> of adjoint<float> is
/// adjoint<double>, to<float> keeps the derivatives, and to<bf16> rounds the value to bf16
/// precision at its own width (the rounding is differentiated as the identity).
///
/// Inside a float64 reference of the checker (check_backward, dot_product_test, taylor_test),
/// to<float> of a float64 value throws: write to<fp32<T>>; so does to<bf16> in taylor_test's
/// runs: write to<T> (grid/program.hpp).
template <class U, tile_expression A>
TILEGRAD_INLINE auto to(A&& a, std::source_location where = std::source_location::current()) {
  using From = detail::elem_t<A>;
  if constexpr (std::is_same_v<U, float> && std::is_same_v<detail::number_of_t<From>, double>)
    detail::refuse_float64_narrowing(where);
  if constexpr (std::is_same_v<U, bf16> && std::is_same_v<detail::number_of_t<From>, double>)
    detail::refuse_float64_bf16(where);
  if constexpr (!detail::rebindable_scalar<From> ||
                !(std::is_floating_point_v<U> || std::is_same_v<U, bf16>))
    return detail::convert_as<U>(detail::as_node(std::forward<A>(a)));
  else if constexpr (std::is_same_v<U, bf16>)
    return make_map<ops::round_bf16_op>(detail::as_node(std::forward<A>(a)));
  else
    return detail::convert_as<rebind_scalar_t<From, U>>(detail::as_node(std::forward<A>(a)));
}

} // namespace tilegrad
