// Block-sparse attention forward against a plain attention in double restricted to the listed
// blocks (scores materialised), fp32, on row counts that do not fill the blocks, with random
// block tables (per batch and head, or shared), query blocks that list nothing, listed blocks in
// any order; keys outside the listed blocks are never read; and the host checks of the block
// table (shapes, counts, indices out of range, a block listed twice) before any program runs.
#include <tilegrad/kernels/block_sparse_attention.hpp>
#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest.h>

#include "../support/attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_block_sparse_attention {

namespace tg = tilegrad;
using test_support::error_of;
namespace tk = tilegrad::kernels;

namespace {

void fill(tg::owned_tensor<float>& t, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1, 1);
  for (float& v : t)
    v = d(rng);
}

// A random table of `rows` x `cols` blocks: each block kept with probability `density`, the rows
// in `empty` listing nothing; odd rows list their blocks in decreasing order, and the entries
// past a row's count hold values no check may look at.
tk::block_table random_table(std::int64_t bt, std::int64_t ht, std::int64_t rows, std::int64_t cols,
                             double density, unsigned seed,
                             std::vector<std::int64_t> const& empty = {}) {
  std::mt19937 rng(seed);
  std::bernoulli_distribution keep(density);
  std::vector<char> on(static_cast<std::size_t>(bt * ht * rows * cols));
  for (auto& x : on)
    x = keep(rng);
  auto t = tk::make_block_table(bt, ht, rows, cols, [&](auto b, auto h, auto r, auto c) {
    bool const none = std::find(empty.begin(), empty.end(), r) != empty.end();
    return !none && on[static_cast<std::size_t>(((b * ht + h) * rows + r) * cols + c)];
  });
  for (std::int64_t b = 0; b < bt; ++b)
    for (std::int64_t h = 0; h < ht; ++h)
      for (std::int64_t r = 0; r < rows; ++r) {
        std::int32_t* row = &t.index(b, h, r, 0);
        std::int32_t const n = t.count(b, h, r);
        if (r % 2)
          std::reverse(row, row + n);
        for (std::int64_t j = n; j < t.index.size(3); ++j)
          row[j] = j % 2 ? -7 : 12345;
      }
  return t;
}

// Whether query block qb of batch b, head h lists key block kb (shared axes of size 1).
bool listed(tk::block_table const& t, std::int64_t b, std::int64_t h, std::int64_t qb,
            std::int64_t kb) {
  b = t.count.size(0) == 1 ? 0 : b;
  h = t.count.size(1) == 1 ? 0 : h;
  for (std::int32_t j = 0; j < t.count(b, h, qb); ++j)
    if (t.index(b, h, qb, j) == kb)
      return true;
  return false;
}

// o and lse of attention to the keys of the listed blocks, in double from the stored values;
// a row with no keys has o = 0 and lse = -inf.
struct fwd_case {
  std::int64_t B, H, N, M;
  std::int64_t bt, ht; // table batch and heads: B or 1, H or 1
  double density;
  unsigned seed;
  std::vector<std::int64_t> empty = {};
  bool causal = false;
};

// Returns the number of rows with no key (lse = -inf).
template <int D, int BQ, int BK>
int check_forward(fwd_case const& c) {
  tg::owned_tensor<float> q({c.B, c.H, c.N, D}, "q"), k({c.B, c.H, c.M, D}, "k"),
      v({c.B, c.H, c.M, D}, "v"), o({c.B, c.H, c.N, D}, "o"), lse({c.B, c.H, c.N}, "lse");
  fill(q, c.seed);
  fill(k, c.seed + 1);
  fill(v, c.seed + 2);
  auto const t = random_table(c.bt, c.ht, tg::cdiv<std::int64_t>(c.N, BQ),
                              tg::cdiv<std::int64_t>(c.M, BK), c.density, c.seed, c.empty);
  if constexpr (BQ == tk::block_sparse_block && BK == BQ) // the entry point's default blocks
    tk::block_sparse_attention_forward<float>(q, k, v, t.count, t.index, o.view(), lse.view(),
                                              {.causal = c.causal});
  else
    tk::block_sparse_attention_forward<float, BQ, BK>(q, k, v, t.count, t.index, o.view(),
                                                      lse.view(), {.causal = c.causal});
  std::vector<double> ro, rl;
  test_support::reference_attention(
      q, k, v, 1.0 / std::sqrt(double(D)),
      [&](auto b, auto h, std::int64_t i, std::int64_t j) {
        return listed(t, b, h, i / BQ, j / BK) && (!c.causal || j <= i);
      },
      ro, rl);
  double err_o = 0, err_l = 0;
  int no_keys = 0;
  for (std::int64_t i = 0; i < o.numel(); ++i)
    err_o = std::max(err_o, std::abs(o.data()[i] - ro[static_cast<std::size_t>(i)]));
  for (std::int64_t i = 0; i < lse.numel(); ++i) {
    double const want = rl[static_cast<std::size_t>(i)];
    if (std::isinf(want)) {
      EXPECT_EQ(lse.data()[i], want) << "row " << i; // a query with no keys
      ++no_keys;
    } else
      err_l = std::max(err_l, std::abs(lse.data()[i] - want));
  }
  auto const what = "D=" + std::to_string(D) + " BQ=" + std::to_string(BQ) +
                    " BK=" + std::to_string(BK) + " N=" + std::to_string(c.N) +
                    " Nk=" + std::to_string(c.M) + " seed=" + std::to_string(c.seed);
  EXPECT_LT(err_o, 2e-6) << what;
  EXPECT_LT(err_l, 2e-6) << what;
  return no_keys;
}

TEST(BlockSparseAttentionForward, Float32MatchesPlainAttentionOnTheListedBlocks) {
  // 100 rows: 7 blocks of 16, the last of 4 rows.
  for (unsigned seed : {1u, 2u, 3u})
    check_forward<16, 16, 16>({2, 3, 100, 100, 2, 3, 0.4, seed, {seed}});
  check_forward<16, 16, 16>({1, 2, 100, 100, 1, 2, 1.0, 4});     // every block: dense attention
  check_forward<64, 16, 16>({1, 2, 70, 150, 1, 2, 0.5, 5, {0}}); // more keys than queries
  check_forward<32, 16, 16>({1, 1, 1, 1, 1, 1, 1.0, 6});         // one query, one key
}

TEST(BlockSparseAttentionForward, DefaultBlocksAreBlockSparseBlock) {
  // The entry point without block sizes, on a table written in blocks of block_sparse_block
  // rows (150 rows: 3 blocks, the last of 22): a table in other units is refused or misread.
  constexpr int B = tk::block_sparse_block;
  check_forward<16, B, B>({1, 2, 150, 150, 1, 2, 0.7, 12, {1}});
}

TEST(BlockSparseAttentionForward, TablesSharedByBatchesAndHeads) {
  check_forward<16, 16, 16>({3, 2, 100, 90, 1, 1, 0.5, 7, {2}});
  check_forward<16, 16, 16>({3, 2, 100, 90, 1, 2, 0.5, 8, {6}});
  check_forward<16, 16, 16>({3, 2, 100, 90, 3, 1, 0.5, 9});
}

TEST(BlockSparseAttentionForward, QueryAndKeyBlocksOfDifferentSizes) {
  check_forward<32, 32, 16>({2, 2, 100, 77, 2, 2, 0.5, 10, {1}});
  check_forward<128, 32, 16>({1, 1, 40, 130, 1, 1, 0.3, 11});
}

TEST(BlockSparseAttentionForward, CausalWithinTheListedBlocks) {
  // Random tables list blocks past the diagonal too: queries whose listed keys all lie after
  // them have no key (o = 0, lse = -inf), whichever order the blocks come in.
  int no_keys = 0;
  for (unsigned seed : {21u, 22u, 23u})
    no_keys += check_forward<16, 16, 16>({2, 2, 100, 100, 2, 2, 0.5, seed, {}, true});
  EXPECT_GT(no_keys, 0);
  check_forward<16, 16, 16>({1, 2, 100, 100, 1, 2, 1.0, 24, {}, true}); // causal attention
  check_forward<32, 32, 16>({1, 2, 100, 77, 1, 2, 0.5, 25, {1}, true}); // blocks of two sizes
  check_forward<16, 16, 16>({1, 1, 40, 130, 1, 1, 0.5, 26, {}, true}); // more keys than queries
}

TEST(BlockSparseAttentionForward, EveryQueryBlockEmptyGivesZeroAndMinusInfinity) {
  tg::owned_tensor<float> q({1, 2, 50, 16}, "q"), o({1, 2, 50, 16}, "o"), lse({1, 2, 50}, "lse");
  fill(q, 12);
  fill(o, 13);
  // max_blocks 0: a table with no room for any block.
  tg::owned_tensor<std::int32_t> count({1, 1, 4}, "kv_count"), index({1, 1, 4, 0}, "kv_index");
  tk::block_sparse_attention_forward<float, 16, 16>(q, q, q, count, index, o.view(), lse.view());
  for (float x : o)
    EXPECT_EQ(x, 0.0f);
  for (float x : lse)
    EXPECT_EQ(x, -std::numeric_limits<float>::infinity());
}

TEST(BlockSparseAttentionForward, KeysOutsideTheListedBlocksAreNeverRead) {
  std::int64_t const N = 100, M = 100;
  tg::owned_tensor<float> q({1, 1, N, 16}, "q"), k({1, 1, M, 16}, "k"), v({1, 1, M, 16}, "v"),
      o({1, 1, N, 16}, "o"), lse({1, 1, N}, "lse");
  fill(q, 14);
  fill(k, 15);
  fill(v, 16);
  // A local window of one block each side over key blocks 0-4, and NaNs in key blocks 5 and 6,
  // which nobody lists; query block 6 lists nothing.
  auto const t = tk::make_block_table(
      1, 1, 7, 7, [](auto, auto, auto r, auto c) { return c <= 4 && c + 1 >= r && c <= r + 1; });
  for (std::int64_t j = 80; j < M; ++j)
    k(0, 0, j, 3) = v(0, 0, j, 5) = std::numeric_limits<float>::quiet_NaN();
  tk::block_sparse_attention_forward<float, 16, 16>(q, k, v, t.count, t.index, o.view(),
                                                    lse.view());
  std::vector<double> ro, rl;
  test_support::reference_attention(
      q, k, v, 0.25,
      [&](auto b, auto h, std::int64_t i, std::int64_t j) {
        return listed(t, b, h, i / 16, j / 16);
      },
      ro, rl);
  for (std::int64_t i = 0; i < o.numel(); ++i) {
    ASSERT_NEAR(o.data()[i], ro[static_cast<std::size_t>(i)], 2e-6) << i;
  }
  for (std::int64_t i = 96; i < N; ++i)
    EXPECT_EQ(lse(0, 0, i), -std::numeric_limits<float>::infinity());
}

TEST(BlockSparseAttentionForward, BadBlockTablesAreReportedBeforeAnyProgramRuns) {
  // N = 100, Nk = 70 rows: 7 query blocks and 5 key blocks of 16.
  tg::owned_tensor<float> q({2, 2, 100, 16}, "q"), k({2, 2, 70, 16}, "k"), v({2, 2, 70, 16}, "v"),
      o({2, 2, 100, 16}, "o"), lse({2, 2, 100}, "lse");
  o(1, 1, 99, 15) = 42; // must stay: nothing runs
  auto run = [&](tk::block_table const& t) {
    return error_of([&] {
      tk::block_sparse_attention_forward<float, 16, 16>(q, k, v, t.count, t.index, o.view(),
                                                        lse.view());
    });
  };
  auto table = [](std::int64_t bt, std::int64_t ht, std::int64_t rows) {
    return tk::make_block_table(bt, ht, rows, 5,
                                [](auto, auto, auto r, auto c) { return c == r % 5 || c == 0; });
  };
  auto expect = [](std::string const& msg, std::string const& part) {
    EXPECT_NE(msg.find(part), std::string::npos) << msg;
  };

  auto t = table(2, 2, 7);
  t.index(1, 0, 3, 1) = 5;
  expect(run(t), "kv_index 'kv_index' at (1, 0, 3, 1) is 5, not a key block in [0, 5) ('k' has "
                 "70 rows, key blocks of 16)");
  t.index(1, 0, 3, 1) = -1;
  expect(run(t), "kv_index 'kv_index' at (1, 0, 3, 1) is -1, not a key block in [0, 5)");
  t.index(1, 0, 3, 1) = 0;
  expect(run(t), "kv_index 'kv_index' at (1, 0, 3, 1) is 0, listed before at (1, 0, 3, 0)");
  t.index(1, 0, 3, 1) = 3;

  t.count(0, 1, 6) = 3;
  expect(run(t), "kv_count 'kv_count' at (0, 1, 6) is 3, more than the 2 blocks kv_index "
                 "'kv_index' holds per query block");
  t.count(0, 1, 6) = -2;
  expect(run(t), "kv_count 'kv_count' at (0, 1, 6) is -2, negative");

  expect(run(table(2, 2, 6)), "kv_count 'kv_count' has shape (2, 2, 6), expected (2 or 1, 2 or 1, "
                              "7) for 'q' of shape (2, 2, 100, 16) in query blocks of 16");
  expect(run(table(3, 1, 7)), "kv_count 'kv_count' has shape (3, 1, 7)");
  auto u = table(1, 2, 7);
  u.index = tg::owned_tensor<std::int32_t>({1, 1, 7, 2}, "blocks");
  expect(run(u), "kv_index 'blocks' has shape (1, 1, 7, 2), expected (1, 2, 7, max blocks) as "
                 "kv_count 'kv_count'");
  u.index = tg::owned_tensor<std::int32_t>({1, 2, 7}, "blocks");
  expect(run(u), "kv_index 'blocks' must have rank 4");
  // The shape checks shared with flash attention speak of this kernel.
  auto const w = table(1, 1, 7);
  expect(error_of([&] {
           tk::block_sparse_attention_forward<float, 16, 16>(q, k, q, w.count, w.index, o.view(),
                                                             lse.view());
         }),
         "tilegrad::block_sparse_attention: value 'q' has rows 100 but 'k' has 70");
  EXPECT_EQ(o(1, 1, 99, 15), 42);
  t.count(0, 1, 6) = 2;
  EXPECT_EQ(run(t), "(no error)");
}

// Tables given as strided views: the index stored transposed (its last axis of stride `rows`),
// the count as one column of a two-column buffer. The kernels read an entry at a raw element
// offset, without the stride: the forward and dq read their neighbours' entries with no error
// (o off by up to 1.5) or past the buffer. Now the same bits as the contiguous table.
TEST(BlockSparseAttention, StridedTablesReadTheirOwnEntries) {
  constexpr int BS = 16;
  int const B = 1, H = 2, N = 100, M = 90;
  std::int64_t const rows = tg::cdiv(N, BS), cols = tg::cdiv(M, BS);
  auto const t = random_table(1, H, rows, cols, 0.5, 7, {3});
  std::int64_t const mx = t.index.size(3);
  std::vector<std::int32_t> index_t(static_cast<std::size_t>(H * mx * rows), -5),
      count2(static_cast<std::size_t>(H * rows * 2), 99);
  for (int h = 0; h < H; ++h)
    for (std::int64_t r = 0; r < rows; ++r) {
      count2[static_cast<std::size_t>((h * rows + r) * 2)] = t.count(0, h, r);
      for (std::int64_t j = 0; j < mx; ++j)
        index_t[static_cast<std::size_t>((h * mx + j) * rows + r)] = t.index(0, h, r, j);
    }
  tg::tensor<std::int32_t const> const index(index_t.data(), {1, H, rows, mx},
                                             {H * mx * rows, mx * rows, 1, rows}, "kv_index");
  tg::tensor<std::int32_t const> const count(count2.data(), {1, H, rows},
                                             {H * rows * 2, rows * 2, 2}, "kv_count");
  tg::owned_tensor<float> q({B, H, N, 32}, "q"), k({B, H, M, 32}, "k"), v({B, H, M, 32}, "v"),
      d_o({B, H, N, 32}, "do");
  fill(q, 1), fill(k, 2), fill(v, 3), fill(d_o, 4);
  struct result {
    tg::owned_tensor<float> o, lse, dq, dk, dv;
  };
  auto const run = [&](tg::tensor<std::int32_t const> c, tg::tensor<std::int32_t const> x) {
    result r{tg::owned_tensor<float>({B, H, N, 32}), tg::owned_tensor<float>({B, H, N}),
             tg::owned_tensor<float>({B, H, N, 32}), tg::owned_tensor<float>({B, H, M, 32}),
             tg::owned_tensor<float>({B, H, M, 32})};
    tk::block_sparse_options const opt{.causal = true};
    tk::block_sparse_attention_forward<float, BS, BS>(q, k, v, c, x, r.o.view(), r.lse.view(), opt);
    tk::block_sparse_attention_backward<float, BS, BS>(q, k, v, r.o, d_o, r.lse, c, x, r.dq.view(),
                                                       r.dk.view(), r.dv.view(), opt);
    return r;
  };
  auto const want = run(t.count, t.index);
  auto const got = run(count, index);
  auto const same = [](tg::owned_tensor<float> const& a, tg::owned_tensor<float> const& b) {
    return std::equal(a.begin(), a.end(), b.begin(),
                      [](float x, float y) { return std::memcmp(&x, &y, sizeof x) == 0; });
  };
  EXPECT_TRUE(same(got.o, want.o));
  EXPECT_TRUE(same(got.lse, want.lse));
  EXPECT_TRUE(same(got.dq, want.dq));
  EXPECT_TRUE(same(got.dk, want.dk));
  EXPECT_TRUE(same(got.dv, want.dv));
}

} // namespace

} // namespace test_block_sparse_attention
