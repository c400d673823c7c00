// Pointer tiles (Triton's `ptr + offsets`): load, store and atomics through a tile of integer
// offsets into a tensor, with masks. Offsets with affine rows (see affine.hpp) load and store
// contiguous rows as vectors, masked lanes only at the edges; other offsets gather/scatter.
#pragma once

#include "tilegrad/ad/adjoint.hpp"
#include "tilegrad/core/config.hpp"
#include "tilegrad/core/simd.hpp"
#include "tilegrad/core/types.hpp"
#include "tilegrad/memory/affine.hpp"
#include "tilegrad/memory/checked.hpp"
#include "tilegrad/memory/hints.hpp"
#include "tilegrad/memory/tensor.hpp"
#include "tilegrad/memory/tracking.hpp"
#include "tilegrad/tile/elementwise.hpp"
#include "tilegrad/tile/expr.hpp"
#include "tilegrad/tile/reduce.hpp"
#include "tilegrad/tile/tile.hpp"

#include <array>
#include <atomic>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <source_location>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>

namespace tilegrad {

/// A tile of addresses: a tensor and a tile of integer element offsets from its data(), plus
/// a scalar shift, so that `p += BK * stride` in a loop keeps p's type.
/// The affine structure of the offsets is worked out once, when the pointer tile is made
/// (a table of base and step per row): loads in a loop that advances p cost no index math.
template <class T, class Off>
struct ptr_tile {
  using element_type = T;
  using shape_type = shape_of_t<Off>;
  tensor<T> base;
  Off offsets;
  std::int64_t shift = 0;
  /// Offsets from base.data() in [0, extent) address the tensor's memory (its span, worked out
  /// once: an access that read it from base's shape and strides would load them with vector
  /// loads straddling the stores that just built the pointer tile, which cannot be forwarded).
  std::int64_t extent = 0;
  std::array<detail::affine_row, shape_type::rows> rows{};

  ptr_tile(tensor<T> const& t, Off off, std::int64_t sh = 0)
      : base(t), offsets(std::move(off)), shift(sh), extent(t.numel() == 0 ? 0 : t.span()) {
    for (int r = 0; r < shape_type::rows; ++r) {
      if constexpr (detail::is_affine_v<Off>)
        rows[r] = detail::affine_at(offsets, r);
      else
        rows[r] = {0, 0, false};
    }
  }

  ptr_tile& operator+=(std::int64_t n) {
    shift += n;
    return *this;
  }
  ptr_tile& operator-=(std::int64_t n) {
    shift -= n;
    return *this;
  }
};

template <class X>
inline constexpr bool is_ptr_tile_v = false;
template <class T, class Off>
inline constexpr bool is_ptr_tile_v<ptr_tile<T, Off>> = true;

namespace detail {
template <class E>
concept offset_expression = tile_expression<E> && is_integer_v<value_of_t<E>>;

// An offset expression that owns what it reads. Triton's `ptrs = x_ptr + offs` is a value: a
// later `offs += BK` does not move ptrs. An expression refers to the tiles it reads, so one kept
// in a pointer tile would read them when the pointer is used, and follow `offs += BK`. The
// snapshot copies those tiles in and keeps the structure around them (broadcasts, arithmetic
// with aranges and numbers), so affine rows stay vector accesses; a node of another kind is
// evaluated into a tile. @post snapshot(n) reads as n reads now, whatever happens to n's tiles.
template <class N>
struct snapshot_node {
  using type = tile_t<value_of_t<N>, shape_of_t<N>>;
  static type get(N const& n) { return type(n); }
};
template <class N>
using snapshot_t = typename snapshot_node<std::remove_cvref_t<N>>::type;
template <class N>
TILEGRAD_INLINE snapshot_t<N> snapshot(N const& n) {
  return snapshot_node<std::remove_cvref_t<N>>::get(n);
}
template <class T, int... Ns>
struct snapshot_node<tile<T, Ns...>> {
  using type = tile<T, Ns...>;
  static type const& get(type const& n) { return n; }
};
template <class T>
struct snapshot_node<scalar_node<T>> {
  using type = scalar_node<T>;
  static type const& get(type const& n) { return n; }
};
template <int Start, int End>
struct snapshot_node<arange_node<Start, End>> {
  using type = arange_node<Start, End>;
  static type const& get(type const& n) { return n; }
};
template <class E, class S>
struct snapshot_node<broadcast_node<E, S>> {
  using type = broadcast_node<snapshot_t<E>, S>;
  static type get(broadcast_node<E, S> const& n) { return {{}, snapshot(n.e)}; }
};
template <class E, class S>
struct snapshot_node<reshape_node<E, S>> {
  using type = reshape_node<snapshot_t<E>, S>;
  static type get(reshape_node<E, S> const& n) { return {{}, snapshot(n.e)}; }
};
template <class E, int... P>
struct snapshot_node<permute_node<E, P...>> {
  using type = permute_node<snapshot_t<E>, P...>;
  static type get(permute_node<E, P...> const& n) { return {{}, snapshot(n.e)}; }
};
template <class To, class E>
struct snapshot_node<convert_node<To, E>> {
  using type = convert_node<To, snapshot_t<E>>;
  static type get(convert_node<To, E> const& n) { return {{}, snapshot(n.e)}; }
};
template <class Op, class... Es>
struct snapshot_node<map_node<Op, Es...>> {
  using type = map_node<Op, snapshot_t<Es>...>;
  static type get(map_node<Op, Es...> const& n) {
    return n.es.apply([&](auto const&... e) { return type{{}, n.op, {snapshot(e)...}}; });
  }
};
} // namespace detail

/// t + offsets: the addresses t.data() + offsets (Triton's `x_ptr + offsets`).
/// The pointer tile keeps its own copy of the offsets (a snapshot, as in Triton: a later change
/// to a tile they were made from does not move the pointers), never a reference to the caller's
/// variables.
template <class T, detail::offset_expression E>
TILEGRAD_INLINE auto operator+(tensor<T> const& t, E&& offsets) {
  using D = std::remove_cvref_t<E>;
  if constexpr (is_tile_v<D>)
    return ptr_tile<T, D>(t, D(std::forward<E>(offsets)));
  else
    return ptr_tile<T, detail::snapshot_t<E>>(t, detail::snapshot(offsets));
}

/// t + n: a single address (a rank-0 pointer tile), as Triton's `x_ptr + row * stride`.
template <class T, std::integral I>
TILEGRAD_INLINE auto operator+(tensor<T> const& t, I n) {
  return ptr_tile<T, scalar_node<std::int64_t>>(t, {{}, static_cast<std::int64_t>(n)});
}

/// p + offsets: offsets add (and broadcast).
template <class T, class Off, detail::offset_expression E>
TILEGRAD_INLINE auto operator+(ptr_tile<T, Off> const& p, E&& more) {
  // (p's offsets are copied too: p may be a temporary, or change.)
  auto sum = detail::snapshot(p.offsets + std::forward<E>(more));
  return ptr_tile<T, decltype(sum)>(p.base, std::move(sum), p.shift);
}

/// p + n: every address moved by n elements (same type as p).
template <class T, class Off, std::integral I>
TILEGRAD_INLINE ptr_tile<T, Off> operator+(ptr_tile<T, Off> p, I n) {
  p.shift += static_cast<std::int64_t>(n);
  return p;
}

namespace detail {
template <class E>
concept non_integer_tile = tile_expression<E> && !is_integer_v<value_of_t<E>>;
} // namespace detail

// A tensor (Triton's pointer) or a pointer tile plus a tile or a number that is not an integer:
// a message that says what an offset is, where overload resolution would list every candidate.
template <class T, detail::non_integer_tile E>
void operator+(tensor<T> const&, E&&) {
  static_assert(detail::dependent_false<E>,
                "tilegrad: a tensor plus a tile makes addresses (Triton's x_ptr + offsets): the "
                "offsets are an integer tile (arange<0, B>(), integer numbers, a load of an int "
                "tensor, to<int>(x)), not a tile of floats or bools; to add values, load them "
                "first: load(x + offs, mask) + y");
}
template <class T, std::floating_point F>
void operator+(tensor<T> const&, F) {
  static_assert(detail::dependent_false<F>,
                "tilegrad: a tensor plus a number moves its address by that many elements: "
                "the number is an integer; to add a value, load first: load(x + offs) + 1.0f");
}
template <class T, class Off, detail::non_integer_tile E>
void operator+(ptr_tile<T, Off> const&, E&&) {
  static_assert(detail::dependent_false<E>,
                "tilegrad: a pointer tile plus a tile moves its addresses: the offsets are an "
                "integer tile, not a tile of floats or bools; to add values, load them first: "
                "load(ptrs, mask) + y");
}

/// p - offsets, p - n and t - n: Triton's `ptrs - 1` (offsets subtract, and broadcast).
template <class T, class Off, detail::offset_expression E>
TILEGRAD_INLINE auto operator-(ptr_tile<T, Off> const& p, E&& less) {
  auto diff = detail::snapshot(p.offsets - std::forward<E>(less));
  return ptr_tile<T, decltype(diff)>(p.base, std::move(diff), p.shift);
}
template <class T, class Off, std::integral I>
TILEGRAD_INLINE ptr_tile<T, Off> operator-(ptr_tile<T, Off> p, I n) {
  p.shift -= static_cast<std::int64_t>(n);
  return p;
}
template <class T, std::integral I>
TILEGRAD_INLINE auto operator-(tensor<T> const& t, I n) {
  return t + -static_cast<std::int64_t>(n);
}

namespace ad { // reverse mode (ad/memory.hpp) takes over for tensors of adjoint<T>
template <class A, class Off, class Mask, class Other>
auto load_ptr(ptr_tile<A, Off> const& p, Mask const& mask, Other const& other,
              std::source_location const& loc);
template <class A, class Off, class Val, class Mask>
void store_ptr(ptr_tile<A, Off> const& p, Val const& val, Mask const& mask,
               std::source_location const& loc);
template <class A, class Off, class Val, class Mask, class F>
auto atomic_ptr(ptr_tile<A, Off> const& p, Val const& val, Mask const& mask, F&& f,
                char const* what, std::source_location const& loc);
} // namespace ad

namespace detail {

struct no_mask {};

template <class T>
using loaded_t = std::remove_const_t<T>;

// Instantiated only when a stored value's shape does not fit the pointers' shape: the compiler
// prints its name, which holds both shapes, with the message.
template <class Value, class Pointers>
struct value_shape_does_not_fit_pointers {
  static_assert(broadcasts_to_v<Value, Pointers>,
                "tilegrad: store/atomic: the value's shape does not broadcast to the pointers' "
                "shape (each extent of the value must equal the pointers' or be 1, and its rank "
                "be at most theirs): build pointers of the value's shape (a (4, 8) tile through "
                "x + (col(rows) * stride + row(cols))), or reduce the value first");
  static constexpr bool value = false;
};
template <class Value, class Pointers>
inline constexpr bool value_fits_pointers_v =
    broadcasts_to_v<Value, Pointers> || value_shape_does_not_fit_pointers<Value, Pointers>::value;

template <class Mask, int W>
TILEGRAD_INLINE bool lane_active(Mask const& m, int r, int c) {
  if constexpr (std::is_same_v<Mask, no_mask>)
    return true;
  else
    return m.template load<1>(r, c);
}

template <class N, int W>
constexpr bool vectorizes_or_absent() {
  if constexpr (std::is_same_v<N, no_mask>)
    return true;
  else
    return N::template vectorizes<W>;
}

// Width for a row-wise vector access to T with mask and value nodes of these types.
template <class T, class Mask, class Val>
inline constexpr int access_width =
    (simd::native_width<T> > 1 && vectorizes_or_absent<Mask, simd::native_width<T>>() &&
     vectorizes_or_absent<Val, simd::native_width<T>>())
        ? simd::native_width<T>
        : 1;

// Width of the runs a load copies from contiguous rows: access_width where T has SIMD; for an
// element type without (forward mode's dual numbers), runs of 16 lanes that the mask, read 16 at a
// time, turns on whole, copied as they lie (one lane at a time, with the mask read per lane, took
// half of a matmul's jvp).
template <class T, class Mask>
inline constexpr int load_run_width = (access_width<T, Mask, no_mask> > 1)
                                          ? access_width<T, Mask, no_mask>
                                      : (!is_builtin_v<T> && std::is_trivially_copyable_v<T> &&
                                         vectorizes_or_absent<Mask, simd::native_width<float>>())
                                          ? simd::native_width<float>
                                          : 1;

// Shape of an access: the pointers' shape, broadcast with the mask's.
template <class Off, class Mask>
struct access_shape {
  using type = broadcast_shape_t<shape_of_t<Off>, shape_of_t<Mask>>;
};
template <class Off>
struct access_shape<Off, no_mask> {
  using type = shape_of_t<Off>;
};
template <class Off, class Mask>
using access_shape_t = typename access_shape<Off, Mask>::type;

template <class Mask, int W>
TILEGRAD_INLINE int mask_state(Mask const& m, int r, int c) { // 2: all, 0: none, 1: some
  if constexpr (std::is_same_v<Mask, no_mask>) {
    return 2;
  } else {
    auto v = m.template load<W>(r, c);
    if constexpr (W == 1) {
      return v ? 2 : 0;
    } else {
#if TILEGRAD_USE_XSIMD
      if (xsimd::all(v)) return 2;
      return xsimd::any(v) ? 1 : 0;
#endif
    }
  }
}

template <class S, class N>
TILEGRAD_INLINE auto broadcast_to_shape(N&& n) {
  return broadcast_as<S>(as_node(std::forward<N>(n)));
}

template <class S, class N>
TILEGRAD_INLINE auto bcast(N&& n) {
  return broadcast_as<S>(std::forward<N>(n));
}

// The loop shared by loads, stores and atomics: for each element (r, c) of shape S whose mask
// lane is on, calls `one(r, c, offset)`; where a row is contiguous and a whole vector of lanes
// is on, calls `vec(r, c, offset_of_lane_0)` instead (when Vectorise).
template <class S, int W, class T, class P, class Mask, class One, class Vec>
TILEGRAD_INLINE void for_each_access(ptr_tile<T, P> const& p, Mask const& mask, One&& one,
                                     Vec&& vec) {
  constexpr int L = S::inner;
  // Pointers broadcast to a larger mask shape lose the row table: recompute through the view.
  constexpr bool table = std::is_same_v<S, shape_of_t<P>>;
  auto const off = bcast<S>(p.offsets);
  std::int64_t const shift = p.shift;
  for (int r = 0; r < S::rows; ++r) {
    affine_row a{0, 0, false};
    if constexpr (table)
      a = p.rows[r];
    else if constexpr (is_affine_v<std::remove_cvref_t<decltype(off)>>)
      a = affine_at(off, r);
    a.base += shift;
    int c = 0;
    if constexpr (W > 1) {
      if (a.ok && a.step == 1) {
        for (; c + W <= L; c += W) {
          int const state = mask_state<Mask, W>(mask, r, c);
          if (state == 2) {
            vec(r, c, a.base + c);
          } else if (state == 1) {
            for (int l = c; l < c + W; ++l)
              if (lane_active<Mask, 1>(mask, r, l)) one(r, l, a.base + l);
          }
        }
      }
    }
    for (; c < L; ++c) {
      if (!lane_active<Mask, 1>(mask, r, c)) continue;
      std::int64_t const o =
          a.ok ? a.base + a.step * c
               : static_cast<std::int64_t>(off.template load<1>(r, c)) + shift;
      one(r, c, o);
    }
  }
}

// The body of a pointer-tile load of shape S: writes the loaded tile to o, wherever o is (a
// tile, or reverse mode's tape). Checks bounds when chk. `lane(pos, offset, n)` sees the n lanes
// pos.. read from offset.. (n > 1: contiguous) as they are read (reverse mode and race tracking
// record them; the fast path passes a no-op).
template <class S, class V, class T, class Off, class Mask, class Other, class Lane>
TILEGRAD_INLINE void load_into(V* o, ptr_tile<T, Off> const& p, Mask const& mask,
                               Other const& other_in, std::source_location const& loc, bool chk,
                               Lane&& lane) {
  T* base = p.base.data();
  constexpr bool same = std::is_same_v<V, std::remove_const_t<T>>;
  constexpr int vector_width = access_width<V, Mask, no_mask>;
  constexpr bool vectorised = vector_width > 1;
  constexpr int W = same ? load_run_width<V, Mask> : vector_width;
  if constexpr (!std::is_same_v<Mask, no_mask>) {
    // Masked-off lanes read `other` (zero without one).
    if constexpr (!std::is_same_v<Other, no_mask>)
      assign<S>(o, broadcast_to_shape<S>(to<V>(other_in)));
    else
      std::fill_n(o, S::size, V{});
  }
  for_each_access<S, W>(
      p, mask,
      [&](int r, int c, std::int64_t e) {
        if (chk) check_offset(p.base, e, "load", loc);
        o[r * S::inner + c] = base[e];
        lane(r * S::inner + c, e, 1);
      },
      [&](int r, int c, std::int64_t e) {
        if (chk) check_run(p.base, e, W, "load", loc);
        if constexpr (vectorised)
          simd::store<V, W>(o + r * S::inner + c, simd::load<V, W>(base + e));
        else // (a copy of a known size: inlined, where copy_n called memmove per run)
          std::memcpy(static_cast<void*>(o + r * S::inner + c), base + e, W * sizeof(V));
        lane(r * S::inner + c, e, W);
      });
}

template <class S, class Mask>
TILEGRAD_INLINE auto broadcast_mask(Mask const& mask) {
  if constexpr (std::is_same_v<Mask, no_mask>)
    return no_mask{};
  else
    return bcast<S>(mask);
}

// Records the lanes of a pointer-tile access of a tracked launch, after the access: a walk over
// the addresses alone, so the access itself stays the fast path's code (compiled once).
template <class S, class T, class Off, class Mask>
TILEGRAD_NOINLINE void record_lanes(access_hooks const& h, ptr_tile<T, Off> const& p,
                                    Mask const& mask, std::uint8_t op,
                                    std::source_location const& loc) {
  access_recorder rec(h, p.base.data(), sizeof(T), p.extent, p.base.name());
  if (!rec.wanted(op))
    return;
  if constexpr (std::is_same_v<std::remove_const_t<T>, bf16>)
    if (op == op_store)
      rec.move_stored_bf16(const_cast<bf16*>(p.base.data()));
  constexpr int W = access_width<std::remove_const_t<T>, Mask, no_mask>;
  for_each_access<S, W>(
      p, mask, [&](int, int, std::int64_t e) { rec(0, e, 1); },
      [&](int, int, std::int64_t e) { rec(0, e, W); });
  rec.commit(op, loc);
}

template <class T, class Off, class Mask, class Other>
auto load_impl(ptr_tile<T, Off> const& p, Mask const& mask_in, Other const& other_in,
               std::source_location const& loc) {
  if constexpr (adjoint_scalar<T>) {
    return ad::load_ptr(p, mask_in, other_in, loc);
  } else {
    using S = access_shape_t<Off, Mask>;
    auto const mask = broadcast_mask<S>(mask_in);
    tile_t<loaded_t<T>, S> out(uninitialized);
    // In a launch that checks (hooks set): bounds always checked, lanes recorded when tracked.
    access_hooks const* const h = current_hooks();
    // (No branch on h before the access: the compiler keeps one copy of its code.)
    load_into<S>(out.data(), p, mask, other_in, loc, checked() | (h != nullptr),
                 [](int, std::int64_t, int) {});
    if (h) [[unlikely]]
      record_lanes<S>(*h, p, mask, op_load, loc);
    return out;
  }
}

// The body of a pointer-tile store of shape S (mask already broadcast to S). Checks bounds when
// chk. `lane(pos, offset, n)` sees the lanes written as they are written (reverse mode and race
// tracking record them; the fast path passes a no-op).
template <class S, class T, class Off, class Mask, class Val, class Lane>
TILEGRAD_INLINE void store_from(ptr_tile<T, Off> const& p, Val const& val_in, Mask const& mask,
                                std::source_location const& loc, bool chk, Lane&& lane) {
  // Triton casts the stored value to the pointer's element type.
  auto val = bcast<S>(convert_as<T>(val_in));
  T* base = p.base.data();
  constexpr int W = access_width<T, Mask, decltype(val)>;
  for_each_access<S, W>(
      p, mask,
      [&](int r, int c, std::int64_t e) {
        if (chk) check_offset(p.base, e, "store", loc);
        base[e] = val.template load<1>(r, c);
        lane(r * S::inner + c, e, 1);
      },
      [&](int r, int c, std::int64_t e) {
        if (chk) check_run(p.base, e, W, "store", loc);
        simd::store<T, W>(base + e, val.template load<W>(r, c));
        lane(r * S::inner + c, e, W);
      });
}

template <class T, class Off, class Mask, class Val>
void store_impl(ptr_tile<T, Off> const& p, Val const& val_in, Mask const& mask_in,
                std::source_location const& loc) {
  static_assert(!std::is_const_v<T>, "tilegrad: store through a pointer tile of a const tensor");
  static_assert(
      !drops_tangents_v<T, value_of_t<Val>>,
      "tilegrad::jvp: the kernel stores a value with tangents into a tensor of another float type "
      "(an unmarked bf16 or double tensor in a launch whose float type is float): the tangents "
      "would be dropped, and what is loaded back would count as a constant. Pass such a scratch "
      "tensor in the launch's float type, so that it carries tangents");
  using S = access_shape_t<Off, Mask>;
  if constexpr (!value_fits_pointers_v<shape_of_t<Val>, S>) {
    return; // the assertion above has said why (no cascade of errors in every mode)
  } else if constexpr (adjoint_scalar<T>) {
    ad::store_ptr(p, val_in, mask_in, loc);
  } else {
    auto const mask = broadcast_mask<S>(mask_in);
    access_hooks const* const h = current_hooks();
    if (h && h->before_write) [[unlikely]]
      h->before_write("store", loc);
    before_write(p.base.data(), p.base.data() + p.extent); // borrowed tiles copy first
    store_from<S>(p, val_in, mask, loc, checked() | (h != nullptr), [](int, std::int64_t, int) {});
    if (h) [[unlikely]]
      record_lanes<S>(*h, p, mask, op_store, loc);
  }
}

template <class M>
TILEGRAD_INLINE auto mask_node(M&& m) {
  static_assert(std::is_same_v<value_of_t<node_t<M>>, bool>,
                "tilegrad: a mask must be a bool tile (a comparison such as offs < n)");
  return as_node(std::forward<M>(m));
}

} // namespace detail

/// load(p): the elements at the addresses of p (no mask: every address must be inside).
/// Each form of load and store takes cache hints last (Triton's cache_modifier and
/// eviction_policy, memory/hints.hpp), which change nothing through pointer tiles.
template <class T, class Off>
auto load(ptr_tile<T, Off> const& p, cache_hints = {},
          std::source_location loc = std::source_location::current()) {
  return detail::load_impl(p, detail::no_mask{}, detail::no_mask{}, loc);
}

/// load(p, mask): masked-off lanes read 0 and are not accessed.
template <class T, class Off, tile_expression M>
auto load(ptr_tile<T, Off> const& p, M&& mask, cache_hints = {},
          std::source_location loc = std::source_location::current()) {
  return detail::load_impl(p, detail::mask_node(std::forward<M>(mask)), detail::no_mask{}, loc);
}

/// load(p, mask, other): masked-off lanes read `other` (a number or a tile) and are not accessed.
template <class T, class Off, tile_expression M, class O>
  requires(tile_expression<O> || scalar_operand<O>)
auto load(ptr_tile<T, Off> const& p, M&& mask, O&& other, cache_hints = {},
          std::source_location loc = std::source_location::current()) {
  return detail::load_impl(p, detail::mask_node(std::forward<M>(mask)),
                           detail::as_node(std::forward<O>(other)), loc);
}

/// store(p, value): writes value (broadcast to p's shape, cast to the tensor's type).
template <class T, class Off, class V>
  requires(tile_expression<V> || scalar_operand<V>)
void store(ptr_tile<T, Off> const& p, V&& value, cache_hints = {},
           std::source_location loc = std::source_location::current()) {
  detail::store_impl(p, detail::as_node(std::forward<V>(value)), detail::no_mask{}, loc);
}

/// store(p, value, mask): masked-off lanes write nothing and are not accessed.
template <class T, class Off, class V, tile_expression M>
  requires(tile_expression<V> || scalar_operand<V>)
void store(ptr_tile<T, Off> const& p, V&& value, M&& mask, cache_hints = {},
           std::source_location loc = std::source_location::current()) {
  detail::store_impl(p, detail::as_node(std::forward<V>(value)),
                     detail::mask_node(std::forward<M>(mask)), loc);
}

// ---------------------------------------------------------------------------------------------
// Atomics: element by element with std::atomic_ref (a lock per address for custom scalars),
// safe under the parallel grid. Each returns the old values (masked-off lanes: 0).
// ---------------------------------------------------------------------------------------------

namespace detail {

/// std::atomic_ref's interface on an element that a lock guards: plain reads and writes, each
/// operation holding what `lock()` returns while it runs.
template <class T, class Lock>
class guarded_ref {
public:
  guarded_ref(T& x, Lock lock) : x_(x), lock_(lock) {}
  T load(std::memory_order = std::memory_order_seq_cst) const {
    [[maybe_unused]] auto const held = lock_();
    return x_;
  }
  T fetch_add(T v, std::memory_order = std::memory_order_seq_cst) const {
    [[maybe_unused]] auto const held = lock_();
    T const old = x_;
    x_ = old + v;
    return old;
  }
  T exchange(T v, std::memory_order = std::memory_order_seq_cst) const {
    [[maybe_unused]] auto const held = lock_();
    T const old = x_;
    x_ = v;
    return old;
  }
  // Compares object representations, as std::atomic_ref does.
  bool compare_exchange_strong(T& expected, T v, std::memory_order = std::memory_order_seq_cst,
                               std::memory_order = std::memory_order_seq_cst) const {
    [[maybe_unused]] auto const held = lock_();
    if (std::memcmp(&x_, &expected, sizeof(T)) == 0) {
      x_ = v;
      return true;
    }
    expected = x_;
    return false;
  }
  bool compare_exchange_weak(T& expected, T v, std::memory_order s = std::memory_order_seq_cst,
                             std::memory_order f = std::memory_order_seq_cst) const {
    return compare_exchange_strong(expected, v, s, f);
  }

private:
  T& x_;
  Lock lock_;
};

// A custom scalar (a dual number: a value and its tangents) has no atomic instruction: its
// atomics hold one of a fixed set of mutexes, chosen by address.
struct address_mutex {
  std::mutex* m;
  explicit address_mutex(void const* p) {
    static std::mutex locks[64];
    m = &locks[(reinterpret_cast<std::uintptr_t>(p) >> 4) % 64];
  }
  std::unique_lock<std::mutex> operator()() const { return std::unique_lock<std::mutex>(*m); }
};
template <class T>
using locked_ref = guarded_ref<T, address_mutex>;

// An element whose lock the caller holds already (a float's stripe lock, below).
struct held_by_caller {
  int operator()() const { return 0; }
};
template <class T>
using plain_ref = guarded_ref<T, held_by_caller>;

template <class T>
auto atomic_ref_to(T& x) {
  if constexpr (std::is_arithmetic_v<T>)
    return std::atomic_ref<T>(x);
  else
    return locked_ref<T>(x, address_mutex(&x));
}

/// Floating-point atomics: x86 has no atomic float add (std::atomic_ref<float>::fetch_add is a
/// compare-and-swap loop per element), so every atomic on a float or double element holds the
/// lock of the 1 KiB stripe of memory it updates (one of a fixed set of spin locks, chosen by
/// stripe) and updates the element as plain memory: a run of lanes in one stripe takes the lock
/// once, and adds as vectors. The locks order every atomic on an element, as the hardware's
/// would. (4 KiB stripes made 16 threads adding rows of 64 floats into 64 rows of a table wait on
/// 4 locks, slower than compare-and-swap; 256 B ones halved the rate of rows of 1024 floats:
/// docs/performance.md, "Float atomics by lock stripes".)
inline constexpr int stripe_bits = 10;
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
struct alignas(64) stripe_spin {
  std::atomic<bool> held{false};
};
inline stripe_spin& spin_of_stripe(std::uintptr_t stripe) {
  static stripe_spin locks[512];
  return locks[(stripe ^ (stripe >> 9)) % 512];
}
class stripe_lock {
public:
  stripe_lock() = default;
  stripe_lock(stripe_lock const&) = delete;
  stripe_lock& operator=(stripe_lock const&) = delete;
  ~stripe_lock() { release(); }
  /// Holds the lock of the stripe of p (letting go of the one held before, if another).
  void hold(void const* p) {
    std::uintptr_t const stripe = reinterpret_cast<std::uintptr_t>(p) >> stripe_bits;
    if (held_ && stripe == stripe_)
      return;
    release();
    stripe_spin& s = spin_of_stripe(stripe);
    for (int spins = 0; s.held.exchange(true, std::memory_order_acquire);)
      while (s.held.load(std::memory_order_relaxed))
        if (++spins % 64 == 0)
          std::this_thread::yield();
        else
          cpu_relax();
    held_ = &s;
    stripe_ = stripe;
  }
  /// Whether p lies in the stripe held.
  bool holds(void const* p) const {
    return held_ && reinterpret_cast<std::uintptr_t>(p) >> stripe_bits == stripe_;
  }
  void release() {
    if (held_)
      held_->held.store(false, std::memory_order_release);
    held_ = nullptr;
  }

private:
  stripe_spin* held_ = nullptr;
  std::uintptr_t stripe_ = 0;
};

/// The lane width of atomics: floats and doubles update runs of lanes as vectors under their
/// stripe's lock (where the value reads as vectors: not one made from bf16 data); other types one
/// element at a time.
template <class T, class Mask, class Val>
inline constexpr int atomic_width = std::is_floating_point_v<T> ? access_width<T, Mask, Val> : 1;

/// How long a program may fail one try again and again (wait_streak) before the launch says it
/// waits for ever, in seconds; 0: never (set_wait_limit).
inline std::atomic<double> wait_limit{10.0};

// A program that spins on one element (a lock, or a flag another program sets) tries an
// atomic_cas or atomic_xchg on it again and again. A wait for another program that has not
// started (one queued behind the waiter on its thread, or in a later wave of a checked launch)
// never ends: such a streak of failed tries at one place is timed (every 4096 tries), and past
// the limit the waiting program throws instead of hanging the launch.
struct wait_streak {
  void const* at = nullptr; // the tensor's data
  std::source_location loc; // the try
  std::uint64_t tries = 0;  // failed in a row
  std::chrono::steady_clock::time_point since;
};
inline thread_local wait_streak streak;

/// After a try of one element, at offset e of t: `failed` says it found what it waits on gone.
template <class T>
void note_try(tensor<T> const& t, std::int64_t e, bool failed, char const* what,
              std::source_location const& loc) {
  wait_streak& w = streak;
  bool const same = w.at == t.data() && w.loc.line() == loc.line() &&
                    w.loc.column() == loc.column() && w.loc.file_name() == loc.file_name();
  if (!failed) {
    if (same)
      w.at = nullptr;
    return;
  }
  if (!same) {
    w.at = t.data();
    w.loc = loc;
    w.tries = 0;
  }
  if (++w.tries % 4096 != 0)
    return;
  auto const now = std::chrono::steady_clock::now();
  if (w.tries == 4096) {
    w.since = now;
    return;
  }
  double const limit = wait_limit.load(std::memory_order_relaxed);
  double const waited = std::chrono::duration<double>(now - w.since).count();
  if (limit > 0 && waited >= limit) {
    std::uint64_t const tries = w.tries;
    w.at = nullptr;
    waited_too_long(tensor<std::byte const>(reinterpret_cast<std::byte const*>(t.data()), t.rank(),
                                            t.shape(), t.strides(), t.name()),
                    sizeof(T), e, what, tries, waited, loc);
  }
}

// The body of an atomic of shape S: old[lane] = f(element, value) for every lane on, one
// element at a time (floats and doubles: under their stripe's lock, atomic_add by vectors).
// Checks bounds when chk (a contiguous run of W lanes at once); `lane(pos, offset, n)` sees the
// lanes as they are updated, `value(v)` each lane's value after it.
template <int W, class S, class T, class Off, class Val, class Mask, class F, class Lane,
          class Value>
TILEGRAD_INLINE void atomic_into(T* old, ptr_tile<T, Off> const& p, Val const& val,
                                 Mask const& mask, F& f, char const* what,
                                 std::source_location const& loc, bool chk, Lane&& lane,
                                 Value&& value) {
  T* base = p.base.data();
  constexpr bool locked = std::is_floating_point_v<T>;
  [[maybe_unused]] stripe_lock stripes;
  [[maybe_unused]] bool const add = locked && std::string_view(what) == "atomic_add";
  auto one = [&](int r, int c, std::int64_t e) {
    T const v = val.template load<1>(r, c);
    if constexpr (locked) {
      stripes.hold(base + e);
      old[r * S::inner + c] = f(plain_ref<T>(base[e], {}), v);
    } else {
      old[r * S::inner + c] = f(atomic_ref_to(base[e]), v);
    }
    value(v);
  };
  for_each_access<S, W>(
      p, mask,
      [&](int r, int c, std::int64_t e) {
        if (chk)
          check_offset(p.base, e, what, loc);
        lane(r * S::inner + c, e, 1);
        one(r, c, e);
      },
      [&](int r, int c, std::int64_t e) {
        if (chk)
          check_run(p.base, e, W, what, loc);
        lane(r * S::inner + c, e, W);
        if constexpr (locked && W > 1) {
          stripes.hold(base + e);
          if (add && stripes.holds(base + e + (W - 1))) { // in one stripe: added as a vector
            T* const o = old + r * S::inner + c;
            T* const m = base + e;
            auto const v = val.template load<W>(r, c);
            simd::store<T, W>(o, simd::load<T, W>(m));
            simd::store<T, W>(m, ops::add_op::apply(simd::load<T, W>(o), v));
            for (int l = 0; l < W; ++l)
              value(val.template load<1>(r, c + l));
            return;
          }
        }
        for (int l = 0; l < W; ++l)
          one(r, c + l, e + l);
      });
}

// An atomic in a launch that checks bounds or races: always checked, and recorded when tracked
// (an atomic_add of float or double values with the magnitude of each value). On an integer
// tensor, atomic_xchg and atomic_cas synchronise programs (locks, flags) rather than race, and
// on one element they take and give back the program's locks (`cmps`: atomic_cas's compare
// values, null for the others); an atomic_add of a positive value to one element draws a ticket.
// `argument`: the primal values of a launch argument of adjoints (ad::atomic_ptr), which the
// hooks do not watch (access_hooks::watched). Returns the offset of the last lane updated (-1:
// none).
template <class S, class T, class Off, class Val, class Mask, class F>
TILEGRAD_NOINLINE std::int64_t
atomic_hooked(access_hooks const& h, T* old, ptr_tile<T, Off> const& p, Val const& val,
              Mask const& mask, F& f, char const* what, std::source_location const& loc,
              T const* cmps, bool argument) {
  if (h.before_write)
    h.before_write(what, loc);
  access_recorder rec(h, p.base.data(), sizeof(T), p.extent, p.base.name(), argument);
  bool const add = std::string_view(what) == "atomic_add";
  if (std::is_floating_point_v<T> && add && !h.lenient)
    rec.expect_values(S::size);
  // Whole vectors of lanes where the mask and the value allow: one bounds check and one record
  // per vector.
  constexpr int W = access_width<T, Mask, Val>;
  // The probe of locks (launch_tracker, "Locks found held"): the first tries of each taking of
  // a known lock (an atomic_cas from its free value, an atomic_xchg of another value) find it
  // held. Such a try returns what another program wrote to take it (else what it would write
  // itself; never the free value), and writes nothing.
  bool const xchg = std::string_view(what) == "atomic_xchg";
  auto tried = [&](auto a, T v) -> T {
    if constexpr (std::is_integral_v<T> && S::size == 1)
      if ((cmps ? v != cmps[0] : xchg) && rec.active() && h.tracker->probing()) {
        std::uint64_t const key = launch_tracker::lock_key(rec.tensor(), rec.last_element());
        std::int64_t const cmp = cmps ? static_cast<std::int64_t>(cmps[0]) : 0;
        if (auto const held = h.tracker->held_value(key, h.log->program, cmps ? &cmp : nullptr,
                                                    static_cast<std::int64_t>(v))) {
          if (h.log->fail_try(key, launch_tracker::probe_failures)) {
            lock_probe const here{rec.tensor(), rec.last_element(), loc, xchg};
            if (h.log->failed.tensor < 0)
              h.log->failed = here;
            h.log->pending = here;
            return static_cast<T>(*held);
          }
          T const was = f(a, v);
          if (cmps ? was == cmps[0] : was != v)
            h.log->took(key);
          return was;
        }
      }
    return f(a, v);
  };
  std::int64_t last = -1;
  atomic_into<W, S>(
      old, p, val, mask, tried, what, loc, true,
      [&](int pos, std::int64_t e, int n) {
        rec(pos, e, n);
        last = e + n - 1;
      },
      [&](T const& v) {
        if constexpr (std::is_floating_point_v<T>)
          rec.value(static_cast<double>(v));
      });
  std::string_view const w(what);
  bool const exchange = w == "atomic_xchg" || w == "atomic_cas";
  // (vjp: logged for tg::loop's replay check, not as a race.)
  std::uint8_t const unraced = h.lenient || (std::is_integral_v<T> && exchange) ? op_unraced : 0;
  rec.commit(unraced | (add                 ? op_atomic_add
                        : w == "atomic_max" ? op_atomic_max
                        : w == "atomic_min" ? op_atomic_min
                                            : op_atomic),
             loc);
  if constexpr (std::is_integral_v<T> && S::size == 1)
    if (rec.active() && !h.lenient && rec.lanes() == 1) {
      auto const v = static_cast<std::int64_t>(val.template load<1>(0, 0));
      auto const was = static_cast<std::int64_t>(old[0]);
      if (exchange)
        h.log->lock_event(rec.tensor(), rec.last_element(), was, v, cmps != nullptr,
                          cmps ? static_cast<std::int64_t>(cmps[0]) : 0);
      else if (add && v > 0) // a ticket
        h.log->tickets.push_back({rec.tensor(), rec.last_element(), was, v,
                                  static_cast<std::uint32_t>(h.log->accesses.size() - 1), loc});
    }
  return last;
}

template <class T, class Off, class Val, class Mask, class F>
auto atomic_impl(ptr_tile<T, Off> const& p, Val const& val_in, Mask const& mask_in, F&& f,
                 char const* what, std::source_location const& loc,
                 std::remove_const_t<T> const* cmps = nullptr, bool argument = false) {
  static_assert(!std::is_const_v<T>, "tilegrad: atomic on a const tensor");
  if constexpr (!value_fits_pointers_v<shape_of_t<Val>, access_shape_t<Off, Mask>>) {
    return 0; // the assertion above has said why
  } else if constexpr (adjoint_scalar<T>) {
    return ad::atomic_ptr(p, val_in, mask_in, std::forward<F>(f), what, loc);
  } else {
    static_assert(std::is_arithmetic_v<T> || (!is_builtin_v<T> && std::is_trivially_copyable_v<T>),
                  "tilegrad: atomics work on float, double, integer and custom scalar tensors");
    using S = access_shape_t<Off, Mask>;
    before_write(p.base.data(), p.base.data() + p.extent); // borrowed tiles copy first
    auto mask = [&] {
      if constexpr (std::is_same_v<Mask, no_mask>)
        return no_mask{};
      else
        return bcast<S>(mask_in);
    }();
    auto val = bcast<S>(convert_as<T>(val_in));
    tile_t<T, S> old;
    std::int64_t last = -1;
    if (access_hooks const* h = current_hooks()) [[unlikely]]
      last = atomic_hooked<S>(*h, old.data(), p, val, mask, f, what, loc, cmps, argument);
    else
      atomic_into<atomic_width<T, Mask, decltype(val)>, S>(
          old.data(), p, val, mask, f, what, loc, checked(),
          [&](int, std::int64_t e, int n) { last = e + n - 1; }, [](T const&) {});
    // A try at one element of an integer tensor: failed where an atomic_cas found another value
    // than its compare value, or an atomic_xchg found the value it writes (a test-and-set lock
    // found set).
    if constexpr (std::is_integral_v<T> && S::size == 1)
      if (last >= 0) {
        if (cmps)
          note_try(p.base, last, old.data()[0] != cmps[0], what, loc);
        else if (std::string_view(what) == "atomic_xchg")
          note_try(p.base, last, old.data()[0] == val.template load<1>(0, 0), what, loc);
      }
    return old;
  }
}

template <class Ref, class T>
T atomic_update(Ref a, T v, bool take_max) {
  T cur = a.load(std::memory_order_relaxed);
  while ((take_max ? v > cur : v < cur) &&
         !a.compare_exchange_weak(cur, v, std::memory_order_acq_rel, std::memory_order_relaxed)) {
  }
  return cur;
}

} // namespace detail

#define TILEGRAD_ATOMIC(NAME, BODY)                                                                \
  template <class T, class Off, class V>                                                           \
    requires(tile_expression<V> || scalar_operand<V>)                                              \
  auto NAME(ptr_tile<T, Off> const& p, V&& value,                                                  \
            std::source_location loc = std::source_location::current()) {                          \
    return detail::atomic_impl(p, detail::as_node(std::forward<V>(value)), detail::no_mask{},      \
                               [](auto a, auto v) { return BODY; }, #NAME, loc);                   \
  }                                                                                                \
  template <class T, class Off, class V, tile_expression M>                                        \
    requires(tile_expression<V> || scalar_operand<V>)                                              \
  auto NAME(ptr_tile<T, Off> const& p, V&& value, M&& mask,                                        \
            std::source_location loc = std::source_location::current()) {                          \
    return detail::atomic_impl(p, detail::as_node(std::forward<V>(value)),                         \
                               detail::mask_node(std::forward<M>(mask)),                           \
                               [](auto a, auto v) { return BODY; }, #NAME, loc);                   \
  }

/// atomic_add(p, v[, mask]): *p += v atomically; returns the old values.
TILEGRAD_ATOMIC(atomic_add, a.fetch_add(v, std::memory_order_acq_rel))
/// atomic_max(p, v[, mask]): *p = max(*p, v) atomically; returns the old values.
TILEGRAD_ATOMIC(atomic_max, detail::atomic_update(a, v, true))
/// atomic_min(p, v[, mask]): *p = min(*p, v) atomically; returns the old values.
TILEGRAD_ATOMIC(atomic_min, detail::atomic_update(a, v, false))
/// atomic_xchg(p, v[, mask]): *p = v atomically; returns the old values.
TILEGRAD_ATOMIC(atomic_xchg, a.exchange(v, std::memory_order_acq_rel))
#undef TILEGRAD_ATOMIC

/// How long a program of a launch may fail one atomic_cas or atomic_xchg of one element of an
/// integer tensor again and again (a spin on a lock or a flag) before it throws access_error
/// naming itself, the tensor, the element and the line, in seconds (10 by default; 0: never).
/// A wait for a program that has not started never ends: the programs of a launch run in any
/// order, each thread's one after another.
/// @throws std::invalid_argument when `seconds` is negative or not a number.
inline void set_wait_limit(double seconds) {
  if (!(seconds >= 0))
    throw std::invalid_argument("tilegrad::set_wait_limit: the limit must be 0 or more seconds");
  detail::wait_limit.store(seconds, std::memory_order_relaxed);
}

/// atomic_cas(p, cmp, v): where *p == cmp, *p = v, atomically; returns the old values.
template <class T, class Off, class C, class V>
  requires(tile_expression<C> || scalar_operand<C>) && (tile_expression<V> || scalar_operand<V>)
auto atomic_cas(ptr_tile<T, Off> const& p, C&& cmp, V&& value,
                std::source_location loc = std::source_location::current()) {
  static_assert(!adjoint_scalar<T>, "tilegrad: atomic_cas has no reverse mode (use it on integer "
                                    "tensors, which stay integers in every mode)");
  using S = shape_of_t<Off>;
  static_assert(detail::value_fits_pointers_v<shape_of_t<detail::node_t<C>>, S>);
  auto c = detail::bcast<S>(detail::convert_as<T>(detail::as_node(std::forward<C>(cmp))));
  // Pair each lane's compare value with its new value through the lane index.
  detail::tile_t<T, S> cmps(c);
  return detail::atomic_impl(
      p, detail::as_node(std::forward<V>(value)), detail::no_mask{},
      [&cmps, i = 0](auto a, T v) mutable {
        T expected = cmps.data()[i++];
        a.compare_exchange_strong(expected, v, std::memory_order_acq_rel);
        return expected;
      },
      "atomic_cas", loc, cmps.data());
}

} // namespace tilegrad
