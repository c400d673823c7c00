// FlashAttention-2 (the CS336 assignment 2 kernels, Algorithms 1 and 2 of the FlashAttention-2
// paper): the forward walks key tiles with an online softmax and never forms the N x N scores,
// saving the output O and the row logsumexp L; the backward recomputes the probabilities from L.
// Two backwards: one program per key tile adding dQ by atomic_add, or a key-tile pass for
// dK/dV and a query-tile pass for dQ (no atomics). Tensors are (batch, heads, rows, head dim);
// batch and heads are grid axes 2 and 1. bf16 storage computes in fp32, but as Triton's kernels
// do: q, k, v and dO go to dot as bf16 (accumulating in fp32), and so do P and dS, rounded to
// bf16 first (Triton's p.to(v.dtype)); the softmax scale multiplies the fp32 scores.
#pragma once

#include "tilegrad/core/types.hpp"
#include "tilegrad/grid/launch.hpp"
#include "tilegrad/grid/loop.hpp"
#include "tilegrad/grid/program.hpp"
#include "tilegrad/memory/block_ptr.hpp"
#include "tilegrad/memory/copy.hpp"
#include "tilegrad/memory/pointer.hpp"
#include "tilegrad/memory/tensor.hpp"
#include "tilegrad/tile/creation.hpp"
#include "tilegrad/tile/dot.hpp"
#include "tilegrad/tile/elementwise.hpp"
#include "tilegrad/tile/reduce.hpp"
#include "tilegrad/tile/shape_ops.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace tilegrad::kernels {

namespace detail {

inline constexpr float neg_inf = -std::numeric_limits<float>::infinity();

/// Whether the (query tile at q0) x (key tile at k0) block needs a mask: it crosses the end of
/// the keys, or (causal) the diagonal. Every other block is used whole.
template <int BQ, int BK, bool Causal>
constexpr bool block_needs_mask(int q0, int k0, int n_k) {
  return k0 + BK > n_k || (Causal && k0 + BK - 1 > q0);
}

/// The scores' mask of the block: keys that exist and, causal, keys at or before the query
/// (queries and keys aligned at their first rows). Queries run down the rows, keys along them;
/// transposed (KeysDown), the other way round.
template <int BQ, int BK, bool Causal, bool KeysDown = false>
auto block_mask(int q0, int k0, int n_k) {
  auto const offs_q = q0 + arange<0, BQ>();
  auto const offs_k = k0 + arange<0, BK>();
  if constexpr (KeysDown) {
    if constexpr (Causal)
      return (col(offs_k) < n_k) & (row(offs_q) >= col(offs_k));
    else
      return (col(offs_k) < n_k) & (row(offs_q) >= 0);
  } else {
    if constexpr (Causal)
      return (row(offs_k) < n_k) & (col(offs_q) >= row(offs_k));
    else
      return (row(offs_k) < n_k) & (col(offs_q) >= 0);
  }
}

/// The first key past the ones the query tile at q0 attends to (causal tile skipping).
template <int BQ, bool Causal>
constexpr int key_end(int q0, int n_k) {
  return Causal ? std::min(n_k, q0 + BQ) : n_k;
}

/// The first query tile that attends to the key tile at k0 (causal: none before the diagonal).
template <int BQ, bool Causal>
constexpr int query_begin(int k0) {
  return Causal ? k0 / BQ * BQ : 0;
}

/// The operand type of the kernels' products for storage type T: bf16 itself (dot takes bf16
/// operands as they are), fp32<T> for every other type.
template <class T>
using operand_t = std::conditional_t<std::is_same_v<T, bf16>, bf16, fp32<T>>;

/// x as an operand of a product in operand type E: x itself in fp32, rounded to a bf16 tile
/// for bf16 operands (P and dS before their products, as Triton's p.to(v.dtype)).
template <class E, class X>
decltype(auto) as_operand(X const& x) {
  if constexpr (std::is_same_v<E, bf16>)
    return tilegrad::detail::tile_t<bf16, shape_of_t<X>>(to<bf16>(x));
  else
    return (x);
}

/// x * scale as an operand in E: fp32 operands take the softmax scale once, before the walk;
/// bf16 ones stay as loaded (scaling them would round again) and the scale multiplies the fp32
/// scores their products make instead.
template <class E, class X>
auto prescaled(X&& x, double scale) {
  if constexpr (std::is_same_v<E, bf16>)
    return std::forward<X>(x);
  else
    return std::forward<X>(x) * scale;
}

/// x, a difference of scores, in the units of the scaled scores: x * scale where the operands are
/// bf16 (their scores are unscaled, see prescaled), x itself in fp32 (q was prescaled). The bf16
/// forward thus scales inside its exponentials, fused, not in a pass over the scores.
template <class E, class X>
auto scaled(X&& x, double scale) {
  if constexpr (std::is_same_v<E, bf16>)
    return std::forward<X>(x) * scale;
  else
    return std::forward<X>(x);
}

/// P = exp(scale Q Kᵀ - L) for one block, masked lanes 0, and dS = P (dP - D) scale with
/// dP = dO Vᵀ: what a backward recomputes from the saved logsumexp, queries down the rows.
/// Takes kt = scale Kᵀ (bf16: Kᵀ) and vt = Vᵀ, which a key-tile program transposes once for its
/// whole walk.
template <int BQ, int BK, bool Causal, class E, int D, class L, class Dl>
auto probabilities_and_ds(tile<E, BQ, D> const& qi, tile<E, D, BK> const& kt,
                          tile<E, D, BK> const& vt, tile<E, BQ, D> const& doi, L const& li,
                          Dl const& di, double scale, int q0, int k0, int n_k) {
  using F = fp32<E>;
  tile<F, BQ, BK> pt = [&] {
    if constexpr (std::is_same_v<E, bf16>)
      return tile<F, BQ, BK>(exp(dot(qi, kt) * scale - col(li)));
    else
      return tile<F, BQ, BK>(exp(dot(qi, kt) - col(li)));
  }();
  if (block_needs_mask<BQ, BK, Causal>(q0, k0, n_k))
    pt = where(block_mask<BQ, BK, Causal>(q0, k0, n_k), pt, 0.0f);
  tile<F, BQ, BK> ds = pt * (dot(doi, vt) - col(di)) * scale;
  return std::pair<tile<F, BQ, BK>, tile<F, BQ, BK>>(std::move(pt), std::move(ds));
}

} // namespace detail

/// Forward: o = softmax(scale * q kᵀ [causal mask]) v and lse = the rows' logsumexp, for
/// q, o (B, H, N, D), k, v (B, H, Nk, D), lse (B, H, N). Grid: (cdiv(N, BQ), H, B).
template <int D, int BQ, int BK, bool Causal>
inline constexpr auto flash_attention_fwd =
    []<class T>(program const& p, tensor<T const> q, tensor<T const> k, tensor<T const> v,
                tensor<T> o, tensor<fp32<T>> lse, double scale) {
      using F = fp32<T>;
      using E = detail::operand_t<T>;
      int const q0 = p.program_id(0) * BQ, h = p.program_id(1), b = p.program_id(2);
      auto const kh = k[b][h], vh = v[b][h];
      int const n_k = static_cast<int>(kh.size(0));
      // The scores are computed transposed, keys down the rows: S^T = K (scale Q)^T needs Q^T,
      // transposed once here rather than K^T in every step, and P V = (P^T)^T V reads P^T in
      // place. The softmax statistics then reduce along axis 0. Rows of q past the end read
      // zeros; their results are not stored.
      tile<E, D, BQ> qt = detail::prescaled<E>(
          trans(to<E>(load(make_block_ptr<BQ, D>(q[b][h], {q0, 0}), bounds<0>))), scale);
      // bf16 scores stay unscaled and m follows them: under a negative scale the largest scaled
      // score is the smallest unscaled one, so q is negated (exactly) and the scale taken as
      // positive (s). (fp32 q carries the scale, sign included.)
      double const s = std::is_same_v<E, bf16> && scale < 0 ? -scale : scale;
      if constexpr (std::is_same_v<E, bf16>)
        if (scale < 0)
          qt = to<E>(-to<F>(qt));
      auto m = full<F, BQ>(F(detail::neg_inf)); // running maximum of each query's scores
      auto l = zeros<F, BQ>();                  // running sum of exp(score - m)
      auto acc = zeros<F, BQ, D>();
      // The key walk carries m, l and acc; in reverse mode tg::loop keeps only those per key
      // tile (the tape of one key tile is rebuilt in the sweep), not every tile's records.
      loop(0, detail::key_end<BQ, Causal>(q0, n_k), BK, m, l, acc,
           [=](int k0, auto& m, auto& l, auto& acc) {
             tile<E, BK, D> const kj = to<E>(load(make_block_ptr<BK, D>(kh, {k0, 0}), bounds<0>));
             tile<E, BK, D> const vj = to<E>(load(make_block_ptr<BK, D>(vh, {k0, 0}), bounds<0>));
             tile<F, BK, BQ> st = dot(kj, qt); // (bf16: unscaled; m follows st's units)
             if (detail::block_needs_mask<BQ, BK, Causal>(q0, k0, n_k))
               st = where(detail::block_mask<BQ, BK, Causal, true>(q0, k0, n_k), st,
                          detail::neg_inf);
             tile<F, BQ> const m_new = maximum(m, max<0>(st));
             // P^T over the scores, in place: one 64 x 64 tile less in the step's working set
             st = exp(detail::scaled<E>(st - row(m_new), s));
             // rescales what earlier tiles summed
             tile<F, BQ> const alpha = exp(detail::scaled<E>(m - m_new, s));
             l = l * alpha + sum<0>(st);
             acc *= col(alpha);
             auto const& pe = detail::as_operand<E>(st);
             acc = dot(trans(pe), vj, std::move(acc));
             m = m_new;
           });
      store(make_block_ptr<BQ, D>(o[b][h], {q0, 0}), acc / col(l), bounds<0>);
      store(make_block_ptr<BQ>(lse[b][h], {q0}), detail::scaled<E>(m, s) + log(l), bounds<0>);
    };

/// delta = rowsum(do * o), the D of Algorithm 2, for o, do (B, H, N, D) and delta (B, H, N).
/// Grid: (cdiv(N, BQ), H, B).
template <int D, int BQ>
inline constexpr auto flash_attention_bwd_delta =
    []<class T>(program const& p, tensor<T const> o, tensor<T const> d_o, tensor<fp32<T>> delta) {
      using F = fp32<T>;
      int const q0 = p.program_id(0) * BQ, h = p.program_id(1), b = p.program_id(2);
      tile<F, BQ, D> const oi = to<F>(load(make_block_ptr<BQ, D>(o[b][h], {q0, 0}), bounds<0>));
      tile<F, BQ, D> const doi = to<F>(load(make_block_ptr<BQ, D>(d_o[b][h], {q0, 0}), bounds<0>));
      store(make_block_ptr<BQ>(delta[b][h], {q0}), sum<1>(oi * doi), bounds<0>);
    };

namespace detail {

/// The key-tile program of the backward: dK and dV of its keys over every query tile that sees
/// them; with AtomicDq, also each query tile's share of dQ, added to dq (which must start at 0).
template <int D, int BQ, int BK, bool Causal, bool AtomicDq>
inline constexpr auto flash_attention_bwd_keys = []<class T>(program const& p, tensor<T const> q,
                                                             tensor<T const> k, tensor<T const> v,
                                                             tensor<T const> d_o,
                                                             tensor<fp32<T> const> lse,
                                                             tensor<fp32<T> const> delta,
                                                             tensor<fp32<T>> dq, tensor<T> dk,
                                                             tensor<T> dv, double scale) {
  using F = fp32<T>;
  using E = operand_t<T>;
  int const k0 = p.program_id(0) * BK, h = p.program_id(1), b = p.program_id(2);
  auto const qh = q[b][h], doh = d_o[b][h];
  auto const lh = lse[b][h], dh = delta[b][h];
  int const n_q = static_cast<int>(qh.size(0)), n_k = static_cast<int>(k.size(2));
  // K and V stay for the whole walk: their transposes are taken once, and every product
  // of the walk reads its operands in place (dot(trans(x), y) reads x transposed).
  tile<E, BK, D> const kj = to<E>(load(make_block_ptr<BK, D>(k[b][h], {k0, 0}), bounds<0>));
  tile<E, D, BK> const kt = prescaled<E>(trans(kj), scale);
  tile<E, D, BK> const vt = trans(to<E>(load(make_block_ptr<BK, D>(v[b][h], {k0, 0}), bounds<0>)));
  auto dk_acc = zeros<F, BK, D>();
  auto dv_acc = zeros<F, BK, D>();
  for (int q0 = query_begin<BQ, Causal>(k0); q0 < n_q; q0 += BQ) {
    tile<E, BQ, D> const qi = to<E>(load(make_block_ptr<BQ, D>(qh, {q0, 0}), bounds<0>));
    tile<E, BQ, D> const doi = to<E>(load(make_block_ptr<BQ, D>(doh, {q0, 0}), bounds<0>));
    auto const li = load(make_block_ptr<BQ>(lh, {q0}), bounds<0>);
    auto const di = load(make_block_ptr<BQ>(dh, {q0}), bounds<0>);
    auto const [pt, ds] =
        probabilities_and_ds<BQ, BK, Causal>(qi, kt, vt, doi, li, di, scale, q0, k0, n_k);
    auto const& pe = as_operand<E>(pt);
    auto const& dse = as_operand<E>(ds);
    dv_acc = dot(trans(pe), doi, std::move(dv_acc));
    dk_acc = dot(trans(dse), qi, std::move(dk_acc));
    if constexpr (AtomicDq) {
      auto const rows = q0 + arange<0, BQ>();
      auto const dqh = dq[b][h];
      atomic_add(dqh + (col(rows) * dqh.stride(0) + row(arange<0, D>()) * dqh.stride(1)),
                 dot(dse, kj), col(rows) < n_q);
    }
  }
  store(make_block_ptr<BK, D>(dk[b][h], {k0, 0}), dk_acc, bounds<0>);
  store(make_block_ptr<BK, D>(dv[b][h], {k0, 0}), dv_acc, bounds<0>);
};

} // namespace detail

/// Backward, key-tile programs adding dQ atomically: dk, dv (B, H, Nk, D) and dq (B, H, N, D)
/// in fp32 of the mode, zeroed before the launch. Needs lse from the forward and delta from
/// flash_attention_bwd_delta. Grid: (cdiv(Nk, BK), H, B).
template <int D, int BQ, int BK, bool Causal>
inline constexpr auto flash_attention_bwd =
    detail::flash_attention_bwd_keys<D, BQ, BK, Causal, true>;

/// Backward without atomics, first pass: dk and dv only. Grid: (cdiv(Nk, BK), H, B); the dq
/// argument is not touched.
template <int D, int BQ, int BK, bool Causal>
inline constexpr auto flash_attention_bwd_dkdv =
    detail::flash_attention_bwd_keys<D, BQ, BK, Causal, false>;

/// Backward without atomics, second pass: dq (B, H, N, D) by query tiles, each walking the key
/// tiles it attends to. Grid: (cdiv(N, BQ), H, B).
template <int D, int BQ, int BK, bool Causal>
inline constexpr auto flash_attention_bwd_dq =
    []<class T>(program const& p, tensor<T const> q, tensor<T const> k, tensor<T const> v,
                tensor<T const> d_o, tensor<fp32<T> const> lse, tensor<fp32<T> const> delta,
                tensor<T> dq, double scale) {
      using F = fp32<T>;
      using E = detail::operand_t<T>;
      int const q0 = p.program_id(0) * BQ, h = p.program_id(1), b = p.program_id(2);
      auto const kh = k[b][h], vh = v[b][h];
      int const n_k = static_cast<int>(kh.size(0));
      // Transposed, keys down the rows, as in the forward: Q^T and dO^T are taken once, and
      // dS K = (dS^T)^T K reads dS^T in place.
      tile<E, D, BQ> const qt = detail::prescaled<E>(
          trans(to<E>(load(make_block_ptr<BQ, D>(q[b][h], {q0, 0}), bounds<0>))), scale);
      tile<E, D, BQ> const do_t =
          trans(to<E>(load(make_block_ptr<BQ, D>(d_o[b][h], {q0, 0}), bounds<0>)));
      auto const li = load(make_block_ptr<BQ>(lse[b][h], {q0}), bounds<0>);
      auto const di = load(make_block_ptr<BQ>(delta[b][h], {q0}), bounds<0>);
      auto acc = zeros<F, BQ, D>();
      for (int k0 = 0; k0 < detail::key_end<BQ, Causal>(q0, n_k); k0 += BK) {
        tile<E, BK, D> const kj = to<E>(load(make_block_ptr<BK, D>(kh, {k0, 0}), bounds<0>));
        tile<E, BK, D> const vj = to<E>(load(make_block_ptr<BK, D>(vh, {k0, 0}), bounds<0>));
        tile<F, BK, BQ> pt = [&] {
          if constexpr (std::is_same_v<E, bf16>)
            return tile<F, BK, BQ>(exp(dot(kj, qt) * scale - row(li)));
          else
            return tile<F, BK, BQ>(exp(dot(kj, qt) - row(li)));
        }();
        if (detail::block_needs_mask<BQ, BK, Causal>(q0, k0, n_k))
          pt = where(detail::block_mask<BQ, BK, Causal, true>(q0, k0, n_k), pt, 0.0f);
        tile<F, BK, BQ> const dst = pt * (dot(vj, do_t) - row(di));
        auto const& dse = detail::as_operand<E>(dst);
        acc = dot(trans(dse), kj, std::move(acc));
      }
      store(make_block_ptr<BQ, D>(dq[b][h], {q0, 0}), acc * scale, bounds<0>);
    };

// ---------------------------------------------------------------------------------------------
// Host entry points: shapes checked before any program runs, tiles picked per head dim.
// ---------------------------------------------------------------------------------------------

struct attention_options {
  bool causal = false;
  double scale = 0; // 0: 1 / sqrt(head dim); double, so that the fp64 instantiation is exact
  launch_options launch = default_options();
};

enum class attention_backward { atomic_dq, two_pass };

namespace detail {

// Shape checks of the host entry points; `who` names the entry point in the messages
// ("flash_attention", "block_sparse_attention").
template <class A, class B>
void expect_dims(char const* who, char const* what, tensor<A> const& t, tensor<B> const& ref,
                 int axis, char const* axis_name) {
  if (t.size(axis) != ref.size(axis))
    throw std::invalid_argument(std::string("tilegrad::") + who + ": " + what + " '" + t.name() +
                                "' has " + axis_name + " " + std::to_string(t.size(axis)) +
                                " but '" + ref.name() + "' has " + std::to_string(ref.size(axis)) +
                                " (shapes " + t.shape_string() + " and " + ref.shape_string() +
                                ")");
}

template <class A>
void expect_rank(char const* who, tensor<A> const& t, int rank, char const* layout) {
  if (t.rank() != rank)
    throw std::invalid_argument(std::string("tilegrad::") + who + ": '" + t.name() +
                                "' must have rank " + std::to_string(rank) + " " + layout +
                                ", not shape " + t.shape_string());
}

template <class A, class B>
void expect_same_shape(char const* who, char const* what, tensor<A> const& t,
                       tensor<B> const& ref) {
  if (!t.same_shape(ref))
    throw std::invalid_argument(std::string("tilegrad::") + who + ": " + what + " '" + t.name() +
                                "' has shape " + t.shape_string() + ", expected " +
                                ref.shape_string() + " as '" + ref.name() + "'");
}

/// The forward's tensors: q, o (B, H, N, D), k and v (B, H, Nk, D), lse (B, H, N), a head dim
/// the kernels are built for.
template <class T, class L>
void check_forward_args(char const* who, tensor<T const> const& q, tensor<T const> const& k,
                        tensor<T const> const& v, tensor<T const> const& o,
                        tensor<L const> const& lse) {
  for (auto const* t : {&q, &k, &v})
    expect_rank(who, *t, 4, "(batch, heads, rows, head dim)");
  for (auto [axis, name] : {std::pair{0, "batch"}, {1, "heads"}, {3, "head dim"}}) {
    expect_dims(who, "key", k, q, axis, name);
    expect_dims(who, "value", v, q, axis, name);
  }
  expect_dims(who, "value", v, k, 2, "rows");
  if (q.size(2) < 1 || k.size(2) < 1)
    throw std::invalid_argument(std::string("tilegrad::") + who + ": no query or no key rows");
  int const d = static_cast<int>(q.size(3));
  if (d != 16 && d != 32 && d != 64 && d != 128)
    throw std::invalid_argument(std::string("tilegrad::") + who + ": head dim " +
                                std::to_string(d) + " of '" + q.name() +
                                "' is not one of 16, 32, 64, 128");
  expect_same_shape(who, "output", o, q);
  expect_rank(who, lse, 3, "(batch, heads, rows)");
  for (auto [axis, name] : {std::pair{0, "batch"}, {1, "heads"}, {2, "rows"}})
    expect_dims(who, "logsumexp", lse, q, axis, name);
}

/// The backward's: the forward's, and d_o, dq like q, dk like k, dv like v.
template <class T, class L>
void check_backward_args(char const* who, tensor<T const> const& q, tensor<T const> const& k,
                         tensor<T const> const& v, tensor<T const> const& o,
                         tensor<T const> const& d_o, tensor<L const> const& lse,
                         tensor<T const> const& dq, tensor<T const> const& dk,
                         tensor<T const> const& dv) {
  check_forward_args(who, q, k, v, o, lse);
  expect_same_shape(who, "output gradient", d_o, q);
  expect_same_shape(who, "query gradient", dq, q);
  expect_same_shape(who, "key gradient", dk, k);
  expect_same_shape(who, "value gradient", dv, v);
}

/// Calls f(std::integral_constant<int, D>{}) for the head dim d.
template <class F>
void with_head_dim(int d, F&& f) {
  switch (d) {
  case 16:
    return f(std::integral_constant<int, 16>{});
  case 32:
    return f(std::integral_constant<int, 32>{});
  case 64:
    return f(std::integral_constant<int, 64>{});
  default:
    return f(std::integral_constant<int, 128>{});
  }
}

} // namespace detail

/// The tile sizes flash_attention_forward and flash_attention_backward launch the kernels with
/// for head dim D: query tiles of attention_block_q<D> rows (the grid's axis 0 has
/// cdiv(N, attention_block_q<D>) programs in the forward, the delta and the dq launches) and key
/// tiles of attention_block_k<D> rows (the key-tile launches of the backward). 64 x 64 score
/// blocks; at D = 128, 32 query rows keep the working set (q, the o accumulator, k and v tiles)
/// in L2. A caller launching the kernels itself, or writing a backward for the forward the entry
/// point ran, uses these to get the same tiles.
template <int D>
inline constexpr int attention_block_q = D >= 128 ? 32 : 64;
template <int D>
inline constexpr int attention_block_k = 64;

namespace detail {

template <int D>
inline constexpr int block_q = attention_block_q<D>;
template <int D>
inline constexpr int block_k = attention_block_k<D>;

inline double default_scale(double s, std::int64_t d) {
  return s != 0 ? s : 1.0 / std::sqrt(static_cast<double>(d));
}

template <class A>
grid attention_grid(tensor<A> const& t, int block) {
  return grid(static_cast<int>(cdiv<std::int64_t>(t.size(2), block)), static_cast<int>(t.size(1)),
              static_cast<int>(t.size(0)));
}

} // namespace detail

/// o = attention(q, k, v) and its logsumexp lse, shapes checked first (errors name the tensor
/// and the axis). T is float or bf16 (lse is float), or double.
template <class T>
void flash_attention_forward(tensor<T const> q, tensor<T const> k, tensor<T const> v, tensor<T> o,
                             tensor<fp32<T>> lse, attention_options const& opt = {}) {
  detail::check_forward_args<T, fp32<T>>("flash_attention", q, k, v, o, lse);
  double const scale = detail::default_scale(opt.scale, q.size(3));
  detail::with_head_dim(static_cast<int>(q.size(3)), [&](auto dc) {
    constexpr int D = decltype(dc)::value, BQ = attention_block_q<D>, BK = attention_block_k<D>;
    auto const g = detail::attention_grid(q, BQ);
    if (opt.causal)
      launch(opt.launch, g, flash_attention_fwd<D, BQ, BK, true>, q, k, v, o, lse, scale);
    else
      launch(opt.launch, g, flash_attention_fwd<D, BQ, BK, false>, q, k, v, o, lse, scale);
  });
}

/// dq, dk, dv from d_o, with o and lse from the forward. two_pass (the default): a key-tile
/// launch for dk, dv and a query-tile launch for dq; atomic_dq: one launch over key tiles adding
/// dq atomically into an fp32 buffer. Both start with the delta launch. two_pass recomputes the
/// scores once more but gives the same gradients, to the bit, for any thread count; atomic_dq
/// adds dq in the order the programs run. On a 16-core Xeon atomic_dq ran about 1.2 times faster
/// in fp32 and two_pass 1.3 times faster in bf16 (docs/performance.md, "Float atomics by lock
/// stripes").
template <class T>
void flash_attention_backward(tensor<T const> q, tensor<T const> k, tensor<T const> v,
                              tensor<T const> o, tensor<T const> d_o, tensor<fp32<T> const> lse,
                              tensor<T> dq, tensor<T> dk, tensor<T> dv,
                              attention_options const& opt = {},
                              attention_backward variant = attention_backward::two_pass) {
  using F = fp32<T>;
  detail::check_backward_args<T, F>("flash_attention", q, k, v, o, d_o, lse, dq, dk, dv);
  double const scale = detail::default_scale(opt.scale, q.size(3));
  owned_tensor<F> delta({q.size(0), q.size(1), q.size(2)}, "delta");
  detail::with_head_dim(static_cast<int>(q.size(3)), [&](auto dc) {
    constexpr int D = decltype(dc)::value, BQ = attention_block_q<D>, BK = attention_block_k<D>;
    launch(opt.launch, detail::attention_grid(q, BQ), flash_attention_bwd_delta<D, BQ>, o, d_o,
           delta.view());
    auto const keys = detail::attention_grid(k, BK);
    auto run = [&]<bool Causal>() {
      if (variant == attention_backward::two_pass) {
        tensor<F> none = delta.view(); // the dq argument the dk/dv pass does not touch
        launch(opt.launch, keys, flash_attention_bwd_dkdv<D, BQ, BK, Causal>, q, k, v, d_o, lse,
               delta.cview(), none, dk, dv, scale);
        launch(opt.launch, detail::attention_grid(q, BQ), flash_attention_bwd_dq<D, BQ, BK, Causal>,
               q, k, v, d_o, lse, delta.cview(), dq, scale);
        return;
      }
      // dq accumulates in fp32: dq itself when T is fp32, else a buffer converted afterwards.
      if constexpr (std::is_same_v<T, F>) {
        if (dq.is_contiguous())
          std::fill_n(dq.data(), dq.numel(), F(0));
        else
          for (std::int64_t i = 0; i < dq.numel(); ++i)
            dq.data()[dq.row_major_offset(i)] = F(0);
        launch(opt.launch, keys, flash_attention_bwd<D, BQ, BK, Causal>, q, k, v, d_o, lse,
               delta.cview(), dq, dk, dv, scale);
      } else {
        owned_tensor<F> acc({q.size(0), q.size(1), q.size(2), q.size(3)}, "dq (fp32)");
        launch(opt.launch, keys, flash_attention_bwd<D, BQ, BK, Causal>, q, k, v, d_o, lse,
               delta.cview(), acc.view(), dk, dv, scale);
        copy(acc.cview(), dq); // traced under check_backward, to the atomic additions
      }
    };
    if (opt.causal)
      run.template operator()<true>();
    else
      run.template operator()<false>();
  });
}

} // namespace tilegrad::kernels
