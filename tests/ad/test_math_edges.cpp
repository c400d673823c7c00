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

} // namespace

} // namespace test_math_edges
