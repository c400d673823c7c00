// Build configuration: which backends are compiled in, and the few macros the library uses.
#pragma once

#include <cstdint>

#if !defined(TILEGRAD_USE_XSIMD)
#if __has_include(<xsimd/xsimd.hpp>)
#define TILEGRAD_USE_XSIMD 1
#else
#define TILEGRAD_USE_XSIMD 0
#endif
#endif

#if !defined(TILEGRAD_USE_TBB)
#if __has_include(<tbb/parallel_for.h>)
#define TILEGRAD_USE_TBB 1
#else
#define TILEGRAD_USE_TBB 0
#endif
#endif

#if !defined(TILEGRAD_USE_OPENMP)
#if defined(_OPENMP)
#define TILEGRAD_USE_OPENMP 1
#else
#define TILEGRAD_USE_OPENMP 0
#endif
#endif

// Hot-path helpers are forced inline: the fused loops only vectorise when every node of an
// expression is inlined into the loop body.
#if defined(__GNUC__) || defined(__clang__)
#define TILEGRAD_INLINE inline __attribute__((always_inline))
#define TILEGRAD_INLINE_LAMBDA __attribute__((always_inline))
#else
#define TILEGRAD_INLINE inline
#define TILEGRAD_INLINE_LAMBDA
#endif

// Slow paths kept out of line, so that the fast path they branch off stays small (and code
// reached from two paths is compiled once).
#if defined(__GNUC__) || defined(__clang__)
#define TILEGRAD_NOINLINE __attribute__((noinline))
#define TILEGRAD_NOINLINE_LAMBDA __attribute__((noinline))
#else
#define TILEGRAD_NOINLINE
#define TILEGRAD_NOINLINE_LAMBDA
#endif

// TILEGRAD_SEPARATE_COMPILATION=1: the reverse-mode and checker machinery that does not depend on
// a kernel (vjp's accumulation, the checker's body, per gradient type) is declared, not compiled,
// in every translation unit, and compiled in the one that includes tilegrad/separate.hpp. Set it
// for every file of a program, or for none; the default 0 keeps the library header-only.
#if !defined(TILEGRAD_SEPARATE_COMPILATION)
#define TILEGRAD_SEPARATE_COMPILATION 0
#endif

// Functions of that machinery which are not templates (reports, race and bounds messages, the
// tracked launch) are TILEGRAD_MACHINERY (free functions) or TILEGRAD_MACHINERY_MEMBER (members and
// friends defined in a class), their bodies under #if TILEGRAD_MACHINERY_BODIES. With separate
// compilation (GCC and Clang) a file sees their declarations only; the file that includes
// tilegrad/separate.hpp (TILEGRAD_SEPARATE_SOURCE) compiles them, once.
#if TILEGRAD_SEPARATE_COMPILATION && (defined(__GNUC__) || defined(__clang__))
#define TILEGRAD_MACHINERY
#if defined(TILEGRAD_SEPARATE_SOURCE)
#define TILEGRAD_MACHINERY_BODIES 1
#define TILEGRAD_MACHINERY_MEMBER __attribute__((used))
#else
#define TILEGRAD_MACHINERY_BODIES 0
#define TILEGRAD_MACHINERY_MEMBER
#endif
#else
#define TILEGRAD_MACHINERY inline
#define TILEGRAD_MACHINERY_MEMBER
#define TILEGRAD_MACHINERY_BODIES 1
#endif

// TILEGRAD_ASAN: this file is compiled under AddressSanitizer (GCC or Clang). The few places that
// keep memory of their own (kept blocks, a loop's frame bounds) behave differently under it.
#if defined(__SANITIZE_ADDRESS__)
#define TILEGRAD_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TILEGRAD_ASAN 1
#endif
#endif

namespace tilegrad {
inline namespace v0 {}
} // namespace tilegrad
