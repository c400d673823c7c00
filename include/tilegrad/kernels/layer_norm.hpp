// Layer normalization, the Triton tutorial kernel (05): one program per row, the row walked in
// blocks of BlockN columns; the forward also stores each row's mean and reciprocal standard
// deviation for the backward. Its hand-written backward writes dx and, per group of Rows rows,
// partial sums of dw and db that a second launch reduces: no atomics, no locks, so the result
// does not depend on the order programs run in.
#pragma once

#include "tilegrad/core/types.hpp"
#include "tilegrad/grid/program.hpp"
#include "tilegrad/memory/block_ptr.hpp"
#include "tilegrad/memory/hints.hpp"
#include "tilegrad/memory/pointer.hpp" // the rank-0 stores of mean and rstd
#include "tilegrad/memory/tensor.hpp"
#include "tilegrad/tile/creation.hpp"
#include "tilegrad/tile/elementwise.hpp"
#include "tilegrad/tile/reduce.hpp"
#include "tilegrad/tile/shape_ops.hpp"

#include <algorithm>
#include <cstdint>

namespace tilegrad::kernels {

/// y[i, :] = (x[i, :] - mean_i) * rstd_i * w + b with mean_i and rstd_i = 1 / sqrt(var_i + eps)
/// over the row's N columns, stored into mean[i] and rstd[i] for the backward. x, y: (M, N);
/// w, b: (N); mean, rstd: (M). Grid: M programs; BlockN need not divide N.
template <int BlockN>
inline constexpr auto layer_norm_fwd = []<class T>(program const& p, tensor<T const> x,
                                                   tensor<T const> w, tensor<T const> b,
                                                   tensor<T> y, tensor<T> mean, tensor<T> rstd,
                                                   double eps) {
  std::int64_t const row_idx = p.program_id(0);
  std::int64_t const n = x.size(1);
  // A weight, bias or output of another shape would be zero-padded or cut by the bounds, silently.
  // (Checked by every program: one alone let the others write past a smaller output while it
  // threw.)
  {
    expect_shape(w, {n});
    expect_shape(b, {n});
    expect_shape(y, {x.size(0), n});
    expect_shape(mean, {x.size(0)});
    expect_shape(rstd, {x.size(0)});
  }
  int const col_tiles = static_cast<int>(cdiv<std::int64_t>(n, BlockN));
  // The row is walked as a (1, BlockN) block; columns past N read 0. (The tutorial's pointer
  // tiles with a column mask compute the same; block loads measured about 25 % faster on one core.)
  // Loaded blocks are named tiles where an expression reads them: an expression holding a
  // loaded tile by value copies it when it is evaluated.
  auto const row_block = make_block_ptr<1, BlockN>(x, {row_idx, 0});

  // Mean and variance summed block by block into a number. (The Triton tutorial adds blocks
  // into a (1, BlockN) tile and reduces it once; on the CPU such a tile is memory, written and
  // read back every block: measured 1.5x slower.)
  tile<fp32<T>> m = zeros<fp32<T>>();
  auto xb = row_block;
  for (int i = 0; i < col_tiles; ++i) {
    m += sum(load(xb, bounds<1>));
    xb = xb.advance(0, BlockN);
  }
  tile<fp32<T>> const m0 = m / static_cast<double>(n);

  // Variance in a second pass (not E[x²] - mean², which cancels); padded columns would hold
  // -mean, so they are zeroed. The pass also sums the deviations, which corrects both (the
  // corrected two-pass algorithm): the mean summed in float is a few ulp off on a row of large
  // values, and where the row varies by less than that (a constant row of 1e4), the squares of
  // that error were its variance: rstd 4.5 % off and y = b off by 0.3. PyTorch's layer norm gives
  // y = b there, and so does this one.
  auto const cols = row(arange<0, BlockN>());
  tile<fp32<T>> var = zeros<fp32<T>>();
  tile<fp32<T>> dev = zeros<fp32<T>>();
  xb = row_block;
  for (int i = 0; i < col_tiles; ++i) {
    tile<fp32<T>, 1, BlockN> const xv = load(xb, bounds<1>);
    // The columns left, at most BlockN: an int32 bound keeps the mask an int32 comparison.
    int const left = static_cast<int>(std::min<std::int64_t>(n - i * std::int64_t{BlockN}, BlockN));
    auto const d = where(cols < left, xv - m0, 0.0f); // (an expression: read thrice, not stored)
    dev += sum(d);
    var += sum(d * d);
    xb = xb.advance(0, BlockN);
  }
  tile<fp32<T>> const shift = dev / static_cast<double>(n);
  tile<fp32<T>> const mu = m0 + shift;
  tile<fp32<T>> const r = rsqrt(maximum(var / static_cast<double>(n) - shift * shift, 0.0f) + eps);
  store(mean + row_idx * mean.stride(0), mu);
  store(rstd + row_idx * rstd.stride(0), r);

  // Normalise and apply the affine map.
  xb = row_block;
  auto yb = make_block_ptr<1, BlockN>(y, {row_idx, 0});
  cache_hints const out_hint = output_hint(y.size(0) * y.size(1) * std::int64_t{sizeof(T)});
  auto wb = make_block_ptr<BlockN>(w, {0});
  auto bb = make_block_ptr<BlockN>(b, {0});
  for (int i = 0; i < col_tiles; ++i) {
    tile<fp32<T>, 1, BlockN> const xv = load(xb, bounds<1>);
    tile<fp32<T>, BlockN> const wv = load(wb, bounds<0>);
    tile<fp32<T>, BlockN> const bv = load(bb, bounds<0>);
    // y is written once and read by the next layer, not by this launch: a large y is streamed
    // past the caches (no read of the lines it overwrites; output_hint, memory/hints.hpp).
    store(yb, (xv - mu) * r * row(wv) + row(bv), bounds<1>, out_hint);
    xb = xb.advance(0, BlockN);
    yb = yb.advance(0, BlockN);
    wb = wb.advance(BlockN);
    bb = bb.advance(BlockN);
  }
};

/// Backward of layer_norm_fwd, from the mean and rstd it stored. With xhat = (x - mean) * rstd
/// and wdy = w * dy, row by row:
///   dx = rstd * (wdy - (xhat * c1 + c2)),  c1 = mean over the row of xhat * wdy,
///                                          c2 = mean over the row of wdy;
/// and for the group g of rows [g * Rows, (g + 1) * Rows):
///   partial_dw[g, :] = sum over its rows of dy * xhat,  partial_db[g, :] = sum of dy.
/// Each program owns one group and one row of each partial buffer; layer_norm_reduce_dwdb sums
/// them. Grid: cdiv(M, Rows) programs; partial_dw and partial_db have shape (cdiv(M, Rows), N).
/// Neither Rows need divide M nor BlockN divide N.
/// Under check_backward, pass mean and rstd to the forward unmarked (no gradient, no cotangent)
/// and let the backward capture them: the checker runs the float forward before each backward
/// call (examples/05_layer_norm.cpp).
///
/// The group is walked a row at a time, in (1, BlockN) blocks: a block of one row is contiguous,
/// so its loads read x and dy in place, where a (Rows, BlockN) block of longer rows is copied
/// into a tile (measured 1.3-1.6x slower, docs/performance.md). The first pass takes each row's
/// c1 and c2; the second walks the columns, and for each block of columns the group's rows,
/// adding dw and db into two (1, BlockN) tiles, stored once per block. The group's rows are read
/// twice, the second time from the cache: Rows x N x 2 x sizeof(T) bytes should fit in L2.
template <int BlockN, int Rows>
inline constexpr auto layer_norm_bwd =
    []<class T>(program const& p, tensor<T const> x, tensor<T const> w, tensor<T const> mean,
                tensor<T const> rstd, tensor<T const> dy, tensor<T> dx, tensor<T> partial_dw,
                tensor<T> partial_db) {
      // Operands of another shape would be zero-padded or cut by the bounds, silently. (Checked by
      // every program: one alone let the others write past a smaller output while it threw.)
      {
        std::int64_t const m = x.size(0), n = x.size(1), groups = cdiv<std::int64_t>(m, Rows);
        expect_shape(w, {n});
        expect_shape(mean, {m});
        expect_shape(rstd, {m});
        expect_shape(dy, {m, n});
        expect_shape(dx, {m, n});
        expect_shape(partial_dw, {groups, n});
        expect_shape(partial_db, {groups, n});
      }
      std::int64_t const r0 = p.program_id(0) * std::int64_t{Rows};
      int const rows = static_cast<int>(std::min<std::int64_t>(Rows, x.size(0) - r0));
      int const col_tiles = static_cast<int>(cdiv<std::int64_t>(x.size(1), BlockN));
      // A number meets an fp32<T> tile in the tile's type: float on the fast path, double in the
      // fp64 instantiation.
      double const n = static_cast<double>(x.size(1));
      // Columns past N read 0 in x, w and dy, hence wdy = 0 and dy * xhat = 0: no mask needed.
      auto const k = arange<0, Rows>(); // the row of the group, to set and pick c1 and c2
      auto c1 = zeros<fp32<T>, Rows>();
      auto c2 = zeros<fp32<T>, Rows>();

      // First pass, a row at a time: its c1 and c2, set into element r of the group's tiles.
      for (int r = 0; r < rows; ++r) {
        tile<fp32<T>> const mu = load(mean + (r0 + r) * mean.stride(0));
        tile<fp32<T>> const rs = load(rstd + (r0 + r) * rstd.stride(0));
        auto xb = make_block_ptr<1, BlockN>(x, {r0 + r, 0});
        auto gb = make_block_ptr<1, BlockN>(dy, {r0 + r, 0});
        auto wb = make_block_ptr<BlockN>(w, {0});
        tile<fp32<T>> s1 = zeros<fp32<T>>();
        tile<fp32<T>> s2 = zeros<fp32<T>>();
        for (int i = 0; i < col_tiles; ++i) {
          tile<fp32<T>, 1, BlockN> const xv = load(xb, bounds<1>); // named: read in place
          tile<fp32<T>, 1, BlockN> const g = load(gb, bounds<1>);
          tile<fp32<T>, BlockN> const wv = load(wb, bounds<0>);
          auto const wdy = row(wv) * g; // an expression, summed where it is read
          s1 += sum((xv - mu) * rs * wdy);
          s2 += sum(wdy);
          xb = xb.advance(0, BlockN);
          gb = gb.advance(0, BlockN);
          wb = wb.advance(BlockN);
        }
        c1 = where(k == r, s1 / n, c1);
        c2 = where(k == r, s2 / n, c2);
      }

      // Second pass, a block of columns at a time: dx of each row, and the group's partial sums.
      // dx is written once and read by the next layer's backward, not by this launch: a large
      // dx is streamed past the caches (output_hint, memory/hints.hpp).
      cache_hints const out_hint = output_hint(dx.size(0) * dx.size(1) * std::int64_t{sizeof(T)});
      auto wb = make_block_ptr<BlockN>(w, {0});
      auto pwb = make_block_ptr<1, BlockN>(partial_dw, {p.program_id(0), 0});
      auto pbb = make_block_ptr<1, BlockN>(partial_db, {p.program_id(0), 0});
      for (int i = 0; i < col_tiles; ++i) {
        std::int64_t const c0 = std::int64_t{i} * BlockN;
        tile<fp32<T>, BlockN> const wv = load(wb, bounds<0>);
        auto dw = zeros<fp32<T>, 1, BlockN>();
        auto db = zeros<fp32<T>, 1, BlockN>();
        for (int r = 0; r < rows; ++r) {
          tile<fp32<T>> const mu = load(mean + (r0 + r) * mean.stride(0));
          tile<fp32<T>> const rs = load(rstd + (r0 + r) * rstd.stride(0));
          tile<fp32<T>> const c1r = sum(where(k == r, c1, 0.0f));
          tile<fp32<T>> const c2r = sum(where(k == r, c2, 0.0f));
          tile<fp32<T>, 1, BlockN> const xv = load(make_block_ptr<1, BlockN>(x, {r0 + r, c0}),
                                                   bounds<1>);
          tile<fp32<T>, 1, BlockN> const g = load(make_block_ptr<1, BlockN>(dy, {r0 + r, c0}),
                                                  bounds<1>);
          auto const xhat = (xv - mu) * rs;
          store(make_block_ptr<1, BlockN>(dx, {r0 + r, c0}),
                (row(wv) * g - (xhat * c1r + c2r)) * rs, bounds<1>, out_hint);
          dw += g * xhat;
          db += g;
        }
        store(pwb, dw, bounds<1>);
        store(pbb, db, bounds<1>);
        wb = wb.advance(BlockN);
        pwb = pwb.advance(0, BlockN);
        pbb = pbb.advance(0, BlockN);
      }
    };

/// dw[j] = sum over g of partial_dw[g, j] and db[j] = sum over g of partial_db[g, j], BG groups
/// at a time, in the same order on every run. Grid: cdiv(N, BlockN) programs.
template <int BG, int BlockN>
inline constexpr auto layer_norm_reduce_dwdb =
    []<class T>(program const& p, tensor<T const> partial_dw, tensor<T const> partial_db,
                tensor<T> dw, tensor<T> db) {
      {
        expect_shape(partial_db, {partial_dw.size(0), partial_dw.size(1)});
        expect_shape(dw, {partial_dw.size(1)});
        expect_shape(db, {partial_dw.size(1)});
      }
      std::int64_t const c0 = p.program_id(0) * std::int64_t{BlockN};
      auto pwb = make_block_ptr<BG, BlockN>(partial_dw, {0, c0});
      auto pbb = make_block_ptr<BG, BlockN>(partial_db, {0, c0});
      auto acc_w = zeros<fp32<T>, BlockN>();
      auto acc_b = zeros<fp32<T>, BlockN>();
      for (int i = 0; i < cdiv<std::int64_t>(partial_dw.size(0), BG); ++i) {
        acc_w += sum<0>(load(pwb, bounds<0, 1>));
        acc_b += sum<0>(load(pbb, bounds<0, 1>));
        pwb = pwb.advance(BG, 0);
        pbb = pbb.advance(BG, 0);
      }
      store(make_block_ptr<BlockN>(dw, {c0}), acc_w, bounds<0>);
      store(make_block_ptr<BlockN>(db, {c0}), acc_b, bounds<0>);
    };

} // namespace tilegrad::kernels
