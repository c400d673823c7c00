// Storage of a tile's elements. Small tiles keep them inline; large ones (a 64x64 float tile
// is 16 KiB) keep them in a 64-byte aligned block from a per-thread cache, so that moving a
// tile (into an expression, out of a load or a dot) moves a pointer instead of copying the
// block, and a program's big tiles do not sit on worker threads' stacks.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

namespace tilegrad {

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

template <class T, int N, bool Inline = (N * sizeof(T) <= inline_tile_bytes)>
class tile_storage;

template <class T, int N>
class tile_storage<T, N, true> {
public:
  tile_storage() = default;
  T* get() { return data_; }
  T const* get() const { return data_; }

private:
  alignas(64) T data_[N];
};

template <class T, int N>
class tile_storage<T, N, false> {
public:
  tile_storage() : p_(allocate()) {}
  tile_storage(tile_storage const& o) : p_(allocate()) {
    if constexpr (std::is_trivially_copyable_v<T>)
      std::memcpy(p_, o.p_, N * sizeof(T));
    else
      std::copy(o.p_, o.p_ + N, p_);
  }
  tile_storage(tile_storage&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  tile_storage& operator=(tile_storage const& o) {
    if (this != &o) {
      if (!p_) p_ = allocate();
      if constexpr (std::is_trivially_copyable_v<T>)
        std::memcpy(p_, o.p_, N * sizeof(T));
      else
        std::copy(o.p_, o.p_ + N, p_);
    }
    return *this;
  }
  tile_storage& operator=(tile_storage&& o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  ~tile_storage() { release(); }

  T* get() { return p_; }
  T const* get() const { return p_; }

private:
  static T* allocate() {
    T* p = static_cast<T*>(block_cache::local().take(N * sizeof(T)));
    if constexpr (!std::is_trivially_default_constructible_v<T>)
      std::uninitialized_value_construct_n(p, N);
    return p;
  }
  void release() {
    if (!p_) return;
    if constexpr (!std::is_trivially_destructible_v<T>) std::destroy_n(p_, N);
    block_cache::local().give(p_, N * sizeof(T));
    p_ = nullptr;
  }
  T* p_;
};

} // namespace detail
} // namespace tilegrad
