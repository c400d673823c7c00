// Reductions along an axis or over the whole tile (sum, max, min, argmax, argmin; Triton's
// tl.sum etc. with keep_dims), and the inclusive scan cumsum. The operand expression is read
// in one pass, without a temporary; the (smaller) result is a tile.
#pragma once

#include "tilegrad/ad/adjoint.hpp"
#include "tilegrad/core/config.hpp"
#include "tilegrad/core/shape.hpp"
#include "tilegrad/core/simd.hpp"
#include "tilegrad/core/types.hpp"
#include "tilegrad/tile/eval.hpp"
#include "tilegrad/tile/expr.hpp"
#include "tilegrad/tile/ops.hpp"
#include "tilegrad/tile/tile.hpp"

#include <concepts>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace tilegrad {

namespace ad { // reverse mode (ad/reduce.hpp) takes over for adjoint tiles
template <class Op, int Axis, bool Keep, class E>
auto reduce(E&& e);
template <class Op, bool Keep, class E>
auto reduce_all(E&& e);
template <int Axis, bool Reverse, class E>
auto cumsum(E&& e);
template <class N>
auto to_primal(N const& n);
} // namespace ad

/// Tag asking a reduction to keep the reduced axis with extent 1.
struct keep_dims_t {};
inline constexpr keep_dims_t keep_dims{};

namespace detail {

template <class S, int Axis, bool Keep, class Seq>
struct reduced_shape;
template <class S, int Axis, bool Keep, std::size_t... Is>
struct reduced_shape<S, Axis, Keep, std::index_sequence<Is...>> {
  static constexpr int ext(int i) {
    if (Keep) return i == Axis ? 1 : S::dim(i);
    return i < Axis ? S::dim(i) : S::dim(i + 1);
  }
  using type = shape<ext(static_cast<int>(Is))...>;
};
template <class S, int Axis, bool Keep>
using reduced_shape_t =
    typename reduced_shape<S, Axis, Keep, std::make_index_sequence<Keep ? S::rank : S::rank - 1>>::type;

template <class T, class S>
struct tile_of_shape;
template <class T, int... Ns>
struct tile_of_shape<T, shape<Ns...>> {
  using type = tile<T, Ns...>;
};
/// tile<T, ...> with the extents of shape S.
template <class T, class S>
using tile_t = typename tile_of_shape<T, S>::type;

// The three-level view a reduction along `a` takes of shape C: element (o, k, i) with
// o < outer, k < extent of a, i < inner (every later axis flattened), at flat o*A*I + k*I + i.
template <class C, int A>
struct axis_split {
  static constexpr int outer = [] {
    int p = 1;
    for (int i = 0; i < A; ++i) p *= C::dim(i);
    return p;
  }();
  static constexpr int extent = C::dim(A);
  static constexpr int inner = C::size / (outer * extent);
};

template <class Op, class V>
TILEGRAD_INLINE V combine(V const& a, V const& b) {
  return Op::apply(a, b);
}

// Op-reduction of the lanes of one vector.
template <class Op, class T, class V>
TILEGRAD_INLINE T reduce_lanes(V const& v) {
#if TILEGRAD_USE_XSIMD
  if constexpr (std::is_same_v<Op, ops::add_op>) return xsimd::hadd(v);
#if defined(__AVX512F__)
  // The pairwise order of the loop below (lane l with lane l + w for w = 8, 4, 2, 1), on the
  // register: a row's maximum through memory and 15 scalar steps cost a 64 x 64 tile's max<1>
  // ten times its max<0>.
  if constexpr (std::is_same_v<T, float> && V::size == 16) {
    V x = v;
    x = combine<Op>(x, V(_mm512_shuffle_f32x4(x, x, 0x4E)));
    x = combine<Op>(x, V(_mm512_shuffle_f32x4(x, x, 0xB1)));
    x = combine<Op>(x, V(_mm512_permute_ps(x, 0x4E)));
    x = combine<Op>(x, V(_mm512_permute_ps(x, 0xB1)));
    return _mm512_cvtss_f32(x);
  } else if constexpr (std::is_same_v<T, double> && V::size == 8) {
    V x = v;
    x = combine<Op>(x, V(_mm512_shuffle_f64x2(x, x, 0x4E)));
    x = combine<Op>(x, V(_mm512_shuffle_f64x2(x, x, 0xB1)));
    x = combine<Op>(x, V(_mm512_permute_pd(x, 0x55)));
    return _mm512_cvtsd_f64(x);
  }
#endif
#endif
  // Pairwise, so the combines of one step are independent of each other.
  alignas(64) T lanes[V::size];
  v.store_unaligned(lanes);
  for (std::size_t w = V::size / 2; w >= 1; w /= 2)
    for (std::size_t l = 0; l < w; ++l) lanes[l] = combine<Op>(lanes[l], lanes[l + w]);
  return lanes[0];
}

// out[o*I + i] = Op-reduction over k of n[o, k, i]; out has C::size / extent elements.
template <class Op, class C, int A, class T, class N>
TILEGRAD_INLINE void reduce_axis(T* out, N const& n) {
  using split = axis_split<C, A>;
  constexpr int W = width_for<T, N>;
  constexpr int L = C::inner;
  if constexpr (A == C::rank - 1) {
    // Innermost axis: a vector accumulator along the row, then across its lanes.
    for (int r = 0; r < C::rows; ++r) {
      int c = 0;
      T acc;
      if constexpr (W > 1) {
        if (L >= 4 * W) {
          // Four independent accumulators: one would wait out the combine's latency at
          // every step (a long row's sum ran at a third of the load rate). They advance
          // together, so memory is read in order.
          auto v0 = n.template load<W>(r, 0);
          auto v1 = n.template load<W>(r, W);
          auto v2 = n.template load<W>(r, 2 * W);
          auto v3 = n.template load<W>(r, 3 * W);
          for (c = 4 * W; c + 4 * W <= L; c += 4 * W) {
            v0 = combine<Op>(v0, n.template load<W>(r, c));
            v1 = combine<Op>(v1, n.template load<W>(r, c + W));
            v2 = combine<Op>(v2, n.template load<W>(r, c + 2 * W));
            v3 = combine<Op>(v3, n.template load<W>(r, c + 3 * W));
            simd::keep_order(v0, v1, v2, v3); // (the loads in the row's order)
          }
          for (; c + W <= L; c += W) v0 = combine<Op>(v0, n.template load<W>(r, c));
          acc = reduce_lanes<Op, T>(combine<Op>(combine<Op>(v0, v1), combine<Op>(v2, v3)));
        } else if (L >= W) {
          auto v = n.template load<W>(r, 0);
          for (c = W; c + W <= L; c += W) v = combine<Op>(v, n.template load<W>(r, c));
          acc = reduce_lanes<Op, T>(v);
        } else {
          acc = n.template load<1>(r, 0);
          c = 1;
        }
      } else {
        acc = n.template load<1>(r, 0);
        c = 1;
      }
      for (; c < L; ++c) acc = combine<Op>(acc, n.template load<1>(r, c));
      out[r] = acc;
    }
  } else {
    // An outer axis: whole rows combine lane by lane, vectorised along the row.
    constexpr int mid = split::inner / L; // rows per k-slab
    for (int o = 0; o < split::outer; ++o) {
      for (int m = 0; m < mid; ++m) {
        T* d = out + (o * mid + m) * L;
        int const r0 = (o * split::extent) * mid + m;
        int c = 0;
        if constexpr (W > 1) {
          // Four vectors of the row at a time: each column still combines its k in order, but
          // four chains advance together instead of waiting out the combine's latency in turn
          // (a max over the 64 rows of a 64 x 64 tile took 3.5x the time).
          for (; c + 4 * W <= L; c += 4 * W) {
            auto v0 = n.template load<W>(r0, c);
            auto v1 = n.template load<W>(r0, c + W);
            auto v2 = n.template load<W>(r0, c + 2 * W);
            auto v3 = n.template load<W>(r0, c + 3 * W);
            for (int k = 1; k < split::extent; ++k) {
              int const rk = r0 + k * mid;
              v0 = combine<Op>(v0, n.template load<W>(rk, c));
              v1 = combine<Op>(v1, n.template load<W>(rk, c + W));
              v2 = combine<Op>(v2, n.template load<W>(rk, c + 2 * W));
              v3 = combine<Op>(v3, n.template load<W>(rk, c + 3 * W));
            }
            simd::store<T, W>(d + c, v0);
            simd::store<T, W>(d + c + W, v1);
            simd::store<T, W>(d + c + 2 * W, v2);
            simd::store<T, W>(d + c + 3 * W, v3);
          }
          for (; c + W <= L; c += W) {
            auto v = n.template load<W>(r0, c);
            for (int k = 1; k < split::extent; ++k)
              v = combine<Op>(v, n.template load<W>(r0 + k * mid, c));
            simd::store<T, W>(d + c, v);
          }
        }
        for (; c < L; ++c) {
          T v = n.template load<1>(r0, c);
          for (int k = 1; k < split::extent; ++k)
            v = combine<Op>(v, n.template load<1>(r0 + k * mid, c));
          d[c] = v;
        }
      }
    }
  }
}

// Op-reduction of every element.
template <class Op, class C, class T, class N>
TILEGRAD_INLINE T reduce_all(N const& n) {
  if constexpr (C::rank == 0) {
    return n.template load<1>(0, 0);
  } else {
    tile_t<T, shape<C::rows>> rows_acc(uninitialized); // reduce each row, then the row results
    reduce_axis<Op, C, C::rank - 1, T>(rows_acc.data(), n);
    T acc = rows_acc.data()[0];
    for (int r = 1; r < C::rows; ++r) acc = combine<Op>(acc, rows_acc.data()[r]);
    return acc;
  }
}

template <class Op, int Axis, bool Keep, class E>
TILEGRAD_INLINE auto reduce_plain(E&& e);
template <class Op, bool Keep, class E>
TILEGRAD_INLINE auto reduce_all_plain(E&& e);

template <class Op, int Axis, bool Keep, class E>
TILEGRAD_INLINE auto reduce(E&& e) {
  if constexpr (adjoint_scalar<value_of_t<E>>) {
    return ad::reduce<Op, Axis, Keep>(std::forward<E>(e));
  } else {
    return reduce_plain<Op, Axis, Keep>(std::forward<E>(e));
  }
}

template <class Op, int Axis, bool Keep, class E>
TILEGRAD_INLINE auto reduce_plain(E&& e) {
  using C = shape_of_t<E>;
  using T = acc_t<value_of_t<E>>;
  static_assert(!std::is_same_v<value_of_t<E>, bf16>,
                "tilegrad: bf16 is a storage type: convert with to<float>(x) before reducing "
                "(to<fp32<T>>(x) in a kernel generic over T: it stays float64 in the checker's "
                "reference)");
  auto n = convert_as<T>(as_node(std::forward<E>(e)));
  constexpr int a = normalize_axis<C, Axis>();
  tile_t<T, reduced_shape_t<C, a, Keep>> out(uninitialized);
  reduce_axis<Op, C, a, T>(out.data(), n);
  return out;
}

template <class Op, bool Keep, class E>
TILEGRAD_INLINE auto reduce_all_to_tile(E&& e) {
  if constexpr (adjoint_scalar<value_of_t<E>>)
    return ad::reduce_all<Op, Keep>(std::forward<E>(e));
  else
    return reduce_all_plain<Op, Keep>(std::forward<E>(e));
}

template <class Op, bool Keep, class E>
TILEGRAD_INLINE auto reduce_all_plain(E&& e) {
  using C = shape_of_t<E>;
  using T = acc_t<value_of_t<E>>;
  auto n = convert_as<T>(as_node(std::forward<E>(e)));
  T v = reduce_all<Op, C, T>(n);
  if constexpr (Keep) {
    using K = decltype([]<std::size_t... Is>(std::index_sequence<Is...>) {
      return shape<(static_cast<void>(Is), 1)...>{};
    }(std::make_index_sequence<C::rank>{}));
    return tile_t<T, K>(v);
  } else {
    return tile<T>(v);
  }
}

// argmax / argmin: first index on ties (strict comparison keeps the earliest).
template <bool Max, int Axis, bool Keep, class E>
TILEGRAD_INLINE auto arg_reduce(E&& e) {
  using C = shape_of_t<E>;
  auto n = [&] {
    if constexpr (adjoint_scalar<value_of_t<E>>)
      return ad::to_primal(as_node(std::forward<E>(e))); // indices have no gradient
    else
      return as_node(std::forward<E>(e));
  }();
  using T = value_of_t<decltype(n)>;
  constexpr int a = normalize_axis<C, Axis>();
  using split = axis_split<C, a>;
  tile_t<std::int32_t, reduced_shape_t<C, a, Keep>> out(uninitialized);
  auto at = [&](int flat) { return n.template load<1>(flat / C::inner, flat % C::inner); };
  for (int o = 0; o < split::outer; ++o) {
    for (int i = 0; i < split::inner; ++i) {
      int const base = o * split::extent * split::inner + i;
      T best = at(base);
      std::int32_t best_k = 0;
      for (int k = 1; k < split::extent; ++k) {
        T v = at(base + k * split::inner);
        if (Max ? (v > best) : (v < best)) {
          best = v;
          best_k = k;
        }
      }
      out.data()[o * split::inner + i] = best_k;
    }
  }
  return out;
}

} // namespace detail

#define TILEGRAD_REDUCTION(NAME, OP)                                                               \
  /** NAME<Axis>(x): reduces along Axis (negative counts from the end). */                         \
  template <int Axis, tile_expression E>                                                           \
  TILEGRAD_INLINE auto NAME(E&& e) {                                                               \
    return detail::reduce<ops::OP, Axis, false>(std::forward<E>(e));                               \
  }                                                                                                \
  template <int Axis, tile_expression E>                                                           \
  TILEGRAD_INLINE auto NAME(E&& e, keep_dims_t) {                                                  \
    return detail::reduce<ops::OP, Axis, true>(std::forward<E>(e));                                \
  }                                                                                                \
  /** NAME(x): reduces every element to a rank-0 tile. */                                          \
  template <tile_expression E>                                                                     \
  TILEGRAD_INLINE auto NAME(E&& e) {                                                               \
    return detail::reduce_all_to_tile<ops::OP, false>(std::forward<E>(e));                         \
  }                                                                                                \
  template <tile_expression E>                                                                     \
  TILEGRAD_INLINE auto NAME(E&& e, keep_dims_t) {                                                  \
    return detail::reduce_all_to_tile<ops::OP, true>(std::forward<E>(e));                          \
  }
TILEGRAD_REDUCTION(sum, add_op)
TILEGRAD_REDUCTION(max, maximum_op)
TILEGRAD_REDUCTION(min, minimum_op)
#undef TILEGRAD_REDUCTION

// What a Triton user writes for tl.sum(x, axis) and tl.maximum(a, b): each gets a message that
// says what to write, where overload resolution would list every candidate.
#define TILEGRAD_RUNTIME_AXIS(NAME)                                                                \
  template <tile_expression E, std::integral I>                                                    \
  void NAME(E&&, I) {                                                                              \
    static_assert(detail::dependent_false<E>,                                                      \
                  "tilegrad::" #NAME ": the axis is a template argument, known at compile time: "  \
                  "write " #NAME "<1>(x) for tl." #NAME "(x, axis=1), and " #NAME                  \
                  "<1>(x, keep_dims) for keep_dims=True");                                         \
  }
#define TILEGRAD_NOT_ELEMENTWISE(NAME, ELEMENTWISE)                                                \
  template <tile_expression E, class B>                                                            \
  requires(tile_expression<B> || std::is_floating_point_v<std::remove_cvref_t<B>>) void NAME(      \
      E&&, B&&) {                                                                                  \
    static_assert(detail::dependent_false<E>,                                                      \
                  "tilegrad::" #NAME " reduces one tile (tl." #NAME "); the elementwise " #NAME    \
                  " of two operands is " #ELEMENTWISE "(a, b), as tl." #ELEMENTWISE);              \
  }
TILEGRAD_RUNTIME_AXIS(sum)
TILEGRAD_RUNTIME_AXIS(max)
TILEGRAD_RUNTIME_AXIS(min)
TILEGRAD_NOT_ELEMENTWISE(max, maximum)
TILEGRAD_NOT_ELEMENTWISE(min, minimum)
#undef TILEGRAD_RUNTIME_AXIS
#undef TILEGRAD_NOT_ELEMENTWISE

/// argmax<Axis>(x): int32 index of the largest element along Axis; the first one on ties.
template <int Axis, tile_expression E>
TILEGRAD_INLINE auto argmax(E&& e) {
  return detail::arg_reduce<true, Axis, false>(std::forward<E>(e));
}
template <int Axis, tile_expression E>
TILEGRAD_INLINE auto argmax(E&& e, keep_dims_t) {
  return detail::arg_reduce<true, Axis, true>(std::forward<E>(e));
}
/// argmin<Axis>(x): int32 index of the smallest element along Axis; the first one on ties.
template <int Axis, tile_expression E>
TILEGRAD_INLINE auto argmin(E&& e) {
  return detail::arg_reduce<false, Axis, false>(std::forward<E>(e));
}
template <int Axis, tile_expression E>
TILEGRAD_INLINE auto argmin(E&& e, keep_dims_t) {
  return detail::arg_reduce<false, Axis, true>(std::forward<E>(e));
}

/// cumsum<Axis>(x): inclusive prefix sum along Axis (Triton's tl.cumsum); Reverse sums from
/// the end. Integers and bool accumulate in int32/int64, floats in their own type.
template <int Axis = 0, bool Reverse = false, tile_expression E>
TILEGRAD_INLINE auto cumsum(E&& e) {
  if constexpr (adjoint_scalar<value_of_t<E>>) {
    return ad::cumsum<Axis, Reverse>(std::forward<E>(e));
  } else {
  using C = shape_of_t<E>;
  using T = acc_t<value_of_t<E>>;
  constexpr int a = normalize_axis<C, Axis>();
  using split = detail::axis_split<C, a>;
  auto n = detail::convert_as<T>(detail::as_node(std::forward<E>(e)));
  detail::tile_t<T, C> out(uninitialized);
  T* d = out.data();
  constexpr int L = C::inner;
  if constexpr (a == C::rank - 1) {
    for (int r = 0; r < C::rows; ++r) {
      T acc{};
      for (int i = 0; i < L; ++i) {
        int const c = Reverse ? L - 1 - i : i;
        acc = i == 0 ? n.template load<1>(r, c) : acc + n.template load<1>(r, c);
        d[r * L + c] = acc;
      }
    }
  } else {
    constexpr int W = detail::width_for<T, decltype(n)>;
    constexpr int mid = split::inner / L;
    for (int o = 0; o < split::outer; ++o) {
      for (int m = 0; m < mid; ++m) {
        for (int kk = 0; kk < split::extent; ++kk) {
          int const k = Reverse ? split::extent - 1 - kk : kk;
          int const r = (o * split::extent + k) * mid + m;
          int const prev = r + (Reverse ? mid : -mid);
          T* dr = d + r * L;
          int c = 0;
          if constexpr (W > 1) {
            for (; c + W <= L; c += W) {
              auto v = n.template load<W>(r, c);
              if (kk > 0) v = v + simd::load<T, W>(d + prev * L + c);
              simd::store<T, W>(dr + c, v);
            }
          }
          for (; c < L; ++c) dr[c] = kk > 0 ? d[prev * L + c] + n.template load<1>(r, c)
                                            : n.template load<1>(r, c);
        }
      }
    }
  }
  return out;
  }
}

} // namespace tilegrad
