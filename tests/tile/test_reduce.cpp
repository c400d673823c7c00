// Reductions of tile/reduce.hpp: sum, max, min, argmax, argmin along every axis of rank-1, -2
// and -3 tiles (negative axes, keep_dims), reduce-all to a rank-0 tile, sum of bool as int32,
// first-index ties of argmax/argmin, and cumsum along every axis in both directions. The
// references are plain loops over the (outer, axis, inner) decomposition of the operand. Inputs
// are multiples of 1/8, so sums are exact whatever order the vectorised loops add in.
#include "../support/reference.hpp"

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_reduce {

namespace {

using namespace tilegrad;
using tg_test::expect_eq;
using tg_test::from_flat;
using tg_test::make_rng;

// Element (o, k, i) of a row-major tile split around one axis is at o * extent * inner +
// k * inner + i: `outer` is the product of the extents before the axis, `inner` after it.
struct split {
  int outer = 1, extent = 1, inner = 1;
};

template <class S>
split split_at(int axis) {
  split s;
  for (int a = 0; a < axis; ++a)
    s.outer *= S::dim(a);
  s.extent = S::dim(axis);
  for (int a = axis + 1; a < S::rank; ++a)
    s.inner *= S::dim(a);
  return s;
}

enum class kind { sum, max, min, argmax, argmin };

// The reduction of x along the split axis, in the result's row-major order (the same with and
// without keep_dims). argmax / argmin keep the first index of equal elements.
template <class T>
std::vector<double> reduce_ref(T const* x, split s, kind k) {
  std::vector<double> out(static_cast<std::size_t>(s.outer * s.inner));
  for (int o = 0; o < s.outer; ++o)
    for (int i = 0; i < s.inner; ++i) {
      int const base = o * s.extent * s.inner + i;
      double acc = static_cast<double>(x[base]);
      T best = x[base];
      int best_k = 0;
      for (int j = 1; j < s.extent; ++j) {
        T const v = x[base + j * s.inner];
        acc += static_cast<double>(v);
        if ((k == kind::max || k == kind::argmax) ? v > best : v < best) {
          best = v;
          best_k = j;
        }
      }
      double r = acc;
      if (k == kind::max || k == kind::min)
        r = static_cast<double>(best);
      if (k == kind::argmax || k == kind::argmin)
        r = best_k;
      out[static_cast<std::size_t>(o * s.inner + i)] = r;
    }
  return out;
}

// Inclusive prefix sums along the split axis, from the end when reverse.
template <class T>
std::vector<double> cumsum_ref(T const* x, split s, bool reverse) {
  std::vector<double> out(static_cast<std::size_t>(s.outer * s.extent * s.inner));
  for (int o = 0; o < s.outer; ++o)
    for (int i = 0; i < s.inner; ++i) {
      double acc = 0;
      for (int jj = 0; jj < s.extent; ++jj) {
        int const j = reverse ? s.extent - 1 - jj : jj;
        int const at = (o * s.extent + j) * s.inner + i;
        acc += static_cast<double>(x[at]);
        out[static_cast<std::size_t>(at)] = acc;
      }
    }
  return out;
}

template <class Tile>
Tile tile_of(std::vector<double> const& v) {
  return from_flat<Tile>([&](int i) { return v[static_cast<std::size_t>(i)]; });
}

// The shape of a reduction along axis a of S: the axis removed, or kept with extent 1.
template <class R, class S>
constexpr bool is_reduced_shape(int a, bool keep) {
  if (R::rank != (keep ? S::rank : S::rank - 1))
    return false;
  for (int d = 0, s = 0; s < S::rank; ++s) {
    if (s == a) {
      if (keep && R::dim(d++) != 1)
        return false;
    } else if (R::dim(d++) != S::dim(s)) {
      return false;
    }
  }
  return true;
}

template <class T>
class Reduce : public ::testing::Test {};
using FloatTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(Reduce, FloatTypes);

// Every reduction along Axis (which may be negative) of x, with and without keep_dims.
template <int Axis, class T, int... Ns>
void check_along(tile<T, Ns...> const& x) {
  using S = shape<Ns...>;
  constexpr int a = Axis < 0 ? Axis + S::rank : Axis;
  split const sp = split_at<S>(a);

  auto const s = sum<Axis>(x);
  auto const sk = sum<Axis>(x, keep_dims);
  auto const mx = max<Axis>(x);
  auto const mn = min<Axis>(x, keep_dims);
  auto const am = argmax<Axis>(x);
  auto const ai = argmin<Axis>(x, keep_dims);
  static_assert(is_reduced_shape<shape_of_t<decltype(s)>, S>(a, false));
  static_assert(is_reduced_shape<shape_of_t<decltype(sk)>, S>(a, true));
  static_assert(is_reduced_shape<shape_of_t<decltype(mx)>, S>(a, false));
  static_assert(is_reduced_shape<shape_of_t<decltype(mn)>, S>(a, true));
  static_assert(is_reduced_shape<shape_of_t<decltype(am)>, S>(a, false));
  static_assert(is_reduced_shape<shape_of_t<decltype(ai)>, S>(a, true));
  static_assert(std::is_same_v<value_of_t<decltype(s)>, T>);
  static_assert(std::is_same_v<value_of_t<decltype(am)>, std::int32_t>);
  static_assert(std::is_same_v<value_of_t<decltype(ai)>, std::int32_t>);

  expect_eq(s, tile_of<std::remove_const_t<decltype(s)>>(reduce_ref(x.data(), sp, kind::sum)),
            "sum");
  expect_eq(sk, tile_of<std::remove_const_t<decltype(sk)>>(reduce_ref(x.data(), sp, kind::sum)),
            "sum, keep_dims");
  expect_eq(mx, tile_of<std::remove_const_t<decltype(mx)>>(reduce_ref(x.data(), sp, kind::max)),
            "max");
  expect_eq(mn, tile_of<std::remove_const_t<decltype(mn)>>(reduce_ref(x.data(), sp, kind::min)),
            "min, keep_dims");
  expect_eq(am, tile_of<std::remove_const_t<decltype(am)>>(reduce_ref(x.data(), sp, kind::argmax)),
            "argmax");
  expect_eq(ai, tile_of<std::remove_const_t<decltype(ai)>>(reduce_ref(x.data(), sp, kind::argmin)),
            "argmin, keep_dims");

  using full = tile<T, Ns...>;
  expect_eq(full(cumsum<Axis>(x)), tile_of<full>(cumsum_ref(x.data(), sp, false)), "cumsum");
  expect_eq(full(cumsum<Axis, true>(x)), tile_of<full>(cumsum_ref(x.data(), sp, true)),
            "cumsum, reverse");
}

// Inputs from {-2, ..., 2} / 8 (ties everywhere, for argmax / argmin) or wider dyadic ones.
template <class Tile>
Tile dyadic(int salt, int kmax) {
  Tile t;
  auto rng = make_rng(static_cast<std::uint64_t>(salt));
  tg_test::fill_dyadic(t, rng, kmax);
  return t;
}

TYPED_TEST(Reduce, RankOne) {
  using T = TypeParam;
  for (int kmax : {2, 64}) {
    auto const x = dyadic<tile<T, 37>>(1, kmax);
    check_along<0>(x);
    check_along<-1>(x);
    auto const one = dyadic<tile<T, 1>>(2, kmax);
    check_along<0>(one);
  }
}

TYPED_TEST(Reduce, RankTwo) {
  using T = TypeParam;
  for (int kmax : {2, 64}) {
    auto const x = dyadic<tile<T, 5, 37>>(3, kmax);
    check_along<0>(x);
    check_along<1>(x);
    check_along<-1>(x);
    check_along<-2>(x);
    auto const y = dyadic<tile<T, 64, 64>>(4, kmax);
    check_along<0>(y);
    check_along<1>(y);
    // Rows long enough for the four accumulators, with whole vectors and single lanes left
    // after them (for float: 64 + 2 x 16 + 4 and 3 x 64 + 19).
    auto const z = dyadic<tile<T, 3, 100>>(6, kmax);
    check_along<1>(z);
    check_along<0>(z);
    auto const u = dyadic<tile<T, 2, 211>>(7, kmax);
    check_along<1>(u);
  }
}

TYPED_TEST(Reduce, RankThree) {
  using T = TypeParam;
  for (int kmax : {2, 64}) {
    auto const x = dyadic<tile<T, 3, 4, 19>>(5, kmax);
    check_along<0>(x);
    check_along<1>(x);
    check_along<2>(x);
    check_along<-1>(x);
    check_along<-2>(x);
    check_along<-3>(x);
  }
}

TYPED_TEST(Reduce, ArgmaxAndArgminTiesGoToTheFirstIndex) {
  using T = TypeParam;
  tile<T, 3, 7> x(T(1));
  x(1, 2) = x(1, 5) = T(4);  // row 1: max at 2 and 5
  x(2, 0) = x(2, 6) = T(-3); // row 2: min at 0 and 6
  tile<std::int32_t, 3> am = argmax<1>(x), ai = argmin<-1>(x);
  tile<std::int32_t, 7> am0 = argmax<0>(x);
  EXPECT_EQ(am(0), 0) << "all equal";
  EXPECT_EQ(am(1), 2) << "first of two maxima";
  EXPECT_EQ(am(2), 1) << "first of the equal non-minimal elements";
  EXPECT_EQ(ai(0), 0) << "all equal";
  EXPECT_EQ(ai(1), 0) << "first of the equal non-maximal elements";
  EXPECT_EQ(ai(2), 0) << "first of two minima";
  for (int j = 0; j < 7; ++j)
    EXPECT_EQ(am0(j), (j == 2 || j == 5) ? 1 : 0) << "argmax<0> at (" << j << ")";
}

TYPED_TEST(Reduce, ReduceAllToRankZero) {
  using T = TypeParam;
  auto const x = dyadic<tile<T, 3, 4, 19>>(6, 64);
  T const* X = x.data();
  double s = 0, mx = X[0], mn = X[0];
  for (int i = 0; i < x.size; ++i) {
    s += X[i];
    mx = X[i] > mx ? X[i] : mx;
    mn = X[i] < mn ? X[i] : mn;
  }
  tile<T> const ts = sum(x);
  EXPECT_EQ(ts.item(), T(s));
  EXPECT_EQ(max(x).item(), T(mx));
  EXPECT_EQ(min(x).item(), T(mn));
  tile<T, 1, 1, 1> const tk = sum(x, keep_dims);
  EXPECT_EQ(tk(0, 0, 0), T(s));
  EXPECT_EQ(sum(x * 2 - 1).item(), T(2 * s - x.size)) << "sum of an expression";
  tile<T> const zero_rank(T(2.5));
  EXPECT_EQ(sum(zero_rank).item(), T(2.5)) << "sum of a rank-0 tile";
  EXPECT_EQ(max(tile<T, 1>(T(-7))).item(), T(-7)) << "max of one element";
}

TYPED_TEST(Reduce, ReductionOfAnExpression) {
  using T = TypeParam;
  using tl = tile<T, 5, 37>;
  auto const a = dyadic<tl>(7, 16);
  auto const b = dyadic<tl>(8, 16);
  tl const ab = from_flat<tl>([&](int i) { return a.data()[i] * b.data()[i] + T(1); });
  expect_eq(sum<1>(a * b + 1),
            tile_of<tile<T, 5>>(reduce_ref(ab.data(), split_at<shape<5, 37>>(1), kind::sum)),
            "sum<1>(a * b + 1)");
  expect_eq(max<0>(a * b + 1),
            tile_of<tile<T, 37>>(reduce_ref(ab.data(), split_at<shape<5, 37>>(0), kind::max)),
            "max<0>(a * b + 1)");
  expect_eq(argmin<1>(a * b + 1),
            tile_of<tile<std::int32_t, 5>>(
                reduce_ref(ab.data(), split_at<shape<5, 37>>(1), kind::argmin)),
            "argmin<1>(a * b + 1)");
}

// ---------------------------------------------------------------------------------------------
// Integer and bool operands
// ---------------------------------------------------------------------------------------------

TEST(ReduceInteger, SumOfBoolIsInt32) {
  tile<bool, 5, 37> p;
  auto rng = make_rng(9);
  tg_test::fill_uniform(p, rng, 0, 1);
  auto const s1 = sum<1>(p);
  auto const s0 = sum<0>(p, keep_dims);
  auto const all = sum(p);
  auto const c = cumsum<-1>(p);
  static_assert(std::is_same_v<value_of_t<decltype(s1)>, std::int32_t>);
  static_assert(std::is_same_v<value_of_t<decltype(s0)>, std::int32_t>);
  static_assert(std::is_same_v<value_of_t<decltype(all)>, std::int32_t>);
  static_assert(std::is_same_v<value_of_t<decltype(c)>, std::int32_t>);
  std::int32_t total = 0;
  for (int i = 0; i < 5; ++i) {
    std::int32_t row = 0;
    for (int j = 0; j < 37; ++j) {
      row += p(i, j);
      EXPECT_EQ(c(i, j), row) << "cumsum at (" << i << ", " << j << ")";
    }
    EXPECT_EQ(s1(i), row) << "sum<1> at (" << i << ")";
    total += row;
  }
  for (int j = 0; j < 37; ++j) {
    std::int32_t column = 0;
    for (int i = 0; i < 5; ++i)
      column += p(i, j);
    EXPECT_EQ(s0(0, j), column) << "sum<0> at (0, " << j << ")";
  }
  EXPECT_EQ(all.item(), total);
  // A mask counted through a comparison.
  tile<std::int32_t, 37> v;
  tg_test::fill_uniform(v, rng, -10, 10);
  std::int32_t positives = 0;
  for (int j = 0; j < 37; ++j)
    positives += v(j) > 0;
  EXPECT_EQ(sum(v > 0).item(), positives);
}

TEST(ReduceInteger, Int32AndInt64) {
  auto rng = make_rng(10);
  tile<std::int32_t, 3, 4, 19> i;
  tile<std::int64_t, 7, 5> l;
  tg_test::fill_uniform(i, rng, -1000, 1000);
  tg_test::fill_uniform(l, rng, -(1LL << 40), 1LL << 40);
  split const si = split_at<shape<3, 4, 19>>(1);
  expect_eq(sum<1>(i), tile_of<tile<std::int32_t, 3, 19>>(reduce_ref(i.data(), si, kind::sum)),
            "int32 sum<1>");
  expect_eq(max<1>(i), tile_of<tile<std::int32_t, 3, 19>>(reduce_ref(i.data(), si, kind::max)),
            "int32 max<1>");
  expect_eq(argmin<1>(i),
            tile_of<tile<std::int32_t, 3, 19>>(reduce_ref(i.data(), si, kind::argmin)),
            "int32 argmin<1>");
  expect_eq(tile<std::int32_t, 3, 4, 19>(cumsum<2, true>(i)),
            tile_of<tile<std::int32_t, 3, 4, 19>>(
                cumsum_ref(i.data(), split_at<shape<3, 4, 19>>(2), true)),
            "int32 cumsum<2, reverse>");
  // int64 sums of values near 2^40 stay exact (no narrowing accumulator).
  std::vector<std::int64_t> want(5, 0), mins(5, 0);
  for (int c = 0; c < 5; ++c) {
    mins[static_cast<std::size_t>(c)] = l(0, c);
    for (int r = 0; r < 7; ++r) {
      want[static_cast<std::size_t>(c)] += l(r, c);
      mins[static_cast<std::size_t>(c)] = std::min(mins[static_cast<std::size_t>(c)], l(r, c));
    }
  }
  tile<std::int64_t, 5> const ls = sum<0>(l), lm = min<-2>(l);
  for (int c = 0; c < 5; ++c) {
    EXPECT_EQ(ls(c), want[static_cast<std::size_t>(c)]) << "int64 sum<0> at (" << c << ")";
    EXPECT_EQ(lm(c), mins[static_cast<std::size_t>(c)]) << "int64 min<-2> at (" << c << ")";
  }
}

} // namespace

} // namespace test_reduce
