// 01: weighted sum, forward. y[i] = sum_j x[i, j] * w[j] with row tiles of 16 and D tiles of
// 64 walked by block pointers; the shapes do not divide the tiles, so the boundary checks and
// zero padding do real work. Compared with a plain loop.
#include "common.hpp"

#include <tilegrad/kernels/weighted_sum.hpp>
#include <tilegrad/tilegrad.hpp>

#include <cstdio>
#include <vector>

namespace tg = tilegrad;

int main() {
  constexpr int BR = 16, BD = 64;
  std::int64_t const n = 1000, d = 333;
  tg::owned_tensor<float> x({n, d}, "x"), w({d}, "w"), y({n}, "y");
  examples::fill_uniform(x, 1);
  examples::fill_uniform(w, 2);

  tg::launch(tg::cdiv(n, BR), tg::kernels::weighted_sum_fwd<BR, BD>, x.cview(), w.cview(),
             y.view());

  std::vector<double> ref(n);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < d; ++j) ref[i] += double(x(i, j)) * w(j);
  double const err = examples::max_abs_diff(y, ref);
  std::printf("weighted sum  x(%ld, %ld) . w(%ld): grid %d programs of %dx%d\n", long(n), long(d),
              long(d), tg::cdiv<int>(n, BR), BR, BD);
  std::printf("max |y - reference| = %.3g  %s\n", err, err < 1e-4 ? "OK" : "MISMATCH");
  return err < 1e-4 ? 0 : 1;
}
