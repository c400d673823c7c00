// Sizes that find bugs in a tiled kernel: along an axis cut into tiles, 1, 2, one tile and its
// neighbours, and several tiles with a remainder; for attention-like problems with two lengths,
// pairs (N, Nk) that also differ. Off-by-one masks, skipped tail tiles and loop bounds taken from
// the wrong side show at these sizes and rarely at round ones.
#pragma once

#include "tilegrad/core/config.hpp"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace tilegrad {

/// The largest size the edge-size helpers return when no max_size is given.
inline constexpr std::int64_t no_size_limit = std::numeric_limits<std::int64_t>::max() / 4;

namespace detail {

inline void expect_edge_args(std::int64_t tile, std::int64_t max_size) {
  if (tile < 1 || max_size < 1)
    throw std::invalid_argument("tilegrad::edge_sizes: tile " + std::to_string(tile) +
                                " and max_size " + std::to_string(max_size) +
                                " must both be at least 1");
}

inline void sort_unique(std::vector<std::int64_t>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

} // namespace detail

/// The sizes an axis cut into tiles of `tile` should be checked at: 1, 2, tile - 1, tile,
/// tile + 1 and 2 * tile + (tile + 1) / 2 (two full tiles and a partial one, the remainder
/// neither 1 nor tile - 1 for tile >= 4). A size above max_size becomes max_size.
/// @pre tile >= 1, max_size >= 1 (std::invalid_argument otherwise)
/// @post result is strictly increasing, result.front() == 1,
///       result.back() == min(max_size, 2 * tile + (tile + 1) / 2)
/// @post for s in {1, 2, tile - 1, tile, tile + 1}: s >= 1 implies min(s, max_size) is in result
TILEGRAD_MACHINERY std::vector<std::int64_t> edge_sizes(std::int64_t tile,
                                                        std::int64_t max_size = no_size_limit)
#if TILEGRAD_MACHINERY_BODIES
{
  detail::expect_edge_args(tile, max_size);
  std::vector<std::int64_t> out;
  for (std::int64_t s :
       {std::int64_t{1}, std::int64_t{2}, tile - 1, tile, tile + 1, 2 * tile + (tile + 1) / 2})
    if (s >= 1)
      out.push_back(std::min(s, max_size));
  detail::sort_unique(out);
  return out;
}
#else
;
#endif

/// The union of edge_sizes(t, max_size) over the tiles of a kernel that cuts one axis two ways
/// (FlashAttention's 32-row query tiles and 64-row key tiles over one sequence).
/// @pre tiles is not empty, every tile >= 1, max_size >= 1
/// @post result is strictly increasing and holds exactly the sizes of every edge_sizes(t, max_size)
TILEGRAD_MACHINERY std::vector<std::int64_t> edge_sizes(std::initializer_list<std::int64_t> tiles,
                                                        std::int64_t max_size = no_size_limit)
#if TILEGRAD_MACHINERY_BODIES
{
  if (tiles.size() == 0)
    throw std::invalid_argument("tilegrad::edge_sizes: no tile size given");
  std::vector<std::int64_t> out;
  for (std::int64_t t : tiles) {
    auto const s = edge_sizes(t, max_size);
    out.insert(out.end(), s.begin(), s.end());
  }
  detail::sort_unique(out);
  return out;
}
#else
;
#endif

/// Two lengths of one problem, as attention's query rows N and key rows Nk.
struct size_pair {
  std::int64_t n, nk;
  friend bool operator==(size_pair const&, size_pair const&) = default;
  friend auto operator<=>(size_pair const&, size_pair const&) = default;
};

/// The (N, Nk) pairs a kernel with tiles of tile_n rows along N and tile_nk along Nk should be
/// checked at. Equal lengths: (s, s) for every s of edge_sizes({tile_n, tile_nk}) (the square
/// case, where a causal mask's diagonal ends with the last tile). Different lengths: the
/// i-th smallest of edge_sizes(tile_n) with the i-th largest of edge_sizes(tile_nk) (1 query
/// against several key tiles, tile_n + 1 against 2, ...); a middle pair that would be equal is
/// replaced by its sizes each met with a neighbour of the other list. About a dozen pairs, every
/// edge of each side met by a different length on the other.
/// @pre tile_n >= 1, tile_nk >= 1, max_size >= 1
/// @post result is strictly increasing (by n, then nk), every n and nk in [1, max_size]
/// @post (s, s) is in result for every s in edge_sizes({tile_n, tile_nk}, max_size)
/// @post when max_size >= 2, every s of edge_sizes(tile_n, max_size) is the n of a pair with
///       nk != n, and every s of edge_sizes(tile_nk, max_size) the nk of a pair with n != nk
TILEGRAD_MACHINERY std::vector<size_pair> edge_pairs(std::int64_t tile_n, std::int64_t tile_nk,
                                                     std::int64_t max_size = no_size_limit)
#if TILEGRAD_MACHINERY_BODIES
{
  std::vector<size_pair> out;
  for (std::int64_t s : edge_sizes({tile_n, tile_nk}, max_size))
    out.push_back({s, s});
  auto const a = edge_sizes(tile_n, max_size), b = edge_sizes(tile_nk, max_size);
  auto const na = static_cast<std::ptrdiff_t>(a.size()), nb = static_cast<std::ptrdiff_t>(b.size());
  // Walk both lists in opposite directions; the longer list's extra sizes meet the other's end.
  auto const next = [](std::ptrdiff_t i, std::ptrdiff_t size) {
    return i + 1 < size ? i + 1 : i - 1;
  };
  for (std::ptrdiff_t i = 0; i < std::max(na, nb); ++i) {
    std::ptrdiff_t const ia = std::min(i, na - 1), ib = std::max<std::ptrdiff_t>(nb - 1 - i, 0);
    std::int64_t const n = a[static_cast<std::size_t>(ia)], nk = b[static_cast<std::size_t>(ib)];
    if (n != nk) {
      out.push_back({n, nk});
    } else if (na > 1 && nb > 1) { // the middle of the walk: each meets a neighbour of the other
      out.push_back({n, b[static_cast<std::size_t>(next(ib, nb))]});
      out.push_back({a[static_cast<std::size_t>(next(ia, na))], nk});
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}
#else
;
#endif

} // namespace tilegrad
