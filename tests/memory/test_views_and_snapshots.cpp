// Pointer tiles snapshot their offsets (a named tile, or an expression of tiles); tensors reject
// layouts the checks cannot cover.
#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_views_and_snapshots {

namespace tg = tilegrad;

TEST(PointerSnapshot, OffsetTileChangedAfterwardsDoesNotMoveThePointers) {
  tg::owned_tensor<float> x({16}, "x");
  for (int i = 0; i < 16; ++i) x(i) = static_cast<float>(i);
  tg::tile<std::int32_t, 4> idx = tg::arange<0, 4>() * 2; // a gather: 0 2 4 6
  auto p = x.cview() + idx;
  auto q = p + idx;   // 0 4 8 12
  idx = idx + 1;      // the caller's tile changes; p and q must not
  auto v = tg::load(p);
  auto w = tg::load(q);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(v(i), 2.0f * i) << i;
    EXPECT_EQ(w(i), 4.0f * i) << i;
  }
}

// An offset expression refers to the tiles it reads; the pointer tile copies them in.
TEST(PointerSnapshot, OffsetExpressionsOfTilesChangedAfterwardsDoNotMoveThePointers) {
  tg::owned_tensor<float> x({64}, "x");
  for (int i = 0; i < 64; ++i)
    x(i) = static_cast<float>(i);
  tg::tile<std::int32_t, 4> idx = tg::arange<0, 4>() * 3; // 0 3 6 9
  tg::tile<std::int32_t, 4> rows = tg::arange<0, 4>();
  tg::tile<std::int32_t, 8> cols = tg::arange<0, 8>();
  auto const gather = x.cview() + idx * 2;                          // 0 6 12 18: gathered
  auto const block = x.cview() + tg::col(rows) * 8 + tg::row(cols); // rows 0-3: affine
  auto const more = gather + idx;                                   // 0 9 18 27
  auto const less = (x.cview() + 40) - idx;                         // 40 37 34 31, from a temporary
  auto const twice = (x.cview() + idx) + idx * 2;                   // 0 9 18 27, from a temporary
  idx = idx + 1; // Triton: offs += 1; the pointers made before stay where they were
  rows = rows + 4;
  cols = cols * 0;
  auto const g = tg::load(gather), m = tg::load(more), l = tg::load(less), t = tg::load(twice);
  auto const b = tg::load(block);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(g(i), 6.0f * i) << i;
    EXPECT_EQ(m(i), 9.0f * i) << i;
    EXPECT_EQ(l(i), 40.0f - 3.0f * i) << i;
    EXPECT_EQ(t(i), 9.0f * i) << i;
    for (int c = 0; c < 8; ++c)
      EXPECT_EQ(b(i, c), static_cast<float>(i * 8 + c)) << i << ", " << c;
  }
}

// Triton's matmul walk: pointers made from offs_k, then offs_k += BK for the next mask. Every mode
// reads and writes where the pointers were made: y(r, c) = 2 x(r, c) + x(r, c + 4) for c < 4.
constexpr auto offsets_moved_after = []<class T>(tg::program const&, tg::tensor<T const> x,
                                                 tg::tensor<T> y) {
  using F = tg::fp32<T>;
  tg::tile<std::int32_t, 4> rows = tg::arange<0, 4>();
  tg::tile<std::int32_t, 4> offs_k = tg::arange<0, 4>();
  auto xs = x + tg::col(rows) * x.stride(0) + tg::row(offs_k);
  auto const ys = y + tg::col(rows) * y.stride(0) + tg::row(offs_k);
  tg::tile<F, 4, 4> acc = tg::zeros<F, 4, 4>();
  for (int k = 0; k < 2; ++k) {
    acc = acc * 2 + tg::load(xs, tg::row(offs_k < x.size(1)), 0.0);
    xs += 4;
    offs_k = offs_k + 4;
  }
  rows = rows * 0;
  tg::store(ys, acc);
};

TEST(PointerSnapshot, AKernelReadsAndWritesWhereItsPointersWereMadeInEveryMode) {
  tg::owned_tensor<double> x({4, 8}, "x"), y({4, 4}, "y"), w({4, 4}, "w"), u({4, 8}, "u");
  for (int i = 0; i < 32; ++i) {
    x.data()[i] = 0.25 * i - 3;
    u.data()[i] = (i % 5) - 2;
  }
  for (int i = 0; i < 16; ++i)
    w.data()[i] = 1 + 0.5 * i;
  tg::launch(1, offsets_moved_after, x.cview(), y.view());
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c)
      EXPECT_EQ(y(r, c), 2 * x(r, c) + x(r, c + 4)) << r << ", " << c;
  auto g = tg::vjp(1, offsets_moved_after, tg::in("x", x), tg::out("y", y, w));
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 8; ++c)
      EXPECT_EQ(g["x"](r, c), (c < 4 ? 2 : 1) * w(r, c % 4)) << r << ", " << c;
  tg::owned_tensor<double> yt({4, 4}, "y");
  auto t = tg::jvp(1, offsets_moved_after, tg::tangent_in("x", x, u), tg::tangent_out("y", yt));
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c)
      EXPECT_EQ(t["y"](r, c), 2 * u(r, c) + u(r, c + 4)) << r << ", " << c;
}

TEST(TensorLayouts, NegativeStridesAndExtentsAreRejected) {
  float buf[8] = {};
  EXPECT_THROW((tg::tensor<float>(buf + 7, {8}, {-1}, "rev")), std::invalid_argument);
  EXPECT_THROW((tg::owned_tensor<float>({-3}, "neg")), std::invalid_argument);
  EXPECT_NO_THROW((tg::tensor<float>(buf, {2, 4}, {1, 2}, "t")));
}

} // namespace test_views_and_snapshots
