// Block loads that read a read-only tensor in place (a heap tile borrowing the memory,
// core/storage.hpp): a loaded tile is still a value. Whatever this thread stores afterwards (a
// block store, a pointer store, an atomic, through another view of the same memory), whatever is
// written into the tile, however the tile is moved, and whichever expression holds it, the tile
// reads what was loaded. Each case first checks that the load did borrow (the tile's data is the
// tensor's memory), so that the rest tests the borrowing path and not a copy. Loads borrow only in
// a program of a plain launch: the last cases check that host code, a launch that tracks accesses
// and vjp copy. One case runs a user's in-place kernel at a realistic size against plain loops.
#include "memory_test_util.hpp"

#include <tilegrad/grid/launch.hpp>
#include <tilegrad/memory/block_ptr.hpp>
#include <tilegrad/memory/pointer.hpp>
#include <tilegrad/tile/creation.hpp>
#include <tilegrad/tile/elementwise.hpp>
#include <tilegrad/tile/reduce.hpp>
#include <tilegrad/tile/shape_ops.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_borrowed_loads {

namespace {

using namespace tilegrad;

constexpr int M = 48, N = 32;    // the tensor
constexpr int R = 16, C = 32;    // a block of whole rows (laid out as a tile): 512 elements, a
                                 // heap tile for every type below
constexpr std::int64_t r0 = 8, c0 = 0; // where it sits

template <class T>
T value(std::int64_t i, std::int64_t j) {
  return static_cast<T>(3 * i + j % 7 + 1) / static_cast<T>(std::is_integral_v<T> ? 1 : 4);
}

template <class T>
class Borrowed : public ::testing::Test {
protected:
  // Tiles borrow only inside a program of a plain launch: the tests run as one.
  program const prog{{0, 0, 0}, {1, 1, 1}};
  detail::program_scope const scope{prog};

  Borrowed() : x({M, N}, "x"), out({M, N}, "out") {
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t j = 0; j < N; ++j) x(i, j) = value<T>(i, j);
  }
  // The same memory as a read-only view (what the kernel reads) and a writable one (what it
  // writes: an in-place launch passes one buffer as both).
  tensor<T const> src() const { return x.cview(); }
  tensor<T> dst() const { return x.view(); }
  T const* at(std::int64_t i, std::int64_t j) const { return x.data() + i * N + j; }

  template <class Tile>
  void expect_block(Tile const& t, std::int64_t i0, std::int64_t j0, T add, char const* what) {
    for (int i = 0; i < R; ++i)
      for (int j = 0; j < C; ++j)
        ASSERT_EQ(t(i, j), static_cast<T>(value<T>(i0 + i, j0 + j) + add))
            << what << " at (" << i << ", " << j << ")";
  }

  owned_tensor<T> x, out;
};
using Types = ::testing::Types<float, double, std::int32_t>;
TYPED_TEST_SUITE(Borrowed, Types);

TYPED_TEST(Borrowed, AStoreToTheLoadedMemoryLeavesTheTileItsValues) {
  using T = TypeParam;
  auto const bp = make_block_ptr<R, C>(this->src(), {r0, c0});
  tile<T, R, C> const a = load(bp);
  ASSERT_EQ(a.data(), this->at(r0, c0)) << "the load did not borrow";
  store(make_block_ptr<R, C>(this->dst(), {r0, c0}), a * T(2)); // in place
  EXPECT_NE(a.data(), this->at(r0, c0));
  this->expect_block(a, r0, c0, T(0), "tile after the store");
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < C; ++j)
      ASSERT_EQ(this->x(r0 + i, c0 + j), static_cast<T>(2 * value<T>(r0 + i, c0 + j)));
  // A store elsewhere in the tensor's memory counts too: the borrow covers the tensor.
  tile<T, R, C> const b = load(make_block_ptr<R, C>(this->src(), {M - R, 0}));
  ASSERT_EQ(b.data(), this->at(M - R, 0));
  store(make_block_ptr<R, C>(this->dst(), {0, 0}), zeros<T, R, C>());
  EXPECT_NE(b.data(), this->at(M - R, 0));
  this->expect_block(b, M - R, 0, T(0), "tile after a store elsewhere");
}

TYPED_TEST(Borrowed, AnExpressionHeldAcrossAStoreReadsTheLoadedValues) {
  using T = TypeParam;
  tile<T, R, C> const a = load(make_block_ptr<R, C>(this->src(), {r0, c0}));
  ASSERT_EQ(a.data(), this->at(r0, c0));
  auto const e = a + T(1); // built while a borrows: it must follow a to its copy
  store(make_block_ptr<R, C>(this->dst(), {r0, c0}), zeros<T, R, C>());
  store(make_block_ptr<R, C>(this->out.view(), {0, 0}), e);
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < C; ++j)
      ASSERT_EQ(this->out(i, j), static_cast<T>(value<T>(r0 + i, c0 + j) + 1)) << i << ", " << j;
}

TYPED_TEST(Borrowed, ATransposeStoredOverItsOwnSource) {
  using T = TypeParam;
  constexpr int S = 16;
  // A 16 x 16 block of rows 32 long is not laid out as a tile: it is copied...
  tile<T, S, S> const a = load(make_block_ptr<S, S>(this->src(), {0, 0}));
  EXPECT_NE(a.data(), this->at(0, 0));
  // ... while the same memory seen as rows of 16 is read in place.
  tensor<T const> narrow(this->x.data(), {M * N / S, S}, "x as rows of 16");
  tensor<T> narrow_w(this->x.data(), {M * N / S, S}, "x as rows of 16");
  tile<T, S, S> const b = load(make_block_ptr<S, S>(narrow, {0, 0}));
  ASSERT_EQ(b.data(), this->at(0, 0));
  std::vector<T> before(this->x.data(), this->x.data() + S * S);
  store(make_block_ptr<S, S>(narrow_w, {0, 0}), trans(b));
  for (int i = 0; i < S; ++i)
    for (int j = 0; j < S; ++j)
      ASSERT_EQ(this->x.data()[i * S + j], before[static_cast<std::size_t>(j * S + i)]) << i << ", " << j;
}

TYPED_TEST(Borrowed, WritingTheTileNeverWritesTheTensor) {
  using T = TypeParam;
  auto const bp = make_block_ptr<R, C>(this->src(), {r0, c0});
  tile<T, R, C> a = load(bp);
  ASSERT_EQ(std::as_const(a).data(), this->at(r0, c0)); // (a non-const data() would copy)
  a += T(1);
  this->expect_block(a, r0, c0, T(1), "tile after +=");
  tile<T, R, C> b = load(bp);
  ASSERT_EQ(std::as_const(b).data(), this->at(r0, c0));
  b(3, 4) = T(-5);
  EXPECT_EQ(b(3, 4), T(-5));
  tile<T, R, C> c = load(bp);
  c = b; // copy assignment into a borrower
  EXPECT_EQ(c(3, 4), T(-5));
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j) ASSERT_EQ(this->x(i, j), value<T>(i, j)) << i << ", " << j;
}

TYPED_TEST(Borrowed, MovedAndSwappedTilesKeepTheirValues) {
  using T = TypeParam;
  auto const bp = make_block_ptr<R, C>(this->src(), {r0, c0});
  auto const bq = make_block_ptr<R, C>(this->src(), {0, 0});
  tile<T, R, C> a = load(bp);
  tile<T, R, C> b = std::move(a); // move construction
  ASSERT_EQ(std::as_const(b).data(), this->at(r0, c0));
  tile<T, R, C> c;
  c = load(bq); // move assignment from a borrower
  tile<T, R, C> d = load(bq);
  d = std::move(b); // borrower onto borrower
  std::vector<tile<T, R, C>> kept;
  kept.push_back(load(bp));
  kept.push_back(load(bq)); // (the vector moves its elements as it grows)
  kept.push_back(load(bp));
  store(make_block_ptr<R, C>(this->dst(), {0, 0}), full<T, R, C>(T(9)));
  store(make_block_ptr<R, C>(this->dst(), {r0, c0}), full<T, R, C>(T(7)));
  this->expect_block(c, 0, 0, T(0), "c");
  this->expect_block(d, r0, c0, T(0), "d");
  this->expect_block(kept[0], r0, c0, T(0), "kept[0]");
  this->expect_block(kept[1], 0, 0, T(0), "kept[1]");
  this->expect_block(kept[2], r0, c0, T(0), "kept[2]");
}

TYPED_TEST(Borrowed, PointerStoresAndAtomicsThroughAnotherViewCount) {
  using T = TypeParam;
  tensor<T> flat(this->x.data(), {M * N}, "x, flat");
  tile<T, R, C> const a = load(make_block_ptr<R, C>(this->src(), {r0, c0}));
  ASSERT_EQ(a.data(), this->at(r0, c0));
  store(flat + (r0 * N + c0 + arange<0, 16>()), full<T, 16>(T(-1)));
  this->expect_block(a, r0, c0, T(0), "after a pointer store");
  tile<T, R, C> const b = load(make_block_ptr<R, C>(this->src(), {r0, c0}));
  ASSERT_EQ(b.data(), this->at(r0, c0));
  EXPECT_EQ(b(0, 0), T(-1));
  atomic_add(flat + ((r0 + 1) * N + c0 + arange<0, 16>()), full<T, 16>(T(100)));
  EXPECT_EQ(b(1, 0), value<T>(r0 + 1, c0));
  EXPECT_EQ(this->x(r0 + 1, c0), static_cast<T>(value<T>(r0 + 1, c0) + 100));
}

TYPED_TEST(Borrowed, AnElementWrittenThroughAWritableViewLeavesTheTileItsValue) {
  using T = TypeParam;
  tile<T, R, C> const a = load(make_block_ptr<R, C>(this->src(), {r0, c0}));
  ASSERT_EQ(a.data(), this->at(r0, c0));
  auto expr = a + T(1); // held across the write: follows the tile to its copy
  this->dst()(r0 + 2, c0 + 3) = T(-5);
  this->expect_block(a, r0, c0, T(0), "after an element write");
  tile<T, R, C> const b = expr;
  this->expect_block(b, r0, c0, T(1), "an expression held across it");
  EXPECT_EQ(this->x(r0 + 2, c0 + 3), T(-5));
  // A read-only view's element access writes nothing and copies nothing.
  tile<T, R, C> const c = load(make_block_ptr<R, C>(this->src(), {r0, c0}));
  ASSERT_EQ(c.data(), this->at(r0, c0));
  EXPECT_EQ(this->src()(r0 + 2, c0 + 3), T(-5));
  EXPECT_EQ(c.data(), this->at(r0, c0));
}

TYPED_TEST(Borrowed, MoreLiveTilesThanTheListHoldsAllKeepTheirValues) {
  using T = TypeParam;
  std::vector<tile<T, R, C>> tiles;
  tiles.reserve(80);
  for (int k = 0; k < 80; ++k) tiles.push_back(load(make_block_ptr<R, C>(this->src(), {k % 7, 0})));
  store(make_block_ptr<R, C>(this->dst(), {0, 0}), zeros<T, R, C>());
  for (int k = 0; k < 80; ++k) this->expect_block(tiles[static_cast<std::size_t>(k)], k % 7, 0, T(0), "tile k");
}

TYPED_TEST(Borrowed, TilesDroppedInAnyOrderLeaveTheOthersTracked) {
  using T = TypeParam;
  // The list drops the newest entry without a copy and fills a hole left by an older one with
  // the newest: after either, every live borrower must still be found by a store.
  auto load_at = [&](std::int64_t i) { return load(make_block_ptr<R, C>(this->src(), {i, 0})); };
  std::vector<std::int64_t> const rows{0, 4, 8, 12, 16, 20};
  for (int drop = 0; drop < 6; ++drop) {
    std::vector<std::optional<tile<T, R, C>>> tiles;
    tiles.reserve(rows.size());
    for (auto i : rows) {
      tiles.emplace_back(load_at(i));
      ASSERT_EQ(std::as_const(*tiles.back()).data(), this->at(i, 0));
    }
    tiles[static_cast<std::size_t>(drop)].reset(); // one from the middle, or the newest
    tile<T, R, C> const late = load_at(24);         // takes the freed place
    ASSERT_EQ(late.data(), this->at(24, 0));
    store(make_block_ptr<M, N>(this->dst(), {0, 0}), full<T, M, N>(T(-3)));
    for (std::size_t k = 0; k < rows.size(); ++k)
      if (tiles[k]) this->expect_block(*tiles[k], rows[k], 0, T(0), "a tile kept");
    this->expect_block(late, 24, 0, T(0), "the tile loaded last");
    for (std::int64_t i = 0; i < M; ++i) // the memory back as it was, for the next round
      for (std::int64_t j = 0; j < N; ++j) this->x(i, j) = value<T>(i, j);
  }
}

TYPED_TEST(Borrowed, UsedAtOnceAndAtTheEdges) {
  using T = TypeParam;
  // A load read straight into a reduction, and one hanging over the tensor's edge (copied, padded).
  auto const s = sum(load(make_block_ptr<R, C>(this->src(), {r0, c0})));
  T want = 0;
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < C; ++j) want += value<T>(r0 + i, c0 + j);
  EXPECT_EQ(s.item(), want);
  tile<T, R, C> const e = load(make_block_ptr<R, C>(this->src(), {M - 4, 0}), bounds<0, 1>);
  EXPECT_NE(e.data(), this->at(M - 4, 0));
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < C; ++j)
      ASSERT_EQ(e(i, j), i < 4 ? value<T>(M - 4 + i, j) : T(0)) << i << ", " << j;
}

// An in-place kernel as a user writes one: the buffer passed as the tensor it reads and the one it
// writes, each program loading its block, storing over it, then storing an expression of what it
// loaded elsewhere.
constexpr auto scale_in_place = [](program const& p, tensor<float const> src, tensor<float> dst,
                                   tensor<float> out, float* seen) {
  auto const bp = make_block_ptr<R, C>(src, {p.program_id(0) * R, p.program_id(1) * C});
  tile<float, R, C> const a = load(bp);
  if (p.program_id(0) == 0 && p.program_id(1) == 0) *seen = a.data() == src.data() ? 1.f : 0.f;
  auto const e = a - 1.0f;
  store(make_block_ptr<R, C>(dst, {p.program_id(0) * R, p.program_id(1) * C}), a * 2.0f);
  store(make_block_ptr<R, C>(out, {p.program_id(0) * R, p.program_id(1) * C}), e);
};

void run_in_place(launch_options const& opts, bool expect_borrow) {
  owned_tensor<float> x({M, N}, "x"), out({M, N}, "out");
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j) x(i, j) = value<float>(i, j);
  float seen = -1;
  launch(opts, grid(M / R, N / C), scale_in_place, x.cview(), x.view(), out.view(), &seen);
  EXPECT_EQ(seen, expect_borrow ? 1.f : 0.f);
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j) {
      ASSERT_EQ(x(i, j), 2 * value<float>(i, j)) << i << ", " << j;
      ASSERT_EQ(out(i, j), value<float>(i, j) - 1) << i << ", " << j;
    }
}

// bf16 storage (attention's K and V tiles): the same rules, for a type with no arithmetic of its
// own. The values are exact in bf16.
TEST(BorrowedBf16, ABlockReadsInPlaceAndKeepsItsValuesAcrossStores) {
  program const prog{{0, 0, 0}, {1, 1, 1}};
  detail::program_scope const scope{prog};
  owned_tensor<bf16> x({M, N}, "x");
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j) x(i, j) = bf16(value<float>(i, j));
  tensor<bf16 const> const src = x.cview();
  tile<bf16, R, C> const a = load(make_block_ptr<R, C>(src, {r0, c0}));
  ASSERT_EQ(a.data(), x.data() + r0 * N + c0);
  auto held = to<float>(a) + 1.0f; // an expression held across the store
  store(make_block_ptr<R, C>(x.view(), {r0, c0}), full<float, R, C>(-1.0f));
  EXPECT_EQ(float(x(r0, c0)), -1.0f);
  tile<float, R, C> const b = held;
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < C; ++j) {
      ASSERT_EQ(float(a(i, j)), value<float>(r0 + i, c0 + j)) << i << ", " << j;
      ASSERT_EQ(b(i, j), value<float>(r0 + i, c0 + j) + 1.0f) << i << ", " << j;
    }
  // A pointer store through another view of the same memory.
  tile<bf16, R, C> const c = load(make_block_ptr<R, C>(src, {r0, c0}));
  ASSERT_EQ(c.data(), x.data() + r0 * N + c0);
  store(x.view() + ((r0 + 1) * N + c0 + arange<0, 16>()), full<float, 16>(5.0f));
  EXPECT_EQ(float(c(0, 0)), -1.0f);
  EXPECT_EQ(float(c(1, 0)), -1.0f);
  EXPECT_EQ(float(x(r0 + 1, c0)), 5.0f);
}

TEST(BorrowedLaunch, AnInPlaceKernelBorrowsAndKeepsItsValues) {
  for (executor e : {executor::tbb, executor::openmp, executor::sequential})
    if (executor_available(e)) run_in_place({e, 2}, true);
}

// At a realistic size, against plain loops: each program scales two rows of a 1001 x 512 buffer
// by their largest magnitude, in place, then stores an expression of what it loaded (held in an
// `auto` across the store) beside it. The last program's block hangs over the edge and copies.
constexpr auto rows_in_place = [](program const& p, tensor<float const> src, tensor<float> dst,
                                  tensor<float> extra, float* seen) {
  auto const bp = make_block_ptr<2, 512>(src, {p.program_id(0) * 2, 0});
  tile<float, 2, 512> const x = load(bp, bounds<0>);
  if (p.program_id(0) == 3) *seen = x.data() == src.data() + 6 * 512 ? 1.f : 0.f;
  auto const m = max<1>(abs(x), keep_dims);
  auto const y = x / (m + 1.0f);
  store(make_block_ptr<2, 512>(dst, {p.program_id(0) * 2, 0}), y * 2.0f, bounds<0>);
  store(make_block_ptr<2, 1>(extra, {p.program_id(0) * 2, 0}), m + sum<1>(y, keep_dims), bounds<0>);
};

TEST(BorrowedLaunch, RowsScaledInPlaceAtARealisticSize) {
  constexpr std::int64_t rows = 1001, cols = 512;
  owned_tensor<float> z({rows, cols}, "z"), extra({rows, 1}, "extra");
  std::vector<float> x0(static_cast<std::size_t>(rows * cols));
  // Mostly positive, so that row sums are far from 0 (a sum that read the stored values instead
  // of the loaded ones must not pass for a rounding difference).
  for (std::size_t i = 0; i < x0.size(); ++i)
    x0[i] = z.data()[i] = static_cast<float>(i * 7919 % 2003) / 97.f - 3.f;
  for (executor e : {executor::tbb, executor::openmp, executor::sequential}) {
    if (!executor_available(e)) continue;
    std::copy(x0.begin(), x0.end(), z.data());
    float seen = -1;
    launch({e, 2}, grid(static_cast<int>((rows + 1) / 2)), rows_in_place, z.cview(), z.view(), extra.view(), &seen);
    EXPECT_EQ(seen, 1.f);
    for (std::int64_t i = 0; i < rows; ++i) {
      float m = 0;
      for (std::int64_t j = 0; j < cols; ++j) m = std::max(m, std::abs(x0[static_cast<std::size_t>(i * cols + j)]));
      double s = 0;
      for (std::int64_t j = 0; j < cols; ++j) {
        float const y = x0[static_cast<std::size_t>(i * cols + j)] / (m + 1.0f);
        s += y;
        ASSERT_EQ(z(i, j), y * 2.0f) << "row " << i << ", column " << j;
      }
      ASSERT_NEAR(extra(i, 0), m + s, 1e-4 * (1 + std::abs(m + s))) << "row " << i;
    }
  }
}

TEST(BorrowedLaunch, ALaunchThatTracksAccessesCopies) {
  launch_options opts{executor::sequential, 1};
  opts.check_races = true;
  run_in_place(opts, false);
}

TEST(BorrowedLaunch, HostCodeCopies) {
  owned_tensor<float> x({M, N}, "x");
  tile<float, R, C> const a = load(make_block_ptr<R, C>(x.cview(), {0, 0}));
  EXPECT_NE(a.data(), x.data());
}

} // namespace

} // namespace test_borrowed_loads
