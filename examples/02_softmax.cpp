// 02: row softmax, the classic Triton kernel. One program per row; the row is one block of
// next_power_of_2(n_cols) lanes, masked past its end (masked lanes load -inf).
#include "common.hpp"

#include <tilegrad/kernels/softmax.hpp>
#include <tilegrad/tilegrad.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

namespace tg = tilegrad;

int main() {
  std::int64_t const rows = 300, cols = 781; // a block of 1024 lanes, 243 of them masked
  constexpr int Block = tg::next_power_of_2(781);
  tg::owned_tensor<float> x({rows, cols}, "x"), y({rows, cols}, "y");
  examples::fill_uniform(x, 3, -4, 4);

  tg::launch(static_cast<int>(rows), tg::kernels::softmax_fwd<Block>, x.cview(), y.view());

  std::vector<double> ref(rows * cols);
  for (std::int64_t i = 0; i < rows; ++i) {
    double m = -INFINITY, z = 0;
    for (std::int64_t j = 0; j < cols; ++j) m = std::max(m, double(x(i, j)));
    for (std::int64_t j = 0; j < cols; ++j) z += std::exp(double(x(i, j)) - m);
    for (std::int64_t j = 0; j < cols; ++j) ref[i * cols + j] = std::exp(double(x(i, j)) - m) / z;
  }
  double const err = examples::max_abs_diff(y, ref);
  std::printf("softmax  x(%ld, %ld): %ld programs, blocks of %d lanes\n", long(rows), long(cols),
              long(rows), Block);
  std::printf("max |y - reference| = %.3g  %s\n", err, err < 1e-6 ? "OK" : "MISMATCH");
  return err < 1e-6 ? 0 : 1;
}
