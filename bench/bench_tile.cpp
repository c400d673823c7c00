// Tile algebra on the float path, each benchmark beside its baselines in this one binary:
//   softmax/RxC/*       row softmax: tilegrad (fused), eager (one temporary tile per op), naive
//   elementwise/RxC/*   y = a * b + c * exp(-d): tilegrad (fused), eager, naive
//   columns/RxC/*       max and sum along axis 0 (a key tile's statistics in the FlashAttention
//                       forward): tilegrad, naive
//   dot/MxNxK/*         C += A @ B: tilegrad acc = dot(a, b, std::move(acc)) (in place) and
//                       acc = dot(a, b, acc) (acc copied), dot(a, trans(bt), acc) (B given
//                       transposed, tl.dot(q, tl.trans(k))), naive triple loop, OpenBLAS sgemm;
//                       tilegrad_bf16: A and B bf16 tiles, C float (vs_fp32: its FLOP/s over
//                       the float dot's on the same values)
//   peak/fma            the FMA throughput of one core, the ceiling of every dot figure
// Operands are tiles and stay in cache. Every tilegrad and eager benchmark first checks its
// result against the naive loop and reports an error instead of a time when they differ.
#include <tilegrad/tile/dot.hpp>
#include <tilegrad/tile/elementwise.hpp>
#include <tilegrad/tile/reduce.hpp>
#include <tilegrad/tile/shape_ops.hpp>
#include <tilegrad/tile/tile.hpp>

#include <benchmark/benchmark.h>

#if TILEGRAD_HAVE_CBLAS
#include <cblas.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <random>
#include <string>
#include <utility>

namespace {

namespace tg = tilegrad;

// Every variant is its own function, compiled once per size and called as a library would be:
// what the compiler makes of a loop then does not depend on the benchmark around it.
#if defined(__GNUC__) || defined(__clang__)
#define BENCH_NOINLINE __attribute__((noinline))
#else
#define BENCH_NOINLINE
#endif

// ---------------------------------------------------------------------------------------------
// Inputs and checks
// ---------------------------------------------------------------------------------------------

/// Uniform values in [lo, hi), reproducible from the seed.
void fill_uniform(float* p, int n, float lo, float hi, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int i = 0; i < n; ++i)
    p[i] = dist(gen);
}

template <class Tile>
void fill_uniform(Tile& t, float lo, float hi, unsigned seed) {
  fill_uniform(t.data(), Tile::size, lo, hi, seed);
}

/// True when |got - want| <= tol * max(1, |want|) everywhere.
bool close(float const* got, float const* want, int n, float tol) {
  for (int i = 0; i < n; ++i)
    if (!(std::abs(got[i] - want[i]) <= tol * std::max(1.0f, std::abs(want[i]))))
      return false;
  return true;
}

/// This thread's CPU time in seconds: the clock Google Benchmark's rates use by default.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// ---------------------------------------------------------------------------------------------
// Row softmax
// ---------------------------------------------------------------------------------------------

/// The natural tilegrad spelling: the max, then e = exp(x - m), its sum, then e / s.
template <int R, int C>
BENCH_NOINLINE void softmax_tilegrad(tg::tile<float, R, C> const& x, tg::tile<float, R, C>& y) {
  auto m = tg::max<1>(x);
  tg::tile<float, R, C> e = tg::exp(x - tg::col(m));
  auto s = tg::sum<1>(e);
  y = e / tg::col(s);
}

/// As a non-fusing library evaluates it: every op into its own temporary.
/// DoNotOptimize keeps each temporary materialised, as separate library calls would.
template <int R, int C>
BENCH_NOINLINE void softmax_eager(tg::tile<float, R, C> const& x, tg::tile<float, R, C>& y) {
  auto m = tg::max<1>(x);                    // m  = max(x, axis=1)
  tg::tile<float, R, C> t1 = x - tg::col(m); // t1 = x - m[:, None]
  benchmark::DoNotOptimize(t1);
  tg::tile<float, R, C> t2 = tg::exp(t1); // t2 = exp(t1)
  benchmark::DoNotOptimize(t2);
  auto s = tg::sum<1>(t2); // s  = sum(t2, axis=1)
  benchmark::DoNotOptimize(s);
  y = t2 / tg::col(s); // y  = t2 / s[:, None]
}

/// Plain C++ loops, no tilegrad.
template <int R, int C>
BENCH_NOINLINE void softmax_naive(float const* x, float* y) {
  for (int i = 0; i < R; ++i) {
    float const* xr = x + i * C;
    float* yr = y + i * C;
    float m = xr[0];
    for (int j = 1; j < C; ++j)
      m = std::max(m, xr[j]);
    float s = 0.0f;
    for (int j = 0; j < C; ++j) {
      yr[j] = std::exp(xr[j] - m);
      s += yr[j];
    }
    for (int j = 0; j < C; ++j)
      yr[j] /= s;
  }
}

enum class variant { tilegrad, eager, naive };

template <int R, int C, variant V>
void bm_softmax(benchmark::State& st) {
  using T = tg::tile<float, R, C>;
  T x, y, ref;
  fill_uniform(x, -8.0f, 8.0f, 1234u + R);
  softmax_naive<R, C>(x.data(), ref.data());

  auto run = [&] {
    if constexpr (V == variant::tilegrad)
      softmax_tilegrad(x, y);
    else if constexpr (V == variant::eager)
      softmax_eager(x, y);
    else
      softmax_naive<R, C>(x.data(), y.data());
  };
  run();
  if (!close(y.data(), ref.data(), T::size, 1e-5f)) {
    st.SkipWithError("result differs from the naive loop");
    return;
  }
  for (auto _ : st) {
    benchmark::DoNotOptimize(x); // the input may have changed: nothing is hoisted
    run();
    benchmark::DoNotOptimize(y);
  }
  // Logical traffic: x read once, y written once.
  st.SetBytesProcessed(st.iterations() * std::int64_t{2} * R * C * std::int64_t{sizeof(float)});
  st.SetItemsProcessed(st.iterations() * std::int64_t{R} * C);
}

// ---------------------------------------------------------------------------------------------
// Pure elementwise: y = a * b + c * exp(-d)
// ---------------------------------------------------------------------------------------------

template <int R, int C>
struct elementwise_operands {
  tg::tile<float, R, C> a, b, c, d, y, ref;
};

template <int R, int C>
BENCH_NOINLINE void elementwise_tilegrad(elementwise_operands<R, C>& o) {
  o.y = o.a * o.b + o.c * tg::exp(-o.d);
}

template <int R, int C>
BENCH_NOINLINE void elementwise_eager(elementwise_operands<R, C>& o) {
  using T = tg::tile<float, R, C>;
  T t1 = o.a * o.b; // t1 = a * b
  benchmark::DoNotOptimize(t1);
  T t2 = -o.d; // t2 = -d
  benchmark::DoNotOptimize(t2);
  T t3 = tg::exp(t2); // t3 = exp(t2)
  benchmark::DoNotOptimize(t3);
  T t4 = o.c * t3; // t4 = c * t3
  benchmark::DoNotOptimize(t4);
  o.y = t1 + t4; // y = t1 + t4
}

template <int R, int C>
BENCH_NOINLINE void elementwise_naive(float const* a, float const* b, float const* c,
                                      float const* d, float* y) {
  for (int i = 0; i < R * C; ++i)
    y[i] = a[i] * b[i] + c[i] * std::exp(-d[i]);
}

template <int R, int C, variant V>
void bm_elementwise(benchmark::State& st) {
  elementwise_operands<R, C> o;
  fill_uniform(o.a, -2.0f, 2.0f, 11u);
  fill_uniform(o.b, -2.0f, 2.0f, 12u);
  fill_uniform(o.c, -2.0f, 2.0f, 13u);
  fill_uniform(o.d, -4.0f, 4.0f, 14u);
  elementwise_naive<R, C>(o.a.data(), o.b.data(), o.c.data(), o.d.data(), o.ref.data());

  auto run = [&] {
    if constexpr (V == variant::tilegrad)
      elementwise_tilegrad(o);
    else if constexpr (V == variant::eager)
      elementwise_eager(o);
    else
      elementwise_naive<R, C>(o.a.data(), o.b.data(), o.c.data(), o.d.data(), o.y.data());
  };
  run();
  if (!close(o.y.data(), o.ref.data(), R * C, 1e-5f)) {
    st.SkipWithError("result differs from the naive loop");
    return;
  }
  for (auto _ : st) {
    benchmark::DoNotOptimize(o.a);
    benchmark::DoNotOptimize(o.b);
    benchmark::DoNotOptimize(o.c);
    benchmark::DoNotOptimize(o.d);
    run();
    benchmark::DoNotOptimize(o.y);
  }
  // Logical traffic: four inputs read once, y written once.
  st.SetBytesProcessed(st.iterations() * std::int64_t{5} * R * C * std::int64_t{sizeof(float)});
  st.SetItemsProcessed(st.iterations() * std::int64_t{R} * C);
}

// ---------------------------------------------------------------------------------------------
// Column statistics: max<0> and sum<0>
// ---------------------------------------------------------------------------------------------

template <int R, int C>
BENCH_NOINLINE void columns_tilegrad(tg::tile<float, R, C> const& x, tg::tile<float, C>& m,
                                     tg::tile<float, C>& s) {
  m = tg::max<0>(x);
  s = tg::sum<0>(x);
}

template <int R, int C>
BENCH_NOINLINE void columns_naive(float const* x, float* m, float* s) {
  for (int j = 0; j < C; ++j)
    m[j] = s[j] = x[j];
  for (int i = 1; i < R; ++i)
    for (int j = 0; j < C; ++j) {
      m[j] = std::max(m[j], x[i * C + j]);
      s[j] += x[i * C + j];
    }
}

template <int R, int C, variant V>
void bm_columns(benchmark::State& st) {
  tg::tile<float, R, C> x;
  tg::tile<float, C> m, s, m_ref, s_ref;
  fill_uniform(x, -8.0f, 8.0f, 77u + R);
  columns_naive<R, C>(x.data(), m_ref.data(), s_ref.data());
  auto run = [&] {
    if constexpr (V == variant::tilegrad)
      columns_tilegrad(x, m, s);
    else
      columns_naive<R, C>(x.data(), m.data(), s.data());
  };
  run();
  // (Both add each column's rows in order: the sums agree to the bit.)
  if (!close(m.data(), m_ref.data(), C, 0.0f) || !close(s.data(), s_ref.data(), C, 0.0f)) {
    st.SkipWithError("result differs from the naive loop");
    return;
  }
  for (auto _ : st) {
    benchmark::DoNotOptimize(x);
    run();
    benchmark::DoNotOptimize(m);
    benchmark::DoNotOptimize(s);
  }
  st.SetItemsProcessed(st.iterations() * std::int64_t{R} * C);
}

// ---------------------------------------------------------------------------------------------
// dot: C (M x N) += A (M x K) @ B (K x N), row-major
// ---------------------------------------------------------------------------------------------

/// Textbook i-j-k loop.
template <int M, int N, int K>
BENCH_NOINLINE void gemm_naive(float const* a, float const* b, float* c) {
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      float s = c[i * N + j];
      for (int k = 0; k < K; ++k)
        s += a[i * K + k] * b[k * N + j];
      c[i * N + j] = s;
    }
}

/// Triton's spelling word for word: the accumulator passed as an lvalue, so dot copies it.
template <int M, int N, int K>
BENCH_NOINLINE void dot_tilegrad_copy_acc(tg::tile<float, M, K> const& a,
                                          tg::tile<float, K, N> const& b,
                                          tg::tile<float, M, N>& c) {
  c = tg::dot(a, b, c);
}

template <int M, int N, int K>
BENCH_NOINLINE void dot_tilegrad(tg::tile<float, M, K> const& a, tg::tile<float, K, N> const& b,
                                 tg::tile<float, M, N>& c) {
  c = tg::dot(a, b, std::move(c)); // Triton's acc = tl.dot(a, b, acc), accumulating in place
}

/// B given transposed, as in Triton's tl.dot(q, tl.trans(k)): dot makes a tile of trans(bt).
template <int M, int N, int K>
BENCH_NOINLINE void dot_tilegrad_trans_b(tg::tile<float, M, K> const& a,
                                         tg::tile<float, N, K> const& bt,
                                         tg::tile<float, M, N>& c) {
  c = tg::dot(a, tg::trans(bt), std::move(c));
}

/// bf16 operands, float accumulator: the dot of a bf16 attention kernel.
template <int M, int N, int K>
BENCH_NOINLINE void dot_tilegrad_bf16(tg::tile<tg::bf16, M, K> const& a,
                                      tg::tile<tg::bf16, K, N> const& b, tg::tile<float, M, N>& c) {
  c = tg::dot(a, b, std::move(c));
}

#if TILEGRAD_HAVE_CBLAS
void gemm_openblas(int m, int n, int k, float const* a, float const* b, float* c) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, k, b, n, 1.0f, c, n);
}
#endif

enum class gemm_impl {
  tilegrad,
  tilegrad_copy_acc,
  tilegrad_trans_b,
  tilegrad_bf16,
  naive,
  openblas
};

template <int M, int N, int K, gemm_impl I>
void bm_dot(benchmark::State& st) {
  tg::tile<float, M, K> a;
  tg::tile<float, K, N> b;
  tg::tile<float, M, N> c, ref;
  fill_uniform(a, -1.0f, 1.0f, 1u);
  fill_uniform(b, -1.0f, 1.0f, 2u);
  fill_uniform(c, -1.0f, 1.0f, 3u);
  // bf16 copies of the operands; the float operands take their values, so that every variant
  // computes the same product.
  tg::tile<tg::bf16, M, K> const a16 = tg::to<tg::bf16>(a);
  tg::tile<tg::bf16, K, N> const b16 = tg::to<tg::bf16>(b);
  if constexpr (I == gemm_impl::tilegrad_bf16) {
    a = tg::to<float>(a16);
    b = tg::to<float>(b16);
  }
  tg::tile<float, N, K> const bt = tg::trans(b); // (the transposed copy of b, made once)
  ref = c;
  gemm_naive<M, N, K>(a.data(), b.data(), ref.data());

  auto run = [&] {
    if constexpr (I == gemm_impl::tilegrad) {
      dot_tilegrad(a, b, c);
    } else if constexpr (I == gemm_impl::tilegrad_copy_acc) {
      dot_tilegrad_copy_acc(a, b, c);
    } else if constexpr (I == gemm_impl::tilegrad_trans_b) {
      dot_tilegrad_trans_b(a, bt, c);
    } else if constexpr (I == gemm_impl::tilegrad_bf16) {
      dot_tilegrad_bf16(a16, b16, c);
    } else if constexpr (I == gemm_impl::naive) {
      gemm_naive<M, N, K>(a.data(), b.data(), c.data());
    } else {
#if TILEGRAD_HAVE_CBLAS
      gemm_openblas(M, N, K, a.data(), b.data(), c.data());
#endif
    }
  };
  {
    tg::tile<float, M, N> const c0 = c;
    run();
    bool const ok = close(c.data(), ref.data(), M * N, 1e-4f);
    c = c0;
    if (!ok) {
      st.SkipWithError("result differs from the naive loop");
      return;
    }
  }
  double const t0 = thread_cpu_seconds();
  for (auto _ : st) {
    benchmark::DoNotOptimize(a);
    benchmark::DoNotOptimize(b);
    benchmark::DoNotOptimize(a16);
    benchmark::DoNotOptimize(b16);
    benchmark::DoNotOptimize(bt);
    run(); // C accumulates A @ B every iteration, as sgemm with beta = 1 does
    benchmark::DoNotOptimize(c);
  }
  double const seconds = thread_cpu_seconds() - t0;
  st.counters["FLOPS"] =
      benchmark::Counter(2.0 * M * N * K, benchmark::Counter::kIsIterationInvariantRate);
  // Another implementation, the same number of calls on the same operands right after, on the
  // same clock, so that both run under the same machine conditions: its time over ours.
  [[maybe_unused]] auto time_over_ours = [&](auto&& call) {
    tg::tile<float, M, N> other = c;
    double const t1 = thread_cpu_seconds();
    for (benchmark::IterationCount i = 0; i < st.iterations(); ++i) {
      benchmark::DoNotOptimize(a);
      benchmark::DoNotOptimize(b);
      call(other);
      benchmark::DoNotOptimize(other);
    }
    return (thread_cpu_seconds() - t1) / seconds;
  };
  // Above 1, the bf16 dot is faster than the float dot on the same values.
  if constexpr (I == gemm_impl::tilegrad_bf16)
    st.counters["vs_fp32"] = time_over_ours([&](auto& out) { dot_tilegrad(a, b, out); });
#if TILEGRAD_HAVE_CBLAS
  // Above 1, tilegrad's FLOP/s beat OpenBLAS's.
  if constexpr (I == gemm_impl::tilegrad)
    st.counters["vs_openblas"] = time_over_ours(
        [&](auto& out) { gemm_openblas(M, N, K, a.data(), b.data(), out.data()); });
#endif
}

/// The machine's limit for dot: independent FMA chains on the widest float vector, enough of
/// them (24) to cover the FMA latency, nothing loaded or stored.
void bm_peak_fma(benchmark::State& st) {
  constexpr int W = tg::simd::native_width<float>;
  constexpr int chains = 24, steps = 64;
  using V = tg::simd::vec_t<float, W>;
  V acc[chains];
  for (int i = 0; i < chains; ++i)
    acc[i] = tg::simd::splat<float, W>(static_cast<float>(i));
  V x = tg::simd::splat<float, W>(0.999f), y = tg::simd::splat<float, W>(0.001f);
  for (auto _ : st) {
    benchmark::DoNotOptimize(x);
    for (int s = 0; s < steps; ++s) {
#pragma GCC unroll 24
      for (int i = 0; i < chains; ++i)
        acc[i] = tg::ops::fma_op::apply(acc[i], x, y);
    }
  }
  for (auto& a : acc)
    benchmark::DoNotOptimize(a);
  st.counters["FLOPS"] =
      benchmark::Counter(2.0 * W * chains * steps, benchmark::Counter::kIsIterationInvariantRate);
}

// ---------------------------------------------------------------------------------------------
// Registration
// ---------------------------------------------------------------------------------------------

template <class F>
void add(std::string const& name, F f) {
  benchmark::RegisterBenchmark(name.c_str(), f);
}

template <int R, int C>
void register_softmax() {
  std::string const base = "softmax/" + std::to_string(R) + "x" + std::to_string(C) + "/";
  add(base + "tilegrad", bm_softmax<R, C, variant::tilegrad>);
  add(base + "eager", bm_softmax<R, C, variant::eager>);
  add(base + "naive", bm_softmax<R, C, variant::naive>);
}

template <int R, int C>
void register_elementwise() {
  std::string const base = "elementwise/" + std::to_string(R) + "x" + std::to_string(C) + "/";
  add(base + "tilegrad", bm_elementwise<R, C, variant::tilegrad>);
  add(base + "eager", bm_elementwise<R, C, variant::eager>);
  add(base + "naive", bm_elementwise<R, C, variant::naive>);
}

template <int R, int C>
void register_columns() {
  std::string const base = "columns/" + std::to_string(R) + "x" + std::to_string(C) + "/";
  add(base + "tilegrad", bm_columns<R, C, variant::tilegrad>);
  add(base + "naive", bm_columns<R, C, variant::naive>);
}

template <int M, int N, int K>
void register_dot() {
  std::string const base =
      "dot/" + std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) + "/";
  add(base + "tilegrad", bm_dot<M, N, K, gemm_impl::tilegrad>);
  add(base + "tilegrad_copy_acc", bm_dot<M, N, K, gemm_impl::tilegrad_copy_acc>);
  add(base + "tilegrad_trans_b", bm_dot<M, N, K, gemm_impl::tilegrad_trans_b>);
  add(base + "tilegrad_bf16", bm_dot<M, N, K, gemm_impl::tilegrad_bf16>);
  add(base + "naive", bm_dot<M, N, K, gemm_impl::naive>);
#if TILEGRAD_HAVE_CBLAS
  add(base + "openblas", bm_dot<M, N, K, gemm_impl::openblas>);
#endif
}

} // namespace

int main(int argc, char** argv) {
  register_softmax<64, 64>();
  register_softmax<128, 128>();
  register_elementwise<64, 64>();
  register_columns<64, 64>();
  register_columns<128, 100>();
  register_dot<16, 16, 16>();
  register_dot<32, 32, 32>();
  register_dot<64, 64, 64>();
  register_dot<128, 128, 128>();
  register_dot<48, 80, 40>(); // M x N x K: non-square, K not a multiple of 16
  register_dot<33, 65, 17>(); // no extent a multiple of 16: row blocks, vectors and tails
  add("peak/fma", bm_peak_fma);

#if TILEGRAD_HAVE_CBLAS
  openblas_set_num_threads(1); // single-thread baseline, whatever OPENBLAS_NUM_THREADS says
  benchmark::AddCustomContext("openblas_config", openblas_get_config());
  benchmark::AddCustomContext("openblas_threads", std::to_string(openblas_get_num_threads()));
#else
  benchmark::AddCustomContext("openblas_config", "not found: no OpenBLAS baselines");
#endif
  benchmark::AddCustomContext("tilegrad_float_lanes",
                              std::to_string(tg::simd::native_width<float>));

  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv))
    return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
