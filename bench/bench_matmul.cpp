// Matrix product (03 in examples/): GFLOP/s of the tilegrad Triton-tutorial kernel beside
// OpenBLAS sgemm on the same threads, square sizes 512, 1024, 2048, on 1 .. all threads.
#include "kernel_bench.hpp"

#include <tilegrad/kernels/matmul.hpp>

#if TILEGRAD_HAVE_CBLAS
#include <cblas.h>
extern "C" void openblas_set_num_threads(int);
#endif

namespace tg = tilegrad;

namespace {

constexpr int BM = 128, BN = 64, BK = 64, GroupM = 2;

void BM_matmul(benchmark::State& state) {
  std::int64_t const n = state.range(0);
  int const threads = static_cast<int>(state.range(1));
  tg::owned_tensor<float> a({n, n}, "a"), b({n, n}, "b"), c({n, n}, "c");
  bench::fill(a, 1);
  bench::fill(b, 2);
  tg::launch_options opts{tg::executor::tbb, threads};
  int const grid = tg::cdiv<int>(n, BM) * tg::cdiv<int>(n, BN);
  for (auto _ : state) {
    tg::launch(opts, grid, tg::kernels::matmul_fwd<BM, BN, BK, GroupM>, a.cview(), b.cview(), c.view());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * n * n * n * state.iterations(),
                                                 benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.counters["threads"] = threads;
}

// Tile shapes and group sizes at n = 1024 on one thread (sequential executor).
template <int TM, int TN, int TK, int G>
void BM_matmul_tiles(benchmark::State& state) {
  std::int64_t const n = 1024;
  tg::owned_tensor<float> a({n, n}, "a"), b({n, n}, "b"), c({n, n}, "c");
  bench::fill(a, 1);
  bench::fill(b, 2);
  int const grid = tg::cdiv<int>(n, TM) * tg::cdiv<int>(n, TN);
  for (auto _ : state) {
    tg::launch({tg::executor::sequential, 1}, grid, tg::kernels::matmul_fwd<TM, TN, TK, G>,
               a.cview(), b.cview(), c.view());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * n * n * n * state.iterations(),
                                                 benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}

#if TILEGRAD_HAVE_CBLAS
void BM_sgemm_openblas(benchmark::State& state) {
  std::int64_t const n = state.range(0);
  int const threads = static_cast<int>(state.range(1));
  openblas_set_num_threads(threads);
  tg::owned_tensor<float> a({n, n}, "a"), b({n, n}, "b"), c({n, n}, "c");
  bench::fill(a, 1);
  bench::fill(b, 2);
  int const ni = static_cast<int>(n);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ni, ni, ni, 1.0f, a.data(), ni,
                b.data(), ni, 0.0f, c.data(), ni);
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * n * n * n * state.iterations(),
                                                 benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.counters["threads"] = threads;
}
#endif

void sizes_threads(benchmark::internal::Benchmark* b) {
  for (std::int64_t n : {512, 1024, 2048})
    for (auto t : bench::thread_counts()) b->Args({n, t});
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}

} // namespace

BENCHMARK(BM_matmul)->Apply(sizes_threads);
BENCHMARK(BM_matmul_tiles<128, 64, 64, 1>)->Name("tiles/128x64x64/group1")->Unit(benchmark::kMillisecond);
BENCHMARK(BM_matmul_tiles<128, 64, 64, 2>)->Name("tiles/128x64x64/group2")->Unit(benchmark::kMillisecond);
BENCHMARK(BM_matmul_tiles<128, 64, 64, 8>)->Name("tiles/128x64x64/group8")->Unit(benchmark::kMillisecond);
BENCHMARK(BM_matmul_tiles<128, 128, 64, 2>)->Name("tiles/128x128x64/group2")->Unit(benchmark::kMillisecond);
BENCHMARK(BM_matmul_tiles<64, 128, 64, 2>)->Name("tiles/64x128x64/group2")->Unit(benchmark::kMillisecond);
#if TILEGRAD_HAVE_CBLAS
BENCHMARK(BM_sgemm_openblas)->Apply(sizes_threads);
#endif
BENCHMARK_MAIN();
