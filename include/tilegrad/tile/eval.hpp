// Evaluation: the only place with loops over expression elements. One fused loop per
// expression: full SIMD batches along each innermost row, a scalar tail at the row's end.
#pragma once

#include "tilegrad/core/config.hpp"
#include "tilegrad/core/simd.hpp"
#include "tilegrad/tile/expr.hpp"

#include <cstdint>
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

/// dst[row, col] = e[row, col] over shape S, in one pass. E::value_type must be T.
template <class S, class T, class E>
TILEGRAD_INLINE void assign(T* dst, E const& e) {
  static_assert(std::is_same_v<value_of_t<E>, T>);
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

/// dst (C x R) = src (R x C) transposed; by 16 x 16 blocks on vector registers where the target
/// has them (simd::has_transpose16_v) and the extents allow: a lane-by-lane transpose of 64 x 64
/// floats cost a quarter of a 64 x 64 x 64 product.
template <class T, int R, int C>
void transpose_into(T* dst, T const* src) {
  if constexpr (simd::has_transpose16_v<T> && R % 16 == 0 && C % 16 == 0) {
    for (int i = 0; i < R; i += 16)
      for (int j = 0; j < C; j += 16)
        simd::transpose16(dst + j * R + i, R, src + i * C + j, C);
  } else {
    for (int i = 0; i < R; ++i)
      for (int j = 0; j < C; ++j) dst[j * R + i] = src[i * C + j];
  }
}

/// assign<S>(dst, e) with non-temporal stores (simd::store_stream) where the target has them and
/// a row covers whole 64-byte lines (it starts on a line and its length is a multiple of 64
/// bytes); otherwise as assign. (A line written partly by non-temporal stores and partly by
/// plain ones, such as the line two rows of 1000 floats share, cost more than plain stores.)
/// The caller fences (simd::stream_fence) before other threads read dst.
template <class S, class T, class E>
TILEGRAD_INLINE void assign_streaming(T* dst, E const& e) {
  static_assert(std::is_same_v<value_of_t<E>, T>);
  constexpr int W = width_for<T, E>;
  if constexpr (simd::has_stream_store<T, W> && S::inner * sizeof(T) % 64 == 0) {
    constexpr int N = S::inner;
    constexpr int vec_end = N / W * W;
    for (int r = 0; r < S::rows; ++r) {
      T* d = dst + r * N;
      if (reinterpret_cast<std::uintptr_t>(d) % 64 == 0) {
        for (int c = 0; c < vec_end; c += W)
          simd::store_stream<T, W>(d + c, e.template load<W>(r, c));
      } else {
        for (int c = 0; c < vec_end; c += W) simd::store<T, W>(d + c, e.template load<W>(r, c));
      }
      for (int c = vec_end; c < N; ++c) d[c] = e.template load<1>(r, c);
    }
  } else {
    assign<S>(dst, e);
  }
}

/// dst[c] = e[0, c] for c in [0, n), 0 <= n <= S::inner, for a shape of one row: a row cut short
/// by the end of a tensor, written without the lanes past it.
template <class S, class T, class E>
TILEGRAD_INLINE void assign_prefix(T* dst, E const& e, int n) {
  static_assert(S::rows == 1 && std::is_same_v<value_of_t<E>, T>);
  constexpr int W = width_for<T, E>;
  int c = 0;
  if constexpr (W > 1)
    for (; c + W <= n; c += W) simd::store<T, W>(dst + c, e.template load<W>(0, c));
  for (; c < n; ++c) dst[c] = e.template load<1>(0, c);
}

/// assign_prefix<S>(dst, e, n) with non-temporal stores where the target has them and the n
/// elements cover whole 64-byte lines (as assign_streaming).
template <class S, class T, class E>
TILEGRAD_INLINE void assign_prefix_streaming(T* dst, E const& e, int n) {
  static_assert(S::rows == 1 && std::is_same_v<value_of_t<E>, T>);
  constexpr int W = width_for<T, E>;
  if constexpr (simd::has_stream_store<T, W>) {
    if (reinterpret_cast<std::uintptr_t>(dst) % 64 == 0 && n % W == 0) {
      for (int c = 0; c < n; c += W) simd::store_stream<T, W>(dst + c, e.template load<W>(0, c));
      return;
    }
  }
  assign_prefix<S>(dst, e, n);
}

} // namespace tilegrad::detail
