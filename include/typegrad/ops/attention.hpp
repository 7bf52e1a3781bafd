#pragma once
// Attention: causal_mask(x) (masked_fill of the elements above a diagonal of the last two axes)
// and scaled_dot_product_attention(q, k, v) (torch.nn.functional.scaled_dot_product_attention):
//
//   softmax(q k^T * scale + mask) v,   scale = 1 / sqrt(d) by default (d: q's last extent)
//
// with an optional causal mask (tg::causal: query i sees keys j <= i, PyTorch's is_causal,
// top-left aligned when Tq != Tk) or an additive float mask (PyTorch's float attn_mask).
//
// With q, k and v of one dtype and one rank and no tensor mask, attention is one fused kernel op
// (attention_op below, flash-style: nothing T x T is kept for the backward, which recomputes the
// probabilities block by block). Otherwise, or with tg::attention_math (PyTorch's math backend),
// it is a composite: two matmuls (kernel boundaries; k^T is a transposed view handed to the GEMM
// as a flag), the mask, and the library's softmax (shifted by its detached row maximum, so large
// logits do not overflow), whose backward can be differentiated again. A masked logit is -inf,
// so its probability is exactly 0 and no gradient reaches it; a row whose logits are all -inf
// gives NaN, as in PyTorch.
//
// causal_mask is a kernel op (it needs the element's row and column, which the fused elementwise
// loops do not have); its VJP is the same mask filling 0, so a NaN or inf in the incoming
// gradient of a masked element does not leak. Its device kernel sits beside it.
//
// Autocast: the fused op is lower precision (computing in f32, its output rounded once); in the
// composite the matmuls are lower precision (the scores and the output then round to the spec's
// dtype), softmax follows its own class; the mask keeps its input's dtype.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

#include <typegrad/core/cpu/buffer_pool.hpp>
#include <typegrad/core/cpu/gemm.hpp>
#include <typegrad/core/cpu/simd.hpp>
#include <typegrad/core/cpu/thread_pool.hpp>
#include <typegrad/core/device_kernel.hpp>
#include <typegrad/core/error.hpp>
#include <typegrad/ops/arithmetic.hpp>
#include <typegrad/ops/log_sum_exp.hpp>
#include <typegrad/ops/matmul.hpp>
#include <typegrad/ops/op_base.hpp>
#include <typegrad/ops/view.hpp>

namespace typegrad {

// scaled_dot_product_attention(q, k, v, tg::causal)
struct causal_t {
    explicit constexpr causal_t() = default;
};
// Pass to tg::scaled_dot_product_attention for a causal mask (PyTorch: is_causal=True).
inline constexpr causal_t causal{};
// scaled_dot_product_attention(q, k, v[, tg::causal], tg::attention_math)
struct attention_math_t {
    explicit constexpr attention_math_t() = default;
};
// Pass (last) to tg::scaled_dot_product_attention for the composite instead of the fused op
// (PyTorch's SDPBackend.MATH): its backward can be differentiated again.
inline constexpr attention_math_t attention_math{};

namespace detail {

// out[..., i, j] = j > i + Diagonal ? fill : x[..., i, j]
template <std::int64_t Diagonal, std::uint64_t FillBits>
struct causal_fill_op : kernel_op_base {
    static constexpr const char* name = "causal_mask";
    // the device kernel: one thread per element
    static constexpr const char* device_source = R"CUDA(
// causal_mask. w: out, diagonal, fill (double bits), x ref
template <int T, int V, int B> __device__ void tg_causal_fill(const tg_node_args& p) {
    typename tg_ty<T>::S* out = (typename tg_ty<T>::S*)p.w[0];
    const tg_i64 diagonal = (tg_i64)p.w[1];
    const typename tg_ty<T>::S fill = tg_ty<T>::to((typename tg_ty<T>::C)(typename tg_ty<V>::C)tg_double_bits(p.w[2]));
    const tg_ref x = tg_ref_at(p, 3);
    const typename tg_ty<B>::S* xp = (const typename tg_ty<B>::S*)x.p;
    const tg_i64 rows = (tg_i64)x.ext[x.rank - 2], cols = (tg_i64)x.ext[x.rank - 1];
    TG_GRID_LOOP(e, tg_numel(x)) {
        const tg_i64 j = e % cols, i = (e / cols) % rows;
        out[e] = j <= i + diagonal ? tg_cvt<T, V, B>(xp[tg_ref_offset(x, e)]) : fill;
    }
}
)CUDA";
    template <class N>
    static std::string device_call() {
        using X = type_at_t<0, typename N::children>;
        return device_template_call("tg_causal_fill", {device_type_code<buffer_t<N>>(), device_type_code<typename X::value_type>(),
                                                       device_type_code<buffer_t<X>>()});
    }
    template <class N, class Ref>
    static std::size_t device_words(const Ref* in, void* out, const std::size_t* ext, std::uint64_t* w, void*) {
        w[0] = device_word(out);
        w[1] = std::uint64_t(Diagonal);
        w[2] = FillBits;
        put_device_ref(w, 3, in[0]);
        std::size_t n = 1;
        for (std::size_t a = 0; a < in[0].rank; ++a) n *= ext[a];
        return n;
    }
    static constexpr bool differentiable = true;
    static constexpr bool shape_only(std::size_t) { return false; }
    static constexpr double fill = std::bit_cast<double>(FillBits);
    template <class X>
    struct rule {
        using value_type = typename X::value_type;
        using shape_type = typename X::shape_type;
    };
    template <class N, class Ref>
    static void extents(const Ref* in, std::size_t* ext) {
        for (std::size_t a = 0; a < in[0].rank; ++a) ext[a] = in[0].ext[a];
    }
    template <class N, class Ref, class T>
    static void run(const Ref* in, T* out, const std::size_t* ext) {
        using X = type_at_t<0, typename N::children>;
        using B = buffer_t<X>;
        using V = typename X::value_type;
        const Ref& x = in[0];
        const std::size_t r = x.rank, rows = ext[r - 2], cols = ext[r - 1];
        std::size_t mats = 1;
        for (std::size_t a = 0; a + 2 < r; ++a) mats *= ext[a];
        const auto* xp = static_cast<const B*>(x.data);
        const T f = T(static_cast<compute_t<V>>(fill));
        const std::ptrdiff_t sc = x.stride[r - 1];
        for (std::size_t m = 0; m < mats; ++m)
            for (std::size_t i = 0; i < rows; ++i) {
                const std::size_t row = m * rows + i;
                const B* src = xp + strided_offset(x, row * cols);
                T* o = out + row * cols;
                // columns j <= i + Diagonal keep x (none when i + Diagonal < 0)
                const std::int64_t last = std::int64_t(i) + Diagonal;
                const std::size_t keep =
                    last < 0 ? 0 : std::size_t(last) + 1 < cols ? std::size_t(last) + 1 : cols;
                for (std::size_t j = 0; j < keep; ++j) o[j] = convert_element<T, V>(src[std::ptrdiff_t(j) * sc]);
                for (std::size_t j = keep; j < cols; ++j) o[j] = f;
            }
    }
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X) {
        return make_node<causal_fill_op<Diagonal, std::bit_cast<std::uint64_t>(0.0)>>(g);
    }
};

// [b, h, t, d] as [b * h, t, d] (one dynamic extent at most, reshape's rule)
template <class S>
using heads_flattened_t =
    shape<(S::extents[0] == dyn || S::extents[1] == dyn ? dyn : S::extents[0] * S::extents[1]), S::extents[2],
          S::extents[3]>;
template <class S>
constexpr bool heads_flattenable() {
    if constexpr (S::rank != 4) return true;
    else return heads_flattened_t<S>::dyn_count <= 1;
}
template <class S>
inline constexpr bool heads_flattenable_v = heads_flattenable<S>();

template <class Q, class K, class V>
constexpr bool attention_ranks_ok() {
    constexpr std::size_t rq = Q::shape_type::rank, rk = K::shape_type::rank, rv = V::shape_type::rank;
    if (rq < 2 || rq > 4 || rk < 2 || rk > 4 || rv < 2 || rv > 4) return false;
    if (rq == 4 || rk == 4 || rv == 4) return rq == 4 && rk == 4 && rv == 4;
    return true;
}
template <class SA, class SB, std::size_t AxA, std::size_t AxB>
constexpr bool extents_agree() {
    constexpr std::size_t a = SA::extents[SA::rank - AxA], b = SB::extents[SB::rank - AxB];
    return a == dyn || b == dyn || a == b;
}

// sqrt(d) correctly rounded for an integer 1 <= d < 2^20, as a constant expression (std::sqrt is
// not constexpr under clang; g++ folds it as a builtin): Newton's iteration gets within an ulp, then
// the candidate whose rounding interval holds sqrt(d) is picked in exact integer arithmetic
// ((c +- ulp/2)^2 against d, scaled to integers below 2^110).
__extension__ typedef unsigned __int128 attention_u128;
constexpr bool sqrt_below(double c, std::uint64_t d, int side) {
    // is d < (c + side * ulp(c) / 2)^2 ? (c = C * 2^k, C the 53-bit significand)
    const std::uint64_t bits = std::bit_cast<std::uint64_t>(c);
    const int k = int((bits >> 52) & 0x7FF) - 1075;
    const std::uint64_t C = (bits & ((std::uint64_t(1) << 52) - 1)) | (std::uint64_t(1) << 52);
    const attention_u128 m = attention_u128(2 * C + std::uint64_t(side > 0 ? 1 : 0)) - (side < 0 ? 1 : 0);
    // m * 2^(k-1) is the interval's end; compare m^2 with d * 2^(2 - 2k) (k < 0 here)
    return attention_u128(d) << (2 - 2 * k) < m * m;
}
constexpr double sqrt_of_integer(std::uint64_t d) {
    double r = double(d);
    for (int i = 0; i < 100; ++i) r = 0.5 * (r + double(d) / r);
    for (int i = 0; i < 4; ++i) {
        if (!sqrt_below(r, d, +1)) r = std::bit_cast<double>(std::bit_cast<std::uint64_t>(r) + 1);
        else if (sqrt_below(r, d, -1)) r = std::bit_cast<double>(std::bit_cast<std::uint64_t>(r) - 1);
        else break;
    }
    return r;
}
template <class Q>
constexpr double default_attention_scale() {
    constexpr std::size_t d = Q::shape_type::extents[Q::shape_type::rank - 1];
    static_assert(d < (std::size_t(1) << 20), "typegrad: scaled_dot_product_attention(q, k, v): d is too large for "
                                                "the default scale; give the scale explicitly.");
    return 1.0 / sqrt_of_integer(d);
}

// The attention of rank 2 or 3 operands; Masker(scores) applies the mask.
template <num Scale, expression Q, expression K, expression V, class Masker>
constexpr auto attention_core(Q q, K k, V v, Masker masker) {
    auto scores = masker(::typegrad::matmul(q, ::typegrad::transpose(k)) * lit<Scale>);
    return ::typegrad::matmul(::typegrad::softmax(scores, axes<-1>), v);
}

template <num Scale, expression Q, expression K, expression V, class Masker>
constexpr auto attention(Q q, K k, V v, Masker masker) {
    using SQ = typename Q::shape_type;
    if constexpr (SQ::rank == 4) {
        using SV = typename V::shape_type;
        static_assert(heads_flattenable_v<SQ> && heads_flattenable_v<typename K::shape_type> && heads_flattenable_v<SV>,
                      "typegrad: scaled_dot_product_attention(q, k, v) of rank 4 through the composite (a mask, "
                      "tg::attention_math, mixed dtypes) flattens [batch, heads] into one axis and can infer one "
                      "dynamic extent: make batch and heads static, or T and d static.");
        using out_shape = shape<SQ::extents[0], SQ::extents[1], SQ::extents[2], SV::extents[3]>;
        auto o = attention_core<Scale>(::typegrad::reshape<heads_flattened_t<SQ>>(q),
                                       ::typegrad::reshape<heads_flattened_t<typename K::shape_type>>(k),
                                       ::typegrad::reshape<heads_flattened_t<SV>>(v), masker);
        static_assert(out_shape::dyn_count <= 1,
                      "typegrad: scaled_dot_product_attention(q, k, v) of rank 4 can infer one dynamic extent of "
                      "its result [batch, heads, T, dv]: make more of them static.");
        return ::typegrad::reshape<out_shape>(o);
    } else {
        return attention_core<Scale>(q, k, v, masker);
    }
}

// ---- the fused (flash-style) attention: no T x T kept for the backward -----------------------
// scaled_dot_product_attention(q, k, v[, tg::causal]) with q, k, v of one dtype and one rank is
// one kernel op. Per batch matrix (the leading axes flattened) and per block of
// attention_block_rows queries, the block's scores (rows x its keys, causal blocks only up to the
// diagonal) are one GEMM, a row softmax in the compute dtype, then P V a second GEMM. Nothing
// T x T outlives the block: the backward (attention_backward_op) recomputes each block's
// probabilities from q and k, forms dP = g v^T, dS = P (dP - rowsum(P dP)) and accumulates
// dV += P^T g, dK += dS^T q, dQ = dS k: five GEMMs per block, the three gradients packed in one
// buffer (attention_grad_part_op: views of it). Batch matrices go over the thread pool (their
// GEMMs then run serially; one matrix: its GEMMs use the pool). Operands of any strides (the
// heads of a [B, T, H, d] projection viewed as [B, H, T, d]) are read in place when their rows are
// unit-stride arrays of the compute dtype, else copied; bf16/f16 compute in f32 and round the
// result once (the composite rounds the scores and the probabilities too).
// The composite (detail::attention) stays for tensor masks, mixed dtypes or ranks and
// tg::attention_math; its backward is differentiable again, the fused one is not (as PyTorch's
// flash attention: grad of grad takes the math path).
inline constexpr std::size_t attention_block_rows = 64;

struct attention_dims {
    std::size_t n, tq, tk, d, dv;  // n: batch matrices (the product of the leading extents)
};
template <class Ref>
attention_dims attention_dims_of(const Ref* in, const char* what) {
    const std::size_t r = in[0].rank;
    attention_dims a{1, in[0].ext[r - 2], in[1].ext[r - 2], in[0].ext[r - 1], in[2].ext[r - 1]};
    for (std::size_t x = 0; x + 2 < r; ++x) {
        if (in[1].ext[x] != in[0].ext[x] || in[2].ext[x] != in[0].ext[x])
            fail<shape_error>({"typegrad: ", what, ": q, k and v must have the same leading (batch, heads) extents; "
                               "to broadcast them use tg::attention_math"});
        a.n *= in[0].ext[x];
    }
    if (in[1].ext[r - 1] != a.d)
        fail<shape_error>({"typegrad: ", what, ": q's and k's last extents (d) differ: ", a.d, " and ", in[1].ext[r - 1]});
    if (in[2].ext[r - 2] != a.tk)
        fail<shape_error>({"typegrad: ", what, ": k and v have different numbers of keys: ", a.tk, " and ",
                           in[2].ext[r - 2]});
    return a;
}

// Batch matrix b of a rank-r operand (rows x cols, the leading axes flattened) as a row-major
// array of C with row stride ld: the operand itself when it is one, else a copy into `copy`.
template <class C, class V, class B, class Ref>
const C* attention_matrix(const Ref& x, std::size_t b, C* copy, std::size_t& ld) {
    const std::size_t r = x.rank, rows = x.ext[r - 2], cols = x.ext[r - 1];
    std::ptrdiff_t off = 0;
    for (std::size_t a = r - 2; a-- > 0;) {
        off += std::ptrdiff_t(b % x.ext[a]) * x.stride[a];
        b /= x.ext[a];
    }
    const B* p = static_cast<const B*>(x.data) + off;
    const std::ptrdiff_t rs = x.stride[r - 2], cs = x.stride[r - 1];
    ld = cols > 0 ? cols : 1;
    if constexpr (std::is_same_v<B, C>)
        if ((cols <= 1 || cs == 1) && (rows <= 1 || rs >= std::ptrdiff_t(cols))) {
            if (rows > 1) ld = std::size_t(rs);
            return p;
        }
    for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < cols; ++j)
            copy[i * cols + j] = convert_element<C, V>(p[std::ptrdiff_t(i) * rs + std::ptrdiff_t(j) * cs]);
    return copy;
}

// row[0, seen) = softmax(row * scale), as the library's softmax: shifted by the row's maximum (NaN
// rows stay NaN, a row of -inf gives NaN). row[seen, keys), the causally masked keys, get the
// composite's exp(-inf - max) / sum: 0, or NaN where the maximum is not finite.
template <class C>
void attention_softmax_row(C* row, std::size_t seen, std::size_t keys, C scale) {
    using Bt = simd::batch<C>;
    constexpr std::size_t w = simd::width<C>;
    C m = -std::numeric_limits<C>::infinity();
    std::size_t j = 0;
    if (seen >= w) {
        Bt mv(m);
        for (; j + w <= seen; j += w) {
            const Bt x = simd::load(row + j) * Bt(scale);
            simd::store(row + j, x);
            mv = simd::max(mv, x);
        }
        m = simd::reduce_max(mv);
    }
    for (; j < seen; ++j) m = simd::max(m, row[j] *= scale);
    C sum = 0;
    j = 0;
    if (seen >= w) {
        Bt sv(C(0));
        for (; j + w <= seen; j += w) {
            const Bt e = simd::exp(simd::load(row + j) - Bt(m));
            simd::store(row + j, e);
            sv += e;
        }
        sum = simd::reduce_sum(sv);
    }
    for (; j < seen; ++j) sum += (row[j] = std::exp(row[j] - m));
    const C inv = C(1) / sum;
    j = 0;
    for (; j + w <= seen; j += w) simd::store(row + j, simd::load(row + j) * Bt(inv));
    for (; j < seen; ++j) row[j] *= inv;
    std::fill(row + seen, row + keys, std::isfinite(m) ? C(0) : std::numeric_limits<C>::quiet_NaN());
}

// A block's probabilities: rows queries from i0 (q's rows, row stride ldq) against the first
// `keys` keys, into s [rows x keys]: S = q k^T, then each row's softmax (its causal keys seen).
template <bool Causal, class C>
void attention_block_probabilities(const attention_dims& a, const C* q, std::size_t ldq, const C* k, std::size_t ldk, C* s,
                                   std::size_t i0, std::size_t rows, std::size_t keys, C scale) {
    if (a.d == 0) std::fill_n(s, rows * keys, C(0));
    else gemm(transpose::no, transpose::yes, rows, keys, a.d, q + i0 * ldq, ldq, k, ldk, s, keys, false);
    for (std::size_t i = 0; i < rows; ++i)
        attention_softmax_row(s + i * keys, Causal ? std::min(a.tk, i0 + i + 1) : a.tk, keys, scale);
}

// The largest |x| of a rows x cols matrix (row stride ld), as a double; inf where one is not
// finite (NaN included).
template <class C>
double attention_max_abs(const C* m, std::size_t rows, std::size_t cols, std::size_t ld) {
    using Bt = simd::batch<C>;
    constexpr std::size_t w = simd::width<C>;
    Bt acc(C(0)), bad(C(0));
    C tail = 0, tail_bad = 0;
    for (std::size_t i = 0; i < rows; ++i) {
        const C* r = m + i * ld;
        std::size_t j = 0;
        for (; j + w <= cols; j += w) {
            const Bt x = simd::load(r + j);
            acc = simd::max(acc, simd::abs(x));
            bad += x * Bt(C(0));  // NaN from an infinity or NaN
        }
        for (; j < cols; ++j) {
            tail = simd::max(tail, std::abs(r[j]));
            tail_bad += r[j] * C(0);
        }
    }
    if (simd::reduce_sum(bad) + tail_bad != C(0)) return std::numeric_limits<double>::infinity();
    return std::max(double(simd::reduce_max(acc)), double(tail));
}
// Whether the causal blocks may stop at the diagonal: the composite multiplies a masked key's
// zero probability by its value and its zero score gradient by k and q, so an infinity or NaN
// there reaches rows that do not see the key (0 * inf); so may an overflowing score (a row
// maximum of inf: the masked probabilities are NaN) or score gradient (0 * inf). Where none of
// that can happen the skipped terms are exact zeros.
inline bool attention_bounded(double a, double b, std::size_t n, double scale, double most) {
    return a * b * double(n) * std::abs(scale) < 0.25 * most;
}

// Runs fn(slot, b0, b1) over batch matrices [0, n) in contiguous ranges (one slot of scratch
// each), on the pool when the work is large enough; every matrix is computed alone, so the
// results do not depend on the thread count. On the pool, slot t's GEMMs pack into buffers kept
// for slot t by the calling thread (gemm_impl::scoped_pack_buffers), so that they grow in the
// first step only, whichever thread runs the slot.
template <class C>
struct attention_batches {
    std::size_t n, threads = 1, per = 1, slots = 1;
    attention_batches(std::size_t n_, std::size_t cost) : n(n_), per(n_ > 0 ? n_ : 1) {
        const std::size_t work = n * cost;
        if (n > 1 && work >= parallel_min_work) threads = num_threads();
        if (threads > 1) {
            const std::size_t tasks = parallel_tasks(n, work, threads);
            per = (n + tasks - 1) / tasks;
            slots = (n + per - 1) / per;
        }
    }
    template <class F>
    void run(F&& fn) const {
        if (slots == 1) return fn(std::size_t(0), std::size_t(0), n);
        gemm_impl::parallel_slots<C>(slots, threads, [&](std::size_t t) { fn(t, t * per, std::min(n, (t + 1) * per)); });
    }
};

// The forward: out [n, tq, dv] (row-major) from q, k, v.
template <bool Causal, class C, class T, class VQ, class BQ, class VK, class BK, class VV, class BV, class Ref>
void attention_forward(const Ref* in, T* out, C scale) {
    const attention_dims a = attention_dims_of(in, "scaled_dot_product_attention(q, k, v)");
    if (a.n * a.tq * a.dv == 0) return;
    constexpr std::size_t blk = attention_block_rows;
    constexpr bool direct = std::is_same_v<T, C>;
    const std::size_t s_at = 0, q_at = s_at + blk * a.tk, k_at = q_at + a.tq * a.d, v_at = k_at + a.tk * a.d,
                      o_at = v_at + a.tk * a.dv, per_slot = o_at + (direct ? 0 : blk * a.dv);
    const attention_batches<C> batches(a.n, 2 * a.tq * a.tk * (a.d + a.dv) / (Causal ? 2 : 1) + 1);
    pooled_buffer<C> scratch(batches.slots * per_slot);
    batches.run([&](std::size_t slot, std::size_t b0, std::size_t b1) {
        C* const base = scratch.data() + slot * per_slot;
        C* const s = base + s_at;
        for (std::size_t b = b0; b < b1; ++b) {
            std::size_t ldq, ldk, ldv;
            const C* q = attention_matrix<C, VQ, BQ>(in[0], b, base + q_at, ldq);
            const C* k = attention_matrix<C, VK, BK>(in[1], b, base + k_at, ldk);
            const C* v = attention_matrix<C, VV, BV>(in[2], b, base + v_at, ldv);
            T* const o = out + b * a.tq * a.dv;
            // a masked key's infinity or NaN reaches the composite's rows through 0 * x: then no
            // key is skipped (attention_bounded); else the causal blocks stop at the diagonal
            const bool skip = Causal && std::isfinite(attention_max_abs(v, a.tk, a.dv, ldv));
            for (std::size_t i0 = 0; i0 < a.tq; i0 += blk) {
                const std::size_t rows = std::min(blk, a.tq - i0), keys = skip ? std::min(a.tk, i0 + rows) : a.tk;
                C* const ob = direct ? reinterpret_cast<C*>(o + i0 * a.dv) : base + o_at;
                if (keys == 0) {
                    std::fill_n(ob, rows * a.dv, C(0));
                } else {
                    attention_block_probabilities<Causal>(a, q, ldq, k, ldk, s, i0, rows, keys, scale);
                    gemm(transpose::no, transpose::no, rows, a.dv, keys, s, keys, v, ldv, ob, a.dv, false);
                }
                if constexpr (!direct)
                    for (std::size_t e = 0; e < rows * a.dv; ++e) o[i0 * a.dv + e] = T(ob[e]);
            }
        }
    });
}

// The backward's operands (g, q, k, v): g must have the output's extents.
template <class Ref>
attention_dims attention_backward_dims(const Ref* in) {
    const attention_dims a = attention_dims_of(in + 1, "scaled_dot_product_attention backward");
    const std::size_t r = in[1].rank;
    bool same = in[0].rank == r && in[0].ext[r - 1] == a.dv;
    for (std::size_t x = 0; x + 1 < r; ++x) same = same && in[0].ext[x] == in[1].ext[x];
    if (!same) throw shape_error("typegrad: scaled_dot_product_attention backward: the gradient's extents differ from the output's");
    return a;
}

// The backward: [dq | dk | dv] packed (each row-major, in q's, k's, v's shapes) from the
// incoming gradient g [n, tq, dv] and q, k, v.
template <bool Causal, class C, class T, class VG, class BG, class VQ, class BQ, class VK, class BK, class VV, class BV,
          class Ref>
void attention_backward(const Ref* in, T* out, C scale) {
    const attention_dims a = attention_backward_dims(in);
    const std::size_t nq = a.n * a.tq * a.d, nk = a.n * a.tk * a.d;
    if (nq + nk + a.n * a.tk * a.dv == 0) return;
    constexpr std::size_t blk = attention_block_rows;
    constexpr bool direct = std::is_same_v<T, C>;
    const std::size_t s_at = 0, p_at = s_at + blk * a.tk, q_at = p_at + blk * a.tk, k_at = q_at + a.tq * a.d,
                      v_at = k_at + a.tk * a.d, g_at = v_at + a.tk * a.dv, dq_at = g_at + a.tq * a.dv,
                      dk_at = dq_at + (direct ? 0 : blk * a.d), dv_at = dk_at + (direct ? 0 : a.tk * a.d),
                      per_slot = dv_at + (direct ? 0 : a.tk * a.dv);
    const attention_batches<C> batches(a.n, 4 * a.tq * a.tk * (a.d + a.dv) / (Causal ? 2 : 1) + 1);
    pooled_buffer<C> scratch(batches.slots * per_slot);
    batches.run([&](std::size_t slot, std::size_t b0, std::size_t b1) {
        C* const base = scratch.data() + slot * per_slot;
        C *const s = base + s_at, *const dp = base + p_at;
        for (std::size_t b = b0; b < b1; ++b) {
            std::size_t ldg, ldq, ldk, ldv;
            const C* g = attention_matrix<C, VG, BG>(in[0], b, base + g_at, ldg);
            const C* q = attention_matrix<C, VQ, BQ>(in[1], b, base + q_at, ldq);
            const C* k = attention_matrix<C, VK, BK>(in[2], b, base + k_at, ldk);
            const C* v = attention_matrix<C, VV, BV>(in[3], b, base + v_at, ldv);
            // as the forward; the composite's backward also meets the masked keys in dV = P^T g,
            // rowsum(P dP), dQ = dS k and dK = dS^T q: all four operands decide
            bool skip = false;
            if constexpr (Causal) {
                constexpr double most = double(std::numeric_limits<C>::max());
                const double mg = attention_max_abs(g, a.tq, a.dv, ldg), mq = attention_max_abs(q, a.tq, a.d, ldq),
                             mk = attention_max_abs(k, a.tk, a.d, ldk), mv = attention_max_abs(v, a.tk, a.dv, ldv);
                skip = attention_bounded(mq, mk, a.d, double(scale), most) && attention_bounded(mg, mv, a.dv, 1.0, most);
            }
            T* const dq_out = out + b * a.tq * a.d;
            T* const dk_out = out + nq + b * a.tk * a.d;
            T* const dv_out = out + nq + nk + b * a.tk * a.dv;
            C* const dk = direct ? reinterpret_cast<C*>(dk_out) : base + dk_at;
            C* const dv = direct ? reinterpret_cast<C*>(dv_out) : base + dv_at;
            std::fill_n(dk, a.tk * a.d, C(0));
            std::fill_n(dv, a.tk * a.dv, C(0));
            for (std::size_t i0 = 0; i0 < a.tq; i0 += blk) {
                const std::size_t rows = std::min(blk, a.tq - i0), keys = skip ? std::min(a.tk, i0 + rows) : a.tk;
                C* const dq = direct ? reinterpret_cast<C*>(dq_out + i0 * a.d) : base + dq_at;
                if (keys == 0) {
                    std::fill_n(dq, rows * a.d, C(0));
                } else {
                    attention_block_probabilities<Causal>(a, q, ldq, k, ldk, s, i0, rows, keys, scale);
                    if (a.dv == 0) std::fill_n(dp, rows * keys, C(0));
                    else gemm(transpose::no, transpose::yes, rows, keys, a.dv, g + i0 * ldg, ldg, v, ldv, dp, keys, false);
                    for (std::size_t i = 0; i < rows; ++i) {
                        C *const p = s + i * keys, *const dpr = dp + i * keys;
                        const std::size_t seen = Causal ? std::min(a.tk, i0 + i + 1) : a.tk, span = skip ? seen : keys;
                        C dot = 0;  // rowsum(P dP) = rowsum(g o), masked keys too where they may matter
                        for (std::size_t j = 0; j < span; ++j) dot += p[j] * dpr[j];
                        for (std::size_t j = 0; j < seen; ++j) dpr[j] = p[j] * (dpr[j] - dot) * scale;  // dS, scaled
                        std::fill(dpr + seen, dpr + keys, C(0));  // the mask's gradient: exactly 0
                    }
                    if (a.dv > 0)
                        gemm(transpose::yes, transpose::no, keys, a.dv, rows, s, keys, g + i0 * ldg, ldg, dv, a.dv, true);
                    if (a.d > 0) {
                        gemm(transpose::no, transpose::no, rows, a.d, keys, dp, keys, k, ldk, dq, a.d, false);
                        gemm(transpose::yes, transpose::no, keys, a.d, rows, dp, keys, q + i0 * ldq, ldq, dk, a.d, true);
                    }
                }
                if constexpr (!direct)
                    for (std::size_t e = 0; e < rows * a.d; ++e) dq_out[i0 * a.d + e] = T(dq[e]);
            }
            if constexpr (!direct) {
                for (std::size_t e = 0; e < a.tk * a.d; ++e) dk_out[e] = T(dk[e]);
                for (std::size_t e = 0; e < a.tk * a.dv; ++e) dv_out[e] = T(dv[e]);
            }
        }
    });
}

// ---- the fused attention on the device -------------------------------------------------------
// Passes of one node kernel around cuBLAS's strided-batched GEMMs, in the compute dtype (f32 for
// bf16/f16): the operands as dense [n, T, d] arrays (read in place when they are), then per chunk
// of score rows (whole matrices, or a range of one matrix's queries when a matrix's T x T scores
// pass attention_device_chunk) S = q k^T, a row-softmax pass, O = P V; the backward recomputes P,
// dP = g v^T, a dS pass, dV = P^T g, dQ = dS k, dK = dS^T q (a query range after the first adds
// its dK and dV). The chunk's scores are the only T x T values, in the backend's scratch.
enum class attention_pass : std::uint64_t { dense, softmax, scores_grad, store, add };
inline constexpr std::size_t attention_device_chunk = std::size_t(1) << 24;  // score elements (64 MB of f32)

struct attention_device_base {
    // S: the compute dtype's code, T: the result's; (Vi, Bi): value and buffer codes of the node's
    // operands (the forward's three, the backward's four).
    static constexpr const char* device_source = R"CUDA(
template <int S, int T, int V0, int B0, int V1, int B1, int V2, int B2, int V3, int B3>
__device__ void tg_attention(const tg_node_args& p) {
    typedef typename tg_ty<S>::S C;
    const int pass = (int)p.w[0];
    if (pass == 0) {  // operand w3 (ref at w4) as w2 dense elements at w1
        C* dst = (C*)p.w[1];
        const int which = (int)p.w[3];
        const tg_ref x = tg_ref_at(p, 4);
        TG_GRID_LOOP(e, (tg_i64)p.w[2]) {
            const tg_i64 off = tg_ref_offset(x, e);
            dst[e] = which == 0 ? tg_cvt<S, V0, B0>(((const typename tg_ty<B0>::S*)x.p)[off])
                   : which == 1 ? tg_cvt<S, V1, B1>(((const typename tg_ty<B1>::S*)x.p)[off])
                   : which == 2 ? tg_cvt<S, V2, B2>(((const typename tg_ty<B2>::S*)x.p)[off])
                                : tg_cvt<S, V3, B3>(((const typename tg_ty<B3>::S*)x.p)[off]);
        }
    } else if (pass == 1 || pass == 2) {  // a thread per score row: P = softmax(S * scale) (causal
        C* s = (C*)p.w[1];                // keys j > i are 0), then (pass 2) dS = P (dP - rowsum(P dP)) scale
        C* dp = (C*)p.w[2];
        const tg_i64 rq = (tg_i64)p.w[4], i0 = (tg_i64)p.w[5], tk = (tg_i64)p.w[6];
        const C scale = (C)tg_double_bits(p.w[7]);
        const bool causal = p.w[8] != 0;
        TG_GRID_LOOP(r, (tg_i64)p.w[3]) {
            C* row = s + r * tk;
            const tg_i64 i = i0 + r % rq, seen = causal ? (i + 1 < tk ? i + 1 : tk) : tk;
            C m = -tg_infinity<C>();
            for (tg_i64 j = 0; j < seen; ++j) m = tg_max(m, row[j] *= scale);
            C sum = 0;
            for (tg_i64 j = 0; j < seen; ++j) sum += (row[j] = tg_exp(row[j] - m));
            const C inv = (C)1 / sum;
            for (tg_i64 j = 0; j < seen; ++j) row[j] *= inv;
            // masked: the composite's exp(-inf - max) / sum, NaN where the maximum is not finite
            const C fill = tg_isfinite(m) ? (C)0 : m - m + (C)tg_double_bits(0x7ff8000000000000ull);
            for (tg_i64 j = seen; j < tk; ++j) row[j] = fill;
            if (pass == 2) {  // rowsum(P dP) over every key, as the composite (a masked 0 * inf too);
                C* d = dp + r * tk;  // the mask's gradient is exactly 0
                C dot = 0;
                for (tg_i64 j = 0; j < tk; ++j) dot += row[j] * d[j];
                for (tg_i64 j = 0; j < seen; ++j) d[j] = row[j] * (d[j] - dot) * scale;
                for (tg_i64 j = seen; j < tk; ++j) d[j] = 0;
            }
        }
    } else if (pass == 3) {  // w3 elements of w1 rounded into the result w2
        const C* src = (const C*)p.w[1];
        typename tg_ty<T>::S* out = (typename tg_ty<T>::S*)p.w[2];
        TG_GRID_LOOP(e, (tg_i64)p.w[3]) out[e] = tg_ty<T>::to((typename tg_ty<T>::C)src[e]);
    } else {  // w3 elements: w1 += w2
        C* dst = (C*)p.w[1];
        const C* src = (const C*)p.w[2];
        TG_GRID_LOOP(e, (tg_i64)p.w[3]) dst[e] += src[e];
    }
}
)CUDA";
    template <class N>
    static std::string device_call() {
        using T = storage_t<typename N::value_type>;
        using L = typename N::children;
        using C3 = type_at_t<L::size - 1, L>;  // the forward repeats its last operand's codes
        auto codes = [](auto* x) {
            using X = std::remove_pointer_t<decltype(x)>;
            return std::pair{device_type_code<typename X::value_type>(), device_type_code<buffer_t<X>>()};
        };
        const auto c0 = codes((type_at_t<0, L>*)nullptr), c1 = codes((type_at_t<1, L>*)nullptr),
                   c2 = codes((type_at_t<2, L>*)nullptr), c3 = codes((C3*)nullptr);
        return device_template_call("tg_attention", {device_type_code<compute_t<T>>(), device_type_code<T>(), c0.first,
                                                      c0.second, c1.first, c1.second, c2.first, c2.second, c3.first,
                                                      c3.second});
    }
};

// The host side of the device passes.
template <class S, class Device, class Ref>
struct attention_device {
    Device& dev;
    attention_dims a;
    double scale;
    bool causal;
    void pass(attention_pass p, std::size_t threads, std::initializer_list<std::uint64_t> own, const Ref* operand = nullptr) {
        if (threads == 0) return;
        std::uint64_t w[device_node_words] = {};
        w[0] = std::uint64_t(p);
        std::size_t at = 1;
        for (const std::uint64_t v : own) w[at++] = v;
        if (operand) put_device_ref(w, 4, *operand);
        dev.launch(w, threads);
    }
    // operand `which` as a dense row-major S array: in place when it is one, else copied to `to`
    template <class B>
    const S* dense(const Ref& r, std::uint64_t which, S* to) {
        bool row_major = true;
        std::ptrdiff_t expect = 1;
        for (std::size_t x = r.rank; x-- > 0;) {
            if (r.ext[x] != 1 && r.stride[x] != expect) row_major = false;
            expect *= std::ptrdiff_t(r.ext[x]);
        }
        if (std::is_same_v<B, S> && row_major) return static_cast<const S*>(r.data);
        pass(attention_pass::dense, numel_of(r), {device_word(to), numel_of(r), which}, &r);
        return to;
    }
    // Chunks of score rows: whole matrices [b, b + nb) (all their queries), or, when one matrix's
    // scores pass attention_device_chunk, queries [i0, i0 + rq) of matrix b (nb = 1).
    bool split() const { return a.tq * a.tk > attention_device_chunk; }
    std::size_t chunk_matrices() const {
        return std::min<std::size_t>({attention_device_chunk / std::max<std::size_t>(1, a.tq * a.tk), 65535, a.n});
    }
    std::size_t chunk_queries() const { return std::max<std::size_t>(1, attention_device_chunk / a.tk); }
    std::size_t chunk_scores() const { return split() ? chunk_queries() * a.tk : chunk_matrices() * a.tq * a.tk; }
    template <class F>
    void chunks(F&& fn) const {
        if (!split()) {
            const std::size_t nb = std::max<std::size_t>(1, chunk_matrices());
            for (std::size_t b = 0; b < a.n; b += nb) fn(b, std::min(nb, a.n - b), std::size_t(0), a.tq);
        } else {
            const std::size_t rq = chunk_queries();
            for (std::size_t b = 0; b < a.n; ++b)
                for (std::size_t i0 = 0; i0 < a.tq; i0 += rq) fn(b, std::size_t(1), i0, std::min(rq, a.tq - i0));
        }
    }
    // scores s [nb, rq, tk] = q[b, i0 + r] . k[b, j] (column-major s^T = k q^T)
    void scores(const S* q, const S* k, S* s, std::size_t b, std::size_t nb, std::size_t i0, std::size_t rq) {
        if (a.d == 0) return dev.zero(s, nb * rq * a.tk * sizeof(S));
        dev.gemm(true, false, int(a.tk), int(rq), int(a.d), k + b * a.tk * a.d, int(a.d), (long long)(a.tk * a.d),
                 q + (b * a.tq + i0) * a.d, int(a.d), (long long)(a.tq * a.d), s, int(a.tk), (long long)(rq * a.tk), int(nb));
    }
    void rows(attention_pass p, S* s, S* dp, std::size_t nb, std::size_t i0, std::size_t rq) {
        pass(p, nb * rq, {device_word(s), device_word(dp), nb * rq, rq, i0, a.tk, device_word(scale), std::uint64_t(causal)});
    }
};
// GEMM extents are int: the device path throws (before anything runs) past them.
inline void check_attention_device_extents(const attention_dims& a) {
    constexpr std::size_t most = std::size_t(1) << 31;
    if (a.tq >= most || a.tk >= most || a.d >= most || a.dv >= most || a.tk * std::max(a.d, a.dv) >= most)
        throw shape_error("typegrad: cuda: scaled_dot_product_attention: the extents exceed the BLAS's 32-bit extents");
}

template <num Scale, bool Causal>
struct attention_backward_op;

// The leading extent a of q, k, v's result: the first static one of the three.
template <class Q, class K, class V>
constexpr std::size_t attention_lead_extent(std::size_t a) {
    constexpr auto q = Q::shape_type::extents, k = K::shape_type::extents, v = V::shape_type::extents;
    return q[a] != dyn ? q[a] : k[a] != dyn ? k[a] : v[a];
}
template <class Q, class K, class V, class Seq = std::make_index_sequence<Q::shape_type::rank - 2>>
struct attention_out_shape;
template <class Q, class K, class V, std::size_t... As>
struct attention_out_shape<Q, K, V, std::index_sequence<As...>> {
    using type = shape<attention_lead_extent<Q, K, V>(As)..., Q::shape_type::extents[Q::shape_type::rank - 2],
                       V::shape_type::extents[V::shape_type::rank - 1]>;
};

// out = softmax(q k^T * Scale [causal]) v, fused.
template <num Scale, bool Causal>
struct attention_op : kernel_op_base, attention_device_base {
    static constexpr const char* name = "scaled_dot_product_attention";
    // as PyTorch's (its autocast lists: lower precision on CUDA and the CPU)
    static constexpr autocast_class autocast_on(device_kind) { return autocast_class::lower_precision; }
    template <class Q, class K, class V>
    struct rule {
        using value_type = typename Q::value_type;
        using shape_type = typename attention_out_shape<Q, K, V>::type;
    };
    template <class N, class Ref>
    static void extents(const Ref* in, std::size_t* ext) {
        const attention_dims a = attention_dims_of(in, "scaled_dot_product_attention(q, k, v)");
        const std::size_t r = in[0].rank;
        for (std::size_t x = 0; x + 2 < r; ++x) ext[x] = in[0].ext[x];
        ext[r - 2] = a.tq;
        ext[r - 1] = a.dv;
    }
    template <class N, class Ref, class T>
    static void run(const Ref* in, T* out, const std::size_t*) {
        using Q = type_at_t<0, typename N::children>;
        using K = type_at_t<1, typename N::children>;
        using V = type_at_t<2, typename N::children>;
        using C = compute_t<T>;
        attention_forward<Causal, C, T, typename Q::value_type, buffer_t<Q>, typename K::value_type, buffer_t<K>,
                          typename V::value_type, buffer_t<V>>(in, out, C(Scale.value()));
    }
    // The device (attention_device): per chunk of score rows S = q k^T, softmax, O = P V.
    template <class N, class Ref, class Device>
    static void device_run(const Ref* in, void* out, const std::size_t*, Device& dev) {
        using T = storage_t<typename N::value_type>;
        using S = compute_t<T>;
        const attention_dims a = attention_dims_of(in, "scaled_dot_product_attention(q, k, v)");
        if (a.n * a.tq * a.dv == 0) return;
        if (a.tk == 0) return dev.zero(out, a.n * a.tq * a.dv * sizeof(T));
        check_attention_device_extents(a);
        attention_device<S, Device, Ref> d{dev, a, Scale.value(), Causal};
        scratch_carver sc;
        const std::size_t q_at = sc.take<S>(a.n * a.tq * a.d), k_at = sc.take<S>(a.n * a.tk * a.d),
                          v_at = sc.take<S>(a.n * a.tk * a.dv), s_at = sc.take<S>(d.chunk_scores()),
                          o_at = sc.take<S>(std::is_same_v<T, S> ? 0 : a.n * a.tq * a.dv);
        void* const base = dev.scratch(sc.bytes);
        const S* q = d.template dense<buffer_t<type_at_t<0, typename N::children>>>(in[0], 0, sc.at<S>(base, q_at));
        const S* k = d.template dense<buffer_t<type_at_t<1, typename N::children>>>(in[1], 1, sc.at<S>(base, k_at));
        const S* v = d.template dense<buffer_t<type_at_t<2, typename N::children>>>(in[2], 2, sc.at<S>(base, v_at));
        S* const s = sc.at<S>(base, s_at);
        S* const o = std::is_same_v<T, S> ? static_cast<S*>(out) : sc.at<S>(base, o_at);
        d.chunks([&](std::size_t b, std::size_t nb, std::size_t i0, std::size_t rq) {
            d.scores(q, k, s, b, nb, i0, rq);
            d.rows(attention_pass::softmax, s, s, nb, i0, rq);
            // column-major O^T [dv x rq] = V^T [dv x tk] . P^T [tk x rq]
            dev.gemm(false, false, int(a.dv), int(rq), int(a.tk), v + b * a.tk * a.dv, int(a.dv), (long long)(a.tk * a.dv), s,
                     int(a.tk), (long long)(rq * a.tk), o + (b * a.tq + i0) * a.dv, int(a.dv), (long long)(a.tq * a.dv), int(nb));
        });
        if constexpr (!std::is_same_v<T, S>) d.pass(attention_pass::store, a.n * a.tq * a.dv, {device_word(o), device_word(out), a.n * a.tq * a.dv});
    }
    template <std::size_t I, class G, class Out, class Q, class K, class V>
    static constexpr auto vjp(G g, Out, Q q, K k, V v);
};

// [dq | dk | dv] packed, from (g, q, k, v)
template <num Scale, bool Causal>
struct attention_backward_op : kernel_op_base, attention_device_base {
    static constexpr const char* name = "scaled_dot_product_attention_backward";
    static constexpr autocast_class autocast_on(device_kind) { return autocast_class::lower_precision; }
    template <class G, class Q, class K, class V>
    struct rule {
        using value_type = typename Q::value_type;
        using shape_type = shape<dyn>;
    };
    template <class N, class Ref>
    static void extents(const Ref* in, std::size_t* ext) {
        ext[0] = numel_of(in[1]) + numel_of(in[2]) + numel_of(in[3]);
    }
    template <class N, class Ref, class T>
    static void run(const Ref* in, T* out, const std::size_t*) {
        using G = type_at_t<0, typename N::children>;
        using Q = type_at_t<1, typename N::children>;
        using K = type_at_t<2, typename N::children>;
        using V = type_at_t<3, typename N::children>;
        using C = compute_t<T>;
        attention_backward<Causal, C, T, typename G::value_type, buffer_t<G>, typename Q::value_type, buffer_t<Q>,
                           typename K::value_type, buffer_t<K>, typename V::value_type, buffer_t<V>>(in, out,
                                                                                                    C(Scale.value()));
    }
    // The device: per chunk of score rows, P recomputed, dP = g v^T, dS, then dV += P^T g,
    // dQ = dS k, dK += dS^T q (a matrix's later query ranges add theirs through a temporary).
    template <class N, class Ref, class Device>
    static void device_run(const Ref* in, void* out, const std::size_t*, Device& dev) {
        using T = storage_t<typename N::value_type>;
        using S = compute_t<T>;
        using L = typename N::children;
        const attention_dims a = attention_backward_dims(in);
        const std::size_t nq = a.n * a.tq * a.d, nk = a.n * a.tk * a.d, nv = a.n * a.tk * a.dv;
        if (nq + nk + nv == 0) return;
        if (a.tq == 0 || a.tk == 0) return dev.zero(out, (nq + nk + nv) * sizeof(T));
        check_attention_device_extents(a);
        attention_device<S, Device, Ref> d{dev, a, Scale.value(), Causal};
        scratch_carver sc;
        const std::size_t g_at = sc.take<S>(a.n * a.tq * a.dv), q_at = sc.take<S>(nq), k_at = sc.take<S>(nk),
                          v_at = sc.take<S>(nv), s_at = sc.take<S>(d.chunk_scores()), p_at = sc.take<S>(d.chunk_scores()),
                          tk_at = sc.take<S>(d.split() ? a.tk * a.d : 0), tv_at = sc.take<S>(d.split() ? a.tk * a.dv : 0),
                          r_at = sc.take<S>(std::is_same_v<T, S> ? 0 : nq + nk + nv);
        void* const base = dev.scratch(sc.bytes);
        const S* g = d.template dense<buffer_t<type_at_t<0, L>>>(in[0], 0, sc.at<S>(base, g_at));
        const S* q = d.template dense<buffer_t<type_at_t<1, L>>>(in[1], 1, sc.at<S>(base, q_at));
        const S* k = d.template dense<buffer_t<type_at_t<2, L>>>(in[2], 2, sc.at<S>(base, k_at));
        const S* v = d.template dense<buffer_t<type_at_t<3, L>>>(in[3], 3, sc.at<S>(base, v_at));
        S *const s = sc.at<S>(base, s_at), *const dp = sc.at<S>(base, p_at);
        S* const res = std::is_same_v<T, S> ? static_cast<S*>(out) : sc.at<S>(base, r_at);
        S *const gq = res, *const gk = res + nq, *const gv = res + nq + nk;
        d.chunks([&](std::size_t b, std::size_t nb, std::size_t i0, std::size_t rq) {
            const bool first = i0 == 0;
            S* const to_k = first ? gk + b * a.tk * a.d : sc.at<S>(base, tk_at);
            S* const to_v = first ? gv + b * a.tk * a.dv : sc.at<S>(base, tv_at);
            d.scores(q, k, s, b, nb, i0, rq);
            // column-major dP^T [tk x rq] = V [tk x dv] . G^T [dv x rq]
            if (a.dv == 0) dev.zero(dp, nb * rq * a.tk * sizeof(S));
            else dev.gemm(true, false, int(a.tk), int(rq), int(a.dv), v + b * a.tk * a.dv, int(a.dv), (long long)(a.tk * a.dv),
                          g + (b * a.tq + i0) * a.dv, int(a.dv), (long long)(a.tq * a.dv), dp, int(a.tk), (long long)(rq * a.tk), int(nb));
            d.rows(attention_pass::scores_grad, s, dp, nb, i0, rq);
            if (a.dv > 0)  // dV^T [dv x tk] = G^T [dv x rq] . P [rq x tk]
                dev.gemm(false, true, int(a.dv), int(a.tk), int(rq), g + (b * a.tq + i0) * a.dv, int(a.dv), (long long)(a.tq * a.dv), s,
                         int(a.tk), (long long)(rq * a.tk), to_v, int(a.dv), (long long)(a.tk * a.dv), int(nb));
            if (a.d > 0) {  // dQ^T [d x rq] = K^T [d x tk] . dS^T [tk x rq]; dK^T [d x tk] = Q^T [d x rq] . dS [rq x tk]
                dev.gemm(false, false, int(a.d), int(rq), int(a.tk), k + b * a.tk * a.d, int(a.d), (long long)(a.tk * a.d), dp,
                         int(a.tk), (long long)(rq * a.tk), gq + (b * a.tq + i0) * a.d, int(a.d), (long long)(a.tq * a.d), int(nb));
                dev.gemm(false, true, int(a.d), int(a.tk), int(rq), q + (b * a.tq + i0) * a.d, int(a.d), (long long)(a.tq * a.d), dp,
                         int(a.tk), (long long)(rq * a.tk), to_k, int(a.d), (long long)(a.tk * a.d), int(nb));
            }
            if (!first) {
                d.pass(attention_pass::add, a.tk * a.d, {device_word(gk + b * a.tk * a.d), device_word(to_k), a.tk * a.d});
                d.pass(attention_pass::add, a.tk * a.dv, {device_word(gv + b * a.tk * a.dv), device_word(to_v), a.tk * a.dv});
            }
        });
        if constexpr (!std::is_same_v<T, S>) d.pass(attention_pass::store, nq + nk + nv, {device_word(res), device_word(out), nq + nk + nv});
    }
    template <std::size_t I, class... Xs>
    static constexpr auto vjp(Xs...) {
        static_assert(always_false<Xs...>, "typegrad: the fused scaled_dot_product_attention's backward is not "
                                             "differentiable (grad of grad); pass tg::attention_math for the "
                                             "composite, whose backward is.");
        return lit<0>;
    }
};

// Input I's gradient inside the packed buffer: a dense view at its offset.
template <std::size_t I>
struct attention_grad_part_op : packed_part_view<I> {
    static constexpr const char* name = "scaled_dot_product_attention_grad";
    template <std::size_t K, class... Xs>
    static constexpr auto vjp(Xs...) {
        static_assert(always_false<Xs...>, "typegrad: the fused scaled_dot_product_attention's backward is not "
                                             "differentiable (grad of grad); pass tg::attention_math for the "
                                             "composite, whose backward is.");
        return lit<0>;
    }
};

template <num Scale, bool Causal>
template <std::size_t I, class G, class Out, class Q, class K, class V>
constexpr auto attention_op<Scale, Causal>::vjp(G g, Out, Q q, K k, V v) {
    return make_node<attention_grad_part_op<I>>(make_node<attention_backward_op<Scale, Causal>>(g, q, k, v), q, k, v);
}

// Whether scaled_dot_product_attention(q, k, v[, causal]) is the fused op: one floating dtype,
// one rank, leading extents that agree where static.
template <class Q, class K, class V>
constexpr bool attention_fusable() {
    using SQ = typename Q::shape_type;
    using SK = typename K::shape_type;
    using SV = typename V::shape_type;
    if constexpr (!(std::is_same_v<typename Q::value_type, typename K::value_type> &&
                    std::is_same_v<typename Q::value_type, typename V::value_type> && SQ::rank == SK::rank &&
                    SQ::rank == SV::rank))
        return false;
    else {
        for (std::size_t a = 0; a + 2 < SQ::rank; ++a) {
            const std::size_t e[3] = {SQ::extents[a], SK::extents[a], SV::extents[a]};
            for (std::size_t i = 0; i < 3; ++i)
                for (std::size_t j = 0; j < 3; ++j)
                    if (e[i] != dyn && e[j] != dyn && e[i] != e[j]) return false;
        }
        return true;
    }
}

struct no_mask {
    template <class S> constexpr S operator()(S s) const { return s; }
};
struct causal_masker {
    template <class S> constexpr auto operator()(S s) const;
};
template <class M>
struct additive_masker {
    M mask;
    template <class S> constexpr auto operator()(S s) const { return s + mask; }
};

}  // namespace detail

// x with the elements above diagonal Diagonal of its last two axes set to -inf (Diagonal = 0:
// column j > row i), as x.masked_fill(torch.ones(T, S).tril(Diagonal) == 0, -inf). The gradient
// of a masked element is 0.
template <std::int64_t Diagonal = 0, expression X>
constexpr auto causal_mask(X x) {
    static_assert(X::shape_type::rank >= 2, "typegrad: causal_mask(x) masks the last two axes of x; x has fewer than two.");
    static_assert(is_dtype_v<typename X::value_type>, "typegrad: causal_mask(x) takes a floating x.");
    return detail::make_node<detail::causal_fill_op<Diagonal,
                                                    std::bit_cast<std::uint64_t>(-std::numeric_limits<double>::infinity())>>(x);
}

namespace detail {
template <class S>
constexpr auto causal_masker::operator()(S s) const { return causal_mask(s); }

#define TYPEGRAD_DETAIL_CHECK_ATTENTION(Q, K, V)                                                                \
    static_assert(::typegrad::detail::attention_ranks_ok<Q, K, V>(),                                                                \
                  "typegrad: scaled_dot_product_attention(q, k, v) takes q, k, v of rank 2 ([T, d]), 3 "        \
                  "([batch, T, d]) or all three of rank 4 ([batch, heads, T, d]).");                            \
    static_assert(is_dtype_v<typename Q::value_type> && is_dtype_v<typename K::value_type> &&                  \
                      is_dtype_v<typename V::value_type>,                                                       \
                  "typegrad: scaled_dot_product_attention(q, k, v) takes floating q, k and v.");               \
    static_assert(::typegrad::detail::extents_agree<typename Q::shape_type, typename K::shape_type, 1, 1>(),                       \
                  "typegrad: scaled_dot_product_attention(q, k, v) needs q's and k's last extents (d) to be "   \
                  "equal.");                                                                                    \
    static_assert(::typegrad::detail::extents_agree<typename K::shape_type, typename V::shape_type, 2, 2>(),                       \
                  "typegrad: scaled_dot_product_attention(q, k, v) needs k and v to have the same number of "   \
                  "keys (second-to-last extent).")
#define TYPEGRAD_DETAIL_CHECK_ATTENTION_SCALE(Scale, Q)                                                          \
    static_assert(Scale.value() == Scale.value() ||                                                             \
                      Q::shape_type::extents[Q::shape_type::rank - 1] != dyn,                                   \
                  "typegrad: scaled_dot_product_attention(q, k, v) takes its default scale 1/sqrt(d) from q's " \
                  "static last extent; q's is dynamic, so give the scale: "                                     \
                  "scaled_dot_product_attention<scale>(q, k, v).")
// a num, not a double: clang 14 does not convert a call's double to a class-type template argument
template <num Scale, class Q>
constexpr num attention_scale() {
    if constexpr (Scale.value() == Scale.value()) return Scale;
    else if constexpr (Q::shape_type::extents[Q::shape_type::rank - 1] == dyn) return num(1.0);  // rejected above
    else return num(default_attention_scale<Q>());
}
}  // namespace detail

namespace detail {
// The fused op where attention_fusable (and not Math), else the composite.
template <num Scale, bool Causal, bool Math, class Q, class K, class V>
constexpr auto scaled_dot_product_attention(Q q, K k, V v) {
    TYPEGRAD_DETAIL_CHECK_ATTENTION(Q, K, V);
    TYPEGRAD_DETAIL_CHECK_ATTENTION_SCALE(Scale, Q);
    constexpr num scale = attention_scale<Scale, Q>();
    if constexpr (!Math && attention_fusable<Q, K, V>()) return make_node<attention_op<scale, Causal>>(q, k, v);
    else if constexpr (Causal) return attention<scale>(q, k, v, causal_masker{});
    else return attention<scale>(q, k, v, no_mask{});
}
}  // namespace detail

// torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=Scale): q [.., Tq, d],
// k [.., Tk, d], v [.., Tk, dv] -> [.., Tq, dv]. Scale NaN (the default) means 1/sqrt(d).
// q, k and v of one dtype and one rank take the fused op (nothing T x T kept for the backward;
// its backward is not differentiable again), others the composite.
template <num Scale = std::numeric_limits<double>::quiet_NaN(), expression Q, expression K, expression V>
constexpr auto scaled_dot_product_attention(Q q, K k, V v) {
    return detail::scaled_dot_product_attention<Scale, false, false>(q, k, v);
}
// is_causal=True: query i attends to keys 0..i.
template <num Scale = std::numeric_limits<double>::quiet_NaN(), expression Q, expression K, expression V>
constexpr auto scaled_dot_product_attention(Q q, K k, V v, causal_t) {
    return detail::scaled_dot_product_attention<Scale, true, false>(q, k, v);
}
// The composite (PyTorch's math backend, SDPBackend.MATH): two matmuls and a softmax, the T x T
// probabilities saved for the backward, which is differentiable again (grad of grad).
template <num Scale = std::numeric_limits<double>::quiet_NaN(), expression Q, expression K, expression V>
constexpr auto scaled_dot_product_attention(Q q, K k, V v, attention_math_t) {
    return detail::scaled_dot_product_attention<Scale, false, true>(q, k, v);
}
// The composite with is_causal=True.
template <num Scale = std::numeric_limits<double>::quiet_NaN(), expression Q, expression K, expression V>
constexpr auto scaled_dot_product_attention(Q q, K k, V v, causal_t, attention_math_t) {
    return detail::scaled_dot_product_attention<Scale, true, true>(q, k, v);
}
// attn_mask as a float tensor added to the scaled scores (broadcast to [.., Tq, Tk]); -inf
// excludes a key. (A boolean mask is where(keep, 0, -inf) of it.)
template <num Scale = std::numeric_limits<double>::quiet_NaN(), expression Q, expression K, expression V,
          expression M>
constexpr auto scaled_dot_product_attention(Q q, K k, V v, M mask) {
    TYPEGRAD_DETAIL_CHECK_ATTENTION(Q, K, V);
    TYPEGRAD_DETAIL_CHECK_ATTENTION_SCALE(Scale, Q);
    static_assert(is_dtype_v<typename M::value_type>,
                  "typegrad: scaled_dot_product_attention(q, k, v, mask) takes an additive floating mask.");
    static_assert(Q::shape_type::rank < 4 || M::shape_type::rank <= 2,
                  "typegrad: scaled_dot_product_attention(q, k, v, mask) of rank 4 takes a mask of shape [Tq, Tk] "
                  "(shared by every batch and head).");
    return detail::attention<detail::attention_scale<Scale, Q>()>(q, k, v, detail::additive_masker<M>{mask});
}
#undef TYPEGRAD_DETAIL_CHECK_ATTENTION
#undef TYPEGRAD_DETAIL_CHECK_ATTENTION_SCALE

}  // namespace typegrad
