// dot's backward where an operand holds inf or NaN in rows or columns that are never stored (a
// padded query row of attention: its scores are all -inf, exp(s - max) is NaN): those values
// meet a zero adjoint and must contribute exactly zero, not 0 * NaN, to the other operand's
// gradient, as every elementwise rule does. Checked against central differences in double, in
// both operand orders and with either operand read transposed; and a NaN that is stored still
// reaches the gradient.
#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest.h>

#include "../support/tensors.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace test_dot_non_finite {

namespace tg = tilegrad;
template <class T>
using owned = tg::owned_tensor<T>;

namespace {

constexpr float inf = std::numeric_limits<float>::infinity();

// y = exp(s - max(s)) @ w over the rows of x (5 of the block's 8): the 3 padded rows of p are
// NaN and never stored. Trans reads p through trans(trans(p)) (dot of a transposed operand).
// StoreAll stores every row of the block, the NaN rows included (y has 8 rows then).
template <bool Trans, bool StoreAll = false>
auto const nan_rows_of_a = []<class T>(tg::program const&, tg::tensor<T const> x,
                                       tg::tensor<T const> w, tg::tensor<T> y) {
  using F = tg::fp32<T>;
  auto const r = tg::arange<0, 8>();
  auto const k = tg::arange<0, 4>();
  auto const c = tg::arange<0, 8>();
  auto const rin = r < x.size(0);
  auto const cin = c < w.size(1);
  tg::tile<F, 8, 4> const s = tg::load(x + tg::col(r) * x.stride(0) + tg::row(k), tg::col(rin), -inf);
  tg::tile<F, 8, 4> const p = tg::exp(s - tg::col(tg::max<1>(s)));
  tg::tile<F, 4, 8> const wv = tg::load(w + tg::col(k) * w.stride(0) + tg::row(c), tg::row(cin), 0.0f);
  tg::tile<F, 8, 8> out;
  if constexpr (Trans) {
    tg::tile<F, 4, 8> const pt = tg::trans(p);
    out = tg::dot(tg::trans(pt), wv);
  } else {
    out = tg::dot(p, wv);
  }
  auto const rows = StoreAll ? tg::col(r < y.size(0)) : tg::col(rin);
  tg::store(y + tg::col(r) * y.stride(0) + tg::row(c), out, rows & tg::row(cin));
};

// y = a @ b with b's 3 padded columns -inf (other = -inf) and never stored.
template <bool Trans>
auto const inf_columns_of_b = []<class T>(tg::program const&, tg::tensor<T const> a,
                                          tg::tensor<T const> b, tg::tensor<T> y) {
  using F = tg::fp32<T>;
  auto const r = tg::arange<0, 4>();
  auto const c = tg::arange<0, 8>();
  auto const cin = c < b.size(1);
  tg::tile<F, 4, 4> const av = tg::load(a + tg::col(r) * a.stride(0) + tg::row(r)) * 0.5f;
  tg::tile<F, 4, 8> const bv = tg::load(b + tg::col(r) * b.stride(0) + tg::row(c), tg::row(cin), -inf);
  tg::tile<F, 4, 8> out;
  if constexpr (Trans) {
    tg::tile<F, 8, 4> const bt = tg::trans(bv);
    out = tg::dot(av, tg::trans(bt));
  } else {
    out = tg::dot(av, bv);
  }
  tg::store(y + tg::col(r) * y.stride(0) + tg::row(c), out, tg::row(cin));
};

double inner(owned<double> const& a, owned<double> const& b) {
  double s = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) s += a.data()[i] * b.data()[i];
  return s;
}

// vjp in float and double, both finite and equal to central differences of <dy, y(x0, x1)>.
template <class Kernel>
void expect_central_differences(Kernel const& k, std::int64_t r0, std::int64_t c0,
                                std::int64_t r1, std::int64_t c1, std::int64_t ry,
                                std::int64_t cy) {
  owned<double> x0({r0, c0}, "x0"), x1({r1, c1}, "x1"), y({ry, cy}, "y"), dy({ry, cy}, "dy");
  test_support::fill(x0, 1);
  test_support::fill(x1, 2);
  test_support::fill(dy, 3);
  auto const g = tg::vjp(1, k, tg::in("x0", x0), tg::in("x1", x1), tg::out("y", y, dy));
  owned<float> f0({r0, c0}, "x0"), f1({r1, c1}, "x1"), fy({ry, cy}, "y"), fdy({ry, cy}, "dy");
  test_support::fill(f0, 1);
  test_support::fill(f1, 2);
  test_support::fill(fdy, 3);
  auto const gf = tg::vjp(1, k, tg::in("x0", f0), tg::in("x1", f1), tg::out("y", fy, fdy));
  double const h = 1e-6;
  for (auto* x : {&x0, &x1}) {
    char const* name = x == &x0 ? "x0" : "x1";
    for (std::int64_t i = 0; i < x->numel(); ++i) {
      double const keep = x->data()[i];
      owned<double> up({ry, cy}), down({ry, cy});
      x->data()[i] = keep + h;
      tg::launch(1, k, x0.cview(), x1.cview(), up.view());
      x->data()[i] = keep - h;
      tg::launch(1, k, x0.cview(), x1.cview(), down.view());
      x->data()[i] = keep;
      double const fd = (inner(up, dy) - inner(down, dy)) / (2 * h);
      double const got = g[name].data()[i];
      ASSERT_TRUE(std::isfinite(got)) << name << " element " << i;
      EXPECT_NEAR(got, fd, 1e-7 * (1 + std::abs(fd))) << name << " element " << i;
      float const gotf = gf[name].data()[i];
      ASSERT_TRUE(std::isfinite(gotf)) << name << " element " << i << " (float)";
      EXPECT_NEAR(gotf, got, 1e-5 * (1 + std::abs(got))) << name << " element " << i << " (float)";
    }
  }
}

} // namespace

TEST(DotNonFinite, NanRowsOfANeverStoredLeaveTheGradientOfBFinite) {
  expect_central_differences(nan_rows_of_a<false>, 5, 4, 4, 6, 5, 6);
  expect_central_differences(nan_rows_of_a<true>, 5, 4, 4, 6, 5, 6);
}

TEST(DotNonFinite, InfColumnsOfBNeverStoredLeaveTheGradientOfAFinite) {
  expect_central_differences(inf_columns_of_b<false>, 4, 4, 4, 5, 4, 5);
  expect_central_differences(inf_columns_of_b<true>, 4, 4, 4, 5, 4, 5);
}

TEST(DotNonFinite, TheMagnitudeSweepStaysFiniteToo) {
  // check_backward's error bound sweeps |partials|: the same rule applies to it.
  owned<double> x({5, 4}, "x"), w({4, 6}, "w"), y({5, 6}, "y"), dy({5, 6}, "dy");
  test_support::fill(x, 1);
  test_support::fill(w, 2);
  test_support::fill(dy, 3);
  for (double& v : dy) v = std::abs(v); // the checker sweeps |w|
  tg::ad::magnitude_scope const sweep(true);
  auto const g = tg::vjp(1, nan_rows_of_a<false>, tg::in("x", x), tg::in("w", w),
                         tg::out("y", y, dy));
  bool nonzero = false;
  for (char const* t : {"x", "w"})
    for (std::int64_t i = 0; i < g[t].numel(); ++i) {
      ASSERT_TRUE(std::isfinite(g[t].data()[i])) << t << " " << i;
      ASSERT_GE(g[t].data()[i], 0) << t << " " << i;
      nonzero |= g[t].data()[i] > 0;
    }
  EXPECT_TRUE(nonzero);
}

TEST(DotNonFinite, ANanThatIsStoredStillReachesTheGradient) {
  // Every row stored: y's rows 5-7 are NaN and their cotangents nonzero, so every element of dw
  // takes NaN (w's gradient sums over all rows of the product), as the math says.
  owned<double> x({5, 4}, "x"), w({4, 6}, "w"), y({8, 6}, "y"), dy({8, 6}, "dy");
  test_support::fill(x, 1);
  test_support::fill(w, 2);
  test_support::fill(dy, 3);
  auto const g = tg::vjp(1, nan_rows_of_a<false, true>, tg::in("x", x), tg::in("w", w),
                         tg::out("y", y, dy));
  for (std::int64_t i = 0; i < g["w"].numel(); ++i)
    EXPECT_TRUE(std::isnan(g["w"].data()[i])) << i;
  for (std::int64_t i = 0; i < 5 * 6; ++i) EXPECT_TRUE(std::isfinite(y.data()[i])) << i;
}

// The scan the sweep of every dot record makes of its operands: inf, -inf and NaN of either
// sign at any place are found; the largest finite values, subnormals and zeros are not.
template <class T>
void expect_scan() {
  using L = std::numeric_limits<T>;
  for (T const bad : {L::infinity(), -L::infinity(), L::quiet_NaN(), -L::quiet_NaN(),
                      L::signaling_NaN()})
    for (int at : {0, 5, 16, 63, 64, 99}) {
      std::vector<T> v(100, T(1.5));
      v[static_cast<std::size_t>(at)] = bad;
      EXPECT_TRUE(tg::ad::any_non_finite(v.data(), 100)) << bad << " at " << at;
      EXPECT_FALSE(tg::ad::any_non_finite(v.data(), at)) << "only before " << at;
    }
  std::vector<T> ok{L::max(), L::lowest(), L::denorm_min(), -L::denorm_min(), T(0), -T(0),
                    L::min(), T(-3)};
  EXPECT_FALSE(tg::ad::any_non_finite(ok.data(), static_cast<int>(ok.size())));
}

TEST(DotNonFinite, TheOperandScanFindsEveryInfAndNan) {
  expect_scan<float>();
  expect_scan<double>();
}

} // namespace test_dot_non_finite
