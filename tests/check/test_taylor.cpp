// taylor_test: central differences of <w, y(x)> in double converge to vjp's <g, u> at rate 2 for
// a smooth kernel, stay at round-off for a bilinear one, and expose a wrong derivative.
#include <tilegrad/check/dot_product.hpp>
#include <tilegrad/check/gtest.hpp>
#include <tilegrad/check/taylor.hpp>
#include <tilegrad/kernels/softmax.hpp>
#include <tilegrad/kernels/weighted_sum.hpp>
#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest.h>

#include "../support/tensors.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_taylor {

namespace tg = tilegrad;

namespace {
void fill(tg::owned_tensor<float>& t, unsigned seed) {
  test_support::fill_float(t, seed, -2, 2);
}
} // namespace

TEST(TaylorTest, SoftmaxConvergesAtRateTwo) {
  tg::owned_tensor<float> x({7, 37}), y({7, 37});
  fill(x, 1);
  auto const r = tg::taylor_test(7, tg::kernels::softmax_fwd<64>, tg::in("x", x), tg::out("y", y));
  EXPECT_BACKWARD_OK(r);
  EXPECT_NEAR(r.observed_rate, 2.0, 0.15) << r;
  ASSERT_EQ(r.h.size(), 6u);
  EXPECT_LT(r.residual.back(), r.residual.front() / 100) << r;
  EXPECT_NE(r.directional, 0.0);
}

TEST(TaylorTest, BilinearKernelIsExactToRoundOff) {
  // <w, x @ v> is quadratic along any direction: central differences have no truncation error.
  tg::owned_tensor<float> x({20, 30}), v({30}), y({20});
  fill(x, 2);
  fill(v, 3);
  auto const r = tg::taylor_test(2, tg::kernels::weighted_sum_fwd<16, 16>, tg::in("x", x),
                                 tg::in("w", v), tg::out("y", y));
  EXPECT_TRUE(r) << r;
  for (std::size_t i = 0; i < r.h.size(); ++i)
    EXPECT_TRUE(r.at_roundoff[i]) << r;
}

TEST(TaylorTest, DetectsAWrongDerivative) {
  // A kernel whose reverse-mode instantiation computes something else than its value
  // instantiation, as a wrong derivative rule would: the gradient is 1% off.
  auto k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y) {
    auto const i = tg::arange<0, 16>();
    auto const v = tg::load(x + i, i < x.size(0), 0.0f);
    if constexpr (std::is_same_v<T, double>)
      tg::store(y + i, tg::exp(v), i < y.size(0));
    else
      tg::store(y + i, tg::exp(v) * 1.01f, i < y.size(0));
  };
  tg::owned_tensor<float> x({13}), y({13});
  fill(x, 4);
  auto const r = tg::taylor_test(1, k, tg::in("x", x), tg::out("y", y));
  EXPECT_FALSE(r) << r;
  EXPECT_LT(r.observed_rate, 0.5) << r;
  // The residual stalls at the size of the error instead of shrinking.
  EXPECT_GT(r.residual.back(), r.residual.front() / 2) << r;
}

// A forward whose programs take their tiles from an integer counter the host zeroes (a work
// queue): the first launch used the counter up, every later one did nothing, and the differences
// of 0 failed a correct gradient (rate 0); the caller's counter was left at 65. Every launch now
// starts from the unmarked tensors as given, and the caller's are left so.
TEST(TaylorTest, AWorkQueueCounterStartsEveryLaunchAsGiven) {
  constexpr int B = 64;
  auto k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<std::int32_t> counter,
                       tg::tensor<T> y) {
    std::int64_t const tiles = tg::cdiv<std::int64_t>(x.numel(), B);
    while (true) {
      std::int64_t const t = tg::atomic_add(counter + 0, 1).item();
      if (t >= tiles)
        break;
      auto const offs = t * B + tg::arange<0, B>();
      auto const m = offs < x.numel();
      auto const a = tg::load(x + offs, m, 0.0f);
      tg::store(y + offs, a * a * a, m);
    }
  };
  tg::owned_tensor<float> x({300}), y({300});
  tg::owned_tensor<std::int32_t> counter({1}, "counter");
  fill(x, 9);
  counter(0) = 0;
  auto const r = tg::taylor_test(4, k, tg::in("x", x), counter.view(), tg::out("y", y));
  EXPECT_TRUE(r) << r;
  EXPECT_NEAR(r.observed_rate, 2.0, 0.2) << r;
  EXPECT_EQ(counter(0), 0);
}

// relu over inputs spread across 0: the differences at steps of 1e-2 cross the kink for some
// inputs, and a correct gradient fails; the verdict says that a kink does this. Away from the
// kink it passes.
TEST(TaylorTest, AKinkWithinTheStepFailsAndTheVerdictSaysKinksDoThat) {
  auto k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y) {
    auto const i = tg::arange<0, 256>();
    auto const m = i < x.size(0);
    auto const v = tg::load(x + i, m, 0.0f);
    tg::store(y + i, tg::maximum(v, 0.0f) + tg::exp(v), m);
  };
  tg::owned_tensor<float> x({200}), y({200});
  fill(x, 10);
  for (float& v : x)
    v *= 0.025f; // in (-0.05, 0.05): at h = 1e-2 a tenth of them are within h of the kink
  // Six steps (to 3e-4) leave inputs within h of the kink: the verdict names kinks.
  auto const r = tg::taylor_test({.max_steps = 6}, 1, k, tg::in("x", x), tg::out("y", y));
  EXPECT_FALSE(r) << r;
  EXPECT_NE(r.verdict.find("a kink or a step of the kernel within h of an input"),
            std::string::npos)
      << r;
  // The steps go on halving while the rate has not settled, until no input moves across the
  // kink (h |u_i| < |x_i|), where the correct gradient's differences converge.
  auto const on = tg::taylor_test(1, k, tg::in("x", x), tg::out("y", y));
  EXPECT_TRUE(on) << on;
  EXPECT_GT(on.h.size(), 6u) << on;
  for (float& v : x)
    v = v < 0 ? v - 0.5f : v + 0.5f; // every input at least 0.5 from the kink
  auto const away = tg::taylor_test(1, k, tg::in("x", x), tg::out("y", y));
  EXPECT_TRUE(away) << away;
}

// Programs that add into their output with atomic_add (the output zeroed by the host, as
// Triton's): every launch of the test starts from the output as given. It did not, and the sums
// of the last launch stayed under the next one's: a correct gradient failed at rate -1.
TEST(TaylorTest, AKernelAddingIntoItsOutputAtomicallyPasses) {
  auto k = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y) {
    auto const c = tg::arange<0, 8>();
    auto const m = c < x.size(1);
    auto const v = tg::load(x + p.program_id(0) * x.stride(0) + c, m, 0.0f);
    tg::atomic_add(y + c, tg::exp(v), m);
  };
  tg::owned_tensor<float> x({6, 7}), y({7});
  fill(x, 5);
  auto const r = tg::taylor_test(6, k, tg::in("x", x), tg::out("y", y));
  EXPECT_TRUE(r) << r;
  EXPECT_NEAR(r.observed_rate, 2.0, 0.2) << r;
}

// y = exp(x) + offset: with a large offset, sum|w * y| (the scale of the objective's round-off)
// is large where <g, u> is not, and every residual is at round-off even for a wrong derivative,
// which passed as "the gradient agrees" (5 % off under 1e10, twice the derivative under 1e12).
// Such a test is inconclusive, and fails; with a small offset the wrong derivative fails by its
// rate and the right one passes.
TEST(TaylorTest, RoundOffLargerThanTheDerivativeIsInconclusive) {
  auto k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y, double offset,
                       double wrong) {
    auto const i = tg::arange<0, 16>();
    auto const m = i < x.size(0);
    auto const v = tg::load(x + i, m, 0.0f);
    if constexpr (std::is_same_v<T, double>)
      tg::store(y + i, tg::exp(v) + offset, m);
    else
      tg::store(y + i, tg::exp(v) * wrong + offset, m);
  };
  for (double offset : {0.0, 1e4, 1e10, 1e12})
    for (double wrong : {1.0, 1.05, 2.0}) {
      tg::owned_tensor<float> x({13}), y({13});
      fill(x, 4);
      auto const r = tg::taylor_test(1, k, tg::in("x", x), tg::out("y", y), offset, wrong);
      if (wrong != 1.0) {
        EXPECT_FALSE(r) << offset << " " << wrong << "\n" << r;
      } else if (offset < 1e6) {
        EXPECT_TRUE(r) << offset << "\n" << r;
      }
      if (offset > 1e6 && !r) { // (what a large offset leaves to judge: no pass of a wrong one)
        EXPECT_NE(r.verdict.find("inconclusive"), std::string::npos) << r;
      }
    }
}

// A kernel whose gradient is exactly 0 where the test runs (y = maximum(x, 1) with every x below
// 1), and one whose gradient is tiny but correct (cos near 0, <g, u> about 1e-8): the differences
// agree with <g, u> (exactly, or to 2e-6 of it) though every residual is under the round-off
// bound. Both pass.
TEST(TaylorTest, ZeroAndTinyCorrectGradientsPass) {
  auto k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y, int which) {
    auto const i = tg::arange<0, 16>();
    auto const m = i < x.size(0);
    auto const v = tg::load(x + i, m, 0.0f);
    if (which == 0)
      tg::store(y + i, tg::maximum(v, 1.0f), m);
    else
      tg::store(y + i, tg::cos(v), m);
  };
  for (int which : {0, 1}) {
    tg::owned_tensor<float> x({13}), y({13});
    fill(x, 6);
    for (float& v : x)
      v = which == 0 ? v * 0.25f - 1.0f : v * 1e-8f; // in [-1.5, -0.5]; within 2e-8 of 0
    auto const r = tg::taylor_test(1, k, tg::in("x", x), tg::out("y", y), which);
    EXPECT_TRUE(r) << which << "\n" << r;
  }
}

// y = x^3 at x = 0: the gradient is exactly 0, and the differences converge to it at rate 2 with
// no size of <g, u> to resolve: it passes on its rates. A wrong gradient there (3 x^2 + 0.1)
// stalls at 0.1 |u| and fails.
TEST(TaylorTest, AGradientThatIsZeroAlongUPassesOnItsRates) {
  auto k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y) {
    auto const i = tg::arange<0, 16>();
    auto const m = i < x.size(0);
    auto const v = tg::load(x + i, m, 0.0f);
    if constexpr (std::is_same_v<T, double>)
      tg::store(y + i, v * v * v, m);
    else
      tg::store(y + i, v * v * v + v * 0.1, m); // reverse mode only: off by 0.1
  };
  tg::owned_tensor<float> x({13}), y({13});
  auto cube = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y) {
    auto const i = tg::arange<0, 16>();
    auto const m = i < x.size(0);
    auto const v = tg::load(x + i, m, 0.0f);
    tg::store(y + i, v * v * v, m);
  };
  auto const right = tg::taylor_test(1, cube, tg::in("x", x), tg::out("y", y));
  EXPECT_TRUE(right) << right;
  EXPECT_EQ(right.directional, 0.0);
  auto const wrong = tg::taylor_test(1, k, tg::in("x", x), tg::out("y", y));
  EXPECT_FALSE(wrong) << wrong;
}

TEST(TaylorTest, OptionsChooseSeedAndSteps) {
  tg::owned_tensor<float> x({3, 10}), y({3, 10});
  fill(x, 5);
  tg::taylor_options o;
  o.seed = 9;
  o.steps = 4;
  o.max_steps = 4;
  o.h0 = 1e-1;
  auto const a =
      tg::taylor_test(o, 3, tg::kernels::softmax_fwd<16>, tg::in("x", x), tg::out("y", y));
  auto const b =
      tg::taylor_test(o, 3, tg::kernels::softmax_fwd<16>, tg::in("x", x), tg::out("y", y));
  ASSERT_EQ(a.h.size(), 4u);
  EXPECT_EQ(a.h.front(), 1e-1);
  EXPECT_EQ(a.directional, b.directional); // seeded: the same w and u
  o.seed = 10;
  auto const c =
      tg::taylor_test(o, 3, tg::kernels::softmax_fwd<16>, tg::in("x", x), tg::out("y", y));
  EXPECT_NE(a.directional, c.directional);
}

// y = exp(2000 x) at x in [-3e-3, 3e-3): at the first steps (h up to 1e-2, 20 times the
// kernel's scale 1/2000) the rates are 13, 6.5, 4.9, whatever the gradient. A median of five
// rates over six steps passed a gradient 10 % off (rate 4.9 >= 1.8) before the residual stalled
// at the last two. The steps go on until the rates settle at 2, or the residual stalls.
template <int PercentOff>
constexpr auto steep = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y) {
  auto const i = p.program_id(0) * 16 + tg::arange<0, 16>();
  auto const v = tg::load(x + i, i < x.size(0), 0.0f);
  if constexpr (std::is_same_v<T, double>)
    tg::store(y + i, tg::exp(v * 2000.0), i < y.size(0));
  else // reverse mode's gradient is off by PercentOff (as a wrong derivative rule would be)
    tg::store(y + i, tg::exp(v * (2000.0 * (1 + PercentOff / 100.0))), i < y.size(0));
};

TEST(TaylorTest, ASteepKernelIsJudgedWhereItsRateSettles) {
  tg::owned_tensor<float> x({40}), y({40});
  test_support::fill_float(x, 11, -3e-3, 3e-3);
  auto const wrong = tg::taylor_test(3, steep<10>, tg::in("x", x), tg::out("y", y));
  EXPECT_FALSE(wrong) << wrong;
  EXPECT_NE(wrong.verdict.find("stalls"), std::string::npos) << wrong;
  EXPECT_LT(std::abs(wrong.observed_rate), 0.25) << wrong;
  auto const right = tg::taylor_test(3, steep<0>, tg::in("x", x), tg::out("y", y));
  EXPECT_TRUE(right) << right;
  EXPECT_NEAR(right.observed_rate, 2.0, 0.1) << right;
  EXPECT_GT(right.h.size(), 6u) << right; // past the six steps that stopped too early
}

// A Poisson regression head, y = exp(<x[r, :], w>) with pixel values x in [0, 255) and small
// weights: rates 4.3, 2.9, 4.9 at the first steps; 10 % off fails, the right gradient passes.
template <int PercentOff>
constexpr auto poisson_head = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                          tg::tensor<T const> w, tg::tensor<T> y) {
  int const r = p.program_id(0);
  auto const xv = tg::load(tg::make_block_ptr<64>(x[r], {0}), tg::bounds<0>);
  auto const wv = tg::load(tg::make_block_ptr<64>(w, {0}), tg::bounds<0>);
  auto const e = tg::exp(tg::sum(xv * wv));
  if constexpr (std::is_same_v<T, double>)
    tg::store(y + r, e);
  else
    tg::store(y + r, e * (1 + PercentOff / 100.0));
};

TEST(TaylorTest, APoissonHeadOnPixelValuesIsJudgedWhereItsRateSettles) {
  tg::owned_tensor<float> x({8, 50}), w({50}), y({8});
  test_support::fill_float(x, 12, 0, 255);
  test_support::fill_float(w, 13, -2e-3, 2e-3);
  auto const right =
      tg::taylor_test(8, poisson_head<0>, tg::passive("x", x), tg::in("w", w), tg::out("y", y));
  EXPECT_TRUE(right) << right;
  auto const wrong =
      tg::taylor_test(8, poisson_head<10>, tg::passive("x", x), tg::in("w", w), tg::out("y", y));
  EXPECT_FALSE(wrong) << wrong;
}

// A one-pass variance, E[x^2] - E[x]^2, of rows at 1000 +- 1: each output rounds at the size of
// E[x^2] (1e6), far above sum|w * y| (the variances, 0.3). The round-off was estimated from the
// outputs, the differences' noise taken for a rate (-3.2), and a correct gradient failed. The
// objective's own noise is measured now (2.4e-10 here); 1 % off still fails by its stall.
template <int PercentOff>
constexpr auto one_pass_variance = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                               tg::tensor<T> y) {
  int const r = p.program_id(0);
  auto const v = tg::to<tg::fp32<T>>(tg::load(tg::make_block_ptr<64>(x[r], {0}), tg::bounds<0>));
  double const n = static_cast<double>(x.size(1));
  auto const mean = tg::sum(v) / n;
  auto const var = tg::sum(v * v) / n - mean * mean;
  if constexpr (std::is_same_v<T, double>)
    tg::store(y + r, var);
  else
    tg::store(y + r, var * (1 + PercentOff / 100.0));
};

TEST(TaylorTest, RoundOffOfLargeIntermediatesIsMeasured) {
  tg::owned_tensor<float> x({8, 64}), y({8});
  test_support::fill_float(x, 14, 999, 1001);
  auto const right = tg::taylor_test(8, one_pass_variance<0>, tg::in("x", x), tg::out("y", y));
  EXPECT_TRUE(right) << right;
  EXPECT_GT(right.noise, 1e-11) << right; // the intermediates' rounding, not the outputs'
  auto const wrong = tg::taylor_test(8, one_pass_variance<1>, tg::in("x", x), tg::out("y", y));
  EXPECT_FALSE(wrong) << wrong;
}

// log of inputs within h of 0: the objective is NaN at x0 - h u; the verdict says so (NaN rates
// were sorted with the others, and the median was whatever the sort left there).
TEST(TaylorTest, AnObjectiveThatIsNotFiniteFailsSayingSo) {
  auto k = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y) {
    auto const i = tg::arange<0, 16>();
    auto const m = i < x.size(0);
    tg::store(y + i, tg::log(tg::load(x + i, m, 1.0f)), m);
  };
  tg::owned_tensor<float> x({13}), y({13});
  test_support::fill_float(x, 15, 1e-3, 4e-3);
  auto const r = tg::taylor_test(1, k, tg::in("x", x), tg::out("y", y));
  EXPECT_FALSE(r) << r;
  EXPECT_NE(r.verdict.find("not finite"), std::string::npos) << r;
}

// Softmax written as Triton users write it, `.to(tl.float32)` after the load spelled to<float>:
// in the float64 references that narrows every value to float, and the float32 round-off failed
// the checks of a correct kernel ("reverse and forward mode differ ... please report"). The
// self-checks throw instead, naming the line and to<fp32<T>>; written so, the kernel passes.
template <bool Fp32OfT>
constexpr auto softmax_upcast = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                            tg::tensor<T> y) {
  using F = std::conditional_t<Fp32OfT, tg::fp32<T>, float>;
  int const r = p.program_id(0);
  auto const row =
      tg::to<F>(tg::load(tg::make_block_ptr<32>(x[r], {0}), tg::bounds<0>, tg::padding::neg_inf));
  auto const num = tg::exp(row - tg::max(row));
  tg::store(tg::make_block_ptr<32>(y[r], {0}), tg::to<T>(num / tg::sum(num)), tg::bounds<0>);
};

TEST(TaylorTest, AKernelNarrowingToFloatInTheFloat64ReferenceIsNamed) {
  tg::owned_tensor<float> x({13, 29}), y({13, 29});
  fill(x, 16);
  auto expect_named = [](auto&& f) {
    try {
      f();
      ADD_FAILURE() << "no error";
    } catch (std::invalid_argument const& e) {
      std::string const what = e.what();
      EXPECT_NE(what.find("to<float> (program ("), std::string::npos) << what;
      EXPECT_NE(what.find("test_taylor.cpp:"), std::string::npos) << what;
      EXPECT_NE(what.find("to<tg::fp32<T>>"), std::string::npos) << what;
    }
  };
  expect_named(
      [&] { (void)tg::taylor_test(13, softmax_upcast<false>, tg::in("x", x), tg::out("y", y)); });
  expect_named([&] {
    (void)tg::dot_product_test(13, softmax_upcast<false>, tg::in("x", x), tg::out("y", y));
  });
  auto const t = tg::taylor_test(13, softmax_upcast<true>, tg::in("x", x), tg::out("y", y));
  EXPECT_TRUE(t) << t;
  auto const d = tg::dot_product_test(13, softmax_upcast<true>, tg::in("x", x), tg::out("y", y));
  EXPECT_TRUE(d) << d;
  // Outside the self-checks to<float> narrows as written: a vjp in double gives gradients float
  // round-off away from those of the kernel written with fp32<T> (not bitwise equal, not further).
  tg::owned_tensor<double> xd({13, 29}), yd({13, 29}), dyd({13, 29});
  for (std::int64_t i = 0; i < xd.numel(); ++i)
    xd.data()[i] = x.data()[i], dyd.data()[i] = 0.5 - 0.01 * double(i % 97);
  auto const narrow = tg::vjp(13, softmax_upcast<false>, tg::in("x", xd), tg::out("y", yd, dyd));
  auto const wide = tg::vjp(13, softmax_upcast<true>, tg::in("x", xd), tg::out("y", yd, dyd));
  double most = 0;
  for (int i = 0; i < 13; ++i)
    for (int j = 0; j < 29; ++j)
      most = std::max(most, std::abs(narrow["x"](i, j) - wide["x"](i, j)));
  EXPECT_GT(most, 0.0);
  EXPECT_LT(most, 1e-6);
  // And on the fast path: rows of probabilities.
  tg::launch(13, softmax_upcast<false>, x.cview(), y.view());
  double row = 0;
  for (int j = 0; j < 29; ++j)
    row += y(5, j);
  EXPECT_NEAR(row, 1.0, 1e-5);
}

// P rounded to bf16 before its product with V, as a bf16 attention does (Triton's
// p.to(v.dtype)). Spelled to<bf16>, it rounds at float64 too, and the objective is a staircase of
// steps 2^-8 |p|, whose differences were anything (a correct gradient failed with residuals 1.5 to
// 155 times <g, u>, "off by about 1 of |<g, u>|"). The test's runs throw there, naming the line and
// to<T>; spelled to<T> (bf16 for bf16 tensors, nothing at float64) the kernel passes, and 5 % off
// fails. The dot-product test keeps the rounding: both of its sides round the same values.
template <bool Literal, int PercentOff>
constexpr auto rounded_product = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                             tg::tensor<T const> v, tg::tensor<T> y) {
  using R = std::conditional_t<Literal, tg::bf16, T>;
  int const r = p.program_id(0);
  auto const xr = tg::load(tg::make_block_ptr<1, 32>(x, {r, 0}), tg::bounds<0, 1>);
  auto const vv = tg::load(tg::make_block_ptr<32, 16>(v, {0, 0}), tg::bounds<0, 1>);
  auto const pr = tg::to<tg::fp32<T>>(tg::to<R>(tg::exp(xr)));
  auto const o = tg::dot(pr, tg::to<tg::fp32<T>>(tg::to<R>(vv)));
  if constexpr (std::is_same_v<T, double> || std::is_same_v<T, float>)
    tg::store(tg::make_block_ptr<1, 16>(y, {r, 0}), o, tg::bounds<0, 1>);
  else
    tg::store(tg::make_block_ptr<1, 16>(y, {r, 0}), o * (1 + PercentOff / 100.0), tg::bounds<0, 1>);
};

TEST(TaylorTest, RoundingToBf16InItsRunsIsNamed) {
  tg::owned_tensor<float> x({5, 29}), v({29, 13}), y({5, 13});
  fill(x, 17);
  fill(v, 18);
  try {
    auto const r = tg::taylor_test(5, rounded_product<true, 0>, tg::in("x", x), tg::in("v", v),
                                   tg::out("y", y));
    ADD_FAILURE() << "no error\n" << r;
  } catch (std::invalid_argument const& e) {
    std::string const what = e.what();
    EXPECT_NE(what.find("to<bf16> (program ("), std::string::npos) << what;
    EXPECT_NE(what.find("test_taylor.cpp:"), std::string::npos) << what;
    EXPECT_NE(what.find("to<T>(x)"), std::string::npos) << what;
  }
  auto const dp = tg::dot_product_test(5, rounded_product<true, 0>, tg::in("x", x), tg::in("v", v),
                                       tg::out("y", y));
  EXPECT_TRUE(dp) << dp;
  auto const right = tg::taylor_test(5, rounded_product<false, 0>, tg::in("x", x), tg::in("v", v),
                                     tg::out("y", y));
  EXPECT_TRUE(right) << right;
  auto const wrong = tg::taylor_test(5, rounded_product<false, 5>, tg::in("x", x), tg::in("v", v),
                                     tg::out("y", y));
  EXPECT_FALSE(wrong) << wrong;
}

} // namespace test_taylor
