// Races between the programs of a vjp launch: two programs storing one element non-atomically,
// a program reading an element another program writes, or an element both stored and updated
// atomically. Triton leaves these undefined; the reverse sweep of one program at a time would
// silently get them wrong, so they are errors naming both programs, the tensor and the element.
//
// Every element of a tensor the kernel may write carries a stamp, 4 bytes: the program that
// wrote it last, and whether atomically. A program checks the stamps it overwrites as it writes
// (this catches programs of earlier waves); after a wave, each program's accesses are checked
// against the final stamps in program order (this catches programs of the same wave, whatever
// their timing). Readers are registered after each wave, so a later store can name them.
#pragma once

#include "tilegrad/ad/context.hpp"
#include "tilegrad/core/config.hpp"
#include "tilegrad/core/pages.hpp"
#include "tilegrad/grid/program.hpp"
#include "tilegrad/memory/checked.hpp"

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

namespace tilegrad {

namespace ad {

/// The other program reading element el (besides `me`), 0 if none.
inline std::uint32_t other_reader(tensor_entry const& e, std::int64_t el, std::uint32_t me) {
  if (!e.readers) return 0;
  std::uint64_t const rd = e.readers[el];
  auto const first = static_cast<std::uint32_t>(rd), second = static_cast<std::uint32_t>(rd >> 32);
  return first && first != me ? first : second && second != me ? second : 0;
}

[[noreturn]] TILEGRAD_MACHINERY void race(tensor_entry const& e, std::int64_t el, std::uint32_t me,
                                          std::uint32_t other, char const* mine, char const* theirs,
                                          std::source_location const& loc, std::array<int, 3> dims)
#if TILEGRAD_MACHINERY_BODIES
{
  auto describe = [&](std::uint32_t id) {
    std::int64_t const lin = static_cast<std::int64_t>(id) - 1;
    int const x = static_cast<int>(lin % dims[0]);
    int const y = static_cast<int>((lin / dims[0]) % dims[1]);
    int const z = static_cast<int>(lin / (std::int64_t{dims[0]} * dims[1]));
    return program({x, y, z}, dims).describe();
  };
  std::string const elem = e.layout.coordinates(el);
  std::string const p = describe(me), q = describe(other);
  // One program that both updates an element atomically and loads or stores it: no race between
  // programs, but nothing reverse mode can order either (the old value of each update depends on
  // the updates of other programs, which its sweep does not see).
  std::string const msg =
      other == me
          ? "tilegrad::vjp: tensor " + detail::tensor_label(e.name) + ", element " + elem + ": " +
                p + " " + mine + " it at " + detail::where_string(loc) + ", and " + theirs +
                " itself. vjp takes no element that one launch both updates atomically and "
                "loads or stores, even within one program (where other programs may add to it, "
                "what a load reads depends on their order): read it, or store it, in a later "
                "launch."
          : "tilegrad::vjp: race on tensor " + detail::tensor_label(e.name) + ", element " + elem +
                ": " + p + " " + mine + " it at " + detail::where_string(loc) + ", and " + q + " " +
                theirs +
                ". Within one launch each element is written by one program (or only accumulated "
                "with atomic_add), and no program reads what another writes. (vjp orders programs "
                "by neither locks nor tickets, as check_backward's race check does for a "
                "backward: a forward reduces what its programs wrote in a second launch.)";
  throw race_error(msg, p, q, e.name, elem, loc);
}
#else
;
#endif

/// Zeroed memory for n stamps (or reader pairs); pages the kernel never touches cost nothing.
template <class U>
struct stamp_buffer {
  U* p = nullptr;
  std::size_t bytes = 0;
  explicit stamp_buffer(std::size_t n) : bytes(n * sizeof(U)) {
    if (n == 0) return;
    p = static_cast<U*>(detail::allocate_block(bytes, true));
  }
  stamp_buffer(stamp_buffer&& o) noexcept : p(o.p), bytes(o.bytes) { o.p = nullptr; }
  stamp_buffer& operator=(stamp_buffer&& o) noexcept {
    std::swap(p, o.p);
    std::swap(bytes, o.bytes);
    return *this;
  }
  ~stamp_buffer() { detail::free_block(p, bytes); }
};

/// After a wave: checks one program's accesses against the final stamps, and registers its
/// loads of tensors the kernel may write. Programs are given in program order.
inline void check_wave_program(std::vector<tensor_entry>& entries,
                               std::vector<stamp_buffer<std::uint64_t>>& readers,
                               std::int64_t pid, std::vector<access> const& accesses,
                               std::array<int, 3> dims) {
  auto const me = static_cast<std::uint32_t>(pid + 1);
  for (access const& a : accesses) {
    tensor_entry& e = entries[static_cast<std::size_t>(a.tensor)];
    auto stamp = [&](int k) {
      return std::atomic_ref<std::uint32_t>(e.stamp[a.r.element(k)]).load(std::memory_order_relaxed);
    };
    switch (a.kind) {
    case access_kind::store: {
      // Every element still carries one of this program's stores. (The wave is over: plain
      // loads, so the loop vectorises.)
      std::uint32_t const* const stamps = e.stamp + a.r.offset;
      std::int64_t const step = a.r.step;
      std::uint32_t const mine = me << 1;
      std::uint32_t diff = 0;
      if (step == 1)
        for (int k = 0, n = a.r.count; k < n; ++k) diff |= stamps[k] ^ mine;
      else
        for (int k = 0, n = a.r.count; k < n; ++k) diff |= stamps[step * k] ^ mine;
      if (diff == 0) break;
      for (int k = 0; k < a.r.count; ++k)
        if (std::uint32_t const s = stamp(k); stamp_program(s) != me || (s & atomic_stamp))
          race(e, a.r.element(k), me, stamp_program(s), "stores",
               s & atomic_stamp ? "updates it atomically" : "stores it too", a.loc, dims);
      break;
    }
    case access_kind::atomic:
      for (int k = 0; k < a.r.count; ++k)
        if (std::uint32_t const s = stamp(k); !(s & atomic_stamp))
          race(e, a.r.element(k), me, stamp_program(s), "atomically updates", "stores it", a.loc,
               dims);
      break;
    case access_kind::load:
      if (!e.readers) {
        readers[static_cast<std::size_t>(a.tensor)] =
            stamp_buffer<std::uint64_t>(static_cast<std::size_t>(e.layout.span()));
        e.readers = readers[static_cast<std::size_t>(a.tensor)].p;
      }
      for (int k = 0; k < a.r.count; ++k) {
        std::int64_t const el = a.r.element(k);
        std::uint32_t const s = stamp(k);
        if (s & atomic_stamp) race(e, el, me, stamp_program(s), "loads", "updates it atomically", a.loc, dims);
        if (stamp_program(s) && stamp_program(s) != me)
          race(e, el, me, stamp_program(s), "loads", "stores it", a.loc, dims);
        std::uint64_t& rd = e.readers[el];
        auto const first = static_cast<std::uint32_t>(rd);
        if (!first)
          rd = me;
        else if (first != me && !(rd >> 32))
          rd |= std::uint64_t{me} << 32;
      }
      break;
    }
  }
}

} // namespace ad
} // namespace tilegrad
