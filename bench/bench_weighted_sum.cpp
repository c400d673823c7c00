// Weighted sum y = x @ w (the CS336 kernel, 01 in examples/): GB/s of the tilegrad kernel
// beside a STREAM-like triad over as many bytes, on 1 .. all threads.
#include "kernel_bench.hpp"

#include <tilegrad/kernels/weighted_sum.hpp>

namespace tg = tilegrad;

namespace {

constexpr std::int64_t rows = 16384, cols = 1000; // 65.5 MB of x: far beyond the caches

// Tile shapes: BR rows of x per program, BD columns per step.
template <int BR, int BD>
void BM_weighted_sum(benchmark::State& state) {
  int const threads = static_cast<int>(state.range(0));
  tg::owned_tensor<float> x({rows, cols}, "x"), w({cols}, "w"), y({rows}, "y");
  bench::fill(x, 1);
  bench::fill(w, 2);
  tg::launch_options opts{tg::executor::tbb, threads};
  for (auto _ : state) {
    tg::launch(opts, tg::cdiv<int>(rows, BR), tg::kernels::weighted_sum_fwd<BR, BD>, x.cview(),
               w.cview(), y.view());
    benchmark::ClobberMemory();
  }
  std::int64_t const bytes = (rows * cols + cols + rows) * 4;
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["threads"] = threads;
}

void BM_triad(benchmark::State& state) { bench::run_triad(state, rows * cols * 4); }

} // namespace

BENCHMARK(BM_weighted_sum<16, 128>)->Apply(bench::threads_arg);
BENCHMARK(BM_weighted_sum<8, 256>)->Apply(bench::threads_arg);
BENCHMARK(BM_weighted_sum<4, 512>)->Apply(bench::threads_arg);
BENCHMARK(BM_weighted_sum<2, 1024>)->Apply(bench::threads_arg);
BENCHMARK(BM_triad)->Apply(bench::threads_arg);
BENCHMARK_MAIN();
