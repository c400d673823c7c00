// check_backward's structural checks and report, on the weighted sum: wrong shape, wrong dtype,
// NaN, a throwing backward, missing and extra gradients, nondeterminism, a backward that is not
// linear in the cotangent, an input the kernel never reads; the atol/rtol rule; the block map
// and the GoogleTest assertion.
#include <tilegrad/check/gtest.hpp>
#include <tilegrad/kernels/weighted_sum.hpp>
#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_report {

namespace tg = tilegrad;

namespace {

constexpr int BR = 16, BD = 32;
std::int64_t const n = 37, d = 20;

// The correct gradients, computed on the host: dx = dy ⊗ w, dw = xᵀ dy.
struct host_grads {
  tg::owned_tensor<float> dx, dw;
};
host_grads correct(tg::backward_context<float>& ctx) {
  auto const x = ctx.input("x");
  auto const w = ctx.input("w");
  auto const dy = ctx.cotangent("y");
  host_grads g{tg::owned_tensor<float>({n, d}), tg::owned_tensor<float>({d})};
  for (std::int64_t j = 0; j < d; ++j) {
    double acc = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      g.dx(i, j) = dy(i) * w(j);
      acc += double(dy(i)) * x(i, j);
    }
    g.dw(j) = static_cast<float>(acc);
  }
  return g;
}

template <class Backward>
tg::check_report check(Backward&& backward, tg::check_options o = {}) {
  tg::owned_tensor<float> x({n, d}), w({d}), y({n});
  return tg::check_backward(tg::forward(tg::cdiv<int>(n, BR), tg::kernels::weighted_sum_fwd<BR, BD>,
                                        tg::in("x", x), tg::in("w", w), tg::out("y", y)),
                            backward, o);
}

// A row softmax that also stores each row's logsumexp, the statistic a backward recomputes the
// probabilities from (FlashAttention's lse): y = exp(x - lse). Rows of up to 32 columns.
constexpr auto softmax_lse_fwd = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                             tg::tensor<T> y, tg::tensor<T> lse) {
  auto const cols = tg::arange<0, 32>();
  auto const mask = cols < x.size(1);
  std::int64_t const r = p.program_id(0);
  tg::tile<tg::fp32<T>, 32> const v = tg::load(x + r * x.stride(0) + cols, mask, -INFINITY);
  tg::tile<tg::fp32<T>> const m = tg::max(v);
  tg::tile<tg::fp32<T>> const l = m + tg::log(tg::sum(tg::exp(v - m)));
  tg::store(y + r * y.stride(0) + cols, tg::exp(v - l), mask);
  tg::store(lse + r * lse.stride(0), l);
};

// dx = y * (dy - <dy, y>), with y = exp(x - lse) recomputed from the saved lse (the backward
// kernel of docs/checking.md, "Tensors saved for the backward").
constexpr auto softmax_lse_bwd = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                             tg::tensor<T const> lse, tg::tensor<T const> dy,
                                             tg::tensor<T> dx) {
  auto const cols = tg::arange<0, 32>();
  auto const mask = cols < x.size(1);
  std::int64_t const r = p.program_id(0);
  tg::tile<T> const l = tg::load(lse + r * lse.stride(0));
  tg::tile<T, 32> const y = tg::exp(tg::load(x + r * x.stride(0) + cols, mask, -INFINITY) - l);
  tg::tile<T, 32> const g = tg::load(dy + r * dy.stride(0) + cols, mask, 0.0f);
  tg::store(dx + r * dx.stride(0) + cols, y * (g - tg::sum(g * y)), mask);
};

// Its backward on the host, from the saved lse: dx = y * (dy - <dy, y>) (the inner term dropped
// when `drop_inner`), plus y * dlse when lse's cotangent is given.
tg::gradient_set softmax_lse_backward(tg::tensor<float const> x, tg::tensor<float const> lse,
                                      tg::tensor<float const> dy,
                                      tg::tensor<float const> const* dlse,
                                      bool drop_inner = false) {
  std::int64_t const rows = x.size(0), cols = x.size(1);
  tg::owned_tensor<float> dx({rows, cols});
  for (std::int64_t i = 0; i < rows; ++i) {
    double inner = 0;
    for (std::int64_t j = 0; j < cols; ++j)
      inner += double(dy(i, j)) * std::exp(double(x(i, j)) - lse(i));
    for (std::int64_t j = 0; j < cols; ++j) {
      double const y = std::exp(double(x(i, j)) - lse(i));
      dx(i, j) = static_cast<float>(
          y * (dy(i, j) - (drop_inner ? 0 : inner) + (dlse ? double((*dlse)(i)) : 0)));
    }
  }
  return {{"x", dx}};
}

} // namespace

TEST(CheckReport, CorrectHostBackwardPassesAndPrintsTheRule) {
  auto const r = check([](tg::backward_context<float>& ctx) -> tg::gradient_set {
    auto g = correct(ctx);
    return {{"x", g.dx}, {"w", g.dw}};
  });
  ASSERT_TRUE(r) << r;
  EXPECT_EQ(r.seeds.size(), 3u);
  auto const s = r.str();
  EXPECT_NE(s.find("check_backward: PASS"), std::string::npos);
  EXPECT_NE(s.find("|g - g_ref64| <= k * u * (|J|^T |w|) elementwise, k = max(32, 3 * "),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("closest to its bound: "), std::string::npos) << s;
  EXPECT_NE(s.find("in x float32 (37, 20); in w float32 (20); out y float32 (37)"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("seed 2: pass"), std::string::npos);
  // The numbers the rule used are in the report and consistent.
  auto const* g = r.gradient("w", 1);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->tol.rule, tg::pass_rule::error_bound);
  EXPECT_GE(g->tol.k_bound, 32);
  EXPECT_EQ(g->tol.unit, 0x1p-24);
  ASSERT_TRUE(g->tol.magnitude);
  EXPECT_EQ(g->tol.magnitude->size(), std::size_t{d});
  // dw(j) sums |x(i, j) * dy(i)| over the rows: every magnitude is positive.
  for (double m : *g->tol.magnitude)
    EXPECT_GT(m, 0);
  EXPECT_LE(g->worst_ratio, 1);
  EXPECT_NEAR(g->worst_ratio_bound,
              g->tol.k_bound * g->tol.unit * g->worst_ratio_magnitude + g->tol.floor, 1e-18);
}

TEST(CheckReport, TheBaselineRuleStaysAvailable) {
  auto const r = check(
      [](tg::backward_context<float>& ctx) -> tg::gradient_set {
        auto g = correct(ctx);
        return {{"x", g.dx}, {"w", g.dw}};
      },
      {.rule = tg::pass_rule::baseline});
  ASSERT_TRUE(r) << r;
  EXPECT_NE(r.str().find("k * max|g_ref32 - g_ref64| + floor, k = 3"), std::string::npos) << r;
  auto const* g = r.gradient("w", 1);
  ASSERT_NE(g, nullptr);
  EXPECT_GT(g->tol.ref32_err, 0);
  EXPECT_GT(g->tol.floor, 0);
  EXPECT_LE(g->max_abs_err, g->tol.bound(0));
}

TEST(CheckReport, FillingTheContextWorksLikeReturning) {
  auto const r = check([](tg::backward_context<float>& ctx) {
    auto g = correct(ctx);
    ctx.set_gradient("x", g.dx);
    ctx.set_gradient("w", g.dw.view());
  });
  EXPECT_BACKWARD_OK(r);
}

TEST(CheckReport, SeedsAreReproducible) {
  std::vector<float> first;
  auto record = [&](tg::backward_context<float>& ctx) -> tg::gradient_set {
    if (ctx.seed() == 7)
      first.push_back(ctx.input("x")(3, 4));
    auto g = correct(ctx);
    return {{"x", g.dx}, {"w", g.dw}};
  };
  EXPECT_TRUE(check(record, {.seeds = 1, .first_seed = 7}));
  EXPECT_TRUE(check(record, {.seeds = 3, .first_seed = 5}));
  ASSERT_GE(first.size(), 2u);
  EXPECT_EQ(first.front(), first.back());
}

TEST(CheckReport, WrongShapeIsReportedNotCompared) {
  auto const r = check([](tg::backward_context<float>& ctx) -> tg::gradient_set {
    auto g = correct(ctx);
    tg::owned_tensor<float> wide({n, d + 1});
    return {{"x", wide}, {"w", g.dw}};
  });
  ASSERT_FALSE(r);
  auto const* x = r.gradient("x");
  ASSERT_NE(x, nullptr);
  EXPECT_FALSE(x->compared);
  EXPECT_NE(r.str().find("shape (37, 21), the input's is (37, 20)"), std::string::npos) << r;
  EXPECT_TRUE(r.gradient("w")->ok);
}

TEST(CheckReport, WrongDtypeIsReportedEvenWithRightValues) {
  auto const r = check([](tg::backward_context<float>& ctx) -> tg::gradient_set {
    auto g = correct(ctx);
    tg::owned_tensor<double> dw({d});
    for (std::int64_t j = 0; j < d; ++j)
      dw(j) = g.dw(j);
    return {{"x", g.dx}, {"w", dw}};
  });
  ASSERT_FALSE(r);
  auto const* w = r.gradient("w");
  EXPECT_FALSE(w->ok);
  EXPECT_EQ(w->mismatches, 0); // the values agree: only the dtype is wrong
  EXPECT_EQ(w->dtype, "float64");
  EXPECT_NE(r.str().find("dtype float64, the input's is float32"), std::string::npos) << r;
}

// A gradient handed back in int32 (truncated): its dtype is the fault; the doubled cotangents'
// gradient, truncated too, is not twice it, and the report added "not linear in the cotangent",
// which read as a second bug.
TEST(CheckReport, AnIntegerGradientIsReportedForItsDtypeOnly) {
  auto const r = check([](tg::backward_context<float>& ctx) -> tg::gradient_set {
    auto g = correct(ctx);
    tg::owned_tensor<std::int32_t> dw({d});
    for (std::int64_t j = 0; j < d; ++j)
      dw(j) = static_cast<std::int32_t>(g.dw(j));
    return {{"x", g.dx}, {"w", dw}};
  });
  ASSERT_FALSE(r);
  auto const* w = r.gradient("w");
  ASSERT_NE(w, nullptr);
  EXPECT_FALSE(w->ok);
  EXPECT_EQ(w->dtype, "int32");
  EXPECT_NE(r.str().find("dtype int32, the input's is float32"), std::string::npos) << r;
  EXPECT_EQ(r.str().find("not linear"), std::string::npos) << r;
  EXPECT_TRUE(r.gradient("x")->ok);
}

TEST(CheckReport, NanIsNamedWithItsCoordinates) {
  auto const r = check([](tg::backward_context<float>& ctx) -> tg::gradient_set {
    auto g = correct(ctx);
    g.dx(5, 7) = std::numeric_limits<float>::quiet_NaN();
    return {{"x", g.dx}, {"w", g.dw}};
  });
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.mentions("gradient 'x' holds 1 NaN/Inf element(s), the first at (5, 7)")) << r;
  auto const* x = r.gradient("x");
  EXPECT_EQ(x->mismatches, 1);
  EXPECT_EQ(x->nonfinite, 1);
  EXPECT_EQ(x->worst.front().at, (std::vector<std::int64_t>{5, 7}));
}

TEST(CheckReport, ThrowingBackwardIsCaughtWithItsMessage) {
  auto const r = check([](tg::backward_context<float>&) -> tg::gradient_set {
    throw std::runtime_error("partial buffer too small");
  });
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.mentions("the backward threw: partial buffer too small")) << r;
  EXPECT_EQ(r.problems().size(), 3u); // once per seed
}

TEST(CheckReport, UnknownContextNameThrowsIntoTheReport) {
  auto const r = check([](tg::backward_context<float>& ctx) -> tg::gradient_set {
    (void)ctx.input("z");
    return {};
  });
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.mentions("no input named 'z' (the forward has: x, w)")) << r;
}

TEST(CheckReport, MissingExtraAndDuplicateGradientsAreReported) {
  auto const r = check([](tg::backward_context<float>& ctx) -> tg::gradient_set {
    auto g = correct(ctx);
    tg::gradient_set s{{"x", g.dx}, {"y", g.dx}, {"q", g.dw}};
    s.set("x", g.dx);
    return s;
  });
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.mentions("missing gradient 'w' (the forward marks it in)")) << r;
  EXPECT_TRUE(r.mentions("extra gradient 'y': the forward marks it out, not in")) << r;
  EXPECT_TRUE(r.mentions("extra gradient 'q': no tensor of the forward has that name")) << r;
  EXPECT_TRUE(r.mentions("set gradient 'x' more than once")) << r;
  EXPECT_TRUE(r.gradient("x")->ok);
}

TEST(CheckReport, NondeterministicBackwardIsCaught) {
  // Each call perturbs one element of dw by a different amount (as lost updates would).
  auto const r = check([calls = 0](tg::backward_context<float>& ctx) mutable -> tg::gradient_set {
    auto g = correct(ctx);
    g.dw(11) += 1e-3f * static_cast<float>(calls++ % 2);
    return {{"x", g.dx}, {"w", g.dw}};
  });
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.mentions("not deterministic: two runs on the same data differ in 1 of 20 "
                         "elements of 'w', the first at (11)"))
      << r;
  EXPECT_TRUE(r.gradient("x")->ok);
}

TEST(CheckReport, BackwardNotLinearInTheCotangentIsCaught) {
  auto const r = check([](tg::backward_context<float>& ctx) -> tg::gradient_set {
    auto g = correct(ctx);
    for (float& v : g.dx)
      v += 0.5f; // an offset that does not scale with dy
    return {{"x", g.dx}, {"w", g.dw}};
  });
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.mentions("with zero cotangents 'x' is 0.5")) << r;
  EXPECT_TRUE(r.mentions("doubling the cotangents makes 'x'")) << r;
  EXPECT_EQ(r.gradient("x")->mismatches, n * d);
}

TEST(CheckReport, InputTheKernelNeverReadsIsFlagged) {
  // w is marked in but the kernel ignores it: its reference gradient is zero and unread.
  auto k = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T const>,
                       tg::tensor<T> y) {
    auto const i = p.program_id(0) * 16 + tg::arange<0, 16>();
    tg::store(y + i, tg::load(x + i * x.stride(0), i < x.size(0), 0.0f) * 2.0f, i < y.size(0));
  };
  tg::owned_tensor<float> x({n, d}), w({d}), y({n});
  auto const r = tg::check_backward(
      tg::forward(tg::cdiv<int>(n, 16), k, tg::in("x", x), tg::in("w", w), tg::out("y", y)),
      [](tg::backward_context<float>& ctx) -> tg::gradient_set {
        auto const dy = ctx.cotangent("y");
        tg::owned_tensor<float> dx({n, d}), dw({d});
        for (std::int64_t i = 0; i < n; ++i)
          dx(i, 0) = 2 * dy(i);
        return {{"x", dx}, {"w", dw}};
      });
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.mentions("the reference never read 'w'")) << r;
  EXPECT_TRUE(r.mentions("reference gradient of 'w' is all zeros")) << r;
  EXPECT_TRUE(r.gradient("x")->ok);
  EXPECT_TRUE(r.gradient("w")->ok);
}

TEST(CheckReport, AtolRtolRuleWithDefaultsAndOverrides) {
  // dw off by 1e-4 relative: beyond float's default rtol 1.3e-6, within an rtol of 1e-3.
  auto slightly_off = [](tg::backward_context<float>& ctx) -> tg::gradient_set {
    auto g = correct(ctx);
    for (float& v : g.dw)
      v *= 1.0001f;
    return {{"x", g.dx}, {"w", g.dw}};
  };
  tg::check_options o{.rule = tg::pass_rule::atol_rtol};
  auto const strict = check(slightly_off, o);
  EXPECT_FALSE(strict);
  EXPECT_NE(strict.rule.find("atol = 1e-05, rtol = 1.3e-06"), std::string::npos) << strict;
  EXPECT_TRUE(strict.gradient("x")->ok);
  EXPECT_GT(strict.gradient("w")->mismatches, 0);
  o.rtol = 1e-3;
  auto const loose = check(slightly_off, o);
  EXPECT_BACKWARD_OK(loose);
  // The baseline rule catches the same error.
  EXPECT_FALSE(check(slightly_off));
}

TEST(CheckReport, CustomInputGeneratorSetsTheValues) {
  bool positive = true;
  auto const r = check(
      [&](tg::backward_context<float>& ctx) -> tg::gradient_set {
        for (float v : tg::owned_tensor<float>(tg::detail::copy_as<float>(ctx.input("x"))))
          positive = positive && v >= 0.5f && v < 2.0f;
        auto g = correct(ctx);
        return {{"x", g.dx}, {"w", g.dw}};
      },
      {.seeds = 2, .inputs = tg::uniform(0.5, 2.0)});
  EXPECT_TRUE(r) << r;
  EXPECT_TRUE(positive);
}

TEST(CheckReport, BlockMapShowsADiagonal) {
  tg::block_map m(64, 64, 16, 32); // cells of 4 x 2
  for (int i = 0; i < 64; ++i)
    m.mark(i, i);
  EXPECT_EQ(m.cell_rows(), 16);
  EXPECT_EQ(m.cell_cols(), 32);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 32; ++j)
      EXPECT_EQ(m.symbol(i, j) != '.', j / 2 == i) << i << ", " << j;
  EXPECT_EQ(m.symbol(0, 0), '3'); // 2 of 8 elements: up to 3 tenths
  tg::block_map full(3, 5);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 5; ++j)
      full.mark(i, j);
  EXPECT_EQ(full.row_string(2), "#####");
  auto const s = (std::ostringstream() << m).str();
  EXPECT_NE(s.find("rows 60-63"), std::string::npos) << s;
  EXPECT_NE(s.find("cell = 4 x 2"), std::string::npos) << s;
}

TEST(CheckReport, BlockMapGivesEachMatrixOfARank4GradientItsOwnBand) {
  // A (2, 3, 100, 8) gradient: six matrices of 100 rows. Marks on the last row of every matrix
  // land in the last cell row of every band, labelled with the matrix's leading coordinates.
  tg::block_map m(600, 8, {2, 3}, 16, 32);
  EXPECT_EQ(m.rows_per_cell(), 64); // 16 cell rows / 6 matrices: 2 per band, of 64 rows
  EXPECT_EQ(m.cell_rows(), 12);
  for (int k = 0; k < 6; ++k)
    for (int c = 0; c < 8; ++c) m.mark(k * 100 + 99, c);
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(m.first_row(i), i / 2 * 100 + i % 2 * 64) << i;
    EXPECT_EQ(m.last_row(i), i / 2 * 100 + (i % 2 ? 99 : 63)) << i;
    EXPECT_EQ(m.row_string(i), i % 2 ? "11111111" : "........") << i; // 1 of 36 per cell
  }
  auto const s = (std::ostringstream() << m).str();
  EXPECT_NE(s.find("6 matrices of 100 rows"), std::string::npos) << s;
  EXPECT_NE(s.find("(1, 2) rows 64-99 11111111"), std::string::npos) << s;
  EXPECT_NE(s.find("(0, 0) rows  0-63 ........"), std::string::npos) << s;
  // Too many matrices for bands: the rows fold as one, as for rank 2.
  tg::block_map folded(4000, 8, {1, 40}, 16, 32);
  EXPECT_EQ(folded.cell_rows(), 16);
  EXPECT_EQ(folded.last_row(15), 3999);
}

TEST(CheckReport, GtestAssertionPrintsTheReport) {
  EXPECT_NONFATAL_FAILURE(
      {
        auto const r = check([](tg::backward_context<float>& ctx) -> tg::gradient_set {
          auto g = correct(ctx);
          g.dx(36, 3) += 1.0f;
          return {{"x", g.dx}, {"w", g.dw}};
        });
        EXPECT_BACKWARD_OK(r);
      },
      "max abs err 1 at (36, 3)");
}

TEST(CheckReport, SavedStatisticMarkedOutGetsAHint) {
  // The natural first guess: lse marked out and read back with ctx.output. Its cotangent is
  // drawn and ignored, so dx fails; the report says which cotangent is ignored and what to do.
  tg::owned_tensor<float> x({n, d}), y({n, d}), lse({n});
  auto const r = tg::check_backward(
      tg::forward(static_cast<int>(n), softmax_lse_fwd, tg::in("x", x), tg::out("y", y),
                  tg::out("lse", lse)),
      [](tg::backward_context<float>& ctx) {
        return softmax_lse_backward(ctx.input("x"), ctx.output("lse"), ctx.cotangent("y"), nullptr);
      });
  ASSERT_FALSE(r);
  EXPECT_FALSE(r.gradient("x")->ok);
  ASSERT_EQ(r.hints.size(), 1u) << r;
  EXPECT_TRUE(r.mentions("seed 0: the gradients match the reference computed with the cotangent "
                         "of 'lse' set to zero, so the backward ignores that output's cotangent"))
      << r;
  EXPECT_TRUE(r.mentions("pass it to tg::forward unmarked (the tensor itself, not "
                         "tg::out(\"lse\", ...))"))
      << r;
  EXPECT_TRUE(r.mentions("If it is a real output, add its cotangent's contribution")) << r;
  EXPECT_NE(r.str().find("\n  hint: seed 0: "), std::string::npos) << r;
}

TEST(CheckReport, SavedStatisticPassedUnmarkedPassesWithoutAHint) {
  // The pattern: lse unmarked (no cotangent); the backward reads the tensor itself, which holds
  // the float forward's values of the seed being checked.
  tg::owned_tensor<float> x({n, d}), y({n, d}), lse({n});
  auto const r = tg::check_backward(
      tg::forward(static_cast<int>(n), softmax_lse_fwd, tg::in("x", x), tg::out("y", y),
                  lse.view()),
      [&lse](tg::backward_context<float>& ctx) {
        return softmax_lse_backward(ctx.input("x"), lse.cview(), ctx.cotangent("y"), nullptr);
      });
  EXPECT_BACKWARD_OK(r);
  EXPECT_TRUE(r.hints.empty()) << r;
}

TEST(CheckReport, OutputWhoseCotangentTheBackwardAddsPasses) {
  // lse as a real output: its cotangent's contribution y * dlse added, the check passes.
  tg::owned_tensor<float> x({n, d}), y({n, d}), lse({n});
  auto const r = tg::check_backward(
      tg::forward(static_cast<int>(n), softmax_lse_fwd, tg::in("x", x), tg::out("y", y),
                  tg::out("lse", lse)),
      [](tg::backward_context<float>& ctx) {
        auto const dlse = ctx.cotangent("lse");
        return softmax_lse_backward(ctx.input("x"), ctx.output("lse"), ctx.cotangent("y"), &dlse);
      });
  EXPECT_BACKWARD_OK(r);
  EXPECT_TRUE(r.hints.empty()) << r;
}

TEST(CheckReport, UnrelatedWrongBackwardGetsNoHint) {
  // Two outputs, so the hint is looked for, but the mistake (the - <dy, y> term dropped) is not
  // an ignored cotangent: no set of zeroed cotangents explains it.
  tg::owned_tensor<float> x({n, d}), y({n, d}), lse({n});
  auto const r = tg::check_backward(
      tg::forward(static_cast<int>(n), softmax_lse_fwd, tg::in("x", x), tg::out("y", y),
                  tg::out("lse", lse)),
      [](tg::backward_context<float>& ctx) {
        auto const dlse = ctx.cotangent("lse");
        return softmax_lse_backward(ctx.input("x"), ctx.output("lse"), ctx.cotangent("y"), &dlse,
                                    true);
      });
  ASSERT_FALSE(r);
  EXPECT_FALSE(r.gradient("x")->ok);
  EXPECT_TRUE(r.hints.empty()) << r;
  EXPECT_FALSE(r.mentions("set to zero")) << r;
}

TEST(CheckReport, SavedStatisticDocExample) {
  // docs/checking.md, "Tensors saved for the backward", as written there.
  tg::owned_tensor<float> x({37, 20}), y({37, 20}), lse({37});
  auto const report = tg::check_backward(
      tg::forward(37, softmax_lse_fwd, tg::in("x", x), tg::out("y", y), lse.view()), // unmarked
      [&lse](tg::backward_context<float>& ctx) {
        auto const x = ctx.input("x");
        tg::owned_tensor<float> dx({x.size(0), x.size(1)});
        tg::launch(ctx.options(), static_cast<int>(x.size(0)), softmax_lse_bwd, x, lse.cview(),
                   ctx.cotangent("y"), dx.view());
        return tg::gradient_set{{"x", dx}};
      });
  EXPECT_BACKWARD_OK(report);
  EXPECT_TRUE(report.hints.empty()) << report;
}

} // namespace test_report
