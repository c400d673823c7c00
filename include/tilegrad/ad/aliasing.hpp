// Tensors of one launch that share a buffer. Views that share the buffer but no element (q, k,
// v of a packed qkv buffer; outputs interleaved element by element) are fine: accesses are
// matched to the tensor whose elements hold them. Tensors that share an element (one buffer
// marked in and out) are refused before any program runs: which tensor an access belongs to,
// and so where its gradient goes, would be ambiguous.
#pragma once

#include "tilegrad/memory/checked.hpp"
#include "tilegrad/memory/tensor.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace tilegrad::ad {

/// Calls f(offset) for each element of a layout (offsets from its first element, in elements),
/// in row-major order of its coordinates.
template <class E, class F>
void for_each_offset(tensor<E> const& t, F&& f) {
  if (t.numel() == 0)
    return;
  // Axes right-aligned on four, the missing ones of extent 1.
  std::array<std::int64_t, 4> n{1, 1, 1, 1}, s{0, 0, 0, 0};
  for (int a = 0; a < t.rank(); ++a) {
    n[static_cast<std::size_t>(4 - t.rank() + a)] = t.size(a);
    s[static_cast<std::size_t>(4 - t.rank() + a)] = t.stride(a);
  }
  for (std::int64_t i0 = 0; i0 < n[0]; ++i0)
    for (std::int64_t i1 = 0; i1 < n[1]; ++i1)
      for (std::int64_t i2 = 0; i2 < n[2]; ++i2) {
        std::int64_t const o = i0 * s[0] + i1 * s[1] + i2 * s[2];
        for (std::int64_t i3 = 0; i3 < n[3]; ++i3)
          f(o + i3 * s[3]);
      }
}

/// Whether a layout's elements are distinct and nest: each axis's stride is at least the span
/// of the axes with smaller strides (axes of extent 1 aside). Contiguous tensors, transposes,
/// slices and views into a packed buffer all do; then an offset names one element, found by
/// dividing by the strides from the largest down.
template <class E>
bool nested_layout(tensor<E> const& t) {
  std::array<int, max_tensor_rank> order{};
  int m = 0;
  for (int a = 0; a < t.rank(); ++a)
    if (t.size(a) > 1)
      order[static_cast<std::size_t>(m++)] = a;
  // At most four axes: an insertion sort (std::sort draws GCC's -Warray-bounds here, its
  // 16-element threshold past the array's end in code that never runs).
  for (int i = 1; i < m; ++i)
    for (int j = i; j > 0 && t.stride(order[static_cast<std::size_t>(j)]) <
                                 t.stride(order[static_cast<std::size_t>(j - 1)]);
         --j)
      std::swap(order[static_cast<std::size_t>(j)], order[static_cast<std::size_t>(j - 1)]);
  std::int64_t reach = 1; // offsets of the axes so far lie in [0, reach)
  for (int i = 0; i < m; ++i) {
    int const a = order[static_cast<std::size_t>(i)];
    if (t.stride(a) < reach)
      return false;
    reach += t.stride(a) * (t.size(a) - 1);
  }
  return true;
}

/// A float tensor of a launch, as the overlap check sees it.
struct memory_ref {
  char const* name = "";
  char const* role = "";          // "in", "out", ... for messages
  std::byte const* lo = nullptr;  // its first element
  tensor<std::byte const> layout; // shape and strides, in elements
  std::size_t bytes = 1;          // bytes per element
  bool tracked = false;           // gradient, cotangent or written: it may share no element
  bool distinct = false;          // gradient or cotangent: its own elements must be distinct
  std::byte const* hi() const {   // one past its last element's last byte
    return layout.numel() == 0
               ? lo
               : lo + (layout.span() - 1) * static_cast<std::int64_t>(bytes) + bytes;
  }
};

inline std::string describe(memory_ref const& r) {
  return tilegrad::detail::tensor_label(r.name) + " (" + r.role + ", shape " +
         r.layout.shape_string() + ")";
}
inline std::string strides_string(tensor<std::byte const> const& t) {
  std::string out = "(";
  for (int a = 0; a < t.rank(); ++a)
    out += (a ? ", " : "") + std::to_string(t.stride(a));
  return out + ")";
}

/// Checks the tensors of a launch for shared memory, before any program runs. Throws
/// std::invalid_argument (`who`: the caller, for the message; `hint`: what to write instead)
/// - when two tensors share an element and either is tracked (one buffer marked in and out,
///   an input read through another argument as well): the message names both and the element;
/// - when a tensor with a gradient or cotangent has elements that are not distinct and nested
///   (a stride-0 broadcast, axes whose strides interleave).
/// Read-only tensors without a gradient may share elements with each other: nothing tracks them.
/// @post result[i]: tensor i's address range overlaps another's (so an address in its range may
///   belong to that other tensor, and lookups must test elements).
inline std::vector<bool> check_overlaps(std::vector<memory_ref> const& refs, char const* who,
                                        char const* hint) {
  std::size_t const n = refs.size();
  if (n > 254) // owners below are bytes
    throw std::invalid_argument(std::string(who) + ": at most 254 float tensors");
  for (auto const& r : refs)
    if (r.distinct && r.layout.numel() > 0 && !nested_layout(r.layout))
      throw std::invalid_argument(
          std::string(who) + ": tensor " + describe(r) + " has strides " +
          strides_string(r.layout) +
          ": its elements overlap or interleave. A tensor with a gradient or a cotangent needs "
          "distinct elements, each axis's stride at least the span of the axes with smaller "
          "strides (pass "
          "the tensor itself, not a broadcast view, and broadcast in the kernel).");

  // Tensors by first byte; runs of transitively overlapping ranges form groups.
  std::vector<std::size_t> by_lo;
  for (std::size_t i = 0; i < n; ++i)
    if (refs[i].layout.numel() > 0)
      by_lo.push_back(i);
  std::sort(by_lo.begin(), by_lo.end(), [&](std::size_t a, std::size_t b) {
    return refs[a].lo != refs[b].lo ? std::less<>()(refs[a].lo, refs[b].lo) : a < b;
  });
  std::vector<bool> shared(n, false);
  for (std::size_t g0 = 0; g0 < by_lo.size();) {
    std::size_t g1 = g0 + 1;
    std::byte const* end = refs[by_lo[g0]].hi();
    while (g1 < by_lo.size() && refs[by_lo[g1]].lo < end) {
      end = std::max(end, refs[by_lo[g1]].hi());
      ++g1;
    }
    if (g1 - g0 > 1) {
      bool any_tracked = false;
      for (std::size_t k = g0; k < g1; ++k) {
        shared[by_lo[k]] = true;
        any_tracked |= refs[by_lo[k]].tracked;
      }
      if (any_tracked) {
        // Each element of the group's range marked with the tensor that holds it (index + 1):
        // one pass over the elements, one byte per element of the range, freed before any
        // program runs.
        memory_ref const& first = refs[by_lo[g0]];
        std::int64_t const bytes = static_cast<std::int64_t>(first.bytes);
        std::vector<std::uint8_t> owner(static_cast<std::size_t>((end - first.lo) / bytes + 1), 0);
        for (std::size_t k = g0; k < g1; ++k) {
          std::size_t const i = by_lo[k];
          memory_ref const& r = refs[i];
          std::int64_t const at = r.lo - first.lo;
          if (at % bytes != 0)
            throw std::invalid_argument(std::string(who) + ": tensors " + describe(first) +
                                        " and " + describe(r) +
                                        " overlap in memory, their elements not lined up (" +
                                        std::to_string(at) + " bytes apart). " + hint);
          std::int64_t const base = at / bytes;
          for_each_offset(r.layout, [&](std::int64_t o) {
            std::uint8_t& w = owner[static_cast<std::size_t>(base + o)];
            if (w == 0) {
              w = static_cast<std::uint8_t>(i + 1);
              return;
            }
            std::size_t const j = w - 1u;
            if (j == i || !(r.tracked || refs[j].tracked))
              return; // a read-only broadcast view, or two read-only views: nothing tracks them
            memory_ref const& other = refs[j];
            std::int64_t const o2 = base + o - (other.lo - first.lo) / bytes;
            throw std::invalid_argument(
                std::string(who) + ": tensors " + describe(other) + " and " + describe(r) +
                " share memory: element " + other.layout.coordinates(o2) + " of " +
                tilegrad::detail::tensor_label(other.name) + " is element " +
                r.layout.coordinates(o) + " of " + tilegrad::detail::tensor_label(r.name) +
                ". Tensors of one launch may share a buffer but not its elements. " + hint);
          });
        }
      }
    }
    g0 = g1;
  }
  return shared;
}

} // namespace tilegrad::ad
