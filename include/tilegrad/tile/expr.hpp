// Expression nodes. A node is plain data: it knows its element type and shape and can produce
// W lanes of one innermost row, `load<W>(row, col)` (W = 1 is the scalar path). Evaluation,
// the only place with loops, lives in eval.hpp.
//
// The protocol every node N follows:
//   N::value_type, N::shape_type
//   N::vectorizes<W>   true when every node below can produce W lanes at once
//   N::may_alias       true when an output element reads input elements at other positions
//                      (transpose): assigning it to one of its own leaves needs a temporary
//   n.load<W>(row, col)  lanes [col, col + W) of row `row` (row = every axis but the last,
//                        flattened row-major), as simd::vec_t<value_type, W>
#pragma once

#include "tilegrad/core/config.hpp"
#include "tilegrad/core/shape.hpp"
#include "tilegrad/core/simd.hpp"
#include "tilegrad/core/types.hpp"

#include <concepts>
#include <tuple>
#include <type_traits>
#include <utility>

namespace tilegrad {

/// Base of every tile expression node (and of tile itself).
struct node_base {};

template <class E>
concept tile_expression = std::derived_from<std::remove_cvref_t<E>, node_base>;

/// A plain number that may meet a tile in an expression (it broadcasts as a rank-0 tile).
template <class X>
concept scalar_operand = !tile_expression<X> && (std::is_arithmetic_v<std::remove_cvref_t<X>> ||
                                                 requires { typename std::remove_cvref_t<X>::scalar_tag; });

template <class E>
using shape_of_t = typename std::remove_cvref_t<E>::shape_type;
template <class E>
using value_of_t = typename std::remove_cvref_t<E>::value_type;

template <class T, int... Ns>
class tile;

template <class X>
inline constexpr bool is_tile_v = false;
template <class T, int... Ns>
inline constexpr bool is_tile_v<tile<T, Ns...>> = true;

// ---------------------------------------------------------------------------------------------
// Leaves
// ---------------------------------------------------------------------------------------------

/// A reference to a tile's storage (how an lvalue tile enters an expression).
template <class T, class S>
struct tile_ref : node_base {
  using value_type = T;
  using shape_type = S;
  static constexpr bool may_alias = false;
  template <int W>
  static constexpr bool vectorizes = simd::has_vec_v<T, W>;

  T const* p;

  template <int W>
  TILEGRAD_INLINE simd::vec_t<T, W> load(int row, int col) const {
    return simd::load<T, W>(p + row * S::inner + col);
  }
};

/// A reference to a heap tile (how an lvalue tile of more than inline_tile_bytes enters an
/// expression): it reads through the tile's storage pointer, so an expression built before the
/// tile took its own copy of borrowed memory (detail::borrows) reads that copy.
template <class T, class S>
struct tile_view : node_base {
  using value_type = T;
  using shape_type = S;
  static constexpr bool may_alias = false;
  template <int W>
  static constexpr bool vectorizes = simd::has_vec_v<T, W>;

  T const* const* pp;

  T const* data() const { return *pp; }
  template <int W>
  TILEGRAD_INLINE simd::vec_t<T, W> load(int row, int col) const {
    return simd::load<T, W>(*pp + row * S::inner + col);
  }
};

/// A number broadcast to every element (rank 0).
template <class T>
struct scalar_node : node_base {
  using value_type = T;
  using shape_type = shape<>;
  static constexpr bool may_alias = false;
  template <int W>
  static constexpr bool vectorizes = simd::has_vec_v<T, W>;

  T value;

  template <int W>
  TILEGRAD_INLINE simd::vec_t<T, W> load(int, int) const {
    return simd::splat<T, W>(value);
  }
};

namespace detail {
template <class X>
TILEGRAD_INLINE auto as_node(X&& x) {
  using D = std::remove_cvref_t<X>;
  if constexpr (requires { x.as_expr_node(); })
    return std::forward<X>(x).as_expr_node(); // a tile that enters expressions as a node of its
                                              // own (reverse mode)
  else if constexpr (is_tile_v<D> && std::is_lvalue_reference_v<X> && requires { x.data_slot(); })
    return tile_view<typename D::value_type, typename D::shape_type>{{}, x.data_slot()};
  else if constexpr (is_tile_v<D> && std::is_lvalue_reference_v<X>)
    return tile_ref<typename D::value_type, typename D::shape_type>{{}, x.data()};
  else if constexpr (tile_expression<D>)
    return D(std::forward<X>(x)); // expressions and temporary tiles are held by value
  else
    return scalar_node<D>{{}, x};
}
template <class X>
using node_t = decltype(as_node(std::declval<X>()));
} // namespace detail

// ---------------------------------------------------------------------------------------------
// Broadcasting and element-type conversion
// ---------------------------------------------------------------------------------------------

/// Views E (shape C) as shape S under NumPy broadcasting: leading axes are added, extent-1
/// axes repeat. No data moves.
template <class E, class S>
struct broadcast_node : node_base {
  using value_type = value_of_t<E>;
  using shape_type = S;
  using C = shape_of_t<E>;
  static_assert(broadcastable_v<C, S> && S::rank >= C::rank,
                "tilegrad: a tile is broadcast to a shape it does not broadcast to (extents must "
                "match or be 1, the target's rank at least the tile's)");
  static constexpr bool may_alias = E::may_alias;
  template <int W>
  static constexpr bool vectorizes = E::template vectorizes<W>;

  E e;

  static constexpr int lead = S::rank - C::rank;
  // Row of E that output row `row` reads: the row index decomposed over S's outer axes, with
  // broadcast axes dropped.
  TILEGRAD_INLINE static int child_row(int row) {
    int cr = 0;
    if constexpr (S::rank >= 2) {
      int rem = row;
      for (int a = S::rank - 2; a >= 0; --a) {
        int const coord = rem % S::dim(a);
        rem /= S::dim(a);
        int const ca = a - lead;
        if (ca >= 0 && C::dim(ca) != 1) cr += coord * (C::stride(ca) / C::inner);
      }
    }
    return cr;
  }

  template <int W>
  TILEGRAD_INLINE simd::vec_t<value_type, W> load(int row, int col) const {
    if constexpr (C::inner == 1 && S::inner != 1)
      return simd::splat<value_type, W>(e.template load<1>(child_row(row), 0));
    else
      return e.template load<W>(child_row(row), col);
  }
};

/// Element-type conversion (to<U>, and promotion of mixed-type operands).
template <class To, class E>
struct convert_node : node_base {
  using value_type = To;
  using shape_type = shape_of_t<E>;
  using from_type = value_of_t<E>;
  static constexpr bool may_alias = E::may_alias;
  template <int W>
  static constexpr bool vectorizes =
      E::template vectorizes<W> && simd::has_vec_v<To, W> && simd::has_vec_v<from_type, W>;

  E e;

  template <int W>
  TILEGRAD_INLINE simd::vec_t<To, W> load(int row, int col) const {
    return simd::convert<To, W, from_type>(e.template load<W>(row, col));
  }
};

namespace detail {
template <class S, class N>
TILEGRAD_INLINE auto broadcast_as(N&& n) {
  using D = std::remove_cvref_t<N>;
  if constexpr (std::is_same_v<shape_of_t<D>, S>)
    return D(std::forward<N>(n));
  else
    return broadcast_node<D, S>{{}, std::forward<N>(n)};
}
template <class T, class N>
TILEGRAD_INLINE auto convert_as(N&& n) {
  using D = std::remove_cvref_t<N>;
  if constexpr (std::is_same_v<value_of_t<D>, T>)
    return D(std::forward<N>(n));
  else if constexpr (std::is_same_v<D, scalar_node<value_of_t<D>>>)
    return scalar_node<T>{{}, static_cast<T>(n.value)}; // convert constants once
  else
    return convert_node<T, D>{{}, std::forward<N>(n)};
}
} // namespace detail

// ---------------------------------------------------------------------------------------------
// Elementwise maps
// ---------------------------------------------------------------------------------------------

namespace detail {
template <std::size_t I, class E>
struct operand_slot {
  [[no_unique_address]] E value;
};
template <class Seq, class... Es>
struct operand_slots;
template <std::size_t... I, class... Es>
struct operand_slots<std::index_sequence<I...>, Es...> : operand_slot<I, Es>... {
  template <class... A>
    requires(sizeof...(A) == sizeof...(Es) && !(sizeof...(A) == 1 && (std::is_base_of_v<operand_slots, std::remove_cvref_t<A>> && ...)))
  constexpr operand_slots(A&&... a) // NOLINT: implicit, for braced lists of operands
      : operand_slot<I, Es>{std::forward<A>(a)}... {}

  template <class F>
  TILEGRAD_INLINE constexpr decltype(auto) apply(F&& f) const {
    return std::forward<F>(f)(static_cast<operand_slot<I, Es> const&>(*this).value...);
  }
  template <class F>
  TILEGRAD_INLINE constexpr decltype(auto) apply(F&& f) {
    return std::forward<F>(f)(static_cast<operand_slot<I, Es>&>(*this).value...);
  }
};

/// The operands of a map node: a tuple that is trivially copyable when they are (std::tuple's
/// assignment is not trivial), so a closure capturing an expression by value is too
/// (tg::loop's capture check clears the padding of such closures, ad/loop.hpp).
template <class... Es>
struct operands : operand_slots<std::index_sequence_for<Es...>, Es...> {
  static constexpr std::size_t size = sizeof...(Es);
  using operand_slots<std::index_sequence_for<Es...>, Es...>::operand_slots;
};

/// The I-th operand.
template <std::size_t I, class E>
TILEGRAD_INLINE constexpr E const& get(operand_slot<I, E> const& s) {
  return s.value;
}
template <std::size_t I, class E>
TILEGRAD_INLINE constexpr E& get(operand_slot<I, E>& s) {
  return s.value;
}
} // namespace detail

/// Op applied lane by lane to operands of one shape. The element type the op works in is the
/// last operand's (for where, the first operand is the mask).
template <class Op, class... Es>
struct map_node : node_base {
  using operand_type = value_of_t<decltype((std::declval<Es>(), ...))>;
  using value_type = typename Op::template result<operand_type>;
  using shape_type = shape_of_t<decltype((std::declval<Es>(), ...))>;
  static_assert((std::is_same_v<shape_of_t<Es>, shape_type> && ...));
  static constexpr bool may_alias = (Es::may_alias || ...);
  template <int W>
  static constexpr bool vectorizes = (Es::template vectorizes<W> && ...) &&
                                     Op::template vectorizes<operand_type> &&
                                     simd::has_vec_v<value_type, W>;

  [[no_unique_address]] Op op;
  detail::operands<Es...> es;

  template <int W>
  TILEGRAD_INLINE simd::vec_t<value_type, W> load(int row, int col) const {
    // (The lambda too: one not inlined is a call per vector of the fused loop.)
    return es.apply([&](auto const&... e) TILEGRAD_INLINE_LAMBDA {
      auto v = Op::apply(e.template load<W>(row, col)...);
      if constexpr (std::is_same_v<value_type, bool> && W > 1)
        return simd::mask_for<bool, W>(v); // masks of any element type -> one mask type
      else
        return static_cast<simd::vec_t<value_type, W>>(v);
    });
  }
};

template <class Op, class... Es>
TILEGRAD_INLINE auto make_map(Es&&... es) {
  return map_node<Op, std::remove_cvref_t<Es>...>{
      {}, {}, detail::operands<std::remove_cvref_t<Es>...>(std::forward<Es>(es)...)};
}

// ---------------------------------------------------------------------------------------------
// Layout views
// ---------------------------------------------------------------------------------------------

/// E's elements, row-major, read as shape S (same element count).
template <class E, class S>
struct reshape_node : node_base {
  using reshape_source = E;
  using value_type = value_of_t<E>;
  using shape_type = S;
  using C = shape_of_t<E>;
  static constexpr bool may_alias = E::may_alias;
  // A run of W output lanes stays inside one row of E when E's rows are whole multiples of S's.
  template <int W>
  static constexpr bool vectorizes = E::template vectorizes<W> && (C::inner % S::inner == 0);

  E e;

  template <int W>
  TILEGRAD_INLINE simd::vec_t<value_type, W> load(int row, int col) const {
    int const flat = row * S::inner + col;
    return e.template load<W>(flat / C::inner, flat % C::inner);
  }
};

/// Axis permutation of a rank-2 or rank-3 tile: output axis i is input axis P[i].
template <class E, int... P>
struct permute_node : node_base {
  using value_type = value_of_t<E>;
  using C = shape_of_t<E>;
  using shape_type = shape<C::dim(P)...>;
  using S = shape_type;
  static constexpr bool may_alias = true;
  static constexpr int perm(int i) {
    constexpr int p[] = {P...};
    return p[i];
  }
  template <int W>
  static constexpr bool vectorizes = (W == 1);

  E e;

  template <int W>
  TILEGRAD_INLINE simd::vec_t<value_type, W> load(int row, int col) const {
    static_assert(W == 1);
    // output coordinates -> input coordinates
    int out[3] = {0, 0, 0};
    int rem = row;
    out[S::rank - 1] = col;
    for (int a = S::rank - 2; a >= 0; --a) {
      out[a] = rem % S::dim(a);
      rem /= S::dim(a);
    }
    int in[3] = {0, 0, 0};
    constexpr int perm[] = {P...};
    for (int a = 0; a < S::rank; ++a) in[perm[a]] = out[a];
    int in_row = 0;
    for (int a = 0; a < C::rank - 1; ++a) in_row += in[a] * (C::stride(a) / C::inner);
    return e.template load<1>(in_row, in[C::rank - 1]);
  }
};

namespace detail {

// trans(x) of a tile already in memory: dot reads it in place as its left operand, and a tile made
// from it is transposed by blocks (detail::transpose_into).
template <class T, class E>
struct stored_transpose : std::false_type {};
template <class T, class S>
struct stored_transpose<T, permute_node<tile_ref<T, S>, 1, 0>> : std::true_type {
  static T const* data(permute_node<tile_ref<T, S>, 1, 0> const& n) { return n.e.p; }
};
template <class T, class S>
struct stored_transpose<T, permute_node<tile_view<T, S>, 1, 0>> : std::true_type {
  static T const* data(permute_node<tile_view<T, S>, 1, 0> const& n) { return n.e.data(); }
};
template <class T, int... Ns>
struct stored_transpose<T, permute_node<tile<T, Ns...>, 1, 0>> : std::true_type {
  static T const* data(permute_node<tile<T, Ns...>, 1, 0> const& n) { return n.e.data(); }
};

} // namespace detail

} // namespace tilegrad
