// dual<T, N> numbers: every scalar operation against the plain scalar function (value) and
// central differences in double (tangents), with random non-unit seeds, for float and double,
// N = 1 and N = 3; then dual tiles through elementwise expressions, broadcasting, reductions,
// cumsum and dot, on shapes that do not divide the SIMD width, against the double tile path
// (values) and central differences of that same path (tangents).
#include "../support/reference.hpp"

#include <tilegrad/ad/dual.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_dual {

namespace {

namespace tg = tilegrad;
using tg::dual;

// The double spellings of the functions dual (and the tile algebra) provide under these names,
// so one generic lambda serves double (for the differences) and dual (found by ADL).
using std::abs, std::cos, std::erf, std::exp, std::exp2, std::fma, std::fmod, std::log, std::log2,
    std::sin, std::sqrt, std::tanh;
double rsqrt(double x) {
  return 1 / std::sqrt(x);
}
double sigmoid(double x) {
  return 1 / (1 + std::exp(-x));
}
double maximum(double a, double b) {
  return b > a ? b : a;
}
double minimum(double a, double b) {
  return b < a ? b : a;
}
double where(bool c, double a, double b) {
  return c ? a : b;
}

template <class D>
class DualScalar : public ::testing::Test {};
using DualTypes =
    ::testing::Types<dual<float, 1>, dual<float, 3>, dual<double, 1>, dual<double, 3>>;
TYPED_TEST_SUITE(DualScalar, DualTypes);

template <class D>
constexpr double value_rtol = std::is_same_v<typename D::primal_type, float> ? 1e-6 : 1e-15;
// A tangent in T against a central difference in double (step 1e-5: error ~1e-10 relative).
template <class D>
constexpr double tangent_rtol = std::is_same_v<typename D::primal_type, float> ? 2e-5 : 1e-8;

bool near(double got, double want, double rtol) {
  return std::abs(got - want) <= rtol * (1 + std::abs(want));
}

// Seeds of magnitude 0.3 to 2, either sign: a tangent missing a chain factor cannot pass.
double seed(std::mt19937_64& rng) {
  double const m = std::uniform_real_distribution<double>(0.3, 2)(rng);
  return std::bernoulli_distribution(0.5)(rng) ? -m : m;
}

template <class D>
D make(double v, std::mt19937_64& rng) {
  D x(static_cast<typename D::primal_type>(v));
  for (int k = 0; k < D::directions; ++k)
    x.d[k] = static_cast<typename D::primal_type>(seed(rng));
  return x;
}

// f applied to duals: the value against f on the values (in T), the tangent along every
// direction against (f(x + h u) - f(x - h u)) / 2h in double.
template <class D, class F, class... Args>
void check_op_at(char const* name, F&& f, Args const&... x) {
  using T = typename D::primal_type;
  D const y = f(x...);
  T const plain = static_cast<T>(f(static_cast<T>(x.v)...));
  EXPECT_TRUE(near(y.v, plain, value_rtol<D>))
      << name << ": value " << y.v << ", the plain function " << plain;
  constexpr double h = 1e-5;
  for (int k = 0; k < D::directions; ++k) {
    double const fd =
        (f((double(x.v) + h * double(x.d[k]))...) - f((double(x.v) - h * double(x.d[k]))...)) /
        (2 * h);
    EXPECT_TRUE(near(y.d[k], fd, tangent_rtol<D>))
        << name << ": tangent " << k << " is " << y.d[k] << ", central difference " << fd << " (at "
        << ((std::to_string(double(x.v)) + " ") + ...) << ")";
  }
}

template <class D, class... Args, class F>
void check_op(char const* name, std::tuple<Args...> const& args, F&& f) {
  std::apply([&](auto const&... x) { check_op_at<D>(name, f, x...); }, args);
}

TYPED_TEST(DualScalar, UnaryOpsMatchValuesAndCentralDifferences) {
  using D = TypeParam;
  auto rng = tg_test::make_rng(11);
  std::uniform_real_distribution<double> any(-2.5, 2.5), positive(0.2, 4);
  for (int rep = 0; rep < 8; ++rep) {
    D const a = make<D>(any(rng), rng);
    D const p = make<D>(positive(rng), rng);
    check_op<D>("exp", std::tuple(a), [](auto x) { return exp(x); });
    check_op<D>("exp2", std::tuple(a), [](auto x) { return exp2(x); });
    check_op<D>("log", std::tuple(p), [](auto x) { return log(x); });
    check_op<D>("log2", std::tuple(p), [](auto x) { return log2(x); });
    check_op<D>("sqrt", std::tuple(p), [](auto x) { return sqrt(x); });
    check_op<D>("rsqrt", std::tuple(p), [](auto x) { return rsqrt(x); });
    check_op<D>("abs", std::tuple(a), [](auto x) { return abs(x); });
    check_op<D>("sin", std::tuple(a), [](auto x) { return sin(x); });
    check_op<D>("cos", std::tuple(a), [](auto x) { return cos(x); });
    check_op<D>("sigmoid", std::tuple(a), [](auto x) { return sigmoid(x); });
    check_op<D>("tanh", std::tuple(a), [](auto x) { return tanh(x); });
    check_op<D>("erf", std::tuple(a), [](auto x) { return erf(x); });
    check_op<D>("neg", std::tuple(a), [](auto x) { return -x; });
    check_op<D>("x * 3 - 1.5 / x", std::tuple(p), [](auto x) { return x * 3 - 1.5 / x; });
  }
}

TYPED_TEST(DualScalar, BinaryAndTernaryOpsMatchValuesAndCentralDifferences) {
  using D = TypeParam;
  auto rng = tg_test::make_rng(12);
  std::uniform_real_distribution<double> any(-2.5, 2.5), positive(0.5, 3);
  for (int rep = 0; rep < 8; ++rep) {
    D const a = make<D>(any(rng), rng);
    D const b = make<D>(positive(rng), rng);
    D const c = make<D>(any(rng), rng);
    check_op<D>("+", std::tuple(a, b), [](auto x, auto y) { return x + y; });
    check_op<D>("-", std::tuple(a, b), [](auto x, auto y) { return x - y; });
    check_op<D>("*", std::tuple(a, b), [](auto x, auto y) { return x * y; });
    check_op<D>("/", std::tuple(a, b), [](auto x, auto y) { return x / y; });
    check_op<D>("maximum", std::tuple(a, c), [](auto x, auto y) { return maximum(x, y); });
    check_op<D>("minimum", std::tuple(a, c), [](auto x, auto y) { return minimum(x, y); });
    check_op<D>("where", std::tuple(a, c),
                [](auto x, auto y) { return where(x < y, x * y, y - x); });
    check_op<D>("fma", std::tuple(a, b, c), [](auto x, auto y, auto z) { return fma(x, y, z); });
    check_op<D>("compound", std::tuple(a, b), [](auto x, auto y) {
      auto r = x;
      r += y;
      r *= x;
      r -= y;
      r /= y;
      return r;
    });
  }
  // fmod away from its jumps: a / b stays at least 0.1 from an integer.
  for (int rep = 0; rep < 8; ++rep) {
    D const b = make<D>(positive(rng), rng);
    double const q = std::uniform_int_distribution<int>(-4, 4)(rng) +
                     std::uniform_real_distribution<double>(0.1, 0.9)(rng);
    D const a = make<D>(q * double(b.v), rng);
    check_op<D>("fmod", std::tuple(a, b), [](auto x, auto y) { return fmod(x, y); });
  }
}

TYPED_TEST(DualScalar, ComparisonsAndConversions) {
  using D = TypeParam;
  using T = typename D::primal_type;
  auto rng = tg_test::make_rng(13);
  D a = make<D>(1.25, rng);
  D b = make<D>(1.25, rng); // same value, other tangents
  EXPECT_TRUE(a == b && a <= b && a >= b && !(a < b) && !(a != b)) << "compare values only";
  b.v = 2;
  EXPECT_TRUE(a < b && a != b && b > a && !(b <= a));
  // Numbers convert with zero tangents; back to a number, the value.
  D const two = 2.0;
  EXPECT_EQ(two.v, T(2));
  for (int k = 0; k < D::directions; ++k)
    EXPECT_EQ(two.d[k], T(0));
  EXPECT_EQ(static_cast<double>(a), double(a.v));
  EXPECT_EQ(static_cast<int>(b), 2);
  D const s = a * 2 + 1; // mixed with plain numbers
  for (int k = 0; k < D::directions; ++k)
    EXPECT_EQ(s.d[k], 2 * a.d[k]);
  // dual<float> <-> dual<double>: every tangent converts, float -> double implicitly.
  using F = dual<float, D::directions>;
  using W = dual<double, D::directions>;
  W const wide = F(static_cast<F>(a));
  F const narrow = static_cast<F>(W(wide) / 3.0);
  for (int k = 0; k < D::directions; ++k) {
    EXPECT_EQ(wide.d[k], double(static_cast<float>(a.d[k])));
    EXPECT_EQ(narrow.d[k], static_cast<float>(wide.d[k] / 3.0));
  }
  static_assert(std::is_convertible_v<F, W> && !std::is_convertible_v<W, F>);
  static_assert(std::is_trivially_copyable_v<D> && std::is_standard_layout_v<D>);
  static_assert(sizeof(D) == (D::directions + 1) * sizeof(T));
  static_assert(std::is_same_v<tg::fp32<D>, D>, "fp32 in forward mode is the dual itself");
  static_assert(tg::dual_scalar<D const&> && !tg::dual_scalar<T>);
  // A double tile widens a dual<float> tile to dual<double>, as double widens float.
  static_assert(std::is_same_v<tg::promote_t<D, double>, W> &&
                std::is_same_v<tg::promote_t<D, float>, D> &&
                std::is_same_v<tg::promote_t<F, W>, W>);
  // NaN and infinity carry zero tangents (padding values).
  D const nan = std::numeric_limits<D>::quiet_NaN();
  EXPECT_TRUE(std::isnan(nan.v));
  EXPECT_EQ(std::numeric_limits<D>::infinity().v, std::numeric_limits<T>::infinity());
  for (int k = 0; k < D::directions; ++k)
    EXPECT_EQ(nan.d[k], T(0));
}

TEST(DualScalar, TiesAndKinks) {
  // maximum/minimum keep the first operand on ties, abs has derivative 0 at 0: the conventions
  // reverse mode uses, so forward and reverse agree at these points too.
  dual<double, 2> a(1.0), b(1.0), z(0.0);
  a.d[0] = 3, a.d[1] = 4, b.d[0] = -5, b.d[1] = 6, z.d[0] = 7, z.d[1] = 8;
  EXPECT_EQ(maximum(a, b).d[0], 3);
  EXPECT_EQ(minimum(b, a).d[1], 6);
  EXPECT_EQ(abs(z).d[0], 0);
  EXPECT_EQ(abs(-a).d[1], 4);
}

TEST(DualScalar, AZeroTangentContributesZeroWhateverTheValue) {
  // Constants (tangent 0) at -inf, 0 or NaN meet a constant 1 (a masked lane's `other`) and a
  // value with tangents: each term whose tangent is 0 adds exactly 0, as a zero adjoint does in
  // reverse mode (not -inf * 0 = NaN); the term of the value with tangents stays.
  double const inf = std::numeric_limits<double>::infinity();
  dual<double, 2> w(0.75), one(1.0), m(-inf), z(0.0), n(std::numeric_limits<double>::quiet_NaN());
  w.d[0] = 2, w.d[1] = -3;
  for (auto const& c : {m, z, n}) {
    auto const p = c * one, q = one * c, r = c / one, f = fma(c, one, w);
    auto const cw = c * w, wc = w * c;
    for (int k = 0; k < 2; ++k) {
      EXPECT_EQ(p.d[k], 0) << c.v << " " << k;
      EXPECT_EQ(q.d[k], 0) << c.v << " " << k;
      EXPECT_EQ(r.d[k], 0) << c.v << " " << k;
      EXPECT_EQ(f.d[k], w.d[k]) << c.v << " " << k; // the product's terms drop, c's stays
      double const want = c.v * w.d[k];             // c's own term only: -inf, 0 or NaN
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(cw.d[k]) && std::isnan(wc.d[k])) << k;
      } else {
        EXPECT_EQ(cw.d[k], want) << c.v << " " << k;
        EXPECT_EQ(wc.d[k], want) << c.v << " " << k;
      }
    }
  }
  // Dividing a value with tangents by a constant 0, or a constant by a constant 0.
  EXPECT_EQ((z / z).d[0], 0);
  EXPECT_TRUE(std::isinf((w / z).d[0])); // w's own tangent over 0: inf, as the math says
  // Unary rules whose derivative is infinite or NaN there: log and sqrt at 0, exp and log at -inf.
  for (auto const& y : {log(z), sqrt(z), exp(m), log(m), rsqrt(z)})
    for (int k = 0; k < 2; ++k) EXPECT_EQ(y.d[k], 0);
  // Values with tangents are unchanged: the product and quotient rules as before.
  dual<double, 2> a(1.5);
  a.d[0] = 0.25, a.d[1] = -1;
  EXPECT_EQ((a * w).d[1], -1 * 0.75 + 1.5 * -3);
  EXPECT_DOUBLE_EQ((a / w).d[0], (0.25 - (1.5 / 0.75) * 2) / 0.75);
}

// ---------------------------------------------------------------------------------------------
// Dual tiles
// ---------------------------------------------------------------------------------------------

constexpr int K = 3; // directions of the tile tests
using DD = dual<double, K>;

template <int... Ns>
tg::tile<DD, Ns...> with_tangents(tg::tile<double, Ns...> const& v,
                                  std::array<tg::tile<double, Ns...>, K> const& u) {
  tg::tile<DD, Ns...> r;
  for (int i = 0; i < r.size; ++i) {
    r.data()[i].v = v.data()[i];
    for (int k = 0; k < K; ++k)
      r.data()[i].d[k] = u[k].data()[i];
  }
  return r;
}

template <int... Ns>
struct input {
  tg::tile<double, Ns...> v;
  std::array<tg::tile<double, Ns...>, K> u;
  tg::tile<DD, Ns...> dual_tile() const { return with_tangents(v, u); }
  tg::tile<double, Ns...> moved(int k, double h) const {
    return v + h * u[static_cast<std::size_t>(k)];
  }
};

template <int... Ns>
input<Ns...> random_input(std::uint64_t salt, double lo, double hi) {
  auto rng = tg_test::make_rng(salt);
  input<Ns...> in;
  tg_test::fill_uniform(in.v, rng, lo, hi);
  for (auto& t : in.u)
    tg_test::fill_away_from_zero(t, rng, 0.3, 2);
  return in;
}

// An expression evaluated into a tile of its own type and shape.
template <class E>
auto ev(E const& e) {
  return tg::detail::tile_t<tg::value_of_t<E>, tg::shape_of_t<E>>(e);
}

// f on dual tiles against f on double tiles (values) and central differences of f on double
// tiles (tangents). f returns a tile (or an expression, evaluated here).
template <class F, class... In>
void check_tiles(char const* what, F&& f, In const&... in) {
  auto const got = ev(f(in.dual_tile()...));
  auto const want = ev(f(in.v...));
  using R = decltype(want);
  static_assert(std::is_same_v<typename std::remove_cvref_t<decltype(got)>::value_type, DD>);
  constexpr double h = 1e-5;
  for (int i = 0; i < R::size; ++i)
    ASSERT_TRUE(near(got.data()[i].v, want.data()[i], 1e-13))
        << what << ": value at " << i << " is " << got.data()[i].v << ", want " << want.data()[i];
  for (int k = 0; k < K; ++k) {
    R const up = f(in.moved(k, h)...);
    R const down = f(in.moved(k, -h)...);
    for (int i = 0; i < R::size; ++i) {
      double const fd = (up.data()[i] - down.data()[i]) / (2 * h);
      ASSERT_TRUE(near(got.data()[i].d[k], fd, 1e-7))
          << what << ": tangent " << k << " at " << i << " is " << got.data()[i].d[k]
          << ", central difference " << fd;
    }
  }
}

TEST(DualTile, ElementwiseExpressionsOnShapesThatDoNotDivideTheSimdWidth) {
  auto const a = random_input<5, 7>(21, -2, 2);
  auto const p = random_input<5, 7>(22, 0.3, 3);
  check_tiles(
      "arithmetic",
      [](auto const& x, auto const& y) { return ev(x * y + x / y - x * 2.0 + 1 - (-y)); }, a, p);
  check_tiles(
      "math",
      [](auto const& x, auto const& y) {
        return ev(exp(x) * sin(y) + sqrt(y) - log(y) + tanh(x) * erf(x) - cos(x) / exp2(y) +
                  log2(y) * abs(x) + rsqrt(y) - sigmoid(x));
      },
      a, p);
  check_tiles(
      "where / maximum / minimum / fma",
      [](auto const& x, auto const& y) {
        return ev(where(x < y - 1, maximum(x, y - 1.5), minimum(x * x, y)) + fma(x, y, x));
      },
      a, p);
  auto const b = random_input<3, 13>(23, -2, 2);
  auto const c = random_input<3, 13>(24, -2, 2);
  check_tiles(
      "x % y away from its jumps",
      [](auto const& x, auto const& y) { return ev((x * 0.2 + 10.5) % (1 + 0.002 * y)); }, b, c);
}

TEST(DualTile, Broadcasting) {
  auto const u = random_input<5>(31, -2, 2);
  auto const v = random_input<13>(32, -2, 2);
  auto const m = random_input<5, 13>(33, -2, 2);
  check_tiles(
      "col(u) * row(v) + m",
      [](auto const& a, auto const& b, auto const& c) {
        using T = typename std::remove_cvref_t<decltype(a)>::value_type;
        return tg::tile<T, 5, 13>(col(a) * row(b) + c);
      },
      u, v, m);
  check_tiles(
      "trans(m) * col(v) - broadcast_to",
      [](auto const& c, auto const& b) {
        using T = typename std::remove_cvref_t<decltype(c)>::value_type;
        return tg::tile<T, 13, 5>(trans(c) * col(b) -
                                  tg::broadcast_to<13, 5>(reshape<1, 5>(sum<1>(c))));
      },
      m, v);
}

TEST(DualTile, ReductionsAndCumsum) {
  auto const x = random_input<3, 13>(41, -2, 2);
  auto const y = random_input<5, 7>(42, -2, 2);
  check_tiles(
      "sum<1>", [](auto const& t) { return sum<1>(t); }, x);
  check_tiles(
      "sum<0>, keep_dims", [](auto const& t) { return sum<0>(t * t, tg::keep_dims); }, x);
  check_tiles(
      "sum", [](auto const& t) { return sum(exp(t)); }, y);
  check_tiles(
      "max<1>", [](auto const& t) { return max<1>(t); }, x);
  check_tiles(
      "min<0>", [](auto const& t) { return min<0>(t * 3); }, y);
  check_tiles(
      "max", [](auto const& t) { return max(t); }, y);
  check_tiles(
      "cumsum<1>", [](auto const& t) { return cumsum<1>(t * t); }, x);
  check_tiles(
      "cumsum<0, reverse>", [](auto const& t) { return cumsum<0, true>(t); }, y);
  // Softmax along rows: the max subtracted for stability drops out of the tangent.
  check_tiles(
      "softmax",
      [](auto const& t) {
        using T = typename std::remove_cvref_t<decltype(t)>::value_type;
        tg::tile<T, 3, 13> const e = exp(t - col(max<1>(t)));
        return ev(e / col(sum<1>(e)));
      },
      x);
  // argmax/argmin look at values only.
  tg_test::expect_eq(argmax<1>(x.dual_tile()), argmax<1>(x.v), "argmax<1>");
  tg_test::expect_eq(argmin<0>(y.dual_tile()), argmin<0>(y.v), "argmin<0>");
}

TEST(DualTile, Dot) {
  auto const a = random_input<5, 7>(51, -2, 2);
  auto const b = random_input<7, 3>(52, -2, 2);
  auto const c = random_input<5, 3>(53, -2, 2);
  check_tiles(
      "dot(a, b)", [](auto const& x, auto const& y) { return dot(x, y); }, a, b);
  check_tiles(
      "dot(a, b, acc)", [](auto const& x, auto const& y, auto const& z) { return dot(x, y, z); }, a,
      b, c);
  check_tiles(
      "dot(a * a, trans(trans(b)))",
      [](auto const& x, auto const& y) { return dot(x * x, trans(trans(y))); }, a, b);
  static_assert(std::is_same_v<tg::value_of_t<decltype(dot(a.dual_tile(), b.dual_tile()))>, DD>);
}

// dot of dual tiles runs as products of planes (values, each direction's tangents) by the
// number type's kernel where every value and tangent is finite, else as the dual loop. Both
// against a plain loop of dual multiply-adds, at 64 x 64 x 64 (the vector kernel's blocks) and
// 13 x 70 x 9 (tails), with A read transposed, and with an infinite value whose tangent terms
// are 0 (a zero tangent times it), which the planes would make NaN.
template <class D, int M, int K2, int N, bool TransposeA>
void expect_dot_as_the_dual_loop(std::uint64_t salt, bool with_infinity) {
  using V = typename D::primal_type;
  constexpr int Dirs = D::directions;
  auto rng = tg_test::make_rng(salt);
  std::uniform_real_distribution<double> u(-2, 2);
  tg::tile<D, M, K2> a;
  tg::tile<D, K2, N> b;
  tg::tile<D, M, N> acc;
  auto fill = [&](D* x, int n) {
    for (int i = 0; i < n; ++i) {
      x[i] = D(static_cast<V>(u(rng)));
      for (int k = 0; k < Dirs; ++k)
        x[i].d[k] = static_cast<V>(u(rng));
    }
  };
  fill(a.data(), M * K2);
  fill(b.data(), K2 * N);
  fill(acc.data(), M * N);
  if (with_infinity) { // A(1, 2) = inf with zero tangents, B's row 2 tangents zero
    a.data()[1 * K2 + 2] = D(std::numeric_limits<V>::infinity());
    for (int j = 0; j < N; ++j)
      for (int k = 0; k < Dirs; ++k)
        b.data()[2 * N + j].d[k] = 0;
  }
  // The plain loop: C(i, j) = acc(i, j) + sum_k A(i, k) B(k, j), one dual multiply-add at a time.
  auto want = acc;
  for (int i = 0; i < M; ++i)
    for (int k = 0; k < K2; ++k)
      for (int j = 0; j < N; ++j)
        want.data()[i * N + j] =
            want.data()[i * N + j] + a.data()[i * K2 + k] * b.data()[k * N + j];
  tg::tile<D, M, N> got;
  if constexpr (TransposeA) {
    tg::tile<D, K2, M> const at = tg::trans(a);
    got = tg::dot(tg::trans(at), b, acc);
  } else {
    got = tg::dot(a, b, acc);
  }
  double const rtol = std::is_same_v<V, float> ? 1e-5 : 1e-13;
  for (int i = 0; i < M * N; ++i) {
    auto close = [&](double g, double w) {
      return g == w || std::abs(g - w) <= rtol * (K2 * 4.0 + std::abs(w));
    };
    ASSERT_TRUE(close(got.data()[i].v, want.data()[i].v))
        << "value at " << i << ": " << got.data()[i].v << ", want " << want.data()[i].v;
    for (int k = 0; k < Dirs; ++k) {
      ASSERT_FALSE(std::isnan(got.data()[i].d[k]) && !std::isnan(want.data()[i].d[k])) << i;
      ASSERT_TRUE(close(got.data()[i].d[k], want.data()[i].d[k]))
          << "tangent " << k << " at " << i << ": " << got.data()[i].d[k] << ", want "
          << want.data()[i].d[k];
    }
  }
  // Without an accumulator (the product writes C without reading it).
  tg::tile<D, M, N> const alone = tg::dot(a, b);
  for (int i = 0; i < M * N; ++i) {
    double want0 = 0; // the values only: the tangents are those above less acc's
    for (int k = 0; k < K2; ++k)
      want0 += double(a.data()[(i / N) * K2 + k].v) * double(b.data()[k * N + i % N].v);
    ASSERT_TRUE(alone.data()[i].v == want0 ||
                std::abs(alone.data()[i].v - want0) <= rtol * (K2 * 4.0 + std::abs(want0)))
        << i;
    for (int k = 0; k < Dirs; ++k)
      ASSERT_TRUE(std::abs((alone.data()[i].d[k] + acc.data()[i].d[k]) - got.data()[i].d[k]) <=
                  rtol * (K2 * 8.0 + std::abs(got.data()[i].d[k])))
          << i;
  }
  if (with_infinity) { // row 1 holds infinities, with the finite tangents of the dual rule
    for (int j = 0; j < N; ++j)
      ASSERT_TRUE(std::isfinite(got.data()[1 * N + j].d[0])) << j;
  }
}

TEST(DualTile, DotRunsAsTheDualLoopOnPlanesAndKeepsZeroTermsAtInfinities) {
  for (bool inf : {false, true}) {
    expect_dot_as_the_dual_loop<dual<double, 1>, 64, 64, 64, false>(71, inf);
    expect_dot_as_the_dual_loop<dual<double, 1>, 64, 64, 64, true>(72, inf);
    expect_dot_as_the_dual_loop<dual<double, 3>, 13, 70, 9, false>(73, inf);
    expect_dot_as_the_dual_loop<dual<float, 1>, 64, 32, 48, true>(74, inf);
    expect_dot_as_the_dual_loop<dual<float, 3>, 13, 70, 9, false>(75, inf);
  }
}

TEST(DualTile, CastsBetweenFloatAndDouble) {
  auto const x = random_input<3, 13>(61, -2, 2);
  using DF = dual<float, K>;
  tg::tile<DD, 3, 13> const d = x.dual_tile();
  tg::tile<DF, 3, 13> const f = tg::to<DF>(d * 3.0);
  tg::tile<DD, 3, 13> const back = f; // widening: implicit
  for (int i = 0; i < d.size; ++i)
    for (int k = 0; k < K; ++k) {
      ASSERT_EQ(f.data()[i].d[k], static_cast<float>(3.0 * d.data()[i].d[k])) << i;
      ASSERT_EQ(back.data()[i].d[k], double(f.data()[i].d[k])) << i;
    }
  // A float dual tile through an expression: the tangents of the double one, to float accuracy.
  tg::tile<DF, 3, 13> const ef = exp(f) * f;
  tg::tile<DD, 3, 13> const ed = exp(back) * back;
  for (int i = 0; i < d.size; ++i)
    for (int k = 0; k < K; ++k)
      ASSERT_TRUE(near(ef.data()[i].d[k], ed.data()[i].d[k], 1e-5)) << i;
}

} // namespace

} // namespace test_dual
