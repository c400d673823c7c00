// Compile-time tile shapes and NumPy broadcasting between them.
#pragma once

#include <array>
#include <cstddef>
#include <type_traits>

namespace tilegrad {

/// A compile-time tile shape, row-major. Ranks 0 to 3; every extent positive.
template <int... Ns>
struct shape {
  static_assert(sizeof...(Ns) <= 3, "tilegrad: tiles have rank 0 to 3");
  static_assert(((Ns > 0) && ...), "tilegrad: tile extents must be positive");

  static constexpr int rank = sizeof...(Ns);
  static constexpr std::array<int, sizeof...(Ns)> dims{Ns...};
  static constexpr int size = (1 * ... * Ns);
  /// Extent of the innermost axis (1 for rank 0): the axis vectorised loops run along.
  static constexpr int inner = rank == 0 ? 1 : dims[rank == 0 ? 0 : rank - 1];
  /// Number of innermost rows: every axis but the last, flattened.
  static constexpr int rows = size / inner;

  static constexpr int dim(int axis) { return dims[static_cast<std::size_t>(axis)]; }
  /// Row-major stride of an axis, in elements.
  static constexpr int stride(int axis) {
    int s = 1;
    for (int a = rank - 1; a > axis; --a) s *= dims[static_cast<std::size_t>(a)];
    return s;
  }
};

template <class S>
inline constexpr bool is_shape_v = false;
template <int... Ns>
inline constexpr bool is_shape_v<shape<Ns...>> = true;

namespace detail {

// Extent of axis `a` (counted from the right, 0 = innermost) of S, 1 past its rank.
template <class S>
constexpr int extent_from_right(int a) {
  return a < S::rank ? S::dims[static_cast<std::size_t>(S::rank - 1 - a)] : 1;
}

template <class A, class B>
constexpr bool broadcastable() {
  constexpr int r = A::rank > B::rank ? A::rank : B::rank;
  for (int a = 0; a < r; ++a) {
    int x = extent_from_right<A>(a), y = extent_from_right<B>(a);
    if (x != y && x != 1 && y != 1) return false;
  }
  return true;
}

template <class A, class B, class Seq>
struct broadcast_shape_impl;
template <class A, class B, std::size_t... Is>
struct broadcast_shape_impl<A, B, std::index_sequence<Is...>> {
  static constexpr int r = sizeof...(Is);
  static constexpr int ext(std::size_t i) {
    int a = r - 1 - static_cast<int>(i);
    int x = extent_from_right<A>(a), y = extent_from_right<B>(a);
    return x == 1 ? y : x;
  }
  using type = shape<ext(Is)...>;
};

// Instantiated only when two shapes do not broadcast: its name, printed by the compiler on
// the line that carries the assertion, says which shapes met.
template <class Lhs, class Rhs>
struct shapes_do_not_broadcast {
  static_assert(broadcastable<Lhs, Rhs>(),
                "tilegrad: tile shapes do not broadcast: extents must match or be 1 (align them "
                "with expand_dims / broadcast_to, or reshape one operand)");
  using type = shape<>;
};

} // namespace detail

/// True when NumPy broadcasting accepts A and B (extents aligned from the right, equal or 1).
template <class A, class B>
inline constexpr bool broadcastable_v = detail::broadcastable<A, B>();

/// True when From broadcasts to To itself (To's rank at least From's; each extent of From equal
/// to To's or 1): what a value stored through pointers of shape To may have.
template <class From, class To>
inline constexpr bool broadcasts_to_v = [] {
  if (From::rank > To::rank) return false;
  for (int a = 0; a < From::rank; ++a) {
    int const x = detail::extent_from_right<From>(a), y = detail::extent_from_right<To>(a);
    if (x != y && x != 1) return false;
  }
  return true;
}();

/// The broadcast shape of A and B; a compile error naming both when they do not broadcast.
template <class A, class B>
using broadcast_shape_t = typename std::conditional_t<
    broadcastable_v<A, B>,
    detail::broadcast_shape_impl<A, B,
                                 std::make_index_sequence<(A::rank > B::rank ? A::rank : B::rank)>>,
    detail::shapes_do_not_broadcast<A, B>>::type;

/// Normalises a Python-style axis (negative counts from the end).
template <class S, int Axis>
constexpr int normalize_axis() {
  static_assert(Axis >= -S::rank && Axis < S::rank,
                "tilegrad: reduction/scan axis is out of range for this tile's rank");
  return Axis < 0 ? Axis + S::rank : Axis;
}

} // namespace tilegrad
