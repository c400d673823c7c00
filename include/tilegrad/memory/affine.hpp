// Affine structure of integer offset expressions. Offsets built from arange, constants and
// broadcasts (pid * B + arange<0, B>(), col(rows) * stride + row(cols)) are, along each
// innermost row, base + step * col. Knowing that lets a load or store of a contiguous row be
// one vector access instead of a gather; anything else falls back to a gather/scatter.
#pragma once

#include "tilegrad/tile/creation.hpp"
#include "tilegrad/tile/expr.hpp"
#include "tilegrad/tile/ops.hpp"

#include <cstdint>
#include <type_traits>

namespace tilegrad::detail {

/// One innermost row of an offset tile: element col is base + step * col.
struct affine_row {
  std::int64_t base;
  std::int64_t step;
  bool ok = true; // false: this row turned out not to be affine (a product of two ramps)
};

template <class N>
struct affine {
  // A node with one column per row is trivially affine; any other is not, by default.
  static constexpr bool value = shape_of_t<N>::inner == 1;
  static affine_row row(N const& n, int r) {
    return {static_cast<std::int64_t>(n.template load<1>(r, 0)), 0};
  }
};

template <class N>
inline constexpr bool is_affine_v = affine<std::remove_cvref_t<N>>::value;

template <class N>
TILEGRAD_INLINE affine_row affine_at(N const& n, int r) {
  return affine<std::remove_cvref_t<N>>::row(n, r);
}

template <class T>
struct affine<scalar_node<T>> {
  static constexpr bool value = std::is_integral_v<T>;
  static affine_row row(scalar_node<T> const& n, int) {
    return {static_cast<std::int64_t>(n.value), 0};
  }
};

template <int Start, int End>
struct affine<arange_node<Start, End>> {
  static constexpr bool value = true;
  static affine_row row(arange_node<Start, End> const&, int) { return {Start, 1}; }
};

template <class E, class S>
struct affine<broadcast_node<E, S>> {
  using N = broadcast_node<E, S>;
  using C = shape_of_t<E>;
  static constexpr bool inner_broadcast = C::inner == 1 && S::inner != 1;
  static constexpr bool value = inner_broadcast || S::inner == 1 || is_affine_v<E>;
  static affine_row row(N const& n, int r) {
    if constexpr (inner_broadcast || S::inner == 1)
      return {static_cast<std::int64_t>(n.e.template load<1>(N::child_row(r), 0)), 0};
    else
      return affine_at(n.e, N::child_row(r));
  }
};

template <class E, class S>
struct affine<reshape_node<E, S>> {
  using C = shape_of_t<E>;
  // Row r of the view is row r of E when the innermost extents agree (expand_dims on an outer
  // axis); a single-column view is affine anyway.
  static constexpr bool value = S::inner == 1 || (C::inner == S::inner && is_affine_v<E>);
  static affine_row row(reshape_node<E, S> const& n, int r) {
    if constexpr (S::inner == 1)
      return {static_cast<std::int64_t>(n.template load<1>(r, 0)), 0};
    else
      return affine_at(n.e, r);
  }
};

template <class To, class E>
struct affine<convert_node<To, E>> {
  static constexpr bool value = std::is_integral_v<To> && is_affine_v<E>;
  static affine_row row(convert_node<To, E> const& n, int r) { return affine_at(n.e, r); }
};

template <class A, class B>
struct affine<map_node<ops::add_op, A, B>> {
  static constexpr bool value = is_affine_v<A> && is_affine_v<B>;
  static affine_row row(map_node<ops::add_op, A, B> const& n, int r) {
    auto a = affine_at(get<0>(n.es), r);
    auto b = affine_at(get<1>(n.es), r);
    return {a.base + b.base, a.step + b.step, a.ok && b.ok};
  }
};

template <class A, class B>
struct affine<map_node<ops::sub_op, A, B>> {
  static constexpr bool value = is_affine_v<A> && is_affine_v<B>;
  static affine_row row(map_node<ops::sub_op, A, B> const& n, int r) {
    auto a = affine_at(get<0>(n.es), r);
    auto b = affine_at(get<1>(n.es), r);
    return {a.base - b.base, a.step - b.step, a.ok && b.ok};
  }
};

// A product stays affine when one factor is constant along the row (step 0).
template <class A, class B>
struct affine<map_node<ops::mul_op, A, B>> {
  static constexpr bool value = is_affine_v<A> && is_affine_v<B>;
  static affine_row row(map_node<ops::mul_op, A, B> const& n, int r) {
    auto a = affine_at(get<0>(n.es), r);
    auto b = affine_at(get<1>(n.es), r);
    if (a.step == 0)
      return {a.base * b.base, a.base * b.step, a.ok && b.ok};
    if (b.step == 0)
      return {a.base * b.base, a.step * b.base, a.ok && b.ok};
    return {0, 0, false}; // a product of two ramps: the caller gathers
  }
};

// a % m is affine along a row that does not wrap: 0 <= a < m across the row, m constant.
// (The Triton matmul tutorial's `(pid_n * BN + arange) % N` is affine on all but edge tiles.)
template <class A, class B>
struct affine<map_node<ops::mod_op, A, B>> {
  static constexpr bool value = is_affine_v<A> && is_affine_v<B>;
  static affine_row row(map_node<ops::mod_op, A, B> const& n, int r) {
    constexpr int L = shape_of_t<A>::inner;
    auto a = affine_at(get<0>(n.es), r);
    auto m = affine_at(get<1>(n.es), r);
    std::int64_t const last = a.base + a.step * (L - 1);
    bool const inside = m.step == 0 && a.base >= 0 && last >= 0 && a.base < m.base && last < m.base;
    return {a.base, a.step, a.ok && m.ok && inside};
  }
};

template <class A>
struct affine<map_node<ops::neg_op, A>> {
  static constexpr bool value = is_affine_v<A>;
  static affine_row row(map_node<ops::neg_op, A> const& n, int r) {
    auto a = affine_at(get<0>(n.es), r);
    return {-a.base, -a.step, a.ok};
  }
};

} // namespace tilegrad::detail
