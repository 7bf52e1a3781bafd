#pragma once
// dropout<p>(x, rng) (torch.nn.functional.dropout in training mode): each element is kept with
// probability 1 - p and scaled by 1 / (1 - p), or zeroed. The mask comes from Philox4x32-10
// (core/philox.hpp), a counter-based generator: rng is a run-time input of two std::int64_t,
// {seed, offset}, and element e (row-major) uses word e % 4 of the block
// philox4x32_10(counter_at(offset + e / 4), key_from_seed(seed)), kept when its uniform float
// (PyTorch's rule: low 24 bits * 2^-24) is below 1 - p. Any element can be produced alone, in any
// order: the backward regenerates the mask from {seed, offset} instead of storing it (the VJP of
// dropout is dropout of the gradient with the same rng). Advance the offset by ceil(numel / 4)
// between calls for fresh masks, as PyTorch's philox offset.
//
// The result is x times the mask's 0 or 1 / (1 - p), as PyTorch's `input * mask` (not a select):
// a dropped inf or NaN gives NaN, forward and backward (JAX's select would give 0).
// Disabled (inference, dropout<p, false>) and p = 0 are the identity: no node at all. p = 1
// multiplies everything by 0, as PyTorch (`input * zeros`). The streams are typegrad's own: PyTorch's CPU dropout draws from
// mt19937, so masks are not bitwise PyTorch's, only their law is.
//
// A kernel op; its device kernel (beside it) draws the same stream: CPU and CUDA masks are equal.
#include <cstddef>
#include <bit>
#include <cstdint>
#include <string>

#include <typegrad/core/device_kernel.hpp>
#include <typegrad/core/error.hpp>
#include <typegrad/core/philox.hpp>
#include <typegrad/ops/arithmetic.hpp>
#include <typegrad/ops/op_base.hpp>

namespace typegrad {
namespace detail {

// p as its double's bits: graph types hold no class-type template argument (graph/node.hpp).
template <std::uint64_t PBits>
struct dropout_op : kernel_op_base {
    static constexpr const char* name = "dropout";
    // the device kernel: one thread per Philox block of 4 elements, the CPU's stream bit for bit
    static constexpr const char* device_source = R"CUDA(
// Philox4x32-10 (core/philox.hpp)
__device__ __forceinline__ void tg_philox(unsigned c[4], unsigned k0, unsigned k1) {
    for (int r = 0; r < 10; ++r) {
        if (r != 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        const tg_u64 p0 = (tg_u64)0xD2511F53u * c[0], p1 = (tg_u64)0xCD9E8D57u * c[2];
        const unsigned n0 = (unsigned)(p1 >> 32) ^ c[1] ^ k0, n1 = (unsigned)p1;
        const unsigned n2 = (unsigned)(p0 >> 32) ^ c[3] ^ k1, n3 = (unsigned)p0;
        c[0] = n0;
        c[1] = n1;
        c[2] = n2;
        c[3] = n3;
    }
}
// dropout. w: out, p (double bits), scale (double bits), rng ref, x ref
template <int I, int T, int V, int B> __device__ void tg_dropout(const tg_node_args& p) {
    typedef typename tg_ty<T>::C C;
    typename tg_ty<T>::S* out = (typename tg_ty<T>::S*)p.w[0];
    const double keep_below = 1.0 - tg_double_bits(p.w[1]);
    const C scale = (C)tg_double_bits(p.w[2]);
    const tg_ref rng = tg_ref_at(p, 3);
    const tg_ref x = tg_ref_at(p, 5 + 2 * rng.rank);
    const typename tg_ty<B>::S* xp = (const typename tg_ty<B>::S*)x.p;
    const tg_u64 seed = (tg_u64)tg_id<I>(rng, 0), offset = (tg_u64)tg_id<I>(rng, 1);
    const tg_i64 n = tg_numel(x);
    TG_GRID_LOOP(b, (n + 3) / 4) {
        const tg_u64 counter = offset + (tg_u64)b;
        unsigned c[4] = {(unsigned)counter, (unsigned)(counter >> 32), 0u, 0u};
        tg_philox(c, (unsigned)seed, (unsigned)(seed >> 32));
        for (int k = 0; k < 4 && 4 * b + k < n; ++k) {
            const tg_i64 e = 4 * b + k;
            const bool keep = (double)((float)(c[k] & 0x00FFFFFFu) * 5.9604644775390625e-8f) < keep_below;
            const C v = (C)(typename tg_ty<V>::C)tg_ty<B>::from(xp[tg_ref_offset(x, e)]);
            out[e] = tg_ty<T>::to(v * (keep ? scale : (C)0));
        }
    }
}
)CUDA";
    template <class N>
    static std::string device_call() {
        return device_call_of<N, 1, 0>("tg_dropout");
    }
    template <class N, class Ref>
    static std::size_t device_words(const Ref* in, void* out, const std::size_t* ext, std::uint64_t* w, void*) {
        using C = compute_t<buffer_t<N>>;
        w[0] = device_word(out);
        w[1] = device_word(p);
        w[2] = device_word(double(p < 1 ? C(1.0 / (1.0 - p)) : C(0)));
        put_device_ref(w, put_device_ref(w, 3, in[1]), in[0]);
        std::size_t n = 1;
        for (std::size_t a = 0; a < in[0].rank; ++a) n *= ext[a];
        return (n + 3) / 4;
    }
    static constexpr bool differentiable = true;
    static constexpr bool shape_only(std::size_t) { return false; }
    static constexpr double p = std::bit_cast<double>(PBits);
    template <class X, class Rng>
    struct rule {
        using value_type = typename X::value_type;
        using shape_type = typename X::shape_type;
    };
    template <class N, class Ref>
    static void extents(const Ref* in, std::size_t* ext) {
        for (std::size_t a = 0; a < in[0].rank; ++a) ext[a] = in[0].ext[a];
        if (in[1].ext[0] != 2)
            fail<shape_error>({"typegrad: dropout(x, rng): rng holds {seed, offset}, 2 integers, not ",
                               in[1].ext[0]});
    }
    template <class N, class Ref, class T>
    static void run(const Ref* in, T* out, const std::size_t* ext) {
        using X = type_at_t<0, typename N::children>;
        using B = buffer_t<X>;
        using C = compute_t<T>;
        using Id = typename type_at_t<1, typename N::children>::value_type;
        const Ref& x = in[0];
        const Ref& rng = in[1];
        const auto* rp = static_cast<const Id*>(rng.data);
        const auto seed = std::uint64_t(std::int64_t(rp[0]));
        const auto offset = std::uint64_t(std::int64_t(rp[rng.stride[0]]));
        const philox_key key = philox_key_from_seed(seed);
        const auto* xp = static_cast<const B*>(x.data);
        const C scale = p < 1 ? C(1.0 / (1.0 - p)) : C(0);
        std::size_t n = 1;
        for (std::size_t a = 0; a < x.rank; ++a) n *= ext[a];
        for (std::size_t e = 0; e < n; e += 4) {
            const philox_counter r = philox4x32_10(philox_counter_at(offset + e / 4), key);
            for (std::size_t k = 0; k < 4 && e + k < n; ++k) {
                const bool keep = double(uniform_float(r[k])) < 1.0 - p;
                const C v = static_cast<C>(static_cast<compute_t<typename X::value_type>>(
                    static_cast<compute_t<B>>(xp[strided_offset(x, e + k)])));
                out[e + k] = T(v * (keep ? scale : C(0)));  // PyTorch's x * mask: inf or NaN dropped is NaN
            }
        }
    }
    template <std::size_t I, class G, class Out, class X, class Rng>
    static constexpr auto vjp(G g, Out, X, Rng rng) {
        static_assert(I == 0, "typegrad: internal: dropout's rng carries no gradient");
        return make_node<dropout_op>(g, rng);
    }
};

}  // namespace detail

// torch.nn.functional.dropout(x, p, training): rng is a tg::input of two std::int64_t,
// {seed, offset}. Training = false, or p = 0, gives x itself.
template <num P, bool Training = true, expression X, expression Rng>
constexpr auto dropout(X x, Rng rng) {
    static_assert(P.value() >= 0.0 && P.value() <= 1.0, "typegrad: dropout<p>(x, rng) needs 0 <= p <= 1.");
    static_assert(is_index_type_v<typename Rng::value_type> && Rng::shape_type::rank == 1 &&
                      (Rng::shape_type::extents[0] == 2 || Rng::shape_type::extents[0] == dyn),
                  "typegrad: dropout<p>(x, rng) takes rng as a tg::input of two std::int64_t (or std::int32_t): "
                  "{seed, offset}.");
    static_assert(is_dtype_v<typename X::value_type>, "typegrad: dropout<p>(x, rng) takes a floating x.");
    if constexpr (!Training || P.value() == 0.0) return x;
    else return detail::make_node<detail::dropout_op<P.bits>>(x, rng);
}

}  // namespace typegrad
