// Block pointers (memory/block_ptr.hpp): make_block_ptr in its short and full forms, advance,
// load with boundary checks on subsets of axes and zero or NaN padding, store with boundary
// checks. Blocks of 1-D, 2-D and 3-D tensors are placed at offsets that hang over every edge
// (negative offsets and blocks wholly outside included) and compared element by element with a
// plain scalar reference: inside elements read the tensor, outside ones (on checked axes) read
// the padding; stores write exactly the inside elements. Checked mode is on throughout, so an
// access outside the tensor by a boundary-checked block would throw.
#include "memory_test_util.hpp"

#include <tilegrad/memory/block_ptr.hpp>
#include <tilegrad/memory/checked.hpp>
#include <tilegrad/tile/creation.hpp>
#include <tilegrad/tile/elementwise.hpp>
#include <tilegrad/tile/reduce.hpp>
#include <tilegrad/tile/shape_ops.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_block_ptr {

namespace {

using namespace tilegrad;
using tg_mem::as_program;
using tg_mem::at;
using tg_mem::same_value;
using tg_mem::sentinel;
using tg_mem::value_at;

constexpr int M = 37, N = 70;

/// Block offsets along an axis of extent E for a block of B: hanging over both edges, wholly
/// outside on either side, and inside.
std::vector<std::int64_t> hanging(int B, int E) {
  return {-B - 1, -B, -B + 1, -3, -1, 0, 1, E - B, E - B + 1, E - 2, E - 1, E, E + 2};
}
/// Offsets that keep a block of B inside an axis of extent E (for unchecked axes).
std::vector<std::int64_t> inside(int B, int E) { return {0, 1, E - B}; }

template <class T>
T padding_value(padding pad) {
  if constexpr (std::is_floating_point_v<T>)
    return pad == padding::nan       ? std::numeric_limits<T>::quiet_NaN()
           : pad == padding::neg_inf ? -std::numeric_limits<T>::infinity()
                                     : T(0);
  else
    return pad == padding::neg_inf ? std::numeric_limits<T>::lowest() : T(0);
}

template <class T>
class BlockPtr : public ::testing::Test {
protected:
  BlockPtr() : x({M, N}, "x"), y({M, N}, "y") {
    tg_mem::fill_values(x);
    tg_mem::fill_with(y, sentinel<T>());
  }
  owned_tensor<T> x, y;
  checked_scope checks{true};
};
TYPED_TEST_SUITE(BlockPtr, tg_mem::AllTypes);

// Block shapes and layouts whose code differs from the 5 x 37 case only in the extents or the
// strides run on float and double only (int32 and int64 share their vector widths), to keep
// the compile time down.
template <class T>
class BlockPtrFloat : public BlockPtr<T> {};
TYPED_TEST_SUITE(BlockPtrFloat, tg_mem::FloatTypes);

// ---------------------------------------------------------------------------------------------
// 1-D
// ---------------------------------------------------------------------------------------------

template <class T, int B>
void block_1d(tensor<T> t) {
  constexpr int E = 37;
  for (std::int64_t o : hanging(B, E)) {
    auto const bp = make_block_ptr<B>(tensor<T const>(t), {o});
    for (padding pad : {padding::zero, padding::nan, padding::neg_inf}) {
      tile<T, B> const v = load(bp, bounds<0>, pad);
      for (int c = 0; c < B; ++c) {
        std::int64_t const k = o + c;
        T const ref = k >= 0 && k < E ? t(k) : padding_value<T>(pad);
        ASSERT_TRUE(same_value(v(c), ref)) << "B=" << B << " offset " << o << " " << at(c) << ": " << v(c) << " vs " << ref;
      }
    }
    // store: only the inside elements change
    std::vector<T> before(t.data(), t.data() + E);
    tile<T, B> w;
    for (int c = 0; c < B; ++c) w(c) = value_at<T>(3000 + c);
    store(make_block_ptr<B>(t, {o}), w, bounds<0>);
    for (int k = 0; k < E; ++k) {
      T const ref = k - o >= 0 && k - o < B ? w(static_cast<int>(k - o)) : before[k];
      ASSERT_EQ(t(k), ref) << "B=" << B << " store at offset " << o << " " << at(k);
    }
    for (int k = 0; k < E; ++k) t(k) = before[k];
  }
  // Inside, without boundary checks.
  if constexpr (B <= E) {
    tile<T, B> const v = load(make_block_ptr<B>(t, {E - B}));
    for (int c = 0; c < B; ++c) ASSERT_EQ(v(c), t(E - B + c)) << "B=" << B << " unchecked " << at(c);
  }
}

TYPED_TEST(BlockPtr, OneDimensional) {
  using T = TypeParam;
  owned_tensor<T> t({37}, "t");
  tg_mem::fill_values(t);
  block_1d<T, 37>(t);
  if constexpr (std::is_floating_point_v<T>) {
    block_1d<T, 1>(t);
    block_1d<T, 7>(t);
    block_1d<T, 16>(t);
    block_1d<T, 64>(t);
  }
}

// ---------------------------------------------------------------------------------------------
// 2-D
// ---------------------------------------------------------------------------------------------

template <class T, int BM, int BN, int... Axes>
void load_2d(tensor<T const> x) {
  constexpr boundary_check<Axes...> bc{};
  auto const rows = bc.has(0) ? hanging(BM, M) : inside(BM, M);
  auto const cols = bc.has(1) ? hanging(BN, N) : inside(BN, N);
  for (std::int64_t r0 : rows)
    for (std::int64_t c0 : cols) {
      auto const bp = make_block_ptr<BM, BN>(x, {r0, c0});
      tile<T, BM, BN> const dflt = load(bp, bounds<Axes...>);
      for (padding pad : {padding::zero, padding::nan, padding::neg_inf}) {
        if (!std::is_floating_point_v<T> && pad == padding::nan) continue;
        tile<T, BM, BN> const v = load(bp, bounds<Axes...>, pad);
        for (int i = 0; i < BM; ++i)
          for (int j = 0; j < BN; ++j) {
            std::int64_t const r = r0 + i, c = c0 + j;
            bool const in = r >= 0 && r < M && c >= 0 && c < N;
            T const ref = in ? x(r, c) : padding_value<T>(pad);
            ASSERT_TRUE(same_value(v(i, j), ref))
                << BM << "x" << BN << " block at (" << r0 << ", " << c0 << ") " << at(i, j) << ": " << v(i, j) << " vs " << ref;
            if (pad == padding::zero) {
              ASSERT_EQ(dflt(i, j), ref) << "default padding " << at(i, j);
            }
          }
      }
    }
}

TYPED_TEST(BlockPtr, TwoDimensionalLoads) {
  using T = TypeParam;
  tensor<T const> const x = this->x;
  load_2d<T, 5, 37, 0, 1>(x);
  load_2d<T, 5, 37, 0>(x);
  load_2d<T, 5, 37, 1>(x);
  load_2d<T, 5, 37>(x);
  if constexpr (std::is_floating_point_v<T>) {
    load_2d<T, 16, 16, 1, 0>(x); // axes in either order
    load_2d<T, 1, 1, 0, 1>(x);
    load_2d<T, 7, 13, 0, 1>(x);
    load_2d<T, 64, 1, 0>(x);
  }
}

template <class T, int BM, int BN, int... Axes>
void store_2d(owned_tensor<T>& y) {
  constexpr boundary_check<Axes...> bc{};
  auto const rows = bc.has(0) ? hanging(BM, M) : inside(BM, M);
  auto const cols = bc.has(1) ? hanging(BN, N) : inside(BN, N);
  tile<T, BM, BN> v;
  for (int i = 0; i < BM; ++i)
    for (int j = 0; j < BN; ++j) v(i, j) = value_at<T>(i * 100 + j);
  for (std::int64_t r0 : rows)
    for (std::int64_t c0 : cols) {
      tg_mem::fill_with(y, sentinel<T>());
      store(make_block_ptr<BM, BN>(tensor<T>(y), {r0, c0}), v, bounds<Axes...>);
      for (int r = 0; r < M; ++r)
        for (int c = 0; c < N; ++c) {
          std::int64_t const i = r - r0, j = c - c0;
          bool const hit = i >= 0 && i < BM && j >= 0 && j < BN;
          ASSERT_EQ(y(r, c), hit ? v(static_cast<int>(i), static_cast<int>(j)) : sentinel<T>())
              << BM << "x" << BN << " block at (" << r0 << ", " << c0 << ") " << at(r, c);
        }
    }
}

TYPED_TEST(BlockPtr, TwoDimensionalStores) {
  using T = TypeParam;
  store_2d<T, 5, 37, 0, 1>(this->y);
  store_2d<T, 5, 37, 1>(this->y);
  store_2d<T, 5, 37, 0>(this->y);
  if constexpr (std::is_floating_point_v<T>) {
    store_2d<T, 16, 16, 0, 1>(this->y);
    store_2d<T, 7, 13, 0, 1>(this->y);
    store_2d<T, 5, 37>(this->y);
  }
}

// An expression stored through a block of one row (softmax's rows): evaluated straight into the
// row, a row cut short by the tensor's end included, whose lanes past the end must not be written.
// Rows of a contiguous tensor and of a view whose rows are every other row of a larger buffer
// (the rows between must stay as they were).
template <class T, int B>
void store_row_expression(tensor<T> t) {
  tile<T, B> w;
  for (int c = 0; c < B; ++c) w(c) = value_at<T>(500 + c);
  auto const rows = t.size(0), cols = t.size(1);
  for (std::int64_t r : {std::int64_t{-1}, std::int64_t{0}, std::int64_t{5}, rows - 1, rows})
    for (std::int64_t o : hanging(B, static_cast<int>(cols))) {
      for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t k = 0; k < cols; ++k) t(i, k) = sentinel<T>();
      auto const e = reshape<1, B>(w * T(2) + T(1));
      store(make_block_ptr<1, B>(t, {r, o}), e, bounds<0, 1>);
      for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t k = 0; k < cols; ++k) {
          bool const hit = i == r && k - o >= 0 && k - o < B;
          T const ref = hit ? T(w(static_cast<int>(k - o)) * T(2) + T(1)) : sentinel<T>();
          ASSERT_TRUE(same_value(t(i, k), ref))
              << "B=" << B << " block at (" << r << ", " << o << ") " << at(i, k);
        }
    }
}

TYPED_TEST(BlockPtrFloat, ExpressionStoreIntoARowCutShort) {
  using T = TypeParam;
  store_row_expression<T, 16>(this->y.view());
  store_row_expression<T, 128>(this->y.view());
  // Every other row of a (2M, N) buffer: the odd rows around each row written stay untouched.
  owned_tensor<T> buf({2 * M, N}, "buf");
  tg_mem::fill_with(buf, sentinel<T>());
  tensor<T> const every_other(buf.data(), 2, {M, N}, {2 * N, 1}, "every_other");
  store_row_expression<T, 128>(every_other);
  for (int i = 1; i < 2 * M; i += 2)
    for (int k = 0; k < N; ++k) ASSERT_TRUE(same_value(buf(i, k), sentinel<T>())) << at(i, k);
}

// A non-contiguous base: every other column (the column stride is 2, no vector path).
TYPED_TEST(BlockPtrFloat, StridedBaseTensor) {
  using T = TypeParam;
  tensor<T> const xs(this->x.data(), {M, 35}, {N, 2}, "xs");
  for (std::int64_t r0 : hanging(5, M))
    for (std::int64_t c0 : hanging(16, 35)) {
      tile<T, 5, 16> const v = load(make_block_ptr<5, 16>(xs, {r0, c0}), bounds<0, 1>);
      for (int i = 0; i < 5; ++i)
        for (int j = 0; j < 16; ++j) {
          std::int64_t const r = r0 + i, c = c0 + j;
          T const ref = r >= 0 && r < M && c >= 0 && c < 35 ? this->x(r, 2 * c) : T(0);
          ASSERT_EQ(v(i, j), ref) << "block at (" << r0 << ", " << c0 << ") " << at(i, j);
        }
    }
  tile<T, 5, 16> w(T(-1));
  store(make_block_ptr<5, 16>(xs, {35, 30}), w, bounds<0, 1>);
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c) {
      bool const hit = r >= 35 && c % 2 == 0 && c / 2 >= 30;
      ASSERT_EQ(this->x(r, c), hit ? T(-1) : value_at<T>(r * N + c)) << at(r, c);
    }
}

// ---------------------------------------------------------------------------------------------
// 3-D
// ---------------------------------------------------------------------------------------------

TYPED_TEST(BlockPtrFloat, ThreeDimensional) {
  using T = TypeParam;
  constexpr int A = 3, B = 5, C = 37;
  owned_tensor<T> t({A, B, C}, "t3");
  tg_mem::fill_values(t);
  std::int64_t const offsets[][3] = {{-1, 3, 30}, {2, -2, -5}, {0, 0, 0}, {1, 1, 21}, {-2, -4, -16}, {3, 5, 37}, {2, 4, 36}};
  for (auto const& o : offsets) {
    auto const bp = make_block_ptr<2, 4, 16>(tensor<T const>(t), {o[0], o[1], o[2]});
    tile<T, 2, 4, 16> const z = load(bp, bounds<0, 1, 2>);
    tile<T, 2, 4, 16> const n = load(bp, bounds<0, 1, 2>, padding::nan);
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 4; ++j)
        for (int k = 0; k < 16; ++k) {
          std::int64_t const a = o[0] + i, b = o[1] + j, c = o[2] + k;
          bool const in = a >= 0 && a < A && b >= 0 && b < B && c >= 0 && c < C;
          ASSERT_EQ(z(i, j, k), in ? t(a, b, c) : T(0)) << "block at (" << o[0] << ", " << o[1] << ", " << o[2] << ") " << at(i, j, k);
          ASSERT_TRUE(same_value(n(i, j, k), in ? t(a, b, c) : std::numeric_limits<T>::quiet_NaN())) << at(i, j, k);
        }
    // store, then compare the whole tensor
    owned_tensor<T> u({A, B, C}, "u");
    tg_mem::fill_with(u, sentinel<T>());
    tile<T, 2, 4, 16> v;
    for (int f = 0; f < v.size; ++f) v.data()[f] = value_at<T>(f);
    store(make_block_ptr<2, 4, 16>(tensor<T>(u), {o[0], o[1], o[2]}), v, bounds<0, 1, 2>);
    for (int a = 0; a < A; ++a)
      for (int b = 0; b < B; ++b)
        for (int c = 0; c < C; ++c) {
          std::int64_t const i = a - o[0], j = b - o[1], k = c - o[2];
          bool const hit = i >= 0 && i < 2 && j >= 0 && j < 4 && k >= 0 && k < 16;
          ASSERT_EQ(u(a, b, c), hit ? v(static_cast<int>(i), static_cast<int>(j), static_cast<int>(k)) : sentinel<T>())
              << "store at (" << o[0] << ", " << o[1] << ", " << o[2] << ") " << at(a, b, c);
        }
  }
  // Boundary checks on a subset: axis 1 stays inside, axes 0 and 2 hang over.
  tile<T, 2, 4, 16> const s = load(make_block_ptr<2, 4, 16>(tensor<T const>(t), {2, 1, 30}), bounds<0, 2>);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j)
      for (int k = 0; k < 16; ++k) {
        bool const in = 2 + i < A && 30 + k < C;
        ASSERT_EQ(s(i, j, k), in ? t(2 + i, 1 + j, 30 + k) : T(0)) << at(i, j, k);
      }
}

// ---------------------------------------------------------------------------------------------
// advance: the weighted-sum kernel's walk
// ---------------------------------------------------------------------------------------------

// y = x @ w with block pointers advanced along D: the access pattern of
// kernels/weighted_sum.hpp, written out here so that the test depends on the memory layer only.
template <int BR, int BD>
constexpr auto weighted_sum = []<class T>(program const& p, tensor<T const> x, tensor<T const> w,
                                          tensor<T> y) {
  auto xb = make_block_ptr<BR, BD>(x, {p.program_id(0) * std::int64_t{BR}, 0});
  auto wb = make_block_ptr<BD>(w, {0});
  auto acc = zeros<T, BR>();
  for (int i = 0; i < cdiv<std::int64_t>(x.size(1), BD); ++i) {
    acc += sum<1>(load(xb, bounds<0, 1>) * row(load(wb, bounds<0>)));
    xb = xb.advance(0, BD);
    wb = wb.advance(BD);
  }
  store(make_block_ptr<BR>(y, {p.program_id(0) * std::int64_t{BR}}), acc, bounds<0>);
};

TYPED_TEST(BlockPtrFloat, AdvanceLikeTheWeightedSumKernel) {
  using T = TypeParam;
  // Values k/4 and k/8 with small k: every product and partial sum is exact in float, so the
  // result does not depend on the order of summation.
  owned_tensor<T> x({M, N}, "x"), w({N}, "w"), y({M}, "y");
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) x(i, j) = T((i * 7 + j * 3) % 33 - 16) / T(4);
  for (int j = 0; j < N; ++j) w(j) = T((j * 5) % 17 - 8) / T(8);
  constexpr int BR = 16, BD = 32;
  int const grid = cdiv(M, BR);
  for (int pid = 0; pid < grid; ++pid)
    as_program(pid, grid, [&](program const& p) { weighted_sum<BR, BD>(p, tensor<T const>(x), tensor<T const>(w), tensor<T>(y)); });
  for (int i = 0; i < M; ++i) {
    T ref = 0;
    for (int j = 0; j < N; ++j) ref += x(i, j) * w(j);
    ASSERT_EQ(y(i), ref) << at(i);
  }

  // The blocks that walk reads, one by one.
  for (int pid = 0; pid < grid; ++pid) {
    auto xb = make_block_ptr<BR, BD>(tensor<T const>(x), {pid * std::int64_t{BR}, 0});
    for (int step = 0; step < cdiv(N, BD); ++step) {
      EXPECT_EQ(xb.offsets()[0], pid * BR);
      EXPECT_EQ(xb.offsets()[1], step * BD);
      tile<T, BR, BD> const v = load(xb, bounds<0, 1>);
      for (int i = 0; i < BR; ++i)
        for (int j = 0; j < BD; ++j) {
          int const r = pid * BR + i, c = step * BD + j;
          ASSERT_EQ(v(i, j), r < M && c < N ? x(r, c) : T(0)) << "pid " << pid << " step " << step << " " << at(i, j);
        }
      xb = xb.advance(0, BD);
    }
  }

  // advance returns a moved copy (the original stays), by any deltas, negative ones too.
  auto const b0 = make_block_ptr<4, 8>(tensor<T const>(x), {10, 20});
  auto const b1 = b0.advance(-12, 55);
  EXPECT_EQ(b0.offsets()[0], 10);
  EXPECT_EQ(b0.offsets()[1], 20);
  EXPECT_EQ(b1.offsets()[0], -2);
  EXPECT_EQ(b1.offsets()[1], 75);
  EXPECT_EQ(b1.shape(), b0.shape());
  EXPECT_EQ(b1.strides(), b0.strides());
  tile<T, 4, 8> const v = load(b1.advance(3, -10), bounds<0, 1>);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 8; ++j) {
      int const r = 1 + i, c = 65 + j;
      ASSERT_EQ(v(i, j), r < M && c < N ? x(r, c) : T(0)) << at(i, j);
    }
}

// ---------------------------------------------------------------------------------------------
// The full form: explicit shape, strides and order
// ---------------------------------------------------------------------------------------------

TYPED_TEST(BlockPtrFloat, FullFormTransposedView) {
  using T = TypeParam;
  tensor<T const> const x = this->x;
  // x is (M, N); its transpose is the (N, M) array with strides (1, N) over the same buffer.
  for (std::int64_t o0 : hanging(16, N))
    for (std::int64_t o1 : hanging(5, M)) {
      auto const bp = make_block_ptr<16, 5>(x, {N, M}, {1, N}, {o0, o1}, {0, 1});
      tile<T, 16, 5> const v = load(bp, bounds<0, 1>);
      for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 5; ++j) {
          std::int64_t const a = o0 + i, b = o1 + j; // coordinates in the transpose
          T const ref = a >= 0 && a < N && b >= 0 && b < M ? x(b, a) : T(0);
          ASSERT_EQ(v(i, j), ref) << "block at (" << o0 << ", " << o1 << ") " << at(i, j);
        }
    }
  // Store through the transposed view.
  tile<T, 16, 5> w;
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 5; ++j) w(i, j) = value_at<T>(i * 5 + j);
  store(make_block_ptr<16, 5>(tensor<T>(this->y), {N, M}, {1, N}, {60, 34}, {1, 0}), w, bounds<0, 1>);
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c) {
      bool const hit = c >= 60 && r >= 34; // transpose element (c, r) = block (c - 60, r - 34)
      ASSERT_EQ(this->y(r, c), hit ? w(c - 60, r - 34) : sentinel<T>()) << at(r, c);
    }
  // The full form with the tensor's own layout equals the short form.
  tile<T, 5, 37> const a = load(make_block_ptr<5, 37>(x, {M, N}, {N, 1}, {34, 40}, {1, 0}), bounds<0, 1>);
  tile<T, 5, 37> const b = load(make_block_ptr<5, 37>(x, {34, 40}), bounds<0, 1>);
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 37; ++j) ASSERT_EQ(a(i, j), b(i, j)) << at(i, j);
}

TEST(BlockPtrErrors, OrderMustBeAPermutation) {
  owned_tensor<float> x({M, N}, "x");
  tensor<float> const t = x;
  EXPECT_NO_THROW(((void)make_block_ptr<4, 4>(t, {M, N}, {N, 1}, {0, 0}, {1, 0})));
  EXPECT_NO_THROW(((void)make_block_ptr<4, 4>(t, {M, N}, {N, 1}, {0, 0}, {0, 1})));
  EXPECT_THROW(((void)make_block_ptr<4, 4>(t, {M, N}, {N, 1}, {0, 0}, {0, 0})), std::invalid_argument);
  EXPECT_THROW(((void)make_block_ptr<4, 4>(t, {M, N}, {N, 1}, {0, 0}, {1, 2})), std::invalid_argument);
  EXPECT_THROW(((void)make_block_ptr<4, 4>(t, {M, N}, {N, 1}, {0, 0}, {-1, 0})), std::invalid_argument);
  EXPECT_THROW(((void)make_block_ptr<4>(tensor<float>(x.data(), {M * N}), {M * N}, {1}, {0}, {1})), std::invalid_argument);
  EXPECT_THROW(((void)make_block_ptr<2, 2, 2>(t, {2, 2, 2}, {4, 2, 1}, {0, 0, 0}, {2, 0, 2})), std::invalid_argument);
  EXPECT_THROW(((void)make_block_ptr<4, 4>(t, {-1, N}, {N, 1}, {0, 0}, {1, 0})), std::invalid_argument);
  // The message names the tensor, the order given and the line (it named none of them).
  int line = 0;
  try {
    line = __LINE__ + 1;
    (void)make_block_ptr<4, 4>(t, {M, N}, {N, 1}, {0, 0}, {1, 1});
  } catch (std::invalid_argument const& e) {
    std::string const what = e.what();
    EXPECT_NE(what.find("'x'"), std::string::npos) << what;
    EXPECT_NE(what.find("order {1, 1} must be a permutation of the block's 2 axes"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find(":" + std::to_string(line)), std::string::npos) << what;
  }
  EXPECT_NE(line, 0);
}

TEST(BlockPtrErrors, RankMismatchThrows) {
  owned_tensor<float> x({M, N}, "x");
  owned_tensor<float> v({M}, "v");
  try {
    (void)make_block_ptr<16>(tensor<float>(x), {0});
    ADD_FAILURE() << "a 1-D block on a 2-D tensor did not throw";
  } catch (std::invalid_argument const& e) {
    std::string const what = e.what();
    EXPECT_NE(what.find("'x'"), std::string::npos) << what;
    EXPECT_NE(what.find("rank 1"), std::string::npos) << what;
    EXPECT_NE(what.find("rank 2"), std::string::npos) << what;
  }
  EXPECT_THROW(((void)make_block_ptr<4, 4>(tensor<float>(v), {0, 0})), std::invalid_argument);
  EXPECT_THROW(((void)make_block_ptr<2, 4, 4>(tensor<float const>(x), {0, 0, 0})), std::invalid_argument);
  // Inside a program the message names it and the line of the make_block_ptr.
  as_program(3, 5, [&](program const&) {
    int const line = __LINE__ + 2;
    try {
      (void)make_block_ptr<16>(tensor<float>(x), {0});
      ADD_FAILURE() << "a 1-D block on a 2-D tensor did not throw";
    } catch (std::invalid_argument const& e) {
      std::string const what = e.what();
      EXPECT_NE(what.find("by program (3, 0, 0)"), std::string::npos) << what;
      EXPECT_NE(what.find("test_block_ptr.cpp:" + std::to_string(line)), std::string::npos) << what;
    }
  });
}

TEST(BlockPtrCast, StoreConvertsToTheTensorType) {
  checked_scope on(true);
  owned_tensor<double> d({M, N}, "d");
  tile<float, 5, 37> v;
  for (int f = 0; f < v.size; ++f) v.data()[f] = 0.1f * static_cast<float>(f) - 3.3f;
  store(make_block_ptr<5, 37>(tensor<double>(d), {35, 50}), v, bounds<0, 1>);
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c) {
      bool const hit = r >= 35 && c >= 50;
      ASSERT_EQ(d(r, c), hit ? static_cast<double>(v(r - 35, c - 50)) : 0.0) << at(r, c);
    }
  // An expression is evaluated and converted on the way.
  store(make_block_ptr<5, 37>(tensor<double>(d), {0, 0}), v * 2.0f, bounds<0, 1>);
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 37; ++j) ASSERT_EQ(d(i, j), static_cast<double>(v(i, j) * 2.0f)) << at(i, j);
}

// bf16 blocks (rows copied as bytes): hanging over every edge with both paddings, from a
// contiguous tensor and from a transposed (strided) view, against the tensor element by element.
TEST(BlockPtrBf16, LoadCopiesTheInsideElementsAndPads) {
  checked_scope on(true);
  owned_tensor<bf16> x({M, N}, "x");
  for (std::int64_t i = 0; i < x.numel(); ++i)
    x.data()[i] = bf16(0.25f * static_cast<float>(i % 509) - 60.0f);
  auto const check = [&](tensor<bf16 const> t, char const* what) {
    std::int64_t const rows = t.size(0), cols = t.size(1);
    for (std::int64_t r0 : hanging(5, static_cast<int>(rows)))
      for (std::int64_t c0 : hanging(37, static_cast<int>(cols)))
        for (padding pad : {padding::zero, padding::nan, padding::neg_inf}) {
          tile<bf16, 5, 37> const v = load(make_block_ptr<5, 37>(t, {r0, c0}), bounds<0, 1>, pad);
          for (int i = 0; i < 5; ++i)
            for (int j = 0; j < 37; ++j) {
              std::int64_t const r = r0 + i, c = c0 + j;
              bool const in = r >= 0 && r < rows && c >= 0 && c < cols;
              float const got = static_cast<float>(v(i, j));
              if (in)
                ASSERT_EQ(v(i, j).bits, t(r, c).bits) << what << " " << at(i, j) << " at " << r0 << ", " << c0;
              else if (pad == padding::nan)
                ASSERT_TRUE(std::isnan(got)) << what << " " << at(i, j);
              else if (pad == padding::neg_inf)
                ASSERT_EQ(got, -std::numeric_limits<float>::infinity()) << what << " " << at(i, j);
              else
                ASSERT_EQ(got, 0.0f) << what << " " << at(i, j);
            }
        }
  };
  check(x.cview(), "contiguous");
  check(tensor<bf16 const>(x.data(), {N, M}, {1, N}, "xt"), "transposed view");
}

} // namespace

} // namespace test_block_ptr
