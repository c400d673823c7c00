// Shared pieces of the kernel benchmarks: thread counts to sweep, a STREAM-like triad
// baseline on the same threads, and random fills.
#pragma once

#include <tilegrad/tilegrad.hpp>

#include <benchmark/benchmark.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

namespace bench {

inline int all_threads() { return static_cast<int>(std::thread::hardware_concurrency()); }

/// Thread counts swept: 1, 2, 4, ... up to all hardware threads (always including it).
inline std::vector<std::int64_t> thread_counts() {
  std::vector<std::int64_t> t;
  for (int n = 1; n < all_threads(); n *= 2) t.push_back(n);
  t.push_back(all_threads());
  return t;
}

template <class T>
void fill(tilegrad::owned_tensor<T>& t, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1, 1);
  for (T& v : t) v = static_cast<T>(d(rng));
}

/// a = b + s * c over n floats, split into chunks over `threads` TBB threads: the machine's
/// sustainable memory bandwidth, the yardstick of memory-bound kernels.
class triad {
public:
  explicit triad(std::int64_t n) : a_(n), b_(n, 1.0f), c_(n, 2.0f) {}
  void run(int threads) {
    tbb::task_arena arena(threads);
    arena.execute([&] {
      std::int64_t const n = static_cast<std::int64_t>(a_.size());
      tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, n, 1 << 14),
                        [&](tbb::blocked_range<std::int64_t> const& r) {
                          float* a = a_.data();
                          float const* b = b_.data();
                          float const* c = c_.data();
                          for (std::int64_t i = r.begin(); i < r.end(); ++i) a[i] = b[i] + 3.0f * c[i];
                        });
    });
    benchmark::DoNotOptimize(a_.data());
    benchmark::ClobberMemory();
  }
  std::int64_t bytes() const { return 3 * static_cast<std::int64_t>(a_.size()) * 4; }

private:
  std::vector<float> a_, b_, c_;
};

/// Registers a benchmark at each thread count of thread_counts(), timed in wall-clock ms.
inline void threads_arg(benchmark::internal::Benchmark* b) {
  for (auto t : thread_counts()) b->Arg(t);
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}

/// The triad moving about `bytes_moved` bytes (its three arrays together) on range(0) threads.
inline void run_triad(benchmark::State& state, std::int64_t bytes_moved) {
  int const threads = static_cast<int>(state.range(0));
  triad t(bytes_moved / 12);
  for (auto _ : state) t.run(threads);
  state.SetBytesProcessed(state.iterations() * t.bytes());
  state.counters["threads"] = threads;
}

/// One row of the layer-norm forward as a plain loop (the baseline beside the tilegrad kernel):
/// its three row loops vectorised by `omp simd`, the reductions included.
inline void layer_norm_row(float const* xr, float const* wr, float const* br, float* yr,
                           std::int64_t n, float eps, float& mean, float& rstd) {
  float s = 0, v = 0;
#pragma omp simd reduction(+ : s)
  for (std::int64_t j = 0; j < n; ++j)
    s += xr[j];
  float const mu = s / static_cast<float>(n);
#pragma omp simd reduction(+ : v)
  for (std::int64_t j = 0; j < n; ++j)
    v += (xr[j] - mu) * (xr[j] - mu);
  float const r = 1 / std::sqrt(v / static_cast<float>(n) + eps);
  mean = mu;
  rstd = r;
#pragma omp simd
  for (std::int64_t j = 0; j < n; ++j)
    yr[j] = (xr[j] - mu) * r * wr[j] + br[j];
}

/// The layer-norm backward of a group of rows [r0, r1) as a plain loop (the baseline beside the
/// tilegrad kernel): per row, the two row means in one `omp simd` loop, then dx and the group's
/// partial sums of dw and db (pw, pb: one row of N each) in another.
inline void layer_norm_bwd_rows(float const* x, float const* w, float const* mean,
                                float const* rstd, float const* dy, float* dx, float* pw,
                                float* pb, std::int64_t r0, std::int64_t r1, std::int64_t n) {
  for (std::int64_t r = r0; r < r1; ++r) {
    float const* xr = x + r * n;
    float const* gr = dy + r * n;
    float* dxr = dx + r * n;
    float const mu = mean[r], rs = rstd[r];
    float c1 = 0, c2 = 0;
#pragma omp simd reduction(+ : c1, c2)
    for (std::int64_t j = 0; j < n; ++j) {
      float const wdy = w[j] * gr[j];
      c1 += (xr[j] - mu) * rs * wdy;
      c2 += wdy;
    }
    c1 /= static_cast<float>(n);
    c2 /= static_cast<float>(n);
    if (r == r0) { // the group's first row sets its partial sums
#pragma omp simd
      for (std::int64_t j = 0; j < n; ++j) {
        float const xhat = (xr[j] - mu) * rs;
        dxr[j] = (w[j] * gr[j] - (xhat * c1 + c2)) * rs;
        pw[j] = gr[j] * xhat;
        pb[j] = gr[j];
      }
    } else {
#pragma omp simd
      for (std::int64_t j = 0; j < n; ++j) {
        float const xhat = (xr[j] - mu) * rs;
        dxr[j] = (w[j] * gr[j] - (xhat * c1 + c2)) * rs;
        pw[j] += gr[j] * xhat;
        pb[j] += gr[j];
      }
    }
  }
}

/// A row of the softmax forward as a plain loop (the baseline beside the tilegrad kernel): the
/// row's maximum, its exponentials into `buf` with their sum, then y = buf times the sum's
/// reciprocal. The exponentials are the library's exp of 16 floats where the target has AVX-512
/// (`simd::exp16`; std::exp elsewhere, or when n is not a multiple of 16), so the baseline
/// differs from the kernel in the tiles only. With `stream`, y is written with non-temporal
/// stores where the row covers whole 64-byte lines (the kernels' rule for outputs of
/// large_output_bytes and more); the caller fences.
inline void softmax_row(float const* x, float* y, float* buf, std::int64_t n, bool stream) {
  float m = -INFINITY, s = 0;
#if TILEGRAD_USE_XSIMD && defined(__AVX512F__)
  if (n % 16 == 0) {
    // (GCC 12 leaves a max reduction under omp simd a scalar chain: the maximum by hand.)
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (std::int64_t j = 0; j < n; j += 16)
      mx = _mm512_max_ps(mx, _mm512_loadu_ps(x + j));
    m = _mm512_reduce_max_ps(mx);
    __m512 acc = _mm512_setzero_ps();
    __m512 const mv = _mm512_set1_ps(m);
    for (std::int64_t j = 0; j < n; j += 16) {
      __m512 const e = tilegrad::simd::exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j), mv));
      _mm512_storeu_ps(buf + j, e);
      acc = _mm512_add_ps(acc, e);
    }
    s = _mm512_reduce_add_ps(acc);
  } else
#endif
  {
    for (std::int64_t j = 0; j < n; ++j)
      m = std::max(m, x[j]);
    for (std::int64_t j = 0; j < n; ++j) {
      buf[j] = std::exp(x[j] - m);
      s += buf[j];
    }
  }
  float const inv = 1.0f / s;
#if defined(__AVX512F__)
  if (stream && n % 16 == 0 && reinterpret_cast<std::uintptr_t>(y) % 64 == 0) {
    for (std::int64_t j = 0; j < n; j += 16)
      _mm512_stream_ps(y + j, _mm512_mul_ps(_mm512_loadu_ps(buf + j), _mm512_set1_ps(inv)));
    return;
  }
#endif
  (void)stream;
#pragma omp simd
  for (std::int64_t j = 0; j < n; ++j)
    y[j] = buf[j] * inv;
}

/// A row of the softmax backward as a plain loop: dx = y (dy - <dy, y>), dx streamed as
/// softmax_row streams y.
inline void softmax_bwd_row(float const* y, float const* dy, float* dx, std::int64_t n,
                            bool stream) {
  float d = 0;
#pragma omp simd reduction(+ : d)
  for (std::int64_t j = 0; j < n; ++j)
    d += dy[j] * y[j];
#if defined(__AVX512F__)
  if (stream && n % 16 == 0 && reinterpret_cast<std::uintptr_t>(dx) % 64 == 0) {
    __m512 const dv = _mm512_set1_ps(d);
    for (std::int64_t j = 0; j < n; j += 16) {
      __m512 const yv = _mm512_loadu_ps(y + j);
      _mm512_stream_ps(dx + j, _mm512_mul_ps(yv, _mm512_sub_ps(_mm512_loadu_ps(dy + j), dv)));
    }
    return;
  }
#endif
  (void)stream;
#pragma omp simd
  for (std::int64_t j = 0; j < n; ++j)
    dx[j] = y[j] * (dy[j] - d);
}

} // namespace bench
