// Storage of a tile's elements. Small tiles keep them inline; large ones (a 64x64 float tile
// is 16 KiB) keep them in a 64-byte aligned block from a per-thread cache, so that moving a
// tile (into an expression, out of a load or a dot) moves a pointer instead of copying the
// block, and a program's big tiles do not sit on worker threads' stacks.
#pragma once

#include "tilegrad/core/config.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

namespace tilegrad {

struct bf16;

/// Tag: construct a tile without initialising its elements (they are written next).
struct uninitialized_t {
  explicit uninitialized_t() = default;
};
inline constexpr uninitialized_t uninitialized{};

namespace detail {

/// Tiles up to this many bytes live inline.
inline constexpr std::size_t inline_tile_bytes = 512;

// A per-thread cache of freed blocks, by size: tiles are made and dropped at a high rate
// inside programs, always in a few sizes.
class block_cache {
public:
  static block_cache& local() {
    thread_local block_cache c;
    return c;
  }
  void* take(std::size_t bytes) {
    for (auto& s : slots_)
      if (s.bytes == bytes && s.count > 0) return s.blocks[--s.count];
    return ::operator new(bytes, std::align_val_t{64});
  }
  void give(void* p, std::size_t bytes) {
    for (auto& s : slots_)
      if (s.bytes == bytes && s.count < depth) {
        s.blocks[s.count++] = p;
        return;
      }
    for (auto& s : slots_)
      if (s.count == 0) { // claim an empty slot for this size
        s.bytes = bytes;
        s.blocks[s.count++] = p;
        return;
      }
    ::operator delete(p, std::align_val_t{64});
  }
  ~block_cache() {
    for (auto& s : slots_)
      for (int i = 0; i < s.count; ++i) ::operator delete(s.blocks[i], std::align_val_t{64});
  }

private:
  static constexpr int depth = 16;
  struct slot {
    std::size_t bytes = 0;
    int count = 0;
    void* blocks[depth];
  };
  slot slots_[16];
};

/// Tag: construct a tile that reads memory it does not own (a borrowed block load).
struct borrow_t {
  explicit borrow_t() = default;
};
inline constexpr borrow_t borrow{};

// The heap tiles of this thread that read memory they do not own (block loads of read-only
// tensors, used in place instead of copied). A tile stays a value: before this thread writes
// memory a borrower reads (a store, an atomic), before anything writes the tile, and when it is
// copied, it gets its own block first (borrows::before_write, tile_storage::own). A tile that
// cannot borrow (the list is full) copies, as every load did before.
class borrows {
public:
  static constexpr int capacity = 32;
  // A borrower's address is kept as a number: a tile leaves the list before it ends (its
  // destructor, or a move that relinks it), which a compiler cannot see when a local tile is
  // listed in thread storage.
  struct entry {
    std::uintptr_t storage;
    void (*own)(void*);
    char const* lo;
    char const* hi;
  };

  TILEGRAD_INLINE bool add(void* storage, void (*own)(void*), void const* lo, void const* hi) {
    if (n_ == capacity) return false;
    e_[n_++] = {address(storage), own, static_cast<char const*>(lo), static_cast<char const*>(hi)};
    return true;
  }
  TILEGRAD_INLINE void remove(void* storage) {
    for (int i = n_ - 1; i >= 0; --i)
      if (e_[i].storage == address(storage)) {
        // The newest entry, the usual case, is dropped without a copy. Copying it onto itself
        // read 32 bytes just written by narrower stores: a load the store buffer cannot
        // forward, which waits for every older store to reach the cache, in a row kernel the
        // row just stored, still on its way from memory.
        if (i != --n_) e_[i] = e_[n_];
        return;
      }
  }
  /// The borrower at `from` moved to `to`.
  void relink(void* from, void* to) {
    for (int i = n_ - 1; i >= 0; --i)
      if (e_[i].storage == address(from)) {
        e_[i].storage = address(to);
        return;
      }
  }
  /// Two storages exchanged their states.
  void swap_links(void* a, void* b) {
    for (int i = 0; i < n_; ++i) {
      if (e_[i].storage == address(a))
        e_[i].storage = address(b);
      else if (e_[i].storage == address(b))
        e_[i].storage = address(a);
    }
  }
  /// Every borrower reading [lo, hi) gets its own copy: the memory is about to change.
  void before_write(void const* lo, void const* hi) {
    auto const* l = static_cast<char const*>(lo);
    auto const* h = static_cast<char const*>(hi);
    for (int i = n_ - 1; i >= 0; --i)
      if (e_[i].lo < h && l < e_[i].hi)
        e_[i].own(reinterpret_cast<void*>(e_[i].storage)); // (own removes entry i)
  }
  int live() const { return n_; }

private:
  static std::uintptr_t address(void* p) { return reinterpret_cast<std::uintptr_t>(p); }
  entry e_[capacity]{};
  int n_ = 0;
};

inline constinit thread_local borrows borrowed_tiles;

/// Before this thread writes [lo, hi): the tiles reading it take their own copies.
inline void before_write(void const* lo, void const* hi) {
  if (borrowed_tiles.live() != 0) [[unlikely]]
    borrowed_tiles.before_write(lo, hi);
}

template <class T, int N, bool Inline = (N * sizeof(T) <= inline_tile_bytes)>
class tile_storage;

template <class T, int N>
class tile_storage<T, N, true> {
public:
  tile_storage() = default;
  /// Small tiles copy what a borrowing load gives them.
  tile_storage(borrow_t, T const* src, void const*, void const*)
    requires std::is_trivially_copyable_v<T>
  {
    std::memcpy(data_, src, N * sizeof(T));
  }
  T* get() { return data_; }
  T const* get() const { return data_; }

private:
  // Aligned to its size's largest power-of-two factor, up to a cache line: no padding follows the
  // elements. (A tile's padding would be copied with it, holding what the stack held there:
  // tg::loop reads a body's captures word by word, and an old stack address in a captured
  // mask's padding would look like a capture by reference.)
  static constexpr std::size_t bytes = N * sizeof(T);
  alignas(std::min<std::size_t>(64, bytes & (~bytes + 1))) T data_[N];
};

template <class T, int N>
class tile_storage<T, N, false> {
public:
  static constexpr bool can_borrow = std::is_trivially_copyable_v<T>;

  tile_storage() : p_(allocate()) {}
  /// Reads the N elements at `src` in place while it can (see borrows); [lo, hi) is the memory
  /// of the tensor they belong to, whose writes end the borrow.
  TILEGRAD_INLINE tile_storage(borrow_t, T const* src, void const* lo, void const* hi)
    requires can_borrow
  {
    if (borrowed_tiles.add(this, &own_at, lo, hi)) {
      p_ = const_cast<T*>(src); // read only: every write path calls own() first
      borrowed_ = true;
    } else {
      p_ = allocate();
      std::memcpy(p_, src, N * sizeof(T));
    }
  }
  tile_storage(tile_storage const& o) : p_(allocate()) {
    if constexpr (std::is_trivially_copyable_v<T>)
      std::memcpy(p_, o.p_, N * sizeof(T));
    else
      std::copy(o.p_, o.p_ + N, p_);
  }
  tile_storage(tile_storage&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), borrowed_(std::exchange(o.borrowed_, false)) {
    if (borrowed_) borrowed_tiles.relink(&o, this);
  }
  tile_storage& operator=(tile_storage const& o) {
    if (this != &o) {
      if (borrowed_) { // about to be overwritten: a block of its own, nothing copied into it
        unlink();
        p_ = allocate();
      }
      if constexpr (std::is_trivially_copyable_v<T>)
        std::memcpy(p_, o.p_, N * sizeof(T));
      else
        std::copy(o.p_, o.p_ + N, p_);
    }
    return *this;
  }
  tile_storage& operator=(tile_storage&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(borrowed_, o.borrowed_);
    if (borrowed_ || o.borrowed_) borrowed_tiles.swap_links(this, &o);
    return *this;
  }
  TILEGRAD_INLINE ~tile_storage() {
    if (borrowed_) { // (a borrower leaves the list; nothing to give back)
      unlink();
      return;
    }
    release();
  }

  /// Writable elements: a borrower copies what it reads into a block of its own first.
  T* get() {
    if (borrowed_) [[unlikely]]
      own();
    return p_;
  }
  T const* get() const { return p_; }
  /// Where the elements are found (expression leaves of a heap tile read through it, so that
  /// they follow a borrower to its own copy).
  T const* const* slot() const { return const_cast<T const* const*>(&p_); }

private:
  static T* allocate() {
    T* p = static_cast<T*>(block_cache::local().take(N * sizeof(T)));
    // bf16 (16 bits of storage, zero only by its default member initialiser) is not zeroed here:
    // every constructor of a tile writes all its elements next. (adjoint and dual elements are
    // still constructed: their defaults mean something.)
    if constexpr (!std::is_trivially_default_constructible_v<T> && !std::is_same_v<T, bf16>)
      std::uninitialized_value_construct_n(p, N);
    return p;
  }
  // A borrower leaves the thread's list (its p_ still points at the memory it read).
  void unlink() {
    borrowed_tiles.remove(this);
    borrowed_ = false;
  }
  void own() {
    T* const p = allocate();
    std::memcpy(p, p_, N * sizeof(T));
    unlink();
    p_ = p;
  }
  static void own_at(void* self) { static_cast<tile_storage*>(self)->own(); }
  void release() {
    if (!p_) return;
    if (borrowed_) {
      unlink();
      p_ = nullptr;
      return;
    }
    if constexpr (!std::is_trivially_destructible_v<T>) std::destroy_n(p_, N);
    block_cache::local().give(p_, N * sizeof(T));
    p_ = nullptr;
  }
  T* p_;
  bool borrowed_ = false;
};

} // namespace detail
} // namespace tilegrad
