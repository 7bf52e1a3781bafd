#pragma once
// Packed, cache-blocked GEMM for float and double (Goto / BLIS structure), row-major:
//
//   for jc in n step NC                    C column block; its B panel is reused by all of m
//     for pc in k step kc                  one rank-kc update (kc: depth_step, up to KC_MAX)
//       pack op(B)[pc.., jc..] -> kc x nc  NR-wide column micro-panels (L2/L3 resident)
//       for ic in m step MC
//         pack op(A)[ic.., pc..] -> mc x kc  MR-tall row micro-panels (L2 resident)
//         for jr in nc step NR             one B micro-panel (kc x NR), reused by ...
//           for ir in mc step MR           ... every A micro-panel of the block
//             micro-kernel: C[MR x NR] (+)= Apanel * Bpanel
//
// Transposes are handled by the packing routines alone. Packing zero-pads the last panels, so
// the micro-kernel always runs a full MR x NR tile; a partial tile goes through a small stack
// buffer. See docs/gemm.md for the blocking parameters and measurements.
//
// Every element of C is the same chain of FMAs (k in order, restarted at each depth block),
// whatever tile or thread computes it, so the threaded result is bitwise identical to the
// serial one.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <new>
#include <type_traits>
#include <utility>

#include <typegrad/core/cpu/simd.hpp>
#include <typegrad/core/cpu/thread_pool.hpp>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace typegrad::detail {

enum class transpose { no, yes };

namespace gemm_impl {

// Register blocking: the micro-tile is MR rows x NV vectors. The accumulators (MR * NV), the NV
// B vectors and one A broadcast must fit the register file: 32 vector registers with AVX-512,
// 16 otherwise (the classic 6 x 2 vectors). With AVX-512, float uses 8 x 2 (8 x 32): 6 x 4,
// 8 x 3, 12 x 2 and 14 x 2 measured the same within noise, and a narrow NR wastes less on
// padding. Double uses 6 x 4 (6 x 32): it loads 10 operands per 24 FMAs instead of 10 per 16,
// which is what double's twice-as-heavy data needs (5-8% faster than 8 x 2 at n >= 1024).
// Cache blocking (tuned on Zen 4: 32 KiB L1d, 1 MiB L2 per core):
//   KC  the depth of one rank-KC update. Large, to amortise the load and store of the C tile
//       over KC FMAs per element; the A and B micro-panels then exceed L1 and stream from L2,
//       which their rate allows (under 16 bytes per FMA cycle; L2 delivers 32 or more). A
//       product's depth is cut into blocks of up to KC_MAX, of equal depth (depth_step).
//   MC  the packed A block (MC x KC) takes about a third (float) or a quarter (double) of L2,
//       leaving room for the B micro-panel in use and the C lines.
//   NC  the packed B panel (KC x NC) lives in L2/L3; wide, so that A is packed once per KC
//       block for all but huge n.
//   NB  when all of m is one MC block, B is packed NB columns at a time instead, each block
//       used by every row right away (gemm_block).
template <class T>
struct default_config {
    static constexpr bool wide_regs = sizeof(simd::batch<T>) == 64;
    static constexpr std::size_t NV = wide_regs && sizeof(T) == 8 ? 4 : 2;
    static constexpr std::size_t MR = wide_regs && sizeof(T) == 4 ? 8 : 6;
    static constexpr std::size_t NR = NV * simd::width<T>;
    static constexpr std::size_t KC = 384;
    static constexpr std::size_t KC_MAX = KC + KC / 8;
    static constexpr std::size_t MC = (sizeof(T) == 4 ? 240 : 96) / MR * MR;
    static constexpr std::size_t NC = 4096 / NR * NR;
    static constexpr std::size_t NB = 4 * NR;  // B's columns packed at a time when m fits one MC block
};

// Straight-line code for the packing loops: f(0_c), f(1_c), ... f(N-1_c). Forced inline: an
// optimiser that declines (GCC at -O3 did, in an earlier lambda-based micro-kernel) would leave
// the loop body as calls through memory.
template <std::size_t... I, class F>
[[gnu::always_inline]] inline void unroll_impl(std::index_sequence<I...>, F&& f) {
    (f(std::integral_constant<std::size_t, I>{}), ...);
}
template <std::size_t N, class F>
[[gnu::always_inline]] inline void unroll(F&& f) {
    unroll_impl(std::make_index_sequence<N>{}, f);
}

// x * y + z, fused where the target has FMA. xsimd 8.1 has no AVX-512 fma kernel: its generic
// fallback is x * y + z over two batch operators, which clang (-ffp-contract=on) does not
// contract. One expression on the native vector type (a GCC/clang vector extension) is
// contracted by clang, but not by GCC under -ffp-contract=off, which the typegrad target sets
// (CMakeLists.txt: fused loops must recompute identical bits): g++ builds then ran every GEMM
// as vmulps + vaddps. So 512-bit registers take the AVX-512 FMA intrinsic (one rounding, with
// both compilers and any contraction setting); elsewhere xsimd::fma is a real FMA instruction
// (or mul + add where the target has none).
template <class V>
[[gnu::always_inline]] inline V fmadd(const V& x, const V& y, const V& z) {
    using R = typename V::register_type;
#if defined(__AVX512F__)
    using E = typename V::value_type;
    if constexpr (sizeof(R) == 64 && std::is_same_v<E, float>)
        return V(_mm512_fmadd_ps(R(x), R(y), R(z)));
    else if constexpr (sizeof(R) == 64 && std::is_same_v<E, double>)
        return V(_mm512_fmadd_pd(R(x), R(y), R(z)));
    else
#endif
    if constexpr (sizeof(R) == 64 && requires(R r) { r * r + r; })
        return V(R(x) * R(y) + R(z));
    else
        return xsimd::fma(x, y, z);
}

// C[MR x NR] = (add ? C : 0) + A * B over kc, where a is a packed MR-row micro-panel
// (a[p * MR + i]) and b a packed NR-column micro-panel (b[p * NR + j]). Written with fold
// expressions over index packs, not lambdas, so that the MR * NV accumulators are plain locals
// the compiler keeps in registers at every optimisation level that inlines at all.
template <class T, std::size_t MR, std::size_t NV>
struct micro_kernel {
    using V = simd::batch<T>;
    static constexpr std::size_t W = simd::width<T>;
    static constexpr std::size_t NR = NV * W;

    static void run(std::size_t kc, const T* a, const T* b, T* c, std::size_t ldc, bool add) {
        tile(kc, a, b, c, ldc, add, std::make_index_sequence<MR * NV>{}, std::make_index_sequence<NV>{},
             std::make_index_sequence<MR>{});
    }

private:
    // I: accumulator (row I / NV, vector I % NV), J: B vector, R: row.
    template <std::size_t... I, std::size_t... J, std::size_t... R>
    [[gnu::always_inline]] static inline void tile(std::size_t kc, const T* a, const T* b, T* c, std::size_t ldc,
                                                   bool add, std::index_sequence<I...>, std::index_sequence<J...>,
                                                   std::index_sequence<R...>) {
        // C is touched only after the k loop: start fetching its lines now, so that the misses
        // (a large C lives in L3 or memory) overlap the FMAs instead of following them.
        (__builtin_prefetch(c + R * ldc, 1, 3), ...);
        (__builtin_prefetch(c + R * ldc + NR - 1, 1, 3), ...);
        V acc[MR * NV] = {(static_cast<void>(I), V(T(0)))...};
        for (std::size_t p = 0; p < kc; ++p, a += MR, b += NR) {
            const V bv[NV] = {simd::load(b + J * W)...};
            ((acc[I] = fmadd(V(a[I / NV]), bv[I % NV], acc[I])), ...);
        }
        if (add)
            (simd::store(c + (I / NV) * ldc + (I % NV) * W,
                         simd::load(static_cast<const T*>(c + (I / NV) * ldc + (I % NV) * W)) + acc[I]),
             ...);
        else
            (simd::store(c + (I / NV) * ldc + (I % NV) * W, acc[I]), ...);
    }
};

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
// The calling thread's packing buffers, or, while a scoped_pack_buffers lives on it, those it
// names: work split by a kernel over the pool gives each of its tasks buffers of its own, which
// grow once whichever thread runs the task (a thread's own would grow whenever it first gets
// a task with larger products: an allocation in a later, steady-state call).
template <class T>
inline thread_buffers<T>*& buffers_override() {
    thread_local thread_buffers<T>* override = nullptr;
    return override;
}
template <class T>
inline thread_buffers<T>& buffers() {
    if (thread_buffers<T>* o = buffers_override<T>()) return *o;
    thread_local thread_buffers<T> bufs;
    return bufs;
}
template <class T>
class scoped_pack_buffers {
public:
    explicit scoped_pack_buffers(thread_buffers<T>& b) : previous_(buffers_override<T>()) { buffers_override<T>() = &b; }
    scoped_pack_buffers(const scoped_pack_buffers&) = delete;
    scoped_pack_buffers& operator=(const scoped_pack_buffers&) = delete;
    ~scoped_pack_buffers() { buffers_override<T>() = previous_; }

private:
    thread_buffers<T>* previous_;
};

// Calls fn(t) for t in [0, n) on up to `threads` threads of the pool (n tasks at once), task t's
// products packing into buffers the calling thread keeps for slot t (scoped_pack_buffers), so
// that they grow in the first call only, whichever thread runs the task. Work a task splits over
// the pool itself runs on the task's thread (the pool is busy).
template <class T, class F>
void parallel_slots(std::size_t n, std::size_t threads, F&& fn) {
    thread_local std::deque<thread_buffers<T>> packing;  // (slot-indexed; grows, never shrinks)
    while (packing.size() < n) packing.emplace_back();
    std::deque<thread_buffers<T>>* const mine = &packing;  // (in a task, `packing` names the worker's)
    default_thread_pool().parallel_for(n, threads, [&](std::size_t t) {
        const scoped_pack_buffers<T> own((*mine)[t]);
        fn(t);
    });
}

// Packing: op(A) and op(B) are cut into micro-panels of R lanes (R = MR rows of op(A), or
// R = NR columns of op(B)) by kc deep, each stored p-major (panel[p * R + lane]) and the panels
// one after the other; lanes past `len` are zero. Which routine applies depends on how the
// stored matrix lays the lanes out: each of its rows holds consecutive lanes (copy), or one
// lane (gather). Loop orders measured on a 384 x 512 float panel (ld 512).

// Lanes are contiguous: row p of src holds lanes 0..len (A transposed, B not transposed).
// Panels are packed in groups spanning at least 64 lanes, row by row: each source row is read
// in runs of whole cache lines, and each panel's output is still written sequentially.
template <class T, std::size_t R>
inline void pack_copy(std::size_t kc, std::size_t len, const T* src, std::size_t ld, T* out) {
    constexpr std::size_t group = R >= 64 ? 1 : 64 / R;
    const std::size_t full = len / R;
    for (std::size_t s0 = 0; s0 < full; s0 += group) {
        const std::size_t s1 = std::min(full, s0 + group);
        const T* row = src + s0 * R;
        for (std::size_t p = 0; p < kc; ++p, row += ld)
            for (std::size_t s = s0; s < s1; ++s)
                std::memcpy(out + s * R * kc + p * R, row + (s - s0) * R, R * sizeof(T));
    }
    if (const std::size_t r = len - full * R; r != 0) {
        const T* row = src + full * R;
        T* dst = out + full * R * kc;
        for (std::size_t p = 0; p < kc; ++p, row += ld, dst += R) {
            std::size_t l = 0;
            for (; l < r; ++l) dst[l] = row[l];
            for (; l < R; ++l) dst[l] = T(0);
        }
    }
}

// Lanes are strided: row l of src holds lane l for p = 0..kc (A not transposed, B transposed).
// Groups of G lanes walk their rows in step: G read streams, G-element runs written (2.3x
// faster than one lane at a time for R = 32, and no slower for R = 8).
// Float lanes in groups of 8 go 8 x 8 blocks at a time through registers: 8 loads of 8 p, a
// transpose, 8 stores of 8 lanes, instead of 64 scalar moves (every row-major A is packed so).
template <class T, std::size_t R>
inline void pack_gather(std::size_t kc, std::size_t len, const T* src, std::size_t ld, T* out) {
    constexpr std::size_t G = R < 8 ? R : 8;
    for (std::size_t l0 = 0; l0 < len; l0 += R, out += R * kc) {
        const std::size_t r = std::min(R, len - l0);
        std::size_t g = 0;
        for (; g + G <= r; g += G) {
            const T* rows = src + (l0 + g) * ld;
            std::size_t p = 0;
            if constexpr (std::is_same_v<T, float> && G == 8)
                for (; p + 8 <= kc; p += 8) simd::transpose_8x8(rows + p, ld, out + p * R + g, R);
            for (; p < kc; ++p) {
                T* dst = out + p * R + g;
                unroll<G>([&](auto l) { dst[l] = rows[l * ld + p]; });
            }
        }
        for (std::size_t l = g; l < r; ++l) {
            const T* row = src + (l0 + l) * ld;
            for (std::size_t p = 0; p < kc; ++p) out[p * R + l] = row[p];
        }
        for (std::size_t l = r; l < R; ++l)
            for (std::size_t p = 0; p < kc; ++p) out[p * R + l] = T(0);
    }
}

// op(A)[0..mc) x [0..kc) into MR-row panels; op(A)(i, p) is a[i * lda + p], or a[p * lda + i].
template <class T, std::size_t MR>
inline void pack_a(transpose ta, std::size_t mc, std::size_t kc, const T* a, std::size_t lda, T* out) {
    if (ta == transpose::yes) pack_copy<T, MR>(kc, mc, a, lda, out);
    else pack_gather<T, MR>(kc, mc, a, lda, out);
}

// op(B)[0..kc) x [0..nc) into NR-column panels; op(B)(p, j) is b[p * ldb + j], or b[j * ldb + p].
template <class T, std::size_t NR>
inline void pack_b(transpose tb, std::size_t kc, std::size_t nc, const T* b, std::size_t ldb, T* out) {
    if (tb == transpose::no) pack_copy<T, NR>(kc, nc, b, ldb, out);
    else pack_gather<T, NR>(kc, nc, b, ldb, out);
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

// The stored operands' packing: op(B)[pc, pc + kc) x [jc, jc + nc) as pack_b does, and
// op(A)[ic, ic + mc) x [pc, pc + kc) as pack_a does.
template <class T, class Config>
struct stored_b {
    const operands<T>& op;
    void operator()(std::size_t pc, std::size_t kc, std::size_t jc, std::size_t nc, T* out) const {
        const T* src = op.tb == transpose::no ? op.b + pc * op.ldb + jc : op.b + jc * op.ldb + pc;
        pack_b<T, Config::NR>(op.tb, kc, nc, src, op.ldb, out);
    }
};
template <class T, class Config>
struct stored_a {
    const operands<T>& op;
    void operator()(std::size_t ic, std::size_t mc, std::size_t pc, std::size_t kc, T* out) const {
        const T* src = op.ta == transpose::no ? op.a + ic * op.lda + pc : op.a + pc * op.lda + ic;
        pack_a<T, Config::MR>(op.ta, mc, kc, src, op.lda, out);
    }
};

// The serial blocked algorithm on the C block [i_begin, i_end) x [j_begin, j_end).
// size_m x size_n is the largest block of the call: buffers are sized for it even when this
// block is a smaller edge block, so that whichever task a thread gets first, it grows once.
// pack(pc, kc, jc, nc, out) packs B's block and pack_a(ic, mc, pc, kc, out) A's, as stored_b and
// stored_a do from stored operands, or from an operand that is never stored (gemm_packed).
// done(i0, i1) is called when C's rows [i0, i1) are final in every column of the block, in order
// (in the last column block, after its last depth block; rows_done).
struct no_rows_done {
    void operator()(std::size_t, std::size_t) const {}
};
// The depth of each rank-kc update of a product of depth k: as few blocks as KC_MAX allows, of
// equal depth (the last shorter by less than the block count). A product of depth 1568 (a
// convolution's weight gradient over two 28 x 28 images) is four blocks of 392, where steps of
// KC gave four of 384 and one of 32: a fifth pass over every C tile (its load and store) for a
// forty-ninth of the work. Every path of a product uses this step, so each element of C is still
// one chain of FMAs whatever tile or thread computes it.
template <class Config>
constexpr std::size_t depth_step(std::size_t k) {
    const std::size_t blocks = (k + Config::KC_MAX - 1) / Config::KC_MAX;
    return blocks <= 1 ? k : (k + blocks - 1) / blocks;
}

// C's block [ic, ic + mc) x [jc, jc + nc) (+)= the packed A block (its mc rows at ap) times the
// packed B block (its nc columns at bp), both kc deep: B's micro-panels in turn, each used by
// every A micro-panel.
template <class T, class Config>
void block_tiles(const operands<T>& op, std::size_t ic, std::size_t mc, std::size_t jc, std::size_t nc, std::size_t kc,
                 const T* ap, const T* bp, bool add) {
    constexpr std::size_t MR = Config::MR, NR = Config::NR, NV = Config::NV;
    alignas(64) T edge[MR * NR];
    for (std::size_t jr = 0; jr < nc; jr += NR) {
        const std::size_t nr = std::min(NR, nc - jr);
        const T* b_panel = bp + jr * kc;
        for (std::size_t ir = 0; ir < mc; ir += MR) {
            const std::size_t mr = std::min(MR, mc - ir);
            const T* a_panel = ap + ir * kc;
            T* c_tile = op.c + (ic + ir) * op.ldc + jc + jr;
            if (mr == MR && nr == NR) {
                micro_kernel<T, MR, NV>::run(kc, a_panel, b_panel, c_tile, op.ldc, add);
            } else {
                // Same FMA chain into a full-size scratch tile, then the same lane-wise add as
                // the full-tile path.
                micro_kernel<T, MR, NV>::run(kc, a_panel, b_panel, edge, NR, false);
                for (std::size_t i = 0; i < mr; ++i)
                    for (std::size_t j = 0; j < nr; ++j)
                        c_tile[i * op.ldc + j] = add ? c_tile[i * op.ldc + j] + edge[i * NR + j] : edge[i * NR + j];
            }
        }
    }
}

template <class T, class Config, class PackB, class PackA, class Done = no_rows_done>
void gemm_block(const operands<T>& op, std::size_t i_begin, std::size_t i_end, std::size_t j_begin,
                std::size_t j_end, std::size_t size_m, std::size_t size_n, const PackB& pack, const PackA& pack_a,
                const Done& done = {}) {
    constexpr std::size_t MR = Config::MR, NR = Config::NR, NV = Config::NV;
    constexpr std::size_t MC = Config::MC, NC = Config::NC;
    static_assert(NR == NV * simd::width<T> && MC % MR == 0 && NC % NR == 0);
    const std::size_t m = i_end - i_begin, n = j_end - j_begin, k = op.k;
    if (m == 0 || n == 0) return;

    thread_buffers<T>& bufs = buffers<T>();
    const std::size_t step = depth_step<Config>(k), kc_max = step;
    T* const bp = bufs.b.get(kc_max * ((std::min(NC, std::max(n, size_n)) + NR - 1) / NR * NR));
    T* const ap = bufs.a.get(kc_max * ((std::min(MC, std::max(m, size_m)) + MR - 1) / MR * MR));

    if (m <= MC) {
        // One row block: A is packed once per depth block, and B a few column panels at a time
        // (NB), each used by every row while it is in L1/L2. Packing the whole kc x nc panel first
        // (up to 1.7 MB of float) wrote it out to L3 and read it back for so few rows: 2-7% on
        // the products of a convolution's forward with 64 or 128 output channels (docs/gemm.md).
        // The same FMA chains in the same order for every element of C: the same bits.
        constexpr std::size_t NB = Config::NB;
        for (std::size_t pc = 0; pc < k; pc += step) {
            const std::size_t kc = std::min(step, k - pc);
            const bool add = op.accumulate || pc > 0;
            pack_a(i_begin, m, pc, kc, ap);
            for (std::size_t jc = j_begin; jc < j_end; jc += NB) {
                const std::size_t nc = std::min(NB, j_end - jc);
                pack(pc, kc, jc, nc, bp);
                block_tiles<T, Config>(op, i_begin, m, jc, nc, kc, ap, bp, add);
            }
        }
        done(i_begin, i_end);
        return;
    }
    for (std::size_t jc = j_begin; jc < j_end; jc += NC) {
        const std::size_t nc = std::min(NC, j_end - jc);
        for (std::size_t pc = 0; pc < k; pc += step) {
            const std::size_t kc = std::min(step, k - pc);
            pack(pc, kc, jc, nc, bp);
            const bool add = op.accumulate || pc > 0;
            for (std::size_t ic = i_begin; ic < i_end; ic += MC) {
                const std::size_t mc = std::min(MC, i_end - ic);
                pack_a(ic, mc, pc, kc, ap);
                block_tiles<T, Config>(op, ic, mc, jc, nc, kc, ap, bp, add);
                if (jc + nc == j_end && pc + kc == k) done(ic, ic + mc);
            }
        }
    }
}

template <class T, class Config>
void gemm_block(const operands<T>& op, std::size_t i_begin, std::size_t i_end, std::size_t j_begin,
                std::size_t j_end, std::size_t size_m, std::size_t size_n) {
    gemm_block<T, Config>(op, i_begin, i_end, j_begin, j_end, size_m, size_n, stored_b<T, Config>{op}, stored_a<T, Config>{op});
}

// A call of fewer multiply-adds than parallel_threshold stays on the calling thread, and each
// thread gets at least min_work_per_thread of them (2^21 take some 20 us on one core). Waking
// the pool and packing per thread cost microseconds: at 2^21 multiply-adds on 2 threads
// (128^3) the process spent 36-39% more CPU time than serially, at 2^24 (256^3) 6-8%.
inline constexpr std::size_t parallel_threshold = std::size_t(1) << 22;
inline constexpr std::size_t min_work_per_thread = std::size_t(1) << 21;

// How many threads a call runs on: n_threads (0: num_threads()), fewer for small products.
inline std::size_t plan_threads(std::size_t batch, std::size_t m, std::size_t n, std::size_t k,
                                std::size_t n_threads) {
    // In double: the product of four sizes can overflow size_t, and is only compared.
    const double work = double(batch) * double(m) * double(n) * double(k);
    if (work < double(parallel_threshold)) return 1;
    if (n_threads == 0) n_threads = num_threads();  // getenv: only for calls that can use it
    const double by_work = std::min(work / double(min_work_per_thread), double(max_threads));
    return std::max<std::size_t>(1, std::min(n_threads, std::size_t(by_work)));
}

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

// ---- Matrix-vector products (n == 1 or m == 1): no packing -------------------------------------
// y[i * incy] = (accumulate ? y[i * incy] : 0) + sum_p M(i, p) x[p * incx] for i in [i0, i1),
// where M(i, p) is a[i * lda + p] (dot form: rows of M are contiguous, one dot product per y)
// or a[p * lda + i] (axpy form: columns of M are contiguous, y grows by x[p] times row p).
// Packing would copy all of M to use each element once; these read M once, in memory order.
//
// Every y element is computed by the same operations whichever rows a call or thread covers
// (fixed accumulator lanes, tails in the same scalar order), so threaded results are bitwise
// equal to serial ones.
enum class gemv_form { dot, axpy };

template <class T>
struct gemv_operands {
    gemv_form form;
    std::size_t k;
    const T* a;
    std::size_t lda;
    const T* x;
    std::size_t incx;
    T* y;
    std::size_t incy;
    bool accumulate;
};

// R rows of the dot form at once: R x 2 accumulators, chunks of 2 W alternate between them.
template <class T, std::size_t R>
[[gnu::always_inline]] inline void gemv_dot_rows(std::size_t k, const T* a, std::size_t lda, const T* x, T* out) {
    using V = simd::batch<T>;
    constexpr std::size_t W = simd::width<T>;
    V acc0[R], acc1[R];
    unroll<R>([&](auto r) { acc0[r] = acc1[r] = V(T(0)); });
    std::size_t p = 0;
    for (; p + 2 * W <= k; p += 2 * W) {
        const V x0 = simd::load(x + p), x1 = simd::load(x + p + W);
        unroll<R>([&](auto r) {
            acc0[r] = fmadd(simd::load(a + r * lda + p), x0, acc0[r]);
            acc1[r] = fmadd(simd::load(a + r * lda + p + W), x1, acc1[r]);
        });
    }
    if (p + W <= k) {
        const V x0 = simd::load(x + p);
        unroll<R>([&](auto r) { acc0[r] = fmadd(simd::load(a + r * lda + p), x0, acc0[r]); });
        p += W;
    }
    unroll<R>([&](auto r) {
        T tail = T(0);
        for (std::size_t q = p; q < k; ++q) tail = std::fma(a[r * lda + q], x[q], tail);
        out[r] = simd::reduce_sum(acc0[r] + acc1[r]) + tail;
    });
}

// NV vectors of y in the axpy form, columns [i, i + NV W): the products of even and odd p go to
// two accumulators (two FMA chains per vector), added at the end.
template <class T, std::size_t NV>
[[gnu::always_inline]] inline void gemv_axpy_cols(std::size_t k, const T* a, std::size_t lda, const T* x, T* out) {
    using V = simd::batch<T>;
    constexpr std::size_t W = simd::width<T>;
    V acc0[NV], acc1[NV];
    unroll<NV>([&](auto v) { acc0[v] = acc1[v] = V(T(0)); });
    std::size_t p = 0;
    for (; p + 2 <= k; p += 2) {
        const V x0(x[p]), x1(x[p + 1]);
        const T* r0 = a + p * lda;
        const T* r1 = r0 + lda;
        unroll<NV>([&](auto v) {
            acc0[v] = fmadd(x0, simd::load(r0 + v * W), acc0[v]);
            acc1[v] = fmadd(x1, simd::load(r1 + v * W), acc1[v]);
        });
    }
    if (p < k) {
        const V x0(x[p]);
        unroll<NV>([&](auto v) { acc0[v] = fmadd(x0, simd::load(a + p * lda + v * W), acc0[v]); });
    }
    unroll<NV>([&](auto v) { simd::store(out + v * W, acc0[v] + acc1[v]); });
}

// One column of the axpy form in scalar code (m < W only): the same two chains and the same
// final add as a lane of gemv_axpy_cols (the same bits wherever fmadd is a fused FMA).
template <class T>
inline T gemv_axpy_scalar(std::size_t k, const T* a, std::size_t lda, const T* x) {
    T s0 = T(0), s1 = T(0);
    std::size_t p = 0;
    for (; p + 2 <= k; p += 2) {
        s0 = std::fma(x[p], a[p * lda], s0);
        s1 = std::fma(x[p + 1], a[(p + 1) * lda], s1);
    }
    if (p < k) s0 = std::fma(x[p], a[p * lda], s0);
    return s0 + s1;
}

template <class T>
inline void gemv_store(const gemv_operands<T>& op, std::size_t i, T v) {
    T& dst = op.y[i * op.incy];
    dst = op.accumulate ? dst + v : v;
}

// Rows [i0, i1) of one matrix-vector product.
template <class T>
void gemv_range(const gemv_operands<T>& op, std::size_t i0, std::size_t i1, std::size_t m) {
    constexpr std::size_t W = simd::width<T>;
    const std::size_t k = op.k;
    const T* x = op.x;
    if (op.incx != 1) {  // a strided x is gathered once (k elements)
        T* xs = buffers<T>().b.get(k);
        for (std::size_t p = 0; p < k; ++p) xs[p] = op.x[p * op.incx];
        x = xs;
    }
    alignas(64) T out[4 * W];
    if (op.form == gemv_form::dot) {
        std::size_t i = i0;
        for (; i + 4 <= i1; i += 4) {
            gemv_dot_rows<T, 4>(k, op.a + i * op.lda, op.lda, x, out);
            for (std::size_t r = 0; r < 4; ++r) gemv_store(op, i + r, out[r]);
        }
        for (; i < i1; ++i) {
            gemv_dot_rows<T, 1>(k, op.a + i * op.lda, op.lda, x, out);
            gemv_store(op, i, out[0]);
        }
        return;
    }
    std::size_t i = i0;
    const auto put = [&](std::size_t from, std::size_t count) {
        for (std::size_t l = 0; l < count; ++l) gemv_store(op, from + l, out[l]);
    };
    for (; i + 4 * W <= i1; i += 4 * W) {
        gemv_axpy_cols<T, 4>(k, op.a + i, op.lda, x, out);
        put(i, 4 * W);
    }
    for (; i + W <= i1; i += W) {
        gemv_axpy_cols<T, 1>(k, op.a + i, op.lda, x, out);
        put(i, W);
    }
    if (i == i1) return;
    if (m >= W) {
        // The last W columns of M as one vector (reading only columns < m), keeping the lanes
        // from i on: every lane computes its column exactly as on the other paths.
        const std::size_t start = m - W;
        gemv_axpy_cols<T, 1>(k, op.a + start, op.lda, x, out);
        for (std::size_t c = i; c < i1; ++c) gemv_store(op, c, out[c - start]);
        return;
    }
    for (; i < i1; ++i) gemv_store(op, i, gemv_axpy_scalar(k, op.a + i, op.lda, x));
}

// A call of fewer elements of M than gemv_parallel_threshold stays on the calling thread: a
// matrix-vector product reads each element once, so waking the pool only pays for large M.
inline constexpr std::size_t gemv_parallel_threshold = std::size_t(1) << 20;
inline constexpr std::size_t gemv_min_per_thread = std::size_t(1) << 19;

// `batch` matrix-vector products: product g has operands of gemv_operands `op` shifted by
// stride_a, stride_x, stride_y; each has m rows.
template <class T>
void gemv_batched(std::size_t batch, std::size_t m, const gemv_operands<T>& op, std::size_t stride_a,
                  std::size_t stride_x, std::size_t stride_y, std::size_t n_threads) {
    const auto op_of = [&](std::size_t g) {
        gemv_operands<T> o = op;
        o.a += g * stride_a;
        o.x += g * stride_x;
        o.y += g * stride_y;
        return o;
    };
    const double work = double(batch) * double(m) * double(op.k);
    std::size_t threads = 1;
    if (work >= double(gemv_parallel_threshold)) {
        if (n_threads == 0) n_threads = num_threads();
        threads = std::max<std::size_t>(
            1, std::min({n_threads, max_threads, std::size_t(work / double(gemv_min_per_thread))}));
    }
    if (threads <= 1) {
        for (std::size_t g = 0; g < batch; ++g) gemv_range(op_of(g), 0, m, m);
        return;
    }
    // Row chunks aligned to the kernels' unit (4 rows, or one vector of columns), so that chunk
    // edges change which kernel computes a row, never how.
    const std::size_t unit = op.form == gemv_form::dot ? 4 : simd::width<T>;
    const std::size_t per_product = (threads + batch - 1) / batch;
    const std::size_t chunk = std::max(unit, ((m + per_product - 1) / per_product + unit - 1) / unit * unit);
    const std::size_t chunks = (m + chunk - 1) / chunk;
    default_thread_pool().parallel_for(batch * chunks, threads, [&](std::size_t task) {
        const std::size_t g = task / chunks, c = task % chunks;
        gemv_range(op_of(g), c * chunk, std::min(m, (c + 1) * chunk), m);
    });
}

// ---- Small products: no packing ------------------------------------------------------------------
// When op(B) fits L1 and the product is small, packing (and the zero-padded MR x NR tiles the
// packed path computes for a 3 x 5 product) costs more than the arithmetic. Here op(B) is copied
// once into a dense row-major buffer padded to whole vectors (k x npad), A is read in place, and
// each C row is NV vectors of one FMA chain over p: the same chain (from 0, p in order, then
// C + acc or acc) as the packed micro-kernel for k <= KC, hence the same bits.
// Measured (float, AVX-512, one core): the direct path wins up to about 20^3 multiply-adds
// (1.4-2x at 4^3 to 16^3), and for outputs at most one vector wide (n <= W: 1.4x at 64 x 8 x 64,
// where packing pads every B panel to NR columns); the packed path wins from 24^3 up.
inline constexpr std::size_t small_max_work = std::size_t(1) << 13;         // m n k
inline constexpr std::size_t small_max_work_narrow = std::size_t(1) << 16;  // m n k when n <= W
inline constexpr std::size_t small_max_b = std::size_t(1) << 12;            // k npad: op(B) in L1

template <class T>
inline bool use_small_path(std::size_t m, std::size_t n, std::size_t k) {
    constexpr std::size_t W = simd::width<T>;
    const std::size_t npad = (n + W - 1) / W * W;
    const double work = double(m) * double(n) * double(k);
    return double(k) * double(npad) <= double(small_max_b) &&
           (work <= double(small_max_work) || (n <= W && work <= double(small_max_work_narrow)));
}

// RM rows x NV vectors of C: RM * NV independent FMA chains over p (one chain per element).
template <class T, std::size_t RM, std::size_t NV>
[[gnu::always_inline]] inline void small_tile(std::size_t k, const T* a, std::size_t si, std::ptrdiff_t sa,
                                              const T* b, std::size_t ldb, T* out) {
    using V = simd::batch<T>;
    constexpr std::size_t W = simd::width<T>;
    V acc[RM][NV];
    unroll<RM>([&](auto r) { unroll<NV>([&](auto v) { acc[r][v] = V(T(0)); }); });
    for (std::size_t p = 0; p < k; ++p) {
        V bv[NV];
        unroll<NV>([&](auto v) { bv[v] = simd::load(b + p * ldb + v * W); });
        unroll<RM>([&](auto r) {
            const V av(a[r * si + std::size_t(std::ptrdiff_t(p) * sa)]);
            unroll<NV>([&](auto v) { acc[r][v] = fmadd(av, bv[v], acc[r][v]); });
        });
    }
    unroll<RM>([&](auto r) { unroll<NV>([&](auto v) { simd::store(out + (r * NV + v) * W, acc[r][v]); }); });
}

template <class T, std::size_t RM>
inline void small_rows(const operands<T>& op, std::size_t i, std::size_t n, std::size_t npad, const T* bp,
                       std::size_t si, std::ptrdiff_t sa) {
    constexpr std::size_t W = simd::width<T>;
    alignas(64) T out[RM * 4 * W];
    const T* a_rows = op.a + i * si;
    for (std::size_t j = 0; j < n; j += 4 * W) {
        const std::size_t left = npad - j, nv = std::min<std::size_t>(4, left / W);
        switch (nv) {
            case 4: small_tile<T, RM, 4>(op.k, a_rows, si, sa, bp + j, npad, out); break;
            case 3: small_tile<T, RM, 3>(op.k, a_rows, si, sa, bp + j, npad, out); break;
            case 2: small_tile<T, RM, 2>(op.k, a_rows, si, sa, bp + j, npad, out); break;
            default: small_tile<T, RM, 1>(op.k, a_rows, si, sa, bp + j, npad, out); break;
        }
        const std::size_t cols = std::min(nv * W, n - j);
        for (std::size_t r = 0; r < RM; ++r) {
            T* c_row = op.c + (i + r) * op.ldc + j;
            const T* o = out + r * nv * W;
            if (op.accumulate)
                for (std::size_t l = 0; l < cols; ++l) c_row[l] = c_row[l] + o[l];
            else
                std::memcpy(c_row, o, cols * sizeof(T));
        }
    }
}

template <class T>
void gemm_small(const operands<T>& op, std::size_t m, std::size_t n) {
    constexpr std::size_t W = simd::width<T>;
    const std::size_t k = op.k, npad = (n + W - 1) / W * W;
    T* bp = buffers<T>().b.get(k * npad);
    for (std::size_t p = 0; p < k; ++p) {
        T* row = bp + p * npad;
        if (op.tb == transpose::no) std::memcpy(row, op.b + p * op.ldb, n * sizeof(T));
        else
            for (std::size_t j = 0; j < n; ++j) row[j] = op.b[j * op.ldb + p];
        std::fill(row + n, row + npad, T(0));
    }
    // op(A)(i, p) = a[i * si + p * sa]
    const std::ptrdiff_t sa = op.ta == transpose::no ? 1 : std::ptrdiff_t(op.lda);
    const std::size_t si = op.ta == transpose::no ? op.lda : 1;
    // 4 rows at a time (up to 16 chains), then the rest one by one
    std::size_t i = 0;
    for (; i + 4 <= m; i += 4) small_rows<T, 4>(op, i, n, npad, bp, si, sa);
    for (; i < m; ++i) small_rows<T, 1>(op, i, n, npad, bp, si, sa);
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
    // Matrix-vector products. n == 1: C's column = op(A) times op(B)'s column. m == 1: C's row,
    // transposed, = op(B)^T times op(A)'s row. The form follows how the matrix is stored.
    if (n == 1 && (m > 1 || ta == transpose::no)) {
        const gemv_operands<T> op{ta == transpose::no ? gemv_form::dot : gemv_form::axpy, k, a, lda, b,
                                  tb == transpose::no ? ldb : 1, c, ldc, accumulate};
        gemv_batched(batch, m, op, stride_a, stride_b, stride_c, n_threads);
        return;
    }
    if (m == 1) {
        const gemv_operands<T> op{tb == transpose::yes ? gemv_form::dot : gemv_form::axpy, k, b, ldb, a,
                                  ta == transpose::no ? 1 : lda, c, 1, accumulate};
        gemv_batched(batch, n, op, stride_b, stride_a, stride_c, n_threads);
        return;
    }
    const auto op_of = [&](std::size_t g) {
        return operands<T>{ta, tb, k, a + g * stride_a, lda, b + g * stride_b, ldb, c + g * stride_c, ldc,
                           accumulate};
    };
    if (use_small_path<T>(m, n, k)) {
        // Small products: serial each; a large batch of them is split across threads by product.
        const double work = double(batch) * double(m) * double(n) * double(k);
        std::size_t threads = 1;
        if (work >= double(parallel_threshold)) {
            if (n_threads == 0) n_threads = num_threads();
            threads = std::max<std::size_t>(
                1, std::min({n_threads, max_threads, std::size_t(work / double(min_work_per_thread))}));
        }
        if (threads <= 1) {
            for (std::size_t g = 0; g < batch; ++g) gemm_small(op_of(g), m, n);
        } else {
            const std::size_t per_task = (batch + threads * 4 - 1) / (threads * 4);
            default_thread_pool().parallel_for((batch + per_task - 1) / per_task, threads, [&](std::size_t t) {
                for (std::size_t g = t * per_task; g < std::min(batch, (t + 1) * per_task); ++g)
                    gemm_small(op_of(g), m, n);
            });
        }
        return;
    }
    const std::size_t threads = plan_threads(batch, m, n, k, n_threads);
    if (threads <= 1) {
        for (std::size_t g = 0; g < batch; ++g) gemm_block<T, Config>(op_of(g), 0, m, 0, n, m, n);
        return;
    }
    // Tasks: every product of the batch cut into the same tm x tn grid of C blocks, enough
    // blocks in all for every thread. Block edges fall on micro-tile boundaries.
    const std::size_t per_product = (threads + batch - 1) / batch;
    const std::pair<std::size_t, std::size_t> grid = thread_grid(per_product, m, n, Config::MR, Config::NR);
    const std::size_t tm = grid.first, tn = grid.second;  // clang 14 cannot capture structured bindings
    const std::size_t bm = ((m + tm - 1) / tm + Config::MR - 1) / Config::MR * Config::MR;
    const std::size_t bn = ((n + tn - 1) / tn + Config::NR - 1) / Config::NR * Config::NR;
    default_thread_pool().parallel_for(batch * tm * tn, threads, [&](std::size_t task) {
        const std::size_t g = task / (tm * tn), r = task % (tm * tn);
        const std::size_t i0 = std::min(m, (r / tn) * bm), j0 = std::min(n, (r % tn) * bn);
        gemm_block<T, Config>(op_of(g), i0, std::min(m, i0 + bm), j0, std::min(n, j0 + bn), bm, bn);
    });
}

// gemm_batched's product for batch 1 where an operand is never stored: pack_b or pack_a (as
// gemm_block's) writes its panels straight from the data the operand stands for (a
// convolution's input: ops/conv.hpp), so it is not written out and read back before it is
// packed. The same blocks, threads and micro-kernel as stored operands: the same bits as gemm
// over operands that hold the values the packers write.
template <class T, class Config, class PackB, class PackA>
void gemm_packed(const operands<T>& op, std::size_t m, std::size_t n, std::size_t n_threads, const PackB& pack,
                 const PackA& pack_a) {
    const std::size_t k = op.k;
    if (m == 0 || n == 0) return;
    if (k == 0) {
        if (!op.accumulate)
            for (std::size_t i = 0; i < m; ++i) std::fill_n(op.c + i * op.ldc, n, T(0));
        return;
    }
    const std::size_t threads = plan_threads(1, m, n, k, n_threads);
    if (threads <= 1) {
        gemm_block<T, Config>(op, 0, m, 0, n, m, n, pack, pack_a);
        return;
    }
    const std::pair<std::size_t, std::size_t> grid = thread_grid(threads, m, n, Config::MR, Config::NR);
    const std::size_t tm = grid.first, tn = grid.second;
    const std::size_t bm = ((m + tm - 1) / tm + Config::MR - 1) / Config::MR * Config::MR;
    const std::size_t bn = ((n + tn - 1) / tn + Config::NR - 1) / Config::NR * Config::NR;
    default_thread_pool().parallel_for(tm * tn, threads, [&](std::size_t r) {
        const std::size_t i0 = std::min(m, (r / tn) * bm), j0 = std::min(n, (r % tn) * bn);
        gemm_block<T, Config>(op, i0, std::min(m, i0 + bm), j0, std::min(n, j0 + bn), bm, bn, pack, pack_a);
    });
}

}  // namespace gemm_impl

// C[m x n] = (accumulate ? C : 0) + op(A) * op(B), all row-major; op(A) is m x k, op(B) is k x n.
// lda / ldb / ldc are the row strides (in elements) of the stored A, B, C; the stored A is m x k,
// or k x m when ta is transpose::yes (likewise B). C must not overlap A or B. When accumulate is
// false C is only written, so it may hold anything (NaN included). Large products run on the
// shared thread pool (detail::num_threads()). Throws only std::bad_alloc (packing buffers).
// n_threads caps the threads (0: num_threads()).
template <class T>
void gemm(transpose ta, transpose tb, std::size_t m, std::size_t n, std::size_t k, const T* a,
          std::size_t lda, const T* b, std::size_t ldb, T* c, std::size_t ldc, bool accumulate,
          std::size_t n_threads = 0) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "typegrad: internal: gemm takes float or double (bf16/f16: gemm_half.hpp)");
    gemm_impl::gemm_batched<T, gemm_impl::default_config<T>>(1, ta, tb, m, n, k, a, lda, 0, b, ldb, 0, c, ldc, 0,
                                                             accumulate, n_threads);
}

// `batch` independent products; stride_a / stride_b / stride_c are the element distances between
// consecutive matrices. A stride of 0 broadcasts that operand over the batch (not allowed for C
// unless batch is 1).
template <class T>
void gemm_batched(std::size_t batch, transpose ta, transpose tb, std::size_t m, std::size_t n, std::size_t k,
                  const T* a, std::size_t lda, std::size_t stride_a, const T* b, std::size_t ldb,
                  std::size_t stride_b, T* c, std::size_t ldc, std::size_t stride_c, bool accumulate) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "typegrad: internal: gemm_batched takes float or double (bf16/f16: gemm_half.hpp)");
    gemm_impl::gemm_batched<T, gemm_impl::default_config<T>>(batch, ta, tb, m, n, k, a, lda, stride_a, b, ldb,
                                                             stride_b, c, ldc, stride_c, accumulate, 0);
}

// C[m x n] = (accumulate ? C : 0) + op(A) * op(B) as gemm on the calling thread alone, calling
// done(i0, i1) as soon as C's rows [i0, i1) are final, in order, blocks of at most 72 rows: a
// caller consumes C while its rows are in cache (a convolution's col2im, ops/conv.hpp; for n up
// to one column block, 4096, past which the rows come only in the last column block).
// The same bits as gemm.
template <class T>
struct rows_config : gemm_impl::default_config<T> {
    static constexpr std::size_t MC = 72;
};
template <class T, class Done>
void gemm_rows(transpose ta, transpose tb, std::size_t m, std::size_t n, std::size_t k, const T* a, std::size_t lda,
               const T* b, std::size_t ldb, T* c, std::size_t ldc, bool accumulate, const Done& done) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "typegrad: internal: gemm_rows takes float or double");
    using config = rows_config<T>;
    if (m == 0 || n == 0) return;
    if (k == 0 || m == 1 || n == 1 || gemm_impl::use_small_path<T>(m, n, k)) {  // gemm's other paths, whole
        gemm(ta, tb, m, n, k, a, lda, b, ldb, c, ldc, accumulate, 1);
        done(0, m);
        return;
    }
    const gemm_impl::operands<T> op{ta, tb, k, a, lda, b, ldb, c, ldc, accumulate};
    gemm_impl::gemm_block<T, config>(op, 0, m, 0, n, m, n, gemm_impl::stored_b<T, config>{op}, gemm_impl::stored_a<T, config>{op}, done);
}

// The width of the column panels gemm_packed_b's pack writes (NR), the height of the row panels
// gemm_packed_a's pack writes (MR), and the greatest depth either is asked for (KC_MAX).
template <class T>
inline constexpr std::size_t gemm_panel_width = gemm_impl::default_config<T>::NR;
template <class T>
inline constexpr std::size_t gemm_panel_height = gemm_impl::default_config<T>::MR;
template <class T>
inline constexpr std::size_t gemm_panel_depth = gemm_impl::default_config<T>::KC_MAX;

// C[m x n] = (accumulate ? C : 0) + op(A) * B, B (k x n) packed by pack(pc, kc, jc, nc, out): the
// rows [pc, pc + kc) and columns [jc, jc + nc) of B as gemm_panel_width<T>-column panels, one after
// the other, each p-major (panel[p * width + lane]), lanes past nc zero. pack is called from
// several threads at once for different blocks. n_threads caps the threads (0: num_threads()).
template <class T, class PackB>
void gemm_packed_b(transpose ta, std::size_t m, std::size_t n, std::size_t k, const T* a, std::size_t lda,
                   const PackB& pack, T* c, std::size_t ldc, bool accumulate, std::size_t n_threads = 0) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "typegrad: internal: gemm_packed_b takes float or double");
    using config = gemm_impl::default_config<T>;
    const gemm_impl::operands<T> op{ta, transpose::no, k, a, lda, nullptr, 0, c, ldc, accumulate};
    gemm_impl::gemm_packed<T, config>(op, m, n, n_threads, pack, gemm_impl::stored_a<T, config>{op});
}
// C[m x n] = (accumulate ? C : 0) + A * op(B), A (m x k) packed by pack(ic, mc, pc, kc, out): the
// rows [ic, ic + mc) and columns [pc, pc + kc) of A as gemm_panel_height<T>-row panels, one after
// the other, each p-major (panel[p * height + lane]), lanes past mc zero. As gemm_packed_b's.
template <class T, class PackA>
void gemm_packed_a(transpose tb, std::size_t m, std::size_t n, std::size_t k, const PackA& pack, const T* b, std::size_t ldb,
                   T* c, std::size_t ldc, bool accumulate, std::size_t n_threads = 0) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "typegrad: internal: gemm_packed_a takes float or double");
    using config = gemm_impl::default_config<T>;
    const gemm_impl::operands<T> op{transpose::no, tb, k, nullptr, 0, b, ldb, c, ldc, accumulate};
    gemm_impl::gemm_packed<T, config>(op, m, n, n_threads, gemm_impl::stored_b<T, config>{op}, pack);
}

}  // namespace typegrad::detail
