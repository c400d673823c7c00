// tilegrad::copy: a host-side copy between two tensors of one shape, converting the element type
// (an fp32 accumulator rounded into a bf16 gradient, as the bf16 FlashAttention backward does).
// Under check_backward the copy is traced with the backward's launches, so that the determinism
// check follows each copied element back to the atomic additions that made it.
#pragma once

#include "tilegrad/core/bf16.hpp"
#include "tilegrad/memory/tensor.hpp"
#include "tilegrad/memory/tracking.hpp"

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace tilegrad {

namespace detail {
/// The unit roundoff of an element type (0 for integers, whose copies are exact).
template <class T>
constexpr double unit_roundoff_of() {
  if constexpr (std::is_same_v<T, bf16>)
    return 0x1p-8;
  else if constexpr (std::is_floating_point_v<T>)
    return std::numeric_limits<T>::epsilon() / 2;
  else
    return 0;
}
} // namespace detail

/// dst[i] = Dst(src[i]) for every element, in row-major order of the (equal) shapes; rounds to
/// nearest even when Dst is narrower. Throws std::invalid_argument, naming both tensors, when
/// the shapes differ.
template <class Src, class Dst>
void copy(tensor<Src> src, tensor<Dst> dst) {
  static_assert(!std::is_const_v<Dst>, "tilegrad::copy(src, dst): dst must be writable");
  if (!src.same_shape(dst))
    throw std::invalid_argument("tilegrad::copy: the source '" + std::string(src.name()) +
                                "' has shape " + src.shape_string() + ", the destination '" +
                                std::string(dst.name()) + "' " + dst.shape_string());
  using S = std::remove_const_t<Src>;
  std::int64_t const n = src.numel();
  for (std::int64_t i = 0; i < n; ++i)
    dst.data()[dst.row_major_offset(i)] = static_cast<Dst>(src.data()[src.row_major_offset(i)]);
  if (auto* o = detail::current_observer())
    o->add_copy(dst, tensor<S const>(src), detail::unit_roundoff_of<S>());
}

} // namespace tilegrad
