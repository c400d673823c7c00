// What a program of a row kernel costs on one core: the memory-bound kernels of bench_norms and
// bench_weighted_sum on the sequential executor (no thread pool in the way), one row per program
// (eight per program for the layer-norm backward, which sums groups of rows), in nanoseconds per
// row of 1024 floats (and, for the softmax, of 1000 floats in blocks of 1024). M = 32 rows stay in
// the caches, so the figure is the kernel's own work and bookkeeping; M = 4096 rows (16 MiB per
// array) come from memory. Beside them, the layer-norm forward as a plain loop per row. Noise on a
// shared machine is one-sided, so the `min` of the repetitions is the figure to read.
#include "kernel_bench.hpp"

#include <tilegrad/kernels/layer_norm.hpp>
#include <tilegrad/kernels/softmax.hpp>
#include <tilegrad/kernels/weighted_sum.hpp>
#include <tilegrad/tilegrad.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <vector>

namespace tg = tilegrad;

namespace {

constexpr std::int64_t N = 1024;
constexpr float eps = 1e-5f;

struct rows {
  explicit rows(int m)
      : M(m), x({m, N}, "x"), w({N}, "w"), b({N}, "b"), y({m, N}, "y"), dy({m, N}, "dy"),
        dx({m, N}, "dx"), mean({m}, "mean"), rstd({m}, "rstd"), pdw({m / 8, N}, "partial_dw"),
        pdb({m / 8, N}, "partial_db") {
    bench::fill(x, 1);
    bench::fill(w, 2);
    bench::fill(b, 3);
    bench::fill(dy, 4);
    ln_fwd();
  }
  void ln_fwd() {
    tg::launch(seq, M, tg::kernels::layer_norm_fwd<1024>, x.cview(), w.cview(), b.cview(), y.view(),
               mean.view(), rstd.view(), eps);
  }
  int M;
  tg::launch_options seq{.exec = tg::executor::sequential};
  tg::owned_tensor<float> x, w, b, y, dy, dx, mean, rstd, pdw, pdb;
};

template <class F>
void per_row(benchmark::State& state, int M, F&& run) {
  run();
  auto const t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    run();
    benchmark::ClobberMemory();
  }
  double const ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  state.counters["ns_per_row"] =
      ns / (static_cast<double>(M) * static_cast<double>(state.iterations()));
}

void BM_layer_norm_fwd(benchmark::State& state) {
  rows r(static_cast<int>(state.range(0)));
  per_row(state, r.M, [&] { r.ln_fwd(); });
}

/// The forward as a plain loop per row, its three row loops vectorised by `omp simd`.
void BM_layer_norm_fwd_loop(benchmark::State& state) {
  rows r(static_cast<int>(state.range(0)));
  per_row(state, r.M, [&] {
    for (int i = 0; i < r.M; ++i) {
      bench::layer_norm_row(r.x.data() + i * N, r.w.data(), r.b.data(), r.y.data() + i * N, N, eps,
                            r.mean.data()[i], r.rstd.data()[i]);
    }
  });
}

template <int Block>
void BM_layer_norm_bwd(benchmark::State& state) {
  rows r(static_cast<int>(state.range(0)));
  per_row(state, r.M, [&] {
    tg::launch(r.seq, r.M / 8, tg::kernels::layer_norm_bwd<Block, 8>, r.x.cview(), r.w.cview(),
               r.mean.cview(), r.rstd.cview(), r.dy.cview(), r.dx.view(), r.pdw.view(),
               r.pdb.view());
  });
}

/// The softmax rows of Cols floats in blocks of 1024 (Cols = 1000: every row ends inside its
/// block, the lanes past it masked).
template <std::int64_t Cols>
struct softmax_rows {
  explicit softmax_rows(int m)
      : M(m), x({m, Cols}, "x"), y({m, Cols}, "y"), dy({m, Cols}, "dy"), dx({m, Cols}, "dx") {
    bench::fill(x, 1);
    bench::fill(dy, 4);
    fwd();
  }
  void fwd() { tg::launch(seq, M, tg::kernels::softmax_fwd<1024>, x.cview(), y.view()); }
  int M;
  tg::launch_options seq{.exec = tg::executor::sequential};
  tg::owned_tensor<float> x, y, dy, dx;
};

template <std::int64_t Cols>
void BM_softmax_fwd(benchmark::State& state) {
  softmax_rows<Cols> r(static_cast<int>(state.range(0)));
  per_row(state, r.M, [&] { r.fwd(); });
}

template <std::int64_t Cols>
void BM_softmax_bwd(benchmark::State& state) {
  softmax_rows<Cols> r(static_cast<int>(state.range(0)));
  per_row(state, r.M, [&] {
    tg::launch(r.seq, r.M, tg::kernels::softmax_bwd<1024>, r.y.cview(), r.dy.cview(), r.dx.view());
  });
}

/// The weighted sum y = x @ w over rows of 1000 floats, programs of 8 rows in blocks of 256.
void BM_weighted_sum(benchmark::State& state) {
  int const M = static_cast<int>(state.range(0));
  tg::owned_tensor<float> x({M, 1000}, "x"), w({1000}, "w"), y({M}, "y");
  bench::fill(x, 5);
  bench::fill(w, 6);
  tg::launch_options const seq{.exec = tg::executor::sequential};
  per_row(state, M, [&] {
    tg::launch(seq, M / 8, tg::kernels::weighted_sum_fwd<8, 256>, x.cview(), w.cview(), y.view());
  });
}

void in_cache_and_memory(benchmark::internal::Benchmark* b) {
  b->ArgName("M")->Arg(32)->Arg(4096)->Repetitions(5)->ReportAggregatesOnly(true);
  b->ComputeStatistics(
      "min", [](std::vector<double> const& v) { return *std::min_element(v.begin(), v.end()); });
}

} // namespace

BENCHMARK(BM_layer_norm_fwd)->Apply(in_cache_and_memory);
BENCHMARK(BM_layer_norm_fwd_loop)->Apply(in_cache_and_memory);
BENCHMARK(BM_layer_norm_bwd<256>)->Apply(in_cache_and_memory);
BENCHMARK(BM_layer_norm_bwd<1024>)->Apply(in_cache_and_memory);
BENCHMARK(BM_softmax_fwd<1024>)->Apply(in_cache_and_memory);
BENCHMARK(BM_softmax_fwd<1000>)->Apply(in_cache_and_memory);
BENCHMARK(BM_softmax_bwd<1024>)->Apply(in_cache_and_memory);
BENCHMARK(BM_softmax_bwd<1000>)->Apply(in_cache_and_memory);
BENCHMARK(BM_weighted_sum)->Apply(in_cache_and_memory);

BENCHMARK_MAIN();
