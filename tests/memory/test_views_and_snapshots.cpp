// Pointer tiles snapshot a named offset tile; tensors reject layouts the checks cannot cover.
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

TEST(TensorLayouts, NegativeStridesAndExtentsAreRejected) {
  float buf[8] = {};
  EXPECT_THROW((tg::tensor<float>(buf + 7, {8}, {-1}, "rev")), std::invalid_argument);
  EXPECT_THROW((tg::owned_tensor<float>({-3}, "neg")), std::invalid_argument);
  EXPECT_NO_THROW((tg::tensor<float>(buf, {2, 4}, {1, 2}, "t")));
}

} // namespace test_views_and_snapshots
