// Tile creation: zeros, full, arange (Triton's tl.zeros, tl.full, tl.arange).
#pragma once

#include "tilegrad/core/simd.hpp"
#include "tilegrad/core/types.hpp"
#include "tilegrad/tile/expr.hpp"
#include "tilegrad/tile/tile.hpp"

#include <cstdint>
#include <type_traits>

namespace tilegrad {

/// A tile of zeros: zeros<fp32<T>, BM, BN>().
template <class T, int... Ns>
tile<T, Ns...> zeros() {
  return tile<T, Ns...>();
}

/// A tile with every element v. A plain number converts to T in every mode, so that
/// full<fp32<T>>(-INFINITY) is the same line on the fast path and in dual or adjoint kernels.
template <class T, int... Ns>
tile<T, Ns...> full(T const& v) {
  return tile<T, Ns...>(v);
}
template <class T, int... Ns, class V>
  requires(!std::is_same_v<std::remove_cvref_t<V>, T> && std::is_arithmetic_v<V>)
tile<T, Ns...> full(V v) {
  return tile<T, Ns...>(static_cast<T>(v));
}

/// The int32 sequence Start, Start+1, ..., End-1 as a lazy rank-1 tile. It stays an expression,
/// so offsets built from it (pid * B + arange<0, B>()) keep their affine structure.
template <int Start, int End>
struct arange_node : node_base {
  static_assert(End > Start, "tilegrad: arange<Start, End> needs End > Start");
  using value_type = std::int32_t;
  using shape_type = shape<End - Start>;
  static constexpr bool may_alias = false;
  template <int W>
  static constexpr bool vectorizes = simd::has_vec_v<std::int32_t, W>;

  template <int W>
  TILEGRAD_INLINE simd::vec_t<std::int32_t, W> load(int, int col) const {
    if constexpr (W == 1) {
      return Start + col;
    } else {
      alignas(64) static constexpr std::int32_t iota[64] = {
          0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
          22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43,
          44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63};
      static_assert(W <= 64);
      return simd::load<std::int32_t, W>(iota) + simd::splat<std::int32_t, W>(Start + col);
    }
  }
};

template <int Start, int End>
TILEGRAD_INLINE arange_node<Start, End> arange() {
  return {};
}

} // namespace tilegrad
