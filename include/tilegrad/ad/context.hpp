// What reverse mode knows while one program runs: its tape, the tensors of the launch (their
// roles, cotangents and per-element ownership), the accesses it makes to tensors the kernel may
// write (for exact store/load semantics and race detection) and the gradient contributions it
// produces for input tensors, kept as runs of elements rather than element by element.
#pragma once

#include "tilegrad/ad/tape.hpp"
#include "tilegrad/memory/tensor.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <source_location>
#include <vector>

namespace tilegrad::ad {

enum class role { passive, in, out, inout };

/// A float tensor of a vjp launch, by address range.
struct tensor_entry {
  std::byte const* lo = nullptr; // first byte of its data
  std::byte const* hi = nullptr; // one past the last element it spans
  int index = 0;
  role r = role::passive;
  bool writable = false; // the kernel receives it non-const: its accesses are tracked
  char const* name = "";
  tensor<std::byte const> layout;       // shape and strides, for naming elements in messages
  void const* cotangent = nullptr;      // out / inout: indexed by the tensor's element offset
  std::uint64_t* stamp = nullptr;       // writable: (program + 1) << 32 | its last write there
  std::uint64_t* readers = nullptr;     // writable, once loaded: the first two readers + 1
  bool wants_grad() const { return r == role::in || r == role::inout; }
  bool has_cotangent() const { return r == role::out || r == role::inout; }
};

/// A run of n lanes of a tile, pos, pos+1, ..., addressing elements offset, offset + step, ...
/// of a tensor (step 0: one element, n times).
struct run {
  int pos;
  int count;
  std::int64_t offset;
  std::int64_t step;
  std::int64_t element(int k) const { return offset + step * k; }
};

/// Appends lanes to a list of runs, merging a lane into the last run where it continues it.
/// The last run is kept aside until finish() (or the builder's end), so that the common case,
/// a lane continuing it, touches no vector.
class run_builder {
public:
  explicit run_builder(std::vector<run>& out) : out_(out) { out_.clear(); }
  run_builder(run_builder const&) = delete;
  run_builder& operator=(run_builder const&) = delete;
  ~run_builder() { finish(); }
  /// Lanes pos..pos+n-1 at elements off..off+n-1.
  void add(int pos, std::int64_t off, int n) {
    run& b = last_;
    if (b.count != 0 && b.pos + b.count == pos && (b.count == 1 || b.step == 1) &&
        b.offset + b.count == off) {
      b.step = 1;
      b.count += n;
      return;
    }
    start({pos, n, off, 1});
  }
  /// Lane pos at element off.
  void add(int pos, std::int64_t off) {
    run& b = last_;
    if (b.count != 0 && b.pos + b.count == pos) {
      if (b.count == 1) {
        b.step = off - b.offset;
        b.count = 2;
        return;
      }
      if (b.element(b.count) == off) {
        ++b.count;
        return;
      }
    }
    start({pos, 1, off, 1});
  }
  /// Moves the last run to the list; the list is complete.
  void finish() {
    if (last_.count != 0) out_.push_back(last_);
    last_.count = 0;
  }

private:
  void start(run const& r) {
    if (last_.count != 0) out_.push_back(last_);
    last_ = r;
  }
  std::vector<run>& out_;
  run last_{0, 0, 0, 1};
};

enum class access_kind : std::uint8_t { load, store, atomic };

/// A program's access to a tensor the kernel may write, in program order.
struct access {
  access_kind kind;
  int tensor;
  run r;
  void* adj; // store / atomic: the adjoints of the lanes written (lane r.pos first), or null
  std::source_location loc;
};

/// A program's contribution to the gradient of an input: values (at `at` in the program's value
/// buffer) added to the elements of a run.
struct segment {
  int tensor;
  run r;
  std::size_t at;
};

/// Everything one program hands to the launch after it ran; reused from wave to wave.
struct program_result {
  std::vector<access> accesses;
  std::vector<segment> segments;
  std::unique_ptr<std::byte[]> values;
  std::size_t used = 0, capacity = 0;
  std::uint64_t reads = 0; // bit i: tensor i was loaded from

  void clear() {
    accesses.clear();
    segments.clear();
    used = 0;
    reads = 0;
  }
  /// Appends the n values at v as a contribution to the elements of run r of tensor t.
  template <class T>
  void contribute(int t, run const& r, T const* v) {
    std::size_t const bytes = sizeof(T) * static_cast<std::size_t>(r.count);
    if (used + bytes > capacity) {
      std::size_t const cap = std::max(2 * capacity, used + bytes + 4096);
      auto grown = std::make_unique<std::byte[]>(cap);
      if (used) std::memcpy(grown.get(), values.get(), used);
      values = std::move(grown);
      capacity = cap;
    }
    std::memcpy(values.get() + used, v, bytes);
    segments.push_back({t, r, used});
    used += bytes;
  }
};

struct program_state {
  tape t;
  std::vector<tensor_entry> const* tensors = nullptr;
  program_result* out = nullptr;
  std::uint64_t me = 0; // this program's stamp: (linear program id + 1) << 32
  // Programs before this one in program order ran in earlier waves (ids + 1 up to this one):
  // a conflict with them is reported at once; conflicts within a wave after it, in program order.
  std::uint32_t earlier_waves = 0;
  bool earlier(std::uint32_t id) const { return id != 0 && id <= earlier_waves; }
  std::vector<run> scratch;
  bool overwrote = false; // stored an element it had stored before (so not every store is last)

  /// The tensor whose memory holds address p (null for memory of no vjp tensor).
  tensor_entry const* find(void const* p) const {
    if (!tensors) return nullptr;
    auto const* b = static_cast<std::byte const*>(p);
    for (auto const& e : *tensors)
      if (b >= e.lo && b < e.hi) return &e;
    return nullptr;
  }

  /// The adjoint slot of the value this program stored last at an element whose stamp is s,
  /// if it did (`stored`); the slot is null when it stored a constant.
  template <class T>
  T* stored_slot(std::uint64_t s, std::int64_t off, bool& stored) const {
    stored = (s & ~std::uint64_t{0xffffffff}) == me && !(s & (std::uint64_t{1} << 31));
    if (!stored) return nullptr;
    access const& a = out->accesses[s & 0x7fffffff];
    if (!a.adj) return nullptr;
    int const k = a.r.step == 0 ? a.r.count - 1 : static_cast<int>((off - a.r.offset) / a.r.step);
    return static_cast<T*>(a.adj) + k;
  }

  void reset() {
    t.reset();
    overwrote = false;
  }
};

/// The reverse-mode state of the program running on this thread.
inline program_state*& current_state() {
  thread_local program_state* s = nullptr;
  return s;
}

/// The tape adjoint tiles record on: the running program's, or a per-thread scratch tape for
/// adjoint tiles used outside vjp (recorded, never swept).
inline tape& current_tape() {
  if (program_state* s = current_state()) return s->t;
  thread_local tape scratch;
  return scratch;
}

} // namespace tilegrad::ad
