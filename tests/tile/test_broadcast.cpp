// Broadcasting (NumPy rules: extents aligned from the right, equal or 1) and element-type
// promotion (Triton's rules) of tile/elementwise.hpp and tile/expr.hpp, plus broadcast_to and
// expand_dims (negative axes included) of tile/shape_ops.hpp. Every result is checked against a
// plain loop over its coordinates.
#include "../support/reference.hpp"

#include <cmath>
#include <cstdint>
#include <type_traits>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_broadcast {

namespace {

using namespace tilegrad;
using tg_test::make_rng;

template <class T>
class Broadcast : public ::testing::Test {};
using FloatTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(Broadcast, FloatTypes);

TYPED_TEST(Broadcast, ColumnOpRow) {
  using T = TypeParam;
  auto rng = make_rng(1);
  tile<T, 7, 1> a;
  tile<T, 1, 37> b;
  tg_test::fill_uniform(a, rng, -4, 4);
  tg_test::fill_uniform(b, rng, -4, 4);
  tile<T, 7, 37> sum = a + b;
  tile<T, 7, 37> diff = b - a;
  tile<T, 7, 37> prod = a * b;
  static_assert(std::is_same_v<shape_of_t<decltype(a + b)>, shape<7, 37>>);
  for (int i = 0; i < 7; ++i)
    for (int j = 0; j < 37; ++j) {
      EXPECT_EQ(sum(i, j), a(i, 0) + b(0, j)) << "[M,1] + [1,N] at (" << i << ", " << j << ")";
      EXPECT_EQ(diff(i, j), b(0, j) - a(i, 0)) << "[1,N] - [M,1] at (" << i << ", " << j << ")";
      EXPECT_EQ(prod(i, j), a(i, 0) * b(0, j)) << "[M,1] * [1,N] at (" << i << ", " << j << ")";
    }
}

TYPED_TEST(Broadcast, VectorOpMatrix) {
  using T = TypeParam;
  auto rng = make_rng(2);
  tile<T, 37> v;
  tile<T, 5, 37> m;
  tile<T, 5, 1> c;
  tg_test::fill_uniform(v, rng, -4, 4);
  tg_test::fill_uniform(m, rng, -4, 4);
  tg_test::fill_uniform(c, rng, -4, 4);
  tile<T, 5, 37> x = m * v;
  tile<T, 5, 37> y = v - m;
  tile<T, 5, 37> z = m / c + v; // [M,N] / [M,1] + [N]
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 37; ++j) {
      EXPECT_EQ(x(i, j), m(i, j) * v(j)) << "[M,N] * [N] at (" << i << ", " << j << ")";
      EXPECT_EQ(y(i, j), v(j) - m(i, j)) << "[N] - [M,N] at (" << i << ", " << j << ")";
      EXPECT_EQ(z(i, j), m(i, j) / c(i, 0) + v(j))
          << "[M,N] / [M,1] + [N] at (" << i << ", " << j << ")";
    }
}

TYPED_TEST(Broadcast, RankZeroOpAnything) {
  using T = TypeParam;
  auto rng = make_rng(3);
  tile<T> s(T(-1.5));
  tile<T, 1> one;
  tile<T, 7> v;
  tile<T, 3, 4, 19> t;
  tg_test::fill_uniform(one, rng, -4, 4);
  tg_test::fill_uniform(v, rng, -4, 4);
  tg_test::fill_uniform(t, rng, -4, 4);
  tile<T> ss = s * s;
  tile<T, 1> s1 = s + one;
  tile<T, 7> sv = v - s;
  tile<T, 3, 4, 19> st = s * t;
  tile<T, 3, 4, 19> ts = t / s;
  EXPECT_EQ(ss.item(), T(-1.5) * T(-1.5)) << "rank 0 * rank 0";
  EXPECT_EQ(s1(0), T(-1.5) + one(0)) << "rank 0 + [1]";
  for (int i = 0; i < 7; ++i)
    EXPECT_EQ(sv(i), v(i) - T(-1.5)) << "[N] - rank 0 at (" << i << ")";
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j)
      for (int k = 0; k < 19; ++k) {
        EXPECT_EQ(st(i, j, k), T(-1.5) * t(i, j, k))
            << "rank 0 * rank 3 at (" << i << ", " << j << ", " << k << ")";
        EXPECT_EQ(ts(i, j, k), t(i, j, k) / T(-1.5))
            << "rank 3 / rank 0 at (" << i << ", " << j << ", " << k << ")";
      }
}

TYPED_TEST(Broadcast, RankThree) {
  using T = TypeParam;
  auto rng = make_rng(4);
  tile<T, 3, 1, 19> a;
  tile<T, 4, 1> b;
  tile<T, 1, 4, 1> c;
  tile<T, 19> d;
  tg_test::fill_uniform(a, rng, -4, 4);
  tg_test::fill_uniform(b, rng, -4, 4);
  tg_test::fill_uniform(c, rng, -4, 4);
  tg_test::fill_uniform(d, rng, -4, 4);
  tile<T, 3, 4, 19> x = a + b;     // [3,1,19] + [4,1]
  tile<T, 3, 4, 19> y = c * a - d; // [1,4,1] * [3,1,19] - [19]
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j)
      for (int k = 0; k < 19; ++k) {
        EXPECT_EQ(x(i, j, k), a(i, 0, k) + b(j, 0))
            << "[3,1,19] + [4,1] at (" << i << ", " << j << ", " << k << ")";
        // Exact unless FMA contraction rounds c * a - d once (terms below 16 in magnitude).
        EXPECT_NEAR(y(i, j, k), c(0, j, 0) * a(i, 0, k) - d(k), 16 * tg_test::contraction_rtol<T>)
            << "[1,4,1] * [3,1,19] - [19] at (" << i << ", " << j << ", " << k << ")";
      }
}

TYPED_TEST(Broadcast, ColRowAndExpressions) {
  using T = TypeParam;
  auto rng = make_rng(5);
  tile<T, 5> u;
  tile<T, 37> v;
  tile<T, 5, 37> m;
  tg_test::fill_uniform(u, rng, -4, 4);
  tg_test::fill_uniform(v, rng, -4, 4);
  tg_test::fill_uniform(m, rng, -4, 4);
  tile<T, 5, 37> outer = col(u) * row(v);          // u[:, None] * v[None, :]
  tile<T, 5, 37> e = m * 2 - col(u + 1) + row(-v); // operands that are expressions
  tile<T, 5, 1> cu = col(u);
  tile<T, 1, 37> rv = row(v);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(cu(i, 0), u(i)) << "col at (" << i << ", 0)";
    for (int j = 0; j < 37; ++j) {
      EXPECT_EQ(outer(i, j), u(i) * v(j)) << "col(u) * row(v) at (" << i << ", " << j << ")";
      EXPECT_EQ(e(i, j), m(i, j) * T(2) - (u(i) + T(1)) + -v(j))
          << "m * 2 - col(u + 1) + row(-v) at (" << i << ", " << j << ")";
      if (i == 0) {
        EXPECT_EQ(rv(0, j), v(j)) << "row at (0, " << j << ")";
      }
    }
  }
}

TYPED_TEST(Broadcast, BroadcastTo) {
  using T = TypeParam;
  auto rng = make_rng(6);
  tile<T, 37> v;
  tile<T, 4, 1> c;
  tile<T> s(T(2.5));
  tg_test::fill_uniform(v, rng, -4, 4);
  tg_test::fill_uniform(c, rng, -4, 4);
  tile<T, 5, 37> bv = broadcast_to<5, 37>(v);
  tile<T, 3, 4, 19> bc = broadcast_to<3, 4, 19>(c);
  tile<T, 3, 4, 19> bs = broadcast_to<3, 4, 19>(s);
  tile<T, 7, 37> be = broadcast_to<7, 37>(v * 2); // of an expression
  tile<T, 37> same = broadcast_to<37>(v);
  for (int j = 0; j < 37; ++j) {
    EXPECT_EQ(same(j), v(j)) << "broadcast_to<37> at (" << j << ")";
    for (int i = 0; i < 5; ++i)
      EXPECT_EQ(bv(i, j), v(j)) << "at (" << i << ", " << j << ")";
    for (int i = 0; i < 7; ++i)
      EXPECT_EQ(be(i, j), v(j) * T(2)) << "at (" << i << ", " << j << ")";
  }
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j)
      for (int k = 0; k < 19; ++k) {
        EXPECT_EQ(bc(i, j, k), c(j, 0)) << "at (" << i << ", " << j << ", " << k << ")";
        EXPECT_EQ(bs(i, j, k), T(2.5)) << "at (" << i << ", " << j << ", " << k << ")";
      }
}

TYPED_TEST(Broadcast, ExpandDimsWithNegativeAxes) {
  using T = TypeParam;
  auto rng = make_rng(7);
  tile<T, 37> v;
  tile<T, 5, 7> m;
  tg_test::fill_uniform(v, rng, -4, 4);
  tg_test::fill_uniform(m, rng, -4, 4);
  static_assert(std::is_same_v<shape_of_t<decltype(expand_dims<0>(v))>, shape<1, 37>>);
  static_assert(std::is_same_v<shape_of_t<decltype(expand_dims<1>(v))>, shape<37, 1>>);
  static_assert(std::is_same_v<shape_of_t<decltype(expand_dims<-1>(v))>, shape<37, 1>>);
  static_assert(std::is_same_v<shape_of_t<decltype(expand_dims<-2>(v))>, shape<1, 37>>);
  static_assert(std::is_same_v<shape_of_t<decltype(expand_dims<0>(m))>, shape<1, 5, 7>>);
  static_assert(std::is_same_v<shape_of_t<decltype(expand_dims<1>(m))>, shape<5, 1, 7>>);
  static_assert(std::is_same_v<shape_of_t<decltype(expand_dims<2>(m))>, shape<5, 7, 1>>);
  static_assert(std::is_same_v<shape_of_t<decltype(expand_dims<-1>(m))>, shape<5, 7, 1>>);
  static_assert(std::is_same_v<shape_of_t<decltype(expand_dims<-2>(m))>, shape<5, 1, 7>>);
  static_assert(std::is_same_v<shape_of_t<decltype(expand_dims<-3>(m))>, shape<1, 5, 7>>);
  static_assert(std::is_same_v<shape_of_t<decltype(expand_dims<0>(tile<T>()))>, shape<1>>);

  tile<T, 37, 1> a = expand_dims<-1>(v);
  tile<T, 1, 37> b = expand_dims<-2>(v);
  tile<T, 5, 1, 7> c = expand_dims<-2>(m);
  tile<T, 5, 7, 1> d = expand_dims<-1>(m);
  tile<T, 1, 5, 7> e = expand_dims<-3>(m);
  for (int j = 0; j < 37; ++j) {
    EXPECT_EQ(a(j, 0), v(j)) << "expand_dims<-1>(v) at (" << j << ", 0)";
    EXPECT_EQ(b(0, j), v(j)) << "expand_dims<-2>(v) at (0, " << j << ")";
  }
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 7; ++j) {
      EXPECT_EQ(c(i, 0, j), m(i, j)) << "expand_dims<-2>(m) at (" << i << ", 0, " << j << ")";
      EXPECT_EQ(d(i, j, 0), m(i, j)) << "expand_dims<-1>(m) at (" << i << ", " << j << ", 0)";
      EXPECT_EQ(e(0, i, j), m(i, j)) << "expand_dims<-3>(m) at (0, " << i << ", " << j << ")";
    }
  // Expanded operands broadcast: m[:, :, None] * v[None, None, :]-like through expand_dims.
  tile<T, 5, 7, 37> outer = expand_dims<-1>(m) * expand_dims<0>(expand_dims<0>(v));
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 7; ++j)
      for (int k = 0; k < 37; ++k)
        EXPECT_EQ(outer(i, j, k), m(i, j) * v(k))
            << "expand_dims outer product at (" << i << ", " << j << ", " << k << ")";
}

// ---------------------------------------------------------------------------------------------
// Promotion (Triton's rules)
// ---------------------------------------------------------------------------------------------

template <class E>
using elem = value_of_t<E>;

TEST(Promotion, IntegerTileMeetsFloatConstant) {
  tile<std::int32_t, 7> i;
  for (int k = 0; k < 7; ++k)
    i(k) = k - 3;
  static_assert(std::is_same_v<elem<decltype(i + 2.5)>, float>);
  static_assert(std::is_same_v<elem<decltype(2.5 * i)>, float>);
  static_assert(std::is_same_v<elem<decltype(i + 2)>, std::int32_t>);
  static_assert(std::is_same_v<elem<decltype(i + short{2})>, std::int32_t>); // the tile's type
  // wins, except over a 64-bit integer (a size or stride): int64, as in Triton.
  static_assert(std::is_same_v<elem<decltype(i + 2LL)>, std::int64_t>);
  tile<float, 7> f = i + 2.5;
  for (int k = 0; k < 7; ++k)
    EXPECT_EQ(f(k), float(k - 3) + 2.5f) << "at (" << k << ")";
  tile<std::int64_t, 3> l(std::int64_t{5});
  static_assert(std::is_same_v<elem<decltype(l * 0.5)>, float>);
}

TEST(Promotion, Int32TileMeetsInt64Tile) {
  tile<std::int32_t, 5, 7> i;
  tile<std::int64_t, 7> l;
  auto rng = make_rng(8);
  tg_test::fill_uniform(i, rng, -1000, 1000);
  for (int k = 0; k < 7; ++k)
    l(k) = (std::int64_t{1} << 40) * (k - 3) + k;
  static_assert(std::is_same_v<elem<decltype(i + l)>, std::int64_t>);
  static_assert(std::is_same_v<elem<decltype(l * i)>, std::int64_t>);
  tile<std::int64_t, 5, 7> s = i + l;
  tile<std::int64_t, 5, 7> p = l * i;
  for (int r = 0; r < 5; ++r)
    for (int c = 0; c < 7; ++c) {
      EXPECT_EQ(s(r, c), std::int64_t{i(r, c)} + l(c)) << "at (" << r << ", " << c << ")";
      EXPECT_EQ(p(r, c), l(c) * std::int64_t{i(r, c)}) << "at (" << r << ", " << c << ")";
    }
}

TEST(Promotion, FloatTileMeetsDoubleTile) {
  tile<float, 3, 37> f;
  tile<double, 37> d;
  auto rng = make_rng(9);
  tg_test::fill_uniform(f, rng, -4, 4);
  tg_test::fill_uniform(d, rng, -4, 4);
  static_assert(std::is_same_v<elem<decltype(f + d)>, double>);
  static_assert(std::is_same_v<elem<decltype(d * f)>, double>);
  static_assert(std::is_same_v<elem<decltype(f * 2.5)>, float>); // a constant does not widen
  static_assert(std::is_same_v<elem<decltype(d * 2.5f)>, double>);
  tile<double, 3, 37> s = f + d;
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 37; ++c)
      EXPECT_EQ(s(r, c), double(f(r, c)) + d(c))
          << "computed in double at (" << r << ", " << c << ")";
  // Widening on assignment is implicit.
  tile<double, 3, 37> w = f * 3;
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 37; ++c)
      EXPECT_EQ(w(r, c), double(f(r, c) * 3.0f)) << "at (" << r << ", " << c << ")";
}

TEST(Promotion, IntegerTileMeetsFloatTile) {
  tile<std::int32_t, 7, 1> i;
  tile<float, 1, 37> f;
  auto rng = make_rng(10);
  tg_test::fill_uniform(i, rng, -100, 100);
  tg_test::fill_uniform(f, rng, -4, 4);
  static_assert(std::is_same_v<elem<decltype(i * f)>, float>);
  tile<float, 7, 37> p = i * f;
  for (int r = 0; r < 7; ++r)
    for (int c = 0; c < 37; ++c)
      EXPECT_EQ(p(r, c), float(i(r, 0)) * f(0, c)) << "at (" << r << ", " << c << ")";
}

TEST(Promotion, BoolTilesAddAsInt32) {
  tile<bool, 3, 5> p, q;
  auto rng = make_rng(11);
  tg_test::fill_uniform(p, rng, 0, 1);
  tg_test::fill_uniform(q, rng, 0, 1);
  static_assert(std::is_same_v<elem<decltype(p + q)>, std::int32_t>);
  static_assert(std::is_same_v<elem<decltype(p + 1)>, std::int32_t>);
  static_assert(std::is_same_v<elem<decltype(p & q)>, bool>); // logic stays bool
  tile<std::int32_t, 3, 5> s = p + q;
  tile<std::int32_t, 3, 5> t = p * 3 + 1;
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 5; ++c) {
      EXPECT_EQ(s(r, c), int(p(r, c)) + int(q(r, c))) << "at (" << r << ", " << c << ")";
      EXPECT_EQ(t(r, c), int(p(r, c)) * 3 + 1) << "at (" << r << ", " << c << ")";
    }
}

TEST(Promotion, WhereAndFmaOperandsPromoteLikeBinaryOps) {
  tile<float, 3, 7> f;
  tile<double, 7> d;
  tile<std::int32_t, 3, 1> i;
  auto rng = make_rng(12);
  tg_test::fill_uniform(f, rng, -4, 4);
  tg_test::fill_uniform(d, rng, -4, 4);
  tg_test::fill_uniform(i, rng, -3, 3);
  // Two tile operands of different types (and node types) promote; numbers meet the tile type.
  static_assert(std::is_same_v<elem<decltype(where(f > 0, f, d))>, double>);
  static_assert(std::is_same_v<elem<decltype(where(f > 0, f * 2, -f))>, float>);
  static_assert(std::is_same_v<elem<decltype(where(f > 0, i, 2.5))>, float>);
  static_assert(std::is_same_v<elem<decltype(fma(f, 2.0, f))>, float>);
  static_assert(std::is_same_v<elem<decltype(fma(2.0, f, 1))>, float>);
  static_assert(std::is_same_v<elem<decltype(fma(i, 2, i))>, std::int32_t>);
  static_assert(std::is_same_v<elem<decltype(fma(i, 2.5, i))>, float>);
  static_assert(std::is_same_v<elem<decltype(fma(f, d, 1))>, double>);
  tile<double, 3, 7> const w = where(f > 0, f, d);
  tile<float, 3, 7> const h = fma(f, 2.0, i);
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 7; ++c) {
      EXPECT_EQ(w(r, c), f(r, c) > 0 ? double(f(r, c)) : d(c)) << "at (" << r << ", " << c << ")";
      EXPECT_NEAR(h(r, c), f(r, c) * 2.0f + float(i(r, 0)), 4e-6f * (1 + std::abs(f(r, c))))
          << "at (" << r << ", " << c << ")";
    }
}

} // namespace

} // namespace test_broadcast
