// Large blocks of memory (tensors, gradients, vjp's per-element stamps) mapped with a hint for
// transparent huge pages. A fresh 4 KiB page costs a fault on first touch (measured 3 ms per
// MiB on a virtual machine, every vjp call, for gradients it returns in fresh memory); a 2 MiB
// page costs one fault where 4 KiB pages cost 512.
#pragma once

#include <cstddef>
#include <cstdint>
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

/// `bytes` of memory, 64-byte aligned (2 MiB aligned from large_block_bytes on, on Linux), zeroed
/// where `zero` says so (a large block always is). Give it back with free_block(p, bytes).
/// Throws std::bad_alloc.
inline void* allocate_block(std::size_t bytes, bool zero) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (bytes >= large_block_bytes) {
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
  void* const p = ::operator new(bytes == 0 ? 1 : bytes, std::align_val_t{64});
  if (zero) __builtin_memset(p, 0, bytes);
  return p;
}

inline void free_block(void* p, std::size_t bytes) noexcept {
  if (!p) return;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (bytes >= large_block_bytes) {
    ::munmap(p, mapped_bytes(bytes));
    return;
  }
#endif
  ::operator delete(p, std::align_val_t{64});
}

} // namespace tilegrad::detail
