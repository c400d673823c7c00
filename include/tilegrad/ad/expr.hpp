// Reverse mode of fused expressions. An expression over adjoint tiles is evaluated on its
// primal values (the float expression, same fused SIMD loop) and recorded as ONE tape record
// that keeps the primal expression tree; its backward() walks that tree once per vector of
// output lanes, applying each op's reverse rule from tile/ops.hpp and accumulating into the
// adjoints of the leaves (broadcast leaves sum over the broadcast lanes).
#pragma once

#include "tilegrad/ad/adjoint.hpp"
#include "tilegrad/ad/context.hpp"
#include "tilegrad/ad/tape.hpp"
#include "tilegrad/core/simd.hpp"
#include "tilegrad/tile/creation.hpp"
#include "tilegrad/tile/eval.hpp"
#include "tilegrad/tile/expr.hpp"
#include "tilegrad/tile/ops.hpp"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <type_traits>
#include <utility>

namespace tilegrad {

/// A recorded tile as a leaf of a primal expression: its values, and where its adjoint
/// accumulates (null: a constant, e.g. zeros<fp32<T>, N>()).
template <class T, class S>
struct active_ref : node_base {
  using value_type = T;
  using shape_type = S;
  static constexpr bool may_alias = false;
  template <int W>
  static constexpr bool vectorizes = simd::has_vec_v<T, W>;

  T const* values;
  T* adj;

  template <int W>
  TILEGRAD_INLINE simd::vec_t<T, W> load(int row, int col) const {
    return simd::load<T, W>(values + row * S::inner + col);
  }
};

/// How an adjoint tile enters an expression: element type adjoint<T>, so that whatever consumes
/// the expression (a tile, a reduction, dot, a store) takes the reverse-mode path.
template <class T, class S>
struct adjoint_leaf : node_base {
  using value_type = adjoint<T>;
  using shape_type = S;
  static constexpr bool may_alias = false;
  template <int W>
  static constexpr bool vectorizes = (W == 1);

  T const* values;
  T* adj;
  // The values slot of the lvalue tile it was made from (null: a temporary, an item). An
  // expression reads its tiles when it is evaluated, on the fast path and in forward mode; one
  // whose tile was assigned again in between would read the new values there and the old ones
  // here, so evaluation checks that the tile still holds these (check_current).
  T* const* live = nullptr;

  /// @pre the tile it was made from, if any, is alive and holds the same values.
  void check_current() const {
    if (live && *live != values) [[unlikely]]
      ad::tile_assigned_before_evaluation();
  }

  template <int W>
  simd::vec_t<adjoint<T>, W> load(int row, int col) const {
    static_assert(W == 1);
    return adjoint<T>(values[row * S::inner + col]);
  }
};

namespace ad {

// ---- primal transform: the same expression with adjoint leaves read as plain numbers ----------

template <class N>
struct primal_node {
  using type = N; // passive leaves (tiles, refs, constants, arange) stay as they are
  static N const& get(N const& n) { return n; }
};

template <class N>
using primal_node_t = typename primal_node<std::remove_cvref_t<N>>::type;

template <class N>
auto to_primal(N const& n) {
  return primal_node_t<N>(primal_node<std::remove_cvref_t<N>>::get(n));
}

template <class T, class S>
struct primal_node<adjoint_leaf<T, S>> {
  using type = active_ref<T, S>;
  static type get(adjoint_leaf<T, S> const& n) {
    n.check_current();
    return {{}, n.values, n.adj};
  }
};

template <class T>
struct primal_node<scalar_node<adjoint<T>>> {
  using type = scalar_node<T>;
  static type get(scalar_node<adjoint<T>> const& n) { return {{}, n.value.v}; }
};

template <class To, class E>
struct primal_node<convert_node<To, E>> {
  using P = primal_node_t<E>;
  using to = primal_of_t<To>;
  using type = std::conditional_t<std::is_same_v<value_of_t<P>, to>, P, convert_node<to, P>>;
  static type get(convert_node<To, E> const& n) {
    if constexpr (std::is_same_v<value_of_t<P>, to>)
      return to_primal(n.e);
    else
      return {{}, to_primal(n.e)};
  }
};

template <class E, class S>
struct primal_node<broadcast_node<E, S>> {
  using type = broadcast_node<primal_node_t<E>, S>;
  static type get(broadcast_node<E, S> const& n) { return {{}, to_primal(n.e)}; }
};

template <class E, class S>
struct primal_node<reshape_node<E, S>> {
  using type = reshape_node<primal_node_t<E>, S>;
  static type get(reshape_node<E, S> const& n) { return {{}, to_primal(n.e)}; }
};

template <class E, int... P>
struct primal_node<permute_node<E, P...>> {
  using type = permute_node<primal_node_t<E>, P...>;
  static type get(permute_node<E, P...> const& n) { return {{}, to_primal(n.e)}; }
};

template <class Op, class... Es>
struct primal_node<map_node<Op, Es...>> {
  using type = map_node<Op, primal_node_t<Es>...>;
  static type get(map_node<Op, Es...> const& n) {
    return n.es.apply([](auto const&... e) { return type{{}, {}, {to_primal(e)...}}; });
  }
};

// ---- persistence: a recorded expression owns what it reads in the backward sweep --------------

/// Repoints every reference to a plain tile (a mask, labels, an int weight: a tile<bool/int/
/// float> lvalue) at a copy on the tape. The record outlives the variable: the sweep runs after
/// the loop that changed it or the scope that held it ended. Adjoint tiles' values are already
/// on the tape and never change; temporaries and numbers are held by value.
template <int Size, class T>
T* tape_copy(T const* src, tape& tp) {
  T* copy = tp.alloc<T>(Size);
  std::copy_n(src, Size, copy);
  return copy;
}

template <class N>
void persist(N& n, tape& tp) {
  using D = std::remove_cvref_t<N>;
  if constexpr (requires { typename D::value_type; n.p; } &&
                std::is_same_v<D, tile_ref<value_of_t<D>, shape_of_t<D>>>) {
    n.p = tape_copy<shape_of_t<D>::size>(n.p, tp);
  } else if constexpr (std::is_same_v<D, tile_view<value_of_t<D>, shape_of_t<D>>>) {
    using T = value_of_t<D>;
    T const** slot = tp.alloc<T const*>(1); // a heap tile's leaf reads through a pointer
    *slot = tape_copy<shape_of_t<D>::size>(*n.pp, tp);
    n.pp = slot;
  } else if constexpr (requires { n.es; }) {
    n.es.apply([&tp](auto&... e) { (persist(e, tp), ...); });
  } else if constexpr (requires { n.e; }) {
    persist(n.e, tp);
  }
}

template <class N>
N persisted(N n, tape& tp) {
  persist(n, tp);
  return n;
}

// ---- activity: whether a primal expression has a leaf that can carry an adjoint ---------------

template <class N>
struct active : std::false_type {};
template <class N>
inline constexpr bool is_active_v = active<std::remove_cvref_t<N>>::value;

template <class T, class S>
struct active<active_ref<T, S>> : std::true_type {};
template <class E, class S>
struct active<broadcast_node<E, S>> : active<E> {};
template <class E, class S>
struct active<reshape_node<E, S>> : active<E> {};
template <class E, int... P>
struct active<permute_node<E, P...>> : active<E> {};
template <class To, class E>
struct active<convert_node<To, E>> : std::bool_constant<is_floating_v<To> && active<E>::value> {};
template <class Op, class... Es>
struct active<map_node<Op, Es...>>
    : std::bool_constant<Op::differentiable && (active<Es>::value || ...)> {};

/// Whether some leaf of n really carries an adjoint at run time (constants do not).
template <class N>
bool any_active(N const& n) {
  using D = std::remove_cvref_t<N>;
  if constexpr (!is_active_v<D>) {
    return false;
  } else if constexpr (requires { n.adj; }) {
    return n.adj != nullptr;
  } else if constexpr (requires { n.es; }) {
    return n.es.apply([](auto const&... e) { return (any_active(e) || ...); });
  } else {
    return any_active(n.e);
  }
}

// ---- backward through the tree ----------------------------------------------------------------

template <class T, int W>
TILEGRAD_INLINE T sum_lanes(simd::vec_t<T, W> const& g) {
  if constexpr (W == 1) {
    return g;
  } else {
    alignas(64) T l[W];
    g.store_unaligned(l);
    T s = l[0];
    for (int i = 1; i < W; ++i) s += l[i];
    return s;
  }
}

/// Adds g (the adjoint of lanes [c, c + W) of row r of n) into the adjoints of n's leaves.
template <int W, class N, class V>
TILEGRAD_INLINE void backprop(N const& n, int r, int c, V const& g);

/// The adjoints that reach, over one row of a recorded expression, each broadcast of a single
/// lane across the row (a row's maximum, mean or sum, a scale: `x - max(x)`, `y * col(s)`).
/// Without it every vector of the row sums its lanes and walks the tree below the broadcast;
/// with it the row's vectors are added lane by lane and the walk happens once per row (flush).
/// Active on the thread while a record walks its tree (row_sink_scope); the rows' sums are then
/// taken in another order, deterministically.
template <class T, int W>
struct row_sink {
  using vec = simd::vec_t<T, W>;
  // Four sums per broadcast, taken by the vectors of the row in turn (vector k of the row adds
  // to sum k % 4), so consecutive vectors do not wait on each other's addition.
  static constexpr int ways = 4;
  struct slot {
    void const* node;
    void (*flush)(void const* node, int row, T g);
    int row;
    vec acc[ways];
  };
  static constexpr int capacity = 4;
  slot slots[capacity];
  int used = 0;

  /// Adds g, lanes [c, c + W) of output row `row`, for `node`; false where every slot holds
  /// another node.
  TILEGRAD_INLINE bool add(void const* node, int row, int c, vec const& g,
                           void (*walk)(void const*, int, T)) {
    int const way = (c / W) % ways;
    for (int i = 0; i < used; ++i)
      if (slots[i].node == node && slots[i].row == row) {
        slots[i].acc[way] = slots[i].acc[way] + g;
        return true;
      }
    if (used == capacity)
      return false;
    slot& s = slots[used++];
    s.node = node;
    s.flush = walk;
    s.row = row;
    for (int k = 0; k < ways; ++k)
      s.acc[k] = vec(T(0));
    s.acc[way] = g;
    return true;
  }
  /// Walks below each broadcast with what its lanes received, in the order they first did.
  void flush() {
    for (int i = 0; i < used; ++i) {
      vec const* a = slots[i].acc;
      slots[i].flush(slots[i].node, slots[i].row, sum_lanes<T, W>((a[0] + a[1]) + (a[2] + a[3])));
    }
    used = 0;
  }
};

template <class T, int W>
inline thread_local row_sink<T, W>* active_row_sink = nullptr;

/// Makes `sink` the thread's row sink for (T, W) for its lifetime.
template <class T, int W>
struct row_sink_scope {
  row_sink<T, W>* previous;
  explicit row_sink_scope(row_sink<T, W>& sink) : previous(active_row_sink<T, W>) {
    active_row_sink<T, W> = &sink;
  }
  ~row_sink_scope() { active_row_sink<T, W> = previous; }
  row_sink_scope(row_sink_scope const&) = delete;
  row_sink_scope& operator=(row_sink_scope const&) = delete;
};

/// A row sink active for a record's walk, where its lanes vectorise (W > 1); nothing otherwise.
template <class T, int W>
struct row_sink_guard {
  row_sink<T, W> sink;
  row_sink_scope<T, W> scope{sink};
  void flush() { sink.flush(); }
};
template <class T>
struct row_sink_guard<T, 1> {
  void flush() {}
};

/// The walk below broadcast node D of the adjoint g its row's lanes received.
template <class D>
void flush_broadcast(void const* node, int row, value_of_t<D> g) {
  auto const& n = *static_cast<D const*>(node);
  backprop<1>(n.e, D::child_row(row), 0, g);
}

/// W lanes of values (double) moved by their whole rounding error, up or down at random per lane
/// (times the jitter's scale): a value a backward recomputes and rounds, once.
template <int W, class V>
V rounded_as_recomputed(V const& y) {
  jitter_settings const& j = rounding_jitter();
  alignas(64) double lanes[W];
  if constexpr (W == 1)
    lanes[0] = y;
  else
    simd::store<double, W>(lanes, y);
  for (double& v : lanes)
    v += (jitter_draw() < 0 ? -j.scale : j.scale) * j.unit * (v < 0 ? -v : v);
  if constexpr (W == 1)
    return lanes[0];
  else
    return simd::load<double, W>(lanes);
}

/// Stands for "the result of this node is not at hand: recompute it".
struct no_result {};

/// The lanes of v that are NaN. (Not v != v: xsimd's != of batches is an ordered comparison,
/// false for NaN.)
template <class V>
TILEGRAD_INLINE auto nan_lanes(V const& v) {
#if TILEGRAD_USE_XSIMD
  if constexpr (simd::is_batch_v<V>)
    return xsimd::isnan(v);
  else
#endif
    return std::isnan(v);
}
/// Whether a lane of v is NaN.
template <class V>
TILEGRAD_INLINE bool has_nan(V const& v) {
#if TILEGRAD_USE_XSIMD
  if constexpr (simd::is_batch_v<V>)
    return xsimd::any(xsimd::isnan(v));
  else
#endif
    return std::isnan(v);
}

/// A rule's contribution where the adjoint g is exactly zero is exactly zero: the rule of the
/// branch where() did not take, or of a masked lane, must not turn 0 * inf or 0 / 0 (log at 0,
/// an overflowed exp, a division by an empty count) into NaN. Rules that are +-g or a select
/// of g need no guard.
/// In a magnitude sweep (magnitude_sweep()), the contribution's absolute value; in a sweep of
/// squares (squares_sweep()), that of the rule applied twice, g * d^2 (rules are linear in g); in
/// one of counts (counts_sweep()), g where the partial is nonzero.
template <class Op, class V, class Rule>
TILEGRAD_INLINE V zero_stays_zero(V const& g, Rule const& rule) {
  V c = rule(g);
  if constexpr (!Op::passes_adjoint) {
    c = ops::detail::select(g == V(0), V(0), c);
    // So is an infinite (or NaN) adjoint's through a partial derivative of exactly zero, as a
    // zero tangent's is in forward mode: sqrt at 0 (adjoint inf) of x * w with w = 0, a function
    // constant in x, gives x 0, not inf * 0. (Rules are linear in g: rule(1) is the partial.
    // Taken only where a lane is NaN, which a finite adjoint never makes of a finite partial.)
    if (has_nan(c)) [[unlikely]]
      c = ops::detail::select(nan_lanes(c) && (rule(V(1)) == V(0)), V(0), c);
  }
  if (magnitude_sweep()) [[unlikely]] {
    if (squares_sweep())
      c = ops::detail::select(c == V(0), V(0), rule(c));
    else if (counts_sweep())
      c = ops::detail::select(c == V(0), V(0), g); // g counts the terms below: as many here
    c = ops::abs_op::apply(c);
  }
  return c;
}

template <int W, class Op, class... Es, std::size_t... I, class V, class Y = no_result>
TILEGRAD_INLINE void backprop_map(map_node<Op, Es...> const& n, int r, int c, V const& g,
                                  std::index_sequence<I...>, Y const& known = {}) {
  using T = typename map_node<Op, Es...>::operand_type;
  auto const x = std::make_tuple(tilegrad::detail::get<I>(n.es).template load<W>(r, c)...);
  auto const z = [&g](auto const& rule) { return zero_stays_zero<Op>(g, rule); };
  if constexpr (std::is_same_v<Op, ops::where_op>) {
    auto const m = simd::mask_for<T, W>(std::get<0>(x));
    if constexpr (is_active_v<std::tuple_element_t<1, std::tuple<Es...>>>)
      backprop<W>(tilegrad::detail::get<1>(n.es), r, c, ops::detail::select(m, g, V(0)));
    if constexpr (is_active_v<std::tuple_element_t<2, std::tuple<Es...>>>)
      backprop<W>(tilegrad::detail::get<2>(n.es), r, c,
                  ops::detail::select(m, V(0), branches_sweep() ? g * V(2) : g));
  } else if constexpr (sizeof...(Es) == 1) {
    auto const y = [&] {
      if constexpr (std::is_same_v<Y, no_result>)
        return Op::apply(std::get<0>(x));
      else
        return known;
    }();
    constexpr bool saturating =
        std::is_same_v<Op, ops::sigmoid_op> || std::is_same_v<Op, ops::tanh_op>;
    if constexpr (saturating)
      if (magnitude_sweep()) [[unlikely]] {
        // Backwards take these slopes as s (1 - s) and 1 - t^2, differences whose roundings are
        // those of their terms (u t^2 where 1 - t^2 is 1e-8): the running error bound weighs
        // them by their terms' magnitudes, s (1 + s) and 1 + t^2, as it would the subtraction.
        backprop<W>(tilegrad::detail::get<0>(n.es), r, c, z([&](V const& h) {
                      if constexpr (std::is_same_v<Op, ops::sigmoid_op>)
                        return h * y * (V(1) + y);
                      else
                        return h * (V(1) + y * y);
                    }));
        return;
      }
    if constexpr (saturating && std::is_same_v<T, double>)
      if (rounding_jitter().seed != 0 && current_state() && !magnitude_sweep()) [[unlikely]] {
        // A jittered reference (check_backward's second look): the slope as a backward takes it,
        // s (1 - s) with s = sigmoid(x) recomputed and rounded, 1 - s then off by u s / (1 - s)
        // of itself; likewise 1 - t^2 with t = tanh(x), off by 2 u t^2 / (1 - t^2). (The exact
        // slopes have no such error, and stay the rule elsewhere.)
        backprop<W>(tilegrad::detail::get<0>(n.es), r, c,
                    z([&](V const& h) {
                      V const s = rounded_as_recomputed<W>(y);
                      if constexpr (std::is_same_v<Op, ops::sigmoid_op>)
                        return h * s * (V(1) - s);
                      else
                        return h * (V(1) - s * s);
                    }));
        return;
      }
    if constexpr (std::is_same_v<Op, ops::abs_op>)
      if (branches_sweep()) [[unlikely]] { // a negative value is abs's second branch
        V const t = z([&](V const& h) { return Op::grad(std::get<0>(x), y, h); });
        backprop<W>(tilegrad::detail::get<0>(n.es), r, c,
                    ops::detail::select(std::get<0>(x) < V(0), t * V(2), t));
        return;
      }
    backprop<W>(tilegrad::detail::get<0>(n.es), r, c,
                z([&](V const& h) { return Op::grad(std::get<0>(x), y, h); }));
  } else if constexpr (sizeof...(Es) == 2) {
    auto const& a = std::get<0>(x);
    auto const& b = std::get<1>(x);
    auto const y = [&] {
      if constexpr (std::is_same_v<Y, no_result>)
        return Op::apply(a, b);
      else
        return known;
    }();
    if constexpr (is_active_v<std::tuple_element_t<0, std::tuple<Es...>>>)
      backprop<W>(tilegrad::detail::get<0>(n.es), r, c,
                  z([&](V const& h) { return Op::grad0(a, b, y, h); }));
    constexpr bool picks = std::is_same_v<Op, ops::maximum_op> ||
                           std::is_same_v<Op, ops::minimum_op>; // the second operand: a branch
    if constexpr (is_active_v<std::tuple_element_t<1, std::tuple<Es...>>>) {
      V const t = z([&](V const& h) { return Op::grad1(a, b, y, h); });
      backprop<W>(tilegrad::detail::get<1>(n.es), r, c, picks && branches_sweep() ? t * V(2) : t);
    }
  } else {
    static_assert(std::is_same_v<Op, ops::fma_op>);
    auto const& a = std::get<0>(x);
    auto const& b = std::get<1>(x);
    auto const& cc = std::get<2>(x);
    if constexpr (is_active_v<std::tuple_element_t<0, std::tuple<Es...>>>)
      backprop<W>(tilegrad::detail::get<0>(n.es), r, c,
                  z([&](V const& h) { return Op::grad0(a, b, cc, h); }));
    if constexpr (is_active_v<std::tuple_element_t<1, std::tuple<Es...>>>)
      backprop<W>(tilegrad::detail::get<1>(n.es), r, c,
                  z([&](V const& h) { return Op::grad1(a, b, cc, h); }));
    if constexpr (is_active_v<std::tuple_element_t<2, std::tuple<Es...>>>)
      backprop<W>(tilegrad::detail::get<2>(n.es), r, c,
                  z([&](V const& h) { return Op::grad2(a, b, cc, h); }));
  }
  (void)sizeof(T);
}

template <int W, class N, class V>
TILEGRAD_INLINE void backprop(N const& n, int r, int c, V const& g) {
  using D = std::remove_cvref_t<N>;
  if constexpr (!is_active_v<D>) {
    return;
  } else if constexpr (requires { n.adj; }) { // active_ref
    if (!n.adj) return;
    using T = value_of_t<D>;
    T* a = n.adj + r * shape_of_t<D>::inner + c;
    simd::store<T, W>(a, simd::load<T, W>(a) + g);
  } else if constexpr (requires { typename D::reshape_source; }) {
    using C = shape_of_t<decltype(n.e)>;
    int const flat = r * shape_of_t<D>::inner + c;
    backprop<W>(n.e, flat / C::inner, flat % C::inner, g);
  } else if constexpr (requires { n.e; } && requires { D::child_row(0); }) { // broadcast
    using C = shape_of_t<decltype(n.e)>;
    using S = shape_of_t<D>;
    if constexpr (C::inner == 1 && S::inner != 1) {
      using T = value_of_t<D>;
      if constexpr (W > 1 && std::is_same_v<V, simd::vec_t<T, W>>)
        if (row_sink<T, W>* sink = active_row_sink<T, W>)
          if (sink->add(&n, r, c, g, &flush_broadcast<D>))
            return;
      backprop<1>(n.e, D::child_row(r), 0, sum_lanes<T, W>(g));
    } else
      backprop<W>(n.e, D::child_row(r), c, g);
  } else if constexpr (requires { n.es; }) {
    backprop_map<W>(n, r, c, g, std::make_index_sequence<decltype(n.es)::size>{});
  } else if constexpr (requires { typename D::from_type; }) { // between float widths
    using F = typename D::from_type;
    backprop<W>(n.e, r, c, simd::convert<F, W, value_of_t<D>>(g));
  } else { // permute: scalar lanes only
    static_assert(W == 1);
    using C = shape_of_t<decltype(n.e)>;
    using S = shape_of_t<D>;
    int out[3] = {0, 0, 0};
    int rem = r;
    out[S::rank - 1] = c;
    for (int a = S::rank - 2; a >= 0; --a) {
      out[a] = rem % S::dim(a);
      rem /= S::dim(a);
    }
    int in[3] = {0, 0, 0};
    constexpr int perm[] = {D::perm(0), D::perm(S::rank > 1 ? 1 : 0), D::perm(S::rank > 2 ? 2 : 0)};
    for (int a = 0; a < S::rank; ++a) in[perm[a]] = out[a];
    int in_row = 0;
    for (int a = 0; a < C::rank - 1; ++a) in_row += in[a] * (C::stride(a) / C::inner);
    backprop<1>(n.e, in_row, in[C::rank - 1], g);
  }
}

/// Backpropagates g through the root n of a recorded expression whose result, y, was kept:
/// the root's own rule reads y rather than computing it again (an exp, a division).
template <class N>
inline constexpr bool is_map_node_v = false;
template <class Op, class... Es>
inline constexpr bool is_map_node_v<map_node<Op, Es...>> = true;

// Whether evaluating an expression again in the backward pass costs no more than keeping its
// values would (no transcendental function, no division): such an expression is summed and
// differentiated without being materialised.
template <class Op>
inline constexpr bool cheap_op = true;
template <> inline constexpr bool cheap_op<ops::exp_op> = false;
template <> inline constexpr bool cheap_op<ops::exp2_op> = false;
template <> inline constexpr bool cheap_op<ops::log_op> = false;
template <> inline constexpr bool cheap_op<ops::log2_op> = false;
template <> inline constexpr bool cheap_op<ops::sqrt_op> = false;
template <> inline constexpr bool cheap_op<ops::rsqrt_op> = false;
template <> inline constexpr bool cheap_op<ops::sin_op> = false;
template <> inline constexpr bool cheap_op<ops::cos_op> = false;
template <> inline constexpr bool cheap_op<ops::sigmoid_op> = false;
template <> inline constexpr bool cheap_op<ops::tanh_op> = false;
template <> inline constexpr bool cheap_op<ops::erf_op> = false;
template <> inline constexpr bool cheap_op<ops::div_op> = false;
template <> inline constexpr bool cheap_op<ops::mod_op> = false;

template <class N>
struct cheap : std::true_type {}; // leaves
template <class N>
inline constexpr bool is_cheap_v = cheap<std::remove_cvref_t<N>>::value;
template <class E, class S>
struct cheap<broadcast_node<E, S>> : cheap<E> {};
template <class E, class S>
struct cheap<reshape_node<E, S>> : cheap<E> {};
template <class E, int... P>
struct cheap<permute_node<E, P...>> : cheap<E> {};
template <class To, class E>
struct cheap<convert_node<To, E>> : cheap<E> {};
template <class Op, class... Es>
struct cheap<map_node<Op, Es...>> : std::bool_constant<cheap_op<Op> && (cheap<Es>::value && ...)> {};

template <class N>
inline constexpr bool keeps_operand_type = false;
template <class Op, class... Es>
inline constexpr bool keeps_operand_type<map_node<Op, Es...>> =
    std::is_same_v<value_of_t<map_node<Op, Es...>>, typename map_node<Op, Es...>::operand_type>;

template <int W, class N, class V>
TILEGRAD_INLINE void backprop_root(N const& n, int r, int c, V const& g, V const& y) {
  if constexpr (keeps_operand_type<N>)
    backprop_map<W>(n, r, c, g, std::make_index_sequence<decltype(n.es)::size>{}, y);
  else
    backprop<W>(n, r, c, g);
}

/// The tape record of one fused expression assigned to a tile of shape S.
template <class S, class P>
struct expr_record final : record {
  using T = value_of_t<P>;
  P primal;
  T* adj;         // adjoint of the result
  T const* value; // the result

  expr_record(P p, T* a, T const* v) : primal(std::move(p)), adj(a), value(v) {}

  void backward() override {
    constexpr int W = detail::width_for<T, P>;
    constexpr int L = S::inner;
    [[maybe_unused]] row_sink_guard<T, W> sink;
    for (int r = 0; r < S::rows; ++r) {
      T const* g = adj + r * L;
      T const* y = value + r * L;
      int c = 0;
      if constexpr (W > 1) {
        for (; c + W <= L; c += W)
          backprop_root<W>(primal, r, c, simd::load<T, W>(g + c), simd::load<T, W>(y + c));
        sink.flush();
      }
      for (; c < L; ++c)
        if (g[c] != T(0)) backprop_root<1>(primal, r, c, g[c], y[c]);
    }
  }
};

} // namespace ad
} // namespace tilegrad
