// Pointer tiles (memory/pointer.hpp): `tensor + offsets`, load with mask and other, store with
// mask, value broadcast and cast, and `p += n`. Every access pattern a kernel uses is checked
// element by element against the same access written as a plain scalar loop: contiguous rows
// (the vector path), 2-D blocks, strided and reversed rows, gathers through an index tile,
// wrapping `% n` offsets, masks partial at the edge, skipping lanes in the middle, or all off.
// Checked mode is on wherever masked-off lanes point outside the tensor: a masked-off lane that
// were accessed would throw.
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
namespace test_pointer {

namespace {

using namespace tilegrad;
using tg_mem::as_program;
using tg_mem::at;
using tg_mem::sentinel;
using tg_mem::value_at;

using tg_mem::M;
using tg_mem::N;

template <class T>
class Pointer : public tg_mem::pointer_fixture<T> {};
TYPED_TEST_SUITE(Pointer, tg_mem::AllTypes);

// Patterns whose code does not depend on the element type beyond the vector width run on float
// and double only (int32 and int64 share those widths), to keep the compile time down.
template <class T>
class PointerFloat : public Pointer<T> {};
TYPED_TEST_SUITE(PointerFloat, tg_mem::FloatTypes);

// ---------------------------------------------------------------------------------------------
// Loads
// ---------------------------------------------------------------------------------------------

// Each row walked in chunks of B lanes, the last chunk masked at the row's end (Triton's
// `cols = c0 + arange(B); load(x + row * stride + cols, cols < n)`).
template <class T, int B>
void load_rows_in_chunks(tensor<T const> x) {
  for (int r = 0; r < M; ++r)
    as_program(r, M, [&](program const& p) {
      int const pid = p.program_id(0);
      for (int c0 = 0; c0 < N; c0 += B) {
        auto const cols = c0 + arange<0, B>();
        tile<T, B> const v = load(x + pid * x.stride(0) + cols, cols < N);
        for (int c = 0; c < B; ++c)
          ASSERT_EQ(v(c), c0 + c < N ? x(r, c0 + c) : T(0)) << "B=" << B << " c0=" << c0 << " " << at(r, c);
      }
      if constexpr (B <= N) { // unmasked, ending exactly at the row's end
        tile<T, B> const v = load(x + pid * x.stride(0) + (N - B) + arange<0, B>());
        for (int c = 0; c < B; ++c) ASSERT_EQ(v(c), x(r, N - B + c)) << "B=" << B << " " << at(r, c);
      }
    });
}

TYPED_TEST(Pointer, ContiguousRows) {
  using T = TypeParam;
  load_rows_in_chunks<T, 7>(this->xc());
  load_rows_in_chunks<T, 37>(this->xc());
  if constexpr (std::is_floating_point_v<T>) { // integers share the float and double paths
    load_rows_in_chunks<T, 1>(this->xc());
    load_rows_in_chunks<T, 13>(this->xc());
    load_rows_in_chunks<T, 16>(this->xc());
    load_rows_in_chunks<T, 64>(this->xc());
  }
}

// BM x BN blocks `col(rows) * stride + row(cols)` tiling the tensor, masked on both edges,
// without `other` and with a per-row column tile as `other` (scalar `other`s: the tests below).
template <class T, int BM, int BN>
void load_blocks(tensor<T const> x) {
  for (int r0 = 0; r0 < M; r0 += BM)
    for (int c0 = 0; c0 < N; c0 += BN) {
      auto const rows = r0 + arange<0, BM>();
      auto const cols = c0 + arange<0, BN>();
      auto const ptrs = x + (col(rows) * x.stride(0) + row(cols) * x.stride(1));
      auto const mask = (col(rows) < M) & (row(cols) < N);
      tile<T, BM> others;
      for (int i = 0; i < BM; ++i) others(i) = T(-100 - i);
      tile<T, BM, BN> const a = load(ptrs, mask);
      tile<T, BM, BN> const c = load(ptrs, mask, col(others));
      for (int i = 0; i < BM; ++i)
        for (int j = 0; j < BN; ++j) {
          bool const in = r0 + i < M && c0 + j < N;
          T const ref = in ? x(r0 + i, c0 + j) : T(0);
          ASSERT_EQ(a(i, j), ref) << BM << "x" << BN << " block (" << r0 << ", " << c0 << ") " << at(i, j);
          ASSERT_EQ(c(i, j), in ? ref : others(i)) << BM << "x" << BN << " block (" << r0 << ", " << c0 << ") " << at(i, j);
        }
    }
}

TYPED_TEST(Pointer, TwoDimensionalBlocks) {
  using T = TypeParam;
  load_blocks<T, 5, 37>(this->xc());
  if constexpr (std::is_floating_point_v<T>) {
    load_blocks<T, 16, 16>(this->xc());
    load_blocks<T, 13, 1>(this->xc());
  }
}

TYPED_TEST(PointerFloat, StridedAndReversedRows) {
  using T = TypeParam;
  auto const x = this->xc();
  for (int r = 0; r < M; ++r) {
    // step 3, unmasked
    tile<T, 13> const s3 = load(x + r * x.stride(0) + arange<0, 13>() * 3);
    for (int c = 0; c < 13; ++c) ASSERT_EQ(s3(c), x(r, 3 * c)) << "step 3 " << at(r, c);
    // step 5, masked past the end (lanes 14 and 15 would be columns 70 and 75)
    auto const cols = arange<0, 16>() * 5;
    tile<T, 16> const s5 = load(x + r * x.stride(0) + cols, cols < N, T(1));
    for (int c = 0; c < 16; ++c)
      ASSERT_EQ(s5(c), 5 * c < N ? x(r, 5 * c) : T(1)) << "step 5 " << at(r, c);
    // reversed (step -1), whole row in two pieces
    tile<T, 37> const rev = load(x + r * x.stride(0) + (N - 1 - arange<0, 37>()));
    for (int c = 0; c < 37; ++c) ASSERT_EQ(rev(c), x(r, N - 1 - c)) << "reversed " << at(r, c);
    tile<T, 16> const neg = load(x + (-arange<0, 16>() + (r * x.stride(0) + 20)));
    for (int c = 0; c < 16; ++c) ASSERT_EQ(neg(c), x(r, 20 - c)) << "negated " << at(r, c);
  }
  // Down a column (step = row stride), masked past the last row.
  for (int c = 0; c < N; c += 23) {
    auto const rows = arange<0, 40>();
    tile<T, 40> const v = load(x + rows * x.stride(0) + c, rows < M);
    for (int i = 0; i < 40; ++i) ASSERT_EQ(v(i), i < M ? x(i, c) : T(0)) << "column " << at(i, c);
  }
  // Reversed with the masked-off lanes at negative offsets.
  auto const flat = tensor<T const>(this->x.data(), {M}, "flat");
  auto const lanes = arange<0, 64>();
  tile<T, 64> const v = load(flat + (M - 1 - lanes), lanes < M, T(9));
  for (int c = 0; c < 64; ++c) ASSERT_EQ(v(c), c < M ? flat(M - 1 - c) : T(9)) << at(c);
}

// An index tile loaded from an int32 tensor: 1-D gathers (non-affine offsets) and 2-D blocks
// of gathered rows (affine along each row).
TYPED_TEST(Pointer, GatherThroughIndexTile) {
  using T = TypeParam;
  auto const x = this->xc();
  owned_tensor<std::int32_t> idx({M}, "idx");
  for (int c = 0; c < M; ++c) idx(c) = (c * 17 + 5) % M; // a permutation of 0..36
  idx(4) = idx(3);                                        // with one repeat
  tensor<std::int32_t const> const iv = idx;
  tile<std::int32_t, M> const it = load(iv + arange<0, M>());
  for (int c = 0; c < M; ++c) ASSERT_EQ(it(c), idx(c)) << at(c);

  auto const offs = it * x.stride(0) + 5;
  static_assert(!detail::is_affine_v<std::remove_cvref_t<decltype(offs)>>, "a gather is not affine");
  tile<T, M> const g = load(x + offs);
  for (int c = 0; c < M; ++c) ASSERT_EQ(g(c), x(idx(c), 5)) << "gather column 5 " << at(c);

  for (int r = 0; r < M; r += 9) {
    tile<T, M> const w = load(x + r * x.stride(0) + it);
    for (int c = 0; c < M; ++c) ASSERT_EQ(w(c), x(r, idx(c))) << "gather in row " << at(r, c);
  }

  auto const rows2d = col(it) * x.stride(0) + row(arange<0, 16>());
  static_assert(detail::is_affine_v<std::remove_cvref_t<decltype(rows2d)>>, "gathered rows stay affine along a row");
  tile<T, M, 16> const blk = load(x + rows2d + 50, row(arange<0, 16>()) < N - 50);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < 16; ++j) ASSERT_EQ(blk(i, j), x(idx(i), 50 + j)) << "gathered rows " << at(i, j);

  // An int64 index tile, and masked-off lanes holding wild indices (checked: never accessed).
  tile<std::int64_t, 13> wild;
  for (int c = 0; c < 13; ++c) wild(c) = c % 3 == 1 ? std::int64_t{-1000000} : std::int64_t{(c * 5) % M};
  tile<T, 13> const gw = load(x + wild * x.stride(0) + 69, wild >= 0, T(4));
  for (int c = 0; c < 13; ++c)
    ASSERT_EQ(gw(c), c % 3 == 1 ? T(4) : x((c * 5) % M, 69)) << "wild gather " << at(c);
}

// (c0 + arange) % n: affine while a row does not wrap, a gather where it does; right values
// either way (the Triton matmul tutorial's edge tiles).
TYPED_TEST(PointerFloat, WrappingModuloOffsets) {
  using T = TypeParam;
  auto const x = this->xc();
  for (int c0 : {0, 16, 32, 48, 54, 55, 64}) {
    auto const offs = (c0 + arange<0, 16>()) % N;
    bool const wraps = c0 + 15 >= N;
    EXPECT_EQ(detail::affine_at(offs, 0).ok, !wraps) << "c0=" << c0;
    for (int r = 0; r < M; r += 6) {
      tile<T, 16> const v = load(x + r * x.stride(0) + offs);
      for (int c = 0; c < 16; ++c) ASSERT_EQ(v(c), x(r, (c0 + c) % N)) << "c0=" << c0 << " " << at(r, c);
    }
  }
  // Both axes wrapping, as in the matmul kernel's a_ptrs.
  for (int r0 : {0, 32})
    for (int c0 : {0, 60}) {
      auto const rows = (r0 + arange<0, 8>()) % M;
      auto const cols = (c0 + arange<0, 16>()) % N;
      tile<T, 8, 16> const v = load(x + (col(rows) * x.stride(0) + row(cols) * x.stride(1)));
      for (int i = 0; i < 8; ++i)
        for (int j = 0; j < 16; ++j)
          ASSERT_EQ(v(i, j), x((r0 + i) % M, (c0 + j) % N)) << "(" << r0 << ", " << c0 << ") " << at(i, j);
    }
}

TYPED_TEST(PointerFloat, AllOffMask) {
  using T = TypeParam;
  auto const x = this->xc();
  auto const lanes = arange<0, 37>();
  // Offsets far outside the tensor: an all-off mask accesses nothing.
  tile<T, 37> const a = load(x + 1000000 + lanes, lanes < 0);
  tile<T, 37> const b = load(x + (-1000000) + lanes, lanes > 100, T(-2));
  for (int c = 0; c < 37; ++c) {
    ASSERT_EQ(a(c), T(0)) << at(c);
    ASSERT_EQ(b(c), T(-2)) << at(c);
  }
  store(tensor<T>(this->y) + 1000000 + lanes, T(1), lanes < 0);
  for (std::int64_t i = 0; i < this->y.numel(); ++i) ASSERT_EQ(this->y.data()[i], sentinel<T>()) << at(i);
}

TYPED_TEST(PointerFloat, NaNOther) {
  using T = TypeParam;
  auto const x = this->xc();
  auto const cols = 60 + arange<0, 16>();
  tile<T, 16> const a = load(x + 36 * x.stride(0) + cols, cols < N, std::numeric_limits<T>::quiet_NaN());
  // A float NaN meeting a double tensor still reads as NaN.
  tile<T, 16> const b = load(x + 36 * x.stride(0) + cols, cols < N, std::numeric_limits<float>::quiet_NaN());
  tile<T, 16> nans(std::numeric_limits<T>::quiet_NaN());
  tile<T, 16> const c = load(x + 36 * x.stride(0) + cols, cols < N, nans);
  for (int j = 0; j < 16; ++j) {
    if (60 + j < N) {
      ASSERT_EQ(a(j), x(36, 60 + j)) << at(36, 60 + j);
      ASSERT_EQ(b(j), x(36, 60 + j)) << at(36, 60 + j);
      ASSERT_EQ(c(j), x(36, 60 + j)) << at(36, 60 + j);
    } else {
      ASSERT_TRUE(std::isnan(a(j))) << at(36, 60 + j);
      ASSERT_TRUE(std::isnan(b(j))) << at(36, 60 + j);
      ASSERT_TRUE(std::isnan(c(j))) << at(36, 60 + j);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// p += n
// ---------------------------------------------------------------------------------------------

TYPED_TEST(PointerFloat, ShiftWithPlusEquals) {
  using T = TypeParam;
  auto const x = this->xc();
  // Affine offsets: one row per step.
  auto p = x + arange<0, 37>();
  static_assert(std::is_same_v<decltype(p + 70), decltype(p)>, "p + n keeps p's type");
  for (int r = 0; r < M; ++r) {
    tile<T, 37> const v = load(p);
    for (int c = 0; c < 37; ++c) ASSERT_EQ(v(c), x(r, c)) << at(r, c);
    tile<T, 37> const w = load(p + 33);
    for (int c = 0; c < 37; ++c) ASSERT_EQ(w(c), x(r, 33 + c)) << "p + 33 " << at(r, c);
    p += x.stride(0);
  }
  p -= x.stride(0);
  tile<T, 37> const last = load(p);
  for (int c = 0; c < 37; ++c) ASSERT_EQ(last(c), x(M - 1, c)) << "p -= n " << at(c);

  // Gathered offsets shift the same way.
  tile<std::int32_t, 13> it;
  for (int c = 0; c < 13; ++c) it(c) = (c * 29) % N;
  auto q = x + it;
  for (int r = 0; r < M; ++r, q += N) {
    tile<T, 13> const v = load(q);
    for (int c = 0; c < 13; ++c) ASSERT_EQ(v(c), x(r, (c * 29) % N)) << "gather " << at(r, c);
  }

  // The matmul walk: a BM x BK block moved along K by BK, masked at the K edge.
  constexpr int BM = 5, BK = 16;
  auto const rows = 30 + arange<0, BM>();
  auto const ks = arange<0, BK>();
  auto a = x + (col(rows % M) * x.stride(0) + row(ks) * x.stride(1));
  for (int k = 0; k < cdiv(N, BK); ++k) {
    tile<T, BM, BK> const blk = load(a, row(ks) < N - k * BK, T(0));
    for (int i = 0; i < BM; ++i)
      for (int j = 0; j < BK; ++j) {
        int const kk = k * BK + j;
        ASSERT_EQ(blk(i, j), kk < N ? x((30 + i) % M, kk) : T(0)) << "k=" << k << " " << at(i, j);
      }
    a += BK * x.stride(1);
  }
}

TYPED_TEST(PointerFloat, MinusMovesBack) {
  // Triton's `ptrs - 1`, `ptrs - offsets` and `x_ptr - n`, each the same as adding the negation.
  using T = TypeParam;
  auto const x = this->xc();
  auto p = x + (x.stride(0) + 1 + arange<0, 37>());
  static_assert(std::is_same_v<decltype(p - 1), decltype(p)>, "p - n keeps p's type");
  tile<T, 37> const back = load(p - 1), back_tile = load(p - (arange<0, 37>() * 0 + 1)),
                    from_base = load((x - 1) + (x.stride(0) + 1 + arange<0, 37>()));
  for (int c = 0; c < 37; ++c) {
    ASSERT_EQ(back(c), x(1, c)) << at(c);
    ASSERT_EQ(back_tile(c), x(1, c)) << at(c);
    ASSERT_EQ(from_base(c), x(1, c)) << at(c);
  }
}

// ---------------------------------------------------------------------------------------------
// Masked-off lanes are never accessed; the vector path
// ---------------------------------------------------------------------------------------------

TYPED_TEST(PointerFloat, MaskedOffLanesAreNotAccessed) {
  using T = TypeParam;
  ASSERT_TRUE(checked());
  tensor<T> const flat(this->y.data(), {M}, "flat");
  auto const lanes = arange<0, 64>();
  // Unmasked, lanes 37..63 are outside: checked mode catches it ...
  EXPECT_THROW((void)load(flat + lanes), access_error);
  EXPECT_THROW(store(flat + lanes, T(1)), access_error);
  // ... masked, they are not accessed at all.
  tg_mem::fill_with(this->y, sentinel<T>());
  tile<T, 64> v;
  for (int c = 0; c < 64; ++c) v(c) = value_at<T>(c);
  EXPECT_NO_THROW(store(flat + lanes, v, lanes < M));
  tile<T, 64> const w = load(flat + lanes, lanes < M, T(3));
  for (int c = 0; c < 64; ++c) ASSERT_EQ(w(c), c < M ? value_at<T>(c) : T(3)) << at(c);
  for (int i = M; i < M * N; ++i) ASSERT_EQ(this->y.data()[i], sentinel<T>()) << at(i);
  // Masked lanes before the start (negative offsets), and at a bottom-right corner block.
  tile<T, 64> const before = load(flat + (lanes - 27), lanes >= 27, T(2));
  for (int c = 0; c < 64; ++c)
    ASSERT_EQ(before(c), c >= 27 && c - 27 < M ? value_at<T>(c - 27) : T(2)) << at(c);
  auto const x = this->xc();
  auto const rows = 35 + arange<0, 5>();
  auto const cols = 65 + arange<0, 16>();
  tile<T, 5, 16> const corner = load(x + (col(rows) * N + row(cols)), (col(rows) < M) & (row(cols) < N));
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 16; ++j)
      ASSERT_EQ(corner(i, j), 35 + i < M && 65 + j < N ? x(35 + i, 65 + j) : T(0)) << at(i, j);
}

// The vector path: for_each_access (the loop every load and store goes through) hands whole
// vectors of lanes of a contiguous row to the vector callback, the rest lane by lane.
template <class T, class Off, class Mask>
void count_accesses(Off const& off, Mask const& mask, int& vec_calls, int& lane_calls,
                    std::vector<std::int64_t>& seen) {
  using S = detail::access_shape_t<Off, Mask>;
  constexpr int W = detail::access_width<T, Mask, detail::no_mask>;
  vec_calls = lane_calls = 0;
  seen.clear();
  std::vector<T> buf(4096);
  auto const p = tensor<T>(buf.data(), {4096}) + off;
  detail::for_each_access<S, W>(
      p, mask,
      [&](int, int, std::int64_t e) {
        ++lane_calls;
        seen.push_back(e);
      },
      [&](int, int, std::int64_t e) {
        ++vec_calls;
        for (int l = 0; l < W; ++l) seen.push_back(e + l);
      });
  std::sort(seen.begin(), seen.end());
}

TYPED_TEST(Pointer, ContiguousRowsTakeTheVectorPath) {
  using T = TypeParam;
  constexpr int W = simd::native_width<T>;
  static_assert(detail::access_width<T, detail::no_mask, detail::no_mask> == W);
  int vec = 0, lane = 0;
  std::vector<std::int64_t> seen;
  auto const row37 = 3 * N + arange<0, 37>();
  static_assert(detail::is_affine_v<std::remove_cvref_t<decltype(row37)>>);
  count_accesses<T>(row37, detail::no_mask{}, vec, lane, seen);
  EXPECT_EQ(vec, W > 1 ? 37 / W : 0);
  EXPECT_EQ(lane, W > 1 ? 37 % W : 37);
  ASSERT_EQ(seen.size(), 37u);
  for (int c = 0; c < 37; ++c) ASSERT_EQ(seen[c], 3 * N + c) << at(c);

  // Strided rows go lane by lane.
  count_accesses<T>(arange<0, 37>() * 3, detail::no_mask{}, vec, lane, seen);
  EXPECT_EQ(vec, 0);
  EXPECT_EQ(lane, 37);

  // 2-D blocks: every row of 16 in whole vectors (when W divides 16).
  auto const blk = col(arange<0, 5>()) * N + row(arange<0, 16>());
  count_accesses<T>(blk, detail::no_mask{}, vec, lane, seen);
  EXPECT_EQ(vec, W > 1 ? 5 * (16 / W) : 0);
  EXPECT_EQ(vec * W + lane, 80);

  if constexpr (std::is_same_v<T, float>) {
    // A mask partial at the edge: whole vectors where every lane is on, lanes elsewhere.
    auto const cols = 40 + arange<0, 37>();
    auto mask = detail::as_node(cols < N);
    constexpr int WM = detail::access_width<T, decltype(mask), detail::no_mask>;
    EXPECT_EQ(WM, W) << "an int32 comparison mask keeps the float vector path";
    count_accesses<T>(cols, mask, vec, lane, seen);
    ASSERT_EQ(seen.size(), 30u);
    for (int c = 0; c < 30; ++c) ASSERT_EQ(seen[c], 40 + c) << at(c);
    if constexpr (W > 1) {
      EXPECT_EQ(vec, 30 / W);
    }
  }
}

// A row of pointers broadcast down a 2-D mask (the pointers' shape is smaller than the
// access's): each row is still contiguous, so it still takes the vector path.
TYPED_TEST(PointerFloat, PointersBroadcastToTheMaskShapeStayVectorised) {
  using T = TypeParam;
  int vec = 0, lane = 0;
  std::vector<std::int64_t> seen;
  auto const offs = row(arange<0, 16>()) + 100; // shape (1, 16)
  auto mask = detail::as_node(col(arange<0, 5>()) >= 0); // shape (5, 1): all on
  using S = detail::access_shape_t<std::remove_cvref_t<decltype(offs)>, decltype(mask)>;
  static_assert(S::rows == 5 && S::inner == 16);
  count_accesses<T>(offs, mask, vec, lane, seen);
  ASSERT_EQ(seen.size(), 80u);
  for (int i = 0; i < 80; ++i) ASSERT_EQ(seen[i], 100 + i / 5) << at(i);
  constexpr int WM = detail::access_width<T, decltype(detail::bcast<S>(mask)), detail::no_mask>;
  if constexpr (WM > 1) {
    EXPECT_EQ(vec, 5 * (16 / WM)) << "rows of broadcast pointers went lane by lane";
  }
  // And the values are right whichever path runs.
  auto const x = this->xc();
  tile<T, 5, 16> const v = load(x + offs, col(arange<0, 5>()) >= 0);
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 16; ++j) ASSERT_EQ(v(i, j), this->x.data()[100 + j]) << at(i, j);
}

} // namespace

} // namespace test_pointer
