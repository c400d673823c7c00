// Races between the programs of a vjp launch: two programs storing one element non-atomically,
// a program reading an element another program writes, or an element both stored and updated
// atomically. Triton leaves these undefined; the reverse sweep of one program at a time would
// silently get them wrong, so they are errors naming both programs, the tensor and the element.
// The check walks each program's accesses in program order after its wave ran, so the error a
// racy kernel gets is the same for any thread count.
#pragma once

#include "tilegrad/ad/context.hpp"
#include "tilegrad/grid/program.hpp"
#include "tilegrad/memory/checked.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tilegrad {

/// Two programs of one vjp launch touch one element in a way whose result depends on their order.
class race_error : public access_error {
public:
  race_error(std::string const& what, std::string program, std::string other, std::string tensor,
             std::string element, std::source_location where)
      : access_error(what, std::move(program), std::move(tensor), std::move(element), where),
        other_(std::move(other)) {}
  /// The program that touched the element first (in program order).
  std::string const& other_program() const { return other_; }

private:
  std::string other_;
};

namespace ad {

class race_checker {
public:
  race_checker(std::vector<tensor_entry> const& entries, grid g) : entries_(entries), grid_(g) {
    own_.resize(entries.size());
    for (auto const& e : entries) {
      if (!e.writable) continue;
      auto const n = static_cast<std::size_t>(e.layout.span());
      own_[static_cast<std::size_t>(e.index)].writer = std::make_unique<std::uint32_t[]>(n);
      own_[static_cast<std::size_t>(e.index)].reader = std::make_unique<std::uint64_t[]>(n);
    }
  }

  /// The accesses of program `pid` (linear id), in the order it made them.
  void add(std::int64_t pid, std::vector<access> const& accesses) {
    auto const me = static_cast<std::uint32_t>(pid + 1);
    for (access const& a : accesses) {
      ownership& o = own_[static_cast<std::size_t>(a.tensor)];
      for (int k = 0; k < a.r.count; ++k) {
        std::int64_t const el = a.r.element(k);
        std::uint32_t& w = o.writer[el];
        std::uint64_t& rd = o.reader[el];
        std::uint32_t const writer = w & ~atomic_bit;
        switch (a.kind) {
        case access_kind::load:
          if (w & atomic_bit) fail(a, el, me, writer, "loads", "updates it atomically");
          if (writer && writer != me) fail(a, el, me, writer, "loads", "stores it");
          note_reader(rd, me);
          break;
        case access_kind::store:
          if (w & atomic_bit) fail(a, el, me, writer, "stores", "updates it atomically");
          if (writer && writer != me) fail(a, el, me, writer, "stores", "stores it too");
          if (std::uint32_t const r = other_reader(rd, me)) fail(a, el, me, r, "stores", "loads it");
          w = me;
          break;
        case access_kind::atomic:
          if (writer && !(w & atomic_bit)) fail(a, el, me, writer, "updates atomically", "stores it");
          if (std::uint32_t const r = any_reader(rd)) fail(a, el, me, r, "updates atomically", "loads it");
          if (!writer) w = me | atomic_bit;
          break;
        }
      }
    }
  }

  /// Whether element `el` of tensor t was stored (non-atomically) by some program.
  bool stored(int t, std::int64_t el) const {
    auto const& o = own_[static_cast<std::size_t>(t)];
    return o.writer && o.writer[el] != 0 && !(o.writer[el] & atomic_bit);
  }

private:
  static constexpr std::uint32_t atomic_bit = 0x80000000u;
  struct ownership {
    std::unique_ptr<std::uint32_t[]> writer; // program + 1 (atomic_bit: updated atomically)
    std::unique_ptr<std::uint64_t[]> reader; // first reader + 1, and a second one in the high half
  };

  static void note_reader(std::uint64_t& rd, std::uint32_t me) {
    auto const first = static_cast<std::uint32_t>(rd);
    if (!first)
      rd = me;
    else if (first != me && !(rd >> 32))
      rd |= std::uint64_t{me} << 32;
  }
  static std::uint32_t other_reader(std::uint64_t rd, std::uint32_t me) {
    auto const first = static_cast<std::uint32_t>(rd), second = static_cast<std::uint32_t>(rd >> 32);
    return first && first != me ? first : second && second != me ? second : 0;
  }
  static std::uint32_t any_reader(std::uint64_t rd) { return static_cast<std::uint32_t>(rd); }

  std::string describe(std::uint32_t id) const {
    std::int64_t const lin = static_cast<std::int64_t>(id) - 1;
    int const x = static_cast<int>(lin % grid_.dims[0]);
    int const y = static_cast<int>((lin / grid_.dims[0]) % grid_.dims[1]);
    int const z = static_cast<int>(lin / (std::int64_t{grid_.dims[0]} * grid_.dims[1]));
    return program({x, y, z}, grid_.dims).describe();
  }

  [[noreturn]] void fail(access const& a, std::int64_t el, std::uint32_t me, std::uint32_t other,
                         char const* mine, char const* theirs) const {
    tensor_entry const& e = entries_[static_cast<std::size_t>(a.tensor)];
    std::string const elem = e.layout.coordinates(el);
    std::string const p = describe(me), q = describe(other);
    std::string msg = "tilegrad::vjp: race on tensor " + detail::tensor_label(e.name) + ", element " +
                      elem + ": " + p + " " + mine + " it at " + detail::where_string(a.loc) +
                      ", and " + (other == me ? std::string("the same program") : q) + " " + theirs +
                      ". Within one launch each element is written by one program (or only "
                      "accumulated with atomic_add), and no program reads what another writes.";
    throw race_error(msg, p, q, e.name, elem, a.loc);
  }

  std::vector<tensor_entry> const& entries_;
  grid grid_;
  std::vector<ownership> own_;
};

} // namespace ad
} // namespace tilegrad
