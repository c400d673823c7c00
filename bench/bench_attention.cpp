// FlashAttention-2 (kernels/flash_attention.hpp), causal, head dim 64: GFLOP/s of tilegrad's
// forward, both backwards and forward + backward, beside a naive attention that forms the N x N
// scores with OpenBLAS sgemm, and beside sgemm itself timed in the same benchmark on the same
// threads (`vs_sgemm`); the reference gradients (vjp) of the forward kernel against the forward
// (`vjp_vs_fwd`); and the peak memory of that vjp on one head of 16384 rows.
//
// Flop convention (useful work of causal attention, as in the FlashAttention papers): the
// forward is two N x N x d products per head, half of them masked out, 4 N^2 d / 2 flops; the
// backward is five such products (scores recomputed, dV, dP, dQ, dK), 2.5 times the forward.
// Every variant of a pass is credited with the same count, whatever it computes (the naive one
// multiplies the masked half too), so GFLOP/s compares times.
//
// Clocks: one thread, thread CPU time (the machine is shared); more threads, wall-clock time.
// The sgemm and forward yardsticks after each timed loop use the same clock.
#include "kernel_bench.hpp"

#include <tilegrad/kernels/flash_attention.hpp>

#if TILEGRAD_HAVE_CBLAS
#include <cblas.h>
extern "C" void openblas_set_num_threads(int);
extern "C" char* openblas_get_config(void);
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

namespace tg = tilegrad;
namespace tk = tilegrad::kernels;

#if TILEGRAD_HAVE_CBLAS

namespace {

constexpr int D = 64;
constexpr int BQ = tk::attention_block_q<D>, BK = tk::attention_block_k<D>;
constexpr auto fwd_kernel = tk::flash_attention_fwd<D, BQ, BK, true>;
float const scale = 1.0f / std::sqrt(float(D));

/// The library's forward kernel as it was before its key walk became a tg::loop: the same
/// statements in a plain for loop, whose reverse-mode tape records every key tile. The baseline
/// of `fwd/kernel_*` (tg::loop on the fast path is this loop) and of `*vjp_for_loop` (the tape
/// and time tg::loop saves in reverse mode).
template <int D_, int BQ_, int BK_, bool Causal>
constexpr auto for_loop_fwd = []<class T>(tg::program const& p, tg::tensor<T const> q,
                                          tg::tensor<T const> k, tg::tensor<T const> v,
                                          tg::tensor<T> o, tg::tensor<tg::fp32<T>> lse, double sc) {
  using F = tg::fp32<T>;
  namespace td = tk::detail;
  int const q0 = p.program_id(0) * BQ_, h = p.program_id(1), b = p.program_id(2);
  auto const kh = k[b][h], vh = v[b][h];
  int const n_k = static_cast<int>(kh.size(0));
  tg::tile<F, D_, BQ_> const qt =
      trans(to<F>(load(tg::make_block_ptr<BQ_, D_>(q[b][h], {q0, 0}), tg::bounds<0>))) * sc;
  auto m = tg::full<F, BQ_>(F(td::neg_inf));
  auto l = tg::zeros<F, BQ_>();
  auto acc = tg::zeros<F, BQ_, D_>();
  for (int k0 = 0; k0 < td::key_end<BQ_, Causal>(q0, n_k); k0 += BK_) {
    tg::tile<F, BK_, D_> const kj =
        to<F>(load(tg::make_block_ptr<BK_, D_>(kh, {k0, 0}), tg::bounds<0>));
    tg::tile<F, BK_, D_> const vj =
        to<F>(load(tg::make_block_ptr<BK_, D_>(vh, {k0, 0}), tg::bounds<0>));
    tg::tile<F, BK_, BQ_> st = dot(kj, qt);
    if (td::block_needs_mask<BQ_, BK_, Causal>(q0, k0, n_k))
      st = where(td::block_mask<BQ_, BK_, Causal, true>(q0, k0, n_k), st, td::neg_inf);
    tg::tile<F, BQ_> const m_new = maximum(m, tg::max<0>(st));
    tg::tile<F, BK_, BQ_> const pt = exp(st - tg::row(m_new));
    tg::tile<F, BQ_> const alpha = exp(m - m_new);
    l = l * alpha + tg::sum<0>(pt);
    acc *= tg::col(alpha);
    acc = dot(trans(pt), vj, std::move(acc));
    m = m_new;
  }
  store(tg::make_block_ptr<BQ_, D_>(o[b][h], {q0, 0}), acc / tg::col(l), tg::bounds<0>);
  store(tg::make_block_ptr<BQ_>(lse[b][h], {q0}), m + log(l), tg::bounds<0>);
};
constexpr auto for_loop_kernel = for_loop_fwd<D, BQ, BK, true>;

// ----- flops and clocks --------------------------------------------------------------------------

double forward_flops(std::int64_t heads, std::int64_t n) {
  return heads * 4.0 * n * n * D / 2;
}
double backward_flops(std::int64_t heads, std::int64_t n) {
  return 2.5 * forward_flops(heads, n);
}

/// Seconds on the clock Google Benchmark uses for the rates of a benchmark on `threads` threads.
double clock_seconds(int threads) {
  if (threads == 1) {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// The forward alone, best of three on `clock` (clock_seconds' argument: 1 for this thread's CPU
/// time, more for wall time, as the vjp was timed), after the vjp: counters fwd_seconds and
/// vjp_vs_fwd, the vjp's time per iteration over it.
template <class Forward>
void set_vjp_vs_fwd(benchmark::State& state, int clock, Forward&& forward) {
  double fwd = 1e300;
  for (int rep = 0; rep < 3; ++rep) {
    double const t0 = clock_seconds(clock);
    forward();
    fwd = std::min(fwd, clock_seconds(clock) - t0);
  }
  state.counters["fwd_seconds"] = fwd;
  state.counters["vjp_vs_fwd"] = benchmark::Counter(
      double(state.iterations()) * fwd, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

/// Seconds per call of f: one call to warm up, then calls until `budget` seconds have passed
/// (at least two).
template <class F>
double seconds_per_call(int threads, double budget, F&& f) {
  f();
  int calls = 0;
  double const t0 = clock_seconds(threads);
  double t = t0;
  while (calls < 2 || t - t0 < budget) {
    f();
    ++calls;
    t = clock_seconds(threads);
  }
  return (t - t0) / calls;
}

void set_threads_counters(benchmark::State& state, int threads, std::int64_t n) {
  state.counters["threads"] = threads;
  state.counters["N"] = double(n);
}

benchmark::Counter rate(double flops_per_call, benchmark::State const& state) {
  return benchmark::Counter(flops_per_call * double(state.iterations()),
                            benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}

// ----- sgemm yardstick ---------------------------------------------------------------------------

/// C = A B, 1024 x 1024 x 1024: what OpenBLAS reaches on these threads, in flop/s.
class sgemm_yardstick {
public:
  static constexpr int n = 1024;
  static sgemm_yardstick& get() {
    static sgemm_yardstick s;
    return s;
  }
  double flops_per_second(int threads, double budget = 0.1) {
    openblas_set_num_threads(threads);
    double const t = seconds_per_call(threads, budget, [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a_.data(), n, b_.data(),
                  n, 0.0f, c_.data(), n);
      benchmark::ClobberMemory();
    });
    return 2.0 * n * n * n / t;
  }

private:
  sgemm_yardstick() : a_(n * n), b_(n * n), c_(n * n) {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> d(-1, 1);
    for (float& x : a_)
      x = d(rng);
    for (float& x : b_)
      x = d(rng);
  }
  std::vector<float> a_, b_, c_;
};

/// vs_sgemm: the benchmark's GFLOP/s over sgemm's, sgemm timed right after the loop.
void add_vs_sgemm(benchmark::State& state, int threads, double flops_per_call) {
  double const sgemm = sgemm_yardstick::get().flops_per_second(threads);
  state.counters["sgemm_GFLOP/s"] = sgemm / 1e9;
  state.counters["vs_sgemm"] = benchmark::Counter(
      flops_per_call * double(state.iterations()) / sgemm, benchmark::Counter::kIsRate);
}

// ----- problem -----------------------------------------------------------------------------------

void fill_normal(tg::owned_tensor<float>& t, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0, 1);
  for (float& x : t)
    x = d(rng);
}

/// q, k, v, d_o random (standard normal, like torch.randn); outputs and gradients.
struct problem {
  std::int64_t b, h, n;
  tg::owned_tensor<float> q, k, v, o, lse, d_o, dq, dk, dv;
  problem(std::int64_t b_, std::int64_t h_, std::int64_t n_)
      : b(b_), h(h_), n(n_), q({b, h, n, D}, "q"), k({b, h, n, D}, "k"), v({b, h, n, D}, "v"),
        o({b, h, n, D}, "o"), lse({b, h, n}, "lse"), d_o({b, h, n, D}, "d_o"),
        dq({b, h, n, D}, "dq"), dk({b, h, n, D}, "dk"), dv({b, h, n, D}, "dv") {
    fill_normal(q, 1);
    fill_normal(k, 2);
    fill_normal(v, 3);
    fill_normal(d_o, 4);
  }
  std::int64_t heads() const { return b * h; }
};

tk::attention_options options(int threads) {
  return {.causal = true, .launch = tg::launch_options{tg::executor::tbb, threads}};
}

void tilegrad_forward(problem& p, int threads) {
  tk::flash_attention_forward<float>(p.q.cview(), p.k.cview(), p.v.cview(), p.o.view(),
                                     p.lse.view(), options(threads));
}

void tilegrad_backward(problem& p, int threads, tk::attention_backward variant) {
  tk::flash_attention_backward<float>(p.q.cview(), p.k.cview(), p.v.cview(), p.o.cview(),
                                      p.d_o.cview(), p.lse.cview(), p.dq.view(), p.dk.view(),
                                      p.dv.view(), options(threads), variant);
}

// ----- naive attention: N x N scores and probabilities, sgemm for the products ----------------

/// Rows [0, rows) split over `threads` TBB threads.
template <class F>
void over_rows(int threads, std::int64_t rows, F&& f) {
  tbb::task_arena arena(threads);
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, rows, 16),
                      [&](tbb::blocked_range<std::int64_t> const& r) {
                        for (std::int64_t i = r.begin(); i < r.end(); ++i)
                          f(i);
                      });
  });
}

/// The probabilities P of every head (heads x N x N), kept by the forward for the backward (as
/// an autograd framework keeps them), and the N x N scratch of dP / dS.
struct naive_buffers {
  std::vector<float> p, ds;
  naive_buffers(problem const& pr)
      : p(std::size_t(pr.heads() * pr.n * pr.n)), ds(std::size_t(pr.n * pr.n)) {}
};

void naive_forward(problem& pr, naive_buffers& nb, int threads) {
  int const n = int(pr.n);
  for (std::int64_t hd = 0; hd < pr.heads(); ++hd) {
    float const* q = pr.q.data() + hd * n * D;
    float const* k = pr.k.data() + hd * n * D;
    float const* v = pr.v.data() + hd * n * D;
    float* o = pr.o.data() + hd * n * D;
    float* lse = pr.lse.data() + hd * n;
    float* p = nb.p.data() + hd * n * n;
    // S = scale Q K^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, D, scale, q, D, k, D, 0.0f, p, n);
    // causal mask and row softmax, in place
    over_rows(threads, n, [&](std::int64_t i) {
      float* row = p + i * n;
      float m = row[0];
      for (std::int64_t j = 1; j <= i; ++j)
        m = std::max(m, row[j]);
      float s = 0;
      for (std::int64_t j = 0; j <= i; ++j) {
        row[j] = std::exp(row[j] - m);
        s += row[j];
      }
      float const inv = 1 / s;
      for (std::int64_t j = 0; j <= i; ++j)
        row[j] *= inv;
      for (std::int64_t j = i + 1; j < n; ++j)
        row[j] = 0;
      lse[i] = m + std::log(s);
    });
    // O = P V
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, D, n, 1.0f, p, n, v, D, 0.0f, o, D);
  }
}

/// The backward from the forward's P: dV = P^T dO, dP = dO V^T, dS = P o (dP - rowsum(dP o P)),
/// dQ = scale dS K, dK = scale dS^T Q.
void naive_backward(problem& pr, naive_buffers& nb, int threads) {
  int const n = int(pr.n);
  for (std::int64_t hd = 0; hd < pr.heads(); ++hd) {
    float const* q = pr.q.data() + hd * n * D;
    float const* k = pr.k.data() + hd * n * D;
    float const* v = pr.v.data() + hd * n * D;
    float const* d_o = pr.d_o.data() + hd * n * D;
    float const* p = nb.p.data() + hd * n * n;
    float* dq = pr.dq.data() + hd * n * D;
    float* dk = pr.dk.data() + hd * n * D;
    float* dv = pr.dv.data() + hd * n * D;
    float* ds = nb.ds.data();
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, D, n, 1.0f, p, n, d_o, D, 0.0f, dv, D);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, D, 1.0f, d_o, D, v, D, 0.0f, ds, n);
    over_rows(threads, n, [&](std::int64_t i) {
      float const* pr_ = p + i * n;
      float* row = ds + i * n;
      float dot = 0;
      for (std::int64_t j = 0; j < n; ++j)
        dot += row[j] * pr_[j];
      for (std::int64_t j = 0; j < n; ++j)
        row[j] = pr_[j] * (row[j] - dot);
    });
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, D, n, scale, ds, n, k, D, 0.0f, dq,
                D);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, D, n, scale, ds, n, q, D, 0.0f, dk, D);
  }
}

// ----- checks before timing ----------------------------------------------------------------------

/// ||a - b|| / ||b|| over all elements.
double rel_error(float const* a, float const* b, std::int64_t n) {
  double num = 0, den = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    double const d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

constexpr double tolerance = 1e-4;

/// The naive outputs and gradients of one problem size, computed once per process.
struct reference {
  std::vector<float> o, lse, dq, dk, dv;
};

reference const& reference_for(std::int64_t b, std::int64_t h, std::int64_t n) {
  static std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t>, reference> cache;
  auto it = cache.find({b, h, n});
  if (it != cache.end())
    return it->second;
  problem pr(b, h, n);
  naive_buffers nb(pr);
  openblas_set_num_threads(1);
  naive_forward(pr, nb, 1);
  naive_backward(pr, nb, 1);
  reference r{{pr.o.begin(), pr.o.end()},
              {pr.lse.begin(), pr.lse.end()},
              {pr.dq.begin(), pr.dq.end()},
              {pr.dk.begin(), pr.dk.end()},
              {pr.dv.begin(), pr.dv.end()}};
  return cache.emplace(std::tuple{b, h, n}, std::move(r)).first->second;
}

/// The largest relative error of the computed outputs (`which`: "o" checks o and lse, "grad"
/// dq, dk, dv) against the naive ones; 0 where nothing is compared.
double check(problem const& pr, char const* which, float const* dq = nullptr,
             float const* dk = nullptr, float const* dv = nullptr) {
  reference const& r = reference_for(pr.b, pr.h, pr.n);
  std::int64_t const m = pr.o.numel();
  if (std::string(which) == "o")
    return std::max(rel_error(pr.o.data(), r.o.data(), m),
                    rel_error(pr.lse.data(), r.lse.data(), pr.lse.numel()));
  return std::max({rel_error(dq ? dq : pr.dq.data(), r.dq.data(), m),
                   rel_error(dk ? dk : pr.dk.data(), r.dk.data(), m),
                   rel_error(dv ? dv : pr.dv.data(), r.dv.data(), m)});
}

/// Reports an error instead of a time when err is above the tolerance; returns whether it was.
bool failed(benchmark::State& state, double err, char const* what) {
  state.counters["rel_err"] = err;
  if (err <= tolerance)
    return false;
  char msg[160];
  std::snprintf(msg, sizeof msg, "%s differs from the naive attention: relative error %.3g > %.0e",
                what, err, tolerance);
  state.SkipWithError(msg);
  return true;
}

// ----- benchmarks --------------------------------------------------------------------------------

constexpr std::int64_t batch = 1, heads = 4;

enum class pass { fwd, bwd, fwd_bwd };

double flops_of(pass ps, std::int64_t heads_, std::int64_t n) {
  return (ps == pass::bwd ? 0.0 : forward_flops(heads_, n)) +
         (ps == pass::fwd ? 0.0 : backward_flops(heads_, n));
}

/// Times a pass (forward, backward or both) made of `forward` and `backward`, after checking
/// its results against the naive attention; the backward's inputs come from a forward first.
template <class Forward, class Backward>
void time_pass(benchmark::State& state, problem& pr, pass ps, std::int64_t n, int threads,
               char const* what, Forward&& forward, Backward&& backward) {
  forward();
  auto run = [&] {
    if (ps != pass::bwd)
      forward();
    if (ps != pass::fwd)
      backward();
    benchmark::ClobberMemory();
  };
  run();
  double const err = std::max(check(pr, "o"), ps == pass::fwd ? 0.0 : check(pr, "grad"));
  if (failed(state, err, what))
    return;
  for (auto _ : state)
    run();
  double const flops = flops_of(ps, pr.heads(), n);
  state.counters["GFLOP/s"] = rate(flops, state);
  add_vs_sgemm(state, threads, flops);
  set_threads_counters(state, threads, n);
}

/// tilegrad's forward, backward (atomic dQ or two-pass) or both.
void bm_tilegrad(benchmark::State& state, pass ps, tk::attention_backward bwd, std::int64_t n,
                 int threads) {
  openblas_set_num_threads(threads);
  problem pr(batch, heads, n);
  time_pass(
      state, pr, ps, n, threads, "tilegrad", [&] { tilegrad_forward(pr, threads); },
      [&] { tilegrad_backward(pr, threads, bwd); });
}

/// The naive attention (its row loops on the same threads as its sgemms); the backward's P
/// comes from the forward.
void bm_naive(benchmark::State& state, pass ps, std::int64_t n, int threads) {
  openblas_set_num_threads(threads);
  problem pr(batch, heads, n);
  naive_buffers nb(pr);
  time_pass(
      state, pr, ps, n, threads, "naive (threaded)", [&] { naive_forward(pr, nb, threads); },
      [&] { naive_backward(pr, nb, threads); });
}

/// tilegrad's forward on bf16 copies of q, k, v (o bf16, lse float), checked against the naive
/// attention of the float inputs with the looser tolerance bf16 storage needs; vs_fp32: its
/// GFLOP/s over the float forward's, timed right after on the same clock.
void bm_tilegrad_bf16(benchmark::State& state, std::int64_t n, int threads) {
  openblas_set_num_threads(threads);
  problem pr(batch, heads, n);
  auto bf16_copy = [](tg::owned_tensor<float> const& t) {
    tg::owned_tensor<tg::bf16> r({t.size(0), t.size(1), t.size(2), t.size(3)}, t.name());
    tg::copy(t.cview(), r.view());
    return r;
  };
  auto const q = bf16_copy(pr.q), k = bf16_copy(pr.k), v = bf16_copy(pr.v);
  tg::owned_tensor<tg::bf16> o({pr.b, pr.h, n, D}, "o");
  auto const forward = [&] {
    tk::flash_attention_forward<tg::bf16>(q.cview(), k.cview(), v.cview(), o.view(), pr.lse.view(),
                                          options(threads));
    benchmark::ClobberMemory();
  };
  forward();
  tg::copy(o.cview(), pr.o.view());
  constexpr double bf16_tolerance = 2e-2; // inputs and output rounded to 8 significant bits
  double const err = check(pr, "o");
  state.counters["rel_err"] = err;
  if (err > bf16_tolerance) {
    state.SkipWithError("bf16 forward differs from the naive attention");
    return;
  }
  double const t0 = clock_seconds(threads);
  for (auto _ : state)
    forward();
  double const seconds = clock_seconds(threads) - t0;
  double const flops = forward_flops(pr.heads(), n);
  state.counters["GFLOP/s"] = rate(flops, state);
  double const fp32 = seconds_per_call(threads, 0.2, [&] { tilegrad_forward(pr, threads); });
  state.counters["vs_fp32"] = fp32 * double(state.iterations()) / seconds;
  add_vs_sgemm(state, threads, flops);
  set_threads_counters(state, threads, n);
}

/// vjp of the forward kernel (all of q, k, v), credited with forward + backward flops;
/// vjp_vs_fwd: its time over the tilegrad forward's, timed right after on the same clock.
/// `budget`: tg::loop's tape budget while it runs (0: every key walk checkpointed; the largest
/// value: every one recorded whole; see tg::set_loop_record_budget), or -1 for the default.
template <class Kernel>
void bm_vjp(benchmark::State& state, Kernel const& kernel, std::int64_t n, int threads,
            double budget = -1) {
  struct budget_scope {
    std::size_t saved = tg::set_loop_record_budget(0);
    explicit budget_scope(double b) {
      tg::set_loop_record_budget(b < 0 ? saved : static_cast<std::size_t>(b));
    }
    ~budget_scope() { tg::set_loop_record_budget(saved); }
  } const scope(budget);
  openblas_set_num_threads(threads);
  problem pr(batch, heads, n);
  auto const g = tg::grid(tg::cdiv<int>(int(n), BQ), int(pr.h), int(pr.b));
  tg::launch_options const opts{tg::executor::tbb, threads};
  std::size_t tape = 0;
  auto run = [&] {
    auto const grads = tg::vjp(opts, g, kernel, tg::in("q", pr.q), tg::in("k", pr.k),
                               tg::in("v", pr.v), tg::out("o", pr.o, pr.d_o), pr.lse.view(), scale);
    tape = grads.peak_tape_bytes();
    benchmark::ClobberMemory();
    return grads;
  };
  {
    auto const grads = run();
    double const err = std::max(
        check(pr, "o"), check(pr, "grad", grads["q"].data(), grads["k"].data(), grads["v"].data()));
    if (failed(state, err, "vjp"))
      return;
  }
  for (auto _ : state)
    run();
  double const flops = forward_flops(pr.heads(), n) + backward_flops(pr.heads(), n);
  state.counters["GFLOP/s"] = rate(flops, state);
  double const fwd = seconds_per_call(threads, 0.2, [&] { tilegrad_forward(pr, threads); });
  state.counters["vjp_vs_fwd"] = benchmark::Counter(
      double(state.iterations()) * fwd, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["tape_bytes"] = double(tape);
  add_vs_sgemm(state, threads, flops);
  set_threads_counters(state, threads, n);
}

/// The forward kernel launched directly (no host entry): the library's, whose key walk is a
/// tg::loop, and the same kernel with a plain for loop, to show that tg::loop on the fast path
/// is that loop.
template <class Kernel>
void bm_forward_kernel(benchmark::State& state, Kernel const& kernel, std::int64_t n, int threads) {
  openblas_set_num_threads(threads);
  problem pr(batch, heads, n);
  auto const g = tg::grid(tg::cdiv<int>(int(n), BQ), int(pr.h), int(pr.b));
  tg::launch_options const opts{tg::executor::tbb, threads};
  auto const run = [&] {
    tg::launch(opts, g, kernel, pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.view(),
               pr.lse.view(), double(scale));
    benchmark::ClobberMemory();
  };
  run();
  if (failed(state, check(pr, "o"), "forward kernel"))
    return;
  for (auto _ : state)
    run();
  double const flops = forward_flops(pr.heads(), n);
  state.counters["GFLOP/s"] = rate(flops, state);
  set_threads_counters(state, threads, n);
}

/// OpenBLAS sgemm alone, M x N x K: the square yardstick and the attention's per-head shapes.
void bm_sgemm(benchmark::State& state, int m, int n, int k, int threads) {
  openblas_set_num_threads(threads);
  std::vector<float> a(std::size_t(m) * k, 0.5f), b(std::size_t(k) * n, 0.25f),
      c(std::size_t(m) * n);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a.data(), k, b.data(), n,
                0.0f, c.data(), n);
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] = rate(2.0 * m * n * k, state);
  state.counters["threads"] = threads;
}

// ----- peak memory of vjp ------------------------------------------------------------------------

/// A field of /proc/self/status in bytes (VmRSS, VmHWM), -1 if not found.
double status_bytes(std::string const& field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(field + ":", 0) == 0)
      return 1024.0 * std::stod(line.substr(field.size() + 1));
  return -1;
}

/// Resets the process's peak RSS (VmHWM) to its current RSS (Linux 4.0 and later).
bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return bool(f);
}

/// vjp on one head of n rows, once: the growth of the peak RSS over the RSS before (inputs,
/// outputs and cotangent already allocated), less the three gradients vjp returns.
/// Meaningful in a process of its own (freed memory held by the allocator is not counted).
template <class Kernel>
void bm_vjp_memory(benchmark::State& state, Kernel const& kernel, std::int64_t n, int threads) {
  problem pr(1, 1, n);
  auto const g = tg::grid(tg::cdiv<int>(int(n), BQ), 1, 1);
  tg::launch_options const opts{tg::executor::tbb, threads};
  double const rss0 = status_bytes("VmRSS");
  bool const reset = reset_peak_rss();
  double const hwm0 = status_bytes("VmHWM");
  std::size_t tape = 0;
  double grad_bytes = 0;
  for (auto _ : state) {
    auto const grads = tg::vjp(opts, g, kernel, tg::in("q", pr.q), tg::in("k", pr.k),
                               tg::in("v", pr.v), tg::out("o", pr.o, pr.d_o), pr.lse.view(), scale);
    tape = grads.peak_tape_bytes();
    grad_bytes = 3.0 * double(pr.q.numel()) * sizeof(float);
    benchmark::ClobberMemory();
  }
  double const hwm = status_bytes("VmHWM");
  // What stays resident once vjp has returned and its gradients are freed.
  state.counters["rss_held_after_bytes"] = status_bytes("VmRSS") - rss0;
  state.counters["peak_rss_growth_bytes"] = hwm - rss0;
  state.counters["peak_beyond_io_bytes"] = hwm - rss0 - grad_bytes;
  state.counters["tape_bytes"] = double(tape);
  state.counters["hwm_reset"] = reset && hwm0 <= rss0 + (1 << 20) ? 1 : 0;
  double const fwd = seconds_per_call(threads, 0, [&] { tilegrad_forward(pr, threads); });
  state.counters["vjp_vs_fwd"] = benchmark::Counter(
      double(state.iterations()) * fwd, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  set_threads_counters(state, threads, n);
}

/// vjp of the forward kernel on B = 1, `h` heads of n rows over `threads` threads, one call per
/// iteration, wall-clock time: how vjp scales with the threads, and what it holds. Counters:
/// peak_contribution_bytes (gradient contributions held by programs until they are added, as
/// vjp reports it), tape_bytes (the largest tape of one program), and, meaningful in a process
/// of its own, peak_beyond_io_bytes (growth of the peak RSS over the RSS with inputs, outputs
/// and cotangent allocated, less the gradients). Not checked against the naive attention (its
/// N x N buffers do not fit at these sizes); fwd_bwd/vjp checks the same vjp at N <= 4096.
void bm_vjp_scaling(benchmark::State& state, std::int64_t h, std::int64_t n, int threads) {
  problem pr(1, h, n);
  auto const g = tg::grid(tg::cdiv<int>(int(n), BQ), int(h), 1);
  tg::launch_options const opts{tg::executor::tbb, threads};
  double const rss0 = status_bytes("VmRSS");
  bool const reset = reset_peak_rss();
  double const hwm0 = status_bytes("VmHWM");
  double tape = 0, contributions = -1;
  for (auto _ : state) {
    auto const grads = tg::vjp(opts, g, fwd_kernel, tg::in("q", pr.q), tg::in("k", pr.k),
                               tg::in("v", pr.v), tg::out("o", pr.o, pr.d_o), pr.lse.view(), scale);
    tape = double(grads.peak_tape_bytes());
    contributions = [](auto const& gr) { // (-1 for a vjp that does not report it)
      if constexpr (requires { gr.peak_contribution_bytes(); })
        return double(gr.peak_contribution_bytes());
      else
        return -1.0;
    }(grads);
    benchmark::ClobberMemory();
  }
  double const hwm = status_bytes("VmHWM");
  // The forward launch alone on the same problem and threads, after the vjp (the peak RSS above
  // is the vjp's), on the wall clock as the vjp.
  set_vjp_vs_fwd(state, 2, [&] {
    tg::launch(opts, g, fwd_kernel, pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.view(),
               pr.lse.view(), scale);
  });
  double const grad_bytes = 3.0 * double(pr.q.numel()) * sizeof(float);
  state.counters["peak_beyond_io_bytes"] = hwm - rss0 - grad_bytes;
  state.counters["hwm_reset"] = reset && hwm0 <= rss0 + (1 << 20) ? 1 : 0;
  state.counters["peak_contribution_bytes"] = contributions;
  state.counters["tape_bytes"] = tape;
  state.counters["H"] = double(h);
  set_threads_counters(state, threads, n);
}

/// The ceiling of vjp_scaling on this machine: the same work (`h` heads of n rows) split into
/// `threads` independent problems of h / threads heads, each a sequential vjp on a std::thread
/// of its own, so no program shares a gradient element with a program of another thread and
/// every program adds its contributions at once. Wall-clock time of all of them together;
/// vjp_vs_fwd against the forward run the same way (each thread a sequential launch of its
/// problem). The gap to vjp_scaling/tilegrad at the same threads is what the shared launch
/// (contributions held and added in program order, its scheduling) costs.
void bm_vjp_independent(benchmark::State& state, std::int64_t h, std::int64_t n, int threads) {
  std::int64_t const each = std::max<std::int64_t>(1, h / threads);
  std::vector<std::unique_ptr<problem>> prs;
  for (int t = 0; t < threads; ++t)
    prs.push_back(std::make_unique<problem>(1, each, n));
  auto const g = tg::grid(tg::cdiv<int>(int(n), BQ), int(each), 1);
  tg::launch_options const opts{tg::executor::sequential, 1};
  auto on_every_thread = [&](auto&& f) {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&f, &prs, t] { f(*prs[static_cast<std::size_t>(t)]); });
    for (auto& th : pool)
      th.join();
  };
  auto const vjp_one = [&](problem& pr) {
    auto const grads = tg::vjp(opts, g, fwd_kernel, tg::in("q", pr.q), tg::in("k", pr.k),
                               tg::in("v", pr.v), tg::out("o", pr.o, pr.d_o), pr.lse.view(), scale);
    benchmark::DoNotOptimize(grads.peak_tape_bytes());
  };
  on_every_thread(vjp_one); // warm: tapes and pools of each thread
  for (auto _ : state) {
    on_every_thread(vjp_one);
    benchmark::ClobberMemory();
  }
  set_vjp_vs_fwd(state, 2, [&] {
    on_every_thread([&](problem& pr) {
      tg::launch(opts, g, fwd_kernel, pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.view(),
                 pr.lse.view(), scale);
    });
  });
  state.counters["H"] = double(each * threads);
  set_threads_counters(state, threads, n);
}

/// vjp of the forward kernel, B = 1, H = 1, one thread (sequential executor), with tg::loop's
/// record budget set to `kib` KiB (0: every iteration replayed in the sweep; a large budget
/// records the loop whole): what the checkpointed scan costs against recording everything.
/// Counters: fwd_seconds, vjp_vs_fwd (against the forward alone, best of three) and tape_bytes.
void bm_vjp_budget(benchmark::State& state, std::int64_t n, std::size_t kib) {
  problem pr(1, 1, n);
  auto const g = tg::grid(tg::cdiv(n, BQ), 1, 1);
  tg::launch_options const opts{tg::executor::sequential, 1};
  std::size_t const saved = tg::set_loop_record_budget(kib << 10);
  double tape = 0;
  for (auto _ : state) {
    auto const grads = tg::vjp(opts, g, fwd_kernel, tg::in("q", pr.q), tg::in("k", pr.k),
                               tg::in("v", pr.v), tg::out("o", pr.o, pr.d_o), pr.lse.view(), scale);
    tape = double(grads.peak_tape_bytes());
    benchmark::ClobberMemory();
  }
  tg::set_loop_record_budget(saved);
  set_vjp_vs_fwd(state, 1, [&] {
    tg::launch(opts, g, fwd_kernel, pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.view(),
               pr.lse.view(), scale);
  });
  state.counters["tape_bytes"] = tape;
}

// ----- beside PyTorch's scaled_dot_product_attention ------------------------------------------

/// The library's attention on the problems bench/torch_sdpa.py runs PyTorch SDPA on: B = 1, `h`
/// heads of n rows, causal, d = 64, fp32 or bf16 storage (T), forward or forward + backward
/// (`variant`: the backward's, two-pass as the entry point's default or atomic dQ),
/// wall-clock time on every thread count as the script takes it. Named
/// sdpa/<library>/<dtype>/<pass>/H:h/N:n/threads:t, the script's names with `torch`. Not checked
/// here (the naive attention's N x N buffers do not fit the large cases): fwd/... and
/// fwd_bwd/tilegrad check the same entry points at H = 4, N <= 4096.
template <class T>
void bm_sdpa(benchmark::State& state, pass ps, tk::attention_backward variant, std::int64_t h,
             std::int64_t n, int threads) {
  problem pr(1, h, n);
  auto as = [](tg::owned_tensor<float> const& t) {
    if constexpr (std::is_same_v<T, float>) {
      return t;
    } else {
      tg::owned_tensor<T> r({t.size(0), t.size(1), t.size(2), t.size(3)}, t.name());
      tg::copy(t.cview(), r.view());
      return r;
    }
  };
  auto const q = as(pr.q), k = as(pr.k), v = as(pr.v), d_o = as(pr.d_o);
  auto o = as(pr.o), dq = as(pr.dq), dk = as(pr.dk), dv = as(pr.dv);
  auto const opts = options(threads);
  auto const run = [&] {
    tk::flash_attention_forward<T>(q.cview(), k.cview(), v.cview(), o.view(), pr.lse.view(), opts);
    if (ps == pass::fwd_bwd)
      tk::flash_attention_backward<T>(q.cview(), k.cview(), v.cview(), o.cview(), d_o.cview(),
                                      pr.lse.cview(), dq.view(), dk.view(), dv.view(), opts,
                                      variant);
    benchmark::ClobberMemory();
  };
  run();
  for (auto _ : state)
    run();
  state.counters["GFLOP/s"] = rate(flops_of(ps, h, n), state);
  state.counters["H"] = double(h);
  set_threads_counters(state, threads, n);
}

// ----- registration ------------------------------------------------------------------------------

benchmark::internal::Benchmark* with_clock(benchmark::internal::Benchmark* b, int threads) {
  b->Unit(benchmark::kMillisecond);
  if (threads > 1)
    b->UseRealTime();
  return b;
}

std::string suffix(std::int64_t n, int threads) {
  return "/N:" + std::to_string(n) + "/threads:" + std::to_string(threads);
}

void register_all() {
  for (int t : {1, 2})
    with_clock(benchmark::RegisterBenchmark(("vjp_memory/tilegrad" + suffix(16384, t)).c_str(),
                                            bm_vjp_memory<decltype(fwd_kernel)>, fwd_kernel, 16384,
                                            t),
               t)
        ->Iterations(1)
        ->Repetitions(1)
        ->Unit(benchmark::kSecond);
  with_clock(benchmark::RegisterBenchmark(("vjp_memory/for_loop" + suffix(16384, 1)).c_str(),
                                          bm_vjp_memory<decltype(for_loop_kernel)>, for_loop_kernel,
                                          16384, 1),
             1)
      ->Iterations(1)
      ->Repetitions(1)
      ->Unit(benchmark::kSecond);
  // Thread counts up to 16, for larger machines; select with --benchmark_filter, one process per
  // run where the peak RSS matters.
  for (auto [h, n] : {std::pair<std::int64_t, std::int64_t>{1, 1024},
                      {1, 4096},
                      {1, 16384},
                      {4, 4096},
                      {16, 4096},
                      {16, 16384}})
    for (int t : {1, 2, 4, 8, 16})
      with_clock(benchmark::RegisterBenchmark(
                     ("vjp_scaling/tilegrad/H:" + std::to_string(h) + suffix(n, t)).c_str(),
                     bm_vjp_scaling, h, n, t),
                 2)
          ->Iterations(1)
          ->Unit(benchmark::kSecond);
  // The machine's ceiling for the rows above: the same heads as independent problems per thread.
  for (std::int64_t n : {4096, 16384})
    for (int t : {1, 2, 4, 8, 16})
      with_clock(benchmark::RegisterBenchmark(
                     ("vjp_scaling/independent/H:16" + suffix(n, t)).c_str(), bm_vjp_independent,
                     16, n, t),
                 2)
          ->Iterations(1)
          ->Unit(benchmark::kSecond);
  for (std::int64_t n : {1024, 4096, 16384})
    for (std::size_t kib : {std::size_t{0}, std::size_t{2048}, std::size_t{8192}, std::size_t{1} << 20})
      benchmark::RegisterBenchmark(("vjp_budget/tilegrad/N:" + std::to_string(n) +
                                    "/budget_kib:" + std::to_string(kib))
                                       .c_str(),
                                   bm_vjp_budget, n, kib)
          ->Unit(benchmark::kMillisecond);
  // Beside bench/torch_sdpa.py: one thread on H = 4 (N = 1024, 4096), 16 threads on H = 16
  // (N = 1024, 4096, 16384), and 2, 4, 8 threads on H = 16, N = 4096 for the scaling.
  {
    std::vector<std::tuple<int, std::int64_t, std::int64_t>> cases{{1, 4, 1024},    {1, 4, 4096},
                                                                   {16, 16, 1024},  {16, 16, 4096},
                                                                   {16, 16, 16384}, {1, 16, 4096},
                                                                   {2, 16, 4096},   {4, 16, 4096},
                                                                   {8, 16, 4096}};
    constexpr auto atomic = tk::attention_backward::atomic_dq;
    constexpr auto two_pass = tk::attention_backward::two_pass;
    for (auto [t, h, n] : cases) {
      std::string const s = "/H:" + std::to_string(h) + suffix(n, t);
      auto reg = [&](std::string const& name, auto f, auto... a) {
        benchmark::RegisterBenchmark((name + s).c_str(), f, a...)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
      };
      reg("sdpa/tilegrad/fp32/fwd", bm_sdpa<float>, pass::fwd, two_pass, h, n, t);
      reg("sdpa/tilegrad/bf16/fwd", bm_sdpa<tg::bf16>, pass::fwd, two_pass, h, n, t);
      reg("sdpa/tilegrad/fp32/fwd_bwd", bm_sdpa<float>, pass::fwd_bwd, two_pass, h, n, t);
      reg("sdpa/tilegrad/bf16/fwd_bwd", bm_sdpa<tg::bf16>, pass::fwd_bwd, two_pass, h, n, t);
      if (n == 4096 && (t == 1 || t == 16)) { // the other backward, for the choice of default
        reg("sdpa/tilegrad_atomic_dq/fp32/fwd_bwd", bm_sdpa<float>, pass::fwd_bwd, atomic, h, n, t);
        reg("sdpa/tilegrad_atomic_dq/bf16/fwd_bwd", bm_sdpa<tg::bf16>, pass::fwd_bwd, atomic, h, n,
            t);
      }
    }
  }
  for (int t : {1, 2}) {
    for (std::int64_t n : {1024, 4096}) {
      std::string const s = suffix(n, t);
      auto reg = [&](std::string const& name, auto f, auto... a) {
        with_clock(benchmark::RegisterBenchmark((name + s).c_str(), f, a...), t);
      };
      constexpr auto atomic = tk::attention_backward::atomic_dq;
      constexpr auto two_pass = tk::attention_backward::two_pass;
      reg("fwd/tilegrad", bm_tilegrad, pass::fwd, atomic, n, t);
      reg("fwd/naive", bm_naive, pass::fwd, n, t);
      reg("fwd/tilegrad_bf16", bm_tilegrad_bf16, n, t);
      reg("bwd/tilegrad_atomic_dq", bm_tilegrad, pass::bwd, atomic, n, t);
      reg("bwd/tilegrad_two_pass", bm_tilegrad, pass::bwd, two_pass, n, t);
      reg("bwd/naive", bm_naive, pass::bwd, n, t);
      reg("fwd_bwd/tilegrad", bm_tilegrad, pass::fwd_bwd, atomic, n, t);
      reg("fwd_bwd/naive", bm_naive, pass::fwd_bwd, n, t);
      reg("fwd_bwd/vjp", bm_vjp<decltype(fwd_kernel)>, fwd_kernel, n, t, -1.0);
      reg("fwd_bwd/vjp_checkpointed", bm_vjp<decltype(fwd_kernel)>, fwd_kernel, n, t, 0.0);
      reg("fwd_bwd/vjp_for_loop", bm_vjp<decltype(for_loop_kernel)>, for_loop_kernel, n, t, -1.0);
      reg("fwd/kernel_tg_loop", bm_forward_kernel<decltype(fwd_kernel)>, fwd_kernel, n, t);
      reg("fwd/kernel_for_loop", bm_forward_kernel<decltype(for_loop_kernel)>, for_loop_kernel, n,
          t);
      // sgemm at the per-head shapes: S = Q K^T (N x N x d) and O = P V (N x d x N)
      reg("sgemm/NxNx64", bm_sgemm, int(n), int(n), D, t);
      reg("sgemm/Nx64xN", bm_sgemm, int(n), D, int(n), t);
    }
    with_clock(
        benchmark::RegisterBenchmark(("sgemm/1024x1024x1024/threads:" + std::to_string(t)).c_str(),
                                     bm_sgemm, 1024, 1024, 1024, t),
        t);
  }
}

} // namespace

int main(int argc, char** argv) {
  // Experiments with vjp's memory settings (reverse_mode.md): tg::loop's record budget and the
  // bytes of contributions held per batch, in KiB and MiB.
  if (char const* kib = std::getenv("TILEGRAD_BENCH_LOOP_RECORD_KIB")) {
    tg::set_loop_record_budget(std::size_t(std::stoull(kib)) << 10);
    benchmark::AddCustomContext("loop_record_budget_kib", kib);
  }
  if (char const* mib = std::getenv("TILEGRAD_BENCH_CONTRIBUTION_MIB")) {
    tg::ad::contribution_budget() = std::size_t(std::stoull(mib)) << 20;
    benchmark::AddCustomContext("contribution_budget_mib", mib);
  }
  register_all();
  benchmark::AddCustomContext("openblas_config", openblas_get_config());
  benchmark::AddCustomContext("tilegrad_float_lanes",
                              std::to_string(tg::simd::native_width<float>));
  benchmark::AddCustomContext("attention", "causal, B=1, H=4, d=64, tiles " + std::to_string(BQ) +
                                               "x" + std::to_string(BK));
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv))
    return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}

#else

int main() {
  std::puts("bench_attention needs OpenBLAS's CBLAS (the naive attention and the sgemm yardstick)");
}

#endif
