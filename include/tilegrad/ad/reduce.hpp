// Reverse mode of the tile operations that are not elementwise: reductions, cumsum and dot.
// Each materialises its operand as an adjoint tile, computes the primal with the float code,
// and records one record whose backward is itself a tile computation (dot's is two dots).
#pragma once

#include "tilegrad/ad/context.hpp"
#include "tilegrad/ad/tile.hpp"
#include "tilegrad/core/config.hpp"
#include "tilegrad/core/simd.hpp"
#include "tilegrad/tile/dot.hpp"
#include "tilegrad/tile/reduce.hpp"

#include <cmath>
#include <cstring>
#include <type_traits>

namespace tilegrad::ad {

template <class Op, class C, int A, class T>
struct reduce_record final : record {
  T const *xv, *yv;
  T *xa, *ya;
  reduce_record(T const* xv_, T* xa_, T const* yv_, T* ya_) : xv(xv_), yv(yv_), xa(xa_), ya(ya_) {}
  void backward() override {
    using split = detail::axis_split<C, A>;
    for (int o = 0; o < split::outer; ++o)
      for (int i = 0; i < split::inner; ++i) {
        T const g = ya[o * split::inner + i];
        if (g == T(0)) continue;
        int const base = o * split::extent * split::inner + i;
        if constexpr (std::is_same_v<Op, ops::add_op>) {
          for (int k = 0; k < split::extent; ++k) xa[base + k * split::inner] += g;
        } else { // max / min: the first element equal to the result takes it all
          T const y = yv[o * split::inner + i];
          int k = 0;
#if TILEGRAD_USE_XSIMD
          constexpr int W = simd::native_width<T>;
          if constexpr (split::inner == 1 && W > 1) // a contiguous row: skip vectors that miss it
            for (auto const yb = simd::vec_t<T, W>(y); k + W <= split::extent; k += W)
              if (xsimd::any(simd::load<T, W>(xv + base + k) == yb)) break;
#endif
          for (; k < split::extent; ++k)
            if (xv[base + k * split::inner] == y) {
              xa[base + k * split::inner] += g;
              break;
            }
        }
      }
  }
};

/// The record of a sum over axis A of an expression that was not materialised: the adjoint of
/// each sum goes to every element it summed, through the expression, in one pass.
template <class C, int A, class P>
struct sum_expr_record final : record {
  using T = value_of_t<P>;
  P primal;
  T const* ya; // adjoint of the sums
  sum_expr_record(P p, T const* a) : primal(std::move(p)), ya(a) {}
  void backward() override {
    using split = detail::axis_split<C, A>;
    constexpr int W = detail::width_for<T, P>;
    constexpr int L = C::inner;
    for (int r = 0; r < C::rows; ++r) {
      int c = 0;
      if constexpr (A == C::rank - 1) { // the row is one sum
        T const g = ya[r];
        if constexpr (W > 1)
          for (; c + W <= L; c += W) backprop<W>(primal, r, c, simd::splat<T, W>(g));
        if (g != T(0))
          for (; c < L; ++c) backprop<1>(primal, r, c, g);
      } else { // the row's lanes go to consecutive sums
        int const f = r * L;
        T const* g = ya + f / (split::extent * split::inner) * split::inner + f % split::inner;
        if constexpr (W > 1)
          for (; c + W <= L; c += W) backprop<W>(primal, r, c, simd::load<T, W>(g + c));
        for (; c < L; ++c)
          if (g[c] != T(0)) backprop<1>(primal, r, c, g[c]);
      }
    }
  }
};

template <class Op, int Axis, bool Keep, class E>
auto reduce(E&& e) {
  using C = shape_of_t<E>;
  using T = primal_of_t<value_of_t<E>>;
  constexpr int a = normalize_axis<C, Axis>();
  using R = detail::reduced_shape_t<C, a, Keep>;
  tape& tp = current_tape();
  if constexpr (std::is_same_v<Op, ops::add_op> && is_map_node_v<detail::node_t<E>> &&
                is_cheap_v<detail::node_t<E>>) {
    // A sum of a cheap expression: summed as it is evaluated, as on the fast path, and
    // differentiated through the expression without materialising it (its values or their
    // adjoints).
    auto p = detail::convert_as<T>(to_primal(detail::as_node(e)));
    T* yv = tp.alloc<T>(R::size);
    detail::reduce_axis<Op, C, a, T>(yv, p);
    T* ya = nullptr;
    if constexpr (is_active_v<decltype(p)>) {
      if (any_active(p) && tp.recording()) {
        ya = tp.alloc_zero<T>(R::size);
        tp.push<sum_expr_record<C, a, decltype(p)>>(persisted(p, tp), ya);
      }
    }
    return detail::tile_t<adjoint<T>, R>::from_buffers(yv, ya);
  }
  detail::tile_t<adjoint<T>, C> const x(e);
  T* yv = tp.alloc<T>(R::size);
  detail::reduce_axis<Op, C, a, T>(yv, tile_ref<T, C>{{}, x.values()});
  T* ya = nullptr;
  if (x.active() && tp.recording()) {
    ya = tp.alloc_zero<T>(R::size);
    tp.push<reduce_record<Op, C, a, T>>(x.values(), x.adjoints(), yv, ya);
  }
  return detail::tile_t<adjoint<T>, R>::from_buffers(yv, ya);
}

template <class Op, bool Keep, class E>
auto reduce_all(E&& e) {
  using C = shape_of_t<E>;
  using T = primal_of_t<value_of_t<E>>;
  using F = shape<C::size>; // every element along one axis
  detail::tile_t<adjoint<T>, C> const x(e);
  tape& tp = current_tape();
  T* yv = tp.alloc<T>(1);
  detail::reduce_axis<Op, F, 0, T>(yv, tile_ref<T, F>{{}, x.values()});
  T* ya = nullptr;
  if (x.active() && tp.recording()) {
    ya = tp.alloc_zero<T>(1);
    tp.push<reduce_record<Op, F, 0, T>>(x.values(), x.adjoints(), yv, ya);
  }
  if constexpr (Keep) {
    using K = decltype([]<std::size_t... Is>(std::index_sequence<Is...>) {
      return shape<(static_cast<void>(Is), 1)...>{};
    }(std::make_index_sequence<C::rank>{}));
    return detail::tile_t<adjoint<T>, K>::from_buffers(yv, ya);
  } else {
    return tile<adjoint<T>>::from_buffers(yv, ya);
  }
}

template <class C, int A, bool Reverse, class T>
struct cumsum_record final : record {
  T* xa;
  T const* ya;
  cumsum_record(T* xa_, T const* ya_) : xa(xa_), ya(ya_) {}
  void backward() override { // the adjoint of a prefix sum is the suffix sum of the adjoints
    using split = detail::axis_split<C, A>;
    for (int o = 0; o < split::outer; ++o)
      for (int i = 0; i < split::inner; ++i) {
        T run = T(0);
        for (int kk = 0; kk < split::extent; ++kk) {
          int const k = Reverse ? kk : split::extent - 1 - kk;
          int const at = (o * split::extent + k) * split::inner + i;
          run += ya[at];
          xa[at] += run;
        }
      }
  }
};

template <int Axis, bool Reverse, class E>
auto cumsum(E&& e) {
  using C = shape_of_t<E>;
  using T = primal_of_t<value_of_t<E>>;
  constexpr int a = normalize_axis<C, Axis>();
  detail::tile_t<adjoint<T>, C> const x(e);
  auto const y = tilegrad::cumsum<Axis, Reverse>(tile_ref<T, C>{{}, x.values()});
  tape& tp = current_tape();
  T* yv = tp.alloc<T>(C::size);
  std::memcpy(yv, y.data(), sizeof(T) * C::size);
  T* ya = nullptr;
  if (x.active() && tp.recording()) {
    ya = tp.alloc_zero<T>(C::size);
    tp.push<cumsum_record<C, a, Reverse, T>>(x.adjoints(), ya);
  }
  return detail::tile_t<adjoint<T>, C>::from_buffers(yv, ya);
}

template <class T, int M, int N, int K>
struct dot_record final : record {
  T const *av, *bv;
  T *aa, *ba, *acca, *ca;
  dot_record(T const* av_, T* aa_, T const* bv_, T* ba_, T* acca_, T* ca_)
      : av(av_), bv(bv_), aa(aa_), ba(ba_), acca(acca_), ca(ca_) {}
  void backward() override {
    tape& tp = current_tape();
    T const* av = this->av;
    T const* bv = this->bv;
    if (magnitude_sweep()) { // |dC| @ |B|^T and |A|^T @ |dC| (dC is already non-negative)
      T* a = tp.alloc<T>(M * K);
      T* b = tp.alloc<T>(K * N);
      for (int i = 0; i < M * K; ++i) a[i] = std::abs(av[i]);
      for (int i = 0; i < K * N; ++i) b[i] = std::abs(bv[i]);
      av = a;
      bv = b;
    }
    if (aa) { // dA += dC @ B^T
      T* bt = tp.alloc<T>(N * K);
      for (int k = 0; k < K; ++k)
        for (int j = 0; j < N; ++j) bt[j * K + k] = bv[k * N + j];
      detail::gemm<T, M, K, N>(aa, ca, bt);
    }
    if (ba) // dB += A^T @ dC, reading A in place
      detail::gemm<T, K, N, M, true>(ba, av, ca);
    if (acca)
      for (int i = 0; i < M * N; ++i) acca[i] += ca[i];
  }
};

/// dot(trans(x), b, acc) with x (K x M) an adjoint tile, read in place as the fast path reads a
/// stored transpose: C = x^T B + acc. Its backward: dx += B dC^T, dB += x dC.
template <class T, int M, int N, int K>
struct dot_transposed_record final : record {
  T const *xv, *bv;
  T *xa, *ba, *acca, *ca;
  dot_transposed_record(T const* xv_, T* xa_, T const* bv_, T* ba_, T* acca_, T* ca_)
      : xv(xv_), bv(bv_), xa(xa_), ba(ba_), acca(acca_), ca(ca_) {}
  void backward() override {
    tape& tp = current_tape();
    T const* xv = this->xv;
    T const* bv = this->bv;
    if (magnitude_sweep()) { // as dot_record: the operands' absolute values
      T* x = tp.alloc<T>(K * M);
      T* b = tp.alloc<T>(K * N);
      for (int i = 0; i < K * M; ++i) x[i] = std::abs(xv[i]);
      for (int i = 0; i < K * N; ++i) b[i] = std::abs(bv[i]);
      xv = x;
      bv = b;
    }
    if (xa) { // dx += B @ dC^T
      T* ct = tp.alloc<T>(N * M);
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) ct[j * M + i] = ca[i * N + j];
      detail::gemm<T, K, M, N>(xa, bv, ct);
    }
    if (ba) // dB += x @ dC
      detail::gemm<T, K, N, M>(ba, xv, ca);
    if (acca)
      for (int i = 0; i < M * N; ++i) acca[i] += ca[i];
  }
};

template <class E>
inline constexpr bool is_adjoint_transpose_v = false;
template <class T, class S>
inline constexpr bool is_adjoint_transpose_v<permute_node<adjoint_leaf<T, S>, 1, 0>> = true;

template <class A, class B, class C>
auto dot(A&& a, B&& b, C&& acc) {
  using T = primal_of_t<promote_t<value_of_t<A>, value_of_t<B>>>;
  constexpr int M = shape_of_t<A>::dim(0), K = shape_of_t<A>::dim(1), N = shape_of_t<B>::dim(1);
  if constexpr (is_adjoint_transpose_v<std::remove_cvref_t<A>> &&
                std::is_same_v<value_of_t<A>, adjoint<T>>) {
    // trans(x) of a tile on the tape: no copy of the transpose, and no record of one (whose sweep
    // would run lane by lane).
    T const* xv = a.e.values;
    T* xa = a.e.adj;
    tile<adjoint<T>, K, N> const tb(b);
    tile<adjoint<T>, M, N> const tc(acc);
    tape& tp = current_tape();
    T* cv = tp.alloc<T>(M * N);
    std::memcpy(cv, tc.values(), sizeof(T) * M * N);
    detail::gemm<T, M, N, K, true>(cv, xv, tb.values());
    T* ca = nullptr;
    if ((xa || tb.active() || tc.active()) && tp.recording()) {
      ca = tp.alloc_zero<T>(M * N);
      tp.push<dot_transposed_record<T, M, N, K>>(xv, xa, tb.values(), tb.adjoints(),
                                                 tc.adjoints(), ca);
    }
    return tile<adjoint<T>, M, N>::from_buffers(cv, ca);
  }
  tile<adjoint<T>, M, K> const ta(a);
  tile<adjoint<T>, K, N> const tb(b);
  tile<adjoint<T>, M, N> const tc(acc);
  tape& tp = current_tape();
  T* cv = tp.alloc<T>(M * N);
  std::memcpy(cv, tc.values(), sizeof(T) * M * N);
  detail::gemm<T, M, N, K>(cv, ta.values(), tb.values());
  T* ca = nullptr;
  if ((ta.active() || tb.active() || tc.active()) && tp.recording()) {
    ca = tp.alloc_zero<T>(M * N);
    tp.push<dot_record<T, M, N, K>>(ta.values(), ta.adjoints(), tb.values(), tb.adjoints(),
                                    tc.adjoints(), ca);
  }
  return tile<adjoint<T>, M, N>::from_buffers(cv, ca);
}

} // namespace tilegrad::ad
