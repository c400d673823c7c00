// dot(a, b[, acc]): the tile matrix product (Triton's tl.dot), a @ b + acc, accumulating in
// fp32 (fp64 for double). Float and double run a register-blocked micro-kernel: a block of
// MR rows x NB vectors of C lives in registers while k runs, each step broadcasting one
// element of A and loading NB vectors of one row of B (B is row-major: no packing needed).
// Two bf16 operands run the bf16 dot-product kernel of dot_bf16.hpp where the target has one.
#pragma once

#include "tilegrad/ad/adjoint.hpp"
#include "tilegrad/core/config.hpp"
#include "tilegrad/core/simd.hpp"
#include "tilegrad/core/types.hpp"
#include "tilegrad/tile/dot_bf16.hpp"
#include "tilegrad/tile/elementwise.hpp"
#include "tilegrad/tile/expr.hpp"
#include "tilegrad/tile/reduce.hpp"
#include "tilegrad/tile/tile.hpp"

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

namespace tilegrad {

namespace ad { // reverse mode (ad/reduce.hpp) takes over when an operand is an adjoint tile
template <class A, class B, class C>
auto dot(A&& a, B&& b, C&& acc);
template <class A, class B>
auto dot(A&& a, B&& b);
} // namespace ad

namespace detail {

// A's element (i, k): A is stored row-major as (M, K), or with TransA as its transpose (K, M),
// which is how dot(trans(x), y) reads x without copying it.
template <class T, int M, int K, bool TransA>
TILEGRAD_INLINE T a_at(T const* a, int i, int k) {
  if constexpr (TransA)
    return a[k * M + i];
  else
    return a[i * K + k];
}

// C[i0:i0+MR, j0:j0+NB*W] += A[i0:i0+MR, :] @ B[:, j0:j0+NB*W] (with Zero, = instead of +=)
template <class T, int W, int MR, int NB, int M, int N, int K, bool TransA, bool Zero>
TILEGRAD_INLINE void gemm_block(T* c, T const* a, T const* b, int i0, int j0) {
  using V = simd::vec_t<T, W>;
  V acc[MR][NB];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int q = 0; q < NB; ++q)
      acc[r][q] = Zero ? simd::splat<T, W>(T(0)) : simd::load<T, W>(c + (i0 + r) * N + j0 + q * W);
  for (int k = 0; k < K; ++k) {
    V bv[NB];
#pragma GCC unroll 8
    for (int q = 0; q < NB; ++q) bv[q] = simd::load<T, W>(b + k * N + j0 + q * W);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      V const av = simd::splat<T, W>(a_at<T, M, K, TransA>(a, i0 + r, k));
#pragma GCC unroll 8
      for (int q = 0; q < NB; ++q) acc[r][q] = ops::fma_op::apply(av, bv[q], acc[r][q]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int q = 0; q < NB; ++q) simd::store<T, W>(c + (i0 + r) * N + j0 + q * W, acc[r][q]);
}

// All row blocks of one column block of NB vectors starting at j0.
template <class T, int W, int MR, int NB, int M, int N, int K, bool TransA, bool Zero>
TILEGRAD_INLINE void gemm_columns(T* c, T const* a, T const* b, int j0) {
  constexpr int full = M / MR * MR;
  for (int i0 = 0; i0 < full; i0 += MR)
    gemm_block<T, W, MR, NB, M, N, K, TransA, Zero>(c, a, b, i0, j0);
  if constexpr (M % MR != 0)
    gemm_block<T, W, M % MR, NB, M, N, K, TransA, Zero>(c, a, b, full, j0);
}

/// C (M x N) += A (M x K) @ B (K x N), all row-major and contiguous; with TransA, `a` holds
/// A's transpose (K x M). With Zero, C = A @ B: C's elements are not read (they may be
/// uninitialised).
template <class T, int M, int N, int K, bool TransA = false, bool Zero = false>
void gemm(T* c, T const* a, T const* b);

/// A product of dual numbers (forward mode) as products of planes of numbers: C.v += A.v B.v and,
/// for each direction, C.d += A.d B.v + A.v B.d, each by the register-blocked kernel of the
/// number type. The dual loop below runs one dual multiply-add at a time, whose tangent terms
/// branch on zeros (a zero tangent times an infinite partial is 0): forward mode's FlashAttention
/// spent two thirds of its time there. Where every value and tangent is finite, a term is the
/// plain product, and the planes give the same sums (in another order); otherwise the dual loop
/// runs. @return whether the planes ran.
template <class T, int M, int N, int K, bool TransA, bool Zero>
bool gemm_dual_planes(T* c, T const* a, T const* b) {
  using V = typename T::primal_type;
  constexpr int D = T::directions;
  constexpr std::size_t SA = std::size_t{M} * K, SB = std::size_t{K} * N, SC = std::size_t{M} * N;
  thread_local std::vector<V> buffer;
  buffer.resize((SA + SB + SC) * (D + 1));
  V* const pa = buffer.data();     // A's planes: values, then each direction's tangents
  V* const pb = pa + SA * (D + 1); // B's
  V* const pc = pb + SB * (D + 1); // C's
  // x - x is 0 for a finite x and NaN for an infinite or NaN one: the sum of them is 0 exactly
  // when every value and tangent is finite (16 sums side by side, which vectorise).
  auto split = [&](T const* x, V* planes, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      planes[i] = x[i].v;
      for (int k = 0; k < D; ++k)
        planes[(k + 1) * n + i] = x[i].d[k];
    }
    V sums[16] = {};
    std::size_t const all = n * (D + 1), whole = all - all % 16;
    for (std::size_t i = 0; i < whole; i += 16)
      for (int l = 0; l < 16; ++l)
        sums[l] += planes[i + l] - planes[i + l];
    // (The rest counted from zero: GCC 12 at -O3 warned of the loop `for (; i < all; ++i)`,
    // which never runs where `all` is a multiple of 16, as it invoking undefined behaviour.)
    for (std::size_t j = 0; j < all % 16; ++j)
      sums[0] += planes[whole + j] - planes[whole + j];
    V total = 0;
    for (V s : sums)
      total += s;
    return total == V(0);
  };
  if (!split(a, pa, SA) || !split(b, pb, SB))
    return false;
  if constexpr (Zero)
    std::fill_n(pc, SC * (D + 1), V(0));
  else if (!split(c, pc, SC))
    return false;
  gemm<V, M, N, K, TransA, false>(pc, pa, pb);
  for (int k = 1; k <= D; ++k) {
    gemm<V, M, N, K, TransA, false>(pc + k * SC, pa + k * SA, pb);
    gemm<V, M, N, K, TransA, false>(pc + k * SC, pa, pb + k * SB);
  }
  for (std::size_t i = 0; i < SC; ++i) {
    c[i].v = pc[i];
    for (int k = 0; k < D; ++k)
      c[i].d[k] = pc[(k + 1) * SC + i];
  }
  return true;
}

template <class T, int M, int N, int K, bool TransA, bool Zero>
void gemm(T* c, T const* a, T const* b) {
  constexpr int W = simd::native_width<T>;
  if constexpr (requires { typename T::dual_tag; }) {
    if (gemm_dual_planes<T, M, N, K, TransA, Zero>(c, a, b))
      return;
  }
  if constexpr (Zero && (W == 1 || N % W != 0)) { // the plain loops below add to C
    std::fill_n(c, M * N, T(0));
    gemm<T, M, N, K, TransA, false>(c, a, b);
  } else if constexpr (W == 1) {
    for (int i = 0; i < M; ++i)
      for (int k = 0; k < K; ++k) {
        T const aik = a_at<T, M, K, TransA>(a, i, k);
        for (int j = 0; j < N; ++j) c[i * N + j] = c[i * N + j] + aik * b[k * N + j];
      }
  } else {
    // Register budget: 32 vector registers with AVX-512, 16 otherwise. MR x NB accumulators,
    // NB operands of B and one broadcast of A must fit.
    constexpr bool wide = W * sizeof(T) == 64;
    constexpr int NB = wide ? 4 : 2;
    constexpr int MR = 6;
    constexpr int NV = N / W; // whole vectors per row
    constexpr int jfull = NV / NB * NB * W;
    for (int j0 = 0; j0 < jfull; j0 += NB * W)
      gemm_columns<T, W, MR, NB, M, N, K, TransA, Zero>(c, a, b, j0);
    if constexpr (NV % NB != 0)
      gemm_columns<T, W, MR, NV % NB, M, N, K, TransA, Zero>(c, a, b, jfull);
    // Columns past the last whole vector.
    if constexpr (N % W != 0) {
      constexpr int j1 = NV * W;
      for (int i = 0; i < M; ++i)
        for (int k = 0; k < K; ++k) {
          T const aik = a_at<T, M, K, TransA>(a, i, k);
          for (int j = j1; j < N; ++j) c[i * N + j] += aik * b[k * N + j];
        }
    }
  }
}

template <class T, class E>
TILEGRAD_INLINE decltype(auto) materialize(E&& e) {
  using D = std::remove_cvref_t<E>;
  if constexpr (is_tile_v<D> && std::is_same_v<typename D::value_type, T>)
    return std::forward<E>(e); // already contiguous storage of the right type
  else
    return tile_t<T, shape_of_t<D>>(to<T>(std::forward<E>(e)));
}

template <class A, class B>
struct dot_shapes_do_not_match {
  static_assert(A::rank == 2 && B::rank == 2,
                "tilegrad: dot(a, b) multiplies rank-2 tiles (Triton's batched 3-D dot is not "
                "supported: loop over the batch, or reshape to rank 2)");
  static_assert(A::rank != 2 || B::rank != 2 || A::dim(1) == B::dim(0),
                "tilegrad: dot(a, b) needs a (M x K) and b (K x N) with the same K");
  static constexpr bool value = true;
};

} // namespace detail

namespace detail {

/// dot(a, b, acc) on plain numbers. With Bf16Kernel, two bf16 operands run the bf16 kernel of
/// dot_bf16.hpp where it runs for their shape (bf16_kernel_runs); otherwise (and for every other
/// element type) they are converted to the compute type and run the float (or double) kernel above.
/// dot takes the bf16 kernel wherever this build has one (bf16_dot_kernel); dot_impl<false> is the
/// other path, for comparing the two.
/// Whether operand x of a product reads the tile at `p` (itself, or its stored transpose):
/// `acc = dot(acc, w, std::move(acc))`, Triton's `acc = tl.dot(acc, w, acc)`, must not move the
/// accumulator into the result the product writes while it reads it.
template <class T, class X>
bool operand_reads(X const& x, void const* p) {
  using D = std::remove_cvref_t<X>;
  if constexpr (is_tile_v<D>)
    return static_cast<void const*>(x.data()) == p;
  else if constexpr (stored_transpose<value_of_t<D>, D>::value)
    return static_cast<void const*>(stored_transpose<value_of_t<D>, D>::data(x)) == p;
  else
    return false;
}

template <bool Bf16Kernel, bool Zero = false, tile_expression A, tile_expression B,
          tile_expression C>
auto dot_impl(A&& a, B&& b, C&& acc) {
  using SA = shape_of_t<A>;
  using SB = shape_of_t<B>;
  static_assert(dot_shapes_do_not_match<SA, SB>::value);
  constexpr int M = SA::dim(0), K = SA::dim(1), N = SB::dim(1);
  static_assert(std::is_same_v<shape_of_t<C>, shape<M, N>>,
                "tilegrad: dot(a, b, acc): acc must have shape (M, N) of a @ b");
  using T = fp32<promote_t<value_of_t<A>, value_of_t<B>>>;
  // An accumulator passed as a temporary (acc = dot(a, b, std::move(acc))) is reused in place,
  // taken once the operands are evaluated: an operand that is an expression of acc (Triton's
  // acc = tl.dot(acc * s, w, acc)) reads it through its storage, which the move empties. An
  // operand that is acc itself, or its stored transpose, is read in place by the product:
  // then acc is copied.
  auto take_out = [&]() -> tile<T, M, N> {
    if constexpr (Zero && M * N * sizeof(T) < 64) // (zeros cost nothing there, and GCC with
      return tile<T, M, N>();                       // sanitizers took the move for a read)
    else if constexpr (Zero) // (acc only gives the shape: nothing of it is read)
      return tile<T, M, N>(uninitialized);
    else if constexpr (std::is_same_v<std::remove_cvref_t<C>, tile<T, M, N>> &&
                       !std::is_lvalue_reference_v<C>)
      return operand_reads<T>(a, acc.data()) || operand_reads<T>(b, acc.data())
                 ? tile<T, M, N>(acc)
                 : std::move(acc);
    else
      return tile<T, M, N>(acc);
  };
#if TILEGRAD_HAVE_BF16_DOT
  if constexpr (Bf16Kernel && std::is_same_v<value_of_t<A>, bf16> &&
                std::is_same_v<value_of_t<B>, bf16>) {
    if (bf16_kernel_runs<M, N, K>()) {
      auto&& tb = materialize<bf16>(std::forward<B>(b));
      if constexpr (stored_transpose<bf16, std::remove_cvref_t<A>>::value) {
        tile<T, M, N> out = take_out();
        gemm_bf16<M, N, K, true, Zero>(
            out.data(), stored_transpose<bf16, std::remove_cvref_t<A>>::data(a), tb.data());
        return out;
      } else {
        auto&& ta = materialize<bf16>(std::forward<A>(a));
        tile<T, M, N> out = take_out();
        gemm_bf16<M, N, K, false, Zero>(out.data(), ta.data(), tb.data());
        return out;
      }
    }
  }
#endif
  auto&& tb = materialize<T>(std::forward<B>(b));
  if constexpr (stored_transpose<T, std::remove_cvref_t<A>>::value) {
    tile<T, M, N> out = take_out();
    gemm<T, M, N, K, true, Zero>(out.data(), stored_transpose<T, std::remove_cvref_t<A>>::data(a),
                                 tb.data());
    return out;
  } else {
    auto&& ta = materialize<T>(std::forward<A>(a));
    tile<T, M, N> out = take_out();
    gemm<T, M, N, K, false, Zero>(out.data(), ta.data(), tb.data());
    return out;
  }
}

} // namespace detail

/// dot(a, b, acc) = a @ b + acc, with a of shape (M, K), b (K, N), acc (M, N); bf16 and
/// integer operands compute in float, double in double. Two bf16 operands run the CPU's bf16
/// dot-product instruction where the build targets one (dot_bf16.hpp says what it computes).
template <tile_expression A, tile_expression B, tile_expression C>
auto dot(A&& a, B&& b, C&& acc) {
  using SA = shape_of_t<A>;
  using SB = shape_of_t<B>;
  static_assert(detail::dot_shapes_do_not_match<SA, SB>::value);
  if constexpr (adjoint_scalar<value_of_t<A>> || adjoint_scalar<value_of_t<B>> ||
                adjoint_scalar<value_of_t<C>>) {
    return ad::dot(std::forward<A>(a), std::forward<B>(b), std::forward<C>(acc));
  } else {
    return detail::dot_impl<detail::bf16_dot_kernel>(std::forward<A>(a), std::forward<B>(b),
                                                     std::forward<C>(acc));
  }
}

/// dot(a, b) = a @ b.
template <tile_expression A, tile_expression B>
auto dot(A&& a, B&& b) {
  using SA = shape_of_t<A>;
  using SB = shape_of_t<B>;
  static_assert(detail::dot_shapes_do_not_match<SA, SB>::value);
  using T = fp32<promote_t<value_of_t<A>, value_of_t<B>>>;
  if constexpr (adjoint_scalar<value_of_t<A>> || adjoint_scalar<value_of_t<B>>) {
    return ad::dot(std::forward<A>(a), std::forward<B>(b));
  } else { // the products written, not added to zeros (acc a zero broadcast: only its shape)
    using zero = broadcast_node<scalar_node<T>, shape<SA::dim(0), SB::dim(1)>>;
    return detail::dot_impl<detail::bf16_dot_kernel, true>(std::forward<A>(a), std::forward<B>(b),
                                                           zero{{}, {{}, T(0)}});
  }
}

} // namespace tilegrad
