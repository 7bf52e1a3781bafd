#pragma once
// Attention: causal_mask(x) (masked_fill of the elements above a diagonal of the last two axes)
// and scaled_dot_product_attention(q, k, v) (torch.nn.functional.scaled_dot_product_attention):
//
//   softmax(q k^T * scale + mask) v,   scale = 1 / sqrt(d) by default (d: q's last extent)
//
// with an optional causal mask (tg::causal: query i sees keys j <= i, PyTorch's is_causal,
// top-left aligned when Tq != Tk) or an additive float mask (PyTorch's float attn_mask).
//
// attention is a composite: two matmuls (kernel boundaries; k^T is a transposed view handed to
// the GEMM as a flag), the mask, and the library's softmax (shifted by its detached row maximum,
// so large logits do not overflow). A masked logit is -inf, so its probability is exactly 0 and
// no gradient reaches it; a row whose logits are all -inf gives NaN, as in PyTorch. The T x T
// probabilities are saved for the backward (no flash-style recomputation yet).
//
// causal_mask is a kernel op (it needs the element's row and column, which the fused elementwise
// loops do not have); its VJP is the same mask filling 0, so a NaN or inf in the incoming
// gradient of a masked element does not leak. Its device kernel sits beside it.
//
// Autocast: the matmuls are lower precision (the scores and the output then round to the spec's
// dtype); softmax follows its own class; the mask keeps its input's dtype.
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

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
                  "keys (second-to-last extent).");                                                             \
    static_assert(::typegrad::detail::heads_flattenable_v<typename Q::shape_type> && ::typegrad::detail::heads_flattenable_v<typename K::shape_type> &&  \
                      ::typegrad::detail::heads_flattenable_v<typename V::shape_type>,                                              \
                  "typegrad: scaled_dot_product_attention(q, k, v) of rank 4 flattens [batch, heads] into one " \
                  "axis and can infer one dynamic extent: make batch and heads static, or T and d static.")
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

// torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=Scale): q [.., Tq, d],
// k [.., Tk, d], v [.., Tk, dv] -> [.., Tq, dv]. Scale NaN (the default) means 1/sqrt(d).
template <num Scale = std::numeric_limits<double>::quiet_NaN(), expression Q, expression K, expression V>
constexpr auto scaled_dot_product_attention(Q q, K k, V v) {
    TYPEGRAD_DETAIL_CHECK_ATTENTION(Q, K, V);
    TYPEGRAD_DETAIL_CHECK_ATTENTION_SCALE(Scale, Q);
    return detail::attention<detail::attention_scale<Scale, Q>()>(q, k, v, detail::no_mask{});
}
// is_causal=True: query i attends to keys 0..i.
template <num Scale = std::numeric_limits<double>::quiet_NaN(), expression Q, expression K, expression V>
constexpr auto scaled_dot_product_attention(Q q, K k, V v, causal_t) {
    TYPEGRAD_DETAIL_CHECK_ATTENTION(Q, K, V);
    TYPEGRAD_DETAIL_CHECK_ATTENTION_SCALE(Scale, Q);
    return detail::attention<detail::attention_scale<Scale, Q>()>(q, k, v, detail::causal_masker{});
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
