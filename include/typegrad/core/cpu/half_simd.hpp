#ifndef TYPEGRAD_CORE_HALF_SIMD_HPP
#define TYPEGRAD_CORE_HALF_SIMD_HPP
// Bulk conversions between float/double arrays and bf16/f16 arrays.
// The instruction set is chosen at compile time from the including translation unit's target
// flags (no runtime dispatch). Every path produces exactly the bits of the scalar conversions in
// half.hpp; the tails (and CPUs without the extensions) use those scalar conversions.
#include <bit>
#include <cstddef>
#include <cstdint>

#include <typegrad/core/half.hpp>

#if defined(__AVX512F__) || defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

// The implementation differs with the target flags, so it lives in an inline namespace named
// after them: translation units built with different -m flags then define different functions
// instead of silently violating the one-definition rule.
#if defined(__AVX512BF16__) && defined(__AVX512F__)
#define TYPEGRAD_DETAIL_HALF_ISA half_isa_avx512bf16
#elif defined(__AVX512F__)
#define TYPEGRAD_DETAIL_HALF_ISA half_isa_avx512f
#elif defined(__AVX2__) && defined(__F16C__)
#define TYPEGRAD_DETAIL_HALF_ISA half_isa_avx2_f16c
#elif defined(__AVX2__)
#define TYPEGRAD_DETAIL_HALF_ISA half_isa_avx2
#elif defined(__F16C__)
#define TYPEGRAD_DETAIL_HALF_ISA half_isa_f16c
#else
#define TYPEGRAD_DETAIL_HALF_ISA half_isa_scalar
#endif

// GCC 12 flags the deliberately undefined vectors inside its own AVX-512 intrinsics as maybe
// uninitialised once they are inlined here (GCC PR105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace typegrad::detail {
inline namespace TYPEGRAD_DETAIL_HALF_ISA {

// Vector loops run to n rounded down to their block size (i stays a multiple of it). Bounding
// them by "i + Block <= n" instead leaves GCC unable to bound the scalar tail loop, and with a
// constant n it then warns (-Waggressive-loop-optimizations, on by default).
template <std::size_t Block>
constexpr std::size_t round_down(std::size_t n) noexcept {
    return n - n % Block;
}

#if defined(__AVX512F__)

// float -> bf16 bits for 16 lanes: the scalar rounding trick, lane-wise.
inline __m256i bf16_from_ps_avx512(__m512 v) noexcept {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i bias = _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x0040));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(
        _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, quiet));
}

// float -> f16 bits for 16 lanes; the immediate selects nearest-even regardless of MXCSR.RC.
// (The masked form only because GCC's unoptimised macro for the plain one trips -Wsign-conversion.)
inline __m256i f16_from_ps_avx512(__m512 v) noexcept {
    return _mm512_mask_cvtps_ph(_mm256_setzero_si256(), 0xffff, v, _MM_FROUND_TO_NEAREST_INT);
}

// 16 doubles -> 16 floats rounded to odd (truncate, then set the lsb if anything was lost).
// Float keeps >= 2 more bits than bf16/f16 at every magnitude those can represent, so rounding
// this to nearest-even afterwards equals rounding the double directly (no double rounding).
// Truncation clamps overflow to FLT_MAX (odd), which still rounds to infinity.
inline __m512 round_to_odd_ps_avx512(__m512d lo, __m512d hi) noexcept {
    constexpr int truncate = _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC;
    const __m256 t_lo = _mm512_cvt_roundpd_ps(lo, truncate);
    const __m256 t_hi = _mm512_cvt_roundpd_ps(hi, truncate);
    const __mmask8 inexact_lo = _mm512_cmp_pd_mask(_mm512_cvtps_pd(t_lo), lo, _CMP_NEQ_UQ);
    const __mmask8 inexact_hi = _mm512_cmp_pd_mask(_mm512_cvtps_pd(t_hi), hi, _CMP_NEQ_UQ);
    const __mmask16 inexact = static_cast<__mmask16>(static_cast<unsigned>(inexact_lo) |
                                                     (static_cast<unsigned>(inexact_hi) << 8));
    const __m512i both = _mm512_castpd_si512(_mm512_insertf64x4(
        _mm512_castpd256_pd512(_mm256_castps_pd(t_lo)), _mm256_castps_pd(t_hi), 1));
    return _mm512_castsi512_ps(_mm512_mask_or_epi32(both, inexact, both, _mm512_set1_epi32(1)));
}

// True if a lane holds 0 < |x| < 2^-126. Rounding those to odd needs float subnormals, which
// MXCSR.FTZ would flush; bf16 (unlike f16) has values there, so such blocks (rare) go scalar.
inline bool below_float_normal_avx512(__m512d v) noexcept {
    const __m512i abs_bits =
        _mm512_and_si512(_mm512_castpd_si512(v), _mm512_set1_epi64(0x7fffffffffffffff));
    const __m512i one = _mm512_set1_epi64(1);
    const __m512i float_min_minus_one = _mm512_set1_epi64(0x380fffffffffffff);  // bits(2^-126) - 1
    return _mm512_cmplt_epu64_mask(_mm512_sub_epi64(abs_bits, one), float_min_minus_one) != 0;
}

#endif  // __AVX512F__

#if defined(__AVX2__) && !defined(__AVX512F__)

// float -> bf16 bits for 8 lanes, one per 32-bit lane (packed by the caller).
inline __m256i bf16_from_ps_avx2(__m256 v) noexcept {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i bias = _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x0040));
    // |u| fits in a positive int32, so the signed compare is an unsigned one here.
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    return _mm256_blendv_epi8(rounded, quiet, nan);
}

// Packs two vectors of 32-bit bf16 values (each <= 0xffff) into 16 consecutive 16-bit values.
inline __m256i pack_bf16_avx2(__m256i lo, __m256i hi) noexcept {
    // packus interleaves 128-bit lanes (lo0 hi0 lo1 hi1); the permute restores the order.
    return _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8);
}

// 4 doubles -> 4 floats rounded to odd. AVX2 has no truncating conversion, so convert with the
// current rounding mode, step one ulp back towards zero where that rounded away from zero
// (bits - 1 does it for either sign; inf from overflow becomes FLT_MAX), and set the lsb where
// the conversion was inexact.
inline __m128i round_to_odd_bits_avx2(__m256d x) noexcept {
    const __m128 f = _mm256_cvtpd_ps(x);
    const __m256d back = _mm256_cvtps_pd(f);
    const __m256d abs_mask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffff));
    const __m256d away =
        _mm256_cmp_pd(_mm256_and_pd(back, abs_mask), _mm256_and_pd(x, abs_mask), _CMP_GT_OQ);
    const __m256d inexact = _mm256_cmp_pd(back, x, _CMP_NEQ_UQ);
    // The 64-bit lane masks narrowed to 32 bits: their low halves, gathered.
    const __m256i low_halves = _mm256_setr_epi32(0, 2, 4, 6, 0, 0, 0, 0);
    const __m128i away32 =
        _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(_mm256_castpd_si256(away), low_halves));
    const __m128i inexact32 = _mm256_castsi256_si128(
        _mm256_permutevar8x32_epi32(_mm256_castpd_si256(inexact), low_halves));
    const __m128i stepped = _mm_add_epi32(_mm_castps_si128(f), away32);  // away32 is 0 or -1
    return _mm_or_si128(stepped, _mm_and_si128(inexact32, _mm_set1_epi32(1)));
}

inline __m256 round_to_odd_ps_avx2(const double* src) noexcept {
    const __m128i lo = round_to_odd_bits_avx2(_mm256_loadu_pd(src));
    const __m128i hi = round_to_odd_bits_avx2(_mm256_loadu_pd(src + 4));
    return _mm256_castsi256_ps(_mm256_set_m128i(hi, lo));
}

// True if a lane holds 0 < |x| < 2^-126 (see below_float_normal_avx512).
inline bool below_float_normal_avx2(__m256d v) noexcept {
    const __m256d abs_mask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffff));
    const __m256d a = _mm256_and_pd(v, abs_mask);
    const __m256d tiny = _mm256_and_pd(_mm256_cmp_pd(a, _mm256_set1_pd(0x1p-126), _CMP_LT_OQ),
                                       _mm256_cmp_pd(a, _mm256_setzero_pd(), _CMP_NEQ_OQ));
    return _mm256_movemask_pd(tiny) != 0;
}

#endif  // __AVX2__ && !__AVX512F__

// ---- float -> bf16 ----
inline void convert_n(const float* src, bf16* dst, std::size_t n) noexcept {
    std::size_t i = 0;
#if defined(__AVX512BF16__) && defined(__AVX512F__)
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
    const __m512i one = _mm512_set1_epi32(1);
    const __m512i max_subnormal = _mm512_set1_epi32(0x007fffff);
    for (; i < round_down<32>(n); i += 32) {
        const __m512 lo = _mm512_loadu_ps(src + i);
        const __m512 hi = _mm512_loadu_ps(src + i + 16);
        // vcvtne2ps2bf16 treats subnormal inputs as zero; blocks holding one (rare) take the
        // integer path, which rounds them like the scalar code. (|x| - 1 < 0x7fffff: subnormal.)
        const __mmask16 sub_lo = _mm512_cmplt_epu32_mask(
            _mm512_sub_epi32(_mm512_and_si512(_mm512_castps_si512(lo), abs_mask), one),
            max_subnormal);
        const __mmask16 sub_hi = _mm512_cmplt_epu32_mask(
            _mm512_sub_epi32(_mm512_and_si512(_mm512_castps_si512(hi), abs_mask), one),
            max_subnormal);
        if ((sub_lo | sub_hi) == 0) {
            const __m512bh packed = _mm512_cvtne2ps_pbh(hi, lo);  // lo fills the low half
            _mm512_storeu_si512(dst + i, std::bit_cast<__m512i>(packed));
        } else {
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), bf16_from_ps_avx512(lo));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i + 16), bf16_from_ps_avx512(hi));
        }
    }
#endif
#if defined(__AVX512F__)
    for (; i < round_down<16>(n); i += 16) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                            bf16_from_ps_avx512(_mm512_loadu_ps(src + i)));
    }
#elif defined(__AVX2__)
    for (; i < round_down<16>(n); i += 16) {
        const __m256i lo = bf16_from_ps_avx2(_mm256_loadu_ps(src + i));
        const __m256i hi = bf16_from_ps_avx2(_mm256_loadu_ps(src + i + 8));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), pack_bf16_avx2(lo, hi));
    }
#endif
    for (; i < n; ++i) dst[i] = bf16(src[i]);
}

// ---- bf16 -> float (exact: the bits move up by 16) ----
inline void convert_n(const bf16* src, float* dst, std::size_t n) noexcept {
    std::size_t i = 0;
#if defined(__AVX512F__)
    for (; i < round_down<16>(n); i += 16) {
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
        const __m512i u = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
        _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(u));
    }
#elif defined(__AVX2__)
    for (; i < round_down<8>(n); i += 8) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
        const __m256i u = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(u));
    }
#endif
    for (; i < n; ++i) dst[i] = float(src[i]);
}

// ---- float -> f16 ----
inline void convert_n(const float* src, f16* dst, std::size_t n) noexcept {
    std::size_t i = 0;
#if defined(__AVX512F__)
    for (; i < round_down<16>(n); i += 16) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                            f16_from_ps_avx512(_mm512_loadu_ps(src + i)));
    }
#elif defined(__F16C__)
    for (; i < round_down<8>(n); i += 8) {
        // The immediate selects nearest-even regardless of MXCSR.RC.
        const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
    }
#endif
    for (; i < n; ++i) dst[i] = f16(src[i]);
}

// ---- f16 -> float (exact; NaNs come back quiet, in both paths) ----
inline void convert_n(const f16* src, float* dst, std::size_t n) noexcept {
    std::size_t i = 0;
#if defined(__AVX512F__)
    for (; i < round_down<16>(n); i += 16) {
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(h));
    }
#elif defined(__F16C__)
    for (; i < round_down<8>(n); i += 8) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
#endif
    for (; i < n; ++i) dst[i] = float(src[i]);
}

// ---- double -> bf16 (rounded once, via round-to-odd float) ----
inline void convert_n(const double* src, bf16* dst, std::size_t n) noexcept {
    std::size_t i = 0;
#if defined(__AVX512F__)
    for (; i < round_down<16>(n); i += 16) {
        const __m512d lo = _mm512_loadu_pd(src + i);
        const __m512d hi = _mm512_loadu_pd(src + i + 8);
        if (below_float_normal_avx512(lo) || below_float_normal_avx512(hi)) {
            for (std::size_t j = i; j < i + 16; ++j) dst[j] = bf16(src[j]);
            continue;
        }
        const __m512 f = round_to_odd_ps_avx512(lo, hi);  // no subnormals: vcvtneps2bf16 is exact
#if defined(__AVX512BF16__)
        const __m256i h = std::bit_cast<__m256i>(_mm512_cvtneps_pbh(f));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), h);
#else
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), bf16_from_ps_avx512(f));
#endif
    }
#elif defined(__AVX2__)
    for (; i < round_down<16>(n); i += 16) {
        if (below_float_normal_avx2(_mm256_loadu_pd(src + i)) ||
            below_float_normal_avx2(_mm256_loadu_pd(src + i + 4)) ||
            below_float_normal_avx2(_mm256_loadu_pd(src + i + 8)) ||
            below_float_normal_avx2(_mm256_loadu_pd(src + i + 12))) {
            for (std::size_t j = i; j < i + 16; ++j) dst[j] = bf16(src[j]);
            continue;
        }
        const __m256i lo = bf16_from_ps_avx2(round_to_odd_ps_avx2(src + i));
        const __m256i hi = bf16_from_ps_avx2(round_to_odd_ps_avx2(src + i + 8));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), pack_bf16_avx2(lo, hi));
    }
#endif
    for (; i < n; ++i) dst[i] = bf16(src[i]);
}

// ---- double -> f16 (rounded once, via round-to-odd float) ----
inline void convert_n(const double* src, f16* dst, std::size_t n) noexcept {
    std::size_t i = 0;
#if defined(__AVX512F__)
    // Unlike bf16, f16 rounds every float subnormal to zero, so FTZ/DAZ cannot matter here.
    for (; i < round_down<16>(n); i += 16) {
        const __m512 f =
            round_to_odd_ps_avx512(_mm512_loadu_pd(src + i), _mm512_loadu_pd(src + i + 8));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), f16_from_ps_avx512(f));
    }
#elif defined(__AVX2__) && defined(__F16C__)
    for (; i < round_down<8>(n); i += 8) {
        const __m128i h = _mm256_cvtps_ph(round_to_odd_ps_avx2(src + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
    }
#endif
    for (; i < n; ++i) dst[i] = f16(src[i]);
}

// ---- bf16/f16 -> double (exact, via float) ----
inline void convert_n(const bf16* src, double* dst, std::size_t n) noexcept {
    for (std::size_t i = 0; i < n; ++i) dst[i] = static_cast<double>(float(src[i]));
}

inline void convert_n(const f16* src, double* dst, std::size_t n) noexcept {
    for (std::size_t i = 0; i < n; ++i) dst[i] = static_cast<double>(float(src[i]));
}

}  // namespace TYPEGRAD_DETAIL_HALF_ISA
}  // namespace typegrad::detail

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#undef TYPEGRAD_DETAIL_HALF_ISA

#endif  // TYPEGRAD_CORE_HALF_SIMD_HPP
