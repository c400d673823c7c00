// The edge sizes of tiled kernels (tg::edge_sizes, tg::edge_pairs): their contracts for every
// tile from 1 to 200 and several limits, the lists for common tiles, and that tiled loops with
// the classic bugs (a tail tile skipped, an off-by-one mask, a loop bound taken from the other
// side) fail at some edge size while passing at round sizes.
#include <tilegrad/check/shapes.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <vector>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_shapes {

namespace tg = tilegrad;

namespace {

using sizes = std::vector<std::int64_t>;

bool contains(sizes const& v, std::int64_t s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

bool contains(std::vector<tg::size_pair> const& v, tg::size_pair p) {
  return std::find(v.begin(), v.end(), p) != v.end();
}

std::int64_t const limits[] = {1, 2, 3, 5, 64, 100, 160, 4096, tg::no_size_limit};

} // namespace

TEST(EdgeSizes, CommonTiles) {
  EXPECT_EQ(tg::edge_sizes(64), (sizes{1, 2, 63, 64, 65, 160}));
  EXPECT_EQ(tg::edge_sizes(16), (sizes{1, 2, 15, 16, 17, 40}));
  EXPECT_EQ(tg::edge_sizes(2), (sizes{1, 2, 3, 5}));
  EXPECT_EQ(tg::edge_sizes(1), (sizes{1, 2, 3}));
  // Clipped: sizes past the limit become the limit.
  EXPECT_EQ(tg::edge_sizes(64, 160), (sizes{1, 2, 63, 64, 65, 160}));
  EXPECT_EQ(tg::edge_sizes(64, 100), (sizes{1, 2, 63, 64, 65, 100}));
  EXPECT_EQ(tg::edge_sizes(64, 64), (sizes{1, 2, 63, 64}));
  EXPECT_EQ(tg::edge_sizes(64, 1), (sizes{1}));
  // Two tiles over one axis (FlashAttention at d = 128: 32 query rows, 64 key rows).
  EXPECT_EQ(tg::edge_sizes({32, 64}), (sizes{1, 2, 31, 32, 33, 63, 64, 65, 80, 160}));
}

TEST(EdgeSizes, ContractsHoldForEveryTileAndLimit) {
  for (std::int64_t tile = 1; tile <= 200; ++tile)
    for (std::int64_t max : limits) {
      auto const v = tg::edge_sizes(tile, max);
      ASSERT_FALSE(v.empty());
      EXPECT_TRUE(std::is_sorted(v.begin(), v.end()) &&
                  std::adjacent_find(v.begin(), v.end()) == v.end())
          << tile << " " << max;
      EXPECT_EQ(v.front(), 1);
      EXPECT_EQ(v.back(), std::min(max, 2 * tile + (tile + 1) / 2)) << tile << " " << max;
      for (std::int64_t s : {std::int64_t{1}, std::int64_t{2}, tile - 1, tile, tile + 1})
        if (s >= 1) {
          EXPECT_TRUE(contains(v, std::min(s, max))) << tile << " " << max << " " << s;
        }
      // Several tiles and a remainder: more than two tiles, not a multiple of the tile.
      if (max >= 2 * tile + (tile + 1) / 2 && tile >= 2) {
        EXPECT_GT(v.back(), 2 * tile);
        EXPECT_NE(v.back() % tile, 0);
        if (tile >= 4) { // and the remainder is no other edge's
          EXPECT_NE(v.back() % tile, 1);
          EXPECT_NE(v.back() % tile, tile - 1);
        }
      }
      // The union over two tiles holds exactly both lists.
      auto const u = tg::edge_sizes({tile, 64}, max);
      auto both = tg::edge_sizes(64, max);
      both.insert(both.end(), v.begin(), v.end());
      std::sort(both.begin(), both.end());
      both.erase(std::unique(both.begin(), both.end()), both.end());
      EXPECT_EQ(u, both) << tile << " " << max;
    }
}

TEST(EdgeSizes, MisuseThrows) {
  EXPECT_THROW(tg::edge_sizes(0), std::invalid_argument);
  EXPECT_THROW(tg::edge_sizes(-4), std::invalid_argument);
  EXPECT_THROW(tg::edge_sizes(64, 0), std::invalid_argument);
  EXPECT_THROW(tg::edge_sizes({}), std::invalid_argument);
  EXPECT_THROW(tg::edge_pairs(64, 0), std::invalid_argument);
}

TEST(EdgePairs, CommonTiles) {
  using p = tg::size_pair;
  EXPECT_EQ(tg::edge_pairs(64, 64, 160), (std::vector<p>{{1, 1},
                                                         {1, 160},
                                                         {2, 2},
                                                         {2, 65},
                                                         {63, 63},
                                                         {63, 64},
                                                         {64, 63},
                                                         {64, 64},
                                                         {65, 2},
                                                         {65, 65},
                                                         {160, 1},
                                                         {160, 160}}));
  // Tiles of different sizes: every size of both lists on the diagonal, crossed pairs after.
  auto const v = tg::edge_pairs(32, 64);
  for (std::int64_t s : tg::edge_sizes({32, 64}))
    EXPECT_TRUE(contains(v, {s, s})) << s;
  EXPECT_TRUE(contains(v, {1, 160}));
  EXPECT_TRUE(contains(v, {80, 1}));
  EXPECT_EQ(tg::edge_pairs(4, 4, 1), (std::vector<p>{{1, 1}}));
}

TEST(EdgePairs, ContractsHoldForEveryTileAndLimit) {
  for (std::int64_t tn = 1; tn <= 70; ++tn)
    for (std::int64_t tk : {1, 2, 3, 16, 32, 64, 65})
      for (std::int64_t max : limits) {
        auto const v = tg::edge_pairs(tn, tk, max);
        EXPECT_TRUE(std::is_sorted(v.begin(), v.end()) &&
                    std::adjacent_find(v.begin(), v.end()) == v.end())
            << tn << " " << tk << " " << max;
        for (auto [n, nk] : v) {
          EXPECT_TRUE(n >= 1 && n <= max && nk >= 1 && nk <= max);
        }
        for (std::int64_t s : tg::edge_sizes({tn, tk}, max))
          EXPECT_TRUE(contains(v, {s, s})) << tn << " " << tk << " " << max << " " << s;
        if (max < 2)
          continue;
        for (std::int64_t s : tg::edge_sizes(tn, max))
          EXPECT_TRUE(
              std::any_of(v.begin(), v.end(), [&](auto q) { return q.n == s && q.nk != s; }))
              << tn << " " << tk << " " << max << " n " << s;
        for (std::int64_t s : tg::edge_sizes(tk, max))
          EXPECT_TRUE(
              std::any_of(v.begin(), v.end(), [&](auto q) { return q.nk == s && q.n != s; }))
              << tn << " " << tk << " " << max << " nk " << s;
        EXPECT_LE(v.size(), 30u);
      }
}

// A tiled sum over n elements in tiles of Tile, as a kernel's loop writes it, with one bug each.
enum class bug { none, tail_tile_skipped, mask_one_short, mask_one_long_in_last_tile };

template <int Tile>
double tiled_sum(std::vector<double> const& x, bug b) {
  auto const n = static_cast<std::int64_t>(x.size());
  std::int64_t const tiles = b == bug::tail_tile_skipped ? n / Tile : (n + Tile - 1) / Tile;
  double s = 0;
  for (std::int64_t t = 0; t < tiles; ++t)
    for (std::int64_t i = t * Tile; i < (t + 1) * Tile; ++i) {
      bool const in = b == bug::mask_one_short ? i < n - 1 : i < n;
      // Reads one past the end when n is one more than a whole number of tiles (0 there).
      bool const in_long = b == bug::mask_one_long_in_last_tile && n % Tile == 1 && i == n;
      if (in)
        s += x[static_cast<std::size_t>(i)];
      else if (in_long)
        s += 1; // the padding value read as data
    }
  return s;
}

template <int Tile>
bool finds(bug b, sizes const& ns) {
  for (std::int64_t n : ns) {
    std::vector<double> x(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < x.size(); ++i)
      x[i] = 1 + double(i % 7);
    double want = 0;
    for (double e : x)
      want += e;
    if (tiled_sum<Tile>(x, b) != want)
      return true;
  }
  return false;
}

TEST(EdgeSizes, FindTheBugsRoundSizesMiss) {
  constexpr int Tile = 64;
  sizes const round = {64, 128, 256, 1024};
  sizes const edges = tg::edge_sizes(Tile);
  EXPECT_FALSE(finds<Tile>(bug::none, edges));
  for (bug b : {bug::tail_tile_skipped, bug::mask_one_long_in_last_tile}) {
    EXPECT_FALSE(finds<Tile>(b, round)) << int(b);
    EXPECT_TRUE(finds<Tile>(b, edges)) << int(b);
  }
  EXPECT_TRUE(finds<Tile>(bug::mask_one_short, edges));
}

// out[i] = sum of the keys for each of n queries, nk keys; the bugs take one loop's bound from
// the other side: keys walked up to N (keys past N dropped, seen only when Nk > N), queries
// walked up to Nk (queries past Nk left out, seen only when N > Nk).
enum class side_bug { none, keys_to_n, queries_to_nk };

bool pair_finds(side_bug b, std::vector<tg::size_pair> const& pairs) {
  for (auto [n, nk] : pairs) {
    std::int64_t const keys = b == side_bug::keys_to_n ? std::min(n, nk) : nk;
    std::int64_t const queries = b == side_bug::queries_to_nk ? std::min(n, nk) : n;
    std::vector<std::int64_t> out(static_cast<std::size_t>(n), 0);
    for (std::int64_t i = 0; i < queries; ++i)
      for (std::int64_t j = 0; j < keys; ++j)
        out[static_cast<std::size_t>(i)] += j + 1;
    for (std::int64_t o : out)
      if (o != nk * (nk + 1) / 2)
        return true;
  }
  return false;
}

TEST(EdgePairs, FindLoopBoundsTakenFromTheOtherSide) {
  auto const pairs = tg::edge_pairs(64, 64, 160);
  std::vector<tg::size_pair> square;
  for (std::int64_t s : tg::edge_sizes(64, 160))
    square.push_back({s, s});
  EXPECT_FALSE(pair_finds(side_bug::none, pairs));
  for (side_bug b : {side_bug::keys_to_n, side_bug::queries_to_nk}) {
    EXPECT_FALSE(pair_finds(b, square)) << int(b);
    EXPECT_TRUE(pair_finds(b, pairs)) << int(b);
  }
}

} // namespace test_shapes
