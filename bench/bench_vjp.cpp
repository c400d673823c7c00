// Reference gradients (vjp) of the example kernels beside their float forward: time of the
// whole vjp (forward recording, seeding, reverse sweep, accumulation) and the peak tape size,
// at two grid sizes, and with a subset of the gradients asked for.
#include "kernel_bench.hpp"

#include <tilegrad/kernels/matmul.hpp>
#include <tilegrad/kernels/softmax.hpp>
#include <tilegrad/kernels/weighted_sum.hpp>

namespace tg = tilegrad;

namespace {

constexpr int BR = 16, BD = 64;

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
  std::size_t tape = 0;
  for (auto _ : state) {
    if (which == 0) {
      tg::launch(opts, grid, k, x.cview(), w.cview(), y.view());
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
  std::size_t tape = 0;
  for (auto _ : state) {
    if (grad)
      tape = tg::vjp(opts, static_cast<int>(n), k, tg::in("x", x), tg::out("y", y, dy)).peak_tape_bytes();
    else
      tg::launch(opts, static_cast<int>(n), k, x.cview(), y.view());
    benchmark::ClobberMemory();
  }
  state.counters["tape_bytes"] = static_cast<double>(tape);
  state.SetLabel(grad ? "vjp dx" : "forward");
}

void BM_matmul(benchmark::State& state) {
  std::int64_t const n = state.range(0);
  int const which = static_cast<int>(state.range(1));
  tg::owned_tensor<float> a({n, n}, "a"), b({n, n}, "b"), c({n, n}, "c"), dc({n, n}, "dc");
  bench::fill(a, 1);
  bench::fill(b, 2);
  bench::fill(dc, 3);
  tg::launch_options opts{tg::executor::tbb, 1};
  int const grid = tg::cdiv<int>(n, 64) * tg::cdiv<int>(n, 64);
  auto const k = tg::kernels::matmul_fwd<64, 64, 32, 2>;
  std::size_t tape = 0;
  for (auto _ : state) {
    if (which == 0)
      tg::launch(opts, grid, k, a.cview(), b.cview(), c.view());
    else if (which == 1)
      tape = tg::vjp(opts, grid, k, tg::in("a", a), tg::in("b", b), tg::out("c", c, dc)).peak_tape_bytes();
    else
      tape = tg::vjp(opts, grid, k, tg::in("a", a), b.cview(), tg::out("c", c, dc)).peak_tape_bytes();
    benchmark::ClobberMemory();
  }
  state.counters["tape_bytes"] = static_cast<double>(tape);
  state.SetLabel(which == 0 ? "forward" : which == 1 ? "vjp da,db" : "vjp da");
}

} // namespace

BENCHMARK(BM_weighted_sum)->ArgsProduct({{1024, 8192}, {0, 1, 2, 3}})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_softmax)->ArgsProduct({{256, 2048}, {0, 1}})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_matmul)->ArgsProduct({{256, 512}, {0, 1, 2}})->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
