// FlashAttention-2 forward against a plain attention in double (scores materialised), on row
// counts that do not fill the tiles, causal and not, fp32, bf16 storage and double; and the
// shape checks of the host entry points.
#include <tilegrad/kernels/flash_attention.hpp>
#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest.h>

#include "../support/attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_flash_attention {

namespace tg = tilegrad;
using test_support::as_double;
using test_support::error_of;

namespace {

template <class T>
void fill(tg::owned_tensor<T>& t, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1, 1);
  for (T& v : t)
    v = static_cast<T>(d(rng));
}

struct fwd_case {
  std::int64_t B, H, N, M;
  bool causal;
};

template <class T, int D>
void check_forward(fwd_case c, double tol, double scale = 0) {
  tg::owned_tensor<T> q({c.B, c.H, c.N, D}, "q"), k({c.B, c.H, c.M, D}, "k"),
      v({c.B, c.H, c.M, D}, "v"), o({c.B, c.H, c.N, D}, "o");
  tg::owned_tensor<tg::fp32<T>> lse({c.B, c.H, c.N}, "lse");
  fill(q, 1);
  fill(k, 2);
  fill(v, 3);
  tg::kernels::flash_attention_forward<T>(q.cview(), k.cview(), v.cview(), o.view(), lse.view(),
                                          {.causal = c.causal, .scale = scale});
  std::vector<double> ro, rl;
  test_support::reference_attention(
      q, k, v, scale != 0 ? scale : 1.0 / std::sqrt(double(D)),
      [&](auto, auto, std::int64_t i, std::int64_t j) { return !c.causal || j <= i; }, ro, rl);
  // (A NaN error is the largest: std::max would drop it.)
  auto worse = [](double& err, double d) { err = !(d <= err) ? d : err; };
  double err_o = 0, err_l = 0;
  for (std::int64_t i = 0; i < o.numel(); ++i)
    worse(err_o, std::abs(as_double(o.data()[i]) - ro[static_cast<std::size_t>(i)]));
  for (std::int64_t i = 0; i < lse.numel(); ++i)
    worse(err_l, std::abs(as_double(lse.data()[i]) - rl[static_cast<std::size_t>(i)]));
  EXPECT_LT(err_o, tol) << "N=" << c.N << " M=" << c.M << " causal=" << c.causal;
  EXPECT_LT(err_l, tol) << "N=" << c.N << " M=" << c.M << " causal=" << c.causal;
}

TEST(FlashAttentionForward, Float32MatchesPlainAttention) {
  for (bool causal : {false, true}) {
    check_forward<float, 16>({2, 3, 100, 100, causal}, 2e-6);
    check_forward<float, 64>({1, 2, 130, 130, causal}, 2e-6);
    check_forward<float, 32>({1, 1, 1, 1, causal}, 2e-6);
  }
  check_forward<float, 32>({1, 2, 70, 150, false}, 2e-6); // more keys than queries
}

TEST(FlashAttentionForward, Float64MatchesPlainAttention) {
  // At d = 32 and 128, 1/sqrt(d) is not a float: a scale passed as float is 1e-8 off.
  for (bool causal : {false, true}) {
    check_forward<double, 16>({1, 2, 77, 77, causal}, 1e-13);
    check_forward<double, 32>({1, 1, 77, 77, causal}, 1e-13);
    check_forward<double, 128>({1, 1, 45, 45, causal}, 1e-13);
  }
}

TEST(FlashAttentionForward, Bf16StorageMatchesPlainAttentionOnTheRoundedInputs) {
  // Compute is fp32, with bf16 operands to dot: P is rounded to bf16 before P V (Triton's
  // p.to(v.dtype)), o once more at the store (relative 2^-9 of values below 1 each). Measured:
  // at most 0.0024 (0.0020 with P kept in fp32, the rounding of o alone).
  for (bool causal : {false, true})
    check_forward<tg::bf16, 64>({1, 2, 100, 100, causal}, 4e-3);
}

// A negative softmax scale (nothing restricts its sign): the bf16 forward, whose running maximum
// follows the unscaled scores, took the maximum of the scores where the scaled ones need their
// minimum, and its first rescaling was exp(+inf): NaN in every element of o and lse.
TEST(FlashAttentionForward, NegativeScalesInEveryStorage) {
  for (bool causal : {false, true})
    for (double scale : {-0.125, -1.0}) {
      check_forward<float, 64>({1, 2, 100, 100, causal}, 1e-5, scale); // (lse up to about 10)
      check_forward<double, 64>({1, 1, 77, 77, causal}, 1e-13, scale);
      check_forward<tg::bf16, 64>({1, 2, 100, 100, causal}, 8e-3, scale);
    }
}

TEST(FlashAttentionForward, HeadDim128) {
  check_forward<float, 128>({1, 1, 90, 90, true}, 2e-6);
}

// Scores that grow along the key walk: every query has a component 1 along the first axis, and
// key j one of 0.4 j, so each block of 16 keys raises the queries' maxima by about 6.4 and the
// forward rescales what it summed by about e^-6.4 at every step (random scores barely move the
// maxima after the first step), up to scores of 68. Against plain attention in double, in every
// storage; and its reverse mode, through those rescales, against jvp and central differences.
template <class T>
void fill_growing_scores(tg::owned_tensor<T>& q, tg::owned_tensor<T>& k, tg::owned_tensor<T>& v) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> d(-0.3f, 0.3f);
  for (auto* t : {&q, &k, &v})
    for (T& x : *t)
      x = static_cast<T>(d(rng));
  for (std::int64_t h = 0; h < q.size(1); ++h) {
    for (std::int64_t i = 0; i < q.size(2); ++i)
      q(0, h, i, 0) = static_cast<T>(1.0f);
    for (std::int64_t j = 0; j < k.size(2); ++j)
      k(0, h, j, 0) = static_cast<T>(0.4f * static_cast<float>(j));
  }
}

template <class T>
void check_growing_scores(bool causal, double tol_o, double rel_lse) {
  constexpr int D = 16;
  std::int64_t const n = 150, nk = 170;
  tg::owned_tensor<T> q({1, 2, n, D}, "q"), k({1, 2, nk, D}, "k"), v({1, 2, nk, D}, "v"),
      o({1, 2, n, D}, "o");
  tg::owned_tensor<tg::fp32<T>> lse({1, 2, n}, "lse");
  fill_growing_scores(q, k, v);
  tg::kernels::flash_attention_forward<T>(q.cview(), k.cview(), v.cview(), o.view(), lse.view(),
                                          {.causal = causal, .scale = 1.0});
  std::vector<double> ro, rl;
  test_support::reference_attention(
      q, k, v, 1.0, [&](auto, auto, std::int64_t i, std::int64_t j) { return !causal || j <= i; },
      ro, rl);
  double err_o = 0, err_l = 0, top = 0;
  for (std::int64_t i = 0; i < o.numel(); ++i) {
    double const d = std::abs(as_double(o.data()[i]) - ro[static_cast<std::size_t>(i)]);
    err_o = !(d <= err_o) ? d : err_o;
  }
  for (std::int64_t i = 0; i < lse.numel(); ++i) {
    double const want = rl[static_cast<std::size_t>(i)];
    double const d = std::abs(as_double(lse.data()[i]) - want) / std::abs(want);
    err_l = !(d <= err_l) ? d : err_l;
    top = std::max(top, want);
  }
  EXPECT_GT(top, 50.0) << "the scores do not grow: a degenerate test";
  EXPECT_LT(err_o, tol_o) << "causal=" << causal;
  EXPECT_LT(err_l, rel_lse) << "causal=" << causal;
}

TEST(FlashAttentionForward, ScoresThatGrowAlongTheWalkMatchPlainAttention) {
  for (bool causal : {false, true}) {
    // (float: scores up to 68 are off by u times their size, about 4e-6, and o by as much)
    check_growing_scores<float>(causal, 8e-6, 4e-7);
    check_growing_scores<double>(causal, 1e-13, 1e-15);
    check_growing_scores<tg::bf16>(causal, 4e-3, 4e-3);
  }
}

TEST(FlashAttentionForward, ScoresThatGrowAlongTheWalkAreDifferentiated) {
  constexpr int D = 16, BQ = 16, BK = 16;
  std::int64_t const n = 70, nk = 90;
  tg::owned_tensor<float> q({1, 2, n, D}, "q"), k({1, 2, nk, D}, "k"), v({1, 2, nk, D}, "v"),
      o({1, 2, n, D}, "o"), lse({1, 2, n}, "lse");
  fill_growing_scores(q, k, v);
  auto const g = tg::grid(static_cast<int>(tg::cdiv<std::int64_t>(n, BQ)), 2, 1);
  for (std::size_t budget : {std::size_t{0}, std::size_t{8} << 20}) { // replayed, recorded whole
    std::size_t const saved = tg::set_loop_record_budget(budget);
    auto const dp =
        tg::dot_product_test(g, tg::kernels::flash_attention_fwd<D, BQ, BK, false>, tg::in("q", q),
                             tg::in("k", k), tg::in("v", v), tg::out("o", o), lse.view(), 1.0);
    EXPECT_TRUE(dp) << dp;
    auto const tt =
        tg::taylor_test(g, tg::kernels::flash_attention_fwd<D, BQ, BK, true>, tg::in("q", q),
                        tg::in("k", k), tg::in("v", v), tg::out("o", o), lse.view(), 1.0);
    EXPECT_TRUE(tt) << tt;
    tg::set_loop_record_budget(saved);
  }
}

// The bf16 backward (fp32 compute, bf16 storage of every tensor but lse and the dq buffer, P and
// dS rounded to bf16 before their products)
// against the fp32 backward on the same bf16-rounded inputs: both variants, causal and not.
TEST(FlashAttentionBackward, Bf16StorageMatchesFloat32OnTheRoundedInputs) {
  constexpr int D = 32;
  std::int64_t const B = 1, H = 2, N = 90;
  for (bool causal : {false, true})
    for (auto variant :
         {tg::kernels::attention_backward::atomic_dq, tg::kernels::attention_backward::two_pass}) {
      tg::owned_tensor<tg::bf16> q({B, H, N, D}, "q"), k({B, H, N, D}, "k"), v({B, H, N, D}, "v"),
          d_o({B, H, N, D}, "do"), o({B, H, N, D}, "o"), dq({B, H, N, D}), dk({B, H, N, D}),
          dv({B, H, N, D});
      tg::owned_tensor<float> lse({B, H, N}, "lse");
      fill(q, 1);
      fill(k, 2);
      fill(v, 3);
      fill(d_o, 4);
      tg::kernels::attention_options const opt{.causal = causal};
      tg::kernels::flash_attention_forward<tg::bf16>(q, k, v, o.view(), lse.view(), opt);
      tg::kernels::flash_attention_backward<tg::bf16>(q, k, v, o, d_o, lse, dq.view(), dk.view(),
                                                      dv.view(), opt, variant);
      // The fp32 path on the rounded values.
      auto widen = [](tg::owned_tensor<tg::bf16> const& t) {
        tg::owned_tensor<float> w(t.view().shape().data(), 4, t.name());
        for (std::int64_t i = 0; i < t.numel(); ++i)
          w.data()[i] = static_cast<float>(t.data()[i]);
        return w;
      };
      auto const qf = widen(q), kf = widen(k), vf = widen(v), dof = widen(d_o);
      tg::owned_tensor<float> of({B, H, N, D}), lf({B, H, N}), dqf({B, H, N, D}), dkf({B, H, N, D}),
          dvf({B, H, N, D});
      tg::kernels::flash_attention_forward<float>(qf, kf, vf, of.view(), lf.view(), opt);
      tg::kernels::flash_attention_backward<float>(qf, kf, vf, of, dof, lf, dqf.view(), dkf.view(),
                                                   dvf.view(), opt, variant);
      for (auto [got, want, name] :
           {std::tuple{&dq, &dqf, "dq"}, {&dk, &dkf, "dk"}, {&dv, &dvf, "dv"}}) {
        double err = 0, scale = 0;
        for (std::int64_t i = 0; i < want->numel(); ++i) {
          err =
              std::max(err, std::abs(double(static_cast<float>(got->data()[i])) - want->data()[i]));
          scale = std::max(scale, std::abs(double(want->data()[i])));
        }
        // o is stored in bf16 (2^-9 relative), so delta = rowsum(do * o) carries that error
        // into every gradient; P and dS are rounded to bf16 before their products, and the
        // result once more. Measured: at most 0.0052 * max|want| (0.0033 with P and dS kept in
        // fp32).
        EXPECT_LT(err, 1e-2 * scale)
            << name << " causal=" << causal << " variant " << static_cast<int>(variant);
        EXPECT_GT(scale, 0.0) << name;
      }
    }
}

TEST(FlashAttentionForward, ShapeMismatchesAreReportedBeforeAnyProgramRuns) {
  tg::owned_tensor<float> q({1, 2, 10, 64}, "q"), k({1, 2, 12, 32}, "k"), v({1, 2, 12, 64}, "v"),
      o({1, 2, 10, 64}, "o"), lse({1, 2, 10}, "lse"), k2({1, 2, 12, 64}, "k"),
      v2({1, 2, 11, 64}, "v"), q48({1, 2, 10, 48}, "q");
  o.view()(0, 0, 0, 0) = 42; // must stay: nothing runs
  auto msg =
      error_of([&] { tg::kernels::flash_attention_forward<float>(q, k, v, o.view(), lse.view()); });
  EXPECT_NE(msg.find("key 'k' has head dim 32 but 'q' has 64"), std::string::npos) << msg;
  msg = error_of(
      [&] { tg::kernels::flash_attention_forward<float>(q, k2, v2, o.view(), lse.view()); });
  EXPECT_NE(msg.find("value 'v' has rows 11 but 'k' has 12"), std::string::npos) << msg;
  msg = error_of(
      [&] { tg::kernels::flash_attention_forward<float>(q48, q48, q48, q48.view(), lse.view()); });
  EXPECT_NE(msg.find("head dim 48"), std::string::npos) << msg;
  tg::owned_tensor<float> lse_bad({1, 2, 9}, "lse");
  msg = error_of(
      [&] { tg::kernels::flash_attention_forward<float>(q, k2, k2, o.view(), lse_bad.view()); });
  EXPECT_NE(msg.find("logsumexp 'lse' has rows 9 but 'q' has 10"), std::string::npos) << msg;
  EXPECT_EQ(o.view()(0, 0, 0, 0), 42);
}

} // namespace

TEST(FlashAttentionForward, EntryPointLaunchesThePublicTileSizes) {
  // The entry point's o and lse, bit for bit, are those of the kernel launched by hand with
  // attention_block_q<D> x attention_block_k<D> tiles; other key tiles rescale the online
  // softmax at other places and give other bits. D = 128, where the query tile is not 64 rows.
  constexpr int D = 128, BQ = tg::kernels::attention_block_q<D>,
                BK = tg::kernels::attention_block_k<D>;
  std::int64_t const B = 1, H = 2, N = 150;
  tg::owned_tensor<float> q({B, H, N, D}), k({B, H, N, D}), v({B, H, N, D}), o({B, H, N, D}),
      o_hand({B, H, N, D}), o_other({B, H, N, D}), lse({B, H, N}), lse_hand({B, H, N}),
      lse_other({B, H, N});
  fill(q, 11);
  fill(k, 12);
  fill(v, 13);
  tg::kernels::flash_attention_forward<float>(q, k, v, o.view(), lse.view(), {.causal = true});
  double const scale = 1 / std::sqrt(double(D));
  auto const grid = [&](int bq) { return tg::grid(tg::cdiv<int>(int(N), bq), int(H), int(B)); };
  tg::launch(grid(BQ), tg::kernels::flash_attention_fwd<D, BQ, BK, true>, q.cview(), k.cview(),
             v.cview(), o_hand.view(), lse_hand.view(), scale);
  EXPECT_TRUE(std::equal(o.begin(), o.end(), o_hand.begin()));
  EXPECT_TRUE(std::equal(lse.begin(), lse.end(), lse_hand.begin()));
  // The comparison can fail: key tiles of half the size give other bits.
  tg::launch(grid(BQ), tg::kernels::flash_attention_fwd<D, BQ, BK / 2, true>, q.cview(), k.cview(),
             v.cview(), o_other.view(), lse_other.view(), scale);
  EXPECT_FALSE(std::equal(o.begin(), o.end(), o_other.begin()));
}

} // namespace test_flash_attention
