// What check_backward costs: the check of FlashAttention-2's library backwards (atomic dQ and
// two-pass, causal and full) at B = 1, H = 2, N = 512, d = 64, and of the default (two-pass,
// causal) at H = 16, N = 4096 on every thread, 3 seeds and default options, against the backward
// alone (the baseline, `BM_backward`, and timed again right after each check loop on the same
// threads: the counter `vs_backward` is one check's time over one backward's).
//
// A check runs, per seed, the float forward, three reference vjps of the forward (float64,
// float32 and the float64 magnitude sweep) and the backward; on the first seed also the backward
// three more times (zero and doubled cotangents, the determinism rerun). Every launch of the
// backward under the check is bounds-checked and tracked for races.
//
// Clocks: wall-clock time (UseRealTime); `threads` is the TBB thread count of every launch.
#include "kernel_bench.hpp"

#include <tilegrad/kernels/flash_attention.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <stdexcept>

namespace tg = tilegrad;
namespace tk = tilegrad::kernels;

namespace {

constexpr int D = 64;
constexpr int BQ = tk::detail::block_q<D>, BK = tk::detail::block_k<D>;
constexpr std::int64_t B = 1;

tg::launch_options launch(int threads) {
  return tg::launch_options{tg::executor::tbb, threads};
}

tk::attention_backward variant_of(std::int64_t v) {
  return v == 0 ? tk::attention_backward::atomic_dq : tk::attention_backward::two_pass;
}

/// The forward's tensors and the backward's gradients, inputs uniform in [-2, 2) as the checker
/// draws them.
struct problem {
  tg::owned_tensor<float> q, k, v, o, lse, d_o, dq, dk, dv;
  problem(std::int64_t H, std::int64_t N, bool causal, int threads)
      : q({B, H, N, D}, "q"), k({B, H, N, D}, "k"), v({B, H, N, D}, "v"), o({B, H, N, D}, "o"),
        lse({B, H, N}, "lse"), d_o({B, H, N, D}, "d_o"), dq({B, H, N, D}, "dq"),
        dk({B, H, N, D}, "dk"), dv({B, H, N, D}, "dv") {
    bench::fill(q, 1);
    bench::fill(k, 2);
    bench::fill(v, 3);
    bench::fill(d_o, 4);
    tk::flash_attention_forward<float>(q.cview(), k.cview(), v.cview(), o.view(), lse.view(),
                                       {.causal = causal, .launch = launch(threads)});
  }
  void backward(bool causal, int threads, tk::attention_backward variant) {
    tk::flash_attention_backward<float>(q.cview(), k.cview(), v.cview(), o.cview(), d_o.cview(),
                                        lse.cview(), dq.view(), dk.view(), dv.view(),
                                        {.causal = causal, .launch = launch(threads)}, variant);
  }
};

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Seconds per backward: one call to warm up, then calls for at least `budget` seconds.
double backward_seconds(problem& p, bool causal, int threads, tk::attention_backward variant,
                        double budget = 0.5) {
  p.backward(causal, threads, variant);
  int calls = 0;
  double const t0 = now();
  double t = t0;
  while (calls < 3 || t - t0 < budget) {
    p.backward(causal, threads, variant);
    ++calls;
    t = now();
  }
  return (t - t0) / calls;
}

template <bool Causal>
tg::check_report check(tk::attention_backward variant, int threads, std::int64_t H, std::int64_t N,
                       bool check_reference) {
  tg::owned_tensor<float> q({B, H, N, D}), k({B, H, N, D}), v({B, H, N, D}), o({B, H, N, D}),
      lse({B, H, N}, "lse");
  auto const g = tg::grid(tg::cdiv<int>(int(N), BQ), int(H), int(B));
  tg::tensor<float const> const saved = lse.cview();
  return tg::check_backward(
      tg::forward(g, tk::flash_attention_fwd<D, BQ, BK, Causal>, tg::in("q", q), tg::in("k", k),
                  tg::in("v", v), tg::out("o", o), lse.view(), 1 / std::sqrt(double(D))),
      [&](tg::backward_context<float>& ctx) {
        auto const qi = ctx.input("q"), ki = ctx.input("k"), vi = ctx.input("v");
        tg::owned_tensor<float> dq(qi.shape().data(), 4), dk(ki.shape().data(), 4),
            dv(vi.shape().data(), 4);
        tk::flash_attention_backward<float>(qi, ki, vi, ctx.output("o"), ctx.cotangent("o"), saved,
                                            dq.view(), dk.view(), dv.view(),
                                            {.causal = Causal, .launch = ctx.options()}, variant);
        ctx.set_gradient("q", dq);
        ctx.set_gradient("k", dk);
        ctx.set_gradient("v", dv);
      },
      {.inputs = tg::uniform(-2, 2),
       .check_reference = check_reference,
       .launch = launch(threads)});
}

// Args: variant (0 atomic dQ, 1 two-pass), causal (0, 1), threads, H, N.
void BM_backward(benchmark::State& state) {
  auto const variant = variant_of(state.range(0));
  bool const causal = state.range(1) != 0;
  int const threads = int(state.range(2));
  std::int64_t const H = state.range(3), N = state.range(4);
  problem p(H, N, causal, threads);
  for (auto _ : state) {
    p.backward(causal, threads, variant);
    benchmark::ClobberMemory();
  }
  state.counters["threads"] = threads;
}

// Args: those of BM_backward, then whether the reference is checked against forward mode
// (check_options::check_reference; 0: its cost, by difference).
void BM_check_backward(benchmark::State& state) {
  auto const variant = variant_of(state.range(0));
  bool const causal = state.range(1) != 0;
  int const threads = int(state.range(2));
  std::int64_t const H = state.range(3), N = state.range(4);
  bool const reference = state.range(5) != 0;
  double const t0 = now();
  for (auto _ : state) {
    auto const r = causal ? check<true>(variant, threads, H, N, reference)
                          : check<false>(variant, threads, H, N, reference);
    if (!r) {
      state.SkipWithError("check_backward failed on a library backward");
      return;
    }
  }
  double const per_check = (now() - t0) / double(state.iterations());
  problem p(H, N, causal, threads);
  state.counters["threads"] = threads;
  state.counters["vs_backward"] = per_check / backward_seconds(p, causal, threads, variant);
}

void args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"two_pass", "causal", "threads", "H", "N"});
  for (std::int64_t threads : bench::thread_counts())
    for (std::int64_t causal : {1, 0})
      for (std::int64_t variant : {0, 1})
        b->Args({variant, causal, threads, 2, 512});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

/// args, with the reference checked; and on one thread, not checked.
void check_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"two_pass", "causal", "threads", "H", "N", "reference"});
  for (std::int64_t threads : bench::thread_counts())
    for (std::int64_t causal : {1, 0})
      for (std::int64_t variant : {0, 1})
        for (std::int64_t reference : {1, 0})
          if (reference || threads == 1)
            b->Args({variant, causal, threads, 2, 512, reference});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

/// The larger case: causal, the default (two-pass) backward, on every thread.
void large_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"two_pass", "causal", "threads", "H", "N"});
  b->Args({1, 1, bench::thread_counts().back(), 16, 4096});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

void large_check_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"two_pass", "causal", "threads", "H", "N", "reference"});
  for (std::int64_t reference : {1, 0})
    b->Args({1, 1, bench::thread_counts().back(), 16, 4096, reference});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

} // namespace

BENCHMARK(BM_backward)->Apply(args);
BENCHMARK(BM_backward)->Apply(large_args);
BENCHMARK(BM_check_backward)->Apply(check_args)->Iterations(3);
BENCHMARK(BM_check_backward)->Apply(large_check_args)->Iterations(1);

BENCHMARK_MAIN();
