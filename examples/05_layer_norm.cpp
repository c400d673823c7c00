// 05: layer norm, the Triton tutorial kernel, and its hand-written backward. The forward runs
// one program per row, walks the row in blocks of BlockN columns and stores each row's mean and
// rstd; the backward reads them back (as Triton's does), writes dx and, per group of Rows rows,
// partial sums of dw and db, which a second launch reduces: deterministic, no atomics.
// check_backward compares dx, dw and db with the reference gradients vjp derives from the
// forward kernel alone.
#include "common.hpp"

#include <tilegrad/kernels/layer_norm.hpp>
#include <tilegrad/tilegrad.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <vector>

namespace tg = tilegrad;

constexpr int BlockN = 64, Rows = 8, BG = 8;
constexpr double eps = 1e-5; // a double: exact in the float64 reference of check_backward

int main() {
  // Neither BlockN divides N nor Rows divides M.
  std::int64_t const m = 100, n = 300;
  tg::owned_tensor<float> x({m, n}, "x"), w({n}, "w"), b({n}, "b"), y({m, n}, "y");
  tg::owned_tensor<float> mean({m}, "mean"), rstd({m}, "rstd");
  examples::fill_uniform(x, 1, -2, 4);
  examples::fill_uniform(w, 2);
  examples::fill_uniform(b, 3);

  // Forward: y, and the row statistics the backward reads.
  tg::launch(static_cast<int>(m), tg::kernels::layer_norm_fwd<BlockN>, x.cview(), w.cview(),
             b.cview(), y.view(), mean.view(), rstd.view(), eps);
  std::vector<double> ref(static_cast<std::size_t>(m * n));
  for (std::int64_t i = 0; i < m; ++i) {
    double mu = 0, var = 0;
    for (std::int64_t j = 0; j < n; ++j)
      mu += x(i, j) / double(n);
    for (std::int64_t j = 0; j < n; ++j)
      var += (x(i, j) - mu) * (x(i, j) - mu) / double(n);
    for (std::int64_t j = 0; j < n; ++j)
      ref[i * n + j] = (x(i, j) - mu) / std::sqrt(var + eps) * w(j) + b(j);
  }
  double const err = examples::max_abs_diff(y, ref);
  std::printf("layer_norm_fwd x(%ld, %ld): %ld programs, blocks of %d columns\n", long(m), long(n),
              long(m), BlockN);
  std::printf("max |y - reference| = %.3g  %s\n\n", err, err < 1e-5 ? "OK" : "MISMATCH");

  // The hand-written backward, as check_backward calls it. The checker runs the float forward
  // before each call, which refreshes mean and rstd: the backward captures them.
  auto backward = [&](tg::backward_context<float>& ctx) -> tg::gradient_set {
    auto const xs = ctx.input("x");
    auto const ws = ctx.input("w");
    auto const dy = ctx.cotangent("y");
    std::int64_t const rows = xs.size(0), cols = xs.size(1);
    tg::expect_shape(ws, {cols}); // a weight of another length would be read zero-padded
    auto const groups = tg::cdiv(rows, Rows);
    tg::owned_tensor<float> dx({rows, cols}), partial_dw({groups, cols}),
        partial_db({groups, cols}), dw({cols}), db({cols});
    tg::launch(ctx.options(), groups, tg::kernels::layer_norm_bwd<BlockN, Rows>, xs, ws,
               mean.cview(), rstd.cview(), dy, dx.view(), partial_dw.view(), partial_db.view());
    tg::launch(ctx.options(), tg::cdiv(cols, BlockN),
               tg::kernels::layer_norm_reduce_dwdb<BG, BlockN>, partial_dw.cview(),
               partial_db.cview(), dw.view(), db.view());
    return {{"x", dx}, {"w", dw}, {"b", db}};
  };

  // mean and rstd are passed unmarked: written by the forward, no gradient, no cotangent.
  auto const report = tg::check_backward(
      tg::forward(static_cast<int>(m), tg::kernels::layer_norm_fwd<BlockN>, tg::in("x", x),
                  tg::in("w", w), tg::in("b", b), tg::out("y", y), mean.view(), rstd.view(), eps),
      backward);
  std::cout << report;
  return err < 1e-5 && report ? 0 : 1;
}
