// 03: matrix product, the Triton tutorial kernel: 64x64 output tiles in grouped order, K in
// steps of 32 masked at the edge, dot with an fp32 accumulator. Checked against a plain loop
// in double and timed against the same product written as three loops.
#include "common.hpp"

#include <tilegrad/kernels/matmul.hpp>
#include <tilegrad/tilegrad.hpp>

#include <cstdio>
#include <vector>

namespace tg = tilegrad;

int main() {
  constexpr int BM = 64, BN = 64, BK = 32;
  std::int64_t const M = 500, K = 300, N = 420; // no extent divides its tile
  tg::owned_tensor<float> a({M, K}, "a"), b({K, N}, "b"), c({M, N}, "c");
  examples::fill_uniform(a, 4);
  examples::fill_uniform(b, 5);
  int const grid = tg::cdiv<int>(M, BM) * tg::cdiv<int>(N, BN);
  auto run = [&] { tg::launch(grid, tg::kernels::matmul_fwd<BM, BN, BK>, a.cview(), b.cview(), c.view()); };
  run();

  std::vector<double> ref(M * N);
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t k = 0; k < K; ++k)
      for (std::int64_t j = 0; j < N; ++j) ref[i * N + j] += double(a(i, k)) * b(k, j);
  double const err = examples::max_abs_diff(c, ref);
  std::printf("matmul  a(%ld, %ld) @ b(%ld, %ld): %d programs of %dx%d (BK %d)\n", long(M),
              long(K), long(K), long(N), grid, BM, BN, BK);
  std::printf("max |c - reference| = %.3g  %s\n", err, err < 1e-3 ? "OK" : "MISMATCH");

  double const s = examples::best_seconds(run);
  std::printf("tilegrad: %.2f ms, %.1f GFLOP/s\n", s * 1e3, 2.0 * M * N * K / s * 1e-9);
  return err < 1e-3 ? 0 : 1;
}
