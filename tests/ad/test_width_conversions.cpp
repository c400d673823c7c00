// Conversions between float widths inside a kernel (to<double>, to<float>, to<bf16>, fp64<T>)
// in every mode: values against a plain loop on the fast path (float, double), tangents in
// forward mode (dual<float>, dual<double>) and gradients in reverse mode (adjoint<float>,
// adjoint<double>) against closed forms, on shapes that do not divide the tiles, with random
// non-unit cotangents and tangents. bf16 rounding is differentiated as the identity.
#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest.h>

#include "../support/tensors.hpp"

#include <cmath>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_width_conversions {

namespace tg = tilegrad;
using test_support::fill;

namespace {

// The mode maps: "fp64 in the current mode", and two widths of one mode meet at the wider.
static_assert(std::is_same_v<tg::fp64<float>, double>);
static_assert(std::is_same_v<tg::fp64<tg::bf16>, double>);
static_assert(std::is_same_v<tg::fp64<tg::adjoint<float>>, tg::adjoint<double>>);
static_assert(std::is_same_v<tg::fp64<tg::dual<float, 2>>, tg::dual<double, 2>>);
static_assert(
    std::is_same_v<tg::promote_t<tg::adjoint<float>, tg::adjoint<double>>, tg::adjoint<double>>);
static_assert(
    std::is_same_v<tg::promote_t<tg::dual<double, 3>, tg::dual<float, 3>>, tg::dual<double, 3>>);

constexpr int BR = 8, BD = 64;

// s[i] = sum_j x[i, j] w[j] (a materialised fp64 product, reduced) + 0.5 sum_j x[i, j]^2 (a sum
// of a cheap fp64 expression), narrowed to fp32; y[i] = exp(0.1 s[i]).
// z[i, j] = bf16(x[i, j] w[j]) x[i, j].
constexpr auto mixed_widths = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                          tg::tensor<T const> w, tg::tensor<T> y, tg::tensor<T> z) {
  std::int64_t const r0 = p.program_id(0) * std::int64_t{BR};
  auto const xv = tg::load(tg::make_block_ptr<BR, BD>(x, {r0, 0}), tg::bounds<0, 1>);
  auto const wv = tg::load(tg::make_block_ptr<BD>(w, {0}), tg::bounds<0>);
  tg::tile<tg::fp64<T>, BR, BD> const prod = tg::to<double>(xv) * tg::to<double>(tg::row(wv));
  tg::tile<tg::fp64<T>, BR> const acc =
      tg::sum<1>(prod) + tg::sum<1>(tg::to<double>(xv) * tg::to<double>(xv)) * 0.5;
  tg::tile<tg::fp32<T>, BR> const s = tg::to<float>(acc);
  tg::store(tg::make_block_ptr<BR>(y, {r0}), tg::to<T>(tg::exp(s * 0.1f)), tg::bounds<0>);
  auto const r = tg::to<float>(tg::to<tg::bf16>(xv * tg::row(wv)));
  tg::store(tg::make_block_ptr<BR, BD>(z, {r0, 0}), tg::to<T>(r * xv), tg::bounds<0, 1>);
};

int const n = 21, d = 37; // neither divides its tile (8 x 64)

// The plain loop, in the precision of the mode the kernel ran in (P: float or double).
template <class P>
struct reference {
  std::vector<double> y, r; // y[i], and r[i, j] = bf16(x[i, j] w[j])
  template <class X>
  reference(X const& x, X const& w) : y(n), r(n * d) {
    for (int i = 0; i < n; ++i) {
      double s = 0;
      for (int j = 0; j < d; ++j) {
        double const xi = static_cast<double>(x(i, j)), wj = static_cast<double>(w(j));
        s += xi * wj + 0.5 * xi * xi;
        P const prod = static_cast<P>(x(i, j)) * static_cast<P>(w(j));
        r[i * d + j] = static_cast<double>(static_cast<float>(tg::bf16(prod)));
      }
      y[i] = std::exp(0.1 * static_cast<double>(static_cast<float>(s)));
    }
  }
};

template <class T>
class WidthConversions : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(WidthConversions, Types);

TYPED_TEST(WidthConversions, FastPathValues) {
  using T = TypeParam;
  tg::owned_tensor<T> x({n, d}, "x"), w({d}, "w"), y({n}, "y"), z({n, d}, "z");
  fill(x, 1), fill(w, 2);
  tg::launch(tg::cdiv(n, BR), mixed_widths, x.cview(), w.cview(), y.view(), z.view());
  reference<T> const ref(x, w);
  for (int i = 0; i < n; ++i) {
    ASSERT_NEAR(y(i), ref.y[i], 1e-6 * ref.y[i]) << "y(" << i << ")";
    for (int j = 0; j < d; ++j)
      ASSERT_NEAR(z(i, j), ref.r[i * d + j] * x(i, j), 1e-6) << "z(" << i << ", " << j << ")";
  }
}

TYPED_TEST(WidthConversions, GradientsThroughEveryConversion) {
  using T = TypeParam;
  tg::owned_tensor<T> x({n, d}, "x"), w({d}, "w"), y({n}, "y"), z({n, d}, "z");
  tg::owned_tensor<T> dy({n}, "dy"), dz({n, d}, "dz");
  fill(x, 3), fill(w, 4), fill(dy, 5), fill(dz, 6);
  auto g = tg::vjp(tg::cdiv(n, BR), mixed_widths, tg::in("x", x), tg::in("w", w),
                   tg::out("y", y, dy), tg::out("z", z, dz));
  reference<T> const ref(x, w);
  double const tol = std::is_same_v<T, float> ? 1e-5 : 1e-7; // s is narrowed to float
  for (int j = 0; j < d; ++j) {
    double gw = 0;
    for (int i = 0; i < n; ++i) {
      double const xi = x(i, j), wj = w(j), a = double(dy(i)) * ref.y[i] * 0.1;
      double const gx = a * (wj + xi) + double(dz(i, j)) * (wj * xi + ref.r[i * d + j]);
      ASSERT_NEAR(g["x"](i, j), gx, tol * (1 + std::abs(gx))) << "dx(" << i << ", " << j << ")";
      gw += a * xi + double(dz(i, j)) * xi * xi;
    }
    ASSERT_NEAR(g["w"](j), gw, tol * n * (1 + std::abs(gw))) << "dw(" << j << ")";
  }
}

TYPED_TEST(WidthConversions, TangentsThroughEveryConversion) {
  using T = TypeParam;
  tg::owned_tensor<T> x({n, d}, "x"), w({d}, "w"), y({n}, "y"), z({n, d}, "z");
  tg::owned_tensor<T> ux({n, d}, "ux"), uw({d}, "uw");
  fill(x, 7), fill(w, 8), fill(ux, 9), fill(uw, 10);
  auto const t =
      tg::jvp(tg::cdiv(n, BR), mixed_widths, tg::tangent_in("x", x, ux), tg::tangent_in("w", w, uw),
              tg::tangent_out("y", y), tg::tangent_out("z", z));
  reference<T> const ref(x, w);
  double const tol = std::is_same_v<T, float> ? 1e-5 : 1e-7;
  for (int i = 0; i < n; ++i) {
    double ds = 0;
    for (int j = 0; j < d; ++j) {
      double const xi = x(i, j), wj = w(j), dx = ux(i, j), dw = uw(j);
      ds += dx * wj + xi * dw + xi * dx;
      double const dz = (dx * wj + xi * dw) * xi + ref.r[i * d + j] * dx;
      ASSERT_NEAR(t["z"](i, j), dz, tol * (1 + std::abs(dz)))
          << "tangent of z(" << i << ", " << j << ")";
    }
    ASSERT_NEAR(t["y"](i), ref.y[i] * 0.1 * ds, tol * (1 + ref.y[i] * std::abs(ds)))
        << "tangent of y(" << i << ")";
  }
}


// A bf16 load assigned to a tile of fp32<T> widens implicitly, as float to double does (it did not
// compile: bf16 had no promotion with float, and the error spoke of std::common_type). x is the
// launch's float type, s a bf16 scale beside it; y = 2 x s + s, s read through pointers under a
// mask whose `other` fills the tail, and through a block pointer; then s times x as bf16 and
// T tiles.
constexpr int BS = 16;
constexpr auto scaled_by_bf16 = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                            tg::tensor<tg::bf16 const> s, tg::tensor<T> y) {
  auto const c = p.program_id(0) * BS + tg::arange<0, BS>();
  auto const m = c < x.size(0);
  tg::tile<tg::fp32<T>, BS> const a = tg::load(s + c, m, 0.25f);
  tg::tile<tg::fp32<T>, BS> const b =
      tg::load(tg::make_block_ptr<BS>(s, {p.program_id(0) * BS}), tg::bounds<0>);
  tg::tile<tg::fp32<T>, BS> const xv = tg::load(x + c, m);
  // bf16 meets the kernel's type in an expression as float would (it did not compile: no common
  // type of bf16 and float).
  tg::store(y + c, tg::to<T>(xv * a + b + tg::load(s + c, m, 0.25f) * tg::load(x + c, m)), m);
};

TYPED_TEST(WidthConversions, ABf16LoadWidensIntoAFp32Tile) {
  using T = TypeParam;
  int const m = 37; // not a multiple of 16
  tg::owned_tensor<T> x({m}, "x"), y({m}, "y"), dy({m}, "dy"), ux({m}, "ux");
  tg::owned_tensor<tg::bf16> s({m}, "s");
  fill(x, 11), fill(dy, 12), fill(ux, 13);
  for (int i = 0; i < m; ++i)
    s(i) = tg::bf16(0.1f * static_cast<float>(i) - 1.7f);
  tg::launch(tg::cdiv(m, BS), scaled_by_bf16, x.cview(), s.cview(), y.view());
  for (int i = 0; i < m; ++i) {
    double const si = static_cast<double>(static_cast<float>(s(i)));
    ASSERT_NEAR(y(i), 2 * double(x(i)) * si + si, 1e-6) << "y(" << i << ")";
  }
  auto const g =
      tg::vjp(tg::cdiv(m, BS), scaled_by_bf16, tg::in("x", x), s.cview(), tg::out("y", y, dy));
  auto const t = tg::jvp(tg::cdiv(m, BS), scaled_by_bf16, tg::tangent_in("x", x, ux), s.cview(),
                         tg::tangent_out("y", y));
  for (int i = 0; i < m; ++i) {
    double const si = static_cast<double>(static_cast<float>(s(i)));
    ASSERT_NEAR(g["x"](i), 2 * double(dy(i)) * si, 1e-6) << "dx(" << i << ")";
    ASSERT_NEAR(t["y"](i), 2 * double(ux(i)) * si, 1e-6) << "dy(" << i << ")";
  }
}

} // namespace

} // namespace test_width_conversions
