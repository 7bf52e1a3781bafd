#pragma once
// Matrix products with bf16/f16 operands and f32 accumulation (autocast's lower-precision ops).
//
// With AVX512-BF16 (-march with avx512bf16) and bf16 operands, the product runs on vdpbf16ps:
// B is packed as k-pairs of bf16 per column (one 32-bit lane holds B[p][j], B[p+1][j]), each
// A pair is broadcast, and one instruction adds two products per lane in float; cache-blocked
// and threaded like the f32 GEMM, bitwise deterministic whatever the thread count. Operands that
// hold subnormals, or values small enough for a partial sum to become subnormal, take the float
// path instead (vdpbf16ps flushes those to 0; see bf16_dot_is_exact). Elsewhere (and for f16),
// the operands are widened to dense float matrices and the float GEMM runs. Either way every
// product of two 16-bit values is exact in float; the sums are float sums.
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include <typegrad/core/cpu/gemm.hpp>
#include <typegrad/core/cpu/half_simd.hpp>

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

// ---- Subnormals: when vdpbf16ps is exact -------------------------------------------------------
// vdpbf16ps treats subnormal bf16 inputs as 0 and flushes subnormal results to 0 (DAZ and FTZ are
// implied, whatever MXCSR says); PyTorch's bf16 mm keeps them. A product of two bf16 values with
// biased exponents Ea, Eb is a multiple of 2^(Ea - 134 + Eb - 134) (7 fraction bits each), and so
// is every sum of such products in float, rounded or not, as long as that quantum is at least
// 2^-126, the smallest normal float: then no partial sum can be subnormal. So the dot
// instruction gives IEEE results exactly when neither operand holds a subnormal and
// min Ea + min Eb >= 142 over their nonzero finite elements (e.g. both above 2^-56 in magnitude);
// otherwise the product takes the float path, which keeps subnormals. Zeros, infinities and NaN
// need no care: the instruction handles them as IEEE does. (docs/reliability.md, finding 17.)
struct bf16_exponent_range {
    bool subnormal = false;
    unsigned min_exponent = 255;  // the smallest biased exponent of a nonzero finite element
};

inline void scan_bf16_bits(const std::uint16_t* p, std::ptrdiff_t stride, std::size_t count,
                           bf16_exponent_range& r) {
    unsigned sub = 0, lo = r.min_exponent;
    for (std::size_t i = 0; i < count; ++i) {
        const unsigned u = p[std::ptrdiff_t(i) * stride];
        const unsigned e = (u >> 7) & 0xffu;
        sub |= unsigned(e == 0) & unsigned((u & 0x7fu) != 0);
        const unsigned key = e == 0 ? 255u : e;
        lo = key < lo ? key : lo;
    }
    r.subnormal = r.subnormal || sub != 0;
    r.min_exponent = lo;
}

// The exponent range of a rows x cols strided bf16 matrix, walked along its unit stride if any.
inline bf16_exponent_range scan_bf16(strided_matrix<bf16> x, std::size_t rows, std::size_t cols) {
    static_assert(sizeof(bf16) == sizeof(std::uint16_t));
    bf16_exponent_range r;
    const auto* base = reinterpret_cast<const std::uint16_t*>(x.data);
    if (x.row_stride == 1 && x.col_stride != 1) {
        for (std::size_t j = 0; j < cols; ++j) scan_bf16_bits(base + std::ptrdiff_t(j) * x.col_stride, 1, rows, r);
    } else {
        for (std::size_t i = 0; i < rows; ++i)
            scan_bf16_bits(base + std::ptrdiff_t(i) * x.row_stride, x.col_stride, cols, r);
    }
    return r;
}

// True when a * b (a m x k, b k x n) on vdpbf16ps equals the IEEE float computation's inputs and
// partial sums (no subnormal anywhere).
inline bool bf16_dot_is_exact(std::size_t m, std::size_t n, std::size_t k, strided_matrix<bf16> a,
                              strided_matrix<bf16> b) {
    const bf16_exponent_range ra = scan_bf16(a, m, k);
    if (ra.subnormal) return false;
    const bf16_exponent_range rb = scan_bf16(b, k, n);
    return !rb.subnormal && ra.min_exponent + rb.min_exponent >= 142;
}

#if defined(__AVX512BF16__) && defined(__AVX512F__)
// ---- The blocked, threaded bf16 GEMM on vdpbf16ps -------------------------------------------------
// The f32 GEMM's structure (gemm.hpp) over k-pairs: B is packed in NR = 32-column micro-panels of
// k-pairs (one 32-bit lane holds B[2q][j], B[2q+1][j]), A in MR = 8-row micro-panels of pairs
// (broadcast one pair per row), and one vdpbf16ps adds two exact products per lane in float.
// Cache blocks: KCP pairs deep (the B micro-panel, KCP x 32 x 4 bytes, in L1/L2), MC rows of A
// (MC x KCP x 4 bytes in L2), NC columns of B. Each C element is one chain: the accumulators
// start from 0 and continue from C's stored float at each following KCP block, pairs in order,
// whatever tile or thread computes it, so the threaded result is bitwise equal to the serial one.
namespace bf16_gemm {

inline constexpr std::size_t MR = 8, NR = 32, KCP = 192, MC = 192, NC = 2048;

struct operands {
    std::size_t k;
    strided_matrix<bf16> a, b;
    float* c;
    std::size_t ldc;
};

inline std::uint32_t pair_bits(const bf16* lo, const bf16* hi) {
    return std::uint32_t(lo->bits) | (hi != nullptr ? std::uint32_t(hi->bits) << 16 : 0u);
}

// op(B) pairs [q0, q0 + kcp) x columns [j0, j0 + nc) into NR-column panels (out[panel][q * NR + j]).
inline void pack_b(const operands& op, std::size_t q0, std::size_t kcp, std::size_t j0, std::size_t nc,
                   std::uint32_t* out) {
    const strided_matrix<bf16>& b = op.b;
    const std::size_t k = op.k;
    for (std::size_t jp = 0; jp < nc; jp += NR, out += kcp * NR) {
        const std::size_t w = std::min(NR, nc - jp);
        for (std::size_t jj = 0; jj < w; ++jj) {
            const bf16* col = b.data + std::ptrdiff_t(j0 + jp + jj) * b.col_stride;
            for (std::size_t q = 0; q < kcp; ++q) {
                const std::size_t p = 2 * (q0 + q);
                const bf16* lo = col + std::ptrdiff_t(p) * b.row_stride;
                out[q * NR + jj] = pair_bits(lo, p + 1 < k ? lo + b.row_stride : nullptr);
            }
        }
        for (std::size_t q = 0; q < kcp; ++q)
            for (std::size_t jj = w; jj < NR; ++jj) out[q * NR + jj] = 0;
    }
}

// Same for B whose rows are contiguous (col_stride 1): read row pairs in memory order.
inline void pack_b_rows(const operands& op, std::size_t q0, std::size_t kcp, std::size_t j0, std::size_t nc,
                        std::uint32_t* out) {
    const strided_matrix<bf16>& b = op.b;
    const std::size_t k = op.k;
    for (std::size_t q = 0; q < kcp; ++q) {
        const std::size_t p = 2 * (q0 + q);
        const std::uint16_t* lo = reinterpret_cast<const std::uint16_t*>(b.data + std::ptrdiff_t(p) * b.row_stride) + j0;
        const std::uint16_t* hi = p + 1 < k ? lo + b.row_stride : nullptr;
        for (std::size_t jp = 0; jp < nc; jp += NR) {
            std::uint32_t* dst = out + jp * kcp + q * NR;
            const std::size_t w = std::min(NR, nc - jp);
            std::size_t jj = 0;
            if (hi != nullptr)
                for (; jj < w; ++jj) dst[jj] = std::uint32_t(lo[jp + jj]) | (std::uint32_t(hi[jp + jj]) << 16);
            else
                for (; jj < w; ++jj) dst[jj] = std::uint32_t(lo[jp + jj]);
            for (; jj < NR; ++jj) dst[jj] = 0;
        }
    }
}

// op(A) rows [i0, i0 + mc) x pairs [q0, q0 + kcp) into MR-row panels (out[panel][q * MR + r]).
inline void pack_a(const operands& op, std::size_t i0, std::size_t mc, std::size_t q0, std::size_t kcp,
                   std::uint32_t* out) {
    const strided_matrix<bf16>& a = op.a;
    const std::size_t k = op.k;
    for (std::size_t ip = 0; ip < mc; ip += MR, out += kcp * MR) {
        const std::size_t h = std::min(MR, mc - ip);
        for (std::size_t r = 0; r < h; ++r) {
            const bf16* row = a.data + std::ptrdiff_t(i0 + ip + r) * a.row_stride;
            for (std::size_t q = 0; q < kcp; ++q) {
                const std::size_t p = 2 * (q0 + q);
                const bf16* lo = row + std::ptrdiff_t(p) * a.col_stride;
                out[q * MR + r] = pair_bits(lo, p + 1 < k ? lo + a.col_stride : nullptr);
            }
        }
        for (std::size_t q = 0; q < kcp; ++q)
            for (std::size_t r = h; r < MR; ++r) out[q * MR + r] = 0;
    }
}

// C[MR x NR] (row stride ldc) = (add ? C : 0) + A panel * B panel over kcp pairs.
template <std::size_t... R>
[[gnu::always_inline]] inline void kernel(std::size_t kcp, const std::uint32_t* ap, const std::uint32_t* bp, float* c,
                                          std::size_t ldc, bool add, std::index_sequence<R...>) {
    __m512 acc0[MR], acc1[MR];
    if (add) {
        ((acc0[R] = _mm512_loadu_ps(c + R * ldc), acc1[R] = _mm512_loadu_ps(c + R * ldc + 16)), ...);
    } else {
        ((acc0[R] = _mm512_setzero_ps(), acc1[R] = _mm512_setzero_ps()), ...);
    }
    for (std::size_t q = 0; q < kcp; ++q, ap += MR, bp += NR) {
        const __m512bh b0 = std::bit_cast<__m512bh>(_mm512_loadu_si512(bp));
        const __m512bh b1 = std::bit_cast<__m512bh>(_mm512_loadu_si512(bp + 16));
        ((acc0[R] = _mm512_dpbf16_ps(acc0[R], std::bit_cast<__m512bh>(_mm512_set1_epi32(int(ap[R]))), b0),
          acc1[R] = _mm512_dpbf16_ps(acc1[R], std::bit_cast<__m512bh>(_mm512_set1_epi32(int(ap[R]))), b1)),
         ...);
    }
    ((_mm512_storeu_ps(c + R * ldc, acc0[R]), _mm512_storeu_ps(c + R * ldc + 16, acc1[R])), ...);
}

// The C block [i_begin, i_end) x [j_begin, j_end); size_m x size_n sizes the buffers (gemm.hpp).
inline void block(const operands& op, std::size_t i_begin, std::size_t i_end, std::size_t j_begin, std::size_t j_end,
                  std::size_t size_m, std::size_t size_n) {
    const std::size_t m = i_end - i_begin, n = j_end - j_begin, kp = (op.k + 1) / 2;
    if (m == 0 || n == 0) return;
    const std::size_t kcp_max = std::min(KCP, kp);
    std::uint32_t* const bp =
        half_gemm_buffer<std::uint32_t, 0>(kcp_max * ((std::min(NC, std::max(n, size_n)) + NR - 1) / NR * NR));
    std::uint32_t* const ap =
        half_gemm_buffer<std::uint32_t, 1>(kcp_max * ((std::min(MC, std::max(m, size_m)) + MR - 1) / MR * MR));
    alignas(64) float edge[MR * NR];
    const bool b_rows = op.b.col_stride == 1;
    for (std::size_t jc = j_begin; jc < j_end; jc += NC) {
        const std::size_t nc = std::min(NC, j_end - jc);
        for (std::size_t qc = 0; qc < kp; qc += KCP) {
            const std::size_t kcp = std::min(KCP, kp - qc);
            if (b_rows) pack_b_rows(op, qc, kcp, jc, nc, bp);
            else pack_b(op, qc, kcp, jc, nc, bp);
            const bool add = qc > 0;
            for (std::size_t ic = i_begin; ic < i_end; ic += MC) {
                const std::size_t mc = std::min(MC, i_end - ic);
                pack_a(op, ic, mc, qc, kcp, ap);
                for (std::size_t jr = 0; jr < nc; jr += NR) {
                    const std::size_t nr = std::min(NR, nc - jr);
                    for (std::size_t ir = 0; ir < mc; ir += MR) {
                        const std::size_t mr = std::min(MR, mc - ir);
                        float* c_tile = op.c + (ic + ir) * op.ldc + jc + jr;
                        if (mr == MR && nr == NR) {
                            kernel(kcp, ap + ir * kcp, bp + jr * kcp, c_tile, op.ldc, add,
                                   std::make_index_sequence<MR>{});
                        } else {
                            // Same chain through a full-size scratch tile holding C's values.
                            if (add)
                                for (std::size_t i = 0; i < mr; ++i)
                                    std::memcpy(edge + i * NR, c_tile + i * op.ldc, nr * sizeof(float));
                            kernel(kcp, ap + ir * kcp, bp + jr * kcp, edge, NR, add, std::make_index_sequence<MR>{});
                            for (std::size_t i = 0; i < mr; ++i)
                                std::memcpy(c_tile + i * op.ldc, edge + i * NR, nr * sizeof(float));
                        }
                    }
                }
            }
        }
    }
}

}  // namespace bf16_gemm

// c (m x n, row stride ldc, float) = a * b with a m x k and b k x n, both bf16. Large products run
// on the shared thread pool (n_threads, 0: detail::num_threads()); results do not depend on it.
inline void gemm_bf16_dot(std::size_t m, std::size_t n, std::size_t k, strided_matrix<bf16> a,
                          strided_matrix<bf16> b, float* c, std::size_t ldc, std::size_t n_threads = 0) {
    using namespace bf16_gemm;
    if (m == 0 || n == 0) return;
    if (k == 0) {
        for (std::size_t i = 0; i < m; ++i) std::fill_n(c + i * ldc, n, 0.f);
        return;
    }
    const operands op{k, a, b, c, ldc};
    // A bf16 multiply-add pair costs about what one float FMA does: plan as the f32 GEMM does over
    // k / 2.
    const std::size_t threads = gemm_impl::plan_threads(1, m, n, (k + 1) / 2, n_threads);
    if (threads <= 1) {
        block(op, 0, m, 0, n, m, n);
        return;
    }
    const std::pair<std::size_t, std::size_t> grid = gemm_impl::thread_grid(threads, m, n, MR, NR);
    const std::size_t tm = grid.first, tn = grid.second;
    const std::size_t bm = ((m + tm - 1) / tm + MR - 1) / MR * MR;
    const std::size_t bn = ((n + tn - 1) / tn + NR - 1) / NR * NR;
    default_thread_pool().parallel_for(tm * tn, threads, [&](std::size_t task) {
        const std::size_t i0 = std::min(m, (task / tn) * bm), j0 = std::min(n, (task % tn) * bn);
        block(op, i0, std::min(m, i0 + bm), j0, std::min(n, j0 + bn), bm, bn);
    });
}
#endif

// c (m x n dense, T = bf16, f16 or float) = a * b for 16-bit (or float) operands SA, SB.
template <class T, class SA, class SB>
void gemm_reduced(std::size_t m, std::size_t n, std::size_t k, strided_matrix<SA> a, strided_matrix<SB> b, T* c) {
    float* acc = std::is_same_v<T, float> ? reinterpret_cast<float*>(c) : half_gemm_buffer<float, 2>(m * n);
#if defined(__AVX512BF16__) && defined(__AVX512F__)
    if constexpr (std::is_same_v<SA, bf16> && std::is_same_v<SB, bf16>) {
        if (bf16_dot_is_exact(m, n, k, a, b)) {
            gemm_bf16_dot(m, n, k, a, b, acc, n);
            if constexpr (!std::is_same_v<T, float>) convert_n(acc, c, m * n);
            return;
        }
    }
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
