// 06: FlashAttention-2, forward and hand-written backward, checked. The forward is the library's
// kernel (online softmax over key tiles, causal tile skipping). The backward is written here the
// way a kernel author writes it: D = rowsum(dO * O), then a key-tile pass for dK and dV and a
// query-tile pass for dQ, both recomputing P from the saved logsumexp. check_backward compares it
// with the reference gradients that vjp derives from the forward kernel: it passes; then a dQ
// pass whose key mask stops one key early fails, and the block map points at the last row of
// each head. Last, one line of timings.
#include "common.hpp"

#include <tilegrad/kernels/flash_attention.hpp>
#include <tilegrad/tilegrad.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>

namespace tg = tilegrad;
namespace tk = tilegrad::kernels;

// The tiles flash_attention_forward and flash_attention_backward use for this head dim.
constexpr int D = 64, BQ = tk::attention_block_q<D>, BK = tk::attention_block_k<D>;
constexpr bool Causal = true;

// dq = scale * dS K over the key tiles this query tile attends to, dS = P * (dO Vᵀ - D).
// KeyOffByOne is the bug: the key mask reads `keys < n_k - 1`.
template <bool KeyOffByOne>
constexpr auto attention_bwd_dq =
    []<class T>(tg::program const& p, tg::tensor<T const> q, tg::tensor<T const> k,
                tg::tensor<T const> v, tg::tensor<T const> d_o, tg::tensor<T const> lse,
                tg::tensor<T const> delta, tg::tensor<T> dq, double scale) {
      int const q0 = p.program_id(0) * BQ, h = p.program_id(1), b = p.program_id(2);
      int const n_k = static_cast<int>(k.size(2));
      auto const qi = tg::load(tg::make_block_ptr<BQ, D>(q[b][h], {q0, 0}), tg::bounds<0>);
      auto const doi = tg::load(tg::make_block_ptr<BQ, D>(d_o[b][h], {q0, 0}), tg::bounds<0>);
      auto const li = tg::load(tg::make_block_ptr<BQ>(lse[b][h], {q0}), tg::bounds<0>);
      auto const di = tg::load(tg::make_block_ptr<BQ>(delta[b][h], {q0}), tg::bounds<0>);
      auto const offs_q = q0 + tg::arange<0, BQ>();
      auto acc = tg::zeros<T, BQ, D>();
      for (int k0 = 0; k0 < std::min(n_k, q0 + BQ); k0 += BK) { // causal: no tile past the diagonal
        auto const kj = tg::load(tg::make_block_ptr<BK, D>(k[b][h], {k0, 0}), tg::bounds<0>);
        auto const vj = tg::load(tg::make_block_ptr<BK, D>(v[b][h], {k0, 0}), tg::bounds<0>);
        auto const offs_k = k0 + tg::arange<0, BK>();
        auto const keep =
            (tg::row(offs_k) < n_k - (KeyOffByOne ? 1 : 0)) & (tg::col(offs_q) >= tg::row(offs_k));
        tg::tile<T, BQ, BK> const pt =
            tg::where(keep, tg::exp(tg::dot(qi, tg::trans(kj)) * scale - tg::col(li)), 0.0f);
        tg::tile<T, BQ, BK> const ds = pt * (tg::dot(doi, tg::trans(vj)) - tg::col(di));
        acc = tg::dot(ds, kj, std::move(acc));
      }
      tg::store(tg::make_block_ptr<BQ, D>(dq[b][h], {q0, 0}), acc * scale, tg::bounds<0>);
    };

// A double: the fp64 reference (check_backward's float64 vjp) then runs with the exact scale.
double scale() {
  return 1 / std::sqrt(double(D));
}

tg::grid query_tiles(tg::tensor<float const> q) {
  return {tg::cdiv(q.size(2), BQ), q.size(1), q.size(0)};
}
tg::grid key_tiles(tg::tensor<float const> k) {
  return {tg::cdiv(k.size(2), BK), k.size(1), k.size(0)};
}

// The backward: D = rowsum(dO * O), the key-tile pass for dK and dV (the library's kernel), the
// query-tile pass for dQ (written above), each launch with the tiles of the forward.
template <bool KeyOffByOne>
void run_backward(tg::launch_options const& opts, tg::tensor<float const> q,
                  tg::tensor<float const> k, tg::tensor<float const> v, tg::tensor<float const> o,
                  tg::tensor<float const> d_o, tg::tensor<float const> lse, tg::tensor<float> dq,
                  tg::tensor<float> dk, tg::tensor<float> dv) {
  tg::owned_tensor<float> delta({q.size(0), q.size(1), q.size(2)}, "delta");
  tg::launch(opts, query_tiles(q), tk::flash_attention_bwd_delta<D, BQ>, o, d_o, delta.view());
  tg::launch(opts, key_tiles(k), tk::flash_attention_bwd_dkdv<D, BQ, BK, Causal>, q, k, v, d_o, lse,
             delta.cview(), delta.view(), dk, dv, scale());
  tg::launch(opts, query_tiles(q), attention_bwd_dq<KeyOffByOne>, q, k, v, d_o, lse, delta.cview(),
             dq, scale());
}

// The backward as check_backward calls it: inputs, output and its cotangent by name; the
// logsumexp the forward saved is captured.
template <bool KeyOffByOne>
auto backward(tg::tensor<float const> lse) {
  return [lse](tg::backward_context<float>& ctx) {
    auto const q = ctx.input("q"), k = ctx.input("k"), v = ctx.input("v");
    tg::owned_tensor<float> dq(q.shape().data(), 4), dk(k.shape().data(), 4),
        dv(v.shape().data(), 4);
    run_backward<KeyOffByOne>(ctx.options(), q, k, v, ctx.output("o"), ctx.cotangent("o"), lse,
                              dq.view(), dk.view(), dv.view());
    ctx.set_gradient("q", dq);
    ctx.set_gradient("k", dk);
    ctx.set_gradient("v", dv);
  };
}

int main() {
  // Two heads of 200 rows: the last query and key tiles are partial.
  std::int64_t const B = 1, H = 2, N = 200;
  tg::owned_tensor<float> q({B, H, N, D}), k({B, H, N, D}), v({B, H, N, D}), o({B, H, N, D}),
      lse({B, H, N}, "lse");
  auto const fwd =
      tg::forward(query_tiles(q), tk::flash_attention_fwd<D, BQ, BK, Causal>, tg::in("q", q),
                  tg::in("k", k), tg::in("v", v), tg::out("o", o), lse.view(), scale());

  auto const good = tg::check_backward(fwd, backward<false>(lse.cview()));
  std::cout << good << "\n";
  auto const bad = tg::check_backward(fwd, backward<true>(lse.cview()), {.seeds = 1});
  std::cout << bad << "\n";

  // Timings on a larger problem: 4 heads of 1024 rows.
  std::int64_t const Ht = 4, Nt = 1024;
  tg::owned_tensor<float> tq({1, Ht, Nt, D}, "q"), tk_({1, Ht, Nt, D}, "k"),
      tv({1, Ht, Nt, D}, "v"), to({1, Ht, Nt, D}, "o"), tdo({1, Ht, Nt, D}, "do"),
      tl({1, Ht, Nt}, "lse"), tdq({1, Ht, Nt, D}), tdk({1, Ht, Nt, D}), tdv({1, Ht, Nt, D});
  examples::fill_uniform(tq, 1);
  examples::fill_uniform(tk_, 2);
  examples::fill_uniform(tv, 3);
  examples::fill_uniform(tdo, 4);
  // The kernels and tiles flash_attention_forward and flash_attention_backward (two_pass) pick
  // for this head dim, launched directly: the entry points would compile every head dim's.
  double const t_fwd = examples::best_seconds([&] {
    tg::launch(query_tiles(tq.cview()), tk::flash_attention_fwd<D, BQ, BK, Causal>, tq.cview(),
               tk_.cview(), tv.cview(), to.view(), tl.view(), scale());
  });
  double const t_bwd = examples::best_seconds([&] {
    run_backward<false>(tg::default_options(), tq, tk_, tv, to, tdo, tl, tdq.view(), tdk.view(),
                        tdv.view());
  });
  double const t_ref = examples::best_seconds(
      [&] {
        tg::vjp(query_tiles(tq.cview()), tk::flash_attention_fwd<D, BQ, BK, Causal>,
                tg::in("q", tq), tg::in("k", tk_), tg::in("v", tv), tg::out("o", to, tdo),
                tl.view(), scale());
      },
      2);
  std::printf("timing (causal, 1 x %ld heads x %ld rows, d = %d): forward %.2f ms, backward "
              "%.2f ms, reference gradient (vjp) %.2f ms = %.1f x forward\n",
              long(Ht), long(Nt), D, t_fwd * 1e3, t_bwd * 1e3, t_ref * 1e3, t_ref / t_fwd);
  return good && !bad ? 0 : 1;
}
