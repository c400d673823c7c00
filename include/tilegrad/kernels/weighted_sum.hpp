// Weighted sum y = x @ w over the last axis (the CS336 assignment 2 kernel): one program per
// tile of BR rows, walking the D axis in tiles of BD with block pointers. Its hand-written
// backward writes dx and per-row-tile partial sums of dw, reduced by a second launch.
#pragma once

#include "tilegrad/core/types.hpp"
#include "tilegrad/grid/program.hpp"
#include "tilegrad/memory/block_ptr.hpp"
#include "tilegrad/memory/tensor.hpp"
#include "tilegrad/tile/creation.hpp"
#include "tilegrad/tile/elementwise.hpp"
#include "tilegrad/tile/reduce.hpp"
#include "tilegrad/tile/shape_ops.hpp"

namespace tilegrad::kernels {

/// y[i] = sum_j x[i, j] * w[j]. Grid: cdiv(rows, BR) programs.
template <int BR, int BD>
inline constexpr auto weighted_sum_fwd =
    []<class T>(program const& p, tensor<T const> x, tensor<T const> w, tensor<T> y) {
      // A weight or output of another length would be zero-padded or cut by the bounds,
      // silently. (Checked by every program: one alone let the others write past a smaller output
      // while it threw.)
      {
        expect_shape(w, {x.size(1)});
        expect_shape(y, {x.size(0)});
      }
      auto xb = make_block_ptr<BR, BD>(x, {p.program_id(0) * std::int64_t{BR}, 0});
      auto wb = make_block_ptr<BD>(w, {0});
      auto acc = zeros<fp32<T>, BR>();
      for (int i = 0; i < cdiv<std::int64_t>(x.size(1), BD); ++i) {
        // Rows past the end and columns past D read zeros.
        acc += sum<1>(load(xb, bounds<0, 1>) * row(load(wb, bounds<0>)));
        xb = xb.advance(0, BD);
        wb = wb.advance(BD);
      }
      store(make_block_ptr<BR>(y, {p.program_id(0) * std::int64_t{BR}}), acc, bounds<0>);
    };

/// Backward of weighted_sum_fwd: dx[i, :] = dy[i] * w, and for each tile t of BR rows the
/// partial sum partial_dw[t, :] = sum over its rows of dy[i] * x[i, :] (programs never add into
/// the same dw: the partial buffer is reduced afterwards by weighted_sum_reduce_dw or on the
/// host). Grid: cdiv(rows, BR) programs; partial_dw has shape (cdiv(rows, BR), D).
template <int BR, int BD>
inline constexpr auto weighted_sum_bwd = []<class T>(program const& p, tensor<T const> x,
                                                     tensor<T const> w, tensor<T const> dy,
                                                     tensor<T> dx, tensor<T> partial_dw) {
  // Operands of another shape would be zero-padded or cut by the bounds, silently. (Checked by
  // every program: one alone let the others write past a smaller output while it threw.)
  {
    expect_shape(w, {x.size(1)});
    expect_shape(dy, {x.size(0)});
    expect_shape(dx, {x.size(0), x.size(1)});
    expect_shape(partial_dw, {cdiv<std::int64_t>(x.size(0), BR), x.size(1)});
  }
  std::int64_t const r0 = p.program_id(0) * std::int64_t{BR};
  auto const g = load(make_block_ptr<BR>(dy, {r0}), bounds<0>); // zeros past the last row
  auto xb = make_block_ptr<BR, BD>(x, {r0, 0});
  auto wb = make_block_ptr<BD>(w, {0});
  auto dxb = make_block_ptr<BR, BD>(dx, {r0, 0});
  auto pb = make_block_ptr<1, BD>(partial_dw, {p.program_id(0), 0});
  for (int i = 0; i < cdiv<std::int64_t>(x.size(1), BD); ++i) {
    store(dxb, col(g) * row(load(wb, bounds<0>)), bounds<0, 1>);
    store(pb, sum<0>(load(xb, bounds<0, 1>) * col(g), keep_dims), bounds<1>);
    xb = xb.advance(0, BD);
    wb = wb.advance(BD);
    dxb = dxb.advance(0, BD);
    pb = pb.advance(0, BD);
  }
};

/// dw[j] = sum over t of partial_dw[t, j], BT rows at a time. Grid: cdiv(D, BD) programs.
template <int BT, int BD>
inline constexpr auto weighted_sum_reduce_dw =
    []<class T>(program const& p, tensor<T const> partial_dw, tensor<T> dw) {
      expect_shape(dw, {partial_dw.size(1)});
      std::int64_t const c0 = p.program_id(0) * std::int64_t{BD};
      auto pb = make_block_ptr<BT, BD>(partial_dw, {0, c0});
      auto acc = zeros<fp32<T>, BD>();
      for (int i = 0; i < cdiv<std::int64_t>(partial_dw.size(0), BT); ++i) {
        acc += sum<0>(load(pb, bounds<0, 1>));
        pb = pb.advance(BT, 0);
      }
      store(make_block_ptr<BD>(dw, {c0}), acc, bounds<0>);
    };

} // namespace tilegrad::kernels
