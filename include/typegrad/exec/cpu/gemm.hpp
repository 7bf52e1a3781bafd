#pragma once
// Packed, cache-blocked GEMM for float and double (Goto / BLIS structure), row-major:
//
//   for jc in n step NC                    C column block; its B panel is reused by all of m
//     for pc in k step KC                  one rank-KC update
//       pack op(B)[pc.., jc..] -> kc x nc  NR-wide column micro-panels (L2/L3 resident)
//       for ic in m step MC
//         pack op(A)[ic.., pc..] -> mc x kc  MR-tall row micro-panels (L2 resident)
//         for jr in nc step NR             one B micro-panel (kc x NR) stays in L1 ...
//           for ir in mc step MR           ... while the A micro-panels stream from L2
//             micro-kernel: C[MR x NR] (+)= Apanel * Bpanel
//
// Transposes are handled by the packing routines alone. Packing zero-pads the last panels, so
// the micro-kernel always runs a full MR x NR tile; a partial tile goes through a small stack
// buffer. See docs/gemm.md for the blocking parameters and measurements.
//
// Every element of C is the same chain of FMAs (k in order, restarted at each KC block),
// whatever tile or thread computes it, so the threaded result is bitwise identical to the
// serial one.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <new>
#include <type_traits>
#include <utility>

#include <typegrad/exec/cpu/simd.hpp>
#include <typegrad/exec/cpu/thread_pool.hpp>

namespace typegrad::detail {

enum class transpose { no, yes };

namespace gemm_impl {

// Register blocking: the micro-tile is MR rows x NV vectors. Accumulators (MR * NV), the NV
// B vectors and one A broadcast must fit the register file: 32 vector registers with AVX-512
// (8 x 2 leaves room to spare; 6 x 4, 12 x 2 and 14 x 2 measured the same within noise, and
// the narrower NR wastes less on padding), 16 otherwise (the classic 6 x 2).
// Cache blocking (tuned on Zen 4: 32 KiB L1d, 1 MiB L2 per core):
//   KC  the depth of a rank-KC update. Large, to amortise loading and storing the C tile
//       (MR x NR) over KC FMAs per element; a micro-kernel reads (MR + NR) * sizeof(T) bytes
//       per MR * NV FMAs, little enough to stream the A micro-panels from L2.
//   MC  the packed A block (MC x KC) takes a third (float) to a fifth (double) of L2, leaving
//       room for the B micro-panel in use and for C.
//   NC  the packed B panel (KC x NC) lives in L2/L3; wide, so that A is packed once per KC
//       block for all but huge n.
template <class T>
struct default_config {
    static constexpr bool wide_regs = sizeof(simd::batch<T>) == 64;
    static constexpr std::size_t NV = 2;
    static constexpr std::size_t MR = wide_regs ? 8 : 6;
    static constexpr std::size_t NR = NV * simd::width<T>;
    static constexpr std::size_t KC = sizeof(T) == 4 ? 384 : 256;
    static constexpr std::size_t MC = (sizeof(T) == 4 ? 240 : 96) / MR * MR;
    static constexpr std::size_t NC = 4096 / NR * NR;
};

template <std::size_t... I, class F>
inline void unroll_impl(std::index_sequence<I...>, F&& f) {
    (f(std::integral_constant<std::size_t, I>{}), ...);
}
// f(0_c), f(1_c), ... f(N-1_c), as straight-line code.
template <std::size_t N, class F>
inline void unroll(F&& f) {
    unroll_impl(std::make_index_sequence<N>{}, f);
}

// C[MR x NR] = (add ? C : 0) + A * B over kc, where a is a packed MR-row micro-panel
// (a[p * MR + i]) and b a packed NR-column micro-panel (b[p * NR + j]).
template <class T, std::size_t MR, std::size_t NV>
inline void micro_kernel(std::size_t kc, const T* a, const T* b, T* c, std::size_t ldc, bool add) {
    using V = simd::batch<T>;
    constexpr std::size_t W = simd::width<T>;
    constexpr std::size_t NR = NV * W;
    // C is touched only after the k loop: start fetching its lines now, so that the misses
    // (a large C lives in L3 or memory) overlap the FMAs instead of following them.
    unroll<MR>([&](auto i) {
        __builtin_prefetch(c + i * ldc, 1, 3);
        __builtin_prefetch(c + i * ldc + NR - 1, 1, 3);
    });
    // C is touched only after the k loop: start fetching its lines now, so that the misses
    // (a large C lives in L3 or memory) overlap the FMAs instead of following them.
    unroll<MR>([&](auto i) {
        __builtin_prefetch(c + i * ldc, 1, 3);
        __builtin_prefetch(c + i * ldc + NR - 1, 1, 3);
    });
    V acc[MR][NV];
    unroll<MR>([&](auto i) { unroll<NV>([&](auto v) { acc[i][v] = V(T(0)); }); });
    for (std::size_t p = 0; p < kc; ++p) {
        V bv[NV];
        unroll<NV>([&](auto v) { bv[v] = simd::load(b + v * W); });
        unroll<MR>([&](auto i) {
            const V ai(a[i]);
            unroll<NV>([&](auto v) { acc[i][v] = xsimd::fma(ai, bv[v], acc[i][v]); });
        });
        a += MR;
        b += NR;
    }
    if (add) {
        unroll<MR>([&](auto i) {
            unroll<NV>([&](auto v) {
                T* ci = c + i * ldc + v * W;
                simd::store(ci, simd::load(static_cast<const T*>(ci)) + acc[i][v]);
            });
        });
    } else {
        unroll<MR>([&](auto i) { unroll<NV>([&](auto v) { simd::store(c + i * ldc + v * W, acc[i][v]); }); });
    }
}

// Grown on demand, never shrunk: steady-state calls allocate nothing. 64-byte aligned so that
// packed micro-panels start on cache lines.
template <class T>
class pack_buffer {
public:
    pack_buffer() = default;
    pack_buffer(const pack_buffer&) = delete;
    pack_buffer& operator=(const pack_buffer&) = delete;
    ~pack_buffer() { release(); }
    T* get(std::size_t n) {
        if (n > capacity_) {
            release();
            data_ = static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{64}));
            capacity_ = n;
        }
        return data_;
    }

private:
    void release() noexcept {
        if (data_ != nullptr) ::operator delete(data_, std::align_val_t{64});
        data_ = nullptr;
        capacity_ = 0;
    }
    T* data_ = nullptr;
    std::size_t capacity_ = 0;
};

template <class T>
struct thread_buffers {
    pack_buffer<T> a, b;
};
template <class T>
inline thread_buffers<T>& buffers() {
    thread_local thread_buffers<T> bufs;
    return bufs;
}

// Packs op(A)[0..mc) x [0..kc) into ceil(mc / MR) micro-panels, each kc x MR (p-major), zero
// padding the rows past mc. op(A)(i, p) is a[i * lda + p], or a[p * lda + i] when transposed.
template <class T, std::size_t MR>
inline void pack_a(transpose ta, std::size_t mc, std::size_t kc, const T* a, std::size_t lda, T* out) {
    for (std::size_t i0 = 0; i0 < mc; i0 += MR, out += MR * kc) {
        const std::size_t mr = std::min(MR, mc - i0);
        if (ta == transpose::yes) {
            // Each p is a contiguous run of rows: a row copy.
            const T* src = a + i0;
            for (std::size_t p = 0; p < kc; ++p, src += lda) {
                T* dst = out + p * MR;
                std::size_t i = 0;
                for (; i < mr; ++i) dst[i] = src[i];
                for (; i < MR; ++i) dst[i] = T(0);
            }
        } else if (mr == MR) {
            // MR row streams read in step, written interleaved.
            const T* src = a + i0 * lda;
            for (std::size_t p = 0; p < kc; ++p) {
                T* dst = out + p * MR;
                unroll<MR>([&](auto i) { dst[i] = src[i * lda + p]; });
            }
        } else {
            const T* src = a + i0 * lda;
            for (std::size_t p = 0; p < kc; ++p) {
                T* dst = out + p * MR;
                std::size_t i = 0;
                for (; i < mr; ++i) dst[i] = src[i * lda + p];
                for (; i < MR; ++i) dst[i] = T(0);
            }
        }
    }
}

// Packs op(B)[0..kc) x [0..nc) into ceil(nc / NR) micro-panels, each kc x NR (p-major), zero
// padding the columns past nc. op(B)(p, j) is b[p * ldb + j], or b[j * ldb + p] when transposed.
template <class T, std::size_t NR>
inline void pack_b(transpose tb, std::size_t kc, std::size_t nc, const T* b, std::size_t ldb, T* out) {
    constexpr std::size_t W = simd::width<T>;
    for (std::size_t j0 = 0; j0 < nc; j0 += NR, out += NR * kc) {
        const std::size_t nr = std::min(NR, nc - j0);
        if (tb == transpose::no && nr == NR) {
            const T* src = b + j0;
            for (std::size_t p = 0; p < kc; ++p, src += ldb)
                unroll<NR / W>([&](auto v) { simd::store(out + p * NR + v * W, simd::load(src + v * W)); });
        } else if (tb == transpose::no) {
            const T* src = b + j0;
            for (std::size_t p = 0; p < kc; ++p, src += ldb) {
                T* dst = out + p * NR;
                std::size_t j = 0;
                for (; j < nr; ++j) dst[j] = src[j];
                for (; j < NR; ++j) dst[j] = T(0);
            }
        } else {
            // Column j of op(B) is a contiguous row of B: read along it, write with stride NR.
            const T* src = b + j0 * ldb;
            for (std::size_t j = 0; j < nr; ++j, src += ldb)
                for (std::size_t p = 0; p < kc; ++p) out[p * NR + j] = src[p];
            for (std::size_t j = nr; j < NR; ++j)
                for (std::size_t p = 0; p < kc; ++p) out[p * NR + j] = T(0);
        }
    }
}

template <class T>
struct operands {
    transpose ta, tb;
    std::size_t k;
    const T* a;
    std::size_t lda;
    const T* b;
    std::size_t ldb;
    T* c;
    std::size_t ldc;
    bool accumulate;
};

// The serial blocked algorithm on the C block [i_begin, i_end) x [j_begin, j_end).
template <class T, class Config>
void gemm_block(const operands<T>& op, std::size_t i_begin, std::size_t i_end, std::size_t j_begin,
                std::size_t j_end) {
    constexpr std::size_t MR = Config::MR, NR = Config::NR, NV = Config::NV;
    constexpr std::size_t KC = Config::KC, MC = Config::MC, NC = Config::NC;
    static_assert(NR == NV * simd::width<T> && MC % MR == 0 && NC % NR == 0);
    const std::size_t m = i_end - i_begin, n = j_end - j_begin, k = op.k;
    if (m == 0 || n == 0) return;

    thread_buffers<T>& bufs = buffers<T>();
    const std::size_t kc_max = std::min(KC, k);
    T* const bp = bufs.b.get(kc_max * ((std::min(NC, n) + NR - 1) / NR * NR));
    T* const ap = bufs.a.get(kc_max * ((std::min(MC, m) + MR - 1) / MR * MR));
    alignas(64) T edge[MR * NR];

    for (std::size_t jc = j_begin; jc < j_end; jc += NC) {
        const std::size_t nc = std::min(NC, j_end - jc);
        for (std::size_t pc = 0; pc < k; pc += KC) {
            const std::size_t kc = std::min(KC, k - pc);
            const T* b_src = op.tb == transpose::no ? op.b + pc * op.ldb + jc : op.b + jc * op.ldb + pc;
            pack_b<T, NR>(op.tb, kc, nc, b_src, op.ldb, bp);
            const bool add = op.accumulate || pc > 0;
            for (std::size_t ic = i_begin; ic < i_end; ic += MC) {
                const std::size_t mc = std::min(MC, i_end - ic);
                const T* a_src = op.ta == transpose::no ? op.a + ic * op.lda + pc : op.a + pc * op.lda + ic;
                pack_a<T, MR>(op.ta, mc, kc, a_src, op.lda, ap);
                for (std::size_t jr = 0; jr < nc; jr += NR) {
                    const std::size_t nr = std::min(NR, nc - jr);
                    const T* b_panel = bp + jr * kc;
                    for (std::size_t ir = 0; ir < mc; ir += MR) {
                        const std::size_t mr = std::min(MR, mc - ir);
                        const T* a_panel = ap + ir * kc;
                        T* c_tile = op.c + (ic + ir) * op.ldc + jc + jr;
                        if (mr == MR && nr == NR) {
                            micro_kernel<T, MR, NV>(kc, a_panel, b_panel, c_tile, op.ldc, add);
                        } else {
                            // Same FMA chain into a full-size scratch tile, then the same
                            // lane-wise add as the full-tile path.
                            micro_kernel<T, MR, NV>(kc, a_panel, b_panel, edge, NR, false);
                            for (std::size_t i = 0; i < mr; ++i)
                                for (std::size_t j = 0; j < nr; ++j)
                                    c_tile[i * op.ldc + j] =
                                        add ? c_tile[i * op.ldc + j] + edge[i * NR + j] : edge[i * NR + j];
                        }
                    }
                }
            }
        }
    }
}

// Below this many multiply-adds in total a call stays on the calling thread, and each thread
// gets at least this much work: waking the pool costs microseconds.
inline constexpr std::size_t parallel_threshold = std::size_t(1) << 21;

// Splits t threads into a tm x tn grid over an m x n product, preferring square-ish blocks
// (least packing traffic) that are at least one micro-tile each way.
inline std::pair<std::size_t, std::size_t> thread_grid(std::size_t t, std::size_t m, std::size_t n,
                                                       std::size_t mr, std::size_t nr) {
    std::pair<std::size_t, std::size_t> best{t, 1};
    double best_cost = -1;
    for (std::size_t tm = 1; tm <= t; ++tm) {
        if (t % tm != 0) continue;
        const std::size_t tn = t / tm;
        const double bm = double(m) / double(tm), bn = double(n) / double(tn);
        // Packing traffic per thread grows with the block's half-perimeter; blocks thinner than
        // a micro-tile waste work on padding.
        double cost = bm + bn;
        if (bm < double(mr)) cost += double(mr) * double(tm);
        if (bn < double(nr)) cost += double(nr) * double(tn);
        if (best_cost < 0 || cost < best_cost) {
            best_cost = cost;
            best = {tm, tn};
        }
    }
    return best;
}

template <class T, class Config>
void gemm_batched(std::size_t batch, transpose ta, transpose tb, std::size_t m, std::size_t n,
                  std::size_t k, const T* a, std::size_t lda, std::size_t stride_a, const T* b,
                  std::size_t ldb, std::size_t stride_b, T* c, std::size_t ldc, std::size_t stride_c,
                  bool accumulate, std::size_t n_threads) {
    if (batch == 0 || m == 0 || n == 0) return;
    if (k == 0) {
        if (!accumulate)
            for (std::size_t g = 0; g < batch; ++g)
                for (std::size_t i = 0; i < m; ++i) std::fill_n(c + g * stride_c + i * ldc, n, T(0));
        return;
    }
    const auto op_of = [&](std::size_t g) {
        return operands<T>{ta, tb, k, a + g * stride_a, lda, b + g * stride_b, ldb, c + g * stride_c, ldc, accumulate};
    };
    // Saturating: the product only has to be compared with a threshold.
    const double work = double(batch) * double(m) * double(n) * double(k);
    const std::size_t by_work = work >= double(max_threads * parallel_threshold)
                                    ? max_threads
                                    : std::size_t(work / double(parallel_threshold));
    const std::size_t threads = std::min(n_threads, std::max<std::size_t>(by_work, 1));
    if (threads <= 1) {
        for (std::size_t g = 0; g < batch; ++g) gemm_block<T, Config>(op_of(g), 0, m, 0, n);
        return;
    }
    // Tasks: every product of the batch cut into the same tm x tn grid of C blocks, enough
    // blocks in all for every thread. Block edges fall on micro-tile boundaries.
    const std::size_t per_product = (threads + batch - 1) / batch;
    const std::pair<std::size_t, std::size_t> grid = thread_grid(per_product, m, n, Config::MR, Config::NR);
    const std::size_t tm = grid.first, tn = grid.second;  // not a structured binding: clang 14 cannot capture one
    const std::size_t bm = ((m + tm - 1) / tm + Config::MR - 1) / Config::MR * Config::MR;
    const std::size_t bn = ((n + tn - 1) / tn + Config::NR - 1) / Config::NR * Config::NR;
    default_thread_pool().parallel_for(batch * tm * tn, threads, [&](std::size_t task) {
        const std::size_t g = task / (tm * tn), r = task % (tm * tn);
        const std::size_t i0 = std::min(m, (r / tn) * bm), j0 = std::min(n, (r % tn) * bn);
        gemm_block<T, Config>(op_of(g), i0, std::min(m, i0 + bm), j0, std::min(n, j0 + bn));
    });
}

}  // namespace gemm_impl

// C[m x n] = (accumulate ? C : 0) + op(A) * op(B), all row-major; op(A) is m x k, op(B) is k x n.
// lda / ldb / ldc are the row strides (in elements) of the stored A, B, C; the stored A is m x k,
// or k x m when ta is transpose::yes (likewise B). C must not overlap A or B. When accumulate is
// false C is only written, so it may hold anything (NaN included). Large products run on the
// shared thread pool (detail::num_threads()). Throws only std::bad_alloc (packing buffers).
template <class T>
void gemm(transpose ta, transpose tb, std::size_t m, std::size_t n, std::size_t k, const T* a,
          std::size_t lda, const T* b, std::size_t ldb, T* c, std::size_t ldc, bool accumulate) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "gemm: float or double");
    gemm_impl::gemm_batched<T, gemm_impl::default_config<T>>(1, ta, tb, m, n, k, a, lda, 0, b, ldb, 0, c, ldc, 0,
                                                             accumulate, num_threads());
}

// `batch` independent products; stride_a / stride_b / stride_c are the element distances between
// consecutive matrices. A stride of 0 broadcasts that operand over the batch (not allowed for C
// unless batch is 1).
template <class T>
void gemm_batched(std::size_t batch, transpose ta, transpose tb, std::size_t m, std::size_t n, std::size_t k,
                  const T* a, std::size_t lda, std::size_t stride_a, const T* b, std::size_t ldb,
                  std::size_t stride_b, T* c, std::size_t ldc, std::size_t stride_c, bool accumulate) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "gemm_batched: float or double");
    gemm_impl::gemm_batched<T, gemm_impl::default_config<T>>(batch, ta, tb, m, n, k, a, lda, stride_a, b, ldb,
                                                             stride_b, c, ldc, stride_c, accumulate, num_threads());
}

}  // namespace typegrad::detail
