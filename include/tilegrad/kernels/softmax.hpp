// Row softmax, the classic Triton tutorial kernel: one row per program, the whole row in one
// block of next_power_of_2(n_cols) lanes, masked past the row's end; and its hand-written
// backward, one row per program as well. Both take float, double or bf16 tensors: loads convert
// to fp32<T> (a no-op but for bf16), stores round back to the tensor's type.
#pragma once

#include "tilegrad/core/types.hpp"
#include "tilegrad/grid/program.hpp"
#include "tilegrad/memory/pointer.hpp"
#include "tilegrad/memory/tensor.hpp"
#include "tilegrad/tile/creation.hpp"
#include "tilegrad/tile/elementwise.hpp"
#include "tilegrad/tile/reduce.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>

namespace tilegrad::kernels {

/// y[i, :] = softmax(x[i, :]). Grid: one program per row; Block >= n_cols, a power of two.
template <int Block>
inline constexpr auto softmax_fwd = []<class T>(program const& p, tensor<T const> x,
                                                tensor<T> y) {
  static_assert(next_power_of_2(Block) == Block, "softmax_fwd: Block must be a power of two");
  int const row_idx = p.program_id(0);
  auto const cols = arange<0, Block>();
  // An int32 bound (cols < Block anyway): the mask stays an int32 comparison.
  auto const mask = cols < static_cast<int>(std::min<std::int64_t>(x.size(1), Block));
  auto const row = to<fp32<T>>(load(x + row_idx * x.stride(0) + cols * x.stride(1), mask,
                                    -std::numeric_limits<float>::infinity()));
  // Subtract the maximum for stability; masked lanes are -inf and vanish in exp.
  // The exponentials are kept (each is read twice: for the sum and for the output); the output
  // goes to memory without a tile of its own.
  tile<fp32<T>, Block> const num = exp(row - max(row));
  store(y + row_idx * y.stride(0) + cols * y.stride(1), num / sum(num), mask);
};

/// Backward of softmax_fwd from its output y: dx[i, :] = y[i, :] * (dy[i, :] - s) with s the
/// row's dot product <dy[i, :], y[i, :]>. Grid: one program per row; Block >= n_cols, a power
/// of two.
template <int Block>
inline constexpr auto softmax_bwd = []<class T>(program const& p, tensor<T const> y,
                                                tensor<T const> dy, tensor<T> dx) {
  static_assert(next_power_of_2(Block) == Block, "softmax_bwd: Block must be a power of two");
  int const row_idx = p.program_id(0);
  auto const cols = arange<0, Block>();
  auto const mask = cols < static_cast<int>(std::min<std::int64_t>(y.size(1), Block));
  // Masked lanes read 0 in both, so they add nothing to the row's dot product.
  auto const yr = to<fp32<T>>(load(y + row_idx * y.stride(0) + cols * y.stride(1), mask, 0.0f));
  auto const gr = to<fp32<T>>(load(dy + row_idx * dy.stride(0) + cols * dy.stride(1), mask, 0.0f));
  tile<fp32<T>, Block> const out = yr * (gr - sum(gr * yr));
  store(dx + row_idx * dx.stride(0) + cols * dx.stride(1), out, mask);
};

} // namespace tilegrad::kernels
