// dot_product_test: jvp and vjp of the float64 instantiation agree on <J u, w> = <u, J^T w> for
// correct references (softmax, causal FlashAttention with N != Nk and two heads, a work queue of
// atomics, relu with inputs on the kink), and differ where one mode's derivative is wrong; and
// check_backward runs the same test on its reference.
#include <tilegrad/check/dot_product.hpp>
#include <tilegrad/check/gtest.hpp>
#include <tilegrad/check/taylor.hpp>
#include <tilegrad/kernels/flash_attention.hpp>
#include <tilegrad/kernels/softmax.hpp>
#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest.h>

#include "../support/tensors.hpp"

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_dot_product {

namespace tg = tilegrad;

namespace {
void fill(tg::owned_tensor<float>& t, unsigned seed) {
  test_support::fill_float(t, seed, -2, 2);
}

void expect_sound(tg::dot_product_result const& r) {
  EXPECT_TRUE(r) << r;
  EXPECT_GT(std::abs(r.forward_side), 1e-3 * r.scale) << "a degenerate test\n" << r;
}
} // namespace

// The self-checks run on float64 copies of the inputs; a forward that reads an input again
// through a view it captures (a residual) reads the caller's float tensor there, as constants.
// Both tests refuse it with the reason rather than report on a function with a path missing.
TEST(DotProductTest, AnInputReadThroughACapturedViewIsRefusedByBothSelfChecks) {
  tg::owned_tensor<float> x({40}, "x"), y({40}, "y");
  fill(x, 5);
  tg::tensor<float const> const res = x.cview();
  auto const residual = [res]<class T>(tg::program const& p, tg::tensor<T const> x,
                                       tg::tensor<T> y) {
    auto const i = p.program_id(0) * 16 + tg::arange<0, 16>();
    auto const m = i < x.numel();
    tg::tile<tg::fp32<T>, 16> const v = tg::load(x + i, m, 0.0f);
    tg::store(y + i, tg::tanh(v) + tg::load(res + i, m, 0.0f), m);
  };
  auto expect_refused = [](auto&& run) {
    try {
      run();
      ADD_FAILURE() << "no error";
    } catch (tg::access_error const& e) {
      std::string const m = e.what();
      EXPECT_EQ(e.tensor(), "x") << m;
      EXPECT_NE(m.find("through a view that is not an argument"), std::string::npos) << m;
    }
  };
  expect_refused([&] { (void)tg::dot_product_test(3, residual, tg::in("x", x), tg::out("y", y)); });
  expect_refused([&] { (void)tg::taylor_test(3, residual, tg::in("x", x), tg::out("y", y)); });
}

TEST(DotProductTest, SoftmaxPasses) {
  tg::owned_tensor<float> x({7, 37}), y({7, 37});
  fill(x, 1);
  auto const r =
      tg::dot_product_test(7, tg::kernels::softmax_fwd<64>, tg::in("x", x), tg::out("y", y));
  expect_sound(r);
  EXPECT_LT(std::abs(r.forward_side - r.reverse_side), 1e-13 * r.scale) << r;
}

TEST(DotProductTest, CausalFlashAttentionWithTwoHeadsAndFewerKeysPasses) {
  constexpr int D = 32, BQ = 32, BK = 32;
  int const N = 70, NK = 45;
  tg::owned_tensor<float> q({1, 2, N, D}), k({1, 2, NK, D}), v({1, 2, NK, D}), o({1, 2, N, D});
  tg::owned_tensor<float> lse({1, 2, N});
  fill(q, 2), fill(k, 3), fill(v, 4);
  auto const r = tg::dot_product_test(
      {tg::cdiv(N, BQ), 2, 1}, tg::kernels::flash_attention_fwd<D, BQ, BK, true>, tg::in("q", q),
      tg::in("k", k), tg::in("v", v), tg::out("o", o), lse.view(), 0.2);
  expect_sound(r);
}

// Programs take their tiles from a counter (atomic_add on an int tensor) and add into their
// output with atomic_add: every run starts from the counter as given, and it is left so.
TEST(DotProductTest, AWorkQueueOfAtomicsPassesAndLeavesTheCounterAsGiven) {
  constexpr int B = 16;
  auto kern = []<class T>(tg::program const&, tg::tensor<T const> x,
                          tg::tensor<std::int32_t> counter, tg::tensor<T> y) {
    std::int64_t const tiles = tg::cdiv<std::int64_t>(x.numel(), B);
    while (true) {
      std::int64_t const t = tg::atomic_add(counter + 0, 1).item();
      if (t >= tiles)
        break;
      auto const offs = t * B + tg::arange<0, B>();
      auto const m = offs < x.numel();
      auto const a = tg::load(x + offs, m, 0.0f);
      tg::atomic_add(y + tg::arange<0, B>(), tg::sin(a) * a, m);
    }
  };
  tg::owned_tensor<float> x({100}), y({B});
  tg::owned_tensor<std::int32_t> counter({1}, "counter");
  fill(x, 5);
  counter(0) = 0;
  auto const r = tg::dot_product_test(3, kern, tg::in("x", x), counter.view(), tg::out("y", y));
  expect_sound(r);
  EXPECT_EQ(counter(0), 0);
}

// relu with inputs exactly on the kink: no step size, so no kink trouble (taylor_test fails such
// a kernel); both modes pass a tie to maximum's first operand.
TEST(DotProductTest, InputsOnAKinkPass) {
  auto kern = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y) {
    auto const i = tg::arange<0, 64>();
    auto const m = i < x.size(0);
    auto const v = tg::load(x + i, m, 0.0f);
    tg::store(y + i, tg::maximum(v, 0.0f) * tg::exp(v) + tg::abs(v), m);
  };
  tg::owned_tensor<float> x({50}), y({50});
  fill(x, 6);
  for (int i = 0; i < 50; i += 5)
    x(i) = 0.0f;
  expect_sound(tg::dot_product_test(1, kern, tg::in("x", x), tg::out("y", y)));
}

// A kernel whose reverse-mode instantiation computes another function than its forward-mode one,
// as a wrong derivative rule in one mode would: the gradient 1 % off.
TEST(DotProductTest, DetectsAModeThatDisagrees) {
  auto kern = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y) {
    auto const i = tg::arange<0, 16>();
    auto const m = i < x.size(0);
    auto const v = tg::load(x + i, m, 0.0f);
    if constexpr (std::is_same_v<T, tg::adjoint<double>>)
      tg::store(y + i, tg::exp(v) * 1.01, m);
    else
      tg::store(y + i, tg::exp(v), m);
  };
  tg::owned_tensor<float> x({13}), y({13});
  fill(x, 7);
  auto const r = tg::dot_product_test(1, kern, tg::in("x", x), tg::out("y", y));
  EXPECT_FALSE(r) << r;
  EXPECT_NE(r.verdict.find("differ by"), std::string::npos) << r;
  EXPECT_NEAR(r.reverse_side / r.forward_side, 1.01, 1e-9) << r;
}

// Outputs that do not depend on the marked input: both sides 0, nothing compared. It passed,
// printing "agree to 0 times the scale"; it is inconclusive, and fails.
TEST(DotProductTest, NothingComparedIsInconclusive) {
  auto kern = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y) {
    auto const i = tg::arange<0, 16>();
    (void)x;
    tg::store(y + i, tg::full<tg::fp32<T>, 16>(1.5f), i < y.size(0));
  };
  tg::owned_tensor<float> x({13}), y({13});
  fill(x, 9);
  auto const r = tg::dot_product_test(1, kern, tg::in("x", x), tg::out("y", y));
  EXPECT_FALSE(r) << r;
  EXPECT_NE(r.verdict.find("inconclusive"), std::string::npos) << r;
}

// y = softmax(x + b[row]): softmax is shift invariant, so the gradient of the row bias b is 0
// exactly, and with b the only input marked in, forward mode gives <J u, w> = 0 while reverse mode
// gives rounding noise 1e-17 as large as its own terms. The test failed on it ("differ by 0.24
// times the scale"); round-off is judged against every product summed inside both sides. A
// reverse mode 1 % off still fails where the gradient is not 0 (x marked in too).
template <bool WrongReverse>
constexpr auto row_bias_softmax_kernel = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                                     tg::tensor<T const> b, tg::tensor<T> y) {
  auto const cols = tg::arange<0, 32>();
  auto const m = cols < x.size(1);
  std::int64_t const r = p.program_id(0);
  tg::tile<T, 32> const v = tg::load(x + r * x.stride(0) + cols, m, -INFINITY) + tg::load(b + r);
  tg::tile<T, 32> const e = tg::exp(v - tg::max(v));
  if constexpr (std::is_same_v<T, tg::adjoint<double>> && WrongReverse)
    tg::store(y + r * y.stride(0) + cols, e / tg::sum(e) * 1.01, m);
  else
    tg::store(y + r * y.stride(0) + cols, e / tg::sum(e), m);
};
constexpr auto row_bias_softmax = row_bias_softmax_kernel<false>;
constexpr auto row_bias_softmax_wrong_reverse = row_bias_softmax_kernel<true>;

TEST(DotProductTest, AGradientThatCancelsToZeroPasses) {
  tg::owned_tensor<float> x({40, 20}), b({40}), y({40, 20});
  fill(x, 10), fill(b, 11);
  auto const r = tg::dot_product_test(40, row_bias_softmax, tg::passive("x", x), tg::in("b", b),
                                      tg::out("y", y));
  EXPECT_TRUE(r) << r;
  EXPECT_LT(std::abs(r.forward_side - r.reverse_side), 1e-15) << r;
  EXPECT_GT(r.magnitude, 1e10 * std::abs(r.forward_side - r.reverse_side)) << r;

  auto const both =
      tg::dot_product_test(40, row_bias_softmax, tg::in("x", x), tg::in("b", b), tg::out("y", y));
  expect_sound(both);
  auto const wrong = tg::dot_product_test(40, row_bias_softmax_wrong_reverse, tg::in("x", x),
                                          tg::in("b", b), tg::out("y", y));
  EXPECT_FALSE(wrong) << wrong;
  EXPECT_NEAR(wrong.reverse_side / wrong.forward_side, 1.01, 1e-9) << wrong;
}

TEST(DotProductTest, OptionsChooseTheSeed) {
  tg::owned_tensor<float> x({5, 9}), y({5, 9});
  fill(x, 8);
  auto const a = tg::dot_product_test({.seed = 1}, 5, tg::kernels::softmax_fwd<16>,
                                      tg::in("x", x), tg::out("y", y));
  auto const b = tg::dot_product_test({.seed = 2}, 5, tg::kernels::softmax_fwd<16>,
                                      tg::in("x", x), tg::out("y", y));
  EXPECT_TRUE(a) << a;
  EXPECT_TRUE(b) << b;
  EXPECT_NE(a.forward_side, b.forward_side);
}

// y = exp(x) * x over rows of 40. Its reverse-mode instantiation in float64 (the reference of
// check_backward) computes the same function another way; with WrongReverse it is 1 % off (its
// value too, which no check reads: the checker compares gradients, and the float forward
// computes the outputs), as a wrong derivative rule of reverse mode would make it.
template <bool WrongReverse>
constexpr auto exp_times_x_kernel =
    []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y) {
      auto const cols = tg::arange<0, 64>();
      auto const m = cols < x.size(1);
      std::int64_t const r = p.program_id(0);
      auto const v = tg::load(x + r * x.stride(0) + cols, m, 0.0f);
      if constexpr (std::is_same_v<T, tg::adjoint<double>> && WrongReverse)
        tg::store(y + r * y.stride(0) + cols, tg::exp(v) * v * 1.01, m);
      else if constexpr (std::is_same_v<T, tg::adjoint<double>>)
        tg::store(y + r * y.stride(0) + cols, tg::exp(v) * v * 1.01 - 0.01 * tg::exp(v) * v, m);
      else
        tg::store(y + r * y.stride(0) + cols, tg::exp(v) * v, m);
    };
constexpr auto exp_times_x = exp_times_x_kernel<false>;
constexpr auto exp_times_x_wrong_reverse = exp_times_x_kernel<true>;

// dx = dy * exp(x) * (1 + x), times `factor`, on the host.
auto exp_times_x_bwd(double factor) {
  return [factor](tg::backward_context<float>& ctx) {
    auto const x = ctx.input("x");
    auto const dy = ctx.cotangent("y");
    tg::owned_tensor<float> dx({x.size(0), x.size(1)});
    for (std::int64_t i = 0; i < x.size(0); ++i)
      for (std::int64_t j = 0; j < x.size(1); ++j) {
        double const v = x(i, j);
        dx(i, j) = static_cast<float>(factor * dy(i, j) * std::exp(v) * (1 + v));
      }
    return tg::gradient_set{{"x", dx}};
  };
}

tg::check_report check_exp_times_x(auto kernel, double factor, tg::check_options o = {}) {
  tg::owned_tensor<float> x({5, 40}), y({5, 40});
  return tg::check_backward(tg::forward(5, kernel, tg::in("x", x), tg::out("y", y)),
                            exp_times_x_bwd(factor), o);
}

// A correct reference: the report says forward mode agrees, with both sides.
TEST(CheckBackwardReference, AgreesWithForwardModeAndSaysSo) {
  auto const r = check_exp_times_x(exp_times_x, 1.0);
  EXPECT_TRUE(r) << r;
  EXPECT_NE(r.reference.find("agrees with forward mode"), std::string::npos) << r;
  EXPECT_NE(r.str().find("  reference: agrees with forward mode (float64, seed 0"),
            std::string::npos)
      << r;
  auto const softmax = [] {
    tg::owned_tensor<float> x({7, 37}), y({7, 37});
    return tg::check_backward(
        tg::forward(7, tg::kernels::softmax_fwd<64>, tg::in("x", x), tg::out("y", y)),
        [](tg::backward_context<float>& ctx) {
          auto const y = ctx.output("y");
          auto const dy = ctx.cotangent("y");
          tg::owned_tensor<float> dx({7, 37});
          for (std::int64_t i = 0; i < 7; ++i) {
            double dot = 0;
            for (std::int64_t j = 0; j < 37; ++j)
              dot += double(dy(i, j)) * y(i, j);
            for (std::int64_t j = 0; j < 37; ++j)
              dx(i, j) = static_cast<float>(y(i, j) * (dy(i, j) - dot));
          }
          return tg::gradient_set{{"x", dx}};
        });
  }();
  EXPECT_TRUE(softmax) << softmax;
  EXPECT_NE(softmax.reference.find("agrees with forward mode"), std::string::npos) << softmax;
}

// A reference whose reverse mode is 1 % off: a backward that matches it passed every comparison
// before the reference was checked; now the check fails and says the reference is wrong. With
// the check off it passes again (the check is what catches it), and the correct backward fails
// against the wrong reference with the same problem named.
TEST(CheckBackwardReference, AReverseModeOnePercentOffFailsAsAWrongReference) {
  auto const wrong = check_exp_times_x(exp_times_x_wrong_reverse, 1.01);
  EXPECT_FALSE(wrong) << wrong;
  EXPECT_NE(wrong.reference.find("DISAGREES with forward mode"), std::string::npos) << wrong;
  EXPECT_TRUE(wrong.mentions("the reference is wrong: reverse mode (vjp) and forward mode (jvp)"))
      << wrong;
  EXPECT_TRUE(wrong.mentions("please report the kernel")) << wrong;
  ASSERT_EQ(wrong.seeds.size(), 3u);
  EXPECT_FALSE(wrong.seeds[0].problems.empty()) << wrong;
  EXPECT_TRUE(wrong.seeds[1].ok()) << wrong; // the other seeds compare and pass, as before

  auto const unchecked =
      check_exp_times_x(exp_times_x_wrong_reverse, 1.01, {.check_reference = false});
  EXPECT_TRUE(unchecked) << unchecked;
  EXPECT_TRUE(unchecked.reference.empty()) << unchecked;

  auto const correct = check_exp_times_x(exp_times_x_wrong_reverse, 1.0);
  EXPECT_FALSE(correct) << correct;
  EXPECT_TRUE(correct.mentions("the reference is wrong")) << correct;

  // A reverse mode that computes the same function another way is no error.
  auto const same = check_exp_times_x(exp_times_x, 1.0);
  EXPECT_TRUE(same) << same;
}

// dx = factor * y * (dy - <dy, y>) per row and db = 0 (softmax's shift invariance), on the host.
auto row_bias_softmax_bwd(double factor) {
  return [factor](tg::backward_context<float>& ctx) {
    auto const y = ctx.output("y");
    auto const dy = ctx.cotangent("y");
    tg::owned_tensor<float> dx({y.size(0), y.size(1)}), db({y.size(0)});
    for (std::int64_t i = 0; i < y.size(0); ++i) {
      double dot = 0;
      for (std::int64_t j = 0; j < y.size(1); ++j)
        dot += double(dy(i, j)) * y(i, j);
      for (std::int64_t j = 0; j < y.size(1); ++j)
        dx(i, j) = static_cast<float>(factor * y(i, j) * (dy(i, j) - dot));
    }
    return tg::gradient_set{{"x", dx}, {"b", db}};
  };
}

// The row-bias softmax with b alone marked in: db = 0 exactly, and the reference's two sides are
// rounding noise as large as their terms (0.24 of them apart). Its correct backward failed as a
// wrong reference; the difference is 4e-19 of the computation's magnitude (sum |u| * |J|^T |w|,
// the error_bound rule's sweep, or swept for the check where a rule has none). A reverse mode 1 %
// off still fails as a wrong reference where the gradient is not 0 (x marked in too), under
// either rule.
TEST(CheckBackwardReference, AGradientThatCancelsToZeroAgreesWithForwardMode) {
  constexpr std::int64_t rows = 40, n = 20;
  auto check = [&](auto kernel, bool x_in, double factor, tg::pass_rule rule) {
    tg::owned_tensor<float> x({rows, n}), b({rows}), y({rows, n});
    auto const bwd = [&, x_in](tg::backward_context<float>& ctx) {
      auto g = row_bias_softmax_bwd(factor)(ctx);
      return x_in ? g : tg::gradient_set{{"b", tg::owned_tensor<float>({rows})}};
    };
    // (db's reference is 0 or rounding noise: not a captured tensor)
    tg::check_options const o{.rule = rule, .zero_reference_fails = false};
    return x_in ? tg::check_backward(
                      tg::forward(rows, kernel, tg::in("x", x), tg::in("b", b), tg::out("y", y)),
                      bwd, o)
                : tg::check_backward(tg::forward(rows, kernel, tg::passive("x", x), tg::in("b", b),
                                                 tg::out("y", y)),
                                     bwd, o);
  };
  for (auto rule : {tg::pass_rule::error_bound, tg::pass_rule::atol_rtol}) {
    auto const zero = check(row_bias_softmax, false, 1.0, rule);
    EXPECT_TRUE(zero) << zero;
    EXPECT_NE(zero.str().find("  reference: agrees with forward mode (float64, seed 0"),
              std::string::npos)
        << zero;
    EXPECT_NE(zero.reference.find("of the computation's magnitude apart"), std::string::npos)
        << zero;

    auto const both = check(row_bias_softmax, true, 1.0, rule);
    EXPECT_TRUE(both) << both;
    EXPECT_NE(both.reference.find("agrees with forward mode"), std::string::npos) << both;

    auto const wrong = check(row_bias_softmax_wrong_reverse, true, 1.01, rule);
    EXPECT_FALSE(wrong) << wrong;
    EXPECT_NE(wrong.reference.find("DISAGREES with forward mode"), std::string::npos) << wrong;
    EXPECT_TRUE(wrong.mentions("the reference is wrong")) << wrong;
    ASSERT_EQ(wrong.seeds.size(), 3u);
    EXPECT_TRUE(wrong.seeds[1].ok()) << wrong; // the backward matches the wrong reference
  }
}

// Outputs that do not depend on the input: both sides are 0, which the reference line says; the
// verdict is left to the other checks (a reference of zeros fails as a likely capture).
TEST(CheckBackwardReference, NothingToCompareIsSaidAndLeftToTheOtherChecks) {
  auto const constant = []<class T>(tg::program const& p, tg::tensor<T const> x, tg::tensor<T> y) {
    auto const cols = tg::arange<0, 64>();
    auto const m = cols < x.size(1);
    (void)tg::load(x + p.program_id(0) * x.stride(0) + cols, m, 0.0f);
    tg::store(y + p.program_id(0) * y.stride(0) + cols, tg::full<tg::fp32<T>, 64>(1.5f), m);
  };
  tg::owned_tensor<float> x({5, 40}), y({5, 40});
  auto const r = tg::check_backward(
      tg::forward(5, constant, tg::in("x", x), tg::out("y", y)), [](tg::backward_context<float>&) {
        return tg::gradient_set{{"x", tg::owned_tensor<float>({5, 40})}};
      });
  EXPECT_NE(r.reference.find("not checked against forward mode: every term"), std::string::npos)
      << r;
  EXPECT_FALSE(r.mentions("the reference is wrong")) << r;
  EXPECT_TRUE(r.mentions("is all zeros")) << r;
}

} // namespace test_dot_product
