// Element-type conversion, to<U>(x) of tile/elementwise.hpp (and core/bf16.hpp), between float,
// double, int32, int64, bool and bf16: each against static_cast (C++'s conversion, truncation
// toward zero for float -> int) element by element, and bf16 against an independent
// round-to-nearest-even reference: the two bf16 neighbours of x found by search, the nearer one
// chosen by exact comparison with their midpoint, ties to the even one. Covers ties, values one
// ulp off the rounding boundary, overflow to inf, subnormals, signed zeros, NaN and inf.
#include "../support/reference.hpp"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_cast {

namespace {

using namespace tilegrad;
using tg_test::make_rng;

// ---------------------------------------------------------------------------------------------
// The bf16 reference
// ---------------------------------------------------------------------------------------------

// Magnitude of the non-negative bf16 bit pattern b (0x7f80 is inf; as the neighbour above the
// largest finite bf16 it counts as 2^128, which puts the overflow threshold where IEEE puts it).
long double bf16_magnitude(std::uint16_t b) {
  if (b >= 0x7f80)
    return std::ldexp(1.0L, 128);
  return static_cast<long double>(std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16));
}

/// Bits of the bf16 nearest to x (ties to the even pattern); x not NaN. long double holds every
/// float, double and int64 value exactly (x86's 64-bit significand), so every step is exact.
std::uint16_t bf16_ref(long double x) {
  std::uint16_t const sign = std::signbit(x) ? 0x8000 : 0;
  long double const ax = std::fabs(x);
  if (std::isinf(ax))
    return sign | 0x7f80;
  // Largest pattern lo in [0, 0x7f7f] with magnitude(lo) <= ax (bf16 patterns are ordered).
  std::uint16_t lo = 0, hi = 0x7f7f;
  if (bf16_magnitude(hi) <= ax) {
    lo = hi;
  } else {
    while (hi - lo > 1) {
      auto const mid = static_cast<std::uint16_t>((lo + hi) / 2);
      (bf16_magnitude(mid) <= ax ? lo : hi) = mid;
    }
  }
  if (bf16_magnitude(lo) == ax)
    return sign | lo;
  std::uint16_t const up = static_cast<std::uint16_t>(lo + 1);
  long double const twice = 2 * ax, mid = bf16_magnitude(lo) + bf16_magnitude(up);
  std::uint16_t const r = twice < mid ? lo : twice > mid ? up : ((lo & 1) ? up : lo);
  return sign | r;
}

static_assert(std::numeric_limits<long double>::digits >= 64,
              "the bf16 reference needs a long double that holds every int64 exactly");

bool is_bf16_nan(std::uint16_t b) {
  return (b & 0x7f80) == 0x7f80 && (b & 0x007f) != 0;
}

// to<bf16> of each value of `xs` (in tiles of 61 elements: vector body and tail on any width)
// against the reference.
template <class T>
void check_to_bf16(std::vector<T> const& xs, char const* what) {
  constexpr int n = 61;
  for (std::size_t base = 0; base < xs.size(); base += n) {
    tile<T, n> x;
    for (int i = 0; i < n; ++i)
      x(i) = xs[std::min(base + static_cast<std::size_t>(i), xs.size() - 1)];
    tile<bf16, n> const b = to<bf16>(x);
    for (int i = 0; i < n; ++i) {
      long double const v = static_cast<long double>(x(i));
      if (std::isnan(v)) {
        EXPECT_TRUE(is_bf16_nan(b(i).bits))
            << what << ": NaN must stay NaN, got bits " << std::hex << b(i).bits;
        EXPECT_EQ(b(i).bits & 0x8000, std::signbit(v) ? 0x8000 : 0) << what << ": NaN sign";
      } else {
        EXPECT_EQ(b(i).bits, bf16_ref(v))
            << what << ": " << std::hexfloat << v << std::defaultfloat << " (" << v << ") at ("
            << base + static_cast<std::size_t>(i) << ")";
      }
    }
  }
}

float float_bits(std::uint32_t u) {
  return std::bit_cast<float>(u);
}

// Float patterns around every interesting place of bf16 rounding, for bf16 pattern hi16: the
// exact bf16 value, the midpoint to the next pattern (a tie), and one float ulp either side.
void add_boundary_cases(std::vector<float>& xs, std::uint16_t hi16) {
  std::uint32_t const base = static_cast<std::uint32_t>(hi16) << 16;
  for (std::uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu})
    xs.push_back(float_bits(base | low));
}

TEST(CastBf16, FromFloatTiesAndBoundaries) {
  std::vector<float> xs;
  // Even and odd lower neighbours (ties go down, resp. up), both signs, several binades.
  for (std::uint16_t h :
       {0x3f80, 0x3f81, 0x3f82, 0x3fff, 0x4000, 0x4049, 0x4b80, 0x0080, 0x0081, 0x7f7e, 0x7f7f})
    for (std::uint16_t s : {0x0000, 0x8000})
      add_boundary_cases(xs, static_cast<std::uint16_t>(h | s));
  // Subnormal floats (bf16 has float's exponent range: it rounds them like any other value).
  for (std::uint16_t h : {0x0000, 0x0001, 0x0002, 0x007f, 0x8000, 0x8001})
    add_boundary_cases(xs, h);
  // Signed zeros, infinities, the largest float (rounds to inf), the smallest ones.
  float const inf = std::numeric_limits<float>::infinity();
  for (float v : {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::max(),
                  -std::numeric_limits<float>::max(), std::numeric_limits<float>::min(),
                  std::numeric_limits<float>::denorm_min(), 1.0f, -1.0f, 3.0f, 1.0f / 3.0f})
    xs.push_back(v);
  check_to_bf16(xs, "float -> bf16");

  // The cases spelled out, so a reader sees the rule without the reference.
  tile<float, 6> x;
  float const v[6] = {1.0f + 0x1p-8f,            // tie, lower neighbour 1.0 even: down
                      1.0f + 3 * 0x1p-8f,        // tie, lower neighbour 1 + 2^-7 odd: up
                      1.0f + 0x1p-8f + 0x1p-23f, // just above the tie: up
                      -(1.0f + 0x1p-8f),         // negative tie: magnitude down
                      float_bits(0x7f7f8000u),   // tie between the largest bf16 (odd) and inf: inf
                      float_bits(0x7f7f7fffu)};  // just below it: the largest bf16
  for (int i = 0; i < 6; ++i)
    x(i) = v[i];
  tile<bf16, 6> const b = to<bf16>(x);
  std::uint16_t const want[6] = {0x3f80, 0x3f82, 0x3f81, 0xbf80, 0x7f80, 0x7f7f};
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(b(i).bits, want[i]) << "case " << i << ": " << v[i];
}

TEST(CastBf16, FromFloatRandomBitPatterns) {
  auto rng = make_rng(1);
  std::uniform_int_distribution<std::uint32_t> d;
  std::vector<float> xs;
  for (int i = 0; i < 1 << 16; ++i) {
    float const f = float_bits(d(rng));
    if (!std::isnan(f))
      xs.push_back(f);
  }
  check_to_bf16(xs, "float -> bf16 (random patterns)");
}

TEST(CastBf16, NaNStaysNaN) {
  std::vector<float> xs;
  // Quiet NaNs, and NaNs whose payload lies only in the low 16 bits (truncation would make them
  // infinities).
  for (std::uint32_t u :
       {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7f80ffffu, 0x7fbfffffu, 0x7fffffffu})
    xs.push_back(float_bits(u));
  check_to_bf16(xs, "NaN -> bf16");
  tile<bf16, 2> b;
  b(0) = bf16::from_bits(0x7fc1);
  b(1) = bf16::from_bits(0xff81);
  tile<float, 2> const f = to<float>(b);
  EXPECT_TRUE(std::isnan(f(0)));
  EXPECT_TRUE(std::isnan(f(1)));
}

TEST(CastBf16, FromDoubleRoundsOnce) {
  // Doubles just off a bf16 midpoint, by less than half a float ulp: rounding to float first
  // lands on the midpoint and then ties to even, the wrong way half of the time.
  std::vector<double> xs;
  for (std::uint16_t h : {0x3f80, 0x3f81, 0x4049, 0x0080, 0x7f7e, 0x0001}) {
    double const lo = std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
    double const up = std::bit_cast<float>(static_cast<std::uint32_t>(h + 1) << 16);
    double const mid = (lo + up) / 2;
    double const tiny = (up - lo) * 0x1p-30;
    for (double v : {mid, mid + tiny, mid - tiny, lo, up, lo + tiny, up - tiny}) {
      xs.push_back(v);
      xs.push_back(-v);
    }
  }
  auto rng = make_rng(2);
  std::uniform_real_distribution<double> d(-1e6, 1e6);
  for (int i = 0; i < 2000; ++i)
    xs.push_back(d(rng));
  double const inf = std::numeric_limits<double>::infinity();
  for (double v : {0.0, -0.0, inf, -inf, 1e300, -1e300, 1e-300, 3.4e38, 3.3e38})
    xs.push_back(v);
  check_to_bf16(xs, "double -> bf16");
}

TEST(CastBf16, FromIntegersRoundsOnce) {
  // 2^24 + 2^16 + 1 lies just above a bf16 midpoint; as a float it rounds onto the midpoint.
  std::vector<std::int32_t> is = {0,
                                  1,
                                  -1,
                                  255,
                                  256,
                                  257,
                                  16777217,
                                  (1 << 24) + (1 << 16) + 1,
                                  -((1 << 24) + (1 << 16) + 1),
                                  (1 << 24) + (3 << 16),
                                  std::numeric_limits<std::int32_t>::max(),
                                  std::numeric_limits<std::int32_t>::min()};
  std::vector<std::int64_t> ls = {0,
                                  -1,
                                  (std::int64_t{1} << 40) + (std::int64_t{1} << 32) + 1,
                                  -((std::int64_t{1} << 40) + (std::int64_t{1} << 32) + 1),
                                  (std::int64_t{1} << 53) + 1,
                                  std::numeric_limits<std::int64_t>::max(),
                                  std::numeric_limits<std::int64_t>::min()};
  auto rng = make_rng(3);
  std::uniform_int_distribution<std::int32_t> di;
  std::uniform_int_distribution<std::int64_t> dl;
  for (int i = 0; i < 2000; ++i) {
    is.push_back(di(rng));
    ls.push_back(dl(rng));
    ls.push_back(dl(rng) >> (i % 60));
  }
  check_to_bf16(is, "int32 -> bf16");
  check_to_bf16(ls, "int64 -> bf16");
}

TEST(CastBf16, ToOtherTypesIsExactOrTruncates) {
  // Every bf16 pattern: to float and double exactly (the bits shifted up), to int32 truncated.
  for (int chunk = 0; chunk < 256; ++chunk) {
    tile<bf16, 256> b;
    for (int i = 0; i < 256; ++i)
      b(i) = bf16::from_bits(static_cast<std::uint16_t>(chunk * 256 + i));
    tile<float, 256> const f = to<float>(b);
    tile<double, 256> const d = to<double>(b);
    for (int i = 0; i < 256; ++i) {
      std::uint16_t const bits = b(i).bits;
      float const want = std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(f(i)) && std::isnan(d(i))) << "bf16 NaN " << std::hex << bits;
      } else {
        EXPECT_EQ(std::bit_cast<std::uint32_t>(f(i)), std::bit_cast<std::uint32_t>(want))
            << "bf16 -> float of " << std::hex << bits;
        EXPECT_EQ(d(i), double(want)) << "bf16 -> double of " << std::hex << bits;
      }
    }
  }
  tile<bf16, 5> b;
  float const v[5] = {2.5f, -2.5f, 100.0f, -0.75f, 65280.0f};
  for (int i = 0; i < 5; ++i)
    b(i) = bf16(v[i]);
  tile<std::int32_t, 5> const i32 = to<std::int32_t>(b);
  tile<std::int64_t, 5> const i64 = to<std::int64_t>(b);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(i32(i), static_cast<std::int32_t>(v[i])) << "bf16 -> int32 of " << v[i];
    EXPECT_EQ(i64(i), static_cast<std::int64_t>(v[i])) << "bf16 -> int64 of " << v[i];
  }
}

// ---------------------------------------------------------------------------------------------
// float, double, int32, int64, bool
// ---------------------------------------------------------------------------------------------

// to<To>(x) == static_cast<To>(x) for every element of x (in range for To).
template <class To, class From, int... Ns>
void check_cast(tile<From, Ns...> const& x, char const* what) {
  using tt = tile<To, Ns...>;
  tt const got = to<To>(x);
  tt const want = tg_test::from_flat<tt>([&](int i) { return static_cast<To>(x.data()[i]); });
  tg_test::expect_eq(got, want, what);
}

template <class T, int... Ns>
tile<T, Ns...> uniform(int salt, double lo, double hi) {
  tile<T, Ns...> t;
  auto rng = make_rng(static_cast<std::uint64_t>(salt));
  tg_test::fill_uniform(t, rng, lo, hi);
  return t;
}

TEST(Cast, FloatAndDouble) {
  auto const f = uniform<float, 7, 37>(4, -1e6, 1e6);
  auto const d = uniform<double, 7, 37>(5, -1e6, 1e6);
  check_cast<double>(f, "float -> double");
  check_cast<float>(d, "double -> float");
  tile<double, 6> e;
  double const ev[6] = {1e39, -1e39, 1e-46, -1e-46, 1.0 + 0x1p-24, 1.0 + 0x1p-24 + 0x1p-40};
  for (int i = 0; i < 6; ++i)
    e(i) = ev[i];
  check_cast<float>(e, "double -> float: overflow, underflow, ties");
  tile<double, 2> n;
  n(0) = std::numeric_limits<double>::quiet_NaN();
  n(1) = -std::numeric_limits<double>::infinity();
  tile<float, 2> const nf = to<float>(n);
  EXPECT_TRUE(std::isnan(nf(0)));
  EXPECT_EQ(nf(1), -std::numeric_limits<float>::infinity());
}

TEST(Cast, FloatingToIntegerTruncatesTowardZero) {
  auto const f = uniform<float, 7, 37>(6, -2e9, 2e9);
  auto const small = uniform<float, 5, 37>(7, -5, 5);
  auto const d = uniform<double, 7, 37>(8, -9e18, 9e18);
  auto const ds = uniform<double, 3, 4, 19>(9, -5, 5);
  check_cast<std::int32_t>(f, "float -> int32");
  check_cast<std::int32_t>(small, "float -> int32 (small, both signs)");
  check_cast<std::int64_t>(small, "float -> int64");
  check_cast<std::int64_t>(d, "double -> int64");
  check_cast<std::int32_t>(ds, "double -> int32");
  tile<float, 4> t;
  float const tv[4] = {2.7f, -2.7f, 0.5f, -0.5f};
  for (int i = 0; i < 4; ++i)
    t(i) = tv[i];
  tile<std::int32_t, 4> const ti = to<std::int32_t>(t);
  EXPECT_EQ(ti(0), 2);
  EXPECT_EQ(ti(1), -2);
  EXPECT_EQ(ti(2), 0);
  EXPECT_EQ(ti(3), 0);
}

TEST(Cast, IntegerToFloatingRoundsToNearest) {
  auto const i = uniform<std::int32_t, 7, 37>(10, -2147483647.0, 2147483647.0);
  auto const l = uniform<std::int64_t, 7, 37>(11, -9.2e18, 9.2e18);
  check_cast<float>(i, "int32 -> float");
  check_cast<double>(i, "int32 -> double");
  check_cast<float>(l, "int64 -> float");
  check_cast<double>(l, "int64 -> double");
  tile<std::int64_t, 5> e;
  std::int64_t const ev[5] = {(std::int64_t{1} << 53) + 1, -(std::int64_t{1} << 53) - 3,
                              std::numeric_limits<std::int64_t>::max(),
                              std::numeric_limits<std::int64_t>::min(),
                              (std::int64_t{1} << 24) + 1};
  for (int k = 0; k < 5; ++k)
    e(k) = ev[k];
  check_cast<double>(e, "int64 -> double (ties)");
  check_cast<float>(e, "int64 -> float (ties)");
}

TEST(Cast, BetweenIntegerWidths) {
  auto const i = uniform<std::int32_t, 7, 37>(12, -2147483647.0, 2147483647.0);
  auto const l = uniform<std::int64_t, 7, 37>(13, -9.2e18, 9.2e18);
  check_cast<std::int64_t>(i, "int32 -> int64 (sign extension)");
  check_cast<std::int32_t>(l, "int64 -> int32 (modulo 2^32, as static_cast)");
}

TEST(Cast, Bool) {
  auto const p = uniform<bool, 5, 37>(14, 0, 1);
  auto const f = uniform<float, 5, 37>(15, -1, 1);
  auto const i = uniform<std::int32_t, 5, 37>(16, -2, 2);
  check_cast<float>(p, "bool -> float");
  check_cast<double>(p, "bool -> double");
  check_cast<std::int32_t>(p, "bool -> int32");
  check_cast<std::int64_t>(p, "bool -> int64");
  check_cast<bool>(f, "float -> bool");
  check_cast<bool>(i, "int32 -> bool");
}

TEST(Cast, OfExpressionsAndImplicitWidening) {
  auto const i = uniform<std::int32_t, 3, 4, 19>(17, -1000, 1000);
  tile<float, 3, 4, 19> const f = to<float>(i * 3 + 1) / 2;
  tile<double, 3, 4, 19> const d = i; // int32 -> double is a promotion: implicit
  tile<std::int32_t, 3, 4, 19> const back = to<std::int32_t>(f * 2);
  for (int k = 0; k < i.size; ++k) {
    std::int32_t const v = i.data()[k];
    EXPECT_EQ(f.data()[k], float(v * 3 + 1) / 2)
        << tg_test::at_str(tg_test::extents_of<shape<3, 4, 19>>(), k);
    EXPECT_EQ(d.data()[k], double(v)) << tg_test::at_str(tg_test::extents_of<shape<3, 4, 19>>(), k);
    EXPECT_EQ(back.data()[k], v * 3 + 1)
        << tg_test::at_str(tg_test::extents_of<shape<3, 4, 19>>(), k);
  }
}

} // namespace

} // namespace test_cast
