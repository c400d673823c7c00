// Block pointers (Triton's tl.make_block_ptr): a block of a tensor at an offset, advanced by
// whole steps, loaded and stored with per-axis boundary checks and a padding choice.
#pragma once

#include "tilegrad/ad/adjoint.hpp"
#include "tilegrad/core/config.hpp"
#include "tilegrad/core/shape.hpp"
#include "tilegrad/core/simd.hpp"
#include "tilegrad/core/types.hpp"
#include "tilegrad/memory/checked.hpp"
#include "tilegrad/memory/hints.hpp"
#include "tilegrad/memory/tensor.hpp"
#include "tilegrad/memory/tracking.hpp"
#include "tilegrad/tile/elementwise.hpp"
#include "tilegrad/tile/expr.hpp"
#include "tilegrad/tile/reduce.hpp"
#include "tilegrad/tile/tile.hpp"

#include <algorithm>
#include <array>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <limits>
#include <source_location>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace tilegrad {

/// Axes a block load/store checks against the tensor's shape (Triton's boundary_check):
/// `load(bp, bounds<0, 1>)`. Unchecked axes must stay inside (checked mode throws if not).
template <int... Axes>
struct boundary_check {
  static constexpr bool has(int axis) { return ((Axes == axis) || ...); }
  template <int Rank>
  static constexpr bool within() {
    return ((Axes >= 0 && Axes < Rank) && ...);
  }
};
template <int... Axes>
inline constexpr boundary_check<Axes...> bounds{};

/// What out-of-bounds elements of a checked block load read (Triton's padding_option, and
/// neg_inf, which Triton lacks: for a maximum or an exp over a row shorter than its block, the
/// padding that `other=-inf` gives a pointer-tile load).
enum class padding { zero, nan, neg_inf };

/// A pointer to a block of shape (Bs...) of a tensor, starting at `offsets`.
///
/// It keeps what an access needs and no more: the data pointer, the extent of the tensor's
/// memory, its name (for errors), and the block's own shape, strides and offsets. (Small and
/// flat: a block pointer that held a whole tensor view was copied through the stack at every
/// make, advance and load, and the stores of those copies held up the next row's loads.)
template <class T, int... Bs>
class block_ptr {
public:
  static constexpr int rank = sizeof...(Bs);
  using element_type = T;
  using shape_type = ::tilegrad::shape<Bs...>;
  using index_array = std::array<std::int64_t, sizeof...(Bs)>;

  /// The block of `shape` and `strides` over the memory of `base`, at `offsets`.
  block_ptr(tensor<T> const& base, index_array shape, index_array strides, index_array offsets)
      : block_ptr(base.data(), base.numel() == 0 ? 0 : base.span(), base.name(), shape, strides,
                  offsets) {}
  /// The same over `extent` elements of memory at `data`, named `name` in errors.
  block_ptr(T* data, std::int64_t extent, char const* name, index_array shape, index_array strides,
            index_array offsets)
      : data_(data), extent_(extent), name_(name), shape_(shape), strides_(strides),
        offsets_(offsets) {}

  /// The block moved by whole elements along each axis (Triton's tl.advance).
  template <class... D>
  [[nodiscard]] TILEGRAD_INLINE block_ptr advance(D... deltas) const {
    static_assert(sizeof...(D) == rank, "tilegrad: advance takes one step per block axis");
    block_ptr b = *this;
    int a = 0;
    ((b.offsets_[a++] += static_cast<std::int64_t>(deltas)), ...);
    return b;
  }

  /// The tensor's first element.
  T* data() const { return data_; }
  /// Offsets from data() in [0, extent()) address the tensor's memory (0 for an empty tensor).
  std::int64_t extent() const { return extent_; }
  /// The tensor's name, as errors give it.
  char const* name() const { return name_; }
  index_array const& shape() const { return shape_; }
  index_array const& strides() const { return strides_; }
  index_array const& offsets() const { return offsets_; }

private:
  T* data_;
  std::int64_t extent_;
  char const* name_;
  index_array shape_, strides_, offsets_;
};

namespace detail {
[[noreturn]] TILEGRAD_NOINLINE inline void bad_block_ptr(char const* name, std::string const& what,
                                                         std::source_location const& loc) {
  program const* p = current_program();
  throw std::invalid_argument("tilegrad::make_block_ptr on tensor " + tensor_label(name) + ": " +
                              what + (p ? " (" + p->describe() + ")" : std::string()) + ", at " +
                              where_string(loc));
}

template <class T, int... Bs>
void validate_block_ptr(block_ptr<T, Bs...> const& bp, std::array<int, sizeof...(Bs)> order,
                        std::source_location const& loc) {
  int seen = 0;
  for (int o : order) {
    if (o < 0 || o >= static_cast<int>(sizeof...(Bs)) || (seen & (1 << o))) {
      std::string list;
      for (int x : order)
        list += (list.empty() ? "" : ", ") + std::to_string(x);
      bad_block_ptr(bp.name(),
                    "order {" + list + "} must be a permutation of the block's " +
                        std::to_string(sizeof...(Bs)) + " axes",
                    loc);
    }
    seen |= 1 << o;
  }
  for (std::size_t a = 0; a < sizeof...(Bs); ++a)
    if (bp.shape()[a] < 0)
      bad_block_ptr(bp.name(),
                    "negative extent " + std::to_string(bp.shape()[a]) + " in axis " +
                        std::to_string(a) + " of the shape",
                    loc);
}
} // namespace detail

namespace detail {
/// A list of make_block_ptr with one entry per block axis, given in braces (`{row, col}`) or as a
/// std::array. Any other count, an empty `{}` included, is a compile error: a std::array
/// parameter fills what the braces leave out with zeros (an offset of 0 for `{row}` of a 2-D
/// block; in the full form a shape and a stride of 0, where every load reads zeros, with no error).
template <class I, std::size_t R>
struct axis_list {
  std::array<I, R> v{};
  axis_list(std::array<I, R> const& a) : v(a) {} // NOLINT: a std::array converts
  template <std::integral... A>
  axis_list(A... a) { // NOLINT: braces convert
    static_assert(sizeof...(A) == R,
                  "tilegrad::make_block_ptr: give one entry per block axis in each list: one "
                  "offset per block axis (make_block_ptr<BM, BN>(t, {row, col})); in the full "
                  "form one shape extent, one stride, one offset and one order entry per block "
                  "axis");
    if constexpr (sizeof...(A) == R)
      v = {static_cast<I>(a)...};
  }
};
} // namespace detail

/// make_block_ptr<B...>(base, shape, strides, offsets, order): Triton's full form; the base
/// tensor supplies the data pointer and the name used in errors. Each list has one entry per
/// block axis (a compile error otherwise, `{}` included).
template <int... Bs, class T>
block_ptr<T, Bs...>
make_block_ptr(tensor<T> base, detail::axis_list<std::int64_t, sizeof...(Bs)> const& shape,
               detail::axis_list<std::int64_t, sizeof...(Bs)> const& strides,
               detail::axis_list<std::int64_t, sizeof...(Bs)> const& offsets,
               detail::axis_list<int, sizeof...(Bs)> const& order,
               std::source_location const& loc = std::source_location::current()) {
  static_assert(sizeof...(Bs) >= 1 && sizeof...(Bs) <= 3, "tilegrad: blocks have rank 1 to 3");
  static_assert(((Bs > 0) && ...), "tilegrad: block extents must be positive");
  block_ptr<T, Bs...> bp(base, shape.v, strides.v, offsets.v);
  detail::validate_block_ptr(bp, order.v, loc);
  return bp;
}

namespace detail {
[[noreturn]] TILEGRAD_NOINLINE inline void
block_rank_mismatch(char const* name, int block_rank, int rank, std::source_location const& loc) {
  program const* p = current_program();
  throw std::invalid_argument(
      "tilegrad::make_block_ptr: a block of rank " + std::to_string(block_rank) + " on tensor " +
      tensor_label(name) + " of rank " + std::to_string(rank) +
      (p ? " by " + p->describe() : std::string()) + ", at " + where_string(loc));
}
} // namespace detail

/// make_block_ptr<B...>(t, offsets): the block of t at offsets, with t's shape and strides. One
/// offset per block axis (`{row, col}`; fewer, `{}` included, is a compile error).
template <int... Bs, class T>
TILEGRAD_INLINE block_ptr<T, Bs...>
make_block_ptr(tensor<T> const& t, detail::axis_list<std::int64_t, sizeof...(Bs)> const& at,
               std::source_location const& loc = std::source_location::current()) {
  static_assert(sizeof...(Bs) >= 1 && sizeof...(Bs) <= 3, "tilegrad: blocks have rank 1 to 3");
  static_assert(((Bs > 0) && ...), "tilegrad: block extents must be positive");
  constexpr int R = sizeof...(Bs);
  if (t.rank() != R) [[unlikely]]
    detail::block_rank_mismatch(t.name(), R, t.rank(), loc);
  std::array<std::int64_t, R> shape{}, strides{};
  std::int64_t extent = 1;
  for (int a = 0; a < R; ++a) {
    shape[a] = t.shape()[a];
    strides[a] = t.strides()[a];
    extent += (shape[a] - 1) * strides[a];
  }
  for (int a = 0; a < R; ++a)
    if (shape[a] == 0)
      extent = 0;
  return block_ptr<T, Bs...>(t.data(), extent, t.name(), shape, strides, at.v);
}

namespace detail {

// Not a template: the message is compiled once, not once per element type and block shape.
[[noreturn]] inline void block_out_of_bounds(char const* name, void const* base,
                                             std::size_t elem_size, std::int64_t const* shape,
                                             std::int64_t const* coord, std::size_t rank, int axis,
                                             char const* what, std::source_location const& loc) {
  program const* p = current_program();
  std::string const prog = p ? p->describe() : std::string("host code");
  std::string elem = "(", shp = "(";
  for (std::size_t a = 0; a < rank; ++a) {
    // Appended piece by piece: `", " + std::to_string(...)` draws GCC 12's false -Wrestrict at -O3.
    if (a) {
      elem += ", ";
      shp += ", ";
    }
    elem += std::to_string(coord[a]);
    shp += std::to_string(shape[a]);
  }
  elem += ")";
  shp += ")";
  throw access_error("tilegrad: out-of-bounds block " + std::string(what) + " by " + prog +
                         ": tensor " +
                         view_label(name, base, elem_size, static_cast<int>(rank), shape) +
                         " has shape " + shp + ", element " +
                         elem + " is outside it on axis " + std::to_string(axis) +
                         " (add the axis to boundary_check, or keep the block inside), at " +
                         where_string(loc),
                     prog, name, elem, loc);
}

// An element of a block whose own shape and strides (make_block_ptr's full form) put it outside
// the memory of the tensor it was made on.
[[noreturn]] inline void block_outside_memory(char const* name, std::int64_t extent,
                                              std::int64_t offset, std::int64_t const* coord,
                                              std::size_t rank, char const* what,
                                              std::source_location const& loc) {
  program const* p = current_program();
  std::string const prog = p ? p->describe() : std::string("host code");
  std::string elem = "(";
  for (std::size_t a = 0; a < rank; ++a) {
    if (a)
      elem += ", ";
    elem += std::to_string(coord[a]);
  }
  elem += ")";
  throw access_error("tilegrad: out-of-bounds block " + std::string(what) + " by " + prog +
                         ": element " + elem + " of the block's shape lies at offset " +
                         std::to_string(offset) + ", outside the memory of tensor " +
                         tensor_label(name) + " (offsets 0 to " + std::to_string(extent - 1) +
                         "; check the shape and strides given to make_block_ptr), at " +
                         where_string(loc),
                     prog, name, elem, loc);
}

// Walks the block's innermost rows. For each row: `row(r, mem_offset_of_col0, lo, hi)` with
// [lo, hi) the columns inside the tensor; rows outside (on a checked axis) get lo = hi = 0.
// Checks that the block stays inside the tensor when chk.
template <class Check, class T, int... Bs, class F>
void for_each_block_row(block_ptr<T, Bs...> const& bp, char const* what,
                        std::source_location const& loc, bool chk, F&& row) {
  static_assert(Check::template within<sizeof...(Bs)>(),
                "tilegrad: boundary_check names an axis the block does not have");
  using S = shape<Bs...>;
  constexpr int R = S::rank;
  constexpr int L = S::inner;
  auto const& shp = bp.shape();
  auto const& str = bp.strides();
  auto const& off = bp.offsets();
  for (int r = 0; r < S::rows; ++r) {
    std::array<std::int64_t, R> coord{};
    int rem = r;
    bool inside = true;
    std::int64_t mem = 0;
    for (int a = R - 2; a >= 0; --a) {
      coord[a] = off[a] + rem % S::dim(a);
      rem /= S::dim(a);
    }
    for (int a = 0; a < R - 1; ++a) {
      bool const in = coord[a] >= 0 && coord[a] < shp[a];
      if (!in) {
        if (Check::has(a)) {
          inside = false;
        } else if (chk) {
          coord[R - 1] = off[R - 1];
          block_out_of_bounds(bp.name(), bp.data(), sizeof(T), shp.data(), coord.data(), R, a,
                              what, loc);
        }
      }
      mem += coord[a] * str[a];
    }
    if (!inside) {
      row(r, std::int64_t{0}, 0, 0);
      continue;
    }
    std::int64_t const c0 = off[R - 1];
    int lo = 0, hi = L;
    if (Check::has(R - 1)) {
      lo = static_cast<int>(std::clamp<std::int64_t>(-c0, 0, L));
      hi = static_cast<int>(std::clamp<std::int64_t>(shp[R - 1] - c0, 0, L));
      if (hi < lo) hi = lo;
    } else if (chk && (c0 < 0 || c0 + L > shp[R - 1])) {
      coord[R - 1] = c0 < 0 ? c0 : shp[R - 1];
      block_out_of_bounds(bp.name(), bp.data(), sizeof(T), shp.data(), coord.data(), R, R - 1,
                          what, loc);
    }
    mem += c0 * str[R - 1];
    if (chk && hi > lo) { // a block's own shape and strides (the full form) may leave the memory
      std::int64_t const first = mem + lo * str[R - 1], last = mem + (hi - 1) * str[R - 1];
      if (first < 0 || last >= bp.extent() || last < 0 || first >= bp.extent()) {
        int c = lo; // the row's first element outside
        while (c < hi && mem + c * str[R - 1] >= 0 && mem + c * str[R - 1] < bp.extent())
          ++c;
        coord[R - 1] = c0 + c;
        block_outside_memory(bp.name(), bp.extent(), mem + c * str[R - 1], coord.data(), R, what,
                             loc);
      }
      if constexpr (!is_builtin_v<std::remove_const_t<T>>) // (a custom scalar: jvp's duals)
        confine_run(bp.data(), bp.data() + first, sizeof(T),
                    static_cast<std::ptrdiff_t>(str[R - 1] * std::int64_t{sizeof(T)}), hi - lo,
                    what, loc);
    }
    row(r, mem, lo, hi);
  }
}

// The block's first element when the block lies inside the tensor and its elements sit in memory
// as in a tile (row-major, no gaps), else null.
template <class T, int... Bs>
TILEGRAD_INLINE T* dense_block_inside(block_ptr<T, Bs...> const& bp) {
  constexpr int R = sizeof...(Bs);
  constexpr int dims[] = {Bs...};
  auto const& shp = bp.shape();
  auto const& str = bp.strides();
  auto const& off = bp.offsets();
  std::int64_t mem = 0, dense = 1;
  for (int a = R - 1; a >= 0; --a) {
    if (off[a] < 0 || off[a] + dims[a] > shp[a]) return nullptr;
    if (dims[a] > 1 && str[a] != dense) return nullptr;
    dense *= dims[a];
    mem += off[a] * str[a];
  }
  if (mem + dense > bp.extent()) return nullptr; // (the full form's own shape)
  return bp.data() + mem;
}

/// For a block of one row whose innermost axis is checked and contiguous: where the row starts
/// and how many of its lanes lie inside the tensor, when it starts inside and only its end may
/// pass the tensor's (null otherwise, and for a block inside: dense_block_inside serves it).
template <class Check, class T, int... Bs>
TILEGRAD_INLINE T* dense_row_cut(block_ptr<T, Bs...> const& bp, int& n) {
  constexpr int R = sizeof...(Bs);
  constexpr int dims[] = {Bs...};
  if constexpr (shape<Bs...>::rows != 1 || !Check::has(R - 1)) {
    return nullptr;
  } else {
    auto const& shp = bp.shape();
    auto const& str = bp.strides();
    auto const& off = bp.offsets();
    std::int64_t mem = 0;
    for (int a = 0; a < R - 1; ++a) {
      if (off[a] < 0 || off[a] >= shp[a]) return nullptr;
      mem += off[a] * str[a];
    }
    std::int64_t const c0 = off[R - 1], left = shp[R - 1] - c0;
    if (c0 < 0 || left <= 0 || left >= dims[R - 1] || str[R - 1] != 1) return nullptr;
    mem += c0;
    if (mem + left > bp.extent()) return nullptr; // (the full form's own shape)
    n = static_cast<int>(left);
    return bp.data() + mem;
  }
}

} // namespace detail

namespace ad { // reverse mode (ad/memory.hpp) takes over for tensors of adjoint<T>
template <class A, int... Bs, int... Axes>
auto load_block(block_ptr<A, Bs...> const& bp, boundary_check<Axes...> check, padding pad,
                std::source_location const& loc);
template <class A, int... Bs, class E, int... Axes>
void store_block(block_ptr<A, Bs...> const& bp, E&& value, boundary_check<Axes...> check,
                 std::source_location const& loc);
} // namespace ad

namespace detail {

// The padding value of a block load of V.
// (An integer tensor has no NaN, and its -inf is its lowest value.)
template <class V>
V block_fill(padding pad) {
  if constexpr (std::is_same_v<V, bf16>) {
    return pad == padding::nan       ? bf16(std::numeric_limits<float>::quiet_NaN())
           : pad == padding::neg_inf ? bf16(-std::numeric_limits<float>::infinity())
                                     : bf16(0.0f);
  } else if constexpr (std::numeric_limits<V>::has_quiet_NaN) {
    return pad == padding::nan       ? std::numeric_limits<V>::quiet_NaN()
           : pad == padding::neg_inf ? -std::numeric_limits<V>::infinity()
                                     : V(0);
  } else if constexpr (std::numeric_limits<V>::is_specialized) {
    return pad == padding::neg_inf ? std::numeric_limits<V>::lowest() : V(0);
  } else {
    return V(0);
  }
}

// The body of a block load: writes the block to o (Bs... elements, row-major), wherever o is (a
// tile, or reverse mode's tape). `row(r, mem, lo, hi)` sees each row as it is read (reverse mode
// and race tracking record the lanes read from it; the fast path passes a no-op).
template <class Check, class V, class T, int... Bs, class Row>
TILEGRAD_INLINE void load_block_into(V* o, block_ptr<T, Bs...> const& bp, padding pad,
                                     std::source_location const& loc, bool chk, Row&& row) {
  using S = shape<Bs...>;
  constexpr int L = S::inner;
  constexpr int W = simd::native_width<V>;
  T* base = bp.data();
  std::int64_t const sc = bp.strides()[S::rank - 1];
  V const fill = block_fill<V>(pad);
  for_each_block_row<Check>(bp, "load", loc, chk, [&](int r, std::int64_t mem, int lo, int hi) {
    V* d = o + r * L;
    for (int c = 0; c < lo; ++c) d[c] = fill;
    if (sc == 1) {
      T const* src = base + mem;
      int c = lo;
      if constexpr (W > 1) {
        for (; c + W <= hi; c += W) simd::store<V, W>(d + c, simd::load<V, W>(src + c));
      } else if constexpr (std::is_same_v<V, bf16> &&
                           std::is_same_v<std::remove_const_t<T>, bf16>) {
        // bf16 has no vector type: a row is copied as bytes, not element by element.
        if (hi > lo)
          std::memcpy(static_cast<void*>(d + lo), src + lo, sizeof(bf16) * std::size_t(hi - lo));
        c = hi;
      }
      for (; c < hi; ++c) d[c] = src[c];
    } else {
      for (int c = lo; c < hi; ++c) d[c] = base[mem + c * sc];
    }
    for (int c = hi; c < L; ++c) d[c] = fill;
    row(r, mem, lo, hi);
  });
}

// Records the rows of a block access of a tracked launch, after the access (which checked its
// bounds): one function for every block shape and element type, so tracking adds no code per
// access site beyond the call.
TILEGRAD_NOINLINE inline void record_block(access_hooks const& h, void const* base,
                                           std::size_t elem, std::int64_t extent, char const* name,
                                           int rank, int const* dims,
                                           std::int64_t const* shape, std::int64_t const* strides,
                                           std::int64_t const* offsets, unsigned checked_axes,
                                           std::uint8_t op, std::source_location const& loc,
                                           bool bf16_store = false) {
  access_recorder rec(h, base, elem, extent, name);
  if (!rec.wanted(op))
    return;
  if (bf16_store)
    rec.move_stored_bf16(const_cast<void*>(base));
  int rows = 1;
  for (int a = 0; a < rank - 1; ++a)
    rows *= dims[a];
  int const L = dims[rank - 1];
  std::int64_t const sc = strides[rank - 1];
  for (int r = 0; r < rows; ++r) {
    int rem = r;
    std::int64_t mem = 0;
    bool inside = true;
    for (int a = rank - 2; a >= 0; --a) {
      std::int64_t const c = offsets[a] + rem % dims[a];
      rem /= dims[a];
      inside &= c >= 0 && c < shape[a]; // outside only on a checked axis: the row is skipped
      mem += c * strides[a];
    }
    if (!inside)
      continue;
    std::int64_t const c0 = offsets[rank - 1];
    int lo = 0, hi = L;
    if (checked_axes >> (rank - 1) & 1u) {
      lo = static_cast<int>(std::clamp<std::int64_t>(-c0, 0, L));
      hi = static_cast<int>(std::clamp<std::int64_t>(shape[rank - 1] - c0, 0, L));
    }
    mem += c0 * sc;
    if (sc == 1 && hi > lo)
      rec(0, mem + lo, hi - lo);
    else
      for (int c = lo; c < hi; ++c)
        rec(0, mem + c * sc, 1);
  }
  rec.commit(op, loc);
}

template <class Check, class T, int... Bs>
void record_block(access_hooks const& h, block_ptr<T, Bs...> const& bp, std::uint8_t op,
                  std::source_location const& loc) {
  constexpr int dims[] = {Bs...};
  unsigned axes = 0;
  for (int a = 0; a < static_cast<int>(sizeof...(Bs)); ++a)
    axes |= Check::has(a) ? 1u << a : 0u;
  record_block(h, bp.data(), sizeof(T), bp.extent(), bp.name(), static_cast<int>(sizeof...(Bs)),
               dims, bp.shape().data(), bp.strides().data(), bp.offsets().data(), axes, op, loc,
               std::is_same_v<std::remove_const_t<T>, bf16> && op == op_store);
}

} // namespace detail

namespace detail {
/// After non-temporal stores: in a program, the launch fences them once its programs have run
/// (run_programs); outside one, now.
inline void streamed() {
  if (current_program() != nullptr)
    simd::stream_pending() = true;
  else
    simd::stream_fence();
}
} // namespace detail

/// load(bp[, bounds<axes...>[, padding[, hints]]]): the block; elements outside the tensor on
/// checked axes read the padding (zero or NaN) and are not accessed. The cache hints are taken
/// and have no effect on a load (the CPU's caches give it nothing to choose).
template <class T, int... Bs, int... Axes>
TILEGRAD_INLINE auto load(block_ptr<T, Bs...> const& bp, boundary_check<Axes...> = {},
                          padding pad = padding::zero, cache_hints = {},
                          std::source_location loc = std::source_location::current()) {
  if constexpr (adjoint_scalar<T>) {
    return ad::load_block(bp, boundary_check<Axes...>{}, pad, loc);
  } else {
    using V = std::remove_const_t<T>;
    // In a launch that checks (hooks set): bounds always checked, rows recorded when tracked.
    detail::access_hooks const* const h = detail::current_hooks();
#if !defined(TILEGRAD_NO_BORROW)
    // A block of a read-only tensor, inside it and laid out as the tile is: read in place (the
    // tile borrows the memory, and copies it before this program writes there: core/storage.hpp).
    // Only in a program of a plain launch, whose tensors outlive its tiles: not in host code, nor
    // in launches that track accesses (vjp, the checker, check_races), whose records may keep tiles.
    if constexpr (std::is_const_v<T> && is_builtin_v<V> &&
                  sizeof(V) * shape<Bs...>::size > detail::inline_tile_bytes) {
      V const* const src = h == nullptr && detail::current_program() != nullptr
                               ? detail::dense_block_inside(bp)
                               : nullptr;
      if (src) { // (inside the tensor: nothing for checked mode to find)
        V const* const lo = bp.data();
        return tile<V, Bs...>(detail::borrow, src, lo, lo + bp.extent());
      }
    }
#endif
    tile<V, Bs...> out(uninitialized);
    detail::load_block_into<boundary_check<Axes...>>(
        out.data(), bp, pad, loc, checked() | (h != nullptr), [](int, std::int64_t, int, int) {});
    if (h) [[unlikely]]
      detail::record_block<boundary_check<Axes...>>(*h, bp, detail::op_load, loc);
    return out;
  }
}

namespace detail {

// The body of a block store of the contiguous values v (Bs... elements, row-major). `row(r, mem,
// lo, hi)` sees each row as it is written (reverse mode and race tracking record the lanes; the
// fast path passes a no-op).
template <class Check, class T, int... Bs, class Row>
TILEGRAD_INLINE void store_block_from(block_ptr<T, Bs...> const& bp, T const* v,
                                      std::source_location const& loc, bool chk, Row&& row) {
  using S = shape<Bs...>;
  constexpr int L = S::inner;
  constexpr int W = simd::native_width<T>;
  T* base = bp.data();
  std::int64_t const sc = bp.strides()[S::rank - 1];
  for_each_block_row<Check>(bp, "store", loc, chk, [&](int r, std::int64_t mem, int lo, int hi) {
    T const* s = v + r * L;
    if (sc == 1) {
      T* dst = base + mem;
      int c = lo;
      if constexpr (W > 1)
        for (; c + W <= hi; c += W) simd::store<T, W>(dst + c, simd::load<T, W>(s + c));
      for (; c < hi; ++c) dst[c] = s[c];
    } else {
      for (int c = lo; c < hi; ++c) base[mem + c * sc] = s[c];
    }
    row(r, mem, lo, hi);
  });
}

} // namespace detail

/// store(bp, value[, bounds<axes...>[, hints]]): writes the block (value cast to the tensor's
/// type); elements outside the tensor on checked axes are not written. With a streaming hint
/// (cache_modifier::cs or eviction_policy::evict_first) an expression written straight into
/// float or double rows starting on 64-byte boundaries goes there with non-temporal stores
/// (AVX-512): no read of the lines it overwrites, and the caches keep what they held. For output
/// that is not read again soon; stored data read back soon comes from memory instead.
namespace detail {
// Instantiated only on a shape mismatch of a block store: the compiler prints its name, which
// holds the block's shape and the value's.
template <class Block, class Value>
struct cannot_store_block_shape {
  static_assert(std::is_same_v<Block, Value>,
                "tilegrad: store(block_ptr, value): the value's shape differs from the block's "
                "(Triton broadcasts the value; here broadcast_to<...>(value) makes it match, and a "
                "value laid out transposed needs trans(value), not a reshape)");
  static constexpr bool value = true;
};
template <class Block, class Value>
inline constexpr bool require_block_shape =
    std::is_same_v<Block, Value> || cannot_store_block_shape<Block, Value>::value;
} // namespace detail

template <class T, int... Bs, tile_expression E, int... Axes>
void store(block_ptr<T, Bs...> const& bp, E&& value, boundary_check<Axes...> = {},
           cache_hints hints = {}, std::source_location loc = std::source_location::current()) {
  static_assert(!std::is_const_v<T>, "tilegrad: store through a block pointer of a const tensor");
  static_assert(
      !detail::drops_tangents_v<T, value_of_t<std::remove_cvref_t<E>>>,
      "tilegrad::jvp: the kernel stores a value with tangents into a tensor of another float type "
      "(an unmarked bf16 or double tensor in a launch whose float type is float): the tangents "
      "would be dropped, and what is loaded back would count as a constant. Pass such a scratch "
      "tensor in the launch's float type, so that it carries tangents");
  using S = shape<Bs...>;
  static_assert(detail::require_block_shape<S, shape_of_t<E>>);
  if constexpr (adjoint_scalar<T>) {
    ad::store_block(bp, std::forward<E>(value), boundary_check<Axes...>{}, loc);
  } else {
    detail::access_hooks const* const h0 = detail::current_hooks();
    if constexpr (!is_tile_v<std::remove_cvref_t<E>>) {
      // An expression into a block inside the tensor and laid out as a tile: evaluated straight
      // into its rows (no tile in between). Nothing it reads is this memory: loads are tiles, and
      // tiles borrowing the tensor's memory copy it first.
      // (Inside the tensor: nothing for checked mode to find; a tracked launch takes the path
      // below, which records the rows.)
      if (T* const dst = detail::dense_block_inside(bp); dst && h0 == nullptr) {
        detail::before_write(bp.data(), bp.data() + bp.extent());
        auto cast = to<T>(std::forward<E>(value)); // (as the tile below: to<T>, then in)
        if (hints.streaming()) {
          detail::assign_streaming<S>(dst, detail::convert_as<T>(detail::as_node(std::move(cast))));
          detail::streamed();
        } else {
          detail::assign<S>(dst, detail::convert_as<T>(detail::as_node(std::move(cast))));
        }
        return;
      }
      // A row cut short by the tensor's end (a row shorter than the block): its lanes inside.
      if constexpr (S::rows == 1) {
        int n = 0;
        T* const dst = detail::dense_row_cut<boundary_check<Axes...>>(bp, n);
        if (dst && h0 == nullptr) {
          detail::before_write(bp.data(), bp.data() + bp.extent());
          auto cast = to<T>(std::forward<E>(value));
          if (hints.streaming()) {
            detail::assign_prefix_streaming<S>(
                dst, detail::convert_as<T>(detail::as_node(std::move(cast))), n);
            detail::streamed();
          } else {
            detail::assign_prefix<S>(dst, detail::convert_as<T>(detail::as_node(std::move(cast))),
                                     n);
          }
          return;
        }
      }
    }
    // Values as one contiguous block (a tile of the right type is used in place).
    auto&& vals = [&]() -> decltype(auto) {
      using D = std::remove_cvref_t<E>;
      if constexpr (is_tile_v<D> && std::is_same_v<typename D::value_type, T>)
        return std::forward<E>(value);
      else
        return tile<T, Bs...>(to<T>(std::forward<E>(value)));
    }();
    detail::access_hooks const* const h = detail::current_hooks();
    if (h && h->before_write) [[unlikely]]
      h->before_write("store", loc);
    // Tiles borrowing this memory copy it first. (After the values are evaluated: an expression
    // reading a borrower reads through its storage, so it follows the borrower to its copy.)
    detail::before_write(bp.data(), bp.data() + bp.extent());
    detail::store_block_from<boundary_check<Axes...>>(
        bp, vals.data(), loc, checked() | (h != nullptr), [](int, std::int64_t, int, int) {});
    if (h) [[unlikely]]
      detail::record_block<boundary_check<Axes...>>(*h, bp, detail::op_store, loc);
  }
}

} // namespace tilegrad
