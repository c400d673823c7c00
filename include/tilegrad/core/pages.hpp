// Large blocks of memory (tensors, gradients, vjp's per-element stamps) mapped with a hint for
// transparent huge pages. A fresh 4 KiB page costs a fault on first touch (measured 3 ms per
// MiB on a virtual machine, every vjp call, for gradients it returns in fresh memory); a 2 MiB
// page costs one fault where 4 KiB pages cost 512.
#pragma once

#include "tilegrad/core/config.hpp"

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace tilegrad::detail {

/// Blocks from one huge page (2 MiB) on are mapped on their own, with the huge-page hint.
inline constexpr std::size_t large_block_bytes = std::size_t{2} << 20;

/// What a large block of `bytes` maps: whole huge pages.
constexpr std::size_t mapped_bytes(std::size_t bytes) {
  return (bytes + large_block_bytes - 1) / large_block_bytes * large_block_bytes;
}

/// Freed blocks kept for reuse: up to Capacity of them and MostBytes in all, each handed out
/// again for a block of the same class (its size rounded up by the caller). Never destroyed: a
/// tensor with static storage may be freed after every other static is gone.
template <int Capacity, std::size_t MostBytes>
class kept_cache {
public:
  static kept_cache& get() {
    static kept_cache* const cache = new kept_cache;
    return *cache;
  }
  /// A kept block of class c, or null.
  void* take(std::size_t c) {
    std::lock_guard<std::mutex> lock(m_);
    for (int i = n_ - 1; i >= 0; --i)
      if (kept_[i].bytes == c) {
        void* const p = kept_[i].p;
        total_ -= c;
        kept_[i] = kept_[--n_];
        return p;
      }
    return nullptr;
  }
  /// Keeps p, a block of class c; false where that would pass the limits.
  bool keep(void* p, std::size_t c) {
    std::lock_guard<std::mutex> lock(m_);
    if (n_ == Capacity || total_ + c > MostBytes)
      return false;
    kept_[n_++] = {p, c};
    total_ += c;
    return true;
  }

private:
  struct entry {
    void* p;
    std::size_t bytes;
  };
  std::mutex m_;
  entry kept_[Capacity]{};
  int n_ = 0;
  std::size_t total_ = 0;
};

/// Blocks from 128 KiB up to a huge page: the C library maps each on its own and unmaps it when it
/// is freed, so a vjp called again and again on the same shapes (a test, a benchmark, a training
/// step) faulted in every 4 KiB page of its gradients and stamps on every call (on the 16-core
/// Xeon, a softmax vjp of 256 rows of 1000 took 1.8-2.1 ms so, 1.0-1.4 ms with the memory kept).
/// Up to 16 freed blocks are kept and handed out again for the same size, rounded up to 64 KiB.
/// Not under AddressSanitizer, which must see every block freed.
struct kept_block_cache {
  static constexpr std::size_t smallest = std::size_t{128} << 10;
  static constexpr std::size_t granule = std::size_t{64} << 10;
  static constexpr std::size_t size_class(std::size_t bytes) {
    return (bytes + granule - 1) / granule * granule;
  }
};
inline auto& kept_blocks() { return kept_cache<16, 16 * large_block_bytes>::get(); }

/// Mappings of large blocks, freed: kept (up to 8, at most 256 MiB in all) and handed out again
/// for a block that maps the same number of huge pages. A fresh mapping is zeroed by the kernel,
/// page by page, on first touch: in a vjp of a large gradient (8192 x 512 floats) that zeroing
/// took 40 % of the call on a 2-core machine, every call. A kept block comes back as it was
/// left; zeroed only where the caller asks. Not under AddressSanitizer (a block unmapped when
/// freed faults where a freed gradient is read).
inline auto& kept_mappings() { return kept_cache<8, std::size_t{256} << 20>::get(); }

/// `bytes` of memory, 64-byte aligned (2 MiB aligned from large_block_bytes on, on Linux), zeroed
/// where `zero` says so. Give it back with free_block(p, bytes).
/// Throws std::bad_alloc.
inline void* allocate_block(std::size_t bytes, bool zero) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (bytes >= large_block_bytes) {
#ifndef TILEGRAD_ASAN
    if (void* const p = kept_mappings().take(mapped_bytes(bytes))) {
      if (zero) __builtin_memset(p, 0, bytes);
      return p;
    }
#endif
    // Map a 2 MiB-aligned range (a huge page needs the alignment): map one page more, then
    // unmap the ends. A fresh anonymous mapping reads zero.
    std::size_t const len = mapped_bytes(bytes);
    void* const raw = ::mmap(nullptr, len + large_block_bytes, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) throw std::bad_alloc();
    auto const a = reinterpret_cast<std::uintptr_t>(raw);
    std::uintptr_t const start = mapped_bytes(a);
    if (start > a) ::munmap(raw, start - a);
    std::uintptr_t const end = a + len + large_block_bytes;
    if (end > start + len) ::munmap(reinterpret_cast<void*>(start + len), end - (start + len));
    ::madvise(reinterpret_cast<void*>(start), len, MADV_HUGEPAGE); // a hint: ignored where off
    return reinterpret_cast<void*>(start);
  }
#endif
#ifndef TILEGRAD_ASAN
  if (bytes >= kept_block_cache::smallest) {
    void* p = kept_blocks().take(kept_block_cache::size_class(bytes));
    if (!p)
      p = ::operator new(kept_block_cache::size_class(bytes), std::align_val_t{64});
    if (zero) __builtin_memset(p, 0, bytes);
    return p;
  }
#endif
  void* const p = ::operator new(bytes == 0 ? 1 : bytes, std::align_val_t{64});
  if (zero) __builtin_memset(p, 0, bytes);
  return p;
}

inline void free_block(void* p, std::size_t bytes) noexcept {
  if (!p) return;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (bytes >= large_block_bytes) {
#ifndef TILEGRAD_ASAN
    if (kept_mappings().keep(p, mapped_bytes(bytes)))
      return;
#endif
    ::munmap(p, mapped_bytes(bytes));
    return;
  }
#endif
#ifndef TILEGRAD_ASAN
  if (bytes >= kept_block_cache::smallest &&
      kept_blocks().keep(p, kept_block_cache::size_class(bytes)))
    return;
#endif
  ::operator delete(p, std::align_val_t{64});
}

} // namespace tilegrad::detail
