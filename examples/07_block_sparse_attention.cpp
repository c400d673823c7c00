// 07: block-sparse attention. A block table lists, for each query block, the key blocks it
// attends to: here a local window (its own block and the one before) and a global first block.
// The forward reads its loop count and key offsets from that integer table inside the kernel;
// vjp records the path each program took, so the reference gradients follow the table with no
// extra code. The hand-written backward (a key-block pass for dK and dV through the transposed
// table, a query-block pass for dQ) is checked against them.
#include "common.hpp"

#include <tilegrad/kernels/block_sparse_attention.hpp>
#include <tilegrad/tilegrad.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>

namespace tg = tilegrad;
namespace tk = tilegrad::kernels;

constexpr int D = 32, BLOCK = 32;

int main() {
  std::int64_t const B = 1, H = 2, N = 200; // 7 blocks of 32 rows, the last of 8
  std::int64_t const blocks = tg::cdiv(N, BLOCK);
  // One table for every batch and head (axes of size 1 are shared).
  auto const table = tk::make_block_table(1, 1, blocks, blocks, [](auto, auto, auto r, auto c) {
    return c == 0 || c == r || c + 1 == r;
  });
  std::printf("block table (query block: key blocks), blocks of %d rows\n", BLOCK);
  std::int64_t listed = 0;
  for (std::int64_t r = 0; r < blocks; ++r) {
    std::printf("  %ld: ", long(r));
    for (std::int64_t c = 0; c < blocks; ++c) {
      bool on = false;
      for (std::int32_t j = 0; j < table.count(0, 0, r); ++j)
        on = on || table.index(0, 0, r, j) == c;
      std::printf("%c", on ? '#' : '.');
    }
    listed += table.count(0, 0, r);
    std::printf("\n");
  }
  std::printf("  %ld of %ld score blocks computed\n\n", long(listed), long(blocks * blocks));

  // Forward and backward through the host entry points (shapes and table checked first).
  tg::owned_tensor<float> q({B, H, N, D}, "q"), k({B, H, N, D}, "k"), v({B, H, N, D}, "v"),
      o({B, H, N, D}, "o"), lse({B, H, N}, "lse"), d_o({B, H, N, D}, "do"), dq({B, H, N, D}, "dq"),
      dk({B, H, N, D}, "dk"), dv({B, H, N, D}, "dv");
  examples::fill_uniform(q, 1);
  examples::fill_uniform(k, 2);
  examples::fill_uniform(v, 3);
  examples::fill_uniform(d_o, 4);
  tk::block_sparse_attention_forward<float, BLOCK>(q, k, v, table.count, table.index, o.view(),
                                                   lse.view());
  tk::block_sparse_attention_backward<float, BLOCK>(q, k, v, o, d_o, lse, table.count, table.index,
                                                    dq.view(), dk.view(), dv.view());
  std::printf("forward: o(0, 0, 0, 0) = %.5f, lse(0, 1, %ld) = %.5f\n", o(0, 0, 0, 0), long(N - 1),
              lse(0, 1, N - 1));
  std::printf("backward: dq(0, 0, 0, 0) = %.5f, dk(0, 0, 0, 0) = %.5f, dv(0, 1, %ld, 0) = %.5f\n\n",
              dq(0, 0, 0, 0), dk(0, 0, 0, 0), long(N - 1), dv(0, 1, N - 1, 0));

  // The check: the forward kernel is the reference; the backward is the host entry point.
  double const scale = 1 / std::sqrt(double(D)); // exact in the float64 reference
  auto const fwd =
      tg::forward(tg::grid(int(blocks), int(H), int(B)),
                  tk::block_sparse_attention_fwd<D, BLOCK, BLOCK>, tg::in("q", q), tg::in("k", k),
                  tg::in("v", v), table.count, table.index, tg::out("o", o), lse.view(), scale);
  auto const report = tg::check_backward(fwd, [&](tg::backward_context<float>& ctx) {
    tg::owned_tensor<float> gq({B, H, N, D}), gk({B, H, N, D}), gv({B, H, N, D});
    tk::block_sparse_attention_backward<float, BLOCK>(
        ctx.input("q"), ctx.input("k"), ctx.input("v"), ctx.output("o"), ctx.cotangent("o"), lse,
        table.count, table.index, gq.view(), gk.view(), gv.view(), {.launch = ctx.options()});
    return tg::gradient_set{{"q", gq}, {"k", gk}, {"v", gv}};
  });
  std::cout << report;
  return report ? 0 : 1;
}
