// Cache hints of loads and stores (Triton's cache_modifier and eviction_policy). On the CPU one
// of them changes what a store does: a block stored with cache_modifier::cs ("cache streaming")
// or eviction_policy::evict_first is written with non-temporal stores where it can be.
#pragma once

#include <cstdint>

namespace tilegrad {

/// Triton's cache_modifier: ".ca", ".cg", ".cv" for loads; ".wb", ".cg", ".cs", ".wt" for stores.
enum class cache_modifier { none, ca, cg, cv, wb, cs, wt };

/// Triton's eviction_policy: "evict_first" (the data is not read again soon), "evict_last".
enum class eviction_policy { none, evict_first, evict_last };

/// The hints of one load or store: `store(bp, y, bounds<1>, cache_modifier::cs)`,
/// `store(bp, y, bounds<1>, eviction_policy::evict_first)`, or both as `{cm, ep}`.
struct cache_hints {
  cache_modifier cache = cache_modifier::none;
  eviction_policy eviction = eviction_policy::none;

  constexpr cache_hints() = default;
  constexpr cache_hints(cache_modifier c) : cache(c) {}      // NOLINT: implicit by design
  constexpr cache_hints(eviction_policy e) : eviction(e) {}  // NOLINT: implicit by design
  constexpr cache_hints(cache_modifier c, eviction_policy e) : cache(c), eviction(e) {}

  /// Whether a store should bypass the caches: the block is written once and not read soon.
  /// (A non-temporal store skips the read for ownership of each line and leaves the caches to
  /// data in use; stored data that is read again soon then comes from memory instead.)
  constexpr bool streaming() const {
    return cache == cache_modifier::cs || eviction == eviction_policy::evict_first;
  }
};

/// Outputs from this size on are streamed by the library's kernels (output_hint).
inline constexpr std::int64_t large_output_bytes = std::int64_t{32} << 20;

/// The hint for an output of `bytes` that a launch writes once and does not read: evict_first
/// from large_output_bytes on, none below. Streaming a small output sends to memory what the
/// caches would have kept for its reader (on the 16-core Xeon a layer norm of 32 rows of 1024
/// floats took 1.5x as long streamed, one of 4096 rows of 1024, 16 MiB, up to 20 % longer);
/// 4096 rows of 4096, 64 MiB, took 20-30 % less at one thread (docs/performance.md).
constexpr cache_hints output_hint(std::int64_t bytes) {
  return bytes >= large_output_bytes ? cache_hints(eviction_policy::evict_first) : cache_hints();
}

} // namespace tilegrad
