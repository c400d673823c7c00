// Memory-bound kernels: layer norm (forward; backward = dx with per-group partial dw, db, then
// their reduction) and row softmax (forward, backward) on M = 4096 rows, GB/s of logical
// traffic (each input read once, each output written once), each beside a STREAM-like triad
// moving as many bytes on the same threads: vs_triad is the kernel's GB/s over the triad's.
#include "kernel_bench.hpp"

#include <tilegrad/kernels/layer_norm.hpp>
#include <tilegrad/kernels/softmax.hpp>

#include <tbb/enumerable_thread_specific.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

namespace tg = tilegrad;

namespace {

constexpr std::int64_t M = 4096;
constexpr float eps = 1e-5f;
// Layer-norm tiles: the forward walks a row in blocks of LnBlock columns; the backward a group of
// BwdRows rows per program in blocks of 1 x BwdBlock, the reduction RedGroups x RedBlock.
constexpr int LnBlock = 1024, BwdBlock = 1024, BwdRows = 16, RedGroups = 8, RedBlock = 256;

using wall = std::chrono::steady_clock;

double seconds_since(wall::time_point t0) {
  return std::chrono::duration<double>(wall::now() - t0).count();
}

tg::launch_options on(int threads) {
  return {.exec = tg::executor::tbb, .num_threads = threads};
}

/// Times `run` in the benchmark loop, then as many triads over `bytes` on the same threads,
/// right after on the same clock (wall time: the launches are parallel), so that both see the
/// same machine conditions.
template <class Run>
void timed(benchmark::State& state, std::int64_t bytes, Run&& run) {
  int const threads = static_cast<int>(state.range(1));
  run(); // first touch of the outputs, TBB workers up
  auto const t0 = wall::now();
  for (auto _ : state) {
    run();
    benchmark::ClobberMemory();
  }
  double const kernel_s = seconds_since(t0);
  bench::triad triad(bytes / 12); // three float arrays, `bytes` together
  triad.run(threads);
  auto const t1 = wall::now();
  for (benchmark::IterationCount i = 0; i < state.iterations(); ++i)
    triad.run(threads);
  double const triad_s = seconds_since(t1);
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["threads"] = threads;
  state.counters["triad_GBps"] = double(state.iterations()) * double(bytes) / triad_s / 1e9;
  state.counters["vs_triad"] = triad_s / kernel_s;
}

bool near(double got, double want, double tol = 1e-4) {
  return std::abs(got - want) <= tol * (1 + std::abs(want));
}

void BM_layer_norm_fwd(benchmark::State& state) {
  std::int64_t const n = state.range(0);
  tg::owned_tensor<float> x({M, n}, "x"), w({n}, "w"), b({n}, "b"), y({M, n}, "y");
  tg::owned_tensor<float> mean({M}, "mean"), rstd({M}, "rstd");
  bench::fill(x, 1);
  bench::fill(w, 2);
  bench::fill(b, 3);
  auto const opts = on(static_cast<int>(state.range(1)));
  auto run = [&] {
    tg::launch(opts, static_cast<int>(M), tg::kernels::layer_norm_fwd<LnBlock>, x.cview(),
               w.cview(), b.cview(), y.view(), mean.view(), rstd.view(), eps);
  };
  run();
  double mu = 0, var = 0; // row 0 against a plain loop
  for (std::int64_t j = 0; j < n; ++j)
    mu += x(0, j) / double(n);
  for (std::int64_t j = 0; j < n; ++j)
    var += (x(0, j) - mu) * (x(0, j) - mu) / double(n);
  if (!near(mean(0), mu) ||
      !near(y(0, n - 1), (x(0, n - 1) - mu) / std::sqrt(var + eps) * w(n - 1) + b(n - 1))) {
    state.SkipWithError("result differs from the plain loop");
    return;
  }
  // x, w, b in; y, mean, rstd out.
  timed(state, (2 * M * n + 2 * n + 2 * M) * 4, run);
}

/// The same forward as a plain loop per row (rows split over the same TBB threads), with its
/// three row loops vectorised by `omp simd` (the reductions included): what the access pattern
/// costs without tiles.
void BM_layer_norm_fwd_loop(benchmark::State& state) {
  std::int64_t const n = state.range(0);
  int const threads = static_cast<int>(state.range(1));
  tg::owned_tensor<float> x({M, n}, "x"), w({n}, "w"), b({n}, "b"), y({M, n}, "y");
  tg::owned_tensor<float> mean({M}, "mean"), rstd({M}, "rstd");
  bench::fill(x, 1);
  bench::fill(w, 2);
  bench::fill(b, 3);
  auto run = [&] {
    tbb::task_arena arena(threads);
    arena.execute([&] {
      tbb::parallel_for(std::int64_t{0}, M, [&](std::int64_t i) {
        bench::layer_norm_row(x.data() + i * n, w.data(), b.data(), y.data() + i * n, n, eps,
                              mean.data()[i], rstd.data()[i]);
      });
    });
  };
  timed(state, (2 * M * n + 2 * n + 2 * M) * 4, run);
}

/// The backward: dx with a partial row of dw and db per group of BwdRows rows, then the
/// reduction of the partial rows (both launches timed together).
void BM_layer_norm_bwd(benchmark::State& state) {
  std::int64_t const n = state.range(0);
  int const groups = static_cast<int>(tg::cdiv<std::int64_t>(M, BwdRows));
  tg::owned_tensor<float> x({M, n}, "x"), w({n}, "w"), b({n}, "b"), y({M, n}, "y");
  tg::owned_tensor<float> mean({M}, "mean"), rstd({M}, "rstd"), dy({M, n}, "dy"), dx({M, n}, "dx");
  tg::owned_tensor<float> pdw({groups, n}, "partial_dw"), pdb({groups, n}, "partial_db");
  tg::owned_tensor<float> dw({n}, "dw"), db({n}, "db");
  bench::fill(x, 1);
  bench::fill(w, 2);
  bench::fill(b, 3);
  bench::fill(dy, 4);
  auto const opts = on(static_cast<int>(state.range(1)));
  tg::launch(opts, static_cast<int>(M), tg::kernels::layer_norm_fwd<LnBlock>, x.cview(), w.cview(),
             b.cview(), y.view(), mean.view(), rstd.view(), eps);
  auto run = [&] {
    tg::launch(opts, groups, tg::kernels::layer_norm_bwd<BwdBlock, BwdRows>, x.cview(), w.cview(),
               mean.cview(), rstd.cview(), dy.cview(), dx.view(), pdw.view(), pdb.view());
    tg::launch(opts, tg::cdiv<int>(static_cast<int>(n), RedBlock),
               tg::kernels::layer_norm_reduce_dwdb<RedGroups, RedBlock>, pdw.cview(), pdb.cview(),
               dw.view(), db.view());
  };
  run();
  double db0 = 0; // db[0] against a plain loop
  for (std::int64_t i = 0; i < M; ++i)
    db0 += dy(i, 0);
  if (!near(db(0), db0)) {
    state.SkipWithError("result differs from the plain loop");
    return;
  }
  // x, dy, w, mean, rstd in; dx, dw, db out (the partial sums are not counted).
  timed(state, (3 * M * n + 3 * n + 2 * M) * 4, run);
}

/// The same backward as plain loops over the same TBB threads (a group of BwdRows rows per
/// task, then the partial rows summed per column): what the access pattern costs without tiles.
void BM_layer_norm_bwd_loop(benchmark::State& state) {
  std::int64_t const n = state.range(0);
  int const threads = static_cast<int>(state.range(1));
  std::int64_t const groups = tg::cdiv<std::int64_t>(M, BwdRows);
  tg::owned_tensor<float> x({M, n}, "x"), w({n}, "w"), mean({M}, "mean"), rstd({M}, "rstd");
  tg::owned_tensor<float> dy({M, n}, "dy"), dx({M, n}, "dx");
  tg::owned_tensor<float> pdw({groups, n}, "partial_dw"), pdb({groups, n}, "partial_db");
  tg::owned_tensor<float> dw({n}, "dw"), db({n}, "db");
  bench::fill(x, 1);
  bench::fill(w, 2);
  bench::fill(dy, 4);
  for (std::int64_t i = 0; i < M; ++i) {
    mean(i) = 0.01f * static_cast<float>(i % 7);
    rstd(i) = 1.0f + 0.01f * static_cast<float>(i % 5);
  }
  auto run = [&] {
    tbb::task_arena arena(threads);
    arena.execute([&] {
      tbb::parallel_for(std::int64_t{0}, groups, [&](std::int64_t g) {
        bench::layer_norm_bwd_rows(x.data(), w.data(), mean.data(), rstd.data(), dy.data(),
                                   dx.data(), pdw.data() + g * n, pdb.data() + g * n, g * BwdRows,
                                   std::min(M, (g + 1) * BwdRows), n);
      });
      tbb::parallel_for(std::int64_t{0}, n, std::int64_t{RedBlock}, [&](std::int64_t c0) {
        std::int64_t const c1 = std::min(n, c0 + RedBlock);
        for (std::int64_t j = c0; j < c1; ++j)
          dw(j) = db(j) = 0;
        for (std::int64_t g = 0; g < groups; ++g)
#pragma omp simd
          for (std::int64_t j = c0; j < c1; ++j) {
            dw.data()[j] += pdw.data()[g * n + j];
            db.data()[j] += pdb.data()[g * n + j];
          }
      });
    });
  };
  timed(state, (3 * M * n + 3 * n + 2 * M) * 4, run);
}

template <int Block>
void softmax_fwd(tg::launch_options const& opts, tg::owned_tensor<float> const& x,
                 tg::owned_tensor<float>& y) {
  tg::launch(opts, static_cast<int>(M), tg::kernels::softmax_fwd<Block>, x.cview(), y.view());
}

template <int Block>
void softmax_bwd(tg::launch_options const& opts, tg::owned_tensor<float> const& y,
                 tg::owned_tensor<float> const& dy, tg::owned_tensor<float>& dx) {
  tg::launch(opts, static_cast<int>(M), tg::kernels::softmax_bwd<Block>, y.cview(), dy.cview(),
             dx.view());
}

/// Whether row 0 of the softmax y sums to 1; if not, the benchmark is skipped with the reason.
bool first_row_sums_to_one(benchmark::State& state, tg::owned_tensor<float> const& y) {
  double s = 0;
  for (std::int64_t j = 0; j < y.size(1); ++j)
    s += y(0, j);
  if (!near(s, 1))
    state.SkipWithError("a row of the softmax does not sum to 1");
  return near(s, 1);
}

void BM_softmax_fwd(benchmark::State& state) {
  std::int64_t const n = state.range(0);
  tg::owned_tensor<float> x({M, n}, "x"), y({M, n}, "y");
  bench::fill(x, 1);
  auto const opts = on(static_cast<int>(state.range(1)));
  auto run = [&] { n == 1024 ? softmax_fwd<1024>(opts, x, y) : softmax_fwd<4096>(opts, x, y); };
  run();
  if (!first_row_sums_to_one(state, y))
    return;
  timed(state, 2 * M * n * 4, run); // x in, y out
}

void BM_softmax_bwd(benchmark::State& state) {
  std::int64_t const n = state.range(0);
  tg::owned_tensor<float> x({M, n}, "x"), y({M, n}, "y"), dy({M, n}, "dy"), dx({M, n}, "dx");
  bench::fill(x, 1);
  bench::fill(dy, 2);
  auto const opts = on(static_cast<int>(state.range(1)));
  n == 1024 ? softmax_fwd<1024>(opts, x, y) : softmax_fwd<4096>(opts, x, y);
  auto run = [&] {
    n == 1024 ? softmax_bwd<1024>(opts, y, dy, dx) : softmax_bwd<4096>(opts, y, dy, dx);
  };
  run();
  double dot = 0; // dx[0, 0] = y (dy - <dy, y>) against a plain loop
  for (std::int64_t j = 0; j < n; ++j)
    dot += double(dy(0, j)) * y(0, j);
  if (!near(dx(0, 0), y(0, 0) * (dy(0, 0) - dot))) {
    state.SkipWithError("result differs from the plain loop");
    return;
  }
  timed(state, 3 * M * n * 4, run); // y, dy in, dx out
}

/// Runs row(i) for the M rows over `threads` TBB threads, then fences non-temporal stores.
template <class Row>
void plain_rows(int threads, Row&& row) {
  tbb::task_arena arena(threads);
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, M),
                      [&](tbb::blocked_range<std::int64_t> const& r) {
                        for (std::int64_t i = r.begin(); i < r.end(); ++i)
                          row(i);
                      });
  });
#if defined(__AVX512F__)
  _mm_sfence();
#endif
}

/// The softmax forward as a plain loop per row over the same TBB threads (bench::softmax_row:
/// the library's exp, y streamed as the kernel streams it): what the access pattern and the
/// exponentials cost without tiles.
void BM_softmax_fwd_loop(benchmark::State& state) {
  std::int64_t const n = state.range(0);
  int const threads = static_cast<int>(state.range(1));
  tg::owned_tensor<float> x({M, n}, "x"), y({M, n}, "y");
  bench::fill(x, 1);
  bool const stream = M * n * 4 >= tg::large_output_bytes;
  tbb::enumerable_thread_specific<std::vector<float>> bufs([n] { return std::vector<float>(n); });
  auto run = [&] {
    plain_rows(threads, [&](std::int64_t i) {
      bench::softmax_row(x.data() + i * n, y.data() + i * n, bufs.local().data(), n, stream);
    });
  };
  run();
  if (!first_row_sums_to_one(state, y))
    return;
  timed(state, 2 * M * n * 4, run);
}

/// The softmax backward as a plain loop per row (bench::softmax_bwd_row).
void BM_softmax_bwd_loop(benchmark::State& state) {
  std::int64_t const n = state.range(0);
  int const threads = static_cast<int>(state.range(1));
  tg::owned_tensor<float> x({M, n}, "x"), y({M, n}, "y"), dy({M, n}, "dy"), dx({M, n}, "dx");
  bench::fill(x, 1);
  bench::fill(dy, 2);
  n == 1024 ? softmax_fwd<1024>(on(threads), x, y) : softmax_fwd<4096>(on(threads), x, y);
  bool const stream = M * n * 4 >= tg::large_output_bytes;
  auto run = [&] {
    plain_rows(threads, [&](std::int64_t i) {
      bench::softmax_bwd_row(y.data() + i * n, dy.data() + i * n, dx.data() + i * n, n, stream);
    });
  };
  run();
  double dot = 0;
  for (std::int64_t j = 0; j < n; ++j)
    dot += double(dy(0, j)) * y(0, j);
  if (!near(dx(0, 0), y(0, 0) * (dy(0, 0) - dot))) {
    state.SkipWithError("result differs from the closed form");
    return;
  }
  timed(state, 3 * M * n * 4, run);
}

/// The triad alone over three M x N arrays, as a plain baseline row in the table.
void BM_triad(benchmark::State& state) {
  int const threads = static_cast<int>(state.range(1));
  bench::triad t(M * state.range(0));
  for (auto _ : state)
    t.run(threads);
  state.SetBytesProcessed(state.iterations() * t.bytes());
  state.counters["threads"] = threads;
}

void sizes_and_threads(benchmark::internal::Benchmark* b) {
  b->ArgNames({"N", "threads"});
  // 1 and 2 threads, and every core where there are more (the 16-core machine's figures).
  std::vector<std::int64_t> threads{1, 2};
  if (std::int64_t const hw = std::thread::hardware_concurrency(); hw > 2) threads.push_back(hw);
  for (std::int64_t n : {1024, 4096})
    for (std::int64_t t : threads)
      b->Args({n, t});
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}

} // namespace

BENCHMARK(BM_layer_norm_fwd)->Apply(sizes_and_threads);
BENCHMARK(BM_layer_norm_fwd_loop)->Apply(sizes_and_threads);
BENCHMARK(BM_layer_norm_bwd)->Apply(sizes_and_threads);
BENCHMARK(BM_layer_norm_bwd_loop)->Apply(sizes_and_threads);
BENCHMARK(BM_softmax_fwd)->Apply(sizes_and_threads);
BENCHMARK(BM_softmax_bwd)->Apply(sizes_and_threads);
BENCHMARK(BM_softmax_fwd_loop)->Apply(sizes_and_threads);
BENCHMARK(BM_softmax_bwd_loop)->Apply(sizes_and_threads);
BENCHMARK(BM_triad)->Apply(sizes_and_threads);
BENCHMARK_MAIN();
