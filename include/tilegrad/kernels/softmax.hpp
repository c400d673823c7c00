// Row softmax, the classic Triton tutorial kernel: one row per program, the whole row in one
// block of next_power_of_2(n_cols) lanes (a block pointer of the row, padded past its end); and
// its hand-written backward, one row per program as well. Both take float, double or bf16
// tensors: loads convert to fp32<T> (a no-op but for bf16), stores round back to the tensor's
// type.
#pragma once

#include "tilegrad/core/config.hpp"
#include "tilegrad/core/types.hpp"
#include "tilegrad/grid/program.hpp"
#include "tilegrad/memory/block_ptr.hpp"
#include "tilegrad/memory/hints.hpp"
#include "tilegrad/memory/tensor.hpp"
#include "tilegrad/tile/creation.hpp"
#include "tilegrad/tile/elementwise.hpp"
#include "tilegrad/tile/reduce.hpp"

#include <cstdint>
#include <stdexcept>
#include <string>

namespace tilegrad::kernels {

namespace detail {
/// The error of check_softmax_rows, out of line: the check itself is three compares per program,
/// with no call and no stores (a row kernel is memory-bound, and on a Xeon core the stores a
/// program makes before its row's loads wait behind the previous row's: docs/performance.md).
[[noreturn]] TILEGRAD_NOINLINE inline void
softmax_rows_error(char const* who, int program, int block, char const* in_name,
                   std::int64_t in_rows, std::int64_t in_cols, char const* out_name,
                   std::int64_t out_rows, std::int64_t out_cols) {
  std::string const head =
      std::string("tilegrad::") + who + " (program " + std::to_string(program) + "): ";
  if (in_cols > block)
    throw std::invalid_argument(
        head + "'" + in_name + "' has rows of " + std::to_string(in_cols) +
        " columns, more than Block = " + std::to_string(block) +
        ": a program takes a whole row in one block; instantiate the kernel with Block = " +
        std::to_string(next_power_of_2(in_cols)) + " (next_power_of_2 of the row length)");
  throw std::invalid_argument(head + "'" + out_name + "' is (" + std::to_string(out_rows) + ", " +
                              std::to_string(out_cols) + ") where '" + in_name + "' is (" +
                              std::to_string(in_rows) + ", " + std::to_string(in_cols) + ")");
}

/// A program handles one whole row in one block: a row longer than Block would lose its columns
/// past Block with no error (Triton's tutorial kernel has the same precondition), and an output
/// of another shape would be written out of bounds.
template <int Block, class In, class Out>
TILEGRAD_INLINE void check_softmax_rows(char const* who, program const& p, In const& in,
                                        Out const& out) {
  if (in.size(1) > Block || out.size(0) != in.size(0) || out.size(1) != in.size(1)) [[unlikely]]
    softmax_rows_error(who, p.program_id(0), Block, in.name(), in.size(0), in.size(1), out.name(),
                       out.size(0), out.size(1));
}
} // namespace detail

/// y[i, :] = softmax(x[i, :]). Grid: one program per row; Block >= n_cols, a power of two.
template <int Block>
inline constexpr auto softmax_fwd = []<class T>(program const& p, tensor<T const> x,
                                                tensor<T> y) {
  static_assert(next_power_of_2(Block) == Block, "softmax_fwd: Block must be a power of two");
  detail::check_softmax_rows<Block>("softmax_fwd", p, x, y);
  int const row_idx = p.program_id(0);
  // The row as a block of the row's view: a block load copies the row (or reads it in place),
  // where pointer tiles test a mask lane by lane. Lanes past the row's end read -inf and vanish
  // in exp.
  tile<fp32<T>, Block> const row =
      to<fp32<T>>(load(make_block_ptr<Block>(x[row_idx], {0}), bounds<0>, padding::neg_inf));
  // Subtract the maximum for stability. The exponentials are kept (each is read twice: for the
  // sum and for the output); the output goes to memory without a tile of its own, scaled by the
  // sum's reciprocal (as PyTorch's CPU softmax does: a division per element costs the forward a
  // fifth of its time on AVX-512).
  tile<fp32<T>, Block> const num = exp(row - max(row));
  // (Written once, not read by this launch: a large y is streamed past the caches, as
  // layer_norm_fwd's.)
  store(make_block_ptr<Block>(y[row_idx], {0}), num * (1.0f / sum(num)), bounds<0>,
        output_hint(y.size(0) * y.size(1) * std::int64_t{sizeof(T)}));
};

/// Backward of softmax_fwd from its output y: dx[i, :] = y[i, :] * (dy[i, :] - s) with s the
/// row's dot product <dy[i, :], y[i, :]>. Grid: one program per row; Block >= n_cols, a power
/// of two.
template <int Block>
inline constexpr auto softmax_bwd = []<class T>(program const& p, tensor<T const> y,
                                                tensor<T const> dy, tensor<T> dx) {
  static_assert(next_power_of_2(Block) == Block, "softmax_bwd: Block must be a power of two");
  detail::check_softmax_rows<Block>("softmax_bwd", p, y, dy);
  detail::check_softmax_rows<Block>("softmax_bwd", p, y, dx);
  int const row_idx = p.program_id(0);
  // Rows as blocks of the rows' views; lanes past the row's end read 0 in both, so they add
  // nothing to the row's dot product.
  auto const yr = to<fp32<T>>(load(make_block_ptr<Block>(y[row_idx], {0}), bounds<0>));
  auto const gr = to<fp32<T>>(load(make_block_ptr<Block>(dy[row_idx], {0}), bounds<0>));
  store(make_block_ptr<Block>(dx[row_idx], {0}), yr * (gr - sum(gr * yr)), bounds<0>,
        output_hint(dx.size(0) * dx.size(1) * std::int64_t{sizeof(T)}));
};

} // namespace tilegrad::kernels
