// Elementwise operators (tile/elementwise.hpp over the op table of tile/ops.hpp), each checked
// element by element against the same operation written as a plain scalar loop: arithmetic on
// float and double, integer arithmetic with C semantics (Triton's // and % on integers),
// shifts, bitwise ops, comparisons, logic on bool tiles, where with masks of another element
// type, and compound assignment. Extents do not divide the SIMD width, so every fused loop runs
// its vector body and its scalar tail.
#include "../support/reference.hpp"

#include <cmath>
#include <cstdint>
#include <limits>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_elementwise {

namespace {

using namespace tilegrad;
using tg_test::expect_eq;
using tg_test::from_flat;
using tg_test::make_rng;

// ---------------------------------------------------------------------------------------------
// float and double
// ---------------------------------------------------------------------------------------------

template <class T>
class FloatElementwise : public ::testing::Test {};
using FloatTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(FloatElementwise, FloatTypes);

// Full = false checks a representative subset (the extra shapes exercise the loop structure,
// not each op again); Full = true checks every operator.
template <class T, bool Full, int... Ns>
void check_float_arithmetic() {
  using tl = tile<T, Ns...>;
  using bl = tile<bool, Ns...>;
  auto rng = make_rng(tl::size);
  tl a, b;
  tg_test::fill_uniform(a, rng, -10, 10);
  tg_test::fill_away_from_zero(b, rng, 0.25, 10);
  // Equal elements every third position, so == <= >= see ties.
  for (int i = 0; i < tl::size; i += 3)
    b.data()[i] = a.data()[i];
  T const* A = a.data();
  T const* B = b.data();

  // IEEE + - * / are correctly rounded in SIMD and scalar code alike: results are exact.
  expect_eq(tl(a + b), from_flat<tl>([&](int i) { return A[i] + B[i]; }), "a + b");
  expect_eq(tl(a - b), from_flat<tl>([&](int i) { return A[i] - B[i]; }), "a - b");
  expect_eq(tl(a * b), from_flat<tl>([&](int i) { return A[i] * B[i]; }), "a * b");
  expect_eq(tl(a / b), from_flat<tl>([&](int i) { return A[i] / B[i]; }), "a / b");
  expect_eq(bl(a < b), from_flat<bl>([&](int i) { return A[i] < B[i]; }), "a < b");
  if constexpr (Full) {
    expect_eq(tl(a % b), from_flat<tl>([&](int i) { return std::fmod(A[i], B[i]); }), "a % b");
    expect_eq(tl(-a), from_flat<tl>([&](int i) { return -A[i]; }), "-a");
    expect_eq(tl(1 / b), from_flat<tl>([&](int i) { return T(1) / B[i]; }), "1 / b");
    expect_eq(bl(a == b), from_flat<bl>([&](int i) { return A[i] == B[i]; }), "a == b");
    expect_eq(bl(a != b), from_flat<bl>([&](int i) { return A[i] != B[i]; }), "a != b");
    expect_eq(bl(a <= b), from_flat<bl>([&](int i) { return A[i] <= B[i]; }), "a <= b");
    expect_eq(bl(a > b), from_flat<bl>([&](int i) { return A[i] > B[i]; }), "a > b");
    expect_eq(bl(a >= b), from_flat<bl>([&](int i) { return A[i] >= B[i]; }), "a >= b");
    expect_eq(bl(a > 0.5), from_flat<bl>([&](int i) { return A[i] > T(0.5); }), "a > 0.5");
  }
  // One fused expression with numbers on either side (a double constant meets a float tile as
  // float: Triton's rule). Exact, except where FMA contraction may round a * b + c once (terms
  // stay below 200 in magnitude).
  constexpr double contraction = tg_test::contraction_rtol<T>;
  tg_test::expect_near(tl((a - b) * a / (b * b + T(1.5)) - 2.5 * a + 3), from_flat<tl>([&](int i) {
                         return (A[i] - B[i]) * A[i] / (B[i] * B[i] + T(1.5)) - T(2.5) * A[i] +
                                T(3);
                       }),
                       contraction, 200, "fused");

  // Compound assignment evaluates in place, in one pass.
  tl x = a;
  x += b;
  x *= T(2);
  x -= a;
  x /= b;
  tl const want = from_flat<tl>([&](int i) { return ((A[i] + B[i]) * T(2) - A[i]) / B[i]; });
  expect_eq(x, want, "+= *= -= /=");
  x %= T(0.75);
  expect_eq(x, from_flat<tl>([&](int i) { return std::fmod(want.data()[i], T(0.75)); }), "%=");
  // The destination as an operand of its own expression (no transpose: no temporary needed).
  tl y = a;
  y = y * y + y;
  tg_test::expect_near(y, from_flat<tl>([&](int i) { return A[i] * A[i] + A[i]; }), contraction,
                       100, "y = y * y + y");
}

TYPED_TEST(FloatElementwise, ArithmeticAndComparisons) {
  using T = TypeParam;
  check_float_arithmetic<T, false, 1>();
  check_float_arithmetic<T, false, 3>();
  check_float_arithmetic<T, false, 7, 5>();
  check_float_arithmetic<T, true, 5, 37>();
  check_float_arithmetic<T, false, 3, 4, 19>();
  check_float_arithmetic<T, false, 64, 64>();
}

TYPED_TEST(FloatElementwise, RankZeroTile) {
  using T = TypeParam;
  tile<T> a(T(1.25)), b(T(-4));
  tile<T> c = a * b + 1;
  EXPECT_EQ(c.item(), T(1.25) * T(-4) + T(1));
  EXPECT_TRUE(tile<bool>(a > b).item());
  EXPECT_FALSE(tile<bool>(a == b).item());
}

// ---------------------------------------------------------------------------------------------
// int32 and int64: C semantics
// ---------------------------------------------------------------------------------------------

template <class T>
class IntegerElementwise : public ::testing::Test {};
using IntegerTypes = ::testing::Types<std::int32_t, std::int64_t>;
TYPED_TEST_SUITE(IntegerElementwise, IntegerTypes);

template <class T, bool Full, int... Ns>
void check_integer_ops() {
  using tl = tile<T, Ns...>;
  using bl = tile<bool, Ns...>;
  auto rng = make_rng(tl::size + sizeof(T));
  tl a, b, s;
  tg_test::fill_uniform(a, rng, -1000, 1000);
  tg_test::fill_away_from_zero(b, rng, 1, 50); // nonzero, either sign
  tg_test::fill_uniform(s, rng, 0, 8 * sizeof(T) - 12);
  for (int i = 0; i < tl::size; i += 4)
    b.data()[i] = a.data()[i] == 0 ? 1 : a.data()[i];
  T const* A = a.data();
  T const* B = b.data();
  T const* SH = s.data();

  expect_eq(tl(a + b), from_flat<tl>([&](int i) { return A[i] + B[i]; }), "a + b");
  expect_eq(tl(a * b), from_flat<tl>([&](int i) { return A[i] * B[i]; }), "a * b");
  // Truncating division, remainder with the dividend's sign: Triton's // and % on integers.
  expect_eq(tl(a / b), from_flat<tl>([&](int i) { return A[i] / B[i]; }), "a / b");
  expect_eq(tl(a % b), from_flat<tl>([&](int i) { return A[i] % B[i]; }), "a % b");
  expect_eq(tl(a << s), from_flat<tl>([&](int i) { return A[i] << SH[i]; }), "a << s");
  expect_eq(tl(a & b), from_flat<tl>([&](int i) { return A[i] & B[i]; }), "a & b");
  expect_eq(bl(a < b), from_flat<bl>([&](int i) { return A[i] < B[i]; }), "a < b");
  if constexpr (Full) {
    expect_eq(tl(a - b), from_flat<tl>([&](int i) { return A[i] - B[i]; }), "a - b");
    expect_eq(tl(a / -7), from_flat<tl>([&](int i) { return A[i] / T(-7); }), "a / -7");
    expect_eq(tl(a % 7), from_flat<tl>([&](int i) { return A[i] % T(7); }), "a % 7");
    expect_eq(tl(-100 / b), from_flat<tl>([&](int i) { return T(-100) / B[i]; }), "-100 / b");
    expect_eq(tl(-a), from_flat<tl>([&](int i) { return -A[i]; }), "-a");
    expect_eq(tl(abs(a)), from_flat<tl>([&](int i) { return A[i] < 0 ? -A[i] : A[i]; }), "abs(a)");
    expect_eq(tl(a >> s), from_flat<tl>([&](int i) { return A[i] >> SH[i]; }), "a >> s");
    expect_eq(tl(a << 3), from_flat<tl>([&](int i) { return A[i] << 3; }), "a << 3");
    expect_eq(tl(a >> 2), from_flat<tl>([&](int i) { return A[i] >> 2; }), "a >> 2");
    expect_eq(tl(a | b), from_flat<tl>([&](int i) { return A[i] | B[i]; }), "a | b");
    expect_eq(tl(a ^ b), from_flat<tl>([&](int i) { return A[i] ^ B[i]; }), "a ^ b");
    expect_eq(tl(a & 0xff), from_flat<tl>([&](int i) { return A[i] & 0xff; }), "a & 0xff");
    expect_eq(tl(~a), from_flat<tl>([&](int i) { return ~A[i]; }), "~a");
    expect_eq(bl(a == b), from_flat<bl>([&](int i) { return A[i] == B[i]; }), "a == b");
    expect_eq(bl(a != b), from_flat<bl>([&](int i) { return A[i] != B[i]; }), "a != b");
    expect_eq(bl(a <= b), from_flat<bl>([&](int i) { return A[i] <= B[i]; }), "a <= b");
    expect_eq(bl(a > b), from_flat<bl>([&](int i) { return A[i] > B[i]; }), "a > b");
    expect_eq(bl(a >= b), from_flat<bl>([&](int i) { return A[i] >= B[i]; }), "a >= b");

    tl x = a;
    x += b;
    x *= 3;
    x -= 1;
    x /= b;
    x %= 5;
    expect_eq(x, from_flat<tl>([&](int i) { return ((A[i] + B[i]) * 3 - 1) / B[i] % 5; }),
              "+= *= -= /= %=");
  }
}

TYPED_TEST(IntegerElementwise, ArithmeticBitwiseComparisons) {
  using T = TypeParam;
  check_integer_ops<T, false, 1>();
  check_integer_ops<T, false, 7, 5>();
  check_integer_ops<T, true, 5, 37>();
  check_integer_ops<T, false, 3, 4, 19>();
}

TYPED_TEST(IntegerElementwise, DivisionAndRemainderOfNegativeOperands) {
  using T = TypeParam;
  // C truncates toward zero and the remainder takes the dividend's sign; so do Triton's // and
  // % on integer tensors (unlike Python's floor division on ints).
  tile<T, 4> a, b;
  T const av[] = {7, -7, 7, -7}, bv[] = {2, 2, -2, -2};
  for (int i = 0; i < 4; ++i)
    a(i) = av[i], b(i) = bv[i];
  tile<T, 4> q = a / b, r = a % b;
  T const qv[] = {3, -3, -3, 3}, rv[] = {1, -1, 1, -1};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(q(i), qv[i]) << av[i] << " / " << bv[i];
    EXPECT_EQ(r(i), rv[i]) << av[i] << " % " << bv[i];
  }
}

// ---------------------------------------------------------------------------------------------
// bool tiles: & | ^ ! ~ are the logical operations
// ---------------------------------------------------------------------------------------------

template <int... Ns>
void check_logic() {
  using bl = tile<bool, Ns...>;
  using il = tile<std::int32_t, Ns...>;
  auto rng = make_rng(bl::size + 77);
  bl p, q;
  tg_test::fill_uniform(p, rng, 0, 1);
  tg_test::fill_uniform(q, rng, 0, 1);
  bool const* P = p.data();
  bool const* Q = q.data();
  expect_eq(bl(p & q), from_flat<bl>([&](int i) { return P[i] && Q[i]; }), "p & q");
  expect_eq(bl(p | q), from_flat<bl>([&](int i) { return P[i] || Q[i]; }), "p | q");
  expect_eq(bl(p ^ q), from_flat<bl>([&](int i) { return P[i] != Q[i]; }), "p ^ q");
  expect_eq(bl(!p), from_flat<bl>([&](int i) { return !P[i]; }), "!p");
  expect_eq(bl(~p), from_flat<bl>([&](int i) { return !P[i]; }), "~p");
  expect_eq(bl((!(p & q)) | (p ^ q)),
            from_flat<bl>([&](int i) { return !(P[i] && Q[i]) || (P[i] != Q[i]); }),
            "!(p & q) | (p ^ q)");

  // Masks of int32 comparisons combined with logic, fused.
  il u, v;
  tg_test::fill_uniform(u, rng, -5, 5);
  tg_test::fill_uniform(v, rng, -5, 5);
  std::int32_t const* U = u.data();
  std::int32_t const* V = v.data();
  expect_eq(bl(((u < v) & (u >= 0)) | !(v != 3)),
            from_flat<bl>([&](int i) { return (U[i] < V[i] && U[i] >= 0) || !(V[i] != 3); }),
            "((u < v) & (u >= 0)) | !(v != 3)");
  expect_eq(bl((u < v) ^ p), from_flat<bl>([&](int i) { return (U[i] < V[i]) != P[i]; }),
            "(u < v) ^ p");
}

TEST(BoolElementwise, LogicalOps) {
  check_logic<1>();
  check_logic<7, 5>();
  check_logic<5, 37>();
  check_logic<3, 4, 19>();
}

// ---------------------------------------------------------------------------------------------
// where: masks of another element type select float / double values (mask conversion)
// ---------------------------------------------------------------------------------------------

template <class T, class I, int... Ns>
void check_where() {
  using tl = tile<T, Ns...>;
  using il = tile<I, Ns...>;
  auto rng = make_rng(tl::size + 3 * sizeof(I));
  il u, v;
  tl x, y;
  tg_test::fill_uniform(u, rng, -5, 5);
  tg_test::fill_uniform(v, rng, -5, 5);
  tg_test::fill_uniform(x, rng, -10, 10);
  tg_test::fill_uniform(y, rng, -10, 10);
  I const* U = u.data();
  I const* V = v.data();
  T const* X = x.data();
  T const* Y = y.data();

  expect_eq(tl(where(u < v, x, y)), from_flat<tl>([&](int i) { return U[i] < V[i] ? X[i] : Y[i]; }),
            "where(u < v, x, y)");
  expect_eq(tl(where(u == v, x * 2, -y)),
            from_flat<tl>([&](int i) { return U[i] == V[i] ? X[i] * T(2) : -Y[i]; }),
            "where(u == v, x * 2, -y)");
  expect_eq(tl(where(u >= 0, x, 0.0)),
            from_flat<tl>([&](int i) { return U[i] >= 0 ? X[i] : T(0); }), "where(u >= 0, x, 0.0)");
  expect_eq(tl(where(u > v, 1.5, y)),
            from_flat<tl>([&](int i) { return U[i] > V[i] ? T(1.5) : Y[i]; }),
            "where(u > v, 1.5, y)");
  // A mask stored in a bool tile, and a mask of the value type itself.
  tile<bool, Ns...> m = (u <= v) | (v == 0);
  expect_eq(tl(where(m, x, y)),
            from_flat<tl>([&](int i) { return U[i] <= V[i] || V[i] == 0 ? X[i] : Y[i]; }),
            "where(bool tile, x, y)");
  expect_eq(tl(where(x < y, x, y)), from_flat<tl>([&](int i) { return X[i] < Y[i] ? X[i] : Y[i]; }),
            "where(x < y, x, y)");
  // A float-typed mask selecting integers: the conversion the other way.
  expect_eq(il(where(x > y, u, v)), from_flat<il>([&](int i) { return X[i] > Y[i] ? U[i] : V[i]; }),
            "where(x > y, u, v)");
}

template <class T>
class Where : public ::testing::Test {};
TYPED_TEST_SUITE(Where, FloatTypes);

TYPED_TEST(Where, MasksFromInt32Comparisons) {
  using T = TypeParam;
  check_where<T, std::int32_t, 1>();
  check_where<T, std::int32_t, 5, 37>();
  check_where<T, std::int32_t, 3, 4, 19>();
}

TYPED_TEST(Where, MasksFromInt64Comparisons) {
  using T = TypeParam;
  check_where<T, std::int64_t, 3, 4, 19>();
}

TYPED_TEST(Where, BroadcastMaskAndOperands) {
  using T = TypeParam;
  auto rng = make_rng(5);
  tile<std::int32_t, 7> u;
  tile<std::int32_t, 37> v;
  tile<T, 7, 37> x;
  tile<T, 37> z;
  tg_test::fill_uniform(u, rng, -5, 5);
  tg_test::fill_uniform(v, rng, -5, 5);
  tg_test::fill_uniform(x, rng, -10, 10);
  tg_test::fill_uniform(z, rng, -10, 10);
  tile<T, 7, 37> y = where(col(u) < row(v), x, T(-1));
  tile<T, 7, 37> w = where(col(u) == 0, z, x);
  for (int r = 0; r < 7; ++r)
    for (int c = 0; c < 37; ++c) {
      EXPECT_EQ(y(r, c), u(r) < v(c) ? x(r, c) : T(-1)) << "at (" << r << ", " << c << ")";
      EXPECT_EQ(w(r, c), u(r) == 0 ? z(c) : x(r, c)) << "at (" << r << ", " << c << ")";
    }
}

// -x flips the sign on every lane: xsimd's negation of a float batch was 0 - x, which gave +0
// for +0 on the 16 lanes of a batch and -0 on the scalar tail of the same tile.
template <class F>
void expect_negation_flips_the_sign() {
  constexpr int n = 19; // a batch and a tail
  tile<F, n> x;
  for (int i = 0; i < n; ++i)
    x(i) = i % 3 == 0 ? F(0) : i % 3 == 1 ? -F(0) : F(i) - F(9);
  tile<F, n> const y = -x;
  tile<F, n> const z = -(x * F(1)); // inside an expression too
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(std::signbit(y(i)), !std::signbit(x(i))) << i;
    EXPECT_EQ(std::signbit(z(i)), !std::signbit(x(i))) << i;
    EXPECT_EQ(y(i), -x(i)) << i;
  }
}

TEST(Elementwise, NegationFlipsTheSignOnEveryLane) {
  expect_negation_flips_the_sign<float>();
  expect_negation_flips_the_sign<double>();
}

// Comparisons with NaN as in C++ and Triton, on the vector lanes as on the scalar tail: every
// ordering and == false, != true (`x != x` finds NaN). xsimd computes != of AVX and AVX-512 float
// batches as an ordered comparison, and the vector lanes said NaN != NaN was false.
template <class T>
void expect_nan_comparisons() {
  constexpr int N = 37; // vectors and a tail
  tile<T, N> x, y;
  for (int i = 0; i < N; ++i) {
    x(i) = i % 3 ? T(i) : std::numeric_limits<T>::quiet_NaN();
    y(i) = i % 4 ? T(i) : std::numeric_limits<T>::quiet_NaN();
  }
  tile<bool, N> const ne = x != x, ne_y = x != y, eq = x == y, lt = x < y, ge = x >= y;
  tile<T, N> const scrubbed = where(x != x, T(0), x);
  for (int i = 0; i < N; ++i) {
    bool const nx = std::isnan(x(i)), any = nx || std::isnan(y(i));
    EXPECT_EQ(ne(i), nx) << i;
    EXPECT_EQ(ne_y(i), any || x(i) != y(i)) << i;
    EXPECT_EQ(eq(i), !any && x(i) == y(i)) << i;
    EXPECT_EQ(lt(i), !any && x(i) < y(i)) << i;
    EXPECT_EQ(ge(i), !any && x(i) >= y(i)) << i;
    EXPECT_EQ(scrubbed(i), nx ? T(0) : x(i)) << i;
  }
}

// abs of an unsigned tile is the tile (it did not compile: std::abs of an unsigned number is
// ambiguous), on vector lanes and tails.
TEST(Elementwise, AbsOfAnUnsignedTileIsTheTile) {
  tile<std::uint32_t, 37> u;
  tile<std::uint8_t, 37> b;
  for (int i = 0; i < 37; ++i)
    u(i) = 4000000000u - 97u * static_cast<std::uint32_t>(i),
    b(i) = static_cast<std::uint8_t>(250 - i);
  tile<std::uint32_t, 37> const au = abs(u);
  tile<std::uint8_t, 37> const ab = abs(b);
  for (int i = 0; i < 37; ++i) {
    EXPECT_EQ(au(i), u(i)) << i;
    EXPECT_EQ(ab(i), b(i)) << i;
  }
}

TEST(Elementwise, ComparisonsWithNaNOnEveryLane) {
  expect_nan_comparisons<float>();
  expect_nan_comparisons<double>();
}

} // namespace

} // namespace test_elementwise
