// Row softmax (02 in examples/): GB/s of the tilegrad kernel beside a naive loop (max, then
// exp and sum, then normalise; rows split over TBB threads) and a triad, on 1 .. all threads.
#include "kernel_bench.hpp"

#include <tilegrad/kernels/softmax.hpp>

#include <cmath>

namespace tg = tilegrad;

namespace {

constexpr std::int64_t rows = 8192, cols = 1000; // 32.8 MB in, 32.8 MB out
constexpr int Block = tg::next_power_of_2(1000);

void BM_softmax(benchmark::State& state) {
  int const threads = static_cast<int>(state.range(0));
  tg::owned_tensor<float> x({rows, cols}, "x"), y({rows, cols}, "y");
  bench::fill(x, 1);
  tg::launch_options opts{tg::executor::tbb, threads};
  for (auto _ : state) {
    tg::launch(opts, static_cast<int>(rows), tg::kernels::softmax_fwd<Block>, x.cview(), y.view());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 2 * rows * cols * 4);
  state.counters["threads"] = threads;
}

void BM_softmax_naive(benchmark::State& state) {
  int const threads = static_cast<int>(state.range(0));
  tg::owned_tensor<float> x({rows, cols}, "x"), y({rows, cols}, "y");
  bench::fill(x, 1);
  for (auto _ : state) {
    tbb::task_arena arena(threads);
    arena.execute([&] {
      tbb::parallel_for(std::int64_t{0}, rows, [&](std::int64_t i) {
        float const* in = x.data() + i * cols;
        float* out = y.data() + i * cols;
        float m = -INFINITY;
        for (std::int64_t j = 0; j < cols; ++j) m = std::max(m, in[j]);
        float s = 0;
        for (std::int64_t j = 0; j < cols; ++j) {
          out[j] = std::exp(in[j] - m);
          s += out[j];
        }
        for (std::int64_t j = 0; j < cols; ++j) out[j] /= s;
      });
    });
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 2 * rows * cols * 4);
  state.counters["threads"] = threads;
}

void BM_triad(benchmark::State& state) { bench::run_triad(state, 2 * rows * cols * 4); }

} // namespace

BENCHMARK(BM_softmax)->Apply(bench::threads_arg);
BENCHMARK(BM_softmax_naive)->Apply(bench::threads_arg);
BENCHMARK(BM_triad)->Apply(bench::threads_arg);
BENCHMARK_MAIN();
