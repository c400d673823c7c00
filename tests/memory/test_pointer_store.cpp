// Stores through pointer tiles (memory/pointer.hpp): `store(t + offsets, value, mask)` for the
// access patterns of test_pointer.cpp (contiguous rows in masked chunks, 2-D blocks masked at
// both edges, masks that skip lanes in the middle, strided, reversed, scattered and wrapping
// offsets), value broadcast (a number, a rank-0 tile, a row or a column over a block) and the
// cast to the tensor's element type (float into double, int32 and bf16, rounding to nearest
// even). Each result is compared element by element, the untouched elements included, with the
// same stores written as plain scalar loops. Checked mode is on throughout: a masked-off lane
// that pointed outside and were accessed would throw.
#include "memory_test_util.hpp"

#include <tilegrad/core/bf16.hpp>
#include <tilegrad/memory/checked.hpp>
#include <tilegrad/memory/pointer.hpp>
#include <tilegrad/tile/creation.hpp>
#include <tilegrad/tile/elementwise.hpp>
#include <tilegrad/tile/shape_ops.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_pointer_store {

namespace {

using namespace tilegrad;
using tg_mem::as_program;
using tg_mem::at;
using tg_mem::sentinel;
using tg_mem::value_at;

using tg_mem::M;
using tg_mem::N;

template <class T>
class PointerStore : public tg_mem::pointer_fixture<T> {};
TYPED_TEST_SUITE(PointerStore, tg_mem::AllTypes);


// ---------------------------------------------------------------------------------------------
// Stores
// ---------------------------------------------------------------------------------------------

template <class T, int B>
void store_rows_in_chunks(tensor<T> y) {
  for (int r = 0; r < M; ++r)
    for (int c0 = 0; c0 < N; c0 += B) {
      auto const cols = c0 + arange<0, B>();
      tile<T, B> v;
      for (int c = 0; c < B; ++c) v(c) = value_at<T>(r * 1000 + c0 + c);
      store(y + r * y.stride(0) + cols, v, cols < N);
    }
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c) ASSERT_EQ(y(r, c), value_at<T>(r * 1000 + c)) << "B=" << B << " " << at(r, c);
}

TYPED_TEST(PointerStore, StoreRowsInChunks) {
  using T = TypeParam;
  store_rows_in_chunks<T, 7>(this->y);
  store_rows_in_chunks<T, 37>(this->y);
  if constexpr (std::is_floating_point_v<T>) { // integers share the float and double paths
    store_rows_in_chunks<T, 1>(this->y);
    store_rows_in_chunks<T, 16>(this->y);
    store_rows_in_chunks<T, 64>(this->y);
  }
}

template <class T, int BM, int BN>
void store_blocks(tensor<T> y) {
  for (int r0 = 0; r0 < M; r0 += BM)
    for (int c0 = 0; c0 < N; c0 += BN) {
      auto const rows = r0 + arange<0, BM>();
      auto const cols = c0 + arange<0, BN>();
      tile<T, BM, BN> v;
      for (int i = 0; i < BM; ++i)
        for (int j = 0; j < BN; ++j) v(i, j) = value_at<T>((r0 + i) * 100 + c0 + j);
      store(y + (col(rows) * y.stride(0) + row(cols)), v, (col(rows) < M) & (row(cols) < N));
    }
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c)
      ASSERT_EQ(y(r, c), value_at<T>(r * 100 + c)) << BM << "x" << BN << " " << at(r, c);
}

TYPED_TEST(PointerStore, StoreTwoDimensionalBlocks) {
  using T = TypeParam;
  store_blocks<T, 5, 37>(this->y);
  if constexpr (std::is_floating_point_v<T>) {
    store_blocks<T, 16, 16>(this->y);
    store_blocks<T, 13, 1>(this->y);
  }
}

template <class T, int B>
void store_skipping_lanes(tensor<T> y) {
  auto const lanes = arange<0, B>();
  tile<bool, B> pattern;
  for (int c = 0; c < B; ++c) pattern(c) = (c * 7) % 5 < 2;
  for (int r = 0; r < M; ++r) {
    tile<T, B> v;
    for (int c = 0; c < B; ++c) v(c) = value_at<T>(r * 100 + c);
    if (r % 2 == 0)
      store(y + r * y.stride(0) + lanes, v, lanes % 3 != 1); // every third lane off
    else
      store(y + r * y.stride(0) + lanes, v, pattern); // an irregular pattern from a bool tile
  }
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c) {
      bool const on = c < B && (r % 2 == 0 ? c % 3 != 1 : (c * 7) % 5 < 2);
      ASSERT_EQ(y(r, c), on ? value_at<T>(r * 100 + c) : sentinel<T>()) << "B=" << B << " " << at(r, c);
    }
}

TYPED_TEST(PointerStore, StoreMaskSkipsLanesInTheMiddle) {
  using T = TypeParam;
  store_skipping_lanes<T, 37>(this->y);
  if constexpr (std::is_floating_point_v<T>) {
    tg_mem::fill_with(this->y, sentinel<T>());
    store_skipping_lanes<T, 16>(this->y);
    tg_mem::fill_with(this->y, sentinel<T>());
    store_skipping_lanes<T, 7>(this->y);
  }
}

TYPED_TEST(PointerStore, StoreStridedReversedScatteredWrapped) {
  using T = TypeParam;
  tensor<T> const y = this->y;
  tile<T, 37> v;
  for (int c = 0; c < 37; ++c) v(c) = value_at<T>(c);
  std::vector<std::vector<T>> ref(M, std::vector<T>(N, sentinel<T>()));
  // row 0: step 2; row 1: reversed; row 2: scattered by a permutation; row 3: wrapping % n
  store(y + 0 * y.stride(0) + arange<0, 37>() * 2, v, arange<0, 37>() * 2 < N);
  for (int c = 0; 2 * c < N; ++c) ref[0][2 * c] = v(c);
  store(y + 1 * y.stride(0) + (N - 1 - arange<0, 37>()), v);
  for (int c = 0; c < 37; ++c) ref[1][N - 1 - c] = v(c);
  owned_tensor<std::int32_t> perm({37}, "perm");
  for (int c = 0; c < 37; ++c) perm(c) = (c * 11 + 3) % 37;
  tile<std::int32_t, 37> const pt = load(tensor<std::int32_t const>(perm) + arange<0, 37>());
  store(y + 2 * y.stride(0) + pt + 10, v);
  for (int c = 0; c < 37; ++c) ref[2][perm(c) + 10] = v(c);
  store(y + 3 * y.stride(0) + (50 + arange<0, 37>()) % N, v);
  for (int c = 0; c < 37; ++c) ref[3][(50 + c) % N] = v(c);
  // row 4..: down a column, masked past the last row (row 4 + i for i < 33)
  auto const rows = 4 + arange<0, 37>();
  store(y + rows * y.stride(0) + 7, v, rows < M);
  for (int i = 0; i + 4 < M; ++i) ref[4 + i][7] = v(i);
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c) ASSERT_EQ(y(r, c), ref[r][c]) << at(r, c);
}

TYPED_TEST(PointerStore, StoreBroadcastsTheValue) {
  using T = TypeParam;
  tensor<T> const y = this->y;
  auto const lanes = arange<0, 37>();
  store(y + 0 * y.stride(0) + lanes, T(5));                       // a number
  store(y + 1 * y.stride(0) + lanes, tile<T>(T(6)));              // a rank-0 tile
  store(y + 2 * y.stride(0) + lanes, T(8), lanes < 20);           // a number, masked
  tile<T, 5> per_row;
  for (int i = 0; i < 5; ++i) per_row(i) = T(10 + i);
  auto const rows = 3 + arange<0, 5>();
  store(y + (col(rows) * y.stride(0) + row(lanes)), col(per_row)); // a column over a block
  tile<T, 37> per_col;
  for (int j = 0; j < 37; ++j) per_col(j) = T(-j);
  store(y + (col(8 + arange<0, 3>()) * y.stride(0) + row(lanes)), row(per_col)); // a row
  store(y + 11 * y.stride(0) + 3, T(42));                         // one address
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c) {
      T ref = sentinel<T>();
      if (c < 37) {
        if (r == 0) ref = T(5);
        if (r == 1) ref = T(6);
        if (r == 2 && c < 20) ref = T(8);
        if (r >= 3 && r < 8) ref = T(10 + r - 3);
        if (r >= 8 && r < 11) ref = T(-c);
      }
      if (r == 11 && c == 3) ref = T(42);
      ASSERT_EQ(y(r, c), ref) << at(r, c);
    }
  // A rank-0 pointer loads a rank-0 tile.
  auto const one = load(this->xc() + 11 * N + 3);
  static_assert(decltype(one)::rank == 0);
  EXPECT_EQ(one.item(), this->x(11, 3));
}

// Triton casts the stored value to the pointer's element type.
TEST(PointerCast, FloatIntoDoubleAndInt) {
  checked_scope on(true);
  owned_tensor<double> d({37}, "d");
  owned_tensor<std::int32_t> n({37}, "n");
  tile<float, 37> v;
  for (int c = 0; c < 37; ++c) v(c) = 0.1f * static_cast<float>(c) - 1.7f;
  store(tensor<double>(d) + arange<0, 37>(), v);
  store(tensor<std::int32_t>(n) + arange<0, 37>(), v, arange<0, 37>() < 30);
  for (int c = 0; c < 37; ++c) {
    ASSERT_EQ(d(c), static_cast<double>(v(c))) << at(c);
    ASSERT_EQ(n(c), c < 30 ? static_cast<std::int32_t>(v(c)) : 0) << "truncation toward zero " << at(c);
  }
}

// The reference: float -> bf16 by rounding the top 16 bits to nearest, ties to even.
std::uint16_t bf16_rne(float f) {
  std::uint32_t const u = std::bit_cast<std::uint32_t>(f);
  std::uint32_t upper = u >> 16;
  std::uint32_t const lower = u & 0xffffu;
  if (lower > 0x8000u || (lower == 0x8000u && (upper & 1u))) ++upper;
  return static_cast<std::uint16_t>(upper);
}

TEST(PointerCast, FloatIntoBf16RoundsToNearestEven) {
  checked_scope on(true);
  constexpr float u = 1.0f / 256; // half an ulp of bf16 at 1
  float const ties[] = {1 + u,                  // tie, 1.0 is even: down
                        1 + 3 * u,              // tie, 1 + 2u odd: up to 1 + 4u
                        1 + u + u / 4096,       // just above a tie: up
                        1 + u - u / 4096,       // just below a tie: down
                        -(1 + 3 * u),           // negative tie: away (to even)
                        65504.0f, 3.0e38f, -0.0f, 1.0e-40f};
  constexpr int K = 13;
  tile<float, K> v;
  for (int c = 0; c < K; ++c) v(c) = c < 9 ? ties[c] : 0.3f * static_cast<float>(c * c) - 7.77f;
  owned_tensor<bf16> b({K}, "b");
  store(tensor<bf16>(b) + arange<0, K>(), v);
  EXPECT_EQ(b(0).bits, 0x3f80u) << "1 + 2^-8 ties to 1";
  EXPECT_EQ(b(1).bits, 0x3f82u) << "1 + 3*2^-8 ties to 1 + 2^-6";
  EXPECT_EQ(b(2).bits, 0x3f81u);
  EXPECT_EQ(b(3).bits, 0x3f80u);
  for (int c = 0; c < K; ++c) ASSERT_EQ(b(c).bits, bf16_rne(v(c))) << "value " << v(c) << " " << at(c);
  // Loading bf16 back and widening gives the rounded values.
  tile<float, K> const w = to<float>(load(tensor<bf16 const>(b) + arange<0, K>()));
  for (int c = 0; c < K; ++c)
    ASSERT_EQ(w(c), std::bit_cast<float>(std::uint32_t{bf16_rne(v(c))} << 16)) << at(c);
}

} // namespace

} // namespace test_pointer_store
