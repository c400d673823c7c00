// Tensors (memory/tensor.hpp): contiguous and strided views, their queries (size, stride,
// numel, span, is_contiguous, contains, coordinates) checked against plain loops over the
// elements a view addresses, conversion to a const view, and owned_tensor's storage
// (64-byte alignment, zero fill, deep copies, moves).
#include "memory_test_util.hpp"

#include <tilegrad/memory/tensor.hpp>
#include <tilegrad/tilegrad.hpp>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <set>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_tensor {

namespace {

namespace tg = tilegrad;
using namespace tilegrad;
using tg_mem::at;
using tg_mem::value_at;

template <class T>
class Tensor : public ::testing::Test {};
TYPED_TEST_SUITE(Tensor, tg_mem::AllTypes);

// The offsets a view addresses, enumerated from its shape and strides (the reference for
// contains() and span()).
template <class T>
std::set<std::int64_t> addressed(tensor<T> const& t) {
  std::set<std::int64_t> out;
  std::int64_t idx[4] = {0, 0, 0, 0};
  if (t.numel() == 0)
    return out;
  for (;;) {
    std::int64_t off = 0;
    for (int a = 0; a < t.rank(); ++a)
      off += idx[a] * t.stride(a);
    out.insert(off);
    int a = t.rank() - 1;
    while (a >= 0 && ++idx[a] == t.size(a))
      idx[a--] = 0;
    if (a < 0)
      return out;
  }
}

// contains(o) for every o in [lo, hi) against the enumerated set, and coordinates() of every
// addressed offset against the coordinates that produced it.
template <class T>
void check_contains(tensor<T> const& t, std::int64_t lo, std::int64_t hi) {
  auto const in = addressed(t);
  for (std::int64_t o = lo; o < hi; ++o)
    EXPECT_EQ(t.contains(o), in.count(o) == 1) << "offset " << o << " of " << t.shape_string();
}

TYPED_TEST(Tensor, ContiguousViewQueries) {
  using T = TypeParam;
  std::vector<T> buf(37 * 70);
  for (std::size_t i = 0; i < buf.size(); ++i)
    buf[i] = value_at<T>(static_cast<std::int64_t>(i));
  tensor<T> x(buf.data(), {37, 70}, "x");
  EXPECT_EQ(x.data(), buf.data());
  EXPECT_EQ(x.rank(), 2);
  EXPECT_EQ(x.size(0), 37);
  EXPECT_EQ(x.size(1), 70);
  EXPECT_EQ(x.size(-1), 70);
  EXPECT_EQ(x.size(-2), 37);
  EXPECT_EQ(x.stride(0), 70);
  EXPECT_EQ(x.stride(1), 1);
  EXPECT_EQ(x.numel(), 37 * 70);
  EXPECT_EQ(x.span(), 37 * 70);
  EXPECT_TRUE(x.is_contiguous());
  EXPECT_EQ(std::string(x.name()), "x");
  EXPECT_EQ(x.shape_string(), "(37, 70)");
  EXPECT_THROW((void)x.size(2), std::out_of_range);
  EXPECT_THROW((void)x.stride(-3), std::out_of_range);
  for (int i = 0; i < 37; ++i)
    for (int j = 0; j < 70; ++j) {
      ASSERT_EQ(&x(i, j), &buf[static_cast<std::size_t>(i * 70 + j)]) << at(i, j);
      ASSERT_EQ(x.coordinates(i * 70 + j), tg_mem::coord(i, j)) << at(i, j);
    }
  check_contains(x, -75, 37 * 70 + 75);
  // Offsets outside still get coordinates (past the extent, or negative), which messages need.
  EXPECT_EQ(x.coordinates(37 * 70), "(37, 0)");
  EXPECT_EQ(x.coordinates(-1), "(0, -1)"); // column -1 of row 0, as an offset - 1 is written
  EXPECT_EQ(x.coordinates(-70), "(-1, 0)");

  // Writes through the view land in the buffer.
  x(36, 69) = T(5);
  EXPECT_EQ(buf.back(), T(5));

  // named(): the same view under another name; the original keeps its own.
  auto y = x.named("y");
  EXPECT_EQ(std::string(y.name()), "y");
  EXPECT_EQ(std::string(x.name()), "x");
  EXPECT_EQ(y.data(), x.data());
  EXPECT_EQ(y.shape(), x.shape());
  EXPECT_EQ(y.strides(), x.strides());
}

TYPED_TEST(Tensor, RanksOneToFour) {
  using T = TypeParam;
  std::vector<T> buf(3 * 4 * 5 * 7);
  tensor<T> a(buf.data(), {37});
  EXPECT_EQ(a.rank(), 1);
  EXPECT_EQ(a.stride(0), 1);
  EXPECT_EQ(a.span(), 37);
  EXPECT_EQ(a.coordinates(-1), "(-1)");
  EXPECT_EQ(a.coordinates(37), "(37)");
  EXPECT_EQ(std::string(a.name()), "");
  check_contains(a, -3, 40);

  tensor<T> c(buf.data(), {3, 4, 5});
  EXPECT_EQ(c.stride(0), 20);
  EXPECT_EQ(c.stride(1), 5);
  EXPECT_EQ(c.stride(2), 1);
  EXPECT_EQ(c.numel(), 60);
  EXPECT_EQ(&c(2, 3, 4), &buf[59]);
  EXPECT_EQ(c.coordinates(2 * 20 + 3 * 5 + 4), "(2, 3, 4)");

  tensor<T> d(buf.data(), {3, 4, 5, 7});
  EXPECT_EQ(d.rank(), 4);
  EXPECT_EQ(d.stride(0), 140);
  EXPECT_EQ(d.numel(), 420);
  EXPECT_EQ(d.span(), 420);
  EXPECT_EQ(&d(1, 2, 3, 4), &buf[140 + 70 + 21 + 4]);
  EXPECT_EQ(d.coordinates(140 + 70 + 21 + 4), "(1, 2, 3, 4)");
}

TYPED_TEST(Tensor, StridedViewWithGaps) {
  using T = TypeParam;
  std::vector<T> buf(50);
  // Rows of 7 in a buffer of rows of 10: offsets 7, 8, 9 of each row are gaps.
  tensor<T> x(buf.data(), {5, 7}, {10, 1}, "g");
  EXPECT_FALSE(x.is_contiguous());
  EXPECT_EQ(x.numel(), 35);
  EXPECT_EQ(x.span(), 4 * 10 + 6 + 1);
  EXPECT_EQ(x.stride(0), 10);
  EXPECT_EQ(&x(3, 6), &buf[36]);
  check_contains(x, -12, 60);
  EXPECT_FALSE(x.contains(8)) << "offset 8 is in a gap";
  EXPECT_EQ(x.coordinates(8), "(0, 8)");
  EXPECT_EQ(x.coordinates(36), "(3, 6)");
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 7; ++j)
      EXPECT_EQ(x.coordinates(i * 10 + j), tg_mem::coord(i, j)) << at(i, j);

  // Every other column of a 37 x 70 buffer.
  std::vector<T> big(37 * 70);
  tensor<T> ev(big.data(), {37, 35}, {70, 2});
  EXPECT_FALSE(ev.is_contiguous());
  EXPECT_EQ(ev.span(), 36 * 70 + 34 * 2 + 1);
  check_contains(ev, -3, 37 * 70 + 3);

  // A 3-D slice with strides (40, 10, 2) of a 120-element buffer.
  std::vector<T> b3(120);
  tensor<T> s3(b3.data(), {3, 4, 5}, {40, 10, 2});
  EXPECT_FALSE(s3.is_contiguous());
  check_contains(s3, -2, 125);
  EXPECT_EQ(s3.coordinates(40 + 20 + 8), "(1, 2, 4)");
}

TYPED_TEST(Tensor, TransposedViewByStrides) {
  using T = TypeParam;
  std::vector<T> buf(37 * 70);
  for (std::size_t i = 0; i < buf.size(); ++i)
    buf[i] = value_at<T>(static_cast<std::int64_t>(i));
  // The (70, 37) transpose of a contiguous (37, 70) buffer.
  tensor<T> t(buf.data(), {70, 37}, {1, 70});
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.span(), 37 * 70);
  EXPECT_EQ(t.numel(), 37 * 70);
  for (int i = 0; i < 70; ++i)
    for (int j = 0; j < 37; ++j) {
      ASSERT_EQ(t(i, j), buf[static_cast<std::size_t>(j * 70 + i)]) << at(i, j);
      ASSERT_EQ(t.coordinates(j * 70 + i), tg_mem::coord(i, j)) << at(i, j);
    }
  check_contains(t, -3, 37 * 70 + 3);
}

TYPED_TEST(Tensor, LayoutEdgeCases) {
  using T = TypeParam;
  std::vector<T> buf(500);
  // An extent-1 axis may have any stride and the view is still contiguous.
  tensor<T> one_row(buf.data(), {1, 5}, {100, 1});
  EXPECT_TRUE(one_row.is_contiguous());
  EXPECT_EQ(one_row.span(), 5);
  // Column-major is not row-major contiguous.
  tensor<T> colmajor(buf.data(), {5, 7}, {1, 5});
  EXPECT_FALSE(colmajor.is_contiguous());
  check_contains(colmajor, -1, 40);
  // Extent-1 axes whose stride ties with a longer axis's, or lies between the others: every
  // addressed offset is contained and named by the coordinates that address it (an extent-1
  // axis unravelled first took the longer axis's share: (1, 0, 0) for offset 8, out of bounds).
  struct layout {
    int rank;
    extents shape, strides;
  };
  for (auto const& [rank, shape, strides] : {layout{3, {1, 4, 4}, {8, 8, 1}},
                                             layout{3, {4, 1, 4}, {8, 1, 1}},
                                             layout{3, {4, 1, 3}, {8, 5, 1}},
                                             layout{4, {1, 3, 1, 4}, {4, 8, 8, 1}},
                                             layout{4, {2, 1, 1, 3}, {12, 12, 3, 1}}}) {
    tensor<T> v(buf.data(), rank, shape, strides);
    check_contains(v, -2, v.span() + 3);
    std::int64_t idx[4] = {0, 0, 0, 0};
    for (;;) {
      std::int64_t off = 0;
      std::string want = "(";
      for (int a = 0; a < v.rank(); ++a) {
        off += idx[a] * v.stride(a);
        want += (a ? ", " : "") + std::to_string(idx[a]);
      }
      EXPECT_EQ(v.coordinates(off), want + ")") << v.shape_string() << " offset " << off;
      int a = v.rank() - 1;
      while (a >= 0 && ++idx[a] == v.size(a))
        idx[a--] = 0;
      if (a < 0)
        break;
    }
  }
  // An empty view addresses nothing.
  tensor<T> empty(buf.data(), {0, 5});
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_EQ(empty.span(), 0);
  EXPECT_FALSE(empty.contains(0));
  // A default view: rank 1, no elements.
  tensor<T> def;
  EXPECT_EQ(def.rank(), 1);
  EXPECT_EQ(def.numel(), 0);
  EXPECT_EQ(def.data(), nullptr);
}

TYPED_TEST(Tensor, ConstructionErrors) {
  using T = TypeParam;
  std::vector<T> buf(16);
  EXPECT_THROW((tensor<T>(buf.data(), {2, 8}, {8})), std::invalid_argument);
  EXPECT_THROW((tensor<T>(buf.data(), {1, 1, 1, 1, 1})), std::invalid_argument);
  EXPECT_THROW((tensor<T>(buf.data(), {})), std::invalid_argument);
  EXPECT_THROW((tensor<T>(buf.data(), {2, -1})), std::invalid_argument);
  EXPECT_THROW((tensor<T>(buf.data(), 0, extents{}, extents{})), std::invalid_argument);
  EXPECT_THROW((tensor<T>(buf.data(), 5, extents{}, extents{})), std::invalid_argument);
}

TYPED_TEST(Tensor, ConvertsToConstView) {
  using T = TypeParam;
  static_assert(std::is_convertible_v<tensor<T>, tensor<T const>>);
  static_assert(!std::is_convertible_v<tensor<T const>, tensor<T>>);
  static_assert(std::is_same_v<typename tensor<T const>::value_type, T>);
  static_assert(std::is_same_v<typename tensor<T const>::element_type, T const>);
  std::vector<T> buf(37 * 70);
  for (std::size_t i = 0; i < buf.size(); ++i)
    buf[i] = value_at<T>(static_cast<std::int64_t>(i));
  tensor<T> x(buf.data(), {37, 35}, {70, 2}, "x");
  tensor<T const> c = x;
  EXPECT_EQ(c.data(), x.data());
  EXPECT_EQ(c.rank(), 2);
  EXPECT_EQ(c.shape(), x.shape());
  EXPECT_EQ(c.strides(), x.strides());
  EXPECT_EQ(std::string(c.name()), "x");
  for (int i = 0; i < 37; ++i)
    for (int j = 0; j < 35; ++j)
      ASSERT_EQ(c(i, j), buf[static_cast<std::size_t>(i * 70 + 2 * j)]) << at(i, j);
  static_assert(std::is_same_v<decltype(c(0, 0)), T const&>);
}

template <class T>
void expect_aligned(T const* p) {
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 64, 0u)
      << "storage at " << static_cast<void const*>(p);
}

TYPED_TEST(Tensor, OwnedTensorStorage) {
  using T = TypeParam;
  {
    owned_tensor<T> a({1});
    expect_aligned(a.data());
    owned_tensor<T> b({7});
    expect_aligned(b.data());
    owned_tensor<T> c({3, 5, 7}, "c");
    expect_aligned(c.data());
    EXPECT_EQ(c.numel(), 105);
    EXPECT_EQ(c.rank(), 3);
    EXPECT_EQ(c.size(2), 7);
    EXPECT_EQ(std::string(c.name()), "c");
    EXPECT_EQ(c.end() - c.begin(), 105);
  }
  owned_tensor<T> x({37, 70}, "x");
  expect_aligned(x.data());
  EXPECT_EQ(x.numel(), 37 * 70);
  for (std::int64_t i = 0; i < x.numel(); ++i)
    ASSERT_EQ(x.data()[i], T(0)) << at(i);
  tensor<T> v = x; // converts to a view of its storage
  EXPECT_EQ(v.data(), x.data());
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.size(0), 37);
  EXPECT_EQ(v.stride(0), 70);
  EXPECT_EQ(std::string(v.name()), "x");
  tensor<T const> cv = x;
  EXPECT_EQ(cv.data(), x.data());
  EXPECT_EQ(x.cview().data(), x.data());
  x(36, 69) = T(3);
  EXPECT_EQ(x.data()[37 * 70 - 1], T(3));
  EXPECT_EQ(x.view()(36, 69), T(3));
}

// From detail::large_block_bytes on, storage is a mapping of its own (core/pages.hpp): still
// aligned, zeroed, writable to its last element, and handed over by a move.
TYPED_TEST(Tensor, LargeOwnedTensorStorage) {
  using T = TypeParam;
  std::int64_t const rows = 3, cols = static_cast<std::int64_t>(detail::large_block_bytes / sizeof(T) / 2) + 17;
  owned_tensor<T> x({rows, cols}, "x");
  expect_aligned(x.data());
  for (std::int64_t i = 0; i < x.numel(); ++i)
    ASSERT_EQ(x.data()[i], T(0)) << at(i);
  x(rows - 1, cols - 1) = T(5);
  x(0, 0) = T(2);
  owned_tensor<T> y = std::move(x);
  EXPECT_EQ(y(rows - 1, cols - 1), T(5));
  owned_tensor<T> z = y; // a deep copy, in a mapping of its own
  EXPECT_NE(z.data(), y.data());
  EXPECT_EQ(z(0, 0), T(2));
  EXPECT_EQ(z(rows - 1, cols - 1), T(5));
  std::int64_t const shape[] = {rows, cols};
  owned_tensor<T> u(uninitialized, shape, 2, "u");
  expect_aligned(u.data());
  u(rows - 1, cols - 1) = T(1);
  EXPECT_EQ(u.data()[u.numel() - 1], T(1));
}

TEST(Tensor, AllocateBlockZeroesWhatItSaysAndAlignsLargeBlocks) {
  for (std::size_t bytes : {std::size_t{0}, std::size_t{100}, detail::large_block_bytes - 64,
                            detail::large_block_bytes, 3 * detail::large_block_bytes + 4096 + 8}) {
    auto* const p = static_cast<unsigned char*>(detail::allocate_block(bytes, true));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 64, 0u) << bytes;
    std::size_t nonzero = 0;
    for (std::size_t i = 0; i < bytes; ++i) nonzero += p[i] != 0;
    EXPECT_EQ(nonzero, 0u) << bytes;
    if (bytes > 0) p[bytes - 1] = 1; // the last byte is ours
    detail::free_block(p, bytes);
  }
}

// Blocks from kept_block_cache::smallest up to a huge page are kept when freed and handed out
// again for a size of the same class (core/pages.hpp): dirty when given back, a kept block must
// come out zeroed when asked, whole to its last byte, and never for a larger size.
TEST(Tensor, KeptBlocksComeBackZeroedAndWhole) {
  using detail::kept_block_cache;
  std::size_t const bytes = kept_block_cache::smallest + 3 * kept_block_cache::granule + 100;
  auto* const p = static_cast<unsigned char*>(detail::allocate_block(bytes, true));
  std::memset(p, 0xAB, bytes);
  detail::free_block(p, bytes);
  std::size_t const same_class = bytes + 200; // rounds up to the same multiple of the granule
  auto* const q = static_cast<unsigned char*>(detail::allocate_block(same_class, true));
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(q) % 64, 0u);
  std::size_t nonzero = 0;
  for (std::size_t i = 0; i < same_class; ++i) nonzero += q[i] != 0;
  EXPECT_EQ(nonzero, 0u) << "a kept block handed out dirty";
  q[same_class - 1] = 1; // the last byte is ours
  // A larger size does not get the block q frees.
  detail::free_block(q, same_class);
  std::size_t const larger = bytes + 2 * kept_block_cache::granule;
  auto* const r = static_cast<unsigned char*>(detail::allocate_block(larger, true));
  nonzero = 0;
  for (std::size_t i = 0; i < larger; ++i) nonzero += r[i] != 0;
  EXPECT_EQ(nonzero, 0u);
  r[larger - 1] = 1;
  detail::free_block(r, larger);
  // Owned tensors of that size, made and dropped again and again, start at zero every time.
  for (int round = 0; round < 3; ++round) {
    owned_tensor<float> t({static_cast<std::int64_t>(bytes / sizeof(float))}, "t");
    for (std::int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(t.data()[i], 0.0f) << round << ", " << i;
    std::fill(t.begin(), t.end(), 7.0f);
  }
}

TEST(Tensor, KeptMappingsComeBackZeroedAndWhole) {
  // Blocks of a huge page and more are mappings of their own; freed, a few are kept for the
  // next block of as many huge pages, and come back zeroed only where asked.
  std::size_t const bytes = 3 * detail::large_block_bytes / 2 + 100; // maps two huge pages
  auto* const p = static_cast<unsigned char*>(detail::allocate_block(bytes, true));
  std::memset(p, 0xAB, bytes);
  detail::free_block(p, bytes);
  std::size_t const same_class = bytes + 4096; // still two huge pages
  auto* const q = static_cast<unsigned char*>(detail::allocate_block(same_class, true));
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(q) % 64, 0u);
  std::size_t nonzero = 0;
  for (std::size_t i = 0; i < same_class; ++i) nonzero += q[i] != 0;
  EXPECT_EQ(nonzero, 0u) << "a kept mapping handed out dirty";
  std::memset(q, 0xCD, same_class); // every byte is ours
  detail::free_block(q, same_class);
  // A block of more huge pages does not get the mapping q frees.
  std::size_t const larger = bytes + detail::large_block_bytes;
  auto* const r = static_cast<unsigned char*>(detail::allocate_block(larger, true));
  nonzero = 0;
  for (std::size_t i = 0; i < larger; ++i) nonzero += r[i] != 0;
  EXPECT_EQ(nonzero, 0u);
  std::memset(r, 0xEF, larger);
  detail::free_block(r, larger);
  // More blocks freed than are kept: each freed and made again whole.
  std::vector<unsigned char*> many;
  for (int i = 0; i < 12; ++i) {
    many.push_back(static_cast<unsigned char*>(detail::allocate_block(bytes, true)));
    many.back()[bytes - 1] = 1;
  }
  for (auto* m : many) detail::free_block(m, bytes);
  // Owned tensors of that size, made and dropped again and again, start at zero every time.
  for (int round = 0; round < 3; ++round) {
    owned_tensor<float> t({static_cast<std::int64_t>(bytes / sizeof(float))}, "t");
    for (std::int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(t.data()[i], 0.0f) << round << ", " << i;
    std::fill(t.begin(), t.end(), 7.0f);
  }
}

TYPED_TEST(Tensor, OwnedTensorRankErrors) {
  using T = TypeParam;
  EXPECT_THROW((owned_tensor<T>({1, 2, 3, 4, 5})), std::invalid_argument);
  EXPECT_THROW((owned_tensor<T>(std::initializer_list<std::int64_t>{})), std::invalid_argument);
  owned_tensor<T> four({2, 3, 1, 5});
  EXPECT_EQ(four.rank(), 4);
  EXPECT_EQ(four.numel(), 30);
  EXPECT_EQ(four.view().stride(0), 15);
}

TYPED_TEST(Tensor, OwnedTensorCopyAndMove) {
  using T = TypeParam;
  owned_tensor<T> x({37, 70}, "x");
  tg_mem::fill_values(x);
  owned_tensor<T> y = x; // deep copy
  EXPECT_NE(y.data(), x.data());
  expect_aligned(y.data());
  EXPECT_EQ(y.numel(), x.numel());
  EXPECT_EQ(y.size(0), 37);
  EXPECT_EQ(y.size(1), 70);
  EXPECT_EQ(std::string(y.name()), "x");
  for (std::int64_t i = 0; i < x.numel(); ++i)
    ASSERT_EQ(y.data()[i], x.data()[i]) << at(i);
  y(0, 0) = T(1);
  x(0, 1) = T(2);
  EXPECT_EQ(x(0, 0), value_at<T>(0)) << "the copy shares no storage";
  EXPECT_EQ(y(0, 1), value_at<T>(1)) << "the copy shares no storage";
  EXPECT_EQ(y.view().data(), y.data()) << "the copy's view points at its own storage";

  owned_tensor<T> z({3});
  z = x; // copy assignment replaces shape and contents
  EXPECT_EQ(z.rank(), 2);
  EXPECT_EQ(z.numel(), 37 * 70);
  EXPECT_NE(z.data(), x.data());
  EXPECT_EQ(z.view().data(), z.data());
  for (std::int64_t i = 0; i < x.numel(); ++i)
    ASSERT_EQ(z.data()[i], x.data()[i]) << at(i);
  auto const* before = z.data();
  z = static_cast<owned_tensor<T> const&>(z); // self-assignment keeps everything
  EXPECT_EQ(z.data(), before);
  EXPECT_EQ(z(0, 1), T(2));

  T* storage = x.data();
  owned_tensor<T> m = std::move(x); // a move takes the storage over
  EXPECT_EQ(m.data(), storage);
  EXPECT_EQ(m.view().data(), storage);
  EXPECT_EQ(m(0, 1), T(2));
}

} // namespace

// Views whose rows overlap (sliding windows, as torch's unfold and as_strided make them): an
// offset can be reached by several coordinates, and unravelling it greedily (the largest
// coordinate the largest stride allows) put some past the shape: a checked launch storing row 4
// of a (5, 16) view with strides (8, 1) threw "element (5, 0) is outside it".
TEST(Tensor, ViewsWhoseRowsOverlapContainEveryOffsetTheyAddress) {
  std::vector<float> buf(200);
  check_contains(tensor<float>(buf.data(), {5, 16}, {8, 1}, "windows"), -3, 60);
  check_contains(tensor<float>(buf.data(), {25, 16}, {1, 1}, "unfold"), -3, 60);
  check_contains(tensor<float>(buf.data(), {3, 4, 5}, {7, 3, 2}, "odd"), -3, 50);
  check_contains(tensor<float>(buf.data(), {4, 6}, {3, 2}, "gaps"), -3, 30);
  check_contains(tensor<float>(buf.data(), {2, 3, 4, 5}, {13, 7, 5, 3}, "four"), -3, 80);
  // In a checked launch: every window summed, and row 4 of the first view stored.
  std::vector<float> x(40);
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = float(i % 7) - 3;
  tensor<float const> const win(x.data(), {25, 16}, {1, 1}, "windows");
  tg::owned_tensor<float> y({25}, "y");
  auto const sums = [](tg::program const& p, tensor<float const> w, tensor<float> y) {
    auto const r = p.program_id(0);
    tg::store(y + r, tg::sum<0>(tg::load(w + r * w.stride(0) + tg::arange<0, 16>())));
  };
  tg::launch({.check_races = true}, 25, sums, win, y.view());
  for (int r = 0; r < 25; ++r) {
    float s = 0;
    for (int c = 0; c < 16; ++c)
      s += x[static_cast<std::size_t>(r + c)];
    EXPECT_FLOAT_EQ(y(r), s) << r;
  }
  EXPECT_THROW(tg::launch({.check_races = true}, 26, sums, win, y.view()), tg::access_error);
  tensor<float> const rows(buf.data(), {5, 16}, {8, 1}, "rows");
  auto const row4 = [](tg::program const& p, tensor<float> t) {
    if (p.program_id(0) == 4)
      tg::store(t + 4 * t.stride(0) + tg::arange<0, 16>(), tg::full<float, 16>(1.0f));
  };
  EXPECT_NO_THROW(tg::launch({.check_races = true}, 5, row4, rows));
}

// A view of a null pointer with elements faulted at its first access, checked launch or not
// (bounds checks look at offsets); the view refuses it, naming itself. Messages of views name the
// tensor, and an axis out of range inside a program names the program.
TEST(Tensor, BadViewsAreRefusedByName) {
  auto const what = [](auto&& f) {
    try {
      f();
    } catch (std::exception const& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(what([] { tensor<float const>(nullptr, {32}, "x"); }),
            "tilegrad::tensor 'x': null data for shape (32)");
  EXPECT_EQ(what([] { tensor<float const>(nullptr, {4, 0}, "empty"); }), "no error");
  EXPECT_EQ(what([] {
              tensor<float>(nullptr, 1, {3, 1, 1, 1}, {1, 1, 1, 1}, "y");
            }),
            "tilegrad::tensor 'y': null data for shape (3)");
  float buf[8] = {};
  EXPECT_EQ(what([&] {
              tensor<float>(buf, {2, -4}, "w");
            }),
            "tilegrad::tensor 'w': negative extent -4 on axis 1");
  EXPECT_EQ(what([&] {
              tensor<float>(buf, {1, 1, 1, 1, 1}, "r5");
            }),
            "tilegrad::tensor 'r5': rank must be 1 to 4 (5 extents given)");
  EXPECT_EQ(what([] {
              tg::owned_tensor<float>({2, 2, 2, 2, 2}, "big");
            }),
            "tilegrad::tensor 'big': rank must be 1 to 4 (5 extents given)");
  EXPECT_EQ(what([&] { (void)tensor<float>(buf, {8}, "x").size(2); }),
            "tilegrad::tensor 'x': axis 2 out of range for rank 1");
  tensor<float const> const x(buf, {8}, "x");
  std::string inside = what([&] {
    tg::launch(
        {.exec = tg::executor::sequential}, 2,
        [](tg::program const&, tensor<float const> t) { (void)t.size(2); }, x);
  });
  EXPECT_EQ(inside, "tilegrad::tensor 'x': axis 2 out of range for rank 1 (in program (0, 0, 0))");
  // A null name reads as no name.
  EXPECT_STREQ(tensor<float>(buf, {8}, nullptr).name(), "");
}

TEST(Tensor, RowMajorOffsetWalksAnyStridesInRowMajorOrder) {
  // A transposed 3 x 5 view of a 5 x 3 buffer: element i of the view, row-major, is at
  // (i / 5, i % 5), stored at (i % 5) * 3 + i / 5.
  std::vector<float> buf(15);
  tensor<float> t(buf.data(), {3, 5}, {1, 3});
  for (std::int64_t i = 0; i < 15; ++i)
    EXPECT_EQ(t.row_major_offset(i), (i % 5) * 3 + i / 5) << i;
  tensor<float> c(buf.data(), {3, 5});
  for (std::int64_t i = 0; i < 15; ++i)
    EXPECT_EQ(c.row_major_offset(i), i);
  // Contiguous in row-major order (the offset is the index) whatever the stride of an axis of
  // extent 1; two columns of every row are not (a gap of 3 after each row).
  tensor<float> one(buf.data(), {3, 1, 5}, {5, 7, 1});
  tensor<float> cols(buf.data(), {3, 2}, {5, 1});
  for (std::int64_t i = 0; i < 15; ++i)
    EXPECT_EQ(one.row_major_offset(i), i);
  for (std::int64_t i = 0; i < 6; ++i)
    EXPECT_EQ(cols.row_major_offset(i), (i / 2) * 5 + i % 2) << i;
  // A row of a contiguous 3-D tensor, and a row of the transposed view (strided).
  tensor<float> cube(buf.data(), {3, 1, 5});
  for (std::int64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(cube[2].row_major_offset(i), i);
    EXPECT_EQ(t[1].row_major_offset(i), i * 3);
  }
}

TEST(Tensor, SameShapeComparesRankAndExtentsOnly) {
  std::vector<double> d(30);
  std::vector<std::int32_t> n(30);
  tensor<double> a(d.data(), {3, 5});
  EXPECT_TRUE(a.same_shape(tensor<std::int32_t>(n.data(), {3, 5}, {1, 3})));
  EXPECT_FALSE(a.same_shape(tensor<std::int32_t>(n.data(), {5, 3})));
  EXPECT_FALSE(a.same_shape(tensor<std::int32_t>(n.data(), {15})));
  EXPECT_FALSE(a.same_shape(tensor<std::int32_t>(n.data(), {3, 5, 1})));
}

TEST(Tensor, IndexingTheFirstAxisGivesTheSubViewOneRankLower) {
  // t[b][h] of a (2, 3, 4, 5) tensor is the (4, 5) matrix at (b, h, 0, 0), strides kept.
  std::vector<float> buf(120);
  for (std::size_t i = 0; i < buf.size(); ++i)
    buf[i] = static_cast<float>(i);
  tensor<float> t(buf.data(), {2, 3, 4, 5}, "t");
  auto const m = t[1][2];
  ASSERT_EQ(m.rank(), 2);
  EXPECT_EQ(m.size(0), 4);
  EXPECT_EQ(m.size(1), 5);
  EXPECT_EQ(m.stride(0), 5);
  EXPECT_EQ(m.stride(1), 1);
  EXPECT_STREQ(m.name(), "t");
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 5; ++j)
      EXPECT_EQ(m(i, j), t(1, 2, i, j));
  // A strided view keeps its strides: the columns of a transposed 3 x 5 view.
  tensor<float> tr(buf.data(), {3, 5}, {1, 3});
  EXPECT_EQ(tr[2](4), tr(2, 4));
  EXPECT_THROW((void)t[2], std::out_of_range);
  EXPECT_THROW((void)t[-1], std::out_of_range);
  EXPECT_THROW((void)t[0][0][0][0], std::invalid_argument); // rank 1 has no sub-view
  // Inside a program an index out of range is an access_error naming the program, the tensor,
  // the index and the line.
  tg_mem::as_program(2, 4, [&](tilegrad::program const&) {
    int const line = __LINE__ + 2;
    try {
      (void)t[7];
      ADD_FAILURE() << "t[7] did not throw";
    } catch (tilegrad::access_error const& e) {
      std::string const what = e.what();
      EXPECT_NE(what.find("index 7 out of range for axis 0 of size 2"), std::string::npos) << what;
      EXPECT_NE(what.find("by program (2, 0, 0)"), std::string::npos) << what;
      EXPECT_NE(what.find("test_tensor.cpp:" + std::to_string(line)), std::string::npos) << what;
      EXPECT_EQ(e.program(), "program (2, 0, 0)");
      EXPECT_EQ(e.element(), "(7)");
    }
  });
}

TEST(Tensor, ExpectShapeNamesTheTensorBothShapesAndTheLine) {
  owned_tensor<float> w({20, 37}, "w");
  expect_shape(w, {20, 37});
  expect_shape(w.cview(), {20, 37});
  int const line = __LINE__ + 2;
  try {
    expect_shape(w.view(), {37, 20}); // a weight passed transposed
    ADD_FAILURE() << "no throw";
  } catch (std::invalid_argument const& e) {
    std::string const what = e.what();
    EXPECT_EQ(what.rfind("tilegrad::expect_shape: 'w' has shape (20, 37), expected (37, 20) (", 0),
              0u)
        << what;
    EXPECT_NE(what.find("test_tensor.cpp:" + std::to_string(line) + ")"), std::string::npos)
        << what;
  }
  EXPECT_THROW(expect_shape(w, {20, 37, 1}), std::invalid_argument);
}

} // namespace test_tensor
