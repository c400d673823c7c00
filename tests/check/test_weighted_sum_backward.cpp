// check_backward on the weighted sum: the hand-written backward (dx and per-row-tile partial dw,
// reduced by a second launch) passes on shapes that do not divide the tiles; broken variants
// fail, and the report points at the rows or columns the bug touches.
#include <tilegrad/check/gtest.hpp>
#include <tilegrad/kernels/weighted_sum.hpp>
#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest.h>

#include "../support/mismatch_region.hpp"

#include <cstdint>
#include <string>
#include <vector>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_weighted_sum_backward {

namespace tg = tilegrad;

namespace {

constexpr int BR = 16, BD = 32;

// The backward with its two launches; `bug` selects a deliberate mistake.
enum class bug { none, last_row_masked, last_d_tile_skipped, one_partial_row, dy_missing_in_dw };

template <bug B>
tg::gradient_set weighted_sum_backward(tg::backward_context<float>& ctx) {
  auto const x = ctx.input("x");
  auto const w = ctx.input("w");
  auto const dy = ctx.cotangent("y");
  std::int64_t const n = x.size(0), d = x.size(1);
  int const tiles = tg::cdiv<int>(n, BR);
  tg::owned_tensor<float> dx({n, d}), partial({tiles, d}), dw({d});
  if constexpr (B == bug::none) {
    tg::launch(ctx.options(), tiles, tg::kernels::weighted_sum_bwd<BR, BD>, x, w, dy, dx.view(),
               partial.view());
  } else {
    // The same kernel with one mistake each.
    auto kernel = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T const> w,
                              tg::tensor<T const> dy, tg::tensor<T> dx, tg::tensor<T> partial_dw) {
      std::int64_t const r0 = p.program_id(0) * std::int64_t{BR};
      auto g = tg::load(tg::make_block_ptr<BR>(dy, {r0}), tg::bounds<0>);
      if constexpr (B == bug::last_row_masked) // rows < n - 1 instead of rows < n
        g = tg::where(r0 + tg::arange<0, BR>() < x.size(0) - 1, g, 0.0f);
      auto xb = tg::make_block_ptr<BR, BD>(x, {r0, 0});
      auto wb = tg::make_block_ptr<BD>(w, {0});
      auto dxb = tg::make_block_ptr<BR, BD>(dx, {r0, 0});
      auto pb = tg::make_block_ptr<1, BD>(partial_dw, {p.program_id(0), 0});
      int tiles_d = tg::cdiv<std::int64_t>(x.size(1), BD);
      if constexpr (B == bug::last_d_tile_skipped)
        tiles_d = static_cast<int>(x.size(1) / BD);
      for (int i = 0; i < tiles_d; ++i) {
        tg::store(dxb, tg::col(g) * tg::row(tg::load(wb, tg::bounds<0>)), tg::bounds<0, 1>);
        if constexpr (B == bug::dy_missing_in_dw)
          tg::store(pb, tg::sum<0>(tg::load(xb, tg::bounds<0, 1>), tg::keep_dims), tg::bounds<1>);
        else
          tg::store(pb, tg::sum<0>(tg::load(xb, tg::bounds<0, 1>) * tg::col(g), tg::keep_dims),
                    tg::bounds<1>);
        xb = xb.advance(0, BD);
        wb = wb.advance(BD);
        dxb = dxb.advance(0, BD);
        pb = pb.advance(0, BD);
      }
    };
    tg::launch(ctx.options(), tiles, kernel, x, w, dy, dx.view(), partial.view());
  }
  // The reduction over row tiles: a second launch, or (the bug) only the first partial row.
  tg::owned_tensor<float> const reduce_from =
      B == bug::one_partial_row ? tg::owned_tensor<float>({1, d}) : tg::owned_tensor<float>();
  if constexpr (B == bug::one_partial_row) {
    for (std::int64_t j = 0; j < d; ++j)
      reduce_from(0, j) = partial(0, j);
    tg::launch(ctx.options(), tg::cdiv<int>(d, BD), tg::kernels::weighted_sum_reduce_dw<8, BD>,
               reduce_from.cview(), dw.view());
  } else {
    tg::launch(ctx.options(), tg::cdiv<int>(d, BD), tg::kernels::weighted_sum_reduce_dw<8, BD>,
               partial.cview(), dw.view());
  }
  return {{"x", dx}, {"w", dw}};
}

template <bug B>
tg::check_report check(std::int64_t n, std::int64_t d, int seeds = 2) {
  tg::owned_tensor<float> x({n, d}), w({d}), y({n});
  return tg::check_backward(tg::forward(tg::cdiv<int>(n, BR), tg::kernels::weighted_sum_fwd<BR, BD>,
                                        tg::in("x", x), tg::in("w", w), tg::out("y", y)),
                            weighted_sum_backward<B>, {.seeds = seeds});
}

} // namespace

TEST(CheckWeightedSum, HandWrittenBackwardPasses) {
  // Rows and columns at the edges of their tiles (1, 2, tile - 1, tile, tile + 1, several tiles
  // and a remainder), equal and crossed.
  for (auto [n, d] : tg::edge_pairs(BR, BD)) {
    auto const r = check<bug::none>(n, d, 3);
    EXPECT_BACKWARD_OK(r) << n << " x " << d;
    EXPECT_EQ(r.seeds.size(), 3u);
  }
}

TEST(CheckWeightedSum, OffByOneRowMaskShowsInTheLastRowOnly) {
  auto const r = check<bug::last_row_masked>(37, 70);
  ASSERT_FALSE(r) << r;
  auto const* dx = r.gradient("x");
  ASSERT_NE(dx, nullptr);
  EXPECT_FALSE(dx->ok);
  EXPECT_EQ(dx->mismatches, 70);
  EXPECT_TRUE(test_support::mismatches_in(dx, 36, 36, 0, 69));
  EXPECT_EQ(dx->worst.front().at.front(), 36);
  // dw lost row 36's contribution everywhere.
  EXPECT_FALSE(r.gradient("w")->ok);
}

TEST(CheckWeightedSum, SkippedLastDTileShowsInTheLastColumns) {
  auto const r = check<bug::last_d_tile_skipped>(40, 70);
  ASSERT_FALSE(r);
  // The tile at column 64 was never written: dx wrong there in every row, dw there too.
  EXPECT_TRUE(test_support::mismatches_in(r.gradient("x"), 0, 39, 64, 69));
  EXPECT_TRUE(test_support::mismatches_in(r.gradient("w"), 0, 0, 64, 69));
  EXPECT_GE(r.gradient("x")->worst.front().at[1], 64);
}

TEST(CheckWeightedSum, MissingAccumulationAcrossRowTilesBreaksDwOnly) {
  auto const r = check<bug::one_partial_row>(50, 40);
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.gradient("x")->ok);
  auto const* dw = r.gradient("w");
  EXPECT_FALSE(dw->ok);
  EXPECT_EQ(dw->mismatches, 40);
  EXPECT_GT(dw->max_abs_err, 0.1);
}

TEST(CheckWeightedSum, MissingScaleFactorIsCaughtByTheValuesAndByLinearity) {
  auto const r = check<bug::dy_missing_in_dw>(37, 70);
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.gradient("x")->ok);
  EXPECT_FALSE(r.gradient("w")->ok);
  EXPECT_TRUE(r.mentions("not linear in the cotangent: with zero cotangents 'w'")) << r;
}

TEST(CheckWeightedSum, GivenInputsAndCotangentsAreCheckedAndTheRestDrawn) {
  // x and the cotangent of y come from "production data"; w is drawn per seed. The backward
  // computes dw = x^T dy from its own copies of the given numbers (plain loops), so it passes
  // only if the reference ran on exactly those numbers.
  constexpr std::int64_t n = 37, d = 70;
  tg::owned_tensor<float> x({n, d}), w({d}), y({n}), dy({n});
  for (std::int64_t i = 0; i < n; ++i) {
    dy(i) = 0.25f - 0.01f * static_cast<float>(i);
    for (std::int64_t j = 0; j < d; ++j)
      x(i, j) = 0.001f * static_cast<float>((i * 7 + j * 3) % 50) - 0.02f;
  }
  tg::owned_tensor<float> const x_given = x, dy_given = dy;
  std::vector<std::vector<float>> w_seen;
  bool x_is_given = true;
  auto backward = [&](tg::backward_context<float>& ctx) {
    auto const xi = ctx.input("x"), wi = ctx.input("w"), g = ctx.cotangent("y");
    w_seen.emplace_back(wi.data(), wi.data() + wi.numel());
    tg::owned_tensor<float> dx({n, d}), dw({d});
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < d; ++j) {
        if (x_is_given) {
          EXPECT_EQ(xi(i, j), x_given(i, j));
        }
        dx(i, j) = g(i) * wi(j);
      }
    // dw from the given numbers, scaled as the checker scales the cotangent (its structural
    // checks run with zero and doubled cotangents).
    float const scale = dy_given(0) == 0 ? 0 : g(0) / dy_given(0);
    for (std::int64_t j = 0; j < d; ++j) {
      double s = 0;
      for (std::int64_t i = 0; i < n; ++i)
        s += double(x_given(i, j)) * dy_given(i);
      dw(j) = static_cast<float>(s * scale);
    }
    return tg::gradient_set{{"x", dx}, {"w", dw}};
  };
  auto const fwd = tg::forward(tg::cdiv<int>(n, BR), tg::kernels::weighted_sum_fwd<BR, BD>,
                               tg::in("x", x), tg::in("w", w), tg::out("y", y, dy));
  auto const r = tg::check_backward(fwd, backward, {.seeds = 3, .given = {"x"}});
  EXPECT_BACKWARD_OK(r);
  EXPECT_NE(r.launch.find("in x float32 (37, 70) given"), std::string::npos) << r;
  ASSERT_GE(w_seen.size(), 3u);
  EXPECT_NE(w_seen.front(), w_seen.back()); // w is still drawn, per seed

  // The same backward with x drawn (into x: the checker fills the inputs it draws): its dw is
  // of the given x, so the check fails on w.
  x_is_given = false;
  auto const drawn = tg::check_backward(fwd, backward, {.seeds = 1, .check_linearity = false});
  EXPECT_FALSE(drawn.gradient("w")->ok) << drawn;

  // Names that are not inputs, and cotangents of the wrong shape, are problems in the report.
  auto const not_input = tg::check_backward(fwd, backward, {.given = {"y"}});
  EXPECT_FALSE(not_input);
  EXPECT_TRUE(not_input.mentions("out(\"y\", y, dy)")) << not_input;
  tg::owned_tensor<float> short_dy({n - 1});
  auto const wrong_shape = tg::check_backward(
      tg::forward(tg::cdiv<int>(n, BR), tg::kernels::weighted_sum_fwd<BR, BD>, tg::in("x", x),
                  tg::in("w", w), tg::out("y", y, short_dy)),
      backward);
  EXPECT_FALSE(wrong_shape);
  EXPECT_TRUE(wrong_shape.mentions("the cotangent given for 'y' has shape (36)")) << wrong_shape;
}

} // namespace test_weighted_sum_backward
