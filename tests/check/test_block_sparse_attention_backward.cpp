// check_backward on block-sparse attention: the hand-written backward (a key-block pass for dK
// and dV through the transposed table, a query-block pass for dQ) passes against the reference
// gradients of the forward kernel, whose loops and key offsets come from the block table, on
// random tables with query blocks that list nothing and row counts that do not fill the blocks;
// broken variants fail where the bug sits.
#include <tilegrad/check/gtest.hpp>
#include <tilegrad/kernels/block_sparse_attention.hpp>
#include <tilegrad/tilegrad.hpp>

#include <gtest/gtest.h>

#include "../support/mismatch_region.hpp"

#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

// The file's own namespace: the tests of a folder are compiled together (tests/CMakeLists.txt).
namespace test_block_sparse_attention_backward {

namespace tg = tilegrad;
namespace tk = tilegrad::kernels;

namespace {

constexpr int D = 16, BQ = 16, BK = 16;

double scale() {
  return 1 / std::sqrt(double(D));
}

// A random table: each block kept with probability `density`, the query blocks in `empty`
// listing nothing.
tk::block_table random_table(std::int64_t bt, std::int64_t ht, std::int64_t rows, std::int64_t cols,
                             double density, unsigned seed,
                             std::vector<std::int64_t> const& empty = {}) {
  std::mt19937 rng(seed);
  std::bernoulli_distribution keep(density);
  std::vector<char> on(static_cast<std::size_t>(bt * ht * rows * cols));
  for (auto& x : on)
    x = keep(rng);
  return tk::make_block_table(bt, ht, rows, cols, [&](auto b, auto h, auto r, auto c) {
    for (auto e : empty)
      if (r == e)
        return false;
    return on[static_cast<std::size_t>(((b * ht + h) * rows + r) * cols + c)] != 0;
  });
}

// Each query block sees the first key block, its own and its neighbours.
tk::block_table local_and_global(std::int64_t rows, std::int64_t cols) {
  return tk::make_block_table(1, 1, rows, cols, [](auto, auto, auto r, auto c) {
    return c == 0 || (c + 1 >= r && c <= r + 1);
  });
}

enum class bug {
  none,
  last_block_skipped,
  head_table_ignored,
  key_edge_off_by_one,
  causal_mask_missing // in the dq pass of a causal backward
};

// The query-block pass of tk::block_sparse_attention_bwd_dq written out again (without the
// causal mask), with one bug.
template <bug B>
constexpr auto broken_dq =
    []<class T>(tg::program const& p, tg::tensor<T const> q, tg::tensor<T const> k,
                tg::tensor<T const> v, tg::tensor<T const> d_o, tg::tensor<T const> lse,
                tg::tensor<T const> delta, tg::tensor<std::int32_t const> kv_count,
                tg::tensor<std::int32_t const> kv_index, tg::tensor<T> dq, double scale) {
      int const qb = p.program_id(0), q0 = qb * BQ, h = p.program_id(1), b = p.program_id(2);
      int const n_k = static_cast<int>(k.size(2));
      int const bt = kv_count.size(0) == 1 ? 0 : b;
      int const ht = B == bug::head_table_ignored || kv_count.size(1) == 1 ? 0 : h;
      int const count = tg::load(kv_count[bt][ht] + qb).item();
      auto const listed = kv_index[bt][ht][qb];
      auto const qi = tg::load(tg::make_block_ptr<BQ, D>(q[b][h], {q0, 0}), tg::bounds<0>);
      auto const doi = tg::load(tg::make_block_ptr<BQ, D>(d_o[b][h], {q0, 0}), tg::bounds<0>);
      auto const li = tg::load(tg::make_block_ptr<BQ>(lse[b][h], {q0}), tg::bounds<0>);
      auto const di = tg::load(tg::make_block_ptr<BQ>(delta[b][h], {q0}), tg::bounds<0>);
      auto acc = tg::zeros<T, BQ, D>();
      int const end = B == bug::last_block_skipped ? count - 1 : count;
      for (int i = 0; i < end; ++i) {
        int const k0 = tg::load(listed + i).item() * BK;
        auto const kj = tg::load(tg::make_block_ptr<BK, D>(k[b][h], {k0, 0}), tg::bounds<0>);
        auto const vj = tg::load(tg::make_block_ptr<BK, D>(v[b][h], {k0, 0}), tg::bounds<0>);
        auto const keys = tg::row(k0 + tg::arange<0, BK>()) < n_k;
        tg::tile<T, BQ, BK> pt = tg::exp(tg::dot(qi, tg::trans(kj)) * scale - tg::col(li));
        pt = tg::where(keys, pt, 0.0f);
        tg::tile<T, BQ, BK> const ds = pt * (tg::dot(doi, tg::trans(vj)) - tg::col(di)) * scale;
        acc = tg::dot(ds, kj, std::move(acc));
      }
      tg::store(tg::make_block_ptr<BQ, D>(dq[b][h], {q0, 0}), acc, tg::bounds<0>);
    };

// The key-block pass of tk::block_sparse_attention_bwd_dkdv, with a key mask one short.
constexpr auto broken_dkdv =
    []<class T>(tg::program const& p, tg::tensor<T const> q, tg::tensor<T const> k,
                tg::tensor<T const> v, tg::tensor<T const> d_o, tg::tensor<T const> lse,
                tg::tensor<T const> delta, tg::tensor<std::int32_t const> q_count,
                tg::tensor<std::int32_t const> q_index, tg::tensor<T> dk, tg::tensor<T> dv,
                double scale) {
      int const kb = p.program_id(0), k0 = kb * BK, h = p.program_id(1), b = p.program_id(2);
      int const n_k = static_cast<int>(k.size(2));
      int const bt = q_count.size(0) == 1 ? 0 : b, ht = q_count.size(1) == 1 ? 0 : h;
      int const count = tg::load(q_count[bt][ht] + kb).item();
      auto const listed = q_index[bt][ht][kb];
      auto const kj = tg::load(tg::make_block_ptr<BK, D>(k[b][h], {k0, 0}), tg::bounds<0>);
      auto const vj = tg::load(tg::make_block_ptr<BK, D>(v[b][h], {k0, 0}), tg::bounds<0>);
      auto dk_acc = tg::zeros<T, BK, D>();
      auto dv_acc = tg::zeros<T, BK, D>();
      for (int i = 0; i < count; ++i) {
        int const q0 = tg::load(listed + i).item() * BQ;
        auto const qi = tg::load(tg::make_block_ptr<BQ, D>(q[b][h], {q0, 0}), tg::bounds<0>);
        auto const doi = tg::load(tg::make_block_ptr<BQ, D>(d_o[b][h], {q0, 0}), tg::bounds<0>);
        auto const li = tg::load(tg::make_block_ptr<BQ>(lse[b][h], {q0}), tg::bounds<0>);
        auto const di = tg::load(tg::make_block_ptr<BQ>(delta[b][h], {q0}), tg::bounds<0>);
        auto const keys = tg::row(k0 + tg::arange<0, BK>()) < n_k - 1; // the bug: one key short
        tg::tile<T, BQ, BK> pt = tg::exp(tg::dot(qi, tg::trans(kj)) * scale - tg::col(li));
        pt = tg::where(keys, pt, 0.0f);
        tg::tile<T, BQ, BK> const ds = pt * (tg::dot(doi, tg::trans(vj)) - tg::col(di)) * scale;
        dv_acc = tg::dot(tg::trans(pt), doi, std::move(dv_acc));
        dk_acc = tg::dot(tg::trans(ds), qi, std::move(dk_acc));
      }
      tg::store(tg::make_block_ptr<BK, D>(dk[b][h], {k0, 0}), dk_acc, tg::bounds<0>);
      tg::store(tg::make_block_ptr<BK, D>(dv[b][h], {k0, 0}), dv_acc, tg::bounds<0>);
    };

// With no bug and the default blocks, the host entry point; otherwise its three launches
// written out, the broken pass in place of the good one.
template <bug B, int Q = BQ, int K = BK, bool Causal = false>
auto backward(tg::tensor<float const> lse, tk::block_table const& t) {
  return [lse, count = t.count.cview(), index = t.index.cview()](tg::backward_context<float>& ctx) {
    auto const q = ctx.input("q"), k = ctx.input("k"), v = ctx.input("v");
    auto const o = ctx.output("o"), d_o = ctx.cotangent("o");
    tg::owned_tensor<float> dq(q.shape().data(), 4), dk(k.shape().data(), 4),
        dv(v.shape().data(), 4);
    if constexpr (B == bug::none && Q == BQ && K == BK) {
      tk::block_sparse_attention_backward<float, BQ, BK>(
          q, k, v, o, d_o, lse, count, index, dq.view(), dk.view(), dv.view(),
          {.causal = Causal, .launch = ctx.options()});
    } else {
      tg::owned_tensor<float> delta({q.size(0), q.size(1), q.size(2)});
      auto const queries =
          tg::grid(tg::cdiv<int>(int(q.size(2)), Q), int(q.size(1)), int(q.size(0)));
      auto const keys = tg::grid(tg::cdiv<int>(int(k.size(2)), K), int(k.size(1)), int(k.size(0)));
      tg::launch(ctx.options(), queries, tk::flash_attention_bwd_delta<D, Q>, o, d_o, delta.view());
      auto const by_key = tk::block_sparse_transpose(count, index, keys.dims[0]);
      if constexpr (B == bug::key_edge_off_by_one)
        tg::launch(ctx.options(), keys, broken_dkdv, q, k, v, d_o, lse, delta.cview(),
                   by_key.count.cview(), by_key.index.cview(), dk.view(), dv.view(), scale());
      else
        tg::launch(ctx.options(), keys, tk::block_sparse_attention_bwd_dkdv<D, Q, K, Causal>, q, k,
                   v, d_o, lse, delta.cview(), by_key.count.cview(), by_key.index.cview(),
                   dk.view(), dv.view(), scale());
      if constexpr (B == bug::last_block_skipped || B == bug::head_table_ignored ||
                    B == bug::causal_mask_missing)
        tg::launch(ctx.options(), queries, broken_dq<B>, q, k, v, d_o, lse, delta.cview(), count,
                   index, dq.view(), scale());
      else
        tg::launch(ctx.options(), queries, tk::block_sparse_attention_bwd_dq<D, Q, K, Causal>, q, k,
                   v, d_o, lse, delta.cview(), count, index, dq.view(), scale());
    }
    ctx.set_gradient("q", dq);
    ctx.set_gradient("k", dk);
    ctx.set_gradient("v", dv);
  };
}

struct problem {
  std::int64_t batch, heads, n, nk;
};

template <bug B, int Q = BQ, int K = BK, bool Causal = false>
tg::check_report check(problem s, tk::block_table const& t, int seeds = 3) {
  tg::owned_tensor<float> q({s.batch, s.heads, s.n, D}), k({s.batch, s.heads, s.nk, D}),
      v({s.batch, s.heads, s.nk, D}), o({s.batch, s.heads, s.n, D}),
      lse({s.batch, s.heads, s.n}, "lse");
  auto const g = tg::grid(tg::cdiv<int>(int(s.n), Q), int(s.heads), int(s.batch));
  return tg::check_backward(
      tg::forward(g, tk::block_sparse_attention_fwd<D, Q, K, Causal>, tg::in("q", q),
                  tg::in("k", k), tg::in("v", v), t.count, t.index, tg::out("o", o), lse.view(),
                  scale()),
      backward<B, Q, K, Causal>(lse.cview(), t), {.seeds = seeds, .inputs = tg::uniform(-2, 2)});
}

// The query blocks (of one batch and head, rows of 16) with a mismatch in the report's block map
// (cells of 8 rows at 100 rows), as "0 2 3".
std::string bad_query_blocks(tg::gradient_report const* g) {
  std::string out;
  std::int64_t last = -1;
  for (int i = 0; i < g->map.cell_rows(); ++i) {
    std::int64_t const block = g->map.first_row(i) / BQ;
    bool marked = false;
    for (int j = 0; j < g->map.cell_cols(); ++j)
      marked = marked || g->map.mismatches(i, j) > 0;
    if (marked && block != last)
      out.append(out.empty() ? "" : " ").append(std::to_string(block));
    if (marked)
      last = block;
  }
  return out;
}

// The query blocks of a one-batch, one-head table that list at least one key block.
std::string nonempty_query_blocks(tk::block_table const& t) {
  std::string out;
  for (std::int64_t r = 0; r < t.count.size(2); ++r)
    if (t.count(0, 0, r) > 0)
      out.append(out.empty() ? "" : " ").append(std::to_string(r));
  return out;
}

} // namespace

TEST(CheckBlockSparseAttention, BackwardPassesOnRandomTables) {
  // 100 rows: 7 query and key blocks of 16, the last of 4 rows; one query block lists nothing.
  for (unsigned seed : {1u, 2u, 3u})
    EXPECT_BACKWARD_OK(
        check<bug::none>({2, 2, 100, 100}, random_table(2, 2, 7, 7, 0.4, seed, {seed + 2})))
        << "table seed " << seed;
  EXPECT_BACKWARD_OK(check<bug::none>({2, 2, 100, 70}, random_table(1, 1, 7, 5, 0.5, 4, {0})));
  EXPECT_BACKWARD_OK(check<bug::none>({1, 3, 40, 130}, random_table(1, 3, 3, 9, 0.3, 5, {1})));
}

TEST(CheckBlockSparseAttention, BackwardPassesWithQueryAndKeyBlocksOfDifferentSizes) {
  // Query blocks of 32 rows, key blocks of 16: 4 and 7 blocks, the last query block of 4 rows.
  EXPECT_BACKWARD_OK(
      (check<bug::none, 32, 16>({1, 2, 100, 100}, random_table(1, 2, 4, 7, 0.4, 8, {2}))));
}

TEST(CheckBlockSparseAttention, BackwardPassesOnALocalWindowWithAGlobalBlock) {
  EXPECT_BACKWARD_OK(check<bug::none>({1, 2, 100, 100}, local_and_global(7, 7)));
  EXPECT_BACKWARD_OK(check<bug::none>({1, 1, 3, 20}, local_and_global(1, 2)));
}

TEST(CheckBlockSparseAttention, SkippedLastListedBlockShowsInTheQueryBlocksThatListAny) {
  auto const t = random_table(1, 1, 7, 7, 0.4, 6, {1, 4});
  auto const r = check<bug::last_block_skipped>({1, 1, 100, 100}, t, 1);
  ASSERT_FALSE(r);
  // dq of every query block that lists a block is wrong; dk and dv come from the other pass.
  EXPECT_EQ(bad_query_blocks(r.gradient("q")), nonempty_query_blocks(t)) << r;
  EXPECT_EQ(nonempty_query_blocks(t), "0 3 5 6");
  EXPECT_TRUE(r.gradient("k")->ok);
  EXPECT_TRUE(r.gradient("v")->ok);
}

TEST(CheckBlockSparseAttention, HeadTableIgnoredShowsInTheSecondHeadOnly) {
  auto const t = random_table(1, 2, 7, 7, 0.5, 7);
  auto const blocks = [&](std::int64_t h, std::int64_t r) {
    std::string s;
    for (std::int32_t j = 0; j < t.count(0, h, r); ++j)
      s += std::to_string(t.index(0, h, r, j)) + " ";
    return s;
  };
  for (std::int64_t r = 0; r < 7; ++r) // every query block lists other blocks in head 1
    ASSERT_NE(blocks(0, r), blocks(1, r)) << "query block " << r;
  auto const r = check<bug::head_table_ignored>({1, 2, 100, 100}, t, 1);
  ASSERT_FALSE(r);
  // dq of head 1 (rows 100-199 of the report's 2-D view) follows head 0's table; dk and dv come
  // from the other pass.
  EXPECT_TRUE(test_support::mismatches_in(r.gradient("q"), 100, 199, 0, D - 1));
  EXPECT_TRUE(r.gradient("k")->ok);
  EXPECT_TRUE(r.gradient("v")->ok);
}

TEST(CheckBlockSparseAttention, KeyEdgeOffByOneShowsInTheLastKeyOnly) {
  auto const r = check<bug::key_edge_off_by_one>({1, 1, 100, 100}, local_and_global(7, 7), 1);
  ASSERT_FALSE(r);
  // The last key is dropped from dk and dv; dq comes from the other pass.
  EXPECT_TRUE(test_support::mismatches_in(r.gradient("k"), 99, 99, 0, D - 1));
  EXPECT_TRUE(test_support::mismatches_in(r.gradient("v"), 99, 99, 0, D - 1));
  EXPECT_TRUE(r.gradient("q")->ok);
}

TEST(CheckBlockSparseAttention, CausalBackwardPasses) {
  // Random tables list blocks past the diagonal as well: some queries (all of query block 2 in
  // the first table) have only keys after them, so no key at all.
  auto const t = random_table(1, 2, 7, 7, 0.5, 11);
  ASSERT_EQ(t.count(0, 0, 2), 1);
  ASSERT_EQ(t.index(0, 0, 2, 0), 5);
  EXPECT_BACKWARD_OK((check<bug::none, BQ, BK, true>({2, 2, 100, 100}, t)));
  EXPECT_BACKWARD_OK((check<bug::none, BQ, BK, true>({1, 2, 100, 100}, local_and_global(7, 7))));
  EXPECT_BACKWARD_OK(
      (check<bug::none, 32, 16, true>({1, 2, 100, 90}, random_table(1, 2, 4, 6, 0.6, 12))));
}

TEST(CheckBlockSparseAttention, CausalMaskMissingInTheDqPassShowsInDqOnly) {
  auto const r = check<bug::causal_mask_missing, BQ, BK, true>({1, 1, 100, 100},
                                                                local_and_global(7, 7), 1);
  ASSERT_FALSE(r);
  // Every query block lists its diagonal block and the next: each one's dq takes keys after its
  // queries. dk and dv come from the other pass.
  EXPECT_EQ(bad_query_blocks(r.gradient("q")), "0 1 2 3 4 5 6") << r;
  EXPECT_TRUE(r.gradient("k")->ok);
  EXPECT_TRUE(r.gradient("v")->ok);
}

TEST(CheckBlockSparseAttention, BackwardChecksTheTableBeforeAnyProgramRuns) {
  tg::owned_tensor<float> q({1, 1, 100, D}, "q"), lse({1, 1, 100}, "lse"), dq({1, 1, 100, D}, "dq");
  auto t = local_and_global(7, 7);
  t.index(0, 0, 4, 2) = 7;
  dq(0, 0, 0, 0) = 42; // must stay: nothing runs
  try {
    tk::block_sparse_attention_backward<float, BQ, BK>(q, q, q, q, q, lse, t.count, t.index,
                                                       dq.view(), dq.view(), dq.view());
    ADD_FAILURE() << "no error";
  } catch (std::invalid_argument const& e) {
    EXPECT_NE(std::string(e.what()).find("kv_index 'kv_index' at (0, 0, 4, 2) is 7, not a key "
                                         "block in [0, 7)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(dq(0, 0, 0, 0), 42);
}

} // namespace test_block_sparse_attention_backward
