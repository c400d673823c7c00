// check_backward on FlashAttention-2: both hand-written backwards (atomic dQ, and the two-pass
// one without atomics) pass against the reference gradients of the forward kernel, causal and
// not, on row counts that do not fill the tiles; broken variants fail where the bug sits.
#include <tilegrad/check/gtest.hpp>
#include <tilegrad/kernels/flash_attention.hpp>
#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest.h>

#include "../support/mismatch_region.hpp"

#include <cmath>
#include <cstdint>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_flash_attention_backward {

namespace tg = tilegrad;
namespace tk = tilegrad::kernels;

namespace {

constexpr int D = 16, BQ = 64, BK = 64;

enum class bug {
  none,
  key_edge_off_by_one,
  diagonal_excluded,
  dq_unscaled,
  tail_query_tile_skipped
};

// The key-tile backward of tk::flash_attention_bwd written out again, with one bug switched on.
template <bool Causal, bug B>
constexpr auto broken_bwd = []<class T>(tg::program const& p, tg::tensor<T const> q,
                                        tg::tensor<T const> k, tg::tensor<T const> v,
                                        tg::tensor<T const> d_o, tg::tensor<T const> lse,
                                        tg::tensor<T const> delta, tg::tensor<T> dq,
                                        tg::tensor<T> dk, tg::tensor<T> dv, double scale) {
  int const k0 = p.program_id(0) * BK, h = p.program_id(1), b = p.program_id(2);
  int const n_q = static_cast<int>(q.size(2)), n_k = static_cast<int>(k.size(2));
  auto const kj = tg::load(tg::make_block_ptr<BK, D>(k[b][h], {k0, 0}), tg::bounds<0>);
  auto const vj = tg::load(tg::make_block_ptr<BK, D>(v[b][h], {k0, 0}), tg::bounds<0>);
  auto dk_acc = tg::zeros<T, BK, D>();
  auto dv_acc = tg::zeros<T, BK, D>();
  int const q_end = B == bug::tail_query_tile_skipped ? n_q / BQ * BQ : n_q;
  for (int q0 = Causal ? k0 / BQ * BQ : 0; q0 < q_end; q0 += BQ) {
    auto const qi = tg::load(tg::make_block_ptr<BQ, D>(q[b][h], {q0, 0}), tg::bounds<0>);
    auto const doi = tg::load(tg::make_block_ptr<BQ, D>(d_o[b][h], {q0, 0}), tg::bounds<0>);
    auto const li = tg::load(tg::make_block_ptr<BQ>(lse[b][h], {q0}), tg::bounds<0>);
    auto const di = tg::load(tg::make_block_ptr<BQ>(delta[b][h], {q0}), tg::bounds<0>);
    auto const offs_q = q0 + tg::arange<0, BQ>();
    auto const offs_k = k0 + tg::arange<0, BK>();
    auto const keys = tg::row(offs_k) < (B == bug::key_edge_off_by_one ? n_k - 1 : n_k);
    int const diag = B == bug::diagonal_excluded ? 1 : 0;
    auto const causal = tg::col(offs_q) >= tg::row(offs_k) + diag;
    tg::tile<T, BQ, BK> pt = tg::exp(tg::dot(qi, tg::trans(kj)) * scale - tg::col(li));
    if constexpr (Causal)
      pt = tg::where(keys & causal, pt, 0.0f);
    else
      pt = tg::where(keys, pt, 0.0f);
    tg::tile<T, BQ, BK> const ds = pt * (tg::dot(doi, tg::trans(vj)) - tg::col(di)) * scale;
    dv_acc = tg::dot(tg::trans(pt), doi, std::move(dv_acc));
    dk_acc = tg::dot(tg::trans(ds), qi, std::move(dk_acc));
    auto const dqh = dq[b][h];
    double const f = B == bug::dq_unscaled ? 1 / scale : 1;
    tg::atomic_add(dqh + (tg::col(offs_q) * dqh.stride(0) + tg::row(tg::arange<0, D>())),
                   tg::dot(ds, kj) * f, tg::col(offs_q) < n_q);
  }
  tg::store(tg::make_block_ptr<BK, D>(dk[b][h], {k0, 0}), dk_acc, tg::bounds<0>);
  tg::store(tg::make_block_ptr<BK, D>(dv[b][h], {k0, 0}), dv_acc, tg::bounds<0>);
};

double scale() {
  return 1 / std::sqrt(double(D));
}

template <bool Causal, bug B, tk::attention_backward V = tk::attention_backward::atomic_dq>
auto backward(tg::tensor<float const> lse) {
  return [lse](tg::backward_context<float>& ctx) {
    auto const q = ctx.input("q"), k = ctx.input("k"), v = ctx.input("v");
    auto const o = ctx.output("o"), d_o = ctx.cotangent("o");
    tg::owned_tensor<float> dq(q.shape().data(), 4), dk(k.shape().data(), 4),
        dv(v.shape().data(), 4);
    if constexpr (B == bug::none) {
      tk::flash_attention_backward<float>(q, k, v, o, d_o, lse, dq.view(), dk.view(), dv.view(),
                                          {.causal = Causal, .launch = ctx.options()}, V);
    } else {
      tg::owned_tensor<float> delta({q.size(0), q.size(1), q.size(2)});
      tg::launch(ctx.options(),
                 tg::grid(tg::cdiv<int>(int(q.size(2)), BQ), int(q.size(1)), int(q.size(0))),
                 tk::flash_attention_bwd_delta<D, BQ>, o, d_o, delta.view());
      tg::launch(ctx.options(),
                 tg::grid(tg::cdiv<int>(int(k.size(2)), BK), int(k.size(1)), int(k.size(0))),
                 broken_bwd<Causal, B>, q, k, v, d_o, lse, delta.cview(), dq.view(), dk.view(),
                 dv.view(), scale());
    }
    ctx.set_gradient("q", dq);
    ctx.set_gradient("k", dk);
    ctx.set_gradient("v", dv);
  };
}

template <bool Causal, bug B, tk::attention_backward V = tk::attention_backward::atomic_dq>
tg::check_report check(std::int64_t batch, std::int64_t heads, std::int64_t n, int seeds = 2,
                       std::int64_t nk = 0) {
  nk = nk ? nk : n;
  tg::owned_tensor<float> q({batch, heads, n, D}), k({batch, heads, nk, D}),
      v({batch, heads, nk, D}), o({batch, heads, n, D}), lse({batch, heads, n}, "lse");
  auto const g = tg::grid(tg::cdiv<int>(int(n), BQ), int(heads), int(batch));
  return tg::check_backward(
      tg::forward(g, tk::flash_attention_fwd<D, BQ, BK, Causal>, tg::in("q", q), tg::in("k", k),
                  tg::in("v", v), tg::out("o", o), lse.view(), scale()),
      backward<Causal, B, V>(lse.cview()), {.seeds = seeds, .inputs = tg::uniform(-2, 2)});
}

} // namespace

TEST(CheckFlashAttention, AtomicDqBackwardPasses) {
  EXPECT_BACKWARD_OK((check<false, bug::none>(2, 2, 100, 3)));
  EXPECT_BACKWARD_OK((check<true, bug::none>(2, 2, 100, 3)));
  EXPECT_BACKWARD_OK((check<true, bug::none>(1, 1, 2)));
  EXPECT_BACKWARD_OK((check<true, bug::none>(1, 1, 128)));
}

TEST(CheckFlashAttention, TwoPassBackwardPasses) {
  constexpr auto two = tk::attention_backward::two_pass;
  EXPECT_BACKWARD_OK((check<false, bug::none, two>(2, 2, 100, 3)));
  EXPECT_BACKWARD_OK((check<true, bug::none, two>(2, 2, 100, 3)));
  EXPECT_BACKWARD_OK((check<true, bug::none, two>(1, 3, 65)));
}

TEST(CheckFlashAttention, BothBackwardsPassAtTheEdgePairs) {
  // N and Nk at the edges of the 64-row tiles (1, 2, 63, 64, 65, 161), equal and crossed.
  constexpr auto two = tk::attention_backward::two_pass;
  for (auto [n, nk] : tg::edge_pairs(BQ, BK)) {
    EXPECT_BACKWARD_OK((check<false, bug::none>(1, 2, n, 1, nk))) << n << " " << nk;
    EXPECT_BACKWARD_OK((check<true, bug::none>(2, 1, n, 1, nk))) << n << " " << nk;
    EXPECT_BACKWARD_OK((check<false, bug::none, two>(2, 1, n, 1, nk))) << n << " " << nk;
    EXPECT_BACKWARD_OK((check<true, bug::none, two>(1, 2, n, 1, nk))) << n << " " << nk;
  }
}

TEST(CheckFlashAttention, KeyEdgeOffByOneShowsInTheLastRowOnly) {
  auto const r = check<true, bug::key_edge_off_by_one>(1, 1, 100);
  ASSERT_FALSE(r);
  // The last key is dropped: its dk and dv rows, and (causal) the one query that sees it.
  for (char const* name : {"q", "k", "v"})
    EXPECT_TRUE(test_support::mismatches_in(r.gradient(name), 99, 99, 0, D - 1)) << name;
}

TEST(CheckFlashAttention, DiagonalExcludedFailsEveryGradient) {
  auto const r = check<true, bug::diagonal_excluded>(1, 2, 100);
  ASSERT_FALSE(r);
  for (char const* name : {"q", "k", "v"})
    EXPECT_FALSE(r.gradient(name)->ok) << name;
}

TEST(CheckFlashAttention, UnscaledDqFailsDqOnly) {
  auto const r = check<false, bug::dq_unscaled>(1, 1, 100);
  ASSERT_FALSE(r);
  EXPECT_FALSE(r.gradient("q")->ok);
  EXPECT_TRUE(r.gradient("k")->ok);
  EXPECT_TRUE(r.gradient("v")->ok);
}

TEST(CheckFlashAttention, SkippedTailQueryTileShowsInItsRowsOfDq) {
  auto const r = check<true, bug::tail_query_tile_skipped>(1, 1, 100);
  ASSERT_FALSE(r);
  EXPECT_TRUE(test_support::mismatches_in(r.gradient("q"), 64, 99, 0, D - 1));
  EXPECT_FALSE(r.gradient("k")->ok); // keys 0-99 are all seen by queries 64-99
}

} // namespace test_flash_attention_backward
