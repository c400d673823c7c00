// 04: checking a hand-written backward. The weighted sum's backward (dx and per-row-tile partial
// sums of dw, reduced by a second launch) is checked against the reference gradients that vjp
// derives from the forward kernel; then a variant with an off-by-one row mask is checked, and
// the report's block map shows the mismatches sitting in the last row. Last, two self-checks of
// the reference itself: the Taylor test (central differences of the softmax in double converge to
// vjp's directional derivative at rate 2) and the dot-product test (jvp and vjp agree on
// <J u, w> = <u, J^T w>).
#include <tilegrad/kernels/softmax.hpp>
#include <tilegrad/kernels/weighted_sum.hpp>
#include <tilegrad/tilegrad.hpp>

#include <cstdint>
#include <iostream>

namespace tg = tilegrad;

constexpr int BR = 16, BD = 32;

// The backward as a user writes it: two launches, gradients handed back by name.
template <bool OffByOne>
tg::gradient_set backward(tg::backward_context<float>& ctx) {
  auto const x = ctx.input("x");
  auto const w = ctx.input("w");
  auto dy = ctx.cotangent("y");
  std::int64_t const n = x.size(0), d = x.size(1);
  // A weight of another length would be read zero-padded by the kernel's bounds: say so instead.
  tg::expect_shape(w, {d});
  if constexpr (OffByOne) // the bug: a row mask that stops one row early (rows < n - 1)
    dy = tg::tensor<float const>(dy.data(), {n - 1});
  tg::owned_tensor<float> dx({n, d}), partial({tg::cdiv(n, BR), d}), dw({d});
  tg::launch(ctx.options(), tg::cdiv(n, BR), tg::kernels::weighted_sum_bwd<BR, BD>, x, w, dy,
             dx.view(), partial.view());
  tg::launch(ctx.options(), tg::cdiv(d, BD), tg::kernels::weighted_sum_reduce_dw<8, BD>,
             partial.cview(), dw.view());
  return {{"x", dx}, {"w", dw}};
}

int main() {
  std::int64_t const n = 100, d = 70;
  tg::owned_tensor<float> x({n, d}), w({d}), y({n});
  auto const fwd = tg::forward(tg::cdiv(n, BR), tg::kernels::weighted_sum_fwd<BR, BD>,
                               tg::in("x", x), tg::in("w", w), tg::out("y", y));

  auto const good = tg::check_backward(fwd, backward<false>);
  std::cout << good << "\n";
  auto const bad = tg::check_backward(fwd, backward<true>, {.seeds = 1});
  std::cout << bad << "\n";

  tg::owned_tensor<float> s({8, 50}, "s"), p({8, 50}, "p");
  for (std::int64_t i = 0; i < s.numel(); ++i)
    s.data()[i] = static_cast<float>((i * 37 % 101) / 25.0 - 2);
  auto const taylor =
      tg::taylor_test(8, tg::kernels::softmax_fwd<64>, tg::in("s", s), tg::out("p", p));
  std::cout << taylor;
  auto const dot =
      tg::dot_product_test(8, tg::kernels::softmax_fwd<64>, tg::in("s", s), tg::out("p", p));
  std::cout << dot;
  return good && !bad && taylor && dot ? 0 : 1;
}
