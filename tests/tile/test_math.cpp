// The math table of tile/elementwise.hpp (exp exp2 log log2 sqrt rsqrt abs sin cos sigmoid tanh
// erf maximum minimum fma) against the std:: functions, element by element. xsimd's vector math
// is not bit-identical to libm, so transcendental results are compared with a relative
// tolerance of a few ulp (tg_test::math_rtol); exact operations are compared exactly.
#include "../support/reference.hpp"

#include <cmath>
#include <limits>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_math {

namespace {

using namespace tilegrad;
using tg_test::expect_eq;
using tg_test::expect_near;
using tg_test::from_flat;
using tg_test::make_rng;

template <class T>
class Math : public ::testing::Test {};
using FloatTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(Math, FloatTypes);

// Each unary function on inputs uniform in its domain [lo, hi]. `floor` makes the tolerance
// absolute (rtol * floor) where the function crosses zero inside the range.
template <class T, int... Ns>
void check_unary_functions() {
  using tl = tile<T, Ns...>;
  auto rng = make_rng(tl::size);
  tl x;
  // f (on the tile) against ref (std::, on each element) for x uniform in [lo, hi].
  auto check = [&](char const* what, double lo, double hi, double floor, auto f, auto ref) {
    tg_test::fill_uniform(x, rng, lo, hi);
    tl const got = f(x);
    expect_near(got, from_flat<tl>([&](int i) { return ref(x.data()[i]); }), tg_test::math_rtol<T>,
                floor, what);
  };
  check(
      "exp", -20, 20, 0, [](tl const& t) { return tl(exp(t)); }, [](T v) { return std::exp(v); });
  check(
      "exp2", -30, 30, 0, [](tl const& t) { return tl(exp2(t)); },
      [](T v) { return std::exp2(v); });
  check(
      "log", 1e-3, 1e3, 1, [](tl const& t) { return tl(log(t)); }, [](T v) { return std::log(v); });
  check(
      "log2", 1e-3, 1e3, 1, [](tl const& t) { return tl(log2(t)); },
      [](T v) { return std::log2(v); });
  check(
      "sqrt", 0, 1e3, 0, [](tl const& t) { return tl(sqrt(t)); }, [](T v) { return std::sqrt(v); });
  check(
      "rsqrt", 1e-3, 1e3, 0, [](tl const& t) { return tl(rsqrt(t)); },
      [](T v) { return T(1) / std::sqrt(v); });
  check(
      "abs", -10, 10, 0, [](tl const& t) { return tl(abs(t)); }, [](T v) { return std::abs(v); });
  check(
      "sin", -10, 10, 1, [](tl const& t) { return tl(sin(t)); }, [](T v) { return std::sin(v); });
  check(
      "cos", -10, 10, 1, [](tl const& t) { return tl(cos(t)); }, [](T v) { return std::cos(v); });
  check(
      "sigmoid", -20, 20, 0, [](tl const& t) { return tl(sigmoid(t)); },
      [](T v) { return T(1) / (T(1) + std::exp(-v)); });
  check(
      "tanh", -10, 10, 0, [](tl const& t) { return tl(tanh(t)); },
      [](T v) { return std::tanh(v); });
  check(
      "erf", -4, 4, 0, [](tl const& t) { return tl(erf(t)); }, [](T v) { return std::erf(v); });
  // Small arguments, where relative accuracy is hardest to keep.
  check(
      "tanh (small x)", -1e-3, 1e-3, 0, [](tl const& t) { return tl(tanh(t)); },
      [](T v) { return std::tanh(v); });
  check(
      "erf (small x)", -1e-3, 1e-3, 0, [](tl const& t) { return tl(erf(t)); },
      [](T v) { return std::erf(v); });
}

template <class T, int... Ns>
void check_binary_functions() {
  using tl = tile<T, Ns...>;
  auto rng = make_rng(tl::size + 1);
  tl a, b, c;
  tg_test::fill_uniform(a, rng, 0.5, 2);
  tg_test::fill_uniform(b, rng, -2, -0.5);
  tg_test::fill_uniform(c, rng, -2, -0.5);
  T const* A = a.data();
  T const* B = b.data();
  T const* C = c.data();
  // a * b and c share their sign: no cancellation, so an unfused a * b + c (xsimd's fma on a
  // target without FMA instructions) stays within two ulp of the fused result.
  expect_near(tl(fma(a, b, c)), from_flat<tl>([&](int i) { return std::fma(A[i], B[i], C[i]); }),
              4 * std::numeric_limits<T>::epsilon(), 0, "fma(a, b, c)");
  expect_near(tl(fma(a, T(-3), c)),
              from_flat<tl>([&](int i) { return std::fma(A[i], T(-3), C[i]); }),
              4 * std::numeric_limits<T>::epsilon(), 0, "fma(a, -3, c)");

  tg_test::fill_uniform(b, rng, -2, 2);
  for (int i = 0; i < tl::size; i += 5)
    b.data()[i] = a.data()[i]; // ties
  expect_eq(tl(maximum(a, b)), from_flat<tl>([&](int i) { return std::max(A[i], B[i]); }),
            "maximum(a, b)");
  expect_eq(tl(minimum(a, b)), from_flat<tl>([&](int i) { return std::min(A[i], B[i]); }),
            "minimum(a, b)");
  expect_eq(tl(maximum(b, 0.0)), from_flat<tl>([&](int i) { return std::max(B[i], T(0)); }),
            "maximum(b, 0.0)");
  expect_eq(tl(minimum(1, b)), from_flat<tl>([&](int i) { return std::min(T(1), B[i]); }),
            "minimum(1, b)");
}

TYPED_TEST(Math, UnaryFunctions) {
  check_unary_functions<TypeParam, 5, 37>();
  check_unary_functions<TypeParam, 3, 4, 19>();
}

TYPED_TEST(Math, BinaryAndTernaryFunctions) {
  check_binary_functions<TypeParam, 1>();
  check_binary_functions<TypeParam, 5, 37>();
  check_binary_functions<TypeParam, 3, 4, 19>();
}

// A composite of several functions in one fused loop, on the remaining shapes.
template <class T, int... Ns>
void check_composite() {
  using tl = tile<T, Ns...>;
  auto rng = make_rng(tl::size + 2);
  tl a, b;
  tg_test::fill_uniform(a, rng, -3, 3);
  tg_test::fill_uniform(b, rng, 0.25, 4);
  T const* A = a.data();
  T const* B = b.data();
  expect_near(tl(exp(sin(a)) * sqrt(b) - tanh(a) / log2(b + 1) + sigmoid(-a)),
              from_flat<tl>([&](int i) {
                return std::exp(std::sin(A[i])) * std::sqrt(B[i]) -
                       std::tanh(A[i]) / std::log2(B[i] + 1) + T(1) / (T(1) + std::exp(A[i]));
              }),
              4 * tg_test::math_rtol<T>, 1, "composite");
}

TYPED_TEST(Math, CompositeExpression) {
  check_composite<TypeParam, 1>();
  check_composite<TypeParam, 3>();
  check_composite<TypeParam, 7, 5>();
  check_composite<TypeParam, 64, 64>();
}

// IEEE special values (infinities, signed zeros, overflow, NaN out of the domain) come through
// as libm gives them.
template <class T>
void expect_special(T got, T want, char const* what, int i) {
  if (std::isnan(want))
    EXPECT_TRUE(std::isnan(got)) << what << " at (" << i << "): got " << got;
  else if (std::isinf(want) || want == 0)
    EXPECT_EQ(got, want) << what << " at (" << i << ")";
  else
    EXPECT_NEAR(got, want, tg_test::math_rtol<T> * std::abs(want)) << what << " at (" << i << ")";
}

TYPED_TEST(Math, SpecialValues) {
  using T = TypeParam;
  constexpr T inf = std::numeric_limits<T>::infinity();
  constexpr int n = 11;
  T const v[n] = {-inf, -1000, -1, T(-0.0), 0, T(1e-30), 1, 1000, inf, T(-1e-20), T(0.5)};
  tile<T, n> x;
  for (int i = 0; i < n; ++i)
    x(i) = v[i];
  tile<T, n> const e = exp(x), sg = sigmoid(x), th = tanh(x), ab = abs(x), sq = sqrt(x),
                   lg = log(x), ef = erf(x);
  for (int i = 0; i < n; ++i) {
    expect_special(e(i), std::exp(v[i]), "exp", i);
    expect_special(sg(i), T(1) / (T(1) + std::exp(-v[i])), "sigmoid", i);
    expect_special(th(i), std::tanh(v[i]), "tanh", i);
    expect_special(ab(i), std::abs(v[i]), "abs", i);
    expect_special(sq(i), std::sqrt(v[i]), "sqrt", i);
    expect_special(lg(i), std::log(v[i]), "log", i);
    expect_special(ef(i), std::erf(v[i]), "erf", i);
  }
}

// exp on vector lanes (a tile of 48 floats: three vectors of 16 on AVX-512) at the ends of the
// float range, against e^x in double rounded to float: inf past 88.7228, finite below it; the
// subnormal results between -87.34 and -103.97 within the smallest subnormal; 0 below; NaN and
// the infinities as libm gives them.
// exp of floats at the ends of the range, on 16-lane vectors (exp16 on AVX-512), and on the
// 8-lane vectors of a float expression inside a double one (exp(x) into a double tile, a double
// sum of float exps, sigmoid there), whose lanes were xsimd's: inf at 88.5, 0 at -88.
TEST(MathFloat, ExpOnVectorLanesAtTheEndsOfTheRange) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  constexpr float nan = std::numeric_limits<float>::quiet_NaN();
  float const v[] = {-inf,   inf,    nan,     0.0f,     -0.0f,  1000,    -1000,   88.0f,
                     88.5f,  88.7f,  88.72f,  88.7228f, 88.73f, 89.0f,   100.0f,  -87.0f,
                     -87.3f, -87.5f, -90.0f,  -95.5f,   -100,   -102.5f, -103.2f, -103.9f,
                     -104.0f, -104.5f, -110,  1e-30f,   -1e-30f, 0.5f,   -0.5f,   1,
                     -1,     10,     -10,     20.5f,    -20.5f, 40,      -40,     60,
                     -60,    70.25f, -70.25f, 80,       -80,    85,      -85,     87.5f};
  constexpr int n = 48;
  static_assert(sizeof v / sizeof v[0] == n);
  tile<float, n> x;
  for (int i = 0; i < n; ++i)
    x(i) = v[i];
  tile<float, n> const e = exp(x);
  tile<double, n> const in_double = exp(x);
  tile<double, n> const sig_in_double = sigmoid(x);
  auto expect = [](double got, float want, char const* what, float at) {
    if (std::isnan(want))
      EXPECT_TRUE(std::isnan(got)) << what << "(" << at << ") = " << got;
    else if (std::isinf(want) || want == 0)
      EXPECT_EQ(got, want) << what << "(" << at << ")";
    else if (want < std::numeric_limits<float>::min())
      EXPECT_NEAR(got, want, std::numeric_limits<float>::denorm_min()) << what << "(" << at << ")";
    else
      EXPECT_NEAR(got, want, tg_test::math_rtol<float> * want) << what << "(" << at << ")";
  };
  for (int i = 0; i < n; ++i) {
    double const x64 = static_cast<double>(v[i]);
    float const want = static_cast<float>(std::exp(x64));
    expect(e(i), want, "exp", v[i]);
    expect(in_double(i), want, "exp into a double tile", v[i]);
    float const s = static_cast<float>(x64 >= 0 ? 1 / (1 + std::exp(-x64))
                                                : std::exp(x64) / (1 + std::exp(x64)));
    if (!std::isnan(x64))
      expect(sig_in_double(i), s, "sigmoid into a double tile", v[i]);
  }
  tile<double, 8> const big = exp(tile<float, 8>(88.5f)), small = exp(tile<float, 8>(-88.0f));
  EXPECT_EQ(big(3), static_cast<double>(static_cast<float>(std::exp(88.5))));
  EXPECT_NEAR(small(3), std::exp(-88.0), std::numeric_limits<float>::denorm_min());
}

// Double erf on vector lanes far from 0, where it is +-1: xsimd's was NaN past about 9.6e61.
TEST(MathDouble, ErfFarFromZeroOnVectorLanes) {
  constexpr int n = 19;
  double const v[n] = {6.0,    -6.0,  6.5,    1e10, -1e10, 1e61, 9.6e61, -9.6e61, 1e62, 1e200,
                       -1e300, 1e308, -1e308, 0.5,  -0.5,  3.0,  5.9,    1e-300,  0.0};
  tile<double, n> x;
  for (int i = 0; i < n; ++i)
    x(i) = v[i];
  tile<double, n> const e = erf(x);
  for (int i = 0; i < n; ++i)
    EXPECT_NEAR(e(i), std::erf(v[i]), 256 * std::numeric_limits<double>::epsilon())
        << "erf(" << v[i] << ")";
  tile<double, n> const inf_lanes = erf(x * std::numeric_limits<double>::infinity());
  EXPECT_EQ(inf_lanes(0), 1.0);
  EXPECT_EQ(inf_lanes(1), -1.0);
}

// Double erf on vector lanes and the scalar tail against erf in long double, over [-6, 6]
// (past 6 it is +-1 to double's precision) and densely around 0.48 and 2.2: within 1 ulp of the
// exact value rounded to double (the C library's own erf). xsimd's was 68 ulp off near 2.2 and 24
// near 0.48, and a float64 reference that took it failed a correct backward using std::erf.
TEST(MathDouble, ErfWithinAnUlpOfLongDouble) {
  constexpr int n = 1003; // vectors and a tail
  auto rng = make_rng(n);
  std::uniform_real_distribution<double> jitter(-0.5, 0.5);
  tile<double, n> x;
  double worst = 0, worst_at = 0;
  auto check = [&] {
    tile<double, n> const e = erf(x);
    for (int i = 0; i < n; ++i) {
      long double const want = std::erf(static_cast<long double>(x(i)));
      double const w = static_cast<double>(want);
      double const ulp = std::nextafter(std::abs(w), 2.0) - std::abs(w);
      double const err = static_cast<double>(std::abs(static_cast<long double>(e(i)) - want)) /
                         (w == 0 ? std::numeric_limits<double>::denorm_min() : ulp);
      if (!(err <= worst)) {
        worst = err;
        worst_at = x(i);
      }
    }
  };
  // [-6, 6] in steps of 12 / 120,360, each point moved by up to half a step
  for (int chunk = 0; chunk < 120; ++chunk) {
    for (int i = 0; i < n; ++i)
      x(i) = -6.0 + 12.0 * ((chunk * n + i) + jitter(rng)) / (120.0 * n);
    check();
  }
  for (double const at : {0.48, -0.48, 2.2, -2.2, 0.65, 0.84375, 1.25, 2.857}) {
    for (int i = 0; i < n; ++i)
      x(i) = at + 1e-3 * (i - n / 2 + jitter(rng)) / n;
    check();
  }
  for (int i = 0; i < n; ++i) // small arguments, down to the subnormals
    x(i) = (i % 2 ? -1 : 1) * std::ldexp(1.0 + jitter(rng), -(i % 1080));
  check();
  EXPECT_LE(worst, 1.0) << "erf(" << worst_at << ") is " << worst << " ulp off";
}

// exp2 on vector lanes through the top binade, where 2^x is still finite (2^127.99 in float,
// 2^1023.99 in double), and past it; against std::exp2.
template <class F>
void expect_exp2_at_the_top() {
  constexpr int top = std::numeric_limits<F>::max_exponent; // 128 or 1024
  F const v[] = {F(top - 3), F(top - 2),   F(top - 1.5),  F(top - 1),   F(top - 0.5), F(top - 0.01),
                 F(top),     F(top + 0.5), F(-top + 2),   F(0.5),       F(-0.5),      F(1),
                 F(10.25),   F(-10.25),    F(top - 1.25), F(top - 1.75)};
  constexpr int n = sizeof v / sizeof v[0];
  tile<F, n> x;
  for (int i = 0; i < n; ++i)
    x(i) = v[i];
  tile<F, n> const e = exp2(x);
  for (int i = 0; i < n; ++i) {
    F const want = std::exp2(v[i]);
    if (std::isinf(want))
      EXPECT_EQ(e(i), want) << "exp2(" << v[i] << ")";
    else
      EXPECT_NEAR(e(i), want, tg_test::math_rtol<F> * want) << "exp2(" << v[i] << ")";
  }
}

TEST(MathFloat, Exp2OnVectorLanesThroughTheTopBinade) {
  expect_exp2_at_the_top<float>();
  expect_exp2_at_the_top<double>();
}

// exp2 whose results are subnormal (2^-126 down to 2^-149 in float, 2^-1022 to 2^-1074 in
// double): on AVX-512, xsimd's exp2 gave 0 on the 16 lanes of a batch and the right value in the
// scalar tail, so one tile's answer depended on the lane. 19 lanes: a batch and a tail.
template <class F>
void expect_exp2_at_the_bottom() {
  constexpr int low = std::numeric_limits<F>::min_exponent - 1; // -126 or -1022
  constexpr int digits = std::numeric_limits<F>::digits;       // 24 or 53
  constexpr int n = 19;
  F const steps[n] = {F(0.5), F(1),  F(2),  F(3.25), F(4), F(7.5), F(10),  F(12.75), F(16), F(20),
                      F(23),  F(23.5), F(24.5), F(30), F(-1), F(0), F(0.25), F(digits - 1),
                      F(digits - 0.25)};
  tile<F, n> x;
  for (int i = 0; i < n; ++i)
    x(i) = F(low) - steps[i];
  tile<F, n> const e = exp2(x);
  for (int i = 0; i < n; ++i) {
    F const want = std::exp2(x(i));
    // One rounding more than std::exp2's, into the subnormal: at most one step of the smallest.
    EXPECT_NEAR(e(i), want, std::numeric_limits<F>::denorm_min() + tg_test::math_rtol<F> * want)
        << "exp2(" << x(i) << ") on lane " << i;
  }
}

TEST(MathFloat, Exp2WithSubnormalResultsOnVectorLanesAndTails) {
  expect_exp2_at_the_bottom<float>();
  expect_exp2_at_the_bottom<double>();
}

// Double exp, log and log2 on vector lanes at the ends of the double range, against libm: xsimd's
// exp gave inf for exp(709.7) (1.65e308) and 0 for the subnormal results (exp(-709)), its log
// -746.5 for log(1e-310) (-713.8), each only on the lanes of a batch: the scalar tail of the
// same tile was right. 19 lanes: a batch and a tail.
TEST(MathDouble, ExpAndLogOnVectorLanesAtTheEndsOfTheRange) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  constexpr double tiny = std::numeric_limits<double>::denorm_min();
  double const e_in[] = {709.0,  709.5,  709.7,  709.78, 709.8, 710,   -708,   -708.5, -709,   -720,
                         -730.5, -744.4, -745.2, -746,  0.5,   -0.5,  inf,    -inf,   -707.9};
  double const l_in[] = {1e-310, 4.9e-324, 2.2e-308, 1e-320, 3e-315, 1e-300, 0.5, 2, 1e300,
                         0,      inf,      7e-311,   1.5e-309, 2.5e-322, 1,  1e-308, 5e-324,
                         2.225e-308, 3};
  constexpr int n = 19;
  static_assert(sizeof e_in / sizeof e_in[0] == n && sizeof l_in / sizeof l_in[0] == n);
  tile<double, n> x, y;
  for (int i = 0; i < n; ++i) {
    x(i) = e_in[i];
    y(i) = l_in[i];
  }
  tile<double, n> const e = exp(x), l = log(y), l2 = log2(y);
  auto expect = [](double got, double want, char const* what, double at) {
    if (std::isinf(want) || want == 0)
      EXPECT_EQ(got, want) << what << "(" << at << ")";
    else if (std::abs(want) < std::numeric_limits<double>::min())
      EXPECT_NEAR(got, want, 2 * tiny) << what << "(" << at << ")";
    else
      EXPECT_NEAR(got, want, tg_test::math_rtol<double> * std::abs(want))
          << what << "(" << at << ")";
  };
  for (int i = 0; i < n; ++i) {
    expect(e(i), std::exp(e_in[i]), "exp", e_in[i]);
    expect(l(i), std::log(l_in[i]), "log", l_in[i]);
    expect(l2(i), std::log2(l_in[i]), "log2", l_in[i]);
  }
}

} // namespace

} // namespace test_math
