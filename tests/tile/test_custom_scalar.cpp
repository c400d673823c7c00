// A custom scalar type flows through the tile algebra at width 1 (the simd::native_width
// fallback of core/simd.hpp): the very expressions, reductions and dot that run on double run on
// a small struct wrapping a double, with its own operators and math functions found by ADL, and
// give the results of the double path. This is the hook dual and adjoint numbers use.
#include "../support/reference.hpp"

#include <cmath>
#include <cstdint>
#include <type_traits>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_custom_scalar {

namespace custom {

/// A double behind a struct: arithmetic, comparisons, and math functions found by ADL. Every
/// multiplication is counted, to show that the tiles really ran num's own operators.
struct num {
  using scalar_tag = void; // a num may meet a tile as a plain number does (scalar_operand)
  double v = 0;

  constexpr num() = default;
  constexpr explicit num(double x) : v(x) {}

  inline static long multiplications = 0;

  friend num operator+(num a, num b) { return num(a.v + b.v); }
  friend num operator-(num a, num b) { return num(a.v - b.v); }
  friend num operator*(num a, num b) {
    ++multiplications;
    return num(a.v * b.v);
  }
  friend num operator/(num a, num b) { return num(a.v / b.v); }
  friend num operator-(num a) { return num(-a.v); }
  friend bool operator==(num a, num b) { return a.v == b.v; }
  friend bool operator!=(num a, num b) { return a.v != b.v; }
  friend bool operator<(num a, num b) { return a.v < b.v; }
  friend bool operator<=(num a, num b) { return a.v <= b.v; }
  friend bool operator>(num a, num b) { return a.v > b.v; }
  friend bool operator>=(num a, num b) { return a.v >= b.v; }
};

inline num exp(num x) {
  return num(std::exp(x.v));
}
inline num exp2(num x) {
  return num(std::exp2(x.v));
}
inline num log(num x) {
  return num(std::log(x.v));
}
inline num log2(num x) {
  return num(std::log2(x.v));
}
inline num sqrt(num x) {
  return num(std::sqrt(x.v));
}
inline num abs(num x) {
  return num(std::abs(x.v));
}
inline num sin(num x) {
  return num(std::sin(x.v));
}
inline num cos(num x) {
  return num(std::cos(x.v));
}
inline num tanh(num x) {
  return num(std::tanh(x.v));
}
inline num erf(num x) {
  return num(std::erf(x.v));
}
inline num fmod(num a, num b) {
  return num(std::fmod(a.v, b.v));
}

} // namespace custom

namespace {

using namespace tilegrad;
using custom::num;

static_assert(simd::native_width<num> == 1, "a type without a SIMD register runs at width 1");
static_assert(detail::eval_width<num> == 1);
static_assert(is_floating_v<num> && !is_builtin_v<num>);
static_assert(std::is_same_v<promote_t<num, double>, num>); // num absorbs plain numbers
static_assert(std::is_same_v<fp32<num>, num>);

// The num tile's values against the double tile's: exactly (rtol = 0) for arithmetic, within a
// few ulp for transcendental functions (the double path runs xsimd's vector math, num libm's).
template <int... Ns>
void expect_same(tile<num, Ns...> const& got, tile<double, Ns...> const& want, double rtol,
                 char const* what) {
  using dl = tile<double, Ns...>;
  dl const g = tg_test::from_flat<dl>([&](int i) { return got.data()[i].v; });
  if (rtol == 0)
    tg_test::expect_eq(g, want, what);
  else
    tg_test::expect_near(g, want, rtol, 1, what);
}

template <int... Ns>
void check_expressions() {
  using dl = tile<double, Ns...>;
  using nl = tile<num, Ns...>;
  auto rng = tg_test::make_rng(dl::size);
  dl a, b, c;
  tg_test::fill_uniform(a, rng, -3, 3);
  tg_test::fill_uniform(b, rng, 0.25, 4);
  tg_test::fill_uniform(c, rng, -3, 3);
  nl const na = a, nb = b, nc = c; // double -> num is a promotion: implicit
  constexpr double ulp = 1e-14;

  // The same expression text on both element types.
  auto arith = [](auto const& x, auto const& y, auto const& z) {
    return x * y + z / y - x * 2.0 + 1 - (-z);
  };
  // Exact, except where the target has FMA instructions and the compiler contracts x * y + ...
  // on one path and not the other (terms stay below 100 in magnitude).
  expect_same(nl(arith(na, nb, nc)), dl(arith(a, b, c)), 100 * tg_test::contraction_rtol<double>,
              "arithmetic");
  expect_same(nl(na * num(3)), dl(a * 3.0), 0, "a num meets a tile");
  auto math = [](auto const& x, auto const& y) {
    return exp(x) * sin(y) + sqrt(y) - log(y) + tanh(x) * erf(x) - cos(x) / exp2(y) +
           log2(y) * abs(x) + rsqrt(y) - sigmoid(x);
  };
  expect_same(nl(math(na, nb)), dl(math(a, b)), 8 * ulp, "math functions");
  auto select = [](auto const& x, auto const& y, auto const& z) {
    return where(x < z, maximum(x, y), minimum(z, y)) + fma(x, y, z) + (x % y);
  };
  // fma is fused on the double path and a * b + c for a custom scalar: an ulp apart.
  expect_same(nl(select(na, nb, nc)), dl(select(a, b, c)), ulp,
              "where / maximum / minimum / fma / %");
  expect_same(nl(where(na < nc, maximum(na, nb), minimum(nc, nb))),
              dl(where(a < c, maximum(a, b), minimum(c, b))), 0, "where / maximum / minimum");
  tile<bool, Ns...> const nm = na >= nc, dm = a >= c;
  for (int i = 0; i < dl::size; ++i)
    EXPECT_EQ(nm.data()[i], dm.data()[i]) << "comparison at " << i;
}

TEST(CustomScalar, ElementwiseExpressionsMatchTheDoublePath) {
  long const before = num::multiplications;
  check_expressions<1>();
  check_expressions<5, 37>();
  check_expressions<3, 4, 19>();
  EXPECT_GT(num::multiplications, before) << "num's operator* was never called";
}

TEST(CustomScalar, BroadcastingAndShapeOps) {
  auto rng = tg_test::make_rng(1);
  tile<double, 5> u;
  tile<double, 37> v;
  tg_test::fill_uniform(u, rng, -3, 3);
  tg_test::fill_uniform(v, rng, -3, 3);
  tile<num, 5> const nu = u;
  tile<num, 37> const nv = v;
  expect_same(tile<num, 37, 5>(trans(col(nu) * row(nv) - 1.5)),
              tile<double, 37, 5>(trans(col(u) * row(v) - 1.5)), 0, "trans(col(u) * row(v) - 1.5)");
  expect_same(tile<num, 5, 37>(broadcast_to<5, 37>(nv) + reshape<5, 1>(nu)),
              tile<double, 5, 37>(broadcast_to<5, 37>(v) + reshape<5, 1>(u)), 0,
              "broadcast_to + reshape");
}

TEST(CustomScalar, ReductionsMatchTheDoublePath) {
  auto rng = tg_test::make_rng(2);
  tile<double, 3, 4, 19> d;
  tg_test::fill_dyadic(d, rng, 2); // many ties; sums exact in any order
  tile<num, 3, 4, 19> const n = d;
  expect_same(sum<0>(n), sum<0>(d), 0, "sum<0>");
  expect_same(sum<-1>(n, keep_dims), sum<-1>(d, keep_dims), 0, "sum<-1>, keep_dims");
  expect_same(max<1>(n), max<1>(d), 0, "max<1>");
  expect_same(min<2>(n), min<2>(d), 0, "min<2>");
  expect_same(cumsum<1>(n), tile<double, 3, 4, 19>(cumsum<1>(d)), 0, "cumsum<1>");
  expect_same(cumsum<2, true>(n), tile<double, 3, 4, 19>(cumsum<2, true>(d)), 0,
              "cumsum<2, reverse>");
  tg_test::expect_eq(argmax<1>(n), argmax<1>(d), "argmax<1>");
  tg_test::expect_eq(argmin<-1>(n), argmin<-1>(d), "argmin<-1>");
  EXPECT_EQ(sum(n * n).item().v, sum(d * d).item()) << "sum of squares";
  static_assert(std::is_same_v<value_of_t<decltype(sum<0>(n))>, num>);
}

TEST(CustomScalar, DotMatchesTheDoublePath) {
  auto rng = tg_test::make_rng(3);
  tile<double, 17, 33> a;
  tile<double, 33, 5> b;
  tile<double, 17, 5> acc;
  tg_test::fill_dyadic(a, rng);
  tg_test::fill_dyadic(b, rng);
  tg_test::fill_dyadic(acc, rng);
  tile<num, 17, 33> const na = a;
  tile<num, 33, 5> const nb = b;
  tile<num, 17, 5> const nacc = acc;
  static_assert(std::is_same_v<value_of_t<decltype(dot(na, nb))>, num>);
  expect_same(dot(na, nb), dot(a, b), 0, "dot(a, b)");
  expect_same(dot(na, nb, nacc), dot(a, b, acc), 0, "dot(a, b, acc)");
  expect_same(dot(na * 2, trans(trans(nb))), dot(a * 2, trans(trans(b))), 0,
              "dot(a * 2, trans(trans(b)))");
}

} // namespace

} // namespace test_custom_scalar
