// Reverse mode of the tile operations that are not elementwise: reductions, cumsum and dot.
// Each materialises its operand as an adjoint tile, computes the primal with the float code,
// and records one record whose backward is itself a tile computation (dot's is two dots).
#pragma once

#include "tilegrad/ad/context.hpp"
#include "tilegrad/ad/jitter.hpp"
#include "tilegrad/ad/tile.hpp"
#include "tilegrad/core/config.hpp"
#include "tilegrad/core/simd.hpp"
#include "tilegrad/tile/dot.hpp"
#include "tilegrad/tile/reduce.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
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
    if constexpr (std::is_same_v<Op, ops::add_op> && split::inner > 1) {
      // A sum over an axis other than the last (sum<0> of a (64, 64) tile, say): its adjoints
      // are a row of lanes, added along the tile's rows as stored rather than down each column
      // one element per cache line. (max and min stay a scan down each column, which stops at
      // the first element equal to the result.)
      for (int o = 0; o < split::outer; ++o) {
        T const* g = ya + o * split::inner;
        T* x = xa + o * split::extent * split::inner;
        for (int k = 0; k < split::extent; ++k)
          for (int i = 0; i < split::inner; ++i) x[k * split::inner + i] += g[i];
      }
      return;
    }
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
    [[maybe_unused]] row_sink_guard<T, W> sink;
    for (int r = 0; r < C::rows; ++r) {
      int c = 0;
      if constexpr (A == C::rank - 1) { // the row is one sum
        T const g = ya[r];
        if constexpr (W > 1) {
          for (; c + W <= L; c += W) backprop<W>(primal, r, c, simd::splat<T, W>(g));
          sink.flush();
        }
        if (g != T(0))
          for (; c < L; ++c) backprop<1>(primal, r, c, g);
      } else { // the row's lanes go to consecutive sums
        int const f = r * L;
        T const* g = ya + f / (split::extent * split::inner) * split::inner + f % split::inner;
        if constexpr (W > 1) {
          for (; c + W <= L; c += W) backprop<W>(primal, r, c, simd::load<T, W>(g + c));
          sink.flush();
        }
        for (; c < L; ++c)
          if (g[c] != T(0)) backprop<1>(primal, r, c, g[c]);
      }
    }
  }
};

/// y = the reduction of x (C over axis A into n results) as a reader with rounding jitter sees x;
/// keeps y's errors; returns the moved x it reduced (its record's).
template <class Op, class C, int A>
double const* reduce_jittered(tape& tp, double const* x, double* y, int n) {
  double* ey = tp.alloc<double>(static_cast<std::size_t>(n));
  if (whole_moves()) { // x's own errors are in the moved x it reduces
    for (int i = 0; i < n; ++i) ey[i] = 0;
  } else {
    detail::reduce_axis<Op, C, A, double>(y, tile_ref<double, C>{{}, x});
    if (errors_of(tp, x))
      detail::reduce_axis<Op, C, A, double>(
          ey, tile_ref<double, C>{{}, jittered<true>(tp, x, C::size)});
    else
      std::copy_n(y, n, ey);
    errors_from(ey, y, n, 0.0);
  }
  if constexpr (std::is_same_v<Op, ops::add_op>) { // a sum rounds each partial sum
    double* ax = tp.alloc<double>(C::size);
    double* s = tp.alloc<double>(static_cast<std::size_t>(n));
    for (int i = 0; i < C::size; ++i) ax[i] = std::abs(x[i]);
    detail::reduce_axis<Op, C, A, double>(s, tile_ref<double, C>{{}, ax});
    for (int i = 0; i < n; ++i) ey[i] += rounding_jitter().unit * s[i];
  }
  double const* xv = jittered(tp, x, C::size);
  detail::reduce_axis<Op, C, A, double>(y, tile_ref<double, C>{{}, xv});
  keep_errors(tp, y, ey, n);
  return xv;
}

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
    // adjoints). (With rounding jitter, materialised: below.)
    if (!jitter_active<T>()) {
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
  }
  detail::tile_t<adjoint<T>, C> const x(e);
  T* yv = tp.alloc<T>(R::size);
  T const* xv = x.values();
  if (jitter_active<T>()) [[unlikely]] {
    if constexpr (std::is_same_v<T, double>)
      xv = reduce_jittered<Op, C, a>(tp, xv, yv, R::size);
  } else {
    detail::reduce_axis<Op, C, a, T>(yv, tile_ref<T, C>{{}, xv});
  }
  T* ya = nullptr;
  if (x.active() && tp.recording()) {
    ya = tp.alloc_zero<T>(R::size);
    tp.push<reduce_record<Op, C, a, T>>(xv, x.adjoints(), yv, ya);
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
  T const* xv = x.values();
  if (jitter_active<T>()) [[unlikely]] {
    if constexpr (std::is_same_v<T, double>)
      xv = reduce_jittered<Op, F, 0>(tp, xv, yv, 1);
  } else {
    detail::reduce_axis<Op, F, 0, T>(yv, tile_ref<T, F>{{}, xv});
  }
  T* ya = nullptr;
  if (x.active() && tp.recording()) {
    ya = tp.alloc_zero<T>(1);
    tp.push<reduce_record<Op, F, 0, T>>(xv, x.adjoints(), yv, ya);
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

/// Calls f(at) for the elements of each line of C along axis A, in the order a prefix sum (from
/// the end if Reverse) visits them, and done(at) after each line's last.
template <class C, int A, bool Reverse, class F>
void along_prefix(F&& f) {
  using split = detail::axis_split<C, A>;
  for (int o = 0; o < split::outer; ++o)
    for (int i = 0; i < split::inner; ++i)
      for (int kk = 0; kk < split::extent; ++kk) {
        int const k = Reverse ? split::extent - 1 - kk : kk;
        f((o * split::extent + k) * split::inner + i, kk == 0);
      }
}

/// y = the prefix sums of x (C along axis A) under rounding jitter. A float prefix sum rounds
/// each partial sum y_k, by up to u |y_k|, and every later sum carries that rounding on: its
/// error is a walk of those roundings. Whole moves: the walk drawn (a sign per partial sum, at
/// the settings' scale) and added to y, which every reader then reads, over x moved once.
/// Otherwise y keeps, as its errors, what x's errors move it by plus the walk's bound,
/// u sum_{k <= i} |y_k|, and is summed over x as this reader sees it.
template <class C, int A, bool Reverse>
void cumsum_jittered(tape& tp, double const* x, double* y) {
  constexpr int n = C::size;
  double const unit = rounding_jitter().unit;
  auto prefix = [](double* out, double const* in) {
    double run = 0;
    along_prefix<C, A, Reverse>([&](int at, bool first) {
      run = (first ? 0.0 : run) + in[at];
      out[at] = run;
    });
  };
  if (whole_moves()) {
    prefix(y, jittered(tp, x, n));
    double const scale = rounding_jitter().scale;
    double walk = 0, sign = 1;
    along_prefix<C, A, Reverse>([&](int at, bool first) {
      if (first) {
        walk = 0;
        sign = jitter_draw() < 0 ? -scale : scale;
      }
      walk += sign * unit * std::abs(y[at]);
      y[at] += walk;
    });
    return;
  }
  double* ey = tp.alloc<double>(n);
  prefix(y, x);
  if (errors_of(tp, x))
    prefix(ey, jittered<true>(tp, x, n));
  else
    std::copy_n(y, n, ey);
  errors_from(ey, y, n, 0.0);
  double walk = 0;
  along_prefix<C, A, Reverse>([&](int at, bool first) {
    walk = (first ? 0.0 : walk) + std::abs(y[at]);
    ey[at] += unit * walk;
  });
  prefix(y, jittered(tp, x, n));
  keep_errors(tp, y, ey, n);
}

template <int Axis, bool Reverse, class E>
auto cumsum(E&& e) {
  using C = shape_of_t<E>;
  using T = primal_of_t<value_of_t<E>>;
  constexpr int a = normalize_axis<C, Axis>();
  detail::tile_t<adjoint<T>, C> const x(e);
  tape& tp = current_tape();
  T* yv = tp.alloc<T>(C::size);
  if (jitter_active<T>()) [[unlikely]] {
    if constexpr (std::is_same_v<T, double>)
      cumsum_jittered<C, a, Reverse>(tp, x.values(), yv);
  } else {
    auto const y = tilegrad::cumsum<Axis, Reverse>(tile_ref<T, C>{{}, x.values()});
    std::memcpy(yv, y.data(), sizeof(T) * C::size);
  }
  T* ya = nullptr;
  if (x.active() && tp.recording()) {
    ya = tp.alloc_zero<T>(C::size);
    tp.push<cumsum_record<C, a, Reverse, T>>(x.adjoints(), ya);
  }
  return detail::tile_t<adjoint<T>, C>::from_buffers(yv, ya);
}

using detail::transpose_into;

/// Whether v holds an inf or a NaN. Every dot record's sweep asks it of both operands; for float
/// and double it is the largest exponent field (all ones only for inf and NaN), an integer
/// maximum the compiler vectorises. (The comparison v - v == 0 compiled to a branch per element:
/// 16 % of the instructions of FlashAttention's vjp, measured with callgrind.)
template <class T>
inline bool any_non_finite(T const* v, int n) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
    constexpr U ones = static_cast<U>(sizeof(T) == 4 ? 0x7f800000ull : 0x7ff0000000000000ull);
    U most = 0;
    for (int i = 0; i < n; ++i)
      most = std::max(most, static_cast<U>(std::bit_cast<U>(v[i]) & ones));
    return most == ones;
  } else {
    bool bad = false;
    for (int i = 0; i < n; ++i)
      bad |= !(v[i] - v[i] == T(0));
    return bad;
  }
}

/// v with its inf and NaN elements replaced by 0, on the tape.
template <class T>
T const* finite_part(tape& tp, T const* v, int n) {
  T* c = tp.alloc<T>(n);
  for (int i = 0; i < n; ++i)
    c[i] = v[i] - v[i] == T(0) ? v[i] : T(0);
  return c;
}

/// C = op(A) op(B) + acc, each operand as stored: A (M x K), or with TA its transpose x (K x M)
/// (dot(trans(x), b) reads x in place, as the fast path does); B (K x N), or with TB its
/// transpose y (N x K). The backward is four products at most, each on operands as stored or one
/// transposed copy: dA = dC op(B)^T, dB = op(A)^T dC (dx and dy their transposes).
///
/// A term whose adjoint is exactly zero contributes exactly zero, as in every elementwise rule:
/// an inf or NaN in a row of A that is never stored (a padded query row of attention, whose
/// scores are all -inf) must not reach dB through 0 * NaN. An operand holding inf or NaN goes to
/// the product with those elements as 0, and each of them is then added alone where it meets a
/// nonzero adjoint (an operand of finite values, the usual case, costs one vectorised scan).
template <class T, int M, int N, int K, bool TA, bool TB>
struct dot_record final : record {
  T const *av, *bv;
  T *aa, *ba, *acca, *ca;
  dot_record(T const* av_, T* aa_, T const* bv_, T* ba_, T* acca_, T* ca_)
      : av(av_), bv(bv_), aa(aa_), ba(ba_), acca(acca_), ca(ca_) {}
  void backward() override {
    tape& tp = current_tape();
    T const* av = this->av;
    T const* bv = this->bv;
    if (magnitude_sweep()) { // |dC| @ |B|^T and |A|^T @ |dC| (dC is already non-negative),
      T* a = tp.alloc<T>(M * K); // or dC @ (B^2)^T and (A^2)^T @ dC summing squares, or counts
      T* b = tp.alloc<T>(K * N);
      if (squares_sweep()) {
        for (int i = 0; i < M * K; ++i) a[i] = av[i] * av[i];
        for (int i = 0; i < K * N; ++i) b[i] = bv[i] * bv[i];
      } else if (counts_sweep()) { // a term where both factors are nonzero
        for (int i = 0; i < M * K; ++i)
          a[i] = av[i] != T(0) ? T(1) : T(0);
        for (int i = 0; i < K * N; ++i)
          b[i] = bv[i] != T(0) ? T(1) : T(0);
      } else {
        for (int i = 0; i < M * K; ++i) a[i] = std::abs(av[i]);
        for (int i = 0; i < K * N; ++i) b[i] = std::abs(bv[i]);
      }
      av = a;
      bv = b;
    }
    T const* const a_all = av;
    T const* const b_all = bv;
    bool const a_bad = ba && any_non_finite(av, M * K);
    bool const b_bad = aa && any_non_finite(bv, K * N);
    if (a_bad)
      av = finite_part(tp, av, M * K);
    if (b_bad)
      bv = finite_part(tp, bv, K * N);
    // An infinite adjoint (sqrt at 0 above the product) through an operand element of exactly
    // zero contributes zero, as in every elementwise rule (and as a zero tangent does in forward
    // mode): dC's non-finite elements go to the products as 0, and each is then added alone
    // where it meets a nonzero finite operand element (non-finite ones: the loops above).
    T const* const c_all = ca;
    bool const c_bad = any_non_finite(ca, M * N);
    T const* const cf = c_bad ? finite_part(tp, ca, M * N) : ca;
    products(tp, av, bv, cf);
    if (c_bad)
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
          T const d = c_all[i * N + j];
          if (d - d == T(0))
            continue;
          for (int k = 0; aa && k < K; ++k) {
            T const x = TB ? b_all[j * K + k] : b_all[k * N + j];
            if (x != T(0) && x - x == T(0))
              (TA ? aa[k * M + i] : aa[i * K + k]) += d * x;
          }
          for (int k = 0; ba && k < K; ++k) {
            T const x = TA ? a_all[k * M + i] : a_all[i * K + k];
            if (x != T(0) && x - x == T(0))
              (TB ? ba[j * K + k] : ba[k * N + j]) += x * d;
          }
        }
    if (b_bad) // dA(i, k) += dC(i, j) op(B)(k, j) for each non-finite op(B)(k, j)
      for (int k = 0; k < K; ++k)
        for (int j = 0; j < N; ++j) {
          T const x = TB ? b_all[j * K + k] : b_all[k * N + j];
          if (x - x == T(0))
            continue;
          for (int i = 0; i < M; ++i)
            if (T const d = ca[i * N + j]; d != T(0))
              (TA ? aa[k * M + i] : aa[i * K + k]) += d * x;
        }
    if (a_bad) // dB(k, j) += op(A)(i, k) dC(i, j) for each non-finite op(A)(i, k)
      for (int i = 0; i < M; ++i)
        for (int k = 0; k < K; ++k) {
          T const x = TA ? a_all[k * M + i] : a_all[i * K + k];
          if (x - x == T(0))
            continue;
          for (int j = 0; j < N; ++j)
            if (T const d = ca[i * N + j]; d != T(0))
              (TB ? ba[j * K + k] : ba[k * N + j]) += x * d;
        }
    if (acca)
      for (int i = 0; i < M * N; ++i) acca[i] += ca[i];
  }

private:
  void products(tape& tp, T const* av, T const* bv, T const* ca) const {
    if (aa) {
      if constexpr (!TA) { // dA (M x K) += dC op(B)^T
        if constexpr (TB) {
          detail::gemm<T, M, K, N>(aa, ca, bv); // op(B)^T = y, as stored
        } else {
          T* bt = tp.alloc<T>(N * K);
          transpose_into<T, K, N>(bt, bv);
          detail::gemm<T, M, K, N>(aa, ca, bt);
        }
      } else { // dx (K x M) += op(B) dC^T
        T* ct = tp.alloc<T>(N * M);
        transpose_into<T, M, N>(ct, ca);
        detail::gemm<T, K, M, N, TB>(aa, bv, ct);
      }
    }
    if (ba) {
      if constexpr (!TB) { // dB (K x N) += op(A)^T dC
        if constexpr (TA)
          detail::gemm<T, K, N, M>(ba, av, ca); // op(A)^T = x, as stored
        else
          detail::gemm<T, K, N, M, true>(ba, av, ca); // A read transposed in place
      } else { // dy (N x K) += dC^T op(A)
        if constexpr (TA) {
          T* at = tp.alloc<T>(M * K);
          transpose_into<T, K, M>(at, av);
          detail::gemm<T, N, K, M, true>(ba, ca, at);
        } else {
          detail::gemm<T, N, K, M, true>(ba, ca, av);
        }
      }
    }
  }
};

/// trans(x) of a tile on the tape, as an operand of dot: read as stored, not copied into a tile
/// of its own (whose record's sweep would walk the transpose one lane at a time).
template <class E>
inline constexpr bool is_adjoint_transpose_v = false;
template <class T, class S>
inline constexpr bool is_adjoint_transpose_v<permute_node<adjoint_leaf<T, S>, 1, 0>> = true;

/// An operand of dot as values and adjoints on the tape: x itself for trans(x) of an adjoint tile
/// (Transposed), else the operand made an adjoint tile of shape (R x C) (a tile is not copied).
template <class T, int R, int C, class X>
struct dot_operand {
  static constexpr bool transposed = is_adjoint_transpose_v<std::remove_cvref_t<X>> &&
                                     std::is_same_v<value_of_t<X>, adjoint<T>>;
  T const* values;
  T* adj;
  explicit dot_operand(X const& x) {
    if constexpr (transposed) {
      x.e.check_current();
      values = x.e.values;
      adj = x.e.adj;
    } else {
      tile<adjoint<T>, R, C> const t(x);
      values = t.values();
      adj = t.adjoints();
    }
  }
};

/// a @ b + acc recorded as one product; without acc (Zero), a @ b written, not added to zeros.
template <bool Zero, class A, class B, class C>
auto dot_of(A&& a, B&& b, C&& acc) {
  using T = primal_of_t<promote_t<value_of_t<A>, value_of_t<B>>>;
  constexpr int M = shape_of_t<A>::dim(0), K = shape_of_t<A>::dim(1), N = shape_of_t<B>::dim(1);
  dot_operand<T, M, K, A> const ta(a);
  dot_operand<T, K, N, B> const tb(b);
  constexpr bool TA = dot_operand<T, M, K, A>::transposed;
  constexpr bool TB = dot_operand<T, K, N, B>::transposed;
  tape& tp = current_tape();
  T* cv = tp.alloc<T>(M * N);
  T* acc_adj = nullptr;
  T const* av = ta.values;
  T const* bv = tb.values;
  T const* accv = nullptr;
  bool const jitter = jitter_active<T>();
  if constexpr (!Zero) {
    tile<adjoint<T>, M, N> const tc(acc);
    accv = tc.values();
    acc_adj = tc.adjoints();
  }
  // c (+)= op(a) op(b), b as stored
  auto product = [&tp](T* c, T const* a, T const* b) {
    if constexpr (TB) { // the kernel reads B as (K x N) rows: y transposed once
      T* bt = tp.alloc<T>(K * N);
      transpose_into<T, N, K>(bt, b);
      detail::gemm<T, M, N, K, TA, Zero>(c, a, bt);
    } else {
      detail::gemm<T, M, N, K, TA, Zero>(c, a, b);
    }
  };
  if (jitter) [[unlikely]] {
    if constexpr (std::is_same_v<T, double>) {
      // The product's error: u |A| |B| (a rounding per term) and its operands' errors through it.
      double const unit = rounding_jitter().unit;
      // (Whole moves: the operands' errors move them, below; the product keeps its own.)
      bool const whole = whole_moves();
      double const* ea = whole ? nullptr : errors_of(tp, av);
      double const* eb = whole ? nullptr : errors_of(tp, bv);
      double* a1 = tp.alloc<double>(M * K);
      double* b1 = tp.alloc<double>(K * N);
      for (int i = 0; i < M * K; ++i) a1[i] = unit * std::abs(av[i]) + (ea ? ea[i] : 0.0);
      for (int i = 0; i < K * N; ++i) b1[i] = std::abs(bv[i]);
      double* ec = tp.alloc_zero<double>(M * N);
      if (double const* eacc = accv && !whole ? errors_of(tp, accv) : nullptr)
        std::copy_n(eacc, M * N, ec);
      product(ec, a1, b1);
      if (eb) {
        double* e2 = tp.alloc_zero<double>(M * N);
        for (int i = 0; i < M * K; ++i) a1[i] = std::abs(av[i]);
        product(e2, a1, eb);
        for (int i = 0; i < M * N; ++i) ec[i] += e2[i];
      }
      av = jittered(tp, av, M * K);
      bv = jittered(tp, bv, K * N);
      if (accv)
        accv = jittered(tp, accv, M * N);
      if constexpr (!Zero)
        std::memcpy(cv, accv, sizeof(T) * M * N);
      product(cv, av, bv);
      keep_errors(tp, cv, ec, M * N);
    }
  } else {
    if constexpr (!Zero)
      std::memcpy(cv, accv, sizeof(T) * M * N);
    product(cv, av, bv);
  }
  T* ca = nullptr;
  if ((ta.adj || tb.adj || acc_adj) && tp.recording()) {
    ca = tp.alloc_zero<T>(M * N);
    tp.push<dot_record<T, M, N, K, TA, TB>>(av, ta.adj, bv, tb.adj, acc_adj, ca);
  }
  return tile<adjoint<T>, M, N>::from_buffers(cv, ca);
}

template <class A, class B, class C>
auto dot(A&& a, B&& b, C&& acc) {
  return dot_of<false>(std::forward<A>(a), std::forward<B>(b), std::forward<C>(acc));
}

template <class A, class B>
auto dot(A&& a, B&& b) {
  return dot_of<true>(std::forward<A>(a), std::forward<B>(b), 0);
}

} // namespace tilegrad::ad
