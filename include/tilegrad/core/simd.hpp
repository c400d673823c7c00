// The one place that includes xsimd. Maps (element type, lane count) to a vector type, with
// width 1 (the plain scalar) for any type that has no SIMD register: a custom scalar such as a
// dual or adjoint number flows through the very same loops at width 1.
#pragma once

#include "tilegrad/core/bf16.hpp"
#include "tilegrad/core/config.hpp"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>

// GCC 12's AVX-512 intrinsics warn of -Wuninitialized in their own _mm512_undefined_*() wherever
// xsimd's AVX-512 code is inlined (GCC bug 105593, fixed in GCC 13). The warning is placed in
// the intrinsics header: silenced for the text of these headers alone (when this is where
// immintrin.h is first read), the warning stays on for every line of ours.
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#if defined(__SSE2__)
#include <immintrin.h>
#endif
#if TILEGRAD_USE_XSIMD
#include <xsimd/xsimd.hpp>
#endif
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

namespace tilegrad::simd {

#if TILEGRAD_USE_XSIMD
template <class T>
inline constexpr bool is_vectorizable_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int32_t> ||
    std::is_same_v<T, std::int64_t> || std::is_same_v<T, std::uint32_t> ||
    std::is_same_v<T, std::uint64_t>;

template <class T>
inline constexpr int native_width_impl() {
  if constexpr (is_vectorizable_v<T>)
    return static_cast<int>(xsimd::batch<T>::size);
  else
    return 1;
}
#else
template <class T>
inline constexpr bool is_vectorizable_v = false;
template <class T>
inline constexpr int native_width_impl() {
  return 1;
}
#endif

/// Lanes of T in the widest register the build targets; 1 for a type without one.
/// This is the trait a custom scalar type falls back through.
template <class T>
inline constexpr int native_width = native_width_impl<T>();

namespace detail {
template <class T, int W, class = void>
struct vec_of {
  using type = void; // no vector of this width
};
template <class T>
struct vec_of<T, 1> {
  using type = T;
};
#if TILEGRAD_USE_XSIMD
template <class T, int W>
  requires(W > 1 && is_vectorizable_v<T>)
struct vec_of<T, W> {
  using type = xsimd::make_sized_batch_t<T, static_cast<std::size_t>(W)>;
};
// A bool lane set of width W is the comparison mask of the float (or else double) vector of W
// lanes; masks of other element types are converted to it where they meet.
template <int W>
  requires(W > 1)
struct vec_of<bool, W> {
  using fbatch = xsimd::make_sized_batch_t<float, static_cast<std::size_t>(W)>;
  using dbatch = xsimd::make_sized_batch_t<double, static_cast<std::size_t>(W)>;
  using type = typename std::conditional_t<!std::is_void_v<fbatch>, fbatch, dbatch>::batch_bool_type;
};
#endif
} // namespace detail

/// The vector of W lanes of T: T itself at W = 1, an xsimd batch or batch_bool otherwise, void
/// when this build has no such register.
template <class T, int W>
using vec_t = typename detail::vec_of<T, W>::type;

template <class T, int W>
inline constexpr bool has_vec_v = !std::is_void_v<vec_t<T, W>>;

template <class V>
inline constexpr bool is_batch_v = false;
template <class V>
inline constexpr bool is_mask_v = false;
#if TILEGRAD_USE_XSIMD
template <class T, class A>
inline constexpr bool is_batch_v<xsimd::batch<T, A>> = true;
template <class T, class A>
inline constexpr bool is_mask_v<xsimd::batch_bool<T, A>> = true;
#endif

#if TILEGRAD_USE_XSIMD
/// a * b + c rounded once, on every lane. (xsimd 8 computes fma of AVX-512 batches as a * b + c,
/// two roundings unless the compiler contracts them, which GCC does at -O2 and not at -O1: a
/// tile's vector lanes then rounded twice and its scalar tail once.)
template <class T, class A>
TILEGRAD_INLINE xsimd::batch<T, A> fused_multiply_add(xsimd::batch<T, A> const& a,
                                                      xsimd::batch<T, A> const& b,
                                                      xsimd::batch<T, A> const& c) {
#if defined(__AVX512F__)
  if constexpr (sizeof(xsimd::batch<T, A>) == 64 && std::is_same_v<T, float>)
    return xsimd::batch<T, A>(_mm512_fmadd_ps(a, b, c));
  else if constexpr (sizeof(xsimd::batch<T, A>) == 64 && std::is_same_v<T, double>)
    return xsimd::batch<T, A>(_mm512_fmadd_pd(a, b, c));
  else
#endif
    return xsimd::fma(a, b, c);
}
#endif

template <class T, int W>
TILEGRAD_INLINE vec_t<T, W> load(T const* p) {
  if constexpr (W == 1)
    return *p;
  else
    return vec_t<T, W>::load_unaligned(p);
}

template <class T, int W>
TILEGRAD_INLINE void store(T* p, vec_t<T, W> const& v) {
  if constexpr (W == 1)
    *p = v;
  else
    v.store_unaligned(p);
}

template <class T, int W>
TILEGRAD_INLINE vec_t<T, W> splat(T const& x) {
  if constexpr (W == 1)
    return x;
  else
    return vec_t<T, W>(x);
}

namespace detail {
template <class T, int W>
struct mask_of {
  using type = typename vec_t<T, W>::batch_bool_type;
};
template <int W>
struct mask_of<bool, W> {
  using type = vec_t<bool, W>;
};
} // namespace detail

/// Converts a comparison mask (of any element type) to the mask that selects between vectors
/// of T with W lanes; T = bool gives the canonical mask type of W lanes.
template <class T, int W, class M>
TILEGRAD_INLINE auto mask_for(M const& m) {
  if constexpr (W == 1) {
    return static_cast<bool>(m);
  } else {
    using target_t = typename detail::mask_of<T, W>::type;
    if constexpr (std::is_same_v<M, target_t>) {
      return m;
    } else if constexpr (sizeof(typename M::register_type) <= 8 &&
                         sizeof(typename target_t::register_type) <= 8) {
      // AVX-512 mask registers: one bit per lane whatever the element type.
      return target_t(static_cast<typename target_t::register_type>(m.data));
    } else if constexpr (sizeof(typename M::register_type) ==
                         sizeof(typename target_t::register_type)) {
      // SSE/AVX: a mask is a full register of all-ones / all-zeros lanes; reinterpret it.
      typename target_t::register_type r;
      __builtin_memcpy(&r, &m.data, sizeof r);
      return target_t(r);
    } else {
      // Different lane sizes (an int64 mask selecting float lanes): go through memory.
      alignas(64) bool tmp[W];
      m.store_unaligned(tmp);
      return target_t::load_unaligned(tmp);
    }
  }
}

/// Element-type conversion of a vector (or scalar at width 1).
template <class To, int W, class From, class V>
TILEGRAD_INLINE vec_t<To, W> convert(V const& v) {
  if constexpr (W == 1) {
    return static_cast<To>(v);
  } else if constexpr (std::is_same_v<To, From>) {
    return v;
  } else {
#if TILEGRAD_USE_XSIMD
    if constexpr (sizeof(To) == sizeof(From)) {
      return xsimd::batch_cast<To>(v);
    } else {
      alignas(64) From in[W];
      alignas(64) To out[W];
      v.store_unaligned(in);
      for (int i = 0; i < W; ++i) out[i] = static_cast<To>(in[i]);
      return vec_t<To, W>::load_unaligned(out);
    }
#endif
  }
}

/// Whether store_stream<T, W> writes with a non-temporal store on this build (else a plain store).
template <class T, int W>
inline constexpr bool has_stream_store =
#if TILEGRAD_USE_XSIMD && defined(__AVX512F__)
    (std::is_same_v<T, float> || std::is_same_v<T, double>) && W * sizeof(T) == 64;
#else
    false;
#endif

/// Stores v at p, 64-byte aligned, with a non-temporal store where has_stream_store<T, W>: the
/// line skips the read for ownership and the caches. Other threads may read it only after this
/// thread's stream_fence().
template <class T, int W>
TILEGRAD_INLINE void store_stream(T* p, vec_t<T, W> const& v) {
#if TILEGRAD_USE_XSIMD && defined(__AVX512F__)
  if constexpr (has_stream_store<T, W>) {
    if constexpr (std::is_same_v<T, float>)
      _mm512_stream_ps(p, static_cast<__m512>(v));
    else
      _mm512_stream_pd(p, static_cast<__m512d>(v));
    return;
  }
#endif
  store<T, W>(p, v);
}

/// Whether store_bf16<W> has a vector path on this build (else a conversion to bf16 goes lane by
/// lane, through bf16(float)).
template <int W>
inline constexpr bool has_bf16_store =
#if TILEGRAD_USE_XSIMD && defined(__AVX512F__)
    W == 16;
#else
    false;
#endif

/// The 16 floats of v rounded to bf16 and stored at p: bf16(float) on 16 lanes at once (nearest
/// even; a NaN stays a quiet NaN; denormals round like any other number). Only where
/// has_bf16_store<W>.
template <int W>
TILEGRAD_INLINE void store_bf16(bf16* p, vec_t<float, W> const& v) {
  static_assert(has_bf16_store<W>, "tilegrad: store_bf16 has no vector path on this build");
#if TILEGRAD_USE_XSIMD && defined(__AVX512F__)
  __m512i const u = _mm512_castps_si512(static_cast<__m512>(v));
#if defined(__AVX512BF16__)
  // The CPU's conversion (vcvtneps2bf16) rounds to nearest even and quiets a NaN as bf16(float)
  // does, in one instruction, but reads a subnormal input as zero: a vector holding one (|bits|
  // in [1, 0x7fffff]) takes the integer path below.
#if defined(__AVX512DQ__)
  __mmask16 const subnormal = _mm512_fpclass_ps_mask(static_cast<__m512>(v), 0x20);
#else
  __m512i const mag_less_one =
      _mm512_sub_epi32(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(1));
  __mmask16 const subnormal = _mm512_cmplt_epu32_mask(mag_less_one, _mm512_set1_epi32(0x007fffff));
#endif
  if (subnormal == 0) [[likely]] {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(static_cast<__m512>(v))));
    return;
  }
#endif
  __m512i const high = _mm512_srli_epi32(u, 16);
  __m512i const bias =
      _mm512_add_epi32(_mm512_and_si512(high, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7fff));
  __m512i const rounded = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  __mmask16 const nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  __m512i const r =
      _mm512_mask_blend_epi32(nan, rounded, _mm512_or_si512(high, _mm512_set1_epi32(0x40)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
#else
  (void)p;
  (void)v;
#endif
}

#if TILEGRAD_USE_XSIMD && defined(__AVX512F__)
/// e^x on 16 floats: x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts), e^r by Cephes'
/// polynomial, then times 2^n by vscalefps, which also gives inf past the float range, the
/// subnormal results and 0 below it. Inputs clamped to [-104, 89] first (a NaN stays NaN: maxps
/// and minps return their second operand when one is NaN). Measured over every 13th float:
/// at most 1.26 ulp from the correctly rounded e^x, 0.77 of the smallest subnormal below the
/// normal range, inf, 0 and NaN where e^x has them. (xsimd 8's exp took 3.3 times as long in
/// cache on a Zen 4, returned inf for x in (88.38, 88.72] where e^x is finite, and lost the
/// subnormal results.)
TILEGRAD_INLINE __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));
  __m512 const n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}
#endif

/// Copies `bytes` (a multiple of 64) from src to the 64-byte aligned dst with non-temporal
/// stores where the target has them: a line written once and not read again soon skips the read
/// for ownership and leaves the cache to data in use. Elsewhere a plain copy. Other threads may
/// read dst only after this thread's stream_fence().
inline void stream_copy(void* dst, void const* src, std::size_t bytes) {
#if defined(__AVX512F__)
  for (std::size_t i = 0; i < bytes; i += 64)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(static_cast<char*>(dst) + i),
                        _mm512_loadu_si512(static_cast<char const*>(src) + i));
#elif defined(__AVX__)
  for (std::size_t i = 0; i < bytes; i += 32)
    _mm256_stream_si256(
        reinterpret_cast<__m256i*>(static_cast<char*>(dst) + i),
        _mm256_loadu_si256(reinterpret_cast<__m256i const*>(static_cast<char const*>(src) + i)));
#elif defined(__SSE2__)
  for (std::size_t i = 0; i < bytes; i += 16)
    _mm_stream_si128(
        reinterpret_cast<__m128i*>(static_cast<char*>(dst) + i),
        _mm_loadu_si128(reinterpret_cast<__m128i const*>(static_cast<char const*>(src) + i)));
#else
  std::memcpy(dst, src, bytes);
#endif
}

/// Whether transpose16 runs on vector registers for T on this target (else it is a plain loop).
template <class T>
inline constexpr bool has_transpose16_v =
#if defined(__AVX512F__)
    std::is_same_v<T, float> || std::is_same_v<T, bf16>;
#else
    false;
#endif

#if defined(__AVX512F__)
/// r[i] becomes row i of the transpose of the 16 x 16 matrix whose rows are r[0..15]: three
/// rounds of shuffles on 16 registers instead of 256 scalar moves.
TILEGRAD_INLINE void transpose16_in_registers(__m512 (&r)[16]) {
  __m512 a[16], b[16];
  // a[2i], a[2i+1]: rows 2i and 2i+1 interleaved, by 128-bit lane (columns 4L..4L+3).
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // b[4j+c], lane L: column 4L+c of rows 4j..4j+3.
  for (int j = 0; j < 4; ++j) {
    __m512d const a0 = _mm512_castps_pd(a[4 * j]), a1 = _mm512_castps_pd(a[4 * j + 1]);
    __m512d const a2 = _mm512_castps_pd(a[4 * j + 2]), a3 = _mm512_castps_pd(a[4 * j + 3]);
    b[4 * j] = _mm512_castpd_ps(_mm512_unpacklo_pd(a0, a2));
    b[4 * j + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a0, a2));
    b[4 * j + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(a1, a3));
    b[4 * j + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(a1, a3));
  }
  // Row 4L+c of the transpose: lane L of b[c], b[4+c], b[8+c], b[12+c].
  for (int c = 0; c < 4; ++c) {
    __m512 const u0 = _mm512_shuffle_f32x4(b[c], b[4 + c], 0x44);
    __m512 const u1 = _mm512_shuffle_f32x4(b[c], b[4 + c], 0xEE);
    __m512 const v0 = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0x44);
    __m512 const v1 = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0xEE);
    r[0 + c] = _mm512_shuffle_f32x4(u0, v0, 0x88);
    r[4 + c] = _mm512_shuffle_f32x4(u0, v0, 0xDD);
    r[8 + c] = _mm512_shuffle_f32x4(u1, v1, 0x88);
    r[12 + c] = _mm512_shuffle_f32x4(u1, v1, 0xDD);
  }
}
#endif

/// dst (16 x 16, row stride ld_dst) = src (16 x 16, row stride ld_src) transposed, on vector
/// registers where has_transpose16_v<T> (bf16 widened to 32 bits and narrowed back).
template <class T>
inline void transpose16(T* dst, std::int64_t ld_dst, T const* src, std::int64_t ld_src) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    __m512 r[16];
    for (int i = 0; i < 16; ++i)
      r[i] = _mm512_loadu_ps(src + i * ld_src);
    transpose16_in_registers(r);
    for (int i = 0; i < 16; ++i)
      _mm512_storeu_ps(dst + i * ld_dst, r[i]);
    return;
  } else if constexpr (std::is_same_v<T, bf16>) {
    static_assert(sizeof(bf16) == 2);
    __m512 r[16];
    for (int i = 0; i < 16; ++i)
      r[i] = _mm512_castsi512_ps(_mm512_cvtepu16_epi32(
          _mm256_loadu_si256(reinterpret_cast<__m256i const*>(src + i * ld_src))));
    transpose16_in_registers(r);
    for (int i = 0; i < 16; ++i)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i * ld_dst),
                          _mm512_cvtepi32_epi16(_mm512_castps_si512(r[i])));
    return;
  }
#endif
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j)
      dst[j * ld_dst + i] = src[i * ld_src + j];
}

/// Keeps the vectors in registers at this point of the program: the compiler may not move work
/// on them across it. A loop that advances several accumulators along a row calls it once per
/// step, so that the loads stay in the row's order: GCC otherwise runs each accumulator's chain
/// through the whole row before the next one's, and reads memory in an order the prefetchers
/// do not follow. A no-op for scalars and off x86.
template <class... V>
TILEGRAD_INLINE void keep_order(V&... v) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  auto one = [](auto& x) {
    if constexpr (requires { x.data; })
      asm volatile("" : "+v"(x.data));
  };
  (one(v), ...);
#else
  ((void)v, ...);
#endif
}

/// Orders this thread's stream_copy stores before its later stores (a lock release, say).
inline void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#else
  std::atomic_thread_fence(std::memory_order_release);
#endif
}

/// Set while this thread has non-temporal stores (store_stream) not yet fenced.
inline bool& stream_pending() {
  thread_local bool pending = false;
  return pending;
}

/// Fences this thread's non-temporal stores if it made any since the last fence.
TILEGRAD_INLINE void finish_streaming() {
  if (bool& p = stream_pending(); p) [[unlikely]] {
    stream_fence();
    p = false;
  }
}

} // namespace tilegrad::simd
