// Reverse-mode rules of the op table (tile/ops.hpp: grad for unary ops, grad0 / grad1 for
// binary ones, grad0..grad2 for fma and grad1 / grad2 for where) against central differences in
// double, at random points of each op's domain (away from kinks and jumps), with random
// upstream adjoints g that are not 1: a rule that drops its chain factor g fails (a meta-test
// below shows the harness catching exactly that). Rules are also evaluated on xsimd batches,
// where they must agree with the scalar rules lane by lane.
#include "../support/reference.hpp"

#include <gtest/gtest-spi.h>

#include <cmath>
#include <random>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_op_grads {

namespace {

using namespace tilegrad;

constexpr int points = 64;

struct sampler {
  std::mt19937_64 rng = tg_test::make_rng(2024);
  double uniform(double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(rng);
  }
  // An upstream adjoint: random magnitude in [0.5, 2], random sign; never 1.
  double adjoint() {
    double const m = uniform(0.5, 2);
    return std::bernoulli_distribution(0.5)(rng) ? -m : m;
  }
};

// d/dx f at x by central differences, with a step relative to |x|.
template <class F>
double central_difference(F f, double x) {
  double const h = 1e-6 * std::max(1.0, std::abs(x));
  return (f(x + h) - f(x - h)) / (2 * h);
}

// |rule - g * f'(x)| small relative to the adjoint's size. Returns whether it held: the loops
// stop at a rule's first failure (one message per broken rule).
bool expect_adjoint(double rule, double g, double derivative, char const* op, char const* which,
                    double at0, double at1 = NAN) {
  double const want = g * derivative;
  double const tol = 1e-6 * std::max(1.0, std::abs(want));
  EXPECT_NEAR(rule, want, tol) << op << "::" << which << " at " << at0
                               << (std::isnan(at1) ? "" : ", ") << at1 << " with g = " << g;
  return std::abs(rule - want) <= tol;
}

// Unary: grad(x, y, g) with y = f(x), against g * f'(x), x uniform in [lo, hi] with |x| >= gap.
template <class Op>
void check_unary(char const* name, double lo, double hi, double gap = 0) {
  sampler s;
  for (int i = 0; i < points; ++i) {
    double x;
    do
      x = s.uniform(lo, hi);
    while (std::abs(x) < gap);
    double const g = s.adjoint();
    double const y = Op::apply(x);
    double const d = central_difference([](double t) { return Op::apply(t); }, x);
    if (!expect_adjoint(Op::grad(x, y, g), g, d, name, "grad", x))
      return;
  }
}

// Binary: grad0(a, b, y, g) and grad1(a, b, y, g) against g * df/da and g * df/db, at points
// accepted by `ok` (away from kinks and jumps).
template <class Op, class Ok>
void check_binary(char const* name, double lo, double hi, Ok ok) {
  sampler s;
  for (int i = 0; i < points; ++i) {
    double a, b;
    do {
      a = s.uniform(lo, hi);
      b = s.uniform(lo, hi);
    } while (!ok(a, b));
    double const g = s.adjoint();
    double const y = Op::apply(a, b);
    double const da = central_difference([&](double t) { return Op::apply(t, b); }, a);
    double const db = central_difference([&](double t) { return Op::apply(a, t); }, b);
    bool const ok0 = expect_adjoint(Op::grad0(a, b, y, g), g, da, name, "grad0", a, b);
    bool const ok1 = expect_adjoint(Op::grad1(a, b, y, g), g, db, name, "grad1", a, b);
    if (!ok0 || !ok1)
      return;
  }
}

auto const anywhere = [](double, double) { return true; };

TEST(OpGrads, UnaryMath) {
  check_unary<ops::exp_op>("exp", -5, 5);
  check_unary<ops::exp2_op>("exp2", -5, 5);
  check_unary<ops::log_op>("log", 0.1, 10);
  check_unary<ops::log2_op>("log2", 0.1, 10);
  check_unary<ops::sqrt_op>("sqrt", 0.1, 10);
  check_unary<ops::rsqrt_op>("rsqrt", 0.1, 10);
  check_unary<ops::sin_op>("sin", -6, 6);
  check_unary<ops::cos_op>("cos", -6, 6);
  check_unary<ops::sigmoid_op>("sigmoid", -8, 8);
  check_unary<ops::tanh_op>("tanh", -4, 4);
  check_unary<ops::erf_op>("erf", -3, 3);
  check_unary<ops::abs_op>("abs", -5, 5, 1e-3); // away from the kink at 0
  check_unary<ops::neg_op>("neg", -5, 5);
}

TEST(OpGrads, AbsSubgradientAtZeroIsZero) {
  EXPECT_EQ(ops::abs_op::grad(0.0, 0.0, 1.7), 0.0);
  EXPECT_EQ(ops::abs_op::grad(-0.0, 0.0, -1.3), 0.0);
}

// to<bf16> in a mode with derivatives: the value is the bf16 rounding (at the operand's own
// width, as bf16(double) rounds), the derivative the identity by convention (the rounding is
// piecewise constant: central differences would give 0 or infinity).
TEST(OpGrads, Bf16RoundingIsTheIdentityForDerivatives) {
  sampler s;
  for (int i = 0; i < points; ++i) {
    double const x = s.uniform(-5, 5), g = s.adjoint();
    EXPECT_EQ(ops::round_bf16_op::apply(x), static_cast<double>(bf16(x))) << x;
    EXPECT_EQ(ops::round_bf16_op::apply(static_cast<float>(x)),
              static_cast<float>(bf16(static_cast<float>(x))))
        << x;
    EXPECT_EQ(ops::round_bf16_op::grad(x, ops::round_bf16_op::apply(x), g), g) << x;
  }
  // 1 + 2^-8 + 2^-40 lies just above a bf16 midpoint: rounded once from double, it goes up.
  EXPECT_EQ(ops::round_bf16_op::apply(1 + 0x1p-8 + 0x1p-40), 1 + 0x1p-7);
}

TEST(OpGrads, BinaryArithmetic) {
  check_binary<ops::add_op>("add", -5, 5, anywhere);
  check_binary<ops::sub_op>("sub", -5, 5, anywhere);
  check_binary<ops::mul_op>("mul", -5, 5, anywhere);
  check_binary<ops::div_op>("div", -5, 5, [](double, double b) { return std::abs(b) > 0.3; });
  // fmod jumps where a / b crosses an integer: stay a little away from those lines.
  check_binary<ops::mod_op>("mod", -10, 10, [](double a, double b) {
    if (std::abs(b) < 0.5)
      return false;
    double const q = a / b;
    return std::abs(q - std::round(q)) > 1e-3;
  });
}

TEST(OpGrads, MaximumAndMinimum) {
  auto apart = [](double a, double b) { return std::abs(a - b) > 1e-3; };
  check_binary<ops::maximum_op>("maximum", -5, 5, apart);
  check_binary<ops::minimum_op>("minimum", -5, 5, apart);
  // Ties: the whole adjoint goes to the first operand (documented, deterministic).
  EXPECT_EQ(ops::maximum_op::grad0(2.0, 2.0, 2.0, 1.5), 1.5);
  EXPECT_EQ(ops::maximum_op::grad1(2.0, 2.0, 2.0, 1.5), 0.0);
  EXPECT_EQ(ops::minimum_op::grad0(2.0, 2.0, 2.0, 1.5), 1.5);
  EXPECT_EQ(ops::minimum_op::grad1(2.0, 2.0, 2.0, 1.5), 0.0);
}

TEST(OpGrads, Fma) {
  sampler s;
  for (int i = 0; i < points; ++i) {
    double const a = s.uniform(-5, 5), b = s.uniform(-5, 5), c = s.uniform(-5, 5);
    double const g = s.adjoint();
    using ops::fma_op;
    double const da = central_difference([&](double t) { return fma_op::apply(t, b, c); }, a);
    double const db = central_difference([&](double t) { return fma_op::apply(a, t, c); }, b);
    double const dc = central_difference([&](double t) { return fma_op::apply(a, b, t); }, c);
    // The ternary rules take (a, b, c, g).
    expect_adjoint(fma_op::grad0(a, b, c, g), g, da, "fma", "grad0", a, b);
    expect_adjoint(fma_op::grad1(a, b, c, g), g, db, "fma", "grad1", a, b);
    expect_adjoint(fma_op::grad2(a, b, c, g), g, dc, "fma", "grad2", a, b);
  }
}

TEST(OpGrads, Where) {
  sampler s;
  for (int i = 0; i < points; ++i) {
    bool const c = i % 2 == 0;
    double const a = s.uniform(-5, 5), b = s.uniform(-5, 5);
    double const g = s.adjoint();
    using ops::where_op;
    double const da = central_difference([&](double t) { return where_op::apply(c, t, b); }, a);
    double const db = central_difference([&](double t) { return where_op::apply(c, a, t); }, b);
    expect_adjoint(where_op::grad1(c, g), g, da, c ? "where (true)" : "where (false)", "grad1", a,
                   b);
    expect_adjoint(where_op::grad2(c, g), g, db, c ? "where (true)" : "where (false)", "grad2", a,
                   b);
  }
}

TEST(OpGrads, DifferentiableFlags) {
  // Ops with a reverse rule say so; predicates, logic and bit operations have none.
  EXPECT_TRUE(ops::exp_op::differentiable);
  EXPECT_TRUE(ops::abs_op::differentiable);
  EXPECT_TRUE(ops::add_op::differentiable);
  EXPECT_TRUE(ops::mod_op::differentiable);
  EXPECT_TRUE(ops::maximum_op::differentiable);
  EXPECT_TRUE(ops::where_op::differentiable);
  EXPECT_TRUE(ops::fma_op::differentiable);
  EXPECT_FALSE(ops::lt_op::differentiable);
  EXPECT_FALSE(ops::eq_op::differentiable);
  EXPECT_FALSE(ops::invert_op::differentiable);
  EXPECT_FALSE(ops::and_op::differentiable);
  EXPECT_FALSE(ops::or_op::differentiable);
  EXPECT_FALSE(ops::xor_op::differentiable);
  EXPECT_FALSE(ops::shl_op::differentiable);
  EXPECT_FALSE(ops::shr_op::differentiable);
}

// The harness catches a rule that forgets to multiply by the upstream adjoint.
struct exp_without_chain_factor : ops::exp_op {
  template <class V>
  static V grad(V const&, V const& y, V const&) {
    return y; // should be g * y
  }
};
struct mul_grad1_without_chain_factor : ops::mul_op {
  template <class V>
  static V grad1(V const& a, V const&, V const&, V const&) {
    return a; // should be g * a
  }
};

TEST(OpGrads, HarnessRejectsARuleWithoutItsChainFactor) {
  EXPECT_NONFATAL_FAILURE(check_unary<exp_without_chain_factor>("exp_without_chain_factor", -5, 5),
                          "exp_without_chain_factor::grad");
  EXPECT_NONFATAL_FAILURE(check_binary<mul_grad1_without_chain_factor>(
                              "mul_grad1_without_chain_factor", -5, 5, anywhere),
                          "mul_grad1_without_chain_factor::grad1");
}

#if TILEGRAD_USE_XSIMD
// The rules on xsimd batches agree with the scalar rules lane by lane (abs, maximum and where
// select with masks there; the math functions are xsimd's).
TEST(OpGrads, BatchRulesMatchScalarRules) {
  using B = xsimd::batch<double>;
  constexpr int n = static_cast<int>(B::size);
  sampler s;
  alignas(64) double x[n], xp[n], y[n], g[n], out[n];
  auto fill = [&](double* p, double lo, double hi) {
    for (int i = 0; i < n; ++i)
      p[i] = s.uniform(lo, hi);
  };
  auto check = [&](B const& got, auto scalar, char const* what) {
    got.store_aligned(out);
    for (int i = 0; i < n; ++i)
      EXPECT_NEAR(out[i], scalar(i), 1e-13 * std::max(1.0, std::abs(scalar(i))))
          << what << " lane " << i;
  };
  for (int rep = 0; rep < 8; ++rep) {
    fill(x, -4, 4);   // any sign
    fill(xp, 0.1, 4); // the domain of log, log2, sqrt, rsqrt
    fill(y, -4, 4);
    fill(g, -2, 2);
    x[rep % n] = 0; // abs: the subgradient at 0
    B const bx = B::load_aligned(x), bxp = B::load_aligned(xp), by = B::load_aligned(y),
            bg = B::load_aligned(g);
#define TILEGRAD_CHECK_UNARY_BATCH(OP, BX, X)                                                      \
  check(                                                                                           \
      ops::OP::grad(BX, ops::OP::apply(BX), bg),                                                   \
      [&](int i) { return ops::OP::grad(X[i], ops::OP::apply(X[i]), g[i]); }, #OP)
    TILEGRAD_CHECK_UNARY_BATCH(exp_op, bx, x);
    TILEGRAD_CHECK_UNARY_BATCH(exp2_op, bx, x);
    TILEGRAD_CHECK_UNARY_BATCH(log_op, bxp, xp);
    TILEGRAD_CHECK_UNARY_BATCH(log2_op, bxp, xp);
    TILEGRAD_CHECK_UNARY_BATCH(sqrt_op, bxp, xp);
    TILEGRAD_CHECK_UNARY_BATCH(rsqrt_op, bxp, xp);
    TILEGRAD_CHECK_UNARY_BATCH(sin_op, bx, x);
    TILEGRAD_CHECK_UNARY_BATCH(cos_op, bx, x);
    TILEGRAD_CHECK_UNARY_BATCH(sigmoid_op, bx, x);
    TILEGRAD_CHECK_UNARY_BATCH(tanh_op, bx, x);
    TILEGRAD_CHECK_UNARY_BATCH(erf_op, bx, x);
    TILEGRAD_CHECK_UNARY_BATCH(abs_op, bx, x);
    TILEGRAD_CHECK_UNARY_BATCH(neg_op, bx, x);
    TILEGRAD_CHECK_UNARY_BATCH(round_bf16_op, bx, x);
    check(
        ops::round_bf16_op::apply(bx), [&](int i) { return ops::round_bf16_op::apply(x[i]); },
        "round_bf16_op::apply");
#undef TILEGRAD_CHECK_UNARY_BATCH
#define TILEGRAD_CHECK_BINARY_BATCH(OP)                                                            \
  check(                                                                                           \
      ops::OP::grad0(bx, by, ops::OP::apply(bx, by), bg),                                          \
      [&](int i) { return ops::OP::grad0(x[i], y[i], ops::OP::apply(x[i], y[i]), g[i]); },         \
      #OP "::grad0");                                                                              \
  check(                                                                                           \
      ops::OP::grad1(bx, by, ops::OP::apply(bx, by), bg),                                          \
      [&](int i) { return ops::OP::grad1(x[i], y[i], ops::OP::apply(x[i], y[i]), g[i]); },         \
      #OP "::grad1")
    TILEGRAD_CHECK_BINARY_BATCH(add_op);
    TILEGRAD_CHECK_BINARY_BATCH(sub_op);
    TILEGRAD_CHECK_BINARY_BATCH(mul_op);
    TILEGRAD_CHECK_BINARY_BATCH(div_op);
    TILEGRAD_CHECK_BINARY_BATCH(maximum_op);
    TILEGRAD_CHECK_BINARY_BATCH(minimum_op);
#undef TILEGRAD_CHECK_BINARY_BATCH
    auto const m = bx > by;
    check(
        ops::where_op::grad1(m, bg), [&](int i) { return ops::where_op::grad1(x[i] > y[i], g[i]); },
        "where_op::grad1");
    check(
        ops::where_op::grad2(m, bg), [&](int i) { return ops::where_op::grad2(x[i] > y[i], g[i]); },
        "where_op::grad2");
  }
}
#endif

} // namespace

} // namespace test_op_grads
