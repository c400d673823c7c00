// Weighted sum y = x @ w over the last axis (the CS336 assignment 2 kernel): one program per
// tile of BR rows, walking the D axis in tiles of BD with block pointers.
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
inline constexpr auto weighted_sum_fwd = []<class T>(program const& p, tensor<T const> x,
                                                     tensor<T const> w, tensor<T> y) {
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

} // namespace tilegrad::kernels
