// taylor_test: central differences of <w, y(x)> in double converge to vjp's <g, u> at rate 2 for
// a smooth kernel, stay at round-off for a bilinear one, and expose a wrong derivative.
#include <tilegrad/check/gtest.hpp>
#include <tilegrad/check/taylor.hpp>
#include <tilegrad/kernels/softmax.hpp>
#include <tilegrad/kernels/weighted_sum.hpp>
#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest.h>

#include "../support/tensors.hpp"

#include <cmath>
#include <random>
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
  auto const r = tg::taylor_test(1, k, tg::in("x", x), tg::out("y", y));
  EXPECT_FALSE(r) << r;
  EXPECT_NE(r.verdict.find("a kink or a step of the kernel within h of an input"),
            std::string::npos)
      << r;
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

TEST(TaylorTest, OptionsChooseSeedAndSteps) {
  tg::owned_tensor<float> x({3, 10}), y({3, 10});
  fill(x, 5);
  tg::taylor_options o;
  o.seed = 9;
  o.steps = 4;
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

} // namespace test_taylor
