// Derivatives of math at the ends of the float range, in reverse and forward mode, against the
// derivative taken in double: where the value rounds to its limit, and where an intermediate
// overflows.
#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_math_edges {

namespace {

namespace tg = tilegrad;

constexpr int N = 19; // a batch of 16 lanes and a scalar tail

constexpr auto gate = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y) {
  tg::tile<tg::fp32<T>, N> const v = tg::load(tg::make_block_ptr<N>(x, {0}));
  tg::store(tg::make_block_ptr<N>(y, {0}), tg::sigmoid(v));
};

// sigmoid's derivative where sigmoid rounds to 1 (x = 15, 17, 20 in float) and where exp(-x)
// overflows (x <= -89): y (1 - y) lost every digit at the first (3.6e-7 for 3.1e-7 at x = 15, 0
// for 4.1e-8 at 17), and forward mode's quotient rule gave NaN at the second (0 * inf).
TEST(MathEdges, SigmoidDerivativeKeepsItsDigitsInBothModes) {
  float const v[N] = {15, 17, 20, 30, 60, 88, 89, -89, -100, -1e4f, -INFINITY, 0,
                      0.5f, -0.5f, 3, -3, 10, -10, -87};
  tg::owned_tensor<float> x({N}), y({N}), dy({N}), u({N});
  for (int i = 0; i < N; ++i) {
    x(i) = v[i];
    dy(i) = 1;
    u(i) = 1;
  }
  auto const g = tg::vjp(1, gate, tg::in("x", x), tg::out("y", y, dy));
  auto const t = tg::jvp(1, gate, tg::tangent_in("x", x, u), tg::tangent_out("y", y));
  auto const& dx = g["x"];
  auto const& ty = t["y"];
  for (int i = 0; i < N; ++i) {
    // e / (1 + e)^2 with e = exp(-|x|): no rounding to 1 in double either.
    double const e = std::exp(-std::abs(double(v[i]))), want = e / ((1 + e) * (1 + e));
    double const tol = 4e-7 * want + 1e-44;
    EXPECT_NEAR(dx(i), want, tol) << "vjp: sigmoid'(" << v[i] << ")";
    EXPECT_FALSE(std::isnan(ty(i))) << "jvp: sigmoid'(" << v[i] << ")";
    EXPECT_NEAR(ty(i), want, tol) << "jvp: sigmoid'(" << v[i] << ")";
  }
}

constexpr auto squash = []<class T>(tg::program const&, tg::tensor<T const> x, tg::tensor<T> y) {
  tg::tile<tg::fp32<T>, N> const v = tg::load(tg::make_block_ptr<N>(x, {0}));
  tg::store(tg::make_block_ptr<N>(y, {0}), tg::tanh(v));
};

// tanh's derivative where tanh rounds to 1: 1 - y^2 gave 1.2e-7 for 6.1e-8 at x = 9 in float, 0
// from x = 10 (and 0 for 1.7e-17 at x = 20 in double); 4 e / (1 + e)^2 with e = exp(-2 |x|)
// keeps its digits in both modes.
TEST(MathEdges, TanhDerivativeKeepsItsDigitsInBothModes) {
  float const v[N] = {9,        -9, 10,   12,    20, 44, 50,    -50,     100, -1e4f,
                      INFINITY, 0,  0.5f, -0.5f, 3,  -3, 1e-3f, -1e-20f, 5};
  tg::owned_tensor<float> x({N}), y({N}), dy({N}), u({N});
  for (int i = 0; i < N; ++i) {
    x(i) = v[i];
    dy(i) = 1;
    u(i) = 1;
  }
  auto const g = tg::vjp(1, squash, tg::in("x", x), tg::out("y", y, dy));
  auto const t = tg::jvp(1, squash, tg::tangent_in("x", x, u), tg::tangent_out("y", y));
  for (int i = 0; i < N; ++i) {
    long double const c = std::cosh(static_cast<long double>(v[i]));
    double const want = std::isinf(c) ? 0.0 : static_cast<double>(1 / (c * c));
    double const tol = 4e-7 * want + 1e-44;
    EXPECT_NEAR(g["x"](i), want, tol) << "vjp: tanh'(" << v[i] << ")";
    EXPECT_NEAR(t["y"](i), want, tol) << "jvp: tanh'(" << v[i] << ")";
  }
  tg::owned_tensor<double> xd({N}), yd({N}), dyd({N});
  for (int i = 0; i < N; ++i) {
    xd(i) = v[i] * 2.0;
    dyd(i) = 1;
  }
  auto const gd = tg::vjp(1, squash, tg::in("x", xd), tg::out("y", yd, dyd));
  for (int i : {0, 2, 3}) { // x = 18, 20, 24 in double
    long double const c = std::cosh(static_cast<long double>(xd(i)));
    double const want = static_cast<double>(1 / (c * c));
    EXPECT_NEAR(gd["x"](i), want, 1e-12 * want) << "tanh'(" << xd(i) << ")";
  }
}

// The derivative of a % b in b, -trunc(a / b), where a / b rounds up to a whole number: a = 1,
// b = 0.1 has remainder 0.1 - 5.6e-17 = a - 9 b, but trunc(a / b) = 10. Forward mode took -10,
// reverse mode -9: the two modes disagreed, and so did check_backward's check of one against
// the other. Both take (a - y) / b now.
TEST(MathEdges, TheRemaindersSlopeInTheDivisorIsThePiecesInBothModes) {
  constexpr auto rem = []<class T>(tg::program const&, tg::tensor<T const> a, tg::tensor<T const> b,
                                   tg::tensor<T> y) {
    auto const i = tg::arange<0, 4>();
    tg::store(y + i, tg::load(a + i) % tg::load(b + i));
  };
  tg::owned_tensor<double> a({4}), b({4}), y({4}), dy({4}), ua({4}), ub({4});
  double const av[4] = {1, 5, -1, 7.5}, bv[4] = {0.1, 0.1, 0.1, 2};
  for (int i = 0; i < 4; ++i) {
    a(i) = av[i];
    b(i) = bv[i];
    dy(i) = 1;
    ua(i) = 0;
    ub(i) = 1;
  }
  auto const g = tg::vjp(1, rem, tg::in("a", a), tg::in("b", b), tg::out("y", y, dy));
  auto const t = tg::jvp(1, rem, tg::tangent_in("a", a, ua), tg::tangent_in("b", b, ub),
                         tg::tangent_out("y", y));
  for (int i = 0; i < 4; ++i) {
    double const q = std::round((av[i] - std::fmod(av[i], bv[i])) / bv[i]); // the piece's
    EXPECT_NEAR(g["b"](i), -q, 1e-9) << i;
    EXPECT_NEAR(t["y"](i), -q, 1e-9) << i;
    EXPECT_EQ(g["a"](i), 1.0) << i;
  }
  EXPECT_NEAR(t["y"](0), -9, 1e-9); // (1 - 9 * 0.1 in double is the remainder)
}

// Functions constant in x whose reverse sweep passes sqrt's infinite slope at 0 through a
// partial derivative of exactly zero: sqrt(x * w) with a passive w = 0, sqrt(|x| * w), the norm
// of a row every element of which a float mask zeroes, and a product with a zero row. vjp gave
// NaN (inf * 0) where jvp, and the central differences, give 0; both modes now drop a term whose
// partial is exactly zero, as they drop one whose adjoint or tangent is. Where the partial is not
// zero the infinite slope stays (sqrt(x * w) at x = 0, w = 1).
template <int Case>
constexpr auto constant_in_x = []<class T>(tg::program const&, tg::tensor<T const> x,
                                           tg::tensor<T const> w, tg::tensor<T> y) {
  auto const i = tg::arange<0, N>();
  tg::tile<T, N> const v = tg::load(x + i);
  tg::tile<T, N> const c = tg::load(w + i);
  if constexpr (Case == 0) {
    tg::store(y + i, tg::sqrt(v * c) + tg::sqrt(tg::abs(v) * c));
  } else if constexpr (Case == 1) {
    tg::tile<T> const norm = tg::sqrt(tg::sum(v * v * tg::to<float>(c > 2.0)));
    tg::store(y + i, v * 0.5 + norm);
  } else { // a product whose terms are all zero, under sqrt: an infinite adjoint of dot's result
    tg::tile<T, N, 16> const a = tg::col(v) * tg::row(tg::load(w + tg::arange<0, 16>()));
    tg::tile<T, 16, N> const b = tg::row(c) * tg::col(tg::to<float>(tg::arange<0, 16>() < 8));
    tg::tile<T, N, N> const p = tg::dot(a, b); // p(i, j) = v_i c_j (w_0 + ... + w_7) = 0
    tg::store(y + i, tg::sum<1>(tg::sqrt(p)) + v * 0.25);
  }
};

template <int Case>
void expect_zero_partials_pass_nothing(double const (&ws)[N]) {
  tg::owned_tensor<double> x({N}, "x"), w({N}, "w"), y({N}, "y"), dy({N}, "dy"), u({N}, "u");
  for (int i = 0; i < N; ++i) {
    x(i) = i % 3 == 0 ? 0.0 : 0.25 * i - 2;
    w(i) = ws[i];
    dy(i) = 1;
    u(i) = 1;
  }
  auto const g = tg::vjp(1, constant_in_x<Case>, tg::in("x", x), w.cview(), tg::out("y", y, dy));
  auto const t = tg::jvp(1, constant_in_x<Case>, tg::tangent_in("x", x, u), w.cview(),
                         tg::tangent_out("y", y));
  double vjp_dot = 0, jvp_dot = 0;
  for (int i = 0; i < N; ++i) {
    EXPECT_FALSE(std::isnan(g["x"](i))) << "case " << Case << ", x(" << i << ")";
    EXPECT_FALSE(std::isnan(t["y"](i))) << "case " << Case << ", y(" << i << ")";
    vjp_dot += g["x"](i) * u(i);
    jvp_dot += dy(i) * t["y"](i);
  }
  EXPECT_NEAR(vjp_dot, jvp_dot, 1e-12 * (1 + std::abs(jvp_dot))) << "case " << Case;
}

TEST(MathEdges, AZeroPartialPassesNoInfiniteSlopeInEitherMode) {
  double ws[N] = {};
  expect_zero_partials_pass_nothing<0>(ws); // w = 0 everywhere: y constant 0
  {
    tg::owned_tensor<double> x({N}, "x"), w({N}, "w"), y({N}, "y"), dy({N}, "dy");
    for (int i = 0; i < N; ++i)
      x(i) = 1.0 + i, w(i) = i % 2, dy(i) = 1;
    auto const g = tg::vjp(1, constant_in_x<0>, tg::in("x", x), w.cview(), tg::out("y", y, dy));
    for (int i = 0; i < N; ++i) // d/dx (2 sqrt(x w)) = sqrt(w / x)
      EXPECT_NEAR(g["x"](i), std::sqrt(w(i) / x(i)), 1e-12) << i;
  }
  expect_zero_partials_pass_nothing<1>(ws); // every element masked: the norm's slope is inf
  for (int i = 0; i < N; ++i)
    ws[i] = 0.5 + i % 2; // none over 2 either
  expect_zero_partials_pass_nothing<1>(ws);
  for (int i = 0; i < N; ++i)
    ws[i] = i < 8 ? 0.0 : 1.0 + i; // the first 8 of c are zero: every p(i, j) is 0
  expect_zero_partials_pass_nothing<2>(ws);
}

} // namespace

} // namespace test_math_edges
