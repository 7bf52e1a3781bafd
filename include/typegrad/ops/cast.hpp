#pragma once
// cast<T>(x) between f64, f32, bf16 and f16; narrowing rounds to nearest even, and the gradient
// casts back to the input's dtype. To or from f64 it is a kernel boundary (a loop runs in one SIMD
// width): the conversion reads one materialised buffer and writes another, in bulk SIMD
// conversions where the input is dense, and one strided conversion kernel on the device. Within
// the float family it is elementwise (convert_op).
#include <cstddef>
#include <cstdint>
#include <string>

#include <typegrad/core/cpu/half_simd.hpp>
#include <typegrad/ops/arithmetic.hpp>
#include <typegrad/ops/op_base.hpp>

namespace typegrad {
namespace detail {

template <class To>
struct cast_op : kernel_op_base {
    static constexpr const char* name = "cast";
    template <class X>
    struct rule {
        using value_type = To;
        using shape_type = typename X::shape_type;
    };
    template <class N, class Ref>
    static void extents(const Ref* in, std::size_t* ext) {
        for (std::size_t a = 0; a < in[0].rank; ++a) ext[a] = in[0].ext[a];
    }
    // One element: From (the input's buffer type) to To, through the input's dtype V (a bf16
    // reduction is held in float and rounded here) and float between two 16-bit types.
    template <class V, class From>
    static To convert(From x) {
        if constexpr (is_reduced_precision_v<V> && !std::is_same_v<V, From>) return convert<V>(V(x));
        else if constexpr (is_reduced_precision_v<To> && is_reduced_precision_v<From>) return To(static_cast<float>(x));
        else return static_cast<To>(x);
    }
    template <class N, class Ref, class T>
    static void run(const Ref* in, T* out, const std::size_t* ext) {
        using C = type_at_t<0, typename N::children>;
        using From = buffer_t<C>;
        using V = storage_t<typename C::value_type>;
        const auto* x = static_cast<const From*>(in[0].data);
        const std::size_t rank = in[0].rank;
        std::size_t n = 1;
        bool dense = true;
        for (std::size_t a = rank; a-- > 0;) {
            dense = dense && (ext[a] == 1 || in[0].stride[a] == std::ptrdiff_t(n));
            n *= ext[a];
        }
        constexpr bool bulk = std::is_same_v<V, From> && (is_reduced_precision_v<From> != is_reduced_precision_v<To>);
        if constexpr (bulk) {
            if (dense) {
                convert_n(x, out, n);
                return;
            }
        }
        for (std::size_t e = 0; e < n; ++e) out[e] = convert<V>(x[strided_offset(in[0], e)]);
    }
    // The device: the same conversion (a bf16/f16 value held in a float buffer rounds to its dtype
    // first), one thread per element. From f64 to bf16/f16 the CPU rounds once, directly; the
    // device's conversions go through float, so that direction stays on the host.
    static constexpr const char* device_source = R"CUDA(
// cast to or from f64: T the output's code, V the input's dtype, B the input's buffer type
template <int T, int V, int B> __device__ void tg_cast(const tg_node_args& p) {
    typename tg_ty<T>::S* out = (typename tg_ty<T>::S*)p.w[0];
    const tg_ref x = tg_ref_at(p, 1);
    const typename tg_ty<B>::S* xp = (const typename tg_ty<B>::S*)x.p;
    TG_GRID_LOOP(e, tg_numel(x)) {
        typename tg_ty<B>::C v = tg_ty<B>::from(xp[tg_ref_offset(x, e)]);
        if (V != B) v = (typename tg_ty<B>::C)tg_ty<V>::from(tg_ty<V>::to((typename tg_ty<V>::C)v));
        out[e] = tg_ty<T>::to((typename tg_ty<T>::C)v);
    }
}
)CUDA";
    template <class N>
    static constexpr void check_device() {
        static_assert(!is_reduced_precision_v<To>,
                      "typegrad: cuda: a cast from f64 to bf16/f16 has no device kernel yet (the device would "
                      "round twice, through float); cast through f32 (tg::cast<float>) first (docs/cuda.md)");
    }
    template <class N>
    static std::string device_call() {
        using C = type_at_t<0, typename N::children>;
        return device_template_call("tg_cast", {device_type_code<buffer_t<N>>(), device_type_code<typename C::value_type>(),
                                                device_type_code<buffer_t<C>>()});
    }
    template <class N, class Ref>
    static std::size_t device_words(const Ref* in, void* out, const std::size_t*, std::uint64_t* w, void*) {
        w[0] = device_word(out);
        put_device_ref(w, 1, in[0]);
        return numel_of(in[0]);
    }
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X);
};

// Within the float family (f32, bf16, f16) a cast is elementwise: loops compute in float, so it
// is a rounding (narrowing) or nothing (widening), fused like any other op; its value is stored
// in 16 bits only where a kernel (matmul) reads it.
template <class To>
struct convert_op : elementwise_op {
    static constexpr const char* name = "cast";
    template <class... Cs>
    struct rule {
        using value_type = To;
        using shape_type = typename type_at_t<0, type_list<Cs...>>::shape_type;
    };
    template <class V>
    static V apply(const V& x) { return x; }  // the loop rounds a bf16/f16 result
    static constexpr const char* device = "{0}";  // so does the CUDA loop (exec/cuda/codegen.hpp)
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X);
};

}  // namespace detail

// cast<T>(x): converts to the floating dtype T (double, float, tg::bf16, tg::f16), rounding to
// nearest even; the gradient is cast back to x's dtype.
template <class T, expression X>
constexpr auto cast(X x) {
    static_assert(is_dtype_v<T>, "typegrad: cast<T>(x) converts to a floating dtype: double, float, tg::bf16 or tg::f16.");
    static_assert(is_dtype_v<typename X::value_type>,
                  "typegrad: cast<T>(x) converts a floating expression (not labels or constants).");
    using From = typename X::value_type;
    if constexpr (std::is_same_v<T, From>) return x;
    else if constexpr (!std::is_same_v<T, double> && !std::is_same_v<From, double>)
        return detail::make_node<detail::convert_op<T>>(x);
    else return detail::make_node<detail::cast_op<T>>(x);
}

namespace detail {
template <class To>
template <std::size_t I, class G, class Out, class X>
constexpr auto cast_op<To>::vjp(G g, Out, X) {
    return cast<typename X::value_type>(g);
}
template <class To>
template <std::size_t I, class G, class Out, class X>
constexpr auto convert_op<To>::vjp(G g, Out, X) {
    return cast<typename X::value_type>(g);
}
}  // namespace detail
}  // namespace typegrad
