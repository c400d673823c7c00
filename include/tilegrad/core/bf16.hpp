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
  constexpr explicit bf16(double x) : bf16(static_cast<float>(x)) {}
  constexpr explicit bf16(int x) : bf16(static_cast<float>(x)) {}
  constexpr explicit bf16(long x) : bf16(static_cast<float>(x)) {}
  constexpr explicit bf16(long long x) : bf16(static_cast<float>(x)) {}

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

  friend constexpr bool operator==(bf16 a, bf16 b) {
    return static_cast<float>(a) == static_cast<float>(b);
  }
};

} // namespace tilegrad
