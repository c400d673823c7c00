// check_backward on the matrix product: da = dc @ bᵀ and db = aᵀ @ dc, two kernels, pass on
// shapes that do not divide the tiles, checked together and one at a time (the other operand
// passive); broken variants fail where the bug sits.
#include <tilegrad/check/gtest.hpp>
#include <tilegrad/kernels/matmul.hpp>
#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest.h>

#include "../support/mismatch_region.hpp"

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_matmul_backward {

namespace tg = tilegrad;

namespace {

constexpr int BM = 32, BN = 32, BK = 16;

enum class bug { none, untransposed_b, last_row_of_da_unstored, db_not_accumulated };

// da with an optional mistake; the correct one is the library kernel.
template <bug B>
constexpr auto da_kernel = []<class T>(tg::program const& p, tg::tensor<T const> dc,
                                       tg::tensor<T const> b, tg::tensor<T> da) {
  int const M = static_cast<int>(dc.size(0)), N = static_cast<int>(dc.size(1));
  int const K = static_cast<int>(b.size(0));
  auto const offs_m = p.program_id(0) * BM + tg::arange<0, BM>();
  auto const offs_k = p.program_id(1) * BK + tg::arange<0, BK>();
  auto const offs_n = tg::arange<0, BN>();
  auto dc_ptrs = dc + (tg::col(offs_m) * dc.stride(0) + tg::row(offs_n) * dc.stride(1));
  // The bug reads b[n, k] where b[k, n] belongs (only in bounds because the test's K == N).
  auto b_ptrs = B == bug::untransposed_b
                    ? b + (tg::col(offs_k) * b.stride(1) + tg::row(offs_n) * b.stride(0))
                    : b + (tg::col(offs_k) * b.stride(0) + tg::row(offs_n) * b.stride(1));
  std::int64_t const b_step = B == bug::untransposed_b ? b.stride(0) : b.stride(1);
  auto acc = tg::zeros<float, BM, BK>();
  for (int n = 0; n < tg::cdiv(N, BN); ++n) {
    auto const in_n = tg::row(offs_n) < N - n * BN;
    auto const dc_tile = tg::load(dc_ptrs, (tg::col(offs_m) < M) & in_n, 0.0f);
    auto const b_tile = tg::load(b_ptrs, (tg::col(offs_k) < K) & in_n, 0.0f);
    acc = tg::dot(dc_tile, tg::trans(b_tile), std::move(acc));
    dc_ptrs += BN * dc.stride(1);
    b_ptrs += BN * b_step;
  }
  int const rows = B == bug::last_row_of_da_unstored ? M - 1 : M;
  tg::store(da + (tg::col(offs_m) * da.stride(0) + tg::row(offs_k) * da.stride(1)), acc,
            (tg::col(offs_m) < rows) & (tg::row(offs_k) < K));
};

// db that keeps only the last tile of M (acc overwritten instead of accumulated).
constexpr auto db_not_accumulated = []<class T>(tg::program const& p, tg::tensor<T const> a,
                                                tg::tensor<T const> dc, tg::tensor<T> db) {
  int const M = static_cast<int>(a.size(0)), K = static_cast<int>(a.size(1));
  int const N = static_cast<int>(dc.size(1));
  auto const offs_k = p.program_id(0) * BK + tg::arange<0, BK>();
  auto const offs_n = p.program_id(1) * BN + tg::arange<0, BN>();
  auto const offs_m = tg::arange<0, BM>();
  auto a_ptrs = a + (tg::col(offs_m) * a.stride(0) + tg::row(offs_k) * a.stride(1));
  auto dc_ptrs = dc + (tg::col(offs_m) * dc.stride(0) + tg::row(offs_n) * dc.stride(1));
  auto acc = tg::zeros<float, BK, BN>();
  for (int m = 0; m < tg::cdiv(M, BM); ++m) {
    auto const in_m = tg::col(offs_m) < M - m * BM;
    auto const a_tile = tg::load(a_ptrs, in_m & (tg::row(offs_k) < K), 0.0f);
    auto const dc_tile = tg::load(dc_ptrs, in_m & (tg::row(offs_n) < N), 0.0f);
    acc = tg::dot(tg::trans(a_tile), dc_tile);
    a_ptrs += BM * a.stride(0);
    dc_ptrs += BM * dc.stride(0);
  }
  tg::store(db + (tg::col(offs_k) * db.stride(0) + tg::row(offs_n) * db.stride(1)), acc,
            (tg::col(offs_k) < K) & (tg::row(offs_n) < N));
};

// The two launches; `want_a` / `want_b` select which gradients this backward computes.
template <bug B>
tg::gradient_set matmul_backward(tg::backward_context<float>& ctx, bool want_a, bool want_b) {
  auto const a = ctx.input("a");
  auto const b = ctx.input("b");
  auto const dc = ctx.cotangent("c");
  std::int64_t const M = a.size(0), K = a.size(1), N = b.size(1);
  tg::gradient_set out;
  if (want_a) {
    tg::owned_tensor<float> da({M, K});
    tg::grid const g(tg::cdiv<int>(M, BM), tg::cdiv<int>(K, BK));
    if constexpr (B == bug::none)
      tg::launch(ctx.options(), g, tg::kernels::matmul_bwd_da<BM, BK, BN>, dc, b, da.view());
    else
      tg::launch(ctx.options(), g, da_kernel<B>, dc, b, da.view());
    out.set("a", da);
  }
  if (want_b) {
    tg::owned_tensor<float> db({K, N});
    tg::grid const g(tg::cdiv<int>(K, BK), tg::cdiv<int>(N, BN));
    if constexpr (B == bug::db_not_accumulated)
      tg::launch(ctx.options(), g, db_not_accumulated, a, dc, db.view());
    else
      tg::launch(ctx.options(), g, tg::kernels::matmul_bwd_db<BK, BN, BM>, a, dc, db.view());
    out.set("b", db);
  }
  return out;
}

// The forward's grid: one program per output tile.
tg::grid matmul_grid(tg::owned_tensor<float> const& a, tg::owned_tensor<float> const& b) {
  return tg::grid(tg::cdiv<int>(a.size(0), BM) * tg::cdiv<int>(b.size(1), BN));
}

template <bug B>
tg::check_report check(std::int64_t M, std::int64_t K, std::int64_t N, int seeds = 2) {
  tg::owned_tensor<float> a({M, K}), b({K, N}), c({M, N});
  return tg::check_backward(
      tg::forward(matmul_grid(a, b), tg::kernels::matmul_fwd<BM, BN, BK, 2>, tg::in("a", a),
                  tg::in("b", b), tg::out("c", c)),
      [](tg::backward_context<float>& ctx) { return matmul_backward<B>(ctx, true, true); },
      {.seeds = seeds});
}

} // namespace

TEST(CheckMatmul, HandWrittenBackwardPasses) {
  // M and N at the edges of their tiles, equal and crossed; K walks the edges of its own tile.
  auto const ks = tg::edge_sizes(BK);
  std::size_t i = 0;
  for (auto [M, N] : tg::edge_pairs(BM, BN)) {
    std::int64_t const K = ks[i++ % ks.size()];
    EXPECT_BACKWARD_OK(check<bug::none>(M, K, N, 2)) << M << " x " << K << " x " << N;
  }
}

TEST(CheckMatmul, SplitBackwardsAreCheckedOneGradientAtATime) {
  tg::owned_tensor<float> a({45, 20}), b({20, 37}), c({45, 37});
  auto const g = matmul_grid(a, b);
  auto const& k = tg::kernels::matmul_fwd<BM, BN, BK, 2>;
  auto const da_only = tg::check_backward(
      tg::forward(g, k, tg::in("a", a), tg::passive("b", b), tg::out("c", c)),
      [](tg::backward_context<float>& ctx) { return matmul_backward<bug::none>(ctx, true, false); },
      {.seeds = 5});
  EXPECT_BACKWARD_OK(da_only);
  EXPECT_NE(da_only.gradient("a"), nullptr);
  EXPECT_EQ(da_only.gradient("b"), nullptr);
  auto const db_only = tg::check_backward(
      tg::forward(g, k, tg::passive("a", a), tg::in("b", b), tg::out("c", c)),
      [](tg::backward_context<float>& ctx) { return matmul_backward<bug::none>(ctx, false, true); },
      {.seeds = 5});
  EXPECT_BACKWARD_OK(db_only);
  // With both marked in, a backward that computes only da misses db.
  auto const missing = tg::check_backward(
      tg::forward(g, k, tg::in("a", a), tg::in("b", b), tg::out("c", c)),
      [](tg::backward_context<float>& ctx) { return matmul_backward<bug::none>(ctx, true, false); },
      {.seeds = 1});
  EXPECT_FALSE(missing);
  EXPECT_TRUE(missing.mentions("missing gradient 'b'")) << missing;
  EXPECT_TRUE(missing.gradient("a")->ok);
}

TEST(CheckMatmul, WrongTransposeFails) {
  auto const r = check<bug::untransposed_b>(40, 24, 24);
  ASSERT_FALSE(r);
  EXPECT_FALSE(r.gradient("a")->ok);
  EXPECT_GT(r.gradient("a")->mismatches, 40 * 24 * 9 / 10);
  EXPECT_TRUE(r.gradient("b")->ok);
  // da from b instead of its transpose is unrelated to the reference: its least-squares factor
  // is about -1, which the report once read as "off along the reference all over" (a missing
  // scale or sign). It says the two do not correlate.
  EXPECT_LT(std::abs(r.gradient("a")->scale_correlation), tg::scale_correlation_min);
  std::string const text = r.str();
  EXPECT_NE(text.find("FAIL; unlike the reference all over: kernel and reference correlate at "),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("off along the reference"), std::string::npos) << text;
  EXPECT_EQ(text.find("along the reference: kernel = (1 +"), std::string::npos) << text;
}

TEST(CheckMatmul, OffByOneStoreMaskShowsInTheLastRowOfDaOnly) {
  auto const r = check<bug::last_row_of_da_unstored>(45, 20, 37);
  ASSERT_FALSE(r);
  auto const* da = r.gradient("a");
  EXPECT_EQ(da->mismatches, 20);
  EXPECT_TRUE(test_support::mismatches_in(da, 44, 44, 0, 19));
  EXPECT_TRUE(r.gradient("b")->ok);
}

TEST(CheckMatmul, MissingAccumulationAcrossTilesFails) {
  auto const r = check<bug::db_not_accumulated>(70, 20, 37);
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.gradient("a")->ok);
  auto const* db = r.gradient("b");
  EXPECT_FALSE(db->ok);
  EXPECT_EQ(db->mismatches, 20 * 37);
}

} // namespace test_matmul_backward
