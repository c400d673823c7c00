// Block-sparse attention: FlashAttention-2 where each query block attends only to the key blocks
// an integer block table lists (the layout of block-sparse FlashAttention and of FlexAttention's
// BlockMask). The kernels read their loop counts and key offsets from that table, so reverse
// mode follows control flow that depends on data. Tensors are (batch, heads, rows, head dim) as
// in flash_attention.hpp, whose helpers these kernels share.
//
// The block table. For a launch with query block BQ and key block BK:
//   kv_count  int32 (Bt, Ht, cdiv(N, BQ))              number of key blocks of each query block
//   kv_index  int32 (Bt, Ht, cdiv(N, BQ), max_blocks)  their indices, in [0, cdiv(Nk, BK))
// Query block i (rows i*BQ .. i*BQ+BQ-1) attends to key block j (keys j*BK .. j*BK+BK-1) iff j
// is among the first kv_count[b][h][i] entries of kv_index[b][h][i]. Bt is the batch size or 1,
// Ht the number of heads or 1: an axis of size 1 is shared by every batch (head). Entries past
// the count are neither read nor checked; a key block listed twice is an error; the order of
// the listed blocks does not matter. A query block that lists no key block has o = 0 and
// lse = -inf (no keys: the empty sum), and gradient 0 for its queries. The host entry points
// check the table (check_block_table) before any program runs; the kernels trust it.
//
// Causal (FlexAttention's causal mask_mod over a block mask): within the listed blocks, query
// i attends to key j only if j <= i. A query whose listed keys all lie after it has no keys:
// o = 0, lse = -inf and gradient 0, as for a query block that lists nothing.
//
// Backward without atomics (deterministic): the host transposes the table into q_count and
// q_index (for each key block, the query blocks that list it, in increasing order); one launch
// over key blocks computes dK and dV, one over query blocks computes dQ.
#pragma once

#include "tilegrad/core/types.hpp"
#include "tilegrad/grid/launch.hpp"
#include "tilegrad/grid/loop.hpp"
#include "tilegrad/grid/program.hpp"
#include "tilegrad/kernels/flash_attention.hpp"
#include "tilegrad/memory/block_ptr.hpp"
#include "tilegrad/memory/pointer.hpp"
#include "tilegrad/memory/tensor.hpp"
#include "tilegrad/tile/creation.hpp"
#include "tilegrad/tile/dot.hpp"
#include "tilegrad/tile/elementwise.hpp"
#include "tilegrad/tile/reduce.hpp"
#include "tilegrad/tile/shape_ops.hpp"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace tilegrad::kernels {

namespace detail {

/// The blocks that row block `row` of batch b, head h lists: how many, and the row of the index
/// tensor that holds them (a batch or head axis of size 1 is shared).
struct listed_blocks {
  int count;
  tensor<std::int32_t const> index;

  /// The i-th listed block, read from memory (i < count). (A pointer offset counts elements of
  /// memory: the index's stride too, so a strided view of a table reads its own elements; it
  /// read its neighbours', silently, or past the buffer.)
  int operator[](int i) const { return load(index + i * index.stride(0)).item(); }
};

inline listed_blocks listed(tensor<std::int32_t const> count, tensor<std::int32_t const> index,
                            int row, int h, int b) {
  int const bt = count.size(0) == 1 ? 0 : b, ht = count.size(1) == 1 ? 0 : h;
  auto const c = count[bt][ht];
  return {load(c + row * c.stride(0)).item(), index[bt][ht][row]};
}

/// What the forward shifts a row's scores by before exp: its running maximum m. Causal, a row
/// may have no key so far (its blocks so far lie after it), so m is still -inf and exp(-inf + inf)
/// would be a NaN: such a row shifts by 0 (its scores are all -inf).
template <bool Causal, class F, int BQ>
decltype(auto) score_shift(tile<F, BQ> const& m) {
  if constexpr (Causal)
    return tile<F, BQ>(where(m == neg_inf, 0.0f, m));
  else
    return (m);
}

} // namespace detail

/// Forward: o = softmax(scale * q kᵀ [causal mask]) v over the listed key blocks of each query
/// block, and lse = the rows' logsumexp, for q, o (B, H, N, D), k, v (B, H, Nk, D), lse (B, H, N)
/// and the block table kv_count, kv_index of blocks BQ x BK (see the top of this header).
/// Grid: (cdiv(N, BQ), H, B).
template <int D, int BQ, int BK, bool Causal = false>
inline constexpr auto block_sparse_attention_fwd =
    []<class T>(program const& p, tensor<T const> q, tensor<T const> k, tensor<T const> v,
                tensor<std::int32_t const> kv_count, tensor<std::int32_t const> kv_index,
                tensor<T> o, tensor<fp32<T>> lse, double scale) {
      using F = fp32<T>;
      int const qb = p.program_id(0), q0 = qb * BQ, h = p.program_id(1), b = p.program_id(2);
      auto const blocks = detail::listed(kv_count, kv_index, qb, h, b);
      auto const ob = make_block_ptr<BQ, D>(o[b][h], {q0, 0});
      auto const lb = make_block_ptr<BQ>(lse[b][h], {q0});
      if (blocks.count == 0) { // no keys: the empty sum
        store(ob, zeros<F, BQ, D>(), bounds<0>);
        store(lb, full<F, BQ>(F(detail::neg_inf)), bounds<0>);
        return;
      }
      auto const kh = k[b][h], vh = v[b][h];
      int const n_k = static_cast<int>(kh.size(0));
      tile<F, BQ, D> const qi = to<F>(load(make_block_ptr<BQ, D>(q[b][h], {q0, 0}), bounds<0>));
      auto m = full<F, BQ>(F(detail::neg_inf)); // running row maximum of the scores
      auto l = zeros<F, BQ>();                  // running row sum of exp(score - m)
      auto acc = zeros<F, BQ, D>();
      // The walk over the listed blocks carries m, l and acc: in reverse mode tg::loop keeps
      // those per block, not every block's records.
      loop(0, blocks.count, 1, m, l, acc, [=](int i, auto& m, auto& l, auto& acc) {
        int const k0 = blocks[i] * BK;
        tile<F, BK, D> const kj = to<F>(load(make_block_ptr<BK, D>(kh, {k0, 0}), bounds<0>));
        tile<F, BK, D> const vj = to<F>(load(make_block_ptr<BK, D>(vh, {k0, 0}), bounds<0>));
        tile<F, BQ, BK> s = dot(qi, trans(kj)) * scale;
        if (detail::block_needs_mask<BQ, BK, Causal>(q0, k0, n_k)) // the last, or the diagonal
          s = where(detail::block_mask<BQ, BK, Causal>(q0, k0, n_k), s, detail::neg_inf);
        tile<F, BQ> const m_new = maximum(m, max<1>(s));
        auto const& m_ref = detail::score_shift<Causal>(m_new);
        tile<F, BQ, BK> const pt = exp(s - col(m_ref));
        tile<F, BQ> const alpha = exp(m - m_ref); // rescales what earlier blocks summed
        l = l * alpha + sum<1>(pt);
        acc *= col(alpha);
        acc = dot(pt, vj, std::move(acc));
        m = m_new;
      });
      if constexpr (Causal) { // a row with no key: l = 0 and acc = 0, so o = 0 and lse = -inf
        tile<F, BQ> const l_ref = where(l > 0.0f, l, 1.0f); // no 0 / 0, not even unselected
        store(ob, acc / col(l_ref), bounds<0>);
        store(lb, where(l > 0.0f, m + log(l_ref), detail::neg_inf), bounds<0>);
      } else { // every listed block holds at least one key, so l > 0 on every row
        store(ob, acc / col(l), bounds<0>);
        store(lb, m + log(l), bounds<0>);
      }
    };

/// Backward, first pass: dk, dv (B, H, Nk, D) by key blocks, each walking the query blocks that
/// list it in the transposed table q_count (Bt, Ht, cdiv(Nk, BK)), q_index (Bt, Ht, cdiv(Nk, BK),
/// max_q) that block_sparse_transpose builds. Needs lse from the forward and delta from
/// flash_attention_bwd_delta. Grid: (cdiv(Nk, BK), H, B).
template <int D, int BQ, int BK, bool Causal = false>
inline constexpr auto block_sparse_attention_bwd_dkdv = []<class T>(
                                                            program const& p, tensor<T const> q,
                                                            tensor<T const> k, tensor<T const> v,
                                                            tensor<T const> d_o,
                                                            tensor<fp32<T> const> lse,
                                                            tensor<fp32<T> const> delta,
                                                            tensor<std::int32_t const> q_count,
                                                            tensor<std::int32_t const> q_index,
                                                            tensor<T> dk, tensor<T> dv,
                                                            double scale) {
  using F = fp32<T>;
  int const kb = p.program_id(0), k0 = kb * BK, h = p.program_id(1), b = p.program_id(2);
  auto const qh = q[b][h], doh = d_o[b][h];
  auto const lh = lse[b][h], dh = delta[b][h];
  int const n_k = static_cast<int>(k.size(2));
  auto const blocks = detail::listed(q_count, q_index, kb, h, b);
  // K and V stay for the whole walk: transposed once (see flash_attention_bwd).
  tile<F, D, BK> const kt =
      trans(to<F>(load(make_block_ptr<BK, D>(k[b][h], {k0, 0}), bounds<0>))) * scale;
  tile<F, D, BK> const vt = trans(to<F>(load(make_block_ptr<BK, D>(v[b][h], {k0, 0}), bounds<0>)));
  auto dk_acc = zeros<F, BK, D>();
  auto dv_acc = zeros<F, BK, D>();
  for (int i = 0; i < blocks.count; ++i) {
    int const q0 = blocks[i] * BQ;
    // Query rows past the end read zeros (do and delta too): their terms vanish.
    tile<F, BQ, D> const qi = to<F>(load(make_block_ptr<BQ, D>(qh, {q0, 0}), bounds<0>));
    tile<F, BQ, D> const doi = to<F>(load(make_block_ptr<BQ, D>(doh, {q0, 0}), bounds<0>));
    auto const li = load(make_block_ptr<BQ>(lh, {q0}), bounds<0>);
    auto const di = load(make_block_ptr<BQ>(dh, {q0}), bounds<0>);
    auto const [pt, ds] =
        detail::probabilities_and_ds<BQ, BK, Causal>(qi, kt, vt, doi, li, di, scale, q0, k0, n_k);
    dv_acc = dot(trans(pt), doi, std::move(dv_acc));
    dk_acc = dot(trans(ds), qi, std::move(dk_acc));
  }
  store(make_block_ptr<BK, D>(dk[b][h], {k0, 0}), dk_acc, bounds<0>);
  store(make_block_ptr<BK, D>(dv[b][h], {k0, 0}), dv_acc, bounds<0>);
};

/// Backward, second pass: dq (B, H, N, D) by query blocks, each walking its listed key blocks
/// (kv_count, kv_index as in the forward); a query block that lists none gets dq = 0.
/// Grid: (cdiv(N, BQ), H, B).
template <int D, int BQ, int BK, bool Causal = false>
inline constexpr auto block_sparse_attention_bwd_dq =
    []<class T>(program const& p, tensor<T const> q, tensor<T const> k, tensor<T const> v,
                tensor<T const> d_o, tensor<fp32<T> const> lse, tensor<fp32<T> const> delta,
                tensor<std::int32_t const> kv_count, tensor<std::int32_t const> kv_index,
                tensor<T> dq, double scale) {
      using F = fp32<T>;
      int const qb = p.program_id(0), q0 = qb * BQ, h = p.program_id(1), b = p.program_id(2);
      auto const kh = k[b][h], vh = v[b][h];
      int const n_k = static_cast<int>(kh.size(0));
      auto const blocks = detail::listed(kv_count, kv_index, qb, h, b);
      tile<F, BQ, D> const qi = to<F>(load(make_block_ptr<BQ, D>(q[b][h], {q0, 0}), bounds<0>));
      tile<F, BQ, D> const doi = to<F>(load(make_block_ptr<BQ, D>(d_o[b][h], {q0, 0}), bounds<0>));
      auto const li = load(make_block_ptr<BQ>(lse[b][h], {q0}), bounds<0>);
      auto const di = load(make_block_ptr<BQ>(delta[b][h], {q0}), bounds<0>);
      auto acc = zeros<F, BQ, D>();
      for (int i = 0; i < blocks.count; ++i) {
        int const k0 = blocks[i] * BK;
        tile<F, BK, D> const kj = to<F>(load(make_block_ptr<BK, D>(kh, {k0, 0}), bounds<0>));
        tile<F, BK, D> const vj = to<F>(load(make_block_ptr<BK, D>(vh, {k0, 0}), bounds<0>));
        auto const [pt, ds] = detail::probabilities_and_ds<BQ, BK, Causal>(
            qi, tile<F, D, BK>(trans(kj) * scale), tile<F, D, BK>(trans(vj)), doi, li, di, scale,
            q0, k0, n_k);
        acc = dot(ds, kj, std::move(acc));
      }
      store(make_block_ptr<BQ, D>(dq[b][h], {q0, 0}), acc, bounds<0>);
    };

// ---------------------------------------------------------------------------------------------
// Host side: block tables, checks before any program runs, entry points.
// ---------------------------------------------------------------------------------------------

/// A block table owned on the host: count (Bt, Ht, rows) and index (Bt, Ht, rows, max_blocks).
struct block_table {
  owned_tensor<std::int32_t> count, index;
};

/// The table of the blocks (r, c) of `rows` x `cols` blocks where keep(b, h, r, c) holds, for
/// batch b < batch and head h < heads (pass 1 for a table shared by every batch or head); the
/// listed blocks of a row in increasing order, max_blocks the longest row (0 when all are empty).
template <class Keep>
block_table make_block_table(std::int64_t batch, std::int64_t heads, std::int64_t rows,
                             std::int64_t cols, Keep&& keep) {
  std::int64_t widest = 0;
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t r = 0; r < rows; ++r) {
        std::int64_t n = 0;
        for (std::int64_t c = 0; c < cols; ++c)
          n += keep(b, h, r, c) ? 1 : 0;
        widest = std::max(widest, n);
      }
  block_table t{owned_tensor<std::int32_t>({batch, heads, rows}, "kv_count"),
                owned_tensor<std::int32_t>({batch, heads, rows, widest}, "kv_index")};
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t r = 0; r < rows; ++r) {
        std::int32_t n = 0;
        for (std::int64_t c = 0; c < cols; ++c)
          if (keep(b, h, r, c))
            t.index(b, h, r, n++) = static_cast<std::int32_t>(c);
        t.count(b, h, r) = n;
      }
  return t;
}

/// The transposed table: for each of the `cols` column blocks, the rows that list it, in
/// increasing order (q_count and q_index of the backward from kv_count and kv_index).
/// @pre check_block_table accepts the table (counts in range, indices in [0, cols))
inline block_table block_sparse_transpose(tensor<std::int32_t const> count,
                                          tensor<std::int32_t const> index, std::int64_t cols) {
  std::int64_t const bt = count.size(0), ht = count.size(1), rows = count.size(2);
  std::vector<std::vector<std::int32_t>> lists(static_cast<std::size_t>(bt * ht * cols));
  auto list = [&](std::int64_t b, std::int64_t h, std::int64_t c) -> auto& {
    return lists[static_cast<std::size_t>((b * ht + h) * cols + c)];
  };
  std::size_t widest = 0;
  for (std::int64_t b = 0; b < bt; ++b)
    for (std::int64_t h = 0; h < ht; ++h)
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int32_t j = 0; j < count(b, h, r); ++j) {
          auto& l = list(b, h, index(b, h, r, j));
          l.push_back(static_cast<std::int32_t>(r));
          widest = std::max(widest, l.size());
        }
  block_table t{
      owned_tensor<std::int32_t>({bt, ht, cols}, "q_count"),
      owned_tensor<std::int32_t>({bt, ht, cols, static_cast<std::int64_t>(widest)}, "q_index")};
  for (std::int64_t b = 0; b < bt; ++b)
    for (std::int64_t h = 0; h < ht; ++h)
      for (std::int64_t c = 0; c < cols; ++c) {
        auto const& l = list(b, h, c);
        t.count(b, h, c) = static_cast<std::int32_t>(l.size());
        for (std::size_t j = 0; j < l.size(); ++j)
          t.index(b, h, c, static_cast<std::int64_t>(j)) = l[j];
      }
  return t;
}

/// The block size block_sparse_attention_forward and block_sparse_attention_backward use when
/// none is given, for query blocks and key blocks alike, whatever the head dim (their template
/// arguments BQ = block_sparse_block, BK = BQ). The block table is written in these units: a
/// table for the defaults has cdiv(N, block_sparse_block) query blocks, each listing key blocks
/// of block_sparse_block keys.
inline constexpr int block_sparse_block = 64;

struct block_sparse_options {
  bool causal = false; // within the listed blocks, key j only for queries i >= j
  double scale = 0;    // 0: 1 / sqrt(head dim)
  launch_options launch = default_options();
};

namespace detail {

inline std::string position(std::initializer_list<std::int64_t> at) {
  std::string s = "(";
  for (auto a : at)
    s += (s.size() > 1 ? ", " : "") + std::to_string(a);
  return s + ")";
}

[[noreturn]] inline void bad_table(std::string const& what) {
  throw std::invalid_argument("tilegrad::block_sparse_attention: " + what);
}

} // namespace detail

/// The block table of a launch with q (B, H, N, D), k (B, H, Nk, D) and blocks BQ x BK: shapes
/// as at the top of this header, every count in [0, max_blocks], every listed index in
/// [0, cdiv(Nk, BK)) and listed once. Errors name the tensor, the position and the value.
/// @pre q and k have rank 4 (the entry points check them first)
template <class Q, class K>
void check_block_table(tensor<std::int32_t const> count, tensor<std::int32_t const> index,
                       tensor<Q> const& q, tensor<K> const& k, int bq, int bk) {
  std::int64_t const batch = q.size(0), heads = q.size(1);
  std::int64_t const rows = cdiv<std::int64_t>(q.size(2), bq);
  std::int64_t const cols = cdiv<std::int64_t>(k.size(2), bk);
  auto const c = std::string("kv_count '") + count.name() + "'";
  auto const x = std::string("kv_index '") + index.name() + "'";
  if (count.rank() != 3)
    detail::bad_table(c + " must have rank 3 (batch or 1, heads or 1, query blocks), not shape " +
                      count.shape_string());
  if (index.rank() != 4)
    detail::bad_table(x +
                      " must have rank 4 (batch or 1, heads or 1, query blocks, max blocks), not "
                      "shape " +
                      index.shape_string());
  auto const expected = "(" + std::to_string(batch) + " or 1, " + std::to_string(heads) +
                        " or 1, " + std::to_string(rows) + ")";
  if ((count.size(0) != batch && count.size(0) != 1) ||
      (count.size(1) != heads && count.size(1) != 1) || count.size(2) != rows)
    detail::bad_table(c + " has shape " + count.shape_string() + ", expected " + expected +
                      " for '" + q.name() + "' of shape " + q.shape_string() +
                      " in query blocks of " + std::to_string(bq));
  for (int a = 0; a < 3; ++a)
    if (index.size(a) != count.size(a))
      detail::bad_table(x + " has shape " + index.shape_string() + ", expected " +
                        count.shape_string().substr(0, count.shape_string().size() - 1) +
                        ", max blocks) as " + c);
  std::int64_t const max_blocks = index.size(3);
  std::vector<std::int64_t> seen(static_cast<std::size_t>(cols), -1);
  for (std::int64_t b = 0; b < count.size(0); ++b)
    for (std::int64_t h = 0; h < count.size(1); ++h)
      for (std::int64_t r = 0; r < rows; ++r) {
        std::int64_t const n = count(b, h, r);
        if (n < 0 || n > max_blocks)
          detail::bad_table(c + " at " + detail::position({b, h, r}) + " is " + std::to_string(n) +
                            (n < 0 ? ", negative"
                                   : ", more than the " + std::to_string(max_blocks) + " blocks " +
                                         x + " holds per query block"));
        std::fill(seen.begin(), seen.end(), -1);
        for (std::int64_t j = 0; j < n; ++j) {
          std::int64_t const kb = index(b, h, r, j);
          if (kb < 0 || kb >= cols)
            detail::bad_table(
                x + " at " + detail::position({b, h, r, j}) + " is " + std::to_string(kb) +
                ", not a key block in [0, " + std::to_string(cols) + ") ('" + k.name() + "' has " +
                std::to_string(k.size(2)) + " rows, key blocks of " + std::to_string(bk) + ")");
          auto& first = seen[static_cast<std::size_t>(kb)];
          if (first >= 0)
            detail::bad_table(x + " at " + detail::position({b, h, r, j}) + " is " +
                              std::to_string(kb) + ", listed before at " +
                              detail::position({b, h, r, first}));
          first = j;
        }
      }
}

/// o = block-sparse attention of q, k, v under the block table kv_count, kv_index (query blocks
/// of BQ rows, key blocks of BK rows) and its logsumexp lse; shapes and the table checked first.
/// T is float or bf16 (lse is float), or double.
template <class T, int BQ = block_sparse_block, int BK = BQ>
void block_sparse_attention_forward(tensor<T const> q, tensor<T const> k, tensor<T const> v,
                                    tensor<std::int32_t const> kv_count,
                                    tensor<std::int32_t const> kv_index, tensor<T> o,
                                    tensor<fp32<T>> lse, block_sparse_options const& opt = {}) {
  detail::check_forward_args<T, fp32<T>>("block_sparse_attention", q, k, v, o, lse);
  check_block_table(kv_count, kv_index, q, k, BQ, BK);
  double const scale = detail::default_scale(opt.scale, q.size(3));
  detail::with_head_dim(static_cast<int>(q.size(3)), [&](auto dc) {
    constexpr int D = decltype(dc)::value;
    auto const g = detail::attention_grid(q, BQ);
    if (opt.causal)
      launch(opt.launch, g, block_sparse_attention_fwd<D, BQ, BK, true>, q, k, v, kv_count,
             kv_index, o, lse, scale);
    else
      launch(opt.launch, g, block_sparse_attention_fwd<D, BQ, BK, false>, q, k, v, kv_count,
             kv_index, o, lse, scale);
  });
}

/// dq, dk, dv from d_o, with o and lse from the forward and the forward's block table: the delta
/// launch, the table transposed on the host, a key-block launch for dk and dv, a query-block
/// launch for dq. No atomics: the result is the same bits run to run.
template <class T, int BQ = block_sparse_block, int BK = BQ>
void block_sparse_attention_backward(tensor<T const> q, tensor<T const> k, tensor<T const> v,
                                     tensor<T const> o, tensor<T const> d_o,
                                     tensor<fp32<T> const> lse, tensor<std::int32_t const> kv_count,
                                     tensor<std::int32_t const> kv_index, tensor<T> dq,
                                     tensor<T> dk, tensor<T> dv,
                                     block_sparse_options const& opt = {}) {
  using F = fp32<T>;
  detail::check_backward_args<T, fp32<T>>("block_sparse_attention", q, k, v, o, d_o, lse, dq, dk,
                                          dv);
  check_block_table(kv_count, kv_index, q, k, BQ, BK);
  double const scale = detail::default_scale(opt.scale, q.size(3));
  auto const by_key = block_sparse_transpose(kv_count, kv_index, cdiv<std::int64_t>(k.size(2), BK));
  owned_tensor<F> delta({q.size(0), q.size(1), q.size(2)}, "delta");
  auto const passes = [&]<int D, bool Causal>() {
    auto const queries = detail::attention_grid(q, BQ);
    launch(opt.launch, queries, flash_attention_bwd_delta<D, BQ>, o, d_o, delta.view());
    launch(opt.launch, detail::attention_grid(k, BK),
           block_sparse_attention_bwd_dkdv<D, BQ, BK, Causal>, q, k, v, d_o, lse, delta.cview(),
           by_key.count.cview(), by_key.index.cview(), dk, dv, scale);
    launch(opt.launch, queries, block_sparse_attention_bwd_dq<D, BQ, BK, Causal>, q, k, v, d_o, lse,
           delta.cview(), kv_count, kv_index, dq, scale);
  };
  detail::with_head_dim(static_cast<int>(q.size(3)), [&](auto dc) {
    constexpr int D = decltype(dc)::value;
    if (opt.causal)
      passes.template operator()<D, true>();
    else
      passes.template operator()<D, false>();
  });
}

} // namespace tilegrad::kernels
