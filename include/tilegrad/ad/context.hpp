// What reverse mode knows while one program runs: its tape, the tensors of the launch (their
// roles and cotangents), the elements it has stored (for exact store/load semantics) and the
// gradient contributions it produces for input tensors.
#pragma once

#include "tilegrad/ad/tape.hpp"

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace tilegrad::ad {

enum class role { passive, in, out, inout };

/// A float tensor of a vjp launch, by address range.
struct tensor_entry {
  std::byte const* lo = nullptr; // first byte of its data
  std::byte const* hi = nullptr; // one past the last element it spans
  int index = 0;
  role r = role::passive;
  void const* cotangent = nullptr; // for out / inout: same layout as the tensor
  char const* name = "";
  bool wants_grad() const { return r == role::in || r == role::inout; }
};

/// One program's contribution to the gradient of an input element.
struct contribution {
  int tensor;
  std::int64_t offset; // elements from the tensor's data()
  double value;
};

struct program_state {
  tape t;
  std::vector<tensor_entry> const* tensors = nullptr;
  // (tensor index, element) -> the adjoint slot of the value this program stored there last
  std::unordered_map<std::uint64_t, void*> stored;
  std::vector<contribution> contributions;
  std::uint64_t reads = 0; // bit i: tensor i was loaded from

  static std::uint64_t key(int tensor, std::int64_t offset) {
    return (static_cast<std::uint64_t>(tensor) << 48) ^ static_cast<std::uint64_t>(offset);
  }

  /// The tensor whose memory holds address p (null for memory of no vjp tensor).
  tensor_entry const* find(void const* p) const {
    if (!tensors) return nullptr;
    auto const* b = static_cast<std::byte const*>(p);
    for (auto const& e : *tensors)
      if (b >= e.lo && b < e.hi) return &e;
    return nullptr;
  }

  void reset() {
    t.reset();
    stored.clear();
    contributions.clear();
    reads = 0;
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
