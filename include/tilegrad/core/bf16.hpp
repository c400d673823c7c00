// bfloat16 as a storage type: 16 bits, converts to and from float (round to nearest even).
// Arithmetic happens in float: load or cast bf16 data to float, compute, cast back to store.
#pragma once

#include <bit>
#include <cstdint>

namespace tilegrad {

struct bf16 {
  std::uint16_t bits = 0;

  constexpr bf16() = default;
  constexpr explicit bf16(float x) : bits(from_float(x)) {}
  // Wider types go through a float rounded to odd, never the nearest float: that one can land
  // on a bf16 midpoint and round a second time (1 + 2^-8 + 2^-40 would become 1, not 1 + 2^-7).
  constexpr explicit bf16(double x) : bits(from_float(round_to_odd_float(x))) {}
  constexpr explicit bf16(int x) : bf16(static_cast<long long>(x)) {}
  constexpr explicit bf16(long x) : bf16(static_cast<long long>(x)) {}
  constexpr explicit bf16(long long x) : bits(from_float(round_to_odd_float(x))) {}

  constexpr explicit operator float() const {
    return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
  }
  constexpr explicit operator double() const { return static_cast<float>(*this); }
  constexpr explicit operator int() const { return static_cast<int>(static_cast<float>(*this)); }
  constexpr explicit operator long() const { return static_cast<long>(static_cast<float>(*this)); }
  constexpr explicit operator long long() const {
    return static_cast<long long>(static_cast<float>(*this));
  }

  static constexpr bf16 from_bits(std::uint16_t b) {
    bf16 r;
    r.bits = b;
    return r;
  }

  /// Round to nearest, ties to even; NaN stays a (quiet) NaN, infinities stay infinite.
  static constexpr std::uint16_t from_float(float x) {
    std::uint32_t u = std::bit_cast<std::uint32_t>(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
    std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return static_cast<std::uint16_t>((u + rounding) >> 16);
  }

  /// x rounded toward zero to a float whose last bit is set when inexact ("round to odd"). A
  /// float has 16 more significand bits than a bf16, so rounding this float to nearest even
  /// gives the bf16 nearest to x itself.
  static constexpr float round_to_odd_float(double x) {
    float const f = static_cast<float>(x);
    if (static_cast<double>(f) == x || x != x) return f; // exact, or NaN
    std::uint32_t u = std::bit_cast<std::uint32_t>(f);
    bool const away = x > 0 ? static_cast<double>(f) > x : static_cast<double>(f) < x;
    if (away) --u; // one step toward zero (an overflow to inf steps back to the largest float)
    return std::bit_cast<float>(u | 1u);
  }
  static constexpr float round_to_odd_float(long long x) {
    unsigned long long const m =
        x < 0 ? 0ull - static_cast<unsigned long long>(x) : static_cast<unsigned long long>(x);
    int shift = 0;
    while ((m >> shift) >= (1ull << 24)) ++shift;
    if (shift == 0) return static_cast<float>(x); // exact
    bool const inexact = (m & ((1ull << shift) - 1)) != 0;
    float f = static_cast<float>((m >> shift) | (inexact ? 1ull : 0ull)); // < 2^24: exact
    for (int i = 0; i < shift; ++i) f *= 2;
    return x < 0 ? -f : f;
  }

  friend constexpr bool operator==(bf16 a, bf16 b) {
    return static_cast<float>(a) == static_cast<float>(b);
  }
};

} // namespace tilegrad
