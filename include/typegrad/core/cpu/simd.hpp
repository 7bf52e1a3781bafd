#pragma once
// The only header that includes xsimd. Every math function the kernels use is overloaded here
// for scalars and for xsimd batches, so an op's kernel is one generic lambda-free
// template. An xsimd upgrade (8.1 hadd -> 9+ reduce_add) touches this file alone.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

// GCC 12 flags the deliberately undefined vectors inside its own AVX-512 intrinsics
// (_mm512_undefined_pd) as uninitialised once xsimd's exp/hadd inline into a kernel (GCC
// PR105593). The warnings would land in users' builds, where -Werror breaks: GCC honours a
// diagnostic pragma at any point of the inlining chain, and every xsimd call goes through this
// header, so silencing them over xsimd and this header keeps them out of every build.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <xsimd/xsimd.hpp>

#include <typegrad/core/cpu/half_simd.hpp>

namespace typegrad::simd {

template <class T>
using batch = xsimd::batch<T>;
template <class T>
inline constexpr std::size_t width = batch<T>::size;

template <class T>
inline constexpr bool is_batch_v = false;
template <class T, class A>
inline constexpr bool is_batch_v<xsimd::batch<T, A>> = true;

// ---- memory -----------------------------------------------------------------------------
template <class T>
inline batch<T> load(const T* p) { return batch<T>::load_unaligned(p); }
template <class T>
inline void store(T* p, const batch<T>& v) { v.store_unaligned(p); }
template <class T>
inline T load_scalar(const T* p) { return *p; }
// The gather's offsets: int32 lanes for float, int64 for double (one register each).
template <class T>
using gather_index_t = std::conditional_t<sizeof(T) == 4, std::int32_t, std::int64_t>;
template <class T>
inline auto gather_index(const gather_index_t<T>* offsets) {
    return xsimd::batch<gather_index_t<T>>::load_aligned(offsets);
}
// p[offset] for each lane (float or double)
template <class T, class I>
inline batch<T> gather(const T* p, const I& index) {
    return batch<T>::gather(p, index);
}

// ---- storage conversions: bf16/f16 buffers read and written by float loops ----------------
// S is the buffer's element type, T the loop's. Narrowing rounds to nearest even (half_simd.hpp).
template <class T, class S>
inline batch<T> load_as(const S* p) {
    if constexpr (std::is_same_v<S, T>) {
        return load(p);
    } else {
        alignas(64) T lanes[width<T>];
        detail::convert_n(p, lanes, width<T>);
        return batch<T>::load_aligned(lanes);
    }
}
template <class S, class T, class A>
inline void store_as(S* p, const xsimd::batch<T, A>& v) {
    if constexpr (std::is_same_v<S, T>) {
        store(p, v);
    } else {
        alignas(64) T lanes[xsimd::batch<T, A>::size];
        v.store_aligned(lanes);
        detail::convert_n(lanes, p, xsimd::batch<T, A>::size);
    }
}
// The first m lanes of a batch (0 < m < width): a load whose lanes past m repeat p[m - 1] (they
// then compute what a real lane does), and a store of lanes [0, m). A loop's tail is one such
// batch. AVX-512 and AVX2 use masked loads and stores (no access past p + m, no store-forwarding
// stall); other targets go through a buffer.
template <class T>
inline batch<T> load_first_buffered(const T* p, std::size_t m) {
    alignas(64) T lanes[width<T>];
    for (std::size_t l = 0; l < width<T>; ++l) lanes[l] = p[l < m ? l : m - 1];
    return batch<T>::load_aligned(lanes);
}
template <class T>
inline void store_first_buffered(T* p, const batch<T>& v, std::size_t m) {
    alignas(64) T lanes[width<T>];
    v.store_aligned(lanes);
    for (std::size_t l = 0; l < m; ++l) p[l] = lanes[l];
}
template <class T>
inline batch<T> load_first(const T* p, std::size_t m) {
    [[maybe_unused]] const T last = p[m - 1];
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<T, float> && width<T> == 16) {
        const __mmask16 k = static_cast<__mmask16>((1u << m) - 1u);
        return _mm512_mask_loadu_ps(_mm512_set1_ps(last), k, p);
    } else if constexpr (std::is_same_v<T, double> && width<T> == 8) {
        const __mmask8 k = static_cast<__mmask8>((1u << m) - 1u);
        return _mm512_mask_loadu_pd(_mm512_set1_pd(last), k, p);
    }
#elif defined(__AVX2__)
    if constexpr (std::is_same_v<T, float> && width<T> == 8) {
        const __m256i k = _mm256_cmpgt_epi32(_mm256_set1_epi32(int(m)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        return _mm256_blendv_ps(_mm256_set1_ps(last), _mm256_maskload_ps(p, k), _mm256_castsi256_ps(k));
    } else if constexpr (std::is_same_v<T, double> && width<T> == 4) {
        const __m256i k = _mm256_cmpgt_epi64(_mm256_set1_epi64x(std::int64_t(m)), _mm256_setr_epi64x(0, 1, 2, 3));
        return _mm256_blendv_pd(_mm256_set1_pd(last), _mm256_maskload_pd(p, k), _mm256_castsi256_pd(k));
    }
#endif
    return load_first_buffered(p, m);
}
template <class T>
inline void store_first(T* p, const batch<T>& v, std::size_t m) {
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<T, float> && width<T> == 16) {
        return _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << m) - 1u), v);
    } else if constexpr (std::is_same_v<T, double> && width<T> == 8) {
        return _mm512_mask_storeu_pd(p, static_cast<__mmask8>((1u << m) - 1u), v);
    }
#elif defined(__AVX2__)
    if constexpr (std::is_same_v<T, float> && width<T> == 8) {
        return _mm256_maskstore_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(int(m)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)), v);
    } else if constexpr (std::is_same_v<T, double> && width<T> == 4) {
        return _mm256_maskstore_pd(p, _mm256_cmpgt_epi64(_mm256_set1_epi64x(std::int64_t(m)), _mm256_setr_epi64x(0, 1, 2, 3)), v);
    }
#endif
    store_first_buffered(p, v, m);
}

// A value computed in T, rounded to S's precision (an op whose dtype is bf16 rounds its result
// once, as a bf16 kernel that widens, computes and narrows does).
template <class S, class T, class A>
inline xsimd::batch<T, A> round_as(const xsimd::batch<T, A>& v) {
    if constexpr (std::is_same_v<S, T>) {
        return v;
    } else {
        constexpr std::size_t w = xsimd::batch<T, A>::size;
        alignas(64) T lanes[w];
        alignas(64) S narrow[w];
        v.store_aligned(lanes);
        detail::convert_n(lanes, narrow, w);
        detail::convert_n(narrow, lanes, w);
        return xsimd::batch<T, A>::load_aligned(lanes);
    }
}
template <class S, class T> requires std::is_floating_point_v<T>
inline T round_as(T x) {
    if constexpr (std::is_same_v<S, T>) return x;
    else return static_cast<T>(static_cast<float>(S(x)));
}
template <class T, class S>
inline T scalar_as(S x) {
    if constexpr (std::is_same_v<S, T>) return x;
    else return static_cast<T>(static_cast<float>(x));
}

// Up to a whole batch: m in [0, width]; lanes past m are p[m - 1] (or 0 when m is 0) and are
// not stored.
template <class T>
inline batch<T> load_upto(const T* p, std::size_t m) {
    if (m >= width<T>) return load(p);
    return m == 0 ? batch<T>(T(0)) : load_first(p, m);
}
template <class T>
inline void store_upto(T* p, const batch<T>& v, std::size_t m) {
    if (m >= width<T>) store(p, v);
    else if (m > 0) store_first(p, v, m);
}

// ---- lane permutations (GCC and clang vector extensions) ----------------------------------
// The even and the odd lanes of the 2 width lanes lo ++ hi, and back: zip(a, b) is a0 b0 a1 b1
// ..., its first width lanes in lo, the rest in hi.
template <class T, class A>
inline xsimd::batch<T, A> even_lanes(const xsimd::batch<T, A>& lo, const xsimd::batch<T, A>& hi) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
        return xsimd::batch<T, A>(__builtin_shufflevector(lo.data, hi.data, (2 * I)...));
    }(std::make_index_sequence<xsimd::batch<T, A>::size>{});
}
template <class T, class A>
inline xsimd::batch<T, A> odd_lanes(const xsimd::batch<T, A>& lo, const xsimd::batch<T, A>& hi) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
        return xsimd::batch<T, A>(__builtin_shufflevector(lo.data, hi.data, (2 * I + 1)...));
    }(std::make_index_sequence<xsimd::batch<T, A>::size>{});
}
template <class T, class A>
inline void zip_lanes(const xsimd::batch<T, A>& a, const xsimd::batch<T, A>& b, xsimd::batch<T, A>& lo,
                      xsimd::batch<T, A>& hi) {
    constexpr std::size_t n = xsimd::batch<T, A>::size;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
        lo = xsimd::batch<T, A>(__builtin_shufflevector(a.data, b.data, (I % 2 ? n + I / 2 : I / 2)...));
        hi = xsimd::batch<T, A>(__builtin_shufflevector(a.data, b.data, (I % 2 ? n + (n + I) / 2 : (n + I) / 2)...));
    }(std::make_index_sequence<n>{});
}

// dst[q * ldd + l] = src[l * lds + q] for l, q < 8 (float): the usual three rounds of shuffles
// (pairs of rows interleaved, then pairs of pairs, then halves), as GCC/clang vector extensions.
[[gnu::always_inline]] inline void transpose_8x8(const float* src, std::size_t lds, float* dst, std::size_t ldd) {
    using V = float __attribute__((vector_size(32)));
    V r[8], t[8], u[8];
    for (std::size_t l = 0; l < 8; ++l) std::memcpy(&r[l], src + l * lds, sizeof(V));
    for (std::size_t l = 0; l < 8; l += 2) {
        t[l] = __builtin_shufflevector(r[l], r[l + 1], 0, 8, 1, 9, 4, 12, 5, 13);
        t[l + 1] = __builtin_shufflevector(r[l], r[l + 1], 2, 10, 3, 11, 6, 14, 7, 15);
    }
    for (std::size_t l = 0; l < 8; l += 4)
        for (std::size_t h = 0; h < 2; ++h) {
            u[l + 2 * h] = __builtin_shufflevector(t[l + h], t[l + h + 2], 0, 1, 8, 9, 4, 5, 12, 13);
            u[l + 2 * h + 1] = __builtin_shufflevector(t[l + h], t[l + h + 2], 2, 3, 10, 11, 6, 7, 14, 15);
        }
    for (std::size_t q = 0; q < 4; ++q) {
        const V lo = __builtin_shufflevector(u[q], u[q + 4], 0, 1, 2, 3, 8, 9, 10, 11);
        const V hi = __builtin_shufflevector(u[q], u[q + 4], 4, 5, 6, 7, 12, 13, 14, 15);
        std::memcpy(dst + q * ldd, &lo, sizeof(V));
        std::memcpy(dst + (q + 4) * ldd, &hi, sizeof(V));
    }
}

// ---- horizontal -------------------------------------------------------------------------
template <class T, class A>
inline T reduce_sum(const xsimd::batch<T, A>& v) { return xsimd::hadd(v); }
template <class T>
  requires std::is_arithmetic_v<T>
inline T reduce_sum(T v) { return v; }
// The two halves of a register's lanes (GCC and clang vector extensions).
template <class V>
inline auto low_half(const V& v) {
    constexpr std::size_t n = sizeof(V) / sizeof(v[0]);
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
        return __builtin_shufflevector(v, v, I...);
    }(std::make_index_sequence<n / 2>{});
}
template <class V>
inline auto high_half(const V& v) {
    constexpr std::size_t n = sizeof(V) / sizeof(v[0]);
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
        return __builtin_shufflevector(v, v, (I + n / 2)...);
    }(std::make_index_sequence<n / 2>{});
}
// The largest lane, NaN if any lane is NaN: lanes i and i + n/2 combined, down to one lane, on
// the register itself (a loop over a stored array put a store-forwarding stall before each of
// its W - 1 steps). Which of +0 and -0, or of several NaNs, comes out depends on the order, as
// for the row's accumulator chains (docs/design.md).
template <class V>
inline auto max_of_halves(const V& v) {
    constexpr std::size_t n = sizeof(V) / sizeof(v[0]);
    if constexpr (n == 2) {
        return (v[1] > v[0] || v[1] != v[1]) ? v[1] : v[0];
    } else {
        const auto lo = low_half(v), hi = high_half(v);
        const auto take = (hi > lo) | (hi != hi);  // all ones where the higher lane wins
        using I = decltype(take);
        return max_of_halves(decltype(lo)((I(hi) & take) | (I(lo) & ~take)));
    }
}
template <class T, class A>
inline T reduce_max(const xsimd::batch<T, A>& v) {
    if constexpr (xsimd::batch<T, A>::size == 1) return v.get(0);
    else return max_of_halves(v.data);
}
template <class T>
  requires std::is_arithmetic_v<T>
inline T reduce_max(T v) { return v; }
// Lanes i and i + n/2 multiplied, down to one lane, on the register itself (a loop over a
// stored array put a store-forwarding stall before each of its W - 1 products).
template <class V>
inline auto product_of_halves(const V& v) {
    constexpr std::size_t n = sizeof(V) / sizeof(v[0]);
    if constexpr (n == 2) return v[0] * v[1];
    else return product_of_halves(low_half(v) * high_half(v));
}
// Pairwise, halving the lanes (as hadd): fewer roundings in a row than a left fold.
template <class T, class A>
inline T reduce_prod(const xsimd::batch<T, A>& v) {
    if constexpr (xsimd::batch<T, A>::size == 1) return v.get(0);
    else return product_of_halves(v.data);
}
template <class T>
  requires std::is_arithmetic_v<T>
inline T reduce_prod(T v) { return v; }

// ---- elementwise math: batches ------------------------------------------------------------
// r with its finite lanes beyond +-edge replaced by the C library's exp (rare: one check a batch).
template <class T, class A>
inline xsimd::batch<T, A> exp_far_lanes(const xsimd::batch<T, A>& x, xsimd::batch<T, A> r, T edge) {
    using B = xsimd::batch<T, A>;
    const B ax = xsimd::abs(x);
    if (xsimd::any((ax > B(edge)) & (ax < B(std::numeric_limits<T>::infinity())))) [[unlikely]] {
        alignas(64) T in[B::size], out[B::size];
        x.store_aligned(in);
        r.store_aligned(out);
        for (std::size_t i = 0; i < B::size; ++i)
            if (std::abs(in[i]) > edge && std::isfinite(in[i])) out[i] = std::exp(in[i]);
        r = B::load_aligned(out);
    }
    return r;
}
// xsimd 8.1's exp flushes results below the smallest normal number to 0 (exp(-90.f) = 0, not
// 8.2e-40) and overflows early (exp(88.7f) = inf, not 3.3e38); PyTorch's kernels do neither.
// Finite lanes that far out (rare) take the C library's exp. Infinite lanes do not: exp(-inf) = 0
// and exp(inf) = inf are selected, and masked attention logits are -inf in about half the lanes
// of a causal softmax, which made this "rare" path half of its exp's time.
// With AVX-512, float's exp is xsimd's (Cephes' reduction and polynomial) evaluated in FMAs:
// xsimd 8.1 has no AVX-512 fma and evaluates each as a multiply and an add, which
// -ffp-contract=off keeps apart; on a core with one 512-bit FP port (this host) that was twice
// the polynomial's work. Within 1.53 ulps of e^x (xsimd's 1.51; checked over every float); every
// call gives the same bits, as recomputation needs. (Scaling by 2^k with vscalefps instead, which
// rounds subnormal results without a branch, was faster on 64-byte aligned buffers but 35% slower
// than xsimd's exp at 1e6 misaligned floats, std::vector's, in expmul's loop.) Double is xsimd's
// reduction and rational approximation scaled with vscalefpd: no range check, no branch, and
// xsimd's bits wherever xsimd's are not flushed.
template <class T, class A>
inline auto exp(const xsimd::batch<T, A>& x) {
#if XSIMD_WITH_AVX512F
    using B = xsimd::batch<T, A>;  // in the AVX-512 branch only: unused elsewhere (-Wunused-local-typedefs)
    if constexpr (std::is_base_of_v<xsimd::avx512f, A> && (std::is_same_v<T, float> || std::is_same_v<T, double>)) {
        if constexpr (std::is_same_v<T, float>) {
            const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(0x1.715476p+0f)),
                                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0x1.63p-1f), x);    // ln 2, high bits
            r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-0x1.bd0106p-13f), r);       // ln 2, low bits
            __m512 y = _mm512_fmadd_ps(_mm512_set1_ps(0x1.6ef19ep-10f), r, _mm512_set1_ps(0x1.131b16p-7f));
            y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(0x1.5552aep-5f));
            y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(0x1.55534ap-3f));
            y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(0.5f));
            const __m512 e = _mm512_add_ps(_mm512_fmadd_ps(y, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.f));
            // 2^k for |x| <= 87 (k in [-126, 126]); the other lanes are replaced below
            const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)), 23);
            B out = B(_mm512_mul_ps(e, _mm512_castsi512_ps(bits)));
            out = xsimd::select(x < B(-87.5f), B(0.f), out);
            out = xsimd::select(x > B(88.5f), B(std::numeric_limits<float>::infinity()), out);
            return exp_far_lanes(x, out, 87.f);
        } else {
            // xsimd 8.1's own reduction (an internal of Debian 12's xsimd, the version this header is
            // written for; its only use of xsimd internals)
            using reduction = xsimd::kernel::detail::exp_reduction<T, A, xsimd::kernel::detail::exp_tag>;
            const B xc = _mm512_min_pd(_mm512_set1_pd(800.0), _mm512_max_pd(_mm512_set1_pd(-800.0), x));
            B hi, lo, r;
            const B k = reduction::reduce(xc, hi, lo, r);
            return B(_mm512_scalef_pd(reduction::finalize(r, reduction::approx(r), hi, lo), k));
        }
    } else
#endif
    {
        return exp_far_lanes(x, xsimd::exp(x), std::is_same_v<T, float> ? T(87) : T(708));
    }
}
// xsimd 8.1's double log is wrong for subnormal inputs (log(1e-310) gave -746.5, not -713.8;
// float is right): such lanes are scaled into the normal range first.
template <class T, class A>
inline auto log(const xsimd::batch<T, A>& x) {
    using B = xsimd::batch<T, A>;
    if constexpr (std::is_same_v<T, double>) {
        const auto sub = x < B(std::numeric_limits<double>::min()) && x > B(0.0);
        if (xsimd::any(sub)) [[unlikely]] {
            const B r = xsimd::log(xsimd::select(sub, x * B(0x1p54), x));
            return xsimd::select(sub, r - B(54 * 0.69314718055994530942), r);
        }
    }
    return xsimd::log(x);
}
template <class T, class A> inline auto sqrt(const xsimd::batch<T, A>& x) { return xsimd::sqrt(x); }
template <class T, class A> inline auto sin(const xsimd::batch<T, A>& x) { return xsimd::sin(x); }
template <class T, class A> inline auto cos(const xsimd::batch<T, A>& x) { return xsimd::cos(x); }
template <class T, class A> inline auto tanh(const xsimd::batch<T, A>& x) { return xsimd::tanh(x); }
template <class T, class A> inline auto abs(const xsimd::batch<T, A>& x) { return xsimd::abs(x); }
// xsimd 8.1's double erf is NaN from |x| of about 1e100 on (erf(1e300): NaN, not 1), and up to
// 68 ulps off within [-6, 6] (near |x| = 2.2; 13 ulps at -0.53), where PyTorch's is within an
// ulp: gelu's derivative near its zero (x = -0.752, a difference of terms of 0.23) was then off
// by 5e-12 of itself (finding 21). Double lanes take the C library's erf (within an ulp, exact
// +-1 for huge arguments); float keeps xsimd's (2 ulps), whose huge arguments are fine but set
// to +-1 beyond |x| = 6 all the same (erfc(6) = 2e-17).
template <class T, class A>
inline auto erf(const xsimd::batch<T, A>& x) {
    using B = xsimd::batch<T, A>;
    if constexpr (std::is_same_v<T, double>) {
        alignas(64) T lanes[B::size];
        x.store_aligned(lanes);
        for (T& v : lanes) v = std::erf(v);
        return B::load_aligned(lanes);
    } else {
        const B one(T(1));
        return xsimd::select(xsimd::abs(x) > B(T(6)), xsimd::select(x > B(T(0)), one, -one), xsimd::erf(x));
    }
}
// xsimd 8.1's expm1(-0) and log1p(-0) are +0; C's (and PyTorch's) keep the zero's sign, which
// decides, e.g., pow(expm1(-0), -1) (-inf, not +inf): a zero is returned as is (finding 20).
template <class T, class A>
inline auto log1p(const xsimd::batch<T, A>& x) {
    return xsimd::select(x == xsimd::batch<T, A>(T(0)), x, xsimd::log1p(x));
}
template <class T, class A>
inline auto expm1(const xsimd::batch<T, A>& x) {
    return xsimd::select(x == xsimd::batch<T, A>(T(0)), x, xsimd::expm1(x));
}
// pow with the special values of C's pow (C11 F.10.4.4), which PyTorch follows. xsimd 8.1's
// pow gives 0 for every zero base, NaN for pow(x, 0) with infinite or NaN x, for pow(1, NaN),
// pow(-1, +-inf) and pow(-inf, 0.5), and takes huge even exponents (1e30f) for odd ones; so
// |x|^y = exp(y log|x|) here, with the sign and the special cases set explicitly.
template <class T, class A>
inline auto pow(const xsimd::batch<T, A>& x, const xsimd::batch<T, A>& y) {
    using B = xsimd::batch<T, A>;
    const B zero(T(0)), one(T(1)), inf(std::numeric_limits<T>::infinity());
    const auto integer = xsimd::floor(y) == y;                                 // +-inf too, not NaN
    const auto odd = (y - B(T(2)) * xsimd::floor(y * B(T(0.5)))) == one;      // not +-inf
    B r = simd::exp(y * simd::log(xsimd::abs(x)));  // +-0 and +-inf bases: 0 or inf by y's sign
    r = xsimd::select(odd, xsimd::copysign(r, x), r);  // x < 0 or -0 with an odd integer y
    r = xsimd::select(x < zero && x > -inf && !integer, B(std::numeric_limits<T>::quiet_NaN()), r);
    return xsimd::select(y == zero || x == one || (x == -one && xsimd::isinf(y)), one, r);
}
// NaN-propagating, as torch.maximum / torch.minimum. Not `a != a`: xsimd 8.1 compiles batch
// != to _CMP_NEQ_OQ on AVX and AVX-512, false for NaN operands (true on SSE2).
// On x86, xsimd's float max and min are maxps / minps, which return their second operand when
// either is NaN: b's NaN needs no test of its own (a cheap max loop, a softmax's, was bound by
// the five instructions of two tests).
#if defined(__SSE2__)
inline constexpr bool second_nan_propagates = true;
#else
inline constexpr bool second_nan_propagates = false;
#endif
template <class T, class A>
inline auto max(const xsimd::batch<T, A>& a, const xsimd::batch<T, A>& b) {
    if constexpr (second_nan_propagates && std::is_floating_point_v<T>)
        return xsimd::select(xsimd::isnan(a), a, xsimd::max(a, b));
    else
        return xsimd::select(xsimd::isnan(a), a, xsimd::select(xsimd::isnan(b), b, xsimd::max(a, b)));
}
template <class T, class A>
inline auto min(const xsimd::batch<T, A>& a, const xsimd::batch<T, A>& b) {
    if constexpr (second_nan_propagates && std::is_floating_point_v<T>)
        return xsimd::select(xsimd::isnan(a), a, xsimd::min(a, b));
    else
        return xsimd::select(xsimd::isnan(a), a, xsimd::select(xsimd::isnan(b), b, xsimd::min(a, b)));
}
template <class T, class A>
inline auto mask(const xsimd::batch_bool<T, A>& m) {
    return xsimd::select(m, xsimd::batch<T, A>(T(1)), xsimd::batch<T, A>(T(0)));
}
template <class T, class A>
inline auto select(const xsimd::batch_bool<T, A>& m, const xsimd::batch<T, A>& a,
                   const xsimd::batch<T, A>& b) {
    return xsimd::select(m, a, b);
}
// Every lane 0 (a NaN lane is not).
template <class T, class A>
inline bool is_zero(const xsimd::batch<T, A>& x) { return xsimd::all(x == xsimd::batch<T, A>(T(0))); }
template <class T, class A>
inline auto is_finite(const xsimd::batch<T, A>& x) { return xsimd::isfinite(x); }

// ---- elementwise math: scalars ------------------------------------------------------------
// Loop tails compute with the same (vector) functions as loop bodies: an element must get the
// same bits whether a loop reaches it in a batch or in the tail, or a value recomputed in another
// loop (say, compared with a saved maximum) would differ by an ulp.
template <class T, class F>
inline T through_batch(T x, F f) {
    alignas(64) T lanes[width<T>];
    store(lanes, f(batch<T>(x)));
    return lanes[0];
}
template <class T> requires std::is_floating_point_v<T>
inline T exp(T x) { return through_batch(x, [](const batch<T>& b) { return simd::exp(b); }); }
template <class T> requires std::is_floating_point_v<T>
inline T log(T x) { return through_batch(x, [](const batch<T>& b) { return simd::log(b); }); }
template <class T> requires std::is_floating_point_v<T> inline T sqrt(T x) { return std::sqrt(x); }
template <class T> requires std::is_floating_point_v<T>
inline T sin(T x) { return through_batch(x, [](const batch<T>& b) { return xsimd::sin(b); }); }
template <class T> requires std::is_floating_point_v<T>
inline T cos(T x) { return through_batch(x, [](const batch<T>& b) { return xsimd::cos(b); }); }
template <class T> requires std::is_floating_point_v<T>
inline T tanh(T x) { return through_batch(x, [](const batch<T>& b) { return xsimd::tanh(b); }); }
template <class T> requires std::is_floating_point_v<T> inline T abs(T x) { return std::fabs(x); }
template <class T> requires std::is_floating_point_v<T>
inline T erf(T x) { return through_batch(x, [](const batch<T>& b) { return simd::erf(b); }); }
template <class T> requires std::is_floating_point_v<T>
inline T log1p(T x) { return through_batch(x, [](const batch<T>& b) { return ::typegrad::simd::log1p(b); }); }
template <class T> requires std::is_floating_point_v<T>
inline T expm1(T x) { return through_batch(x, [](const batch<T>& b) { return ::typegrad::simd::expm1(b); }); }
template <class T> requires std::is_floating_point_v<T>
inline T pow(T x, T y) {
    return through_batch(x, [y](const batch<T>& b) { return simd::pow(b, batch<T>(y)); });
}
template <class T> requires std::is_floating_point_v<T>
inline T max(T a, T b) { return a != a ? a : (b != b ? b : (a < b ? b : a)); }
template <class T> requires std::is_floating_point_v<T>
inline T min(T a, T b) { return a != a ? a : (b != b ? b : (b < a ? b : a)); }
template <class T> requires std::is_floating_point_v<T>
inline T mask_of(bool m) { return m ? T(1) : T(0); }
template <class T> requires std::is_floating_point_v<T>
inline T select(bool m, T a, T b) { return m ? a : b; }
template <class T> requires std::is_floating_point_v<T>
inline bool is_finite(T x) { return std::isfinite(x); }

// Comparisons as 0/1 values of the operands' type (masks carry no gradient).
template <class V> inline V gt(const V& a, const V& b) {
    if constexpr (is_batch_v<V>) return mask(a > b); else return mask_of<V>(a > b);
}
template <class V> inline V ge(const V& a, const V& b) {
    if constexpr (is_batch_v<V>) return mask(a >= b); else return mask_of<V>(a >= b);
}
template <class V> inline V lt(const V& a, const V& b) {
    if constexpr (is_batch_v<V>) return mask(a < b); else return mask_of<V>(a < b);
}
template <class V> inline V le(const V& a, const V& b) {
    if constexpr (is_batch_v<V>) return mask(a <= b); else return mask_of<V>(a <= b);
}
template <class V> inline V eq(const V& a, const V& b) {
    if constexpr (is_batch_v<V>) return mask(a == b); else return mask_of<V>(a == b);
}

}  // namespace typegrad::simd

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
