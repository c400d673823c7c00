// Runs of lanes: the lanes of a tile access, pos, pos+1, ..., listed as the elements they address
// (offset, offset + step, ...), merged as they are gathered. Reverse mode records its loads and
// stores this way, and so does the access tracking of launches that check for races.
#pragma once

#include <cstdint>
#include <vector>

namespace tilegrad::detail {

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
    run& b = last_; // (a run of one lane has step 1; with none, pos -1 continues nothing)
    if (b.pos + b.count == pos && b.step == 1 && b.offset + b.count == off) {
      b.count += n;
      return;
    }
    start({pos, n, off, 1});
  }
  /// Lane pos at element off.
  void add(int pos, std::int64_t off) {
    run& b = last_;
    if (b.pos + b.count == pos) {
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
  /// The lanes of run r.
  void add(run const& r) {
    if (r.step == 1 || r.count == 1)
      add(r.pos, r.offset, r.count);
    else
      start(r);
  }
  /// Moves the last run to the list; the list is complete.
  void finish() {
    if (last_.count != 0)
      out_.push_back(last_);
    last_ = none;
  }

private:
  static constexpr run none{-1, 0, 0, 1};
  void start(run const& r) {
    if (last_.count != 0)
      out_.push_back(last_);
    last_ = r;
  }
  std::vector<run>& out_;
  run last_ = none;
};

} // namespace tilegrad::detail
