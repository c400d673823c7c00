// Tile creation (tile/creation.hpp: zeros, full, arange) and the tile basics of tile/tile.hpp
// they rest on: zero-initialised default construction, fill construction, rank-0 item(), and
// row-major element access.
#include "../support/reference.hpp"

#include <cstdint>
#include <type_traits>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_creation {

namespace {

using namespace tilegrad;

template <class T>
class Creation : public ::testing::Test {};
using FloatTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(Creation, FloatTypes);

template <class T, int... Ns>
void check_zeros_and_full() {
  using tl = tile<T, Ns...>;
  auto const e = tg_test::extents_of<shape<Ns...>>();
  tl const z = zeros<T, Ns...>();
  tl const f = full<T, Ns...>(T(-2.75));
  tl const d;              // default: zero-filled
  tl const v(T(0.5));      // every element v
  tl const ex = f * 2 + z; // they are ordinary tiles in expressions
  tl const want_zero = tg_test::from_flat<tl>([](int) { return T(0); });
  tg_test::check_eq(z.data(), want_zero.data(), e, "zeros");
  tg_test::check_eq(d.data(), want_zero.data(), e, "tile()");
  tg_test::expect_eq(f, tg_test::from_flat<tl>([](int) { return T(-2.75); }), "full");
  tg_test::expect_eq(v, tg_test::from_flat<tl>([](int) { return T(0.5); }), "tile(v)");
  tg_test::expect_eq(ex, tg_test::from_flat<tl>([](int) { return T(-5.5); }), "full * 2 + zeros");
}

TYPED_TEST(Creation, ZerosAndFull) {
  using T = TypeParam;
  check_zeros_and_full<T>();
  check_zeros_and_full<T, 1>();
  check_zeros_and_full<T, 7, 5>();
  check_zeros_and_full<T, 5, 37>();
  check_zeros_and_full<T, 3, 4, 19>();
  check_zeros_and_full<T, 64, 64>();
}

TEST(Creation, OtherElementTypes) {
  tile<std::int64_t, 3, 5> const z = zeros<std::int64_t, 3, 5>();
  tile<std::int32_t, 7> const f = full<std::int32_t, 7>(-9);
  tile<bool, 2, 3> const t = full<bool, 2, 3>(true);
  tile<bf16, 5> const b = full<bf16, 5>(bf16(1.5f));
  tile<bool, 4> const dflt;
  for (int i = 0; i < 15; ++i)
    EXPECT_EQ(z.data()[i], 0) << "zeros<int64> at (" << i / 5 << ", " << i % 5 << ")";
  for (int i = 0; i < 7; ++i)
    EXPECT_EQ(f(i), -9) << "full<int32> at (" << i << ")";
  for (int i = 0; i < 6; ++i)
    EXPECT_TRUE(t.data()[i]) << "full<bool> at (" << i / 3 << ", " << i % 3 << ")";
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(b(i).bits, 0x3fc0) << "full<bf16> at (" << i << ")";
  for (int i = 0; i < 4; ++i)
    EXPECT_FALSE(dflt(i)) << "tile<bool>() at (" << i << ")";
}

TEST(Creation, RankZeroItem) {
  tile<double> const s(3.25);
  EXPECT_EQ(s.item(), 3.25);
  EXPECT_EQ(s(), 3.25);
  tile<float> const z;
  EXPECT_EQ(z.item(), 0.0f);
  static_assert(tile<float>::rank == 0 && tile<float>::size == 1);
}

TEST(Creation, ElementAccessIsRowMajor) {
  tile<int, 3, 4, 19> t;
  for (int i = 0; i < t.size; ++i)
    t.data()[i] = i;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j)
      for (int k = 0; k < 19; ++k)
        EXPECT_EQ(t(i, j, k), (i * 4 + j) * 19 + k) << "at (" << i << ", " << j << ", " << k << ")";
  tile<int, 7, 5> m;
  m(6, 4) = 42;
  m(2, 3) = 7;
  EXPECT_EQ(m.data()[34], 42);
  EXPECT_EQ(m.data()[13], 7);
  static_assert(tile<int, 3, 4, 19>::rank == 3 && tile<int, 3, 4, 19>::size == 228);
}

template <int Start, int End>
void check_arange() {
  constexpr int n = End - Start;
  auto r = arange<Start, End>();
  static_assert(std::is_same_v<value_of_t<decltype(r)>, std::int32_t>);
  static_assert(std::is_same_v<shape_of_t<decltype(r)>, shape<n>>);
  tile<std::int32_t, n> const t = r;
  tile<float, n> const f = arange<Start, End>();                   // int32 -> float: implicit
  tile<std::int32_t, n> const off = 3 * 64 + arange<Start, End>(); // pid * B + arange
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(t(i), Start + i) << "arange<" << Start << ", " << End << "> at (" << i << ")";
    EXPECT_EQ(f(i), float(Start + i)) << "as float at (" << i << ")";
    EXPECT_EQ(off(i), 192 + Start + i) << "3 * 64 + arange at (" << i << ")";
  }
}

TEST(Creation, Arange) {
  check_arange<0, 1>();
  check_arange<0, 7>();
  check_arange<-3, 5>();
  check_arange<0, 37>();
  check_arange<5, 69>(); // 64 elements, starting off zero
  check_arange<100, 164>();
}

TEST(Creation, ArangeInBroadcastExpressions) {
  // offs_m[:, None] * N + offs_n[None, :]: the row-major flat index of a 7 x 37 block.
  tile<std::int32_t, 7, 37> const flat = col(arange<0, 7>()) * 37 + row(arange<0, 37>());
  tile<bool, 7, 37> const mask = (col(arange<0, 7>()) < 5) & (row(arange<0, 37>()) < 30);
  tile<double, 7, 37> const x = where(mask, to<double>(flat) * 0.5, -1.0);
  for (int i = 0; i < 7; ++i)
    for (int j = 0; j < 37; ++j) {
      EXPECT_EQ(flat(i, j), i * 37 + j) << "at (" << i << ", " << j << ")";
      EXPECT_EQ(mask(i, j), i < 5 && j < 30) << "at (" << i << ", " << j << ")";
      EXPECT_EQ(x(i, j), i < 5 && j < 30 ? (i * 37 + j) * 0.5 : -1.0)
          << "at (" << i << ", " << j << ")";
    }
}

} // namespace

} // namespace test_creation
