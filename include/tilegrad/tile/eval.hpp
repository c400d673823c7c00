// Evaluation: the only place with loops over expression elements. One fused loop per
// expression: full SIMD batches along each innermost row, a scalar tail at the row's end.
#pragma once

#include "tilegrad/core/config.hpp"
#include "tilegrad/core/simd.hpp"
#include "tilegrad/tile/expr.hpp"

#include <type_traits>

namespace tilegrad::detail {

/// Lanes an evaluation into T uses: T's register width (bool tiles go at float's width).
template <class T>
inline constexpr int eval_width =
    std::is_same_v<T, bool> ? simd::native_width<float> : simd::native_width<T>;

/// The lane count evaluating E into a T uses: the vector width when every node of E supports
/// it, else 1 (the scalar path, which any element type supports).
template <class T, class E>
inline constexpr int width_for = (eval_width<T> > 1 && E::template vectorizes<eval_width<T>>)
                                     ? eval_width<T>
                                     : 1;

/// Whether E is a float expression converted to bf16 that can run on W float lanes, rounded
/// to bf16 by simd::store_bf16.
template <class E, int W>
inline constexpr bool bf16_of_float_lanes = false;
template <class X, int W>
inline constexpr bool bf16_of_float_lanes<convert_node<bf16, X>, W> =
    std::is_same_v<value_of_t<X>, float> && W > 1 && X::template vectorizes<W> &&
    simd::has_bf16_store<W>;

/// A node that reads another in place (what an evaluation loop keeps of nodes it has no
/// bound form for).
template <class N>
struct ref_node : node_base {
  using value_type = value_of_t<N>;
  using shape_type = shape_of_t<N>;
  static constexpr bool may_alias = N::may_alias;
  template <int W>
  static constexpr bool vectorizes = N::template vectorizes<W>;

  N const* n;

  template <int W>
  TILEGRAD_INLINE simd::vec_t<value_type, W> load(int row, int col) const {
    return n->template load<W>(row, col);
  }
};

/// bound<N>::of(n): n as one evaluation loop reads it. A loop writes only its destination, and
/// its destination is final before the loop starts (a tile that borrowed it has its own copy),
/// so what the leaves read through does not move while it runs: a heap tile's storage pointer is
/// read once (tile_view -> tile_ref), a rank-0 tile's value once (-> scalar_node). Read in the
/// loop, both would be read again for every vector: a SIMD store may write memory of any type,
/// so the compiler cannot keep them in registers across it.
template <class N>
struct bound {
  TILEGRAD_INLINE static auto of(N const& n) {
    if constexpr (is_tile_v<N>) { // a temporary tile held by the expression
      if constexpr (shape_of_t<N>::rank == 0)
        return scalar_node<value_of_t<N>>{{}, n.data()[0]};
      else
        return tile_ref<value_of_t<N>, shape_of_t<N>>{{}, n.data()};
    } else {
      return ref_node<N>{{}, &n};
    }
  }
};
template <class N>
TILEGRAD_INLINE auto bind_node(N const& n) {
  return bound<N>::of(n);
}
template <class T, class S>
struct bound<tile_view<T, S>> {
  TILEGRAD_INLINE static tile_ref<T, S> of(tile_view<T, S> const& n) { return {{}, *n.pp}; }
};
template <class T, class S>
struct bound<tile_ref<T, S>> {
  TILEGRAD_INLINE static auto of(tile_ref<T, S> const& n) {
    if constexpr (S::rank == 0)
      return scalar_node<T>{{}, *n.p};
    else
      return n;
  }
};
template <class T>
struct bound<scalar_node<T>> {
  TILEGRAD_INLINE static scalar_node<T> of(scalar_node<T> const& n) { return n; }
};
template <class E, class S>
struct bound<broadcast_node<E, S>> {
  TILEGRAD_INLINE static auto of(broadcast_node<E, S> const& n) {
    using B = decltype(bind_node(n.e));
    return broadcast_node<B, S>{{}, bind_node(n.e)};
  }
};
template <class To, class E>
struct bound<convert_node<To, E>> {
  TILEGRAD_INLINE static auto of(convert_node<To, E> const& n) {
    using B = decltype(bind_node(n.e));
    return convert_node<To, B>{{}, bind_node(n.e)};
  }
};
template <class E, class S>
struct bound<reshape_node<E, S>> {
  TILEGRAD_INLINE static auto of(reshape_node<E, S> const& n) {
    using B = decltype(bind_node(n.e));
    return reshape_node<B, S>{{}, bind_node(n.e)};
  }
};
template <class E, int... P>
struct bound<permute_node<E, P...>> {
  TILEGRAD_INLINE static auto of(permute_node<E, P...> const& n) {
    using B = decltype(bind_node(n.e));
    return permute_node<B, P...>{{}, bind_node(n.e)};
  }
};
template <class Op, class... Es>
struct bound<map_node<Op, Es...>> {
  TILEGRAD_INLINE static auto of(map_node<Op, Es...> const& n) {
    return n.es.apply([&](auto const&... e) TILEGRAD_INLINE_LAMBDA {
      return map_node<Op, decltype(bind_node(e))...>{
          {}, n.op, operands<decltype(bind_node(e))...>(bind_node(e)...)};
    });
  }
};

/// dst[row, col] = e[row, col] over shape S, in one pass. E::value_type must be T.
template <class S, class T, class E>
TILEGRAD_INLINE void assign(T* dst, E const& expr) {
  static_assert(std::is_same_v<value_of_t<E>, T>);
  auto const e = bind_node(expr);
  if constexpr (bf16_of_float_lanes<E, simd::native_width<float>>) {
    // to<bf16>(float expression): the expression on float lanes, rounded 16 lanes at once.
    constexpr int W = simd::native_width<float>;
    constexpr int N = S::inner;
    constexpr int vec_end = N / W * W;
    for (int r = 0; r < S::rows; ++r) {
      T* d = dst + r * N;
      for (int c = 0; c < vec_end; c += W) simd::store_bf16<W>(d + c, e.e.template load<W>(r, c));
      for (int c = vec_end; c < N; ++c) d[c] = e.template load<1>(r, c);
    }
    return;
  }
  constexpr int W = width_for<T, E>;
  constexpr int N = S::inner;
  // Where the vector part ends is a constant: the tail loop then has constant bounds (none at
  // all when W divides N). A tail starting where the vector loop left off made GCC 12 at -O2
  // derive a wrapping trip count for it and warn (-Waggressive-loop-optimizations) of overflow
  // in index arithmetic such as q0 + arange, on iterations that never run.
  constexpr int vec_end = W > 1 ? N / W * W : 0;
  for (int r = 0; r < S::rows; ++r) {
    T* d = dst + r * N;
    if constexpr (W > 1) {
      for (int c = 0; c < vec_end; c += W) simd::store<T, W>(d + c, e.template load<W>(r, c));
    }
    for (int c = vec_end; c < N; ++c) d[c] = e.template load<1>(r, c);
  }
}

} // namespace tilegrad::detail
