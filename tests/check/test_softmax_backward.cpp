// check_backward on the row softmax: the hand-written backward dx = y * (dy - <dy, y>) passes on
// row lengths that do not fill the block; broken variants fail where the bug sits.
#include <tilegrad/check/gtest.hpp>
#include <tilegrad/kernels/softmax.hpp>
#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest.h>

#include "../support/mismatch_region.hpp"

#include <cstdint>
#include <string>
#include <type_traits>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_softmax_backward {

namespace tg = tilegrad;

namespace {

constexpr int Block = 128;

enum class bug { none, no_subtraction, last_column_unstored, last_row_skipped, sum_of_dy_only };

template <bug B>
void softmax_backward(tg::backward_context<float>& ctx) {
  auto const y = ctx.output("y");
  auto const dy = ctx.cotangent("y");
  std::int64_t const n = y.size(0), d = y.size(1);
  tg::owned_tensor<float> dx({n, d});
  if constexpr (B == bug::none) {
    tg::launch(ctx.options(), static_cast<int>(n), tg::kernels::softmax_bwd<Block>, y, dy,
               dx.view());
  } else {
    auto kernel = []<class T>(tg::program const& p, tg::tensor<T const> y, tg::tensor<T const> dy,
                              tg::tensor<T> dx) {
      int const r = p.program_id(0);
      auto const cols = tg::arange<0, Block>();
      auto const mask = cols < y.size(1);
      auto const yr = tg::load(y + r * y.stride(0) + cols * y.stride(1), mask, 0.0f);
      auto const gr = tg::load(dy + r * dy.stride(0) + cols * dy.stride(1), mask, 0.0f);
      tg::tile<float, Block> out;
      if constexpr (B == bug::no_subtraction)
        out = yr * gr;
      else if constexpr (B == bug::sum_of_dy_only)
        out = yr * (gr - tg::sum(gr));
      else
        out = yr * (gr - tg::sum(gr * yr));
      auto const store_mask = B == bug::last_column_unstored ? cols < y.size(1) - 1 : mask;
      tg::store(dx + r * dx.stride(0) + cols * dx.stride(1), out, store_mask);
    };
    int const programs = static_cast<int>(B == bug::last_row_skipped ? n - 1 : n);
    if (programs > 0)
      tg::launch(ctx.options(), programs, kernel, y, dy, dx.view());
  }
  ctx.set_gradient("x", dx);
}

template <bug B>
tg::check_report check(std::int64_t n, std::int64_t d, int seeds = 2,
                       bool zero_reference_fails = true) {
  tg::owned_tensor<float> x({n, d}), y({n, d});
  // Wider inputs than the default [-1, 1) make the rows far from uniform.
  return tg::check_backward(
      tg::forward(static_cast<int>(n), tg::kernels::softmax_fwd<Block>, tg::in("x", x),
                  tg::out("y", y)),
      softmax_backward<B>,
      {.seeds = seeds, .inputs = tg::uniform(-3, 3), .zero_reference_fails = zero_reference_fails});
}

} // namespace

TEST(CheckSoftmax, HandWrittenBackwardPasses) {
  // Row lengths at the edges of the block (from 2: one column is the test below) and two in
  // between, on 1, 2 and 9 rows.
  auto widths = tg::edge_sizes(Block, Block);
  widths.erase(widths.begin());
  widths.insert(widths.end(), {37, 100});
  for (std::int64_t d : widths)
    for (std::int64_t n : {1, 2, 9}) {
      auto const r = check<bug::none>(n, d, 3);
      EXPECT_BACKWARD_OK(r) << n << " x " << d;
    }
}

TEST(CheckSoftmax, OneColumnRowsHaveAZeroGradientByCancellationWhichPasses) {
  // softmax of a single element is 1 whatever x: the reference gradient is all zeros, but the
  // kernel reads x (|J|^T |w| is not zero): the terms cancel, which is no capture. It passes,
  // with a warning.
  auto const r = check<bug::none>(4, 1);
  EXPECT_BACKWARD_OK(r);
  EXPECT_TRUE(r.mentions("all zeros by cancellation")) << r;
  EXPECT_BACKWARD_OK((check<bug::none>(4, 1, 2, false)));
}

// Softmax as a Triton user ports it: the load upcast with `.to(tl.float32)`, spelled to<float>.
// In check_backward's float64 references that narrowed every value to float, and the library's
// correct softmax_bwd failed: "reference: DISAGREES with forward mode (1.4e-9, at most 1e-10) ...
// please report". The check now fails saying why, naming the line and to<fp32<T>>; the kernel
// written with to<fp32<T>> passes.
template <bool Fp32OfT>
constexpr auto softmax_upcast =
    []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y) {
      using F = std::conditional_t<Fp32OfT, tg::fp32<T>, float>;
      int const r = p.program_id(0);
      auto const row = tg::to<F>(
          tg::load(tg::make_block_ptr<Block>(x[r], {0}), tg::bounds<0>, tg::padding::neg_inf));
      auto const num = tg::exp(row - tg::max(row));
      tg::store(tg::make_block_ptr<Block>(y[r], {0}), tg::to<T>(num / tg::sum(num)), tg::bounds<0>);
    };

TEST(CheckSoftmax, AForwardNarrowingToFloatFailsNamingTheLineNotTheReference) {
  tg::owned_tensor<float> x({13, 100}), y({13, 100});
  auto const narrow =
      tg::check_backward(tg::forward(13, softmax_upcast<false>, tg::in("x", x), tg::out("y", y)),
                         softmax_backward<bug::none>, {.seeds = 2});
  EXPECT_FALSE(narrow);
  EXPECT_TRUE(narrow.mentions("narrows a float64 value to float")) << narrow;
  EXPECT_TRUE(narrow.mentions("to<tg::fp32<T>>")) << narrow;
  EXPECT_TRUE(narrow.mentions("test_softmax_backward.cpp:")) << narrow;
  EXPECT_FALSE(narrow.mentions("please report")) << narrow;
  auto const wide =
      tg::check_backward(tg::forward(13, softmax_upcast<true>, tg::in("x", x), tg::out("y", y)),
                         softmax_backward<bug::none>, {.seeds = 2});
  EXPECT_BACKWARD_OK(wide);
}

TEST(CheckSoftmax, MissingSubtractionFailsEverywhere) {
  auto const r = check<bug::no_subtraction>(20, 50);
  ASSERT_FALSE(r);
  auto const* g = r.gradient("x");
  EXPECT_GT(g->mismatches, 20 * 50 * 9 / 10);
  EXPECT_TRUE(test_support::mismatches_in(g, 0, 19, 0, 49));
}

TEST(CheckSoftmax, WrongRowSumFails) {
  auto const r = check<bug::sum_of_dy_only>(20, 50);
  ASSERT_FALSE(r);
  EXPECT_GT(r.gradient("x")->mismatches, 20 * 50 * 9 / 10);
}

TEST(CheckSoftmax, OffByOneStoreMaskShowsInTheLastColumnOnly) {
  auto const r = check<bug::last_column_unstored>(20, 50);
  ASSERT_FALSE(r);
  auto const* g = r.gradient("x");
  EXPECT_EQ(g->mismatches, 20);
  EXPECT_TRUE(test_support::mismatches_in(g, 0, 19, 49, 49));
  EXPECT_EQ(g->worst.front().at[1], 49);
}

TEST(CheckSoftmax, SkippedLastRowShowsInTheLastRowOnly) {
  auto const r = check<bug::last_row_skipped>(33, 100);
  ASSERT_FALSE(r);
  auto const* g = r.gradient("x");
  EXPECT_EQ(g->mismatches, 100);
  EXPECT_TRUE(test_support::mismatches_in(g, 32, 32, 0, 99));
}

} // namespace test_softmax_backward
