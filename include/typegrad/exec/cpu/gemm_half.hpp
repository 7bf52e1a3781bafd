#pragma once
// Matrix products with bf16/f16 operands and f32 accumulation (autocast's lower-precision ops).
//
// With AVX512-BF16 (-march with avx512bf16) and bf16 operands, the product runs on vdpbf16ps:
// B is packed as k-pairs of bf16 per column (one 32-bit lane holds B[p][j], B[p+1][j]), each
// A pair is broadcast, and one instruction adds two products per lane in float. Elsewhere (and
// for f16), the operands are widened to dense float matrices and the float GEMM runs. Either way
// every product of two 16-bit values is exact in float; the sums are float sums.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include <typegrad/core/half_simd.hpp>
#include <typegrad/exec/cpu/gemm.hpp>

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#endif

// GCC 12 flags the deliberately undefined vectors inside its own AVX-512 intrinsics as maybe
// uninitialised once they are inlined here (GCC PR105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace typegrad::detail {

// A strided matrix (element strides), read as float.
template <class S>
struct strided_matrix {
    const S* data;
    std::ptrdiff_t row_stride, col_stride;
    float at(std::size_t i, std::size_t j) const {
        return static_cast<float>(data[std::ptrdiff_t(i) * row_stride + std::ptrdiff_t(j) * col_stride]);
    }
};

// Grow-only per-thread work buffers: after the first call at a size, nothing is allocated.
template <class T, int Slot>
T* half_gemm_buffer(std::size_t n) {
    thread_local std::vector<T> buf;
    if (buf.size() < n) buf.resize(n);
    return buf.data();
}

inline constexpr bool has_bf16_dot =
#if defined(__AVX512BF16__) && defined(__AVX512F__)
    true;
#else
    false;
#endif

#if defined(__AVX512BF16__) && defined(__AVX512F__)
// c (m x n, row stride ldc, float) = a * b with a m x k and b k x n, both bf16.
inline void gemm_bf16_dot(std::size_t m, std::size_t n, std::size_t k, strided_matrix<bf16> a,
                          strided_matrix<bf16> b, float* c, std::size_t ldc) {
    const std::size_t kp = (k + 1) / 2;          // k-pairs
    const std::size_t np = (n + 31) / 32 * 32;   // columns, padded to two vectors
    auto bits = [](const bf16* p) -> std::uint32_t { return p->bits; };
    // Packing reads each operand once, in its memory order (a transposed operand column-wise).
    std::uint32_t* bp = half_gemm_buffer<std::uint32_t, 0>(kp * np);
    auto pack_b = [&](std::size_t q, std::size_t j) {
        std::uint32_t lo = 0, hi = 0;
        if (j < n) {
            lo = bits(b.data + std::ptrdiff_t(2 * q) * b.row_stride + std::ptrdiff_t(j) * b.col_stride);
            if (2 * q + 1 < k) hi = bits(b.data + std::ptrdiff_t(2 * q + 1) * b.row_stride + std::ptrdiff_t(j) * b.col_stride);
        }
        bp[q * np + j] = lo | (hi << 16);
    };
    if (b.col_stride == 1) {
        for (std::size_t q = 0; q < kp; ++q)
            for (std::size_t j = 0; j < np; ++j) pack_b(q, j);
    } else {
        for (std::size_t j = 0; j < np; ++j)
            for (std::size_t q = 0; q < kp; ++q) pack_b(q, j);
    }
    std::uint32_t* ap = half_gemm_buffer<std::uint32_t, 1>(m * kp);
    auto pack_a = [&](std::size_t i, std::size_t q) {
        const std::uint32_t lo = bits(a.data + std::ptrdiff_t(i) * a.row_stride + std::ptrdiff_t(2 * q) * a.col_stride);
        const std::uint32_t hi =
            2 * q + 1 < k ? bits(a.data + std::ptrdiff_t(i) * a.row_stride + std::ptrdiff_t(2 * q + 1) * a.col_stride) : 0;
        ap[i * kp + q] = lo | (hi << 16);
    };
    if (a.col_stride == 1 || a.row_stride != 1) {
        for (std::size_t i = 0; i < m; ++i)
            for (std::size_t q = 0; q < kp; ++q) pack_a(i, q);
    } else {
        for (std::size_t q = 0; q < kp; ++q)
            for (std::size_t i = 0; i < m; ++i) pack_a(i, q);
    }
    constexpr std::size_t rows = 8;  // 16 accumulators hide vdpbf16ps latency
    alignas(64) float tile[rows][32];
    for (std::size_t i0 = 0; i0 < m; i0 += rows) {
        const std::size_t mr = m - i0 < rows ? m - i0 : rows;
        for (std::size_t j0 = 0; j0 < np; j0 += 32) {
            __m512 acc[rows][2];
            for (std::size_t r = 0; r < rows; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
            for (std::size_t q = 0; q < kp; ++q) {
                const __m512bh b0 = std::bit_cast<__m512bh>(_mm512_loadu_si512(bp + q * np + j0));
                const __m512bh b1 = std::bit_cast<__m512bh>(_mm512_loadu_si512(bp + q * np + j0 + 16));
                for (std::size_t r = 0; r < mr; ++r) {
                    const __m512bh av = std::bit_cast<__m512bh>(_mm512_set1_epi32(int(ap[(i0 + r) * kp + q])));
                    acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
                    acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
                }
            }
            const std::size_t nc = n - j0 < 32 ? n - j0 : 32;
            for (std::size_t r = 0; r < mr; ++r) {
                _mm512_store_ps(tile[r], acc[r][0]);
                _mm512_store_ps(tile[r] + 16, acc[r][1]);
                std::memcpy(c + (i0 + r) * ldc + j0, tile[r], nc * sizeof(float));
            }
        }
    }
}
#endif

// c (m x n dense, T = bf16, f16 or float) = a * b for 16-bit (or float) operands SA, SB.
template <class T, class SA, class SB>
void gemm_reduced(std::size_t m, std::size_t n, std::size_t k, strided_matrix<SA> a, strided_matrix<SB> b, T* c) {
    float* acc = std::is_same_v<T, float> ? reinterpret_cast<float*>(c) : half_gemm_buffer<float, 2>(m * n);
#if defined(__AVX512BF16__) && defined(__AVX512F__)
    if constexpr (std::is_same_v<SA, bf16> && std::is_same_v<SB, bf16>) {
        gemm_bf16_dot(m, n, k, a, b, acc, n);
    } else
#endif
    {
        float* fa = half_gemm_buffer<float, 3>(m * k);
        float* fb = half_gemm_buffer<float, 4>(k * n);
        for (std::size_t i = 0; i < m; ++i)
            for (std::size_t p = 0; p < k; ++p) fa[i * k + p] = a.at(i, p);
        for (std::size_t p = 0; p < k; ++p)
            for (std::size_t j = 0; j < n; ++j) fb[p * n + j] = b.at(p, j);
        gemm<float>(transpose::no, transpose::no, m, n, k, fa, k, fb, n, acc, n, false);
    }
    if constexpr (!std::is_same_v<T, float>) convert_n(acc, c, m * n);
}

}  // namespace typegrad::detail

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
