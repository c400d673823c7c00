// The tape of one program: an arena holding every recorded tile's values and adjoints, and the
// list of records whose backward() runs in reverse order. One tape per thread, reset (not
// freed) between programs, so a launch's memory is O(threads x one program's tape).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <source_location>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tilegrad/core/config.hpp"

#ifdef TILEGRAD_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace tilegrad::ad {

// Under AddressSanitizer the arena's memory that no live allocation holds is poisoned: a tile
// handle kept past a rewind (a checkpointed loop rewinds every iteration's values) or past the
// program's reset reads freed memory, which is reported, not read.
#ifdef TILEGRAD_ASAN
inline void tape_poison(void const* p, std::size_t n) {
  ASAN_POISON_MEMORY_REGION(p, n);
}
inline void tape_unpoison(void const* p, std::size_t n) {
  ASAN_UNPOISON_MEMORY_REGION(p, n);
}
#else
inline void tape_poison(void const*, std::size_t) {}
inline void tape_unpoison(void const*, std::size_t) {}
#endif

/// Something recorded during the forward pass that can push adjoints back to its inputs.
struct record {
  virtual ~record() = default;
  virtual void backward() = 0;
};

class tape {
public:
  tape() = default;
  tape(tape const&) = delete;
  tape& operator=(tape const&) = delete;
  ~tape() {
    reset();
    for (auto const& c : chunks_) {
      tape_unpoison(c.data, c.size);
      ::operator delete (c.data, std::align_val_t{64});
    }
  }

  /// n elements of T, 64-byte aligned, valid until reset().
  template <class T>
  T* alloc(std::size_t n) {
    std::size_t const bytes = (n * sizeof(T) + 63) & ~std::size_t{63};
    while (current_ < chunks_.size() && used_ + bytes > chunks_[current_].size) {
      ++current_;
      used_ = 0;
    }
    if (current_ == chunks_.size()) {
      std::size_t const size = std::max(bytes, chunk_bytes);
      chunks_.push_back({static_cast<std::byte*>(::operator new(size, std::align_val_t{64})), size});
      tape_poison(chunks_.back().data, size);
      used_ = 0;
    }
    std::byte* p = chunks_[current_].data + used_;
    tape_unpoison(p, bytes);
    used_ += bytes;
    peak_ = std::max(peak_, in_use());
    return reinterpret_cast<T*>(p);
  }

  template <class T>
  T* alloc_zero(std::size_t n) {
    T* p = alloc<T>(n);
    std::memset(static_cast<void*>(p), 0, n * sizeof(T));
    return p;
  }

  /// Constructs a record in the arena and appends it.
  template <class R, class... A>
  R* push(A&&... a) {
    R* r = new (alloc<R>(1)) R(std::forward<A>(a)...);
    records_.push_back(r);
    return r;
  }

  /// Runs every record's backward(), last first. A record's backward() may record more (a
  /// checkpointed loop records one iteration at the end of the tape, sweeps it with sweep_from
  /// and rewinds): records are taken by index, so that appending cannot invalidate the walk.
  void sweep() { sweep_from({}); }

  /// A point on the tape to come back to: the records and the bytes in use then.
  struct mark_type {
    std::size_t records = 0, chunk = 0, used = 0, errors = 0, iterations = 0;
  };
  mark_type mark() const {
    return {records_.size(), current_, used_, error_log_.size(), iteration_loops_.size()};
  }
  /// Runs the backward() of the records made since m, last first.
  void sweep_from(mark_type const& m) {
    for (std::size_t i = records_.size(); i > m.records; --i)
      records_[i - 1]->backward();
  }
  /// Drops the records made since m and gives their memory back to the arena: what was
  /// allocated since m is invalid afterwards.
  void rewind(mark_type const& m) {
    for (std::size_t i = m.records; i < records_.size(); ++i)
      records_[i]->~record();
    records_.resize(m.records);
    release(m.chunk, m.used);
    current_ = m.chunk;
    used_ = m.used;
    for (std::size_t i = m.errors; i < error_log_.size(); ++i)
      errors_.erase(error_log_[i]);
    error_log_.resize(m.errors);
    std::fill(rewound_.begin() + static_cast<std::ptrdiff_t>(m.iterations), rewound_.end(), 1);
  }

  /// Drops the records, keeps the memory for the next program.
  void reset() {
    for (record* r : records_) r->~record();
    records_.clear();
    release(0, 0);
    current_ = 0;
    used_ = 0;
    recording_ = true;
    iteration_ = 0;
    iteration_loops_.clear();
    rewound_.clear();
    if (!error_log_.empty()) {
      errors_.clear();
      error_log_.clear();
    }
  }

  /// A reference run with rounding jitter (ad/jitter.hpp) keeps, beside a recorded tile's values,
  /// an estimate of their rounding errors, found by the values' address; rewind and reset drop
  /// those made since.
  void set_errors(void const* values, void const* errors) {
    if (errors_.insert_or_assign(values, errors).second)
      error_log_.push_back(values);
  }
  void const* errors_of(void const* values) const {
    if (error_log_.empty())
      return nullptr;
    auto const it = errors_.find(values);
    return it == errors_.end() ? nullptr : it->second;
  }

  std::size_t records() const { return records_.size(); }
  /// Bytes in use now, and the most ever in use (a high-water mark across programs).
  std::size_t in_use() const {
    std::size_t b = used_;
    for (std::size_t i = 0; i < current_ && i < chunks_.size(); ++i) b += chunks_[i].size;
    return b;
  }
  std::size_t peak() const { return peak_; }
  /// Whether operations on active tiles record (off while a checkpointed loop runs its
  /// iterations forward: their results are only values, the sweep records them again).
  bool recording() const { return recording_; }
  void set_recording(bool on) { recording_ = on; }
  /// The tg::loop iteration running now (0 outside every loop body), numbered from 1 in the
  /// order the program's iterations begin. An adjoint tile keeps the number of the iteration it
  /// was made or assigned in: once a rewind dropped that iteration's records, reading it is an
  /// error (ad/tile.hpp).
  std::uint64_t iteration() const { return iteration_; }
  /// Whether the records of iteration i were dropped by a rewind.
  bool rewound(std::uint64_t i) const { return i != 0 && i <= rewound_.size() && rewound_[i - 1]; }
  /// The source line of the tg::loop that iteration i (from 1) belongs to.
  std::source_location const* loop_of(std::uint64_t i) const {
    return i >= 1 && i <= iteration_loops_.size() ? iteration_loops_[i - 1] : nullptr;
  }
  /// Begins an iteration of the loop at `where`; returns the one it interrupts, for end_iteration.
  std::uint64_t begin_iteration(std::source_location const* where) {
    std::uint64_t const outer = iteration_;
    iteration_loops_.push_back(where);
    rewound_.push_back(0);
    iteration_ = iteration_loops_.size();
    return outer;
  }
  void end_iteration(std::uint64_t outer) { iteration_ = outer; }
  /// Starts a new high-water mark (one per program).
  void reset_peak() { peak_ = in_use(); }
  std::size_t reserved() const {
    std::size_t b = 0;
    for (auto const& c : chunks_) b += c.size;
    return b;
  }

  struct chunk {
    std::byte* data;
    std::size_t size;
  };
private:
  /// Poisons (under AddressSanitizer) what is in use from chunk c at byte u on: about to be freed.
  void release([[maybe_unused]] std::size_t c, [[maybe_unused]] std::size_t u) {
#ifdef TILEGRAD_ASAN
    for (std::size_t i = c; i <= current_ && i < chunks_.size(); ++i) {
      std::size_t const from = i == c ? u : 0, to = i == current_ ? used_ : chunks_[i].size;
      if (to > from)
        tape_poison(chunks_[i].data + from, to - from);
    }
#endif
  }

  static constexpr std::size_t chunk_bytes = std::size_t{1} << 20;
  std::vector<chunk> chunks_;
  std::size_t current_ = 0, used_ = 0, peak_ = 0;
  bool recording_ = true;
  std::uint64_t iteration_ = 0;
  std::vector<std::source_location const*> iteration_loops_; // per iteration begun
  std::vector<std::uint8_t> rewound_;                        // per iteration begun
  std::vector<record*> records_;
  std::unordered_map<void const*, void const*> errors_;
  std::vector<void const*> error_log_;
};

} // namespace tilegrad::ad
