// splitmix64: the hash that seeds every random choice the library makes (rounding jitter, the
// checker's ulp moves of bf16 sums), so that each is a pure function of its seed.
#pragma once

#include <cstdint>

namespace tilegrad::detail {

/// A well-mixed 64-bit hash of x (splitmix64's finaliser).
inline std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// The next number of the splitmix64 stream whose state is `state`.
inline std::uint64_t splitmix_next(std::uint64_t& state) {
  return mix64(state += 0x9e3779b97f4a7c15ull);
}

} // namespace tilegrad::detail
