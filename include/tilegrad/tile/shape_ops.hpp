// Shape manipulation: expand_dims, broadcast_to, reshape, trans/permute, and the spellings of
// x[:, None] (col) and x[None, :] (row). All are views; none moves data until evaluated.
#pragma once

#include "tilegrad/core/shape.hpp"
#include "tilegrad/tile/expr.hpp"
#include "tilegrad/tile/tile.hpp"

#include <type_traits>
#include <utility>

namespace tilegrad {

namespace detail {
template <class S, int Axis, class Seq>
struct insert_axis;
template <class S, int Axis, std::size_t... Is>
struct insert_axis<S, Axis, std::index_sequence<Is...>> {
  static constexpr int ext(int i) { return i < Axis ? S::dim(i) : i == Axis ? 1 : S::dim(i - 1); }
  using type = shape<ext(static_cast<int>(Is))...>;
};

template <class From, class To>
struct reshape_changes_size {
  static_assert(From::size == To::size,
                "tilegrad: reshape must keep the number of elements");
  static constexpr bool value = true;
};

template <class From, class To>
struct cannot_broadcast_to {
  static_assert(broadcastable_v<From, To> && From::rank <= To::rank &&
                    std::is_same_v<broadcast_shape_t<From, To>, To>,
                "tilegrad: broadcast_to: the tile's shape does not broadcast to the target");
  static constexpr bool value = true;
};

template <class S, class N>
TILEGRAD_INLINE auto reshape_as(N&& n) {
  using D = std::remove_cvref_t<N>;
  using C = shape_of_t<D>;
  static_assert(C::size == S::size ? true : reshape_changes_size<C, S>::value);
  if constexpr (std::is_same_v<C, S>)
    return D(std::forward<N>(n));
  else if constexpr (requires { typename D::reshape_source; }) // reshape of a reshape: collapse
    return reshape_node<typename D::reshape_source, S>{{}, std::forward<N>(n).e};
  else
    return reshape_node<D, S>{{}, std::forward<N>(n)};
}
} // namespace detail

/// reshape<Ns...>(x): the same elements, row-major, in a new shape.
template <int... Ns, tile_expression E>
TILEGRAD_INLINE auto reshape(E&& e) {
  return detail::reshape_as<shape<Ns...>>(detail::as_node(std::forward<E>(e)));
}

/// expand_dims<Axis>(x): inserts an axis of extent 1 (Axis may be negative, as in NumPy).
template <int Axis, tile_expression E>
TILEGRAD_INLINE auto expand_dims(E&& e) {
  using S = shape_of_t<E>;
  static_assert(Axis >= -(S::rank + 1) && Axis <= S::rank,
                "tilegrad: expand_dims axis out of range for this tile's rank");
  constexpr int a = Axis < 0 ? Axis + S::rank + 1 : Axis;
  using R = typename detail::insert_axis<S, a, std::make_index_sequence<S::rank + 1>>::type;
  return detail::reshape_as<R>(detail::as_node(std::forward<E>(e)));
}

/// col(x) is x[:, None]: a rank-1 tile as a column (N, 1).
template <tile_expression E>
TILEGRAD_INLINE auto col(E&& e) {
  static_assert(shape_of_t<E>::rank == 1, "tilegrad: col(x) takes a rank-1 tile (x[:, None])");
  return expand_dims<1>(std::forward<E>(e));
}

/// row(x) is x[None, :]: a rank-1 tile as a row (1, N).
template <tile_expression E>
TILEGRAD_INLINE auto row(E&& e) {
  static_assert(shape_of_t<E>::rank == 1, "tilegrad: row(x) takes a rank-1 tile (x[None, :])");
  return expand_dims<0>(std::forward<E>(e));
}

/// broadcast_to<Ns...>(x): x repeated along its extent-1 and missing leading axes.
template <int... Ns, tile_expression E>
TILEGRAD_INLINE auto broadcast_to(E&& e) {
  using S = shape<Ns...>;
  static_assert(detail::cannot_broadcast_to<shape_of_t<E>, S>::value);
  return detail::broadcast_as<S>(detail::as_node(std::forward<E>(e)));
}

/// permute<P...>(x): output axis i is input axis P[i] (Triton's permute / trans with dims).
template <int... P, tile_expression E>
TILEGRAD_INLINE auto permute(E&& e) {
  using S = shape_of_t<E>;
  static_assert(sizeof...(P) == S::rank, "tilegrad: permute needs one axis per dimension");
  static_assert(((P >= 0 && P < S::rank) && ...), "tilegrad: permute axis out of range");
  static_assert(((((1 << P) | ...)) == (1 << S::rank) - 1),
                "tilegrad: permute axes must be a permutation");
  using D = detail::node_t<E>;
  return permute_node<D, P...>{{}, detail::as_node(std::forward<E>(e))};
}

/// trans(x): the transpose of a rank-2 tile (Triton's tl.trans).
template <tile_expression E>
TILEGRAD_INLINE auto trans(E&& e) {
  static_assert(shape_of_t<E>::rank == 2,
                "tilegrad: trans(x) transposes a rank-2 tile: a rank-1 tile has nothing to "
                "transpose (col(x) and row(x) make it a column or a row, x[:, None] and "
                "x[None, :]); for rank 3 use permute<...>(x)");
  if constexpr (shape_of_t<E>::rank == 2) // (no further errors from permute)
    return permute<1, 0>(std::forward<E>(e));
}

} // namespace tilegrad
