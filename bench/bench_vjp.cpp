// Reference gradients (vjp) of the example kernels beside their float forward: time of the
// whole vjp (forward recording, seeding, reverse sweep, accumulation) and the peak tape size,
// at two grid sizes, and with a subset of the gradients asked for. Each vjp benchmark also times
// the float forward on the same data just before, and reports `ratio`: vjp time / forward time.
// Matmul also runs forward mode (jvp along both inputs), with its ratio to the forward.
#include "kernel_bench.hpp"

#include <chrono>

#include <tilegrad/kernels/matmul.hpp>
#include <tilegrad/kernels/softmax.hpp>
#include <tilegrad/kernels/weighted_sum.hpp>

namespace tg = tilegrad;

namespace {

constexpr int BR = 16, BD = 64;

// Seconds per call of f, over at least 50 ms of calls (after one warm-up call).
template <class F>
double seconds_per_call(F&& f) {
  using clock = std::chrono::steady_clock;
  f();
  int n = 0;
  auto const t0 = clock::now();
  double s = 0;
  do {
    f();
    ++n;
    s = std::chrono::duration<double>(clock::now() - t0).count();
  } while (s < 0.05 || n < 5);
  return s / n;
}

// ratio = (seconds per iteration of the loop that began at t0) / forward.
void report_ratio(benchmark::State& state, std::chrono::steady_clock::time_point t0, double forward) {
  double const loop = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  state.counters["ratio"] = loop / static_cast<double>(state.iterations()) / forward;
}

// which: 0 forward only, 1 vjp for x and w, 2 only dx (w passive), 3 only dw (x passive)
void BM_weighted_sum(benchmark::State& state) {
  std::int64_t const n = state.range(0), d = 512;
  int const which = static_cast<int>(state.range(1));
  tg::owned_tensor<float> x({n, d}, "x"), w({d}, "w"), y({n}, "y"), dy({n}, "dy");
  bench::fill(x, 1);
  bench::fill(w, 2);
  bench::fill(dy, 3);
  tg::launch_options opts{tg::executor::tbb, 1};
  int const grid = tg::cdiv<int>(n, BR);
  auto const k = tg::kernels::weighted_sum_fwd<BR, BD>;
  auto const forward = [&] { tg::launch(opts, grid, k, x.cview(), w.cview(), y.view()); };
  double const fwd = which == 0 ? 0.0 : seconds_per_call(forward);
  std::size_t tape = 0;
  auto const t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    if (which == 0) {
      forward();
    } else if (which == 1) {
      tape = tg::vjp(opts, grid, k, tg::in("x", x), tg::in("w", w), tg::out("y", y, dy)).peak_tape_bytes();
    } else if (which == 2) {
      tape = tg::vjp(opts, grid, k, tg::in("x", x), w.cview(), tg::out("y", y, dy)).peak_tape_bytes();
    } else {
      tape = tg::vjp(opts, grid, k, x.cview(), tg::in("w", w), tg::out("y", y, dy)).peak_tape_bytes();
    }
    benchmark::ClobberMemory();
  }
  state.counters["tape_bytes"] = static_cast<double>(tape);
  if (which != 0) report_ratio(state, t0, fwd);
  state.SetLabel(which == 0 ? "forward" : which == 1 ? "vjp dx,dw" : which == 2 ? "vjp dx" : "vjp dw");
}

void BM_softmax(benchmark::State& state) {
  std::int64_t const n = state.range(0), d = 1000;
  bool const grad = state.range(1) != 0;
  tg::owned_tensor<float> x({n, d}, "x"), y({n, d}, "y"), dy({n, d}, "dy");
  bench::fill(x, 1);
  bench::fill(dy, 2);
  tg::launch_options opts{tg::executor::tbb, 1};
  auto const k = tg::kernels::softmax_fwd<1024>;
  auto const forward = [&] { tg::launch(opts, static_cast<int>(n), k, x.cview(), y.view()); };
  double const fwd = grad ? seconds_per_call(forward) : 0.0;
  std::size_t tape = 0;
  auto const t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    if (grad)
      tape = tg::vjp(opts, static_cast<int>(n), k, tg::in("x", x), tg::out("y", y, dy)).peak_tape_bytes();
    else
      forward();
    benchmark::ClobberMemory();
  }
  state.counters["tape_bytes"] = static_cast<double>(tape);
  if (grad) report_ratio(state, t0, fwd);
  state.SetLabel(grad ? "vjp dx" : "forward");
}

void BM_matmul(benchmark::State& state) {
  std::int64_t const n = state.range(0);
  int const which = static_cast<int>(state.range(1));
  tg::owned_tensor<float> a({n, n}, "a"), b({n, n}, "b"), c({n, n}, "c"), dc({n, n}, "dc"),
      ua({n, n}, "ua"), ub({n, n}, "ub");
  bench::fill(a, 1);
  bench::fill(b, 2);
  bench::fill(dc, 3);
  bench::fill(ua, 4);
  bench::fill(ub, 5);
  tg::launch_options opts{tg::executor::tbb, 1};
  int const grid = tg::cdiv<int>(n, 64) * tg::cdiv<int>(n, 64);
  auto const k = tg::kernels::matmul_fwd<64, 64, 32, 2>;
  auto const forward = [&] { tg::launch(opts, grid, k, a.cview(), b.cview(), c.view()); };
  double const fwd = which == 0 ? 0.0 : seconds_per_call(forward);
  std::size_t tape = 0;
  auto const t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    if (which == 0)
      forward();
    else if (which == 1)
      tape = tg::vjp(opts, grid, k, tg::in("a", a), tg::in("b", b), tg::out("c", c, dc)).peak_tape_bytes();
    else if (which == 2)
      tape = tg::vjp(opts, grid, k, tg::in("a", a), b.cview(), tg::out("c", c, dc)).peak_tape_bytes();
    else // forward mode: the tangent of c along (ua, ub)
      benchmark::DoNotOptimize(tg::jvp(opts, grid, k, tg::tangent_in("a", a.cview(), ua.cview()),
                                       tg::tangent_in("b", b.cview(), ub.cview()),
                                       tg::tangent_out("c", c.view())));
    benchmark::ClobberMemory();
  }
  state.counters["tape_bytes"] = static_cast<double>(tape);
  if (which != 0) report_ratio(state, t0, fwd);
  state.SetLabel(which == 0   ? "forward"
                 : which == 1 ? "vjp da,db"
                 : which == 2 ? "vjp da"
                              : "jvp along da,db");
}

} // namespace

BENCHMARK(BM_weighted_sum)->ArgsProduct({{1024, 8192}, {0, 1, 2, 3}})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_softmax)->ArgsProduct({{256, 2048}, {0, 1}})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_matmul)->ArgsProduct({{256, 512}, {0, 1, 2, 3}})->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
