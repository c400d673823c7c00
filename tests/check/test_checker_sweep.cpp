// The checker's verdicts over random shapes: the library's correct FlashAttention-2 backwards
// (both variants, causal and full, d = 32 and 128, batch and heads 1 to 3, Nk != N, N from 1 to
// past the tiles) and row softmax (1 column up) must pass every run, and report how close each
// came to its bound; a single element off by 1e-5 relative at N = 1024, and bugs that exist only
// at d = 128, only when Nk != N, and only for batch or head > 0, must fail where they sit.
//
// The short sweep runs here; the long one is the same test with TILEGRAD_SWEEP_RUNS set:
//   TILEGRAD_SWEEP_RUNS=2000 TILEGRAD_SWEEP_MAX_N=4096 build/default/tests/check_test_checker_sweep
#include <tilegrad/check/gtest.hpp>
#include <tilegrad/kernels/flash_attention.hpp>
#include <tilegrad/kernels/softmax.hpp>
#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace tg = tilegrad;
namespace tk = tilegrad::kernels;

namespace {

int env_int(char const* name, int fallback) {
  char const* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

struct attention_case {
  int d = 32;
  bool causal = false, two_pass = false;
  std::int64_t batch = 1, heads = 1, n = 1, nk = 1;
  unsigned seed = 0;
  std::string name() const {
    char b[160];
    std::snprintf(b, sizeof b, "d=%d %s %s B=%lld H=%lld N=%lld Nk=%lld seed=%u", d,
                  causal ? "causal" : "full", two_pass ? "two-pass" : "atomic-dq",
                  static_cast<long long>(batch), static_cast<long long>(heads),
                  static_cast<long long>(n), static_cast<long long>(nk), seed);
    return b;
  }
};

// What a broken backward does to the correct gradients (nothing: the library's backward).
using corruption = std::function<void(attention_case const&, tg::tensor<float> dq,
                                      tg::tensor<float> dk, tg::tensor<float> dv)>;

template <int D, bool Causal>
tg::check_report check_attention(attention_case const& c, corruption const& corrupt) {
  constexpr int BQ = tk::detail::block_q<D>, BK = tk::detail::block_k<D>;
  tg::owned_tensor<float> q({c.batch, c.heads, c.n, D}), k({c.batch, c.heads, c.nk, D}),
      v({c.batch, c.heads, c.nk, D}), o({c.batch, c.heads, c.n, D}),
      lse({c.batch, c.heads, c.n}, "lse");
  float const scale = 1.0f / std::sqrt(float(D));
  auto const g = tg::grid(tg::cdiv<int>(int(c.n), BQ), int(c.heads), int(c.batch));
  auto const variant =
      c.two_pass ? tk::attention_backward::two_pass : tk::attention_backward::atomic_dq;
  tg::tensor<float const> const saved = lse.cview();
  return tg::check_backward(
      tg::forward(g, tk::flash_attention_fwd<D, BQ, BK, Causal>, tg::in("q", q), tg::in("k", k),
                  tg::in("v", v), tg::out("o", o), lse.view(), scale),
      [&](tg::backward_context<float>& ctx) {
        auto const qi = ctx.input("q"), ki = ctx.input("k"), vi = ctx.input("v");
        tg::owned_tensor<float> dq(qi.shape().data(), 4), dk(ki.shape().data(), 4),
            dv(vi.shape().data(), 4);
        tk::flash_attention_backward<float>(qi, ki, vi, ctx.output("o"), ctx.cotangent("o"), saved,
                                            dq.view(), dk.view(), dv.view(),
                                            {.causal = Causal, .launch = ctx.options()}, variant);
        if (corrupt)
          corrupt(c, dq.view(), dk.view(), dv.view());
        ctx.set_gradient("q", dq);
        ctx.set_gradient("k", dk);
        ctx.set_gradient("v", dv);
      },
      {.seeds = 1, .first_seed = c.seed, .inputs = tg::uniform(-2, 2)});
}

tg::check_report check_attention(attention_case const& c, corruption const& corrupt = {}) {
  if (c.d == 32)
    return c.causal ? check_attention<32, true>(c, corrupt)
                    : check_attention<32, false>(c, corrupt);
  return c.causal ? check_attention<128, true>(c, corrupt)
                  : check_attention<128, false>(c, corrupt);
}

double worst_ratio(tg::check_report const& r) {
  double w = 0;
  for (auto const& s : r.seeds)
    for (auto const& g : s.gradients)
      w = std::max(w, g.worst_ratio);
  return w;
}

// N values that find bugs: 1, 2, around one and two tiles, and random ones up to max_n.
std::int64_t pick_n(std::mt19937& rng, int block, int max_n) {
  std::int64_t const edges[] = {1, 2, block - 1, block, block + 1, 2 * block + 7};
  if (std::uniform_int_distribution<int>(0, 1)(rng) == 0)
    return std::min<std::int64_t>(edges[std::uniform_int_distribution<int>(0, 5)(rng)], max_n);
  double const l = std::uniform_real_distribution<double>(0, std::log(double(max_n)))(rng);
  return std::max<std::int64_t>(1, std::llround(std::exp(l)));
}

} // namespace

TEST(CheckerSweep, LibraryAttentionBackwardsPassEveryRun) {
  int const runs = env_int("TILEGRAD_SWEEP_RUNS", 10);
  int const max_n = env_int("TILEGRAD_SWEEP_MAX_N", 160);
  std::mt19937 rng(2026);
  std::map<std::string, std::pair<double, int>> worst; // kernel -> (worst ratio, runs)
  int failures = 0;
  for (int i = 0; i < runs; ++i) {
    attention_case c;
    c.d = std::uniform_int_distribution<int>(0, 1)(rng) ? 128 : 32;
    c.causal = std::uniform_int_distribution<int>(0, 1)(rng);
    c.two_pass = std::uniform_int_distribution<int>(0, 1)(rng);
    c.batch = std::uniform_int_distribution<int>(1, 3)(rng);
    c.heads = std::uniform_int_distribution<int>(1, 3)(rng);
    int const block = c.d >= 128 ? 32 : 64;
    c.n = pick_n(rng, block, max_n);
    c.nk = std::uniform_int_distribution<int>(0, 2)(rng) == 0 ? pick_n(rng, 64, max_n) : c.n;
    c.seed = static_cast<unsigned>(i);
    auto const r = check_attention(c);
    std::string const kernel = std::string("flash attention d=") + std::to_string(c.d) +
                               (c.causal ? " causal " : " full ") +
                               (c.two_pass ? "two-pass" : "atomic-dq");
    auto& w = worst[kernel];
    w.first = std::max(w.first, worst_ratio(r));
    ++w.second;
    if (!r) {
      ++failures;
      ADD_FAILURE() << c.name() << "\n" << r;
    }
    if ((i + 1) % 100 == 0) {
      std::printf("%d runs, %d failures\n", i + 1, failures);
      std::fflush(stdout);
    }
  }
  for (auto const& [kernel, w] : worst)
    std::printf("%-40s runs %4d  worst err/bound %.3f\n", kernel.c_str(), w.second, w.first);
  EXPECT_EQ(failures, 0);
}

TEST(CheckerSweep, SoftmaxFromOneColumnPasses) {
  constexpr int Block = 64;
  double worst = 0;
  for (std::int64_t cols : {1, 2, 3, 7, 63, 64}) {
    for (std::int64_t rows : {1, 5}) {
      tg::owned_tensor<float> x({rows, cols}, "x"), y({rows, cols}, "y");
      auto const r = tg::check_backward(tg::forward(static_cast<int>(rows), tk::softmax_fwd<Block>,
                                                    tg::in("x", x), tg::out("y", y)),
                                        [](tg::backward_context<float>& ctx) {
                                          auto const yv = ctx.output("y"), dy = ctx.cotangent("y");
                                          tg::owned_tensor<float> dx(yv.shape().data(), 2);
                                          tg::launch(ctx.options(), static_cast<int>(yv.size(0)),
                                                     tk::softmax_bwd<Block>, yv, dy, dx.view());
                                          ctx.set_gradient("x", dx);
                                        },
                                        {.seeds = 3});
      EXPECT_BACKWARD_OK(r) << rows << " x " << cols;
      worst = std::max(worst, worst_ratio(r));
    }
  }
  std::printf("softmax worst err/bound %.3f\n", worst);
}

TEST(CheckerSweep, OneElementOffIsCaughtWhereFloat32CanHoldItAtN1024) {
  // Where float32 can hold an element to 1e-5 (|g| not far below |J|^T |w|, the size of the sums
  // that make it), one element off by 1e-5 relative fails the check, and only that element. An
  // element that is small by cancellation cannot be held that close by any fp32 kernel; the test
  // prints on what share of elements 1e-5 is within reach.
  attention_case const c{.d = 32, .causal = false, .two_pass = true, .n = 1024, .nk = 1024};
  std::map<char, std::vector<float>> got; // the correct kernel's gradients
  auto const keep = [&](attention_case const&, tg::tensor<float> dq, tg::tensor<float> dk,
                        tg::tensor<float> dv) {
    if (!got.empty()) // the first call has the cotangents (later ones scale them)
      return;
    got['q'].assign(dq.data(), dq.data() + dq.numel());
    got['k'].assign(dk.data(), dk.data() + dk.numel());
    got['v'].assign(dv.data(), dv.data() + dv.numel());
  };
  auto const clean = check_attention(c, keep);
  EXPECT_BACKWARD_OK(clean);
  for (char const* which : {"q", "k", "v"}) {
    auto const* g0 = clean.gradient(which);
    ASSERT_TRUE(g0 && g0->tol.magnitude);
    auto const& m = *g0->tol.magnitude;
    auto const& v = got[which[0]];
    // The most sensitive element: the smallest bound relative to the value.
    std::int64_t at = 0, reach = 0;
    double best = 0;
    for (std::size_t i = 0; i < m.size(); ++i) {
      double const b = g0->tol.bound(0, static_cast<std::int64_t>(i));
      reach += 1e-5 * std::abs(v[i]) > b;
      if (b > 0 && std::abs(v[i]) / b > best) {
        best = std::abs(v[i]) / b;
        at = static_cast<std::int64_t>(i);
      }
    }
    std::printf("d%s: 1e-5 relative is within the bound's reach on %.1f%% of elements; the most "
                "sensitive element holds to %.2g relative\n",
                which, 100.0 * double(reach) / double(m.size()), 1 / best);
    double const off = std::max(1e-5, 2 / best); // 1e-5 where float32 allows it
    auto const r = check_attention(c, [&](attention_case const&, tg::tensor<float> dq,
                                          tg::tensor<float> dk, tg::tensor<float> dv) {
      auto t = which[0] == 'q' ? dq : which[0] == 'k' ? dk : dv;
      t.data()[at] *= static_cast<float>(1 + off);
    });
    EXPECT_FALSE(r) << which;
    auto const* g = r.gradient(which);
    ASSERT_TRUE(g);
    EXPECT_EQ(g->mismatches, 1) << which;
    EXPECT_EQ(g->worst.front().at, (std::vector<std::int64_t>{0, 0, at / 32, at % 32})) << which;
  }
}

TEST(CheckerSweep, BugsOnlyAtD128OnlyWhenNkDiffersOnlyPastTheFirstHeadAreCaught) {
  // A dq row scaled wrongly when the head dim is 128 (a kernel specialised for it).
  auto const d128 = [](attention_case const& c, tg::tensor<float> dq, tg::tensor<float>,
                       tg::tensor<float>) {
    if (c.d == 128)
      for (int j = 0; j < 128; ++j)
        dq.data()[dq.row_major_offset(3 * 128 + j)] *= 1.001f;
  };
  EXPECT_TRUE(check_attention({.d = 32, .n = 40, .nk = 40}, d128));
  EXPECT_FALSE(check_attention({.d = 128, .n = 40, .nk = 40}, d128));
  // The last key's dv dropped when there are more keys than queries (a loop bound on N).
  auto const nk = [](attention_case const& c, tg::tensor<float>, tg::tensor<float>,
                     tg::tensor<float> dv) {
    if (c.nk > c.n)
      for (int j = 0; j < c.d; ++j)
        dv.data()[dv.row_major_offset((c.nk - 1) * c.d + j)] = 0;
  };
  EXPECT_TRUE(check_attention({.d = 32, .n = 70, .nk = 70}, nk));
  auto const r = check_attention({.d = 32, .n = 70, .nk = 90}, nk);
  EXPECT_FALSE(r);
  EXPECT_FALSE(r.gradient("v")->ok);
  EXPECT_TRUE(r.gradient("q")->ok);
  // dk of every head but the first scaled by 1 + 1e-4 (an offset computed from head 0 only).
  auto const heads = [](attention_case const& c, tg::tensor<float>, tg::tensor<float> dk,
                        tg::tensor<float>) {
    std::int64_t const per_head = c.nk * c.d;
    for (std::int64_t i = per_head; i < dk.numel(); ++i)
      dk.data()[dk.row_major_offset(i)] *= 1 + 1e-4f;
  };
  EXPECT_TRUE(check_attention({.d = 32, .batch = 1, .heads = 1, .n = 50, .nk = 50}, heads));
  auto const rh = check_attention({.d = 32, .batch = 2, .heads = 2, .n = 50, .nk = 50}, heads);
  EXPECT_FALSE(rh);
  EXPECT_FALSE(rh.gradient("k")->ok);
  EXPECT_TRUE(rh.gradient("q")->ok);
}
