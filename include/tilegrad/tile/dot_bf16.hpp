// C += A @ B for bf16 A and B and a float C with the CPU's bf16 dot-product instruction
// (AVX512-BF16's vdpbf16ps): one instruction adds, to each of 16 float lanes, the products of a
// pair of consecutive k, a[2p] b[2p] and a[2p + 1] b[2p + 1]. B is packed into panels whose
// 32-bit lanes hold such a pair of one column; A's pairs are broadcast, read in place from a
// row-major A or packed the same way from a transposed one. The register blocking is the float
// micro-kernel's of dot.hpp: MR rows x NB vectors of C in registers while the pairs run.
//
// What it computes (measured on AMD Zen 4, as Intel documents it): each pair adds the odd
// product, then the even one, each product exact in float and each addition rounded to nearest
// even, so the sum over K has the K roundings of the float kernel's fma chain, in another order.
// Denormal operands (bf16 or the accumulator) count as zero and denormal results flush to zero.
//
// On targets with AMX (Intel Sapphire Rapids and later), products whose M and N are multiples of
// 16 and K of 32 run on AMX tiles instead (TDPBF16PS: a 16 x 16 block of C takes the pairs of a
// 16 x 32 block of A and of a 32 x 16 block of B in one instruction), once the process is
// permitted to use them (Linux asks each process to request the tile state); other shapes, or no
// permission, take the float path there. Same pair products, same flushing, the same bound.
#pragma once

#include "tilegrad/core/bf16.hpp"
#include "tilegrad/core/config.hpp"
#include "tilegrad/core/simd.hpp"
#include "tilegrad/core/storage.hpp"

#include <cstdint>
#include <cstring>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

// 1 when this build has the bf16 kernel (the xsimd build on a target with AVX512-BF16).
#if TILEGRAD_USE_XSIMD && defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define TILEGRAD_HAVE_BF16_DOT 1
#else
#define TILEGRAD_HAVE_BF16_DOT 0
#endif

namespace tilegrad::detail {

/// Whether dot of two bf16 operands runs the kernel below: it is built, and TILEGRAD_NO_BF16_DOT
/// (defined before the first tilegrad header) does not ask for the float path instead. Targets
/// with AMX (Intel Sapphire Rapids and later) run AMX where the shape fits (bf16_dot_amx) and
/// the float path elsewhere unless TILEGRAD_BF16_DOT is defined: there `vdpbf16ps` issues on one
/// port where FMAs issue on two, and the kernel ran at 0.56-0.65 of the float one
/// (docs/performance.md); on AMD Zen 4 it runs at 1.9 times.
// (Linux only: the process asks the kernel for the tile state; elsewhere the float path.)
#if TILEGRAD_HAVE_BF16_DOT && defined(__AMX_TILE__) && defined(__AMX_BF16__) &&                    \
    defined(__linux__) && !defined(TILEGRAD_NO_AMX)
#define TILEGRAD_HAVE_AMX_BF16 1
#else
#define TILEGRAD_HAVE_AMX_BF16 0
#endif

#if TILEGRAD_HAVE_BF16_DOT && !defined(TILEGRAD_NO_BF16_DOT) &&                                    \
    (!defined(__AMX_BF16__) || defined(TILEGRAD_BF16_DOT))
inline constexpr bool bf16_dot_native = true;
#else
inline constexpr bool bf16_dot_native = false;
#endif

/// Whether dot of two bf16 operands runs on AMX tiles where the shape fits and the process is
/// permitted (TILEGRAD_NO_AMX, defined before the first tilegrad header, turns it off).
inline constexpr bool bf16_dot_amx = TILEGRAD_HAVE_AMX_BF16 != 0;

/// Whether dot of two bf16 operands may run a bf16 kernel at all (which one, and for which
/// shapes: bf16_kernel_runs).
inline constexpr bool bf16_dot_kernel = bf16_dot_native || bf16_dot_amx;

/// The shapes AMX takes: whole 16 x 16 blocks of C and whole 32-deep blocks of k.
template <int M, int N, int K>
inline constexpr bool amx_shape = M % 16 == 0 && N % 16 == 0 && K % 32 == 0;

#if TILEGRAD_HAVE_BF16_DOT

namespace bf16dot {

inline constexpr int lanes = 16; // float lanes of a 512-bit register

/// n rounded up to whole vectors.
template <int N>
inline constexpr int padded = (N + lanes - 1) / lanes* lanes;

/// Pairs of k: ceil(K / 2).
template <int K>
inline constexpr int pairs = (K + 1) / 2;

/// Scratch for packed pairs, 64-byte aligned (from the per-thread block cache when large).
template <int N>
using pair_buffer = tile_storage<std::uint32_t, N>;

TILEGRAD_INLINE __m512bh as_bh(__m512i v) {
  return (__m512bh)v;
}

/// Rows 2p and 2p + 1 of the R x C bf16 matrix `src` interleaved: dst[p * padded<C> + j] holds
/// (src[2p][j], src[2p + 1][j]) as one 32-bit pair, the even row in the low half; a missing odd
/// row (R odd) and the columns past C are zero.
template <int R, int C>
TILEGRAD_INLINE void pack_row_pairs(std::uint32_t* dst, bf16 const* src) {
  constexpr int LD = padded<C>;
  // Output word t takes element t of the even row (lanes 0-15) and element t of the odd row
  // (lanes 16-31 of the combined register).
  __m512i const idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                       23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  auto row16 = [](bf16 const* row, int j) {
    if (j + lanes <= C)
      return _mm256_loadu_si256(reinterpret_cast<__m256i const*>(row + j));
    return _mm256_maskz_loadu_epi16(static_cast<__mmask16>((1u << (C - j)) - 1), row + j);
  };
  for (int p = 0; p < R / 2; ++p) {
    bf16 const* even = src + 2 * p * C;
    for (int j = 0; j < LD; j += lanes) {
      __m512i const both =
          _mm512_inserti64x4(_mm512_castsi256_si512(row16(even, j)), row16(even + C, j), 1);
      _mm512_store_si512(dst + p * LD + j, _mm512_permutexvar_epi16(idx, both));
    }
  }
  if constexpr (R % 2 != 0) {
    bf16 const* even = src + (R - 1) * C;
    for (int j = 0; j < LD; j += lanes)
      _mm512_store_si512(dst + R / 2 * LD + j,
                         _mm512_permutexvar_epi16(idx, _mm512_castsi256_si512(row16(even, j))));
  }
}

/// The pairs of A = (M x K) for the kernel: pair (i, p) = (A[i][2p], A[i][2p + 1]) at
/// base[i * SI + p * SP], 32 bits each.
template <int SI, int SP>
struct a_pairs {
  std::uint32_t const* base;
  TILEGRAD_INLINE std::uint32_t operator()(int i, int p) const {
    std::uint32_t v;
    std::memcpy(&v, base + i * SI + p * SP, sizeof v);
    return v;
  }
};

/// C[i0:i0+MR, j0:j0+NB*16] += A[i0:i0+MR, :] @ B[:, j0:j0+NB*16] over KP pairs of k; the last
/// of the NB vectors holds Tail valid columns (16: all).
template <int MR, int NB, int Tail, int N, int KP, bool Zero, class APairs>
TILEGRAD_INLINE void block(float* c, APairs const& a, std::uint32_t const* bp, int i0, int j0) {
  constexpr int LDB = padded<N>;
  constexpr __mmask16 tail_mask = static_cast<__mmask16>((1u << Tail) - 1);
  __m512 acc[MR][NB];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int q = 0; q < NB; ++q) {
      float const* p = c + (i0 + r) * N + j0 + q * lanes;
      acc[r][q] = Zero                             ? _mm512_setzero_ps()
                  : (q == NB - 1 && Tail != lanes) ? _mm512_maskz_loadu_ps(tail_mask, p)
                                                   : _mm512_loadu_ps(p);
    }
  for (int p = 0; p < KP; ++p) {
    __m512i bv[NB];
#pragma GCC unroll 8
    for (int q = 0; q < NB; ++q)
      bv[q] = _mm512_load_si512(bp + p * LDB + j0 + q * lanes);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      __m512bh const av = as_bh(_mm512_set1_epi32(static_cast<int>(a(i0 + r, p))));
#pragma GCC unroll 8
      for (int q = 0; q < NB; ++q)
        acc[r][q] = _mm512_dpbf16_ps(acc[r][q], av, as_bh(bv[q]));
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int q = 0; q < NB; ++q) {
      float* p = c + (i0 + r) * N + j0 + q * lanes;
      if (q == NB - 1 && Tail != lanes)
        _mm512_mask_storeu_ps(p, tail_mask, acc[r][q]);
      else
        _mm512_storeu_ps(p, acc[r][q]);
    }
}

// All row blocks of one column block of NB vectors starting at j0.
template <int NB, int Tail, int M, int N, int KP, bool Zero, class APairs>
TILEGRAD_INLINE void columns(float* c, APairs const& a, std::uint32_t const* bp, int j0) {
  constexpr int MR = 6; // 6 x 4 accumulators, 4 vectors of B and A's broadcast: 29 of 32
  constexpr int full = M / MR * MR;
  for (int i0 = 0; i0 < full; i0 += MR)
    block<MR, NB, Tail, N, KP, Zero>(c, a, bp, i0, j0);
  if constexpr (M % MR != 0)
    block<M % MR, NB, Tail, N, KP, Zero>(c, a, bp, full, j0);
}

/// C (M x N, row-major) += A @ B over KP pairs of k, B packed by pack_row_pairs.
template <int M, int N, int KP, bool Zero, class APairs>
TILEGRAD_INLINE void gemm_packed(float* c, APairs const& a, std::uint32_t const* bp) {
  constexpr int NB = 4;
  constexpr int NV = padded<N> / lanes;                    // vectors per row, the last partial
  constexpr int tail = N % lanes == 0 ? lanes : N % lanes; // valid lanes of the last vector
  constexpr int groups = NV / NB, rest = NV % NB;
  if constexpr (groups > 0) {
    constexpr int whole = (rest == 0 && tail != lanes) ? groups - 1 : groups;
    for (int g = 0; g < whole; ++g)
      columns<NB, lanes, M, N, KP, Zero>(c, a, bp, g * NB * lanes);
    if constexpr (whole < groups)
      columns<NB, tail, M, N, KP, Zero>(c, a, bp, whole * NB * lanes);
  }
  if constexpr (rest > 0)
    columns<rest, tail, M, N, KP, Zero>(c, a, bp, groups * NB * lanes);
}

} // namespace bf16dot

#if TILEGRAD_HAVE_AMX_BF16

namespace amx {

/// Asks Linux, once per process, for the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM for
/// XFEATURE_XTILEDATA); false where it is refused.
inline bool permitted() {
  static bool const ok = [] {
    constexpr long req_xcomp_perm = 0x1023, xtiledata = 18;
    return syscall(SYS_arch_prctl, req_xcomp_perm, xtiledata) == 0;
  }();
  return ok;
}

/// Palette 1, the eight tiles of 16 rows x 64 bytes the kernel uses.
struct alignas(64) tile_config {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  std::uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

/// Loads the configuration unless the thread's tiles have it already: other code of the process
/// (a library of its own AMX kernels) may configure them otherwise between two products. Reading
/// the configuration back costs less than loading it, which also zeroes every tile.
inline void configure() {
  static constexpr tile_config want{};
  tile_config now;
  _tile_storeconfig(&now);
  if (std::memcmp(&now, &want, sizeof want) != 0)
    _tile_loadconfig(&want);
}

/// C (M x N, row-major floats) += A @ B: A row-major with K even (lda bf16 between rows), B
/// packed in pairs of rows (pack_row_pairs: LD = N words). Blocks of 32 x 32 of C in four tiles
/// (0-3), two tiles of A (4, 5) and two of B (6, 7); 16 x 16 blocks where M or N is not a
/// multiple of 32.
template <int M, int N, int K, bool Zero>
void gemm(float* c, bf16 const* a, int lda, std::uint32_t const* bp) {
  static_assert(amx_shape<M, N, K>);
  configure();
  constexpr int ldc = N * 4, ldb = N * 4;
  int const ldab = lda * 2;
  if constexpr (M % 32 == 0 && N % 32 == 0) {
    for (int i0 = 0; i0 < M; i0 += 32)
      for (int j0 = 0; j0 < N; j0 += 32) {
        float* c0 = c + i0 * N + j0;
        float* c1 = c0 + 16 * N;
        if constexpr (Zero) {
          _tile_zero(0);
          _tile_zero(1);
          _tile_zero(2);
          _tile_zero(3);
        } else {
          _tile_loadd(0, c0, ldc);
          _tile_loadd(1, c0 + 16, ldc);
          _tile_loadd(2, c1, ldc);
          _tile_loadd(3, c1 + 16, ldc);
        }
        for (int k0 = 0; k0 < K; k0 += 32) {
          _tile_loadd(4, a + i0 * lda + k0, ldab);
          _tile_loadd(5, a + (i0 + 16) * lda + k0, ldab);
          _tile_loadd(6, bp + k0 / 2 * N + j0, ldb);
          _tile_loadd(7, bp + k0 / 2 * N + j0 + 16, ldb);
          _tile_dpbf16ps(0, 4, 6);
          _tile_dpbf16ps(1, 4, 7);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
        _tile_stored(0, c0, ldc);
        _tile_stored(1, c0 + 16, ldc);
        _tile_stored(2, c1, ldc);
        _tile_stored(3, c1 + 16, ldc);
      }
  } else {
    for (int i0 = 0; i0 < M; i0 += 16)
      for (int j0 = 0; j0 < N; j0 += 16) {
        float* c0 = c + i0 * N + j0;
        if constexpr (Zero)
          _tile_zero(0);
        else
          _tile_loadd(0, c0, ldc);
        for (int k0 = 0; k0 < K; k0 += 32) {
          _tile_loadd(4, a + i0 * lda + k0, ldab);
          _tile_loadd(6, bp + k0 / 2 * N + j0, ldb);
          _tile_dpbf16ps(0, 4, 6);
        }
        _tile_stored(0, c0, ldc);
      }
  }
}

/// A (M x K, row-major) from its transpose at (K x M, row-major): for each 16 x 16 block of
/// words (16 pairs of k by 16 rows of A), rows 2p and 2p + 1 of `at` interleaved into pairs (as
/// pack_row_pairs does) and the block transposed on registers, with no buffer in between.
template <int M, int K>
void transpose_in(bf16* dst, bf16 const* at) {
  static_assert(K % 32 == 0 && M % 16 == 0, "amx::transpose_in: whole 16 x 16 blocks of words");
  constexpr int KP = K / 2;
  __m512i const idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                       23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  auto* out = reinterpret_cast<float*>(dst);
  for (int p0 = 0; p0 < KP; p0 += 16)
    for (int i0 = 0; i0 < M; i0 += 16) {
      __m512 r[16];
      for (int p = 0; p < 16; ++p) {
        bf16 const* even = at + (2 * (p0 + p)) * M + i0;
        __m512i const both = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<__m256i const*>(even))),
            _mm256_loadu_si256(reinterpret_cast<__m256i const*>(even + M)), 1);
        r[p] = _mm512_castsi512_ps(_mm512_permutexvar_epi16(idx, both));
      }
      simd::transpose16_in_registers(r);
      for (int i = 0; i < 16; ++i)
        _mm512_storeu_ps(out + (i0 + i) * KP + p0, r[i]);
    }
}

} // namespace amx

#endif // TILEGRAD_HAVE_AMX_BF16

/// C (M x N) += A (M x K) @ B (K x N) (with Zero, =: C is not read) with vdpbf16ps or AMX, all
/// row-major and contiguous; with TransA,
/// `a` holds A's transpose (K x M).
template <int M, int N, int K, bool TransA = false, bool Zero = false>
void gemm_bf16(float* c, bf16 const* a, bf16 const* b) {
  using namespace bf16dot;
  constexpr int KP = pairs<K>;
  pair_buffer<KP * padded<N>> bp;
  pack_row_pairs<K, N>(bp.get(), b);
#if TILEGRAD_HAVE_AMX_BF16
  if constexpr (amx_shape<M, N, K>) {
    if (amx::permitted()) {
      if constexpr (TransA) {
        tile_storage<bf16, M * K> ta;
        amx::transpose_in<M, K>(ta.get(), a);
        amx::gemm<M, N, K, Zero>(c, ta.get(), K, bp.get());
      } else {
        amx::gemm<M, N, K, Zero>(c, a, K, bp.get());
      }
      return;
    }
  }
#endif
  if constexpr (TransA) {
    // A's pairs (i, p) lie in rows 2p and 2p + 1 of its transpose: packed as B is.
    pair_buffer<KP * padded<M>> ap;
    pack_row_pairs<K, M>(ap.get(), a);
    gemm_packed<M, N, KP, Zero>(c, a_pairs<1, padded<M>>{ap.get()}, bp.get());
  } else if constexpr (K % 2 == 0) {
    // Row-major with K even: every pair lies in place.
    gemm_packed<M, N, KP, Zero>(c, a_pairs<KP, 1>{reinterpret_cast<std::uint32_t const*>(a)},
                                bp.get());
  } else {
    // K odd: rows copied into whole pairs, the last one padded with a zero.
    pair_buffer<M * KP> ap;
    for (int i = 0; i < M; ++i) {
      ap.get()[i * KP + KP - 1] = 0;
      std::memcpy(ap.get() + i * KP, a + i * K, K * sizeof(bf16));
    }
    gemm_packed<M, N, KP, Zero>(c, a_pairs<KP, 1>{ap.get()}, bp.get());
  }
}

#endif // TILEGRAD_HAVE_BF16_DOT

/// Whether gemm_bf16 (where the build has it) takes an (M x K) @ (K x N) product in this process:
/// on AMX where the shape fits and the tiles are permitted, else with vdpbf16ps where the build
/// uses it for every shape.
template <int M, int N, int K>
bool bf16_kernel_runs() {
#if TILEGRAD_HAVE_AMX_BF16
  if constexpr (amx_shape<M, N, K>)
    if (amx::permitted())
      return true;
#endif
  return bf16_dot_native;
}

} // namespace tilegrad::detail
