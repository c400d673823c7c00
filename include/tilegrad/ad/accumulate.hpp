// Gradient contributions that programs of a vjp launch hold until they are added: kept in
// fixed-size chunks of a pool the launch shares (so the memory held is what is not added yet,
// whatever the sizes of the programs), split by block of gradient elements, and added block by
// block, each block by one thread, its contributions in program order.
#pragma once

#include "tilegrad/memory/runs.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

namespace tilegrad::ad {

using detail::run;

/// Chunks given back by the contribution pools of finished vjp calls, kept for the next call
/// up to `keep_bytes`: a call then finds its memory already mapped (a fresh mapping costs a
/// page fault per 4 KiB on first touch, each call, serialised in the kernel across threads).
class chunk_cache {
public:
  static constexpr std::size_t chunk_bytes = std::size_t{1} << 16; // 64 KiB
  static constexpr std::size_t keep_bytes = std::size_t{256} << 20;

  static chunk_cache& get() {
    static chunk_cache c;
    return c;
  }
  std::unique_ptr<std::byte[]> take() {
    {
      std::lock_guard<std::mutex> lock(m_);
      if (!free_.empty()) {
        std::unique_ptr<std::byte[]> c = std::move(free_.back());
        free_.pop_back();
        return c;
      }
    }
    return std::make_unique<std::byte[]>(chunk_bytes);
  }
  void give(std::vector<std::unique_ptr<std::byte[]>>& chunks) {
    std::lock_guard<std::mutex> lock(m_);
    for (auto& c : chunks)
      if (free_.size() * chunk_bytes < keep_bytes)
        free_.push_back(std::move(c));
    chunks.clear(); // (those not kept are freed here)
  }

private:
  std::mutex m_;
  std::vector<std::unique_ptr<std::byte[]>> free_;
};

/// Fixed-size chunks of memory for held contributions, shared by the programs of one vjp
/// launch; a chunk given back is reused. It owns every chunk it handed out, and gives them to
/// the chunk_cache when the launch is over.
class contribution_pool {
public:
  static constexpr std::size_t chunk_bytes = chunk_cache::chunk_bytes;

  contribution_pool() = default;
  contribution_pool(contribution_pool const&) = delete;
  contribution_pool& operator=(contribution_pool const&) = delete;
  ~contribution_pool() { chunk_cache::get().give(all_); }

  std::byte* take() {
    std::lock_guard<std::mutex> lock(m_);
    if (free_.empty()) {
      all_.push_back(chunk_cache::get().take());
      free_.push_back(all_.back().get());
    }
    std::byte* const c = free_.back();
    free_.pop_back();
    return c;
  }
  void give(std::vector<std::byte*> const& chunks) {
    if (chunks.empty())
      return;
    std::lock_guard<std::mutex> lock(m_);
    free_.insert(free_.end(), chunks.begin(), chunks.end());
  }
  /// The memory of every chunk taken: the most held at once.
  std::size_t bytes() const { return all_.size() * chunk_bytes; }

private:
  std::mutex m_;
  std::vector<std::unique_ptr<std::byte[]>> all_;
  std::vector<std::byte*> free_;
};

/// A contribution held: `values` added to the elements of run r of tensor `tensor`.
struct held_segment {
  int tensor;
  run r;
  void const* values;
};

/// One program's held contributions, in the order its sweep made them.
class held_contributions {
public:
  /// Appends the n values at v as a contribution to the elements of run r of tensor t; a run
  /// longer than the room left in the chunk is split (its lanes keep their order).
  template <class T>
  void add(contribution_pool& pool, int t, run r, T const* v) {
    static_assert(contribution_pool::chunk_bytes % sizeof(T) == 0);
    while (r.count > 0) {
      if (chunks_.empty() || used_ == contribution_pool::chunk_bytes) {
        chunks_.push_back(pool.take());
        used_ = 0;
      }
      std::size_t const room = (contribution_pool::chunk_bytes - used_) / sizeof(T);
      int const m =
          static_cast<int>(std::min<std::size_t>(room, static_cast<std::size_t>(r.count)));
      std::byte* const dst = chunks_.back() + used_;
      std::memcpy(dst, v, sizeof(T) * static_cast<std::size_t>(m));
      segments_.push_back({t, run{r.pos, m, r.offset, r.step}, dst});
      used_ += sizeof(T) * static_cast<std::size_t>(m);
      r.pos += m;
      r.offset += r.step * m;
      r.count -= m;
      v += m;
    }
  }
  std::vector<held_segment> const& segments() const { return segments_; }
  /// Gives the chunks back to the pool (once the contributions are added).
  void release(contribution_pool& pool) {
    pool.give(chunks_);
    clear();
  }
  /// Forgets the contributions (the pool that owns the chunks frees them).
  void clear() {
    segments_.clear();
    chunks_.clear();
    used_ = 0;
  }

private:
  std::vector<held_segment> segments_;
  std::vector<std::byte*> chunks_;
  std::size_t used_ = 0; // bytes of the last chunk
};

/// The gradient elements of a launch in blocks of block_elems, numbered across its tensors: the
/// unit of work of adding contributions (one thread adds everything that falls in a block).
struct gradient_blocks {
  // A multiple of 64: a block owns whole words of a gradient's bits of written elements.
  static constexpr std::int64_t block_elems = 16384;
  std::vector<std::int64_t> first; // by tensor: the number of its first block
  std::int64_t count = 0;

  /// The next tensor of the launch, with n gradient elements (0: it has no gradient).
  void add_tensor(std::int64_t n) {
    first.push_back(count);
    count += (n + block_elems - 1) / block_elems;
  }
  std::int64_t of(int tensor, std::int64_t element) const {
    return first[static_cast<std::size_t>(tensor)] + element / block_elems;
  }
};

/// A held contribution, or the part of one that falls in one block.
struct block_piece {
  std::int64_t block;
  held_segment s;
};

/// The segments `in` split at block boundaries, stably sorted by block (into `out`): within a
/// block, the pieces keep the order the program made them in, and a run's lanes their order.
template <class T>
void split_by_block(std::vector<held_segment> const& in, gradient_blocks const& blocks,
                    std::vector<block_piece>& out) {
  out.clear();
  constexpr std::int64_t B = gradient_blocks::block_elems;
  for (held_segment const& s : in) {
    run const& r = s.r;
    auto const* v = static_cast<T const*>(s.values);
    std::int64_t const step = r.step;
    for (int k0 = 0; k0 < r.count;) {
      std::int64_t const el = r.element(k0);
      std::int64_t const lo = el / B * B;
      // Lanes k0..k1-1 fall in the block of el (all of them for a run of one element).
      std::int64_t span = r.count - k0;
      if (step > 0)
        span = std::min(span, (lo + B - el + step - 1) / step);
      else if (step < 0)
        span = std::min(span, (el - lo) / -step + 1);
      int const m = static_cast<int>(span);
      out.push_back({blocks.of(s.tensor, el), {s.tensor, run{r.pos + k0, m, el, step}, v + k0}});
      k0 += m;
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](block_piece const& a, block_piece const& b) { return a.block < b.block; });
}

/// Which programs' pieces go to which block: for each block some program touches, the pieces of
/// each program, programs in order.
struct block_plan {
  struct part {
    std::int64_t block;
    std::int64_t program;     // index into the programs given to build
    std::uint32_t begin, end; // its pieces
  };
  std::vector<part> parts;         // by block, then program
  std::vector<std::size_t> starts; // where each block's parts begin, and parts.size()

  /// pieces(i): the pieces of program i (sorted by block), programs 0..n-1 in program order.
  template <class Pieces>
  void build(std::int64_t n, Pieces&& pieces) {
    parts.clear();
    starts.clear();
    for (std::int64_t i = 0; i < n; ++i) {
      std::vector<block_piece> const& p = pieces(i);
      for (std::size_t a = 0; a < p.size();) {
        std::size_t b = a + 1;
        while (b < p.size() && p[b].block == p[a].block)
          ++b;
        parts.push_back(
            {p[a].block, i, static_cast<std::uint32_t>(a), static_cast<std::uint32_t>(b)});
        a = b;
      }
    }
    std::stable_sort(parts.begin(), parts.end(),
                     [](part const& a, part const& b) { return a.block < b.block; });
    for (std::size_t i = 0; i < parts.size(); ++i)
      if (i == 0 || parts[i].block != parts[i - 1].block)
        starts.push_back(i);
    starts.push_back(parts.size());
  }
  std::int64_t blocks() const { return static_cast<std::int64_t>(starts.size()) - 1; }
};

} // namespace tilegrad::ad
