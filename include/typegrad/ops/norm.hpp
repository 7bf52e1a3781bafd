#pragma once
// layer_norm and rms_norm over the last K axes (torch.nn.functional.layer_norm / rms_norm).
//
// Both are composites of fused primitives: the planner gives layer_norm one loop for the mean,
// one for the variance of the centred values (two passes: stable where E[x^2] - E[x]^2 cancels)
// and one for the output. rms_norm's backward is derived through them; layer_norm's is the
// formula of PyTorch's kernel (value_with_vjp below), which agrees with PyTorch at infinite and
// NaN gradients too. Statistics and the affine
// transform are computed in f32 for bf16/f16 input (the input is widened inside the loops, at
// no memory cost) and the result is rounded once to the inputs' dtype, as PyTorch's kernels do.
//
// Autocast: layer_norm is on PyTorch's CUDA fp32 list (its inputs are cast to f32 in a CUDA
// region, and its result is f32); it is on no CPU list, and rms_norm is on no list.
#include <cstddef>
#include <limits>
#include <utility>

#include <typegrad/ops/arithmetic.hpp>
#include <typegrad/ops/autocast_entry.hpp>
#include <typegrad/ops/cast.hpp>
#include <typegrad/ops/compare.hpp>
#include <typegrad/ops/exp_log.hpp>
#include <typegrad/ops/reduce.hpp>

namespace typegrad {
namespace detail {

// axes<-K, ..., -1>
template <std::size_t K, std::size_t... Is>
auto last_axes_impl(std::index_sequence<Is...>) -> axes_t<(int(Is) - int(K))...>;
template <std::size_t K>
using last_axes_t = decltype(last_axes_impl<K>(std::make_index_sequence<K>{}));

// Statistics run in f32 for bf16/f16 values. widen(x) is x in its compute dtype (f32 for the
// float family, f64 for f64) and narrow_like(y, likes...) is y rounded to the promoted dtype of
// likes (read for their dtype and shape only). Both are ops rather than casts chosen when the
// expression is built, so that an autocast region that changes an input's dtype (a CUDA region
// casting to f32, a bf16 matmul feeding layer_norm) changes them too.
struct widen_op : elementwise_op {
    static constexpr const char* name = "widen";
    static constexpr const char* device = "{0}";
    template <class X>
    struct rule {
        using value_type = std::conditional_t<is_reduced_precision_v<typename X::value_type>, float,
                                              typename X::value_type>;
        using shape_type = typename X::shape_type;
    };
    template <class V> static V apply(const V& x) { return x; }
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X) { return cast<typename X::value_type>(g); }
};
struct narrow_like_op : elementwise_op {
    static constexpr const char* name = "narrow";
    static constexpr const char* device = "{0}";  // the loop rounds to the node's dtype
    static constexpr bool shape_only(std::size_t i) { return i > 0; }
    template <class Y, class... Likes>
    struct rule {
        using value_type = promote_t<typename Likes::value_type...>;
        using shape_type = typename Y::shape_type;
    };
    template <class V> static V apply(const V& y) { return y; }
    template <std::size_t I, class G, class Out, class Y, class... Likes>
    static constexpr auto vjp(G g, Out, Y, Likes...) { return cast<typename Y::value_type>(g); }
};

template <expression X>
constexpr auto widened(X x) {
    if constexpr (std::is_same_v<typename X::value_type, double>) return x;  // never changes dtype
    else return make_node<widen_op>(x);
}
// x's last K static extents equal P's extents (where both are static): P is a weight or bias.
template <class X, class P, std::size_t K>
constexpr bool normalized_shape_matches() {
    using SX = typename X::shape_type;
    using SP = typename P::shape_type;
    if (SP::rank != K || SX::rank < K) return false;
    for (std::size_t i = 0; i < K; ++i) {
        const std::size_t a = SX::extents[SX::rank - K + i], b = SP::extents[i];
        if (a != dyn && b != dyn && a != b) return false;
    }
    return true;
}

template <std::size_t K, class X>
constexpr void check_norm_axes(const char*) {
    static_assert(K >= 1 && K <= X::shape_type::rank,
                  "typegrad: layer_norm<K>(x) / rms_norm<K>(x) normalise over the last K axes of x; K must be "
                  "between 1 and x's rank.");
    static_assert(is_dtype_v<typename X::value_type>,
                  "typegrad: layer_norm / rms_norm take a floating expression (not labels or constants).");
}

// machine epsilon of a dtype: rms_norm's default eps, as torch.finfo(dtype).eps
template <class T>
constexpr double machine_epsilon() {
    if constexpr (std::is_same_v<T, bf16>) return 0.0078125;
    else if constexpr (std::is_same_v<T, f16>) return 0.0009765625;
    else return std::numeric_limits<storage_t<T>>::epsilon();
}

// A value computed by a composite, with the gradient of PyTorch's fused backward kernel: an
// elementwise node whose value is its operand 0 (the composite, detached) and whose VJP for
// operand I > 0 is Rule::vjp<I - 1>(g, operands 1..) (expressions of the inputs, so they are
// differentiable again). The normalisations use it: differentiating their composites gives the
// same values in exact arithmetic, but sums the gradient through the mean and through the
// variance separately (sum(g) - sum(x_hat) sum(g x_hat), with sum(x_hat) = 0 only in exact
// arithmetic), so that one infinite gradient makes every element NaN where PyTorch's formula
// gives +-inf (docs/reliability.md, finding 19).
template <class Rule>
struct value_with_vjp_op : elementwise_op {
    static constexpr const char* name = Rule::name;
    static constexpr const char* device = "{0}";
    template <class Y, class... Xs>
    struct rule {
        using value_type = typename Y::value_type;
        using shape_type = typename Y::shape_type;
    };
    template <class V, class... Vs>
    static V apply(const V& y, const Vs&...) { return y; }
    template <std::size_t I, class G, class Out, class Y, class... Xs>
    static constexpr auto vjp(G g, Out, Y, Xs... xs) {
        static_assert(I > 0, "typegrad: internal: a value_with_vjp node's value operand is detached");
        return Rule::template vjp<I - 1>(g, xs...);
    }
};
template <class Rule, expression Y, expression... Xs>
constexpr auto value_with_vjp(Y value, Xs... xs) {
    return make_node<value_with_vjp_op<Rule>>(detach(value), xs...);
}

// 1 / (the number of elements reduced over axes A...) of x, as a scalar node
template <expression X, int... A>
constexpr auto inv_count_over(X x, axes_t<A...>) {
    return make_node<inv_count_op<typename keepdim_shape<typename X::shape_type, A...>::type>>(x);
}

// (x - mean) / sqrt(var + eps) over the last K axes, in the statistics dtype.
template <std::size_t K, num Eps, expression X>
constexpr auto layer_normalize_composite(X xf) {
    constexpr last_axes_t<K> over{};
    auto centred = xf - mean(xf, over, keepdim);
    auto var = mean(square(centred), over, keepdim);
    return centred * (lit<1> / sqrt(var + lit<Eps>));
}
// PyTorch's CPU layer_norm backward (LayerNormBackwardKernelImplInternal, LibTorch 1.13), with
// dY the gradient of the affine result and gamma the weight (1 without one): a = rstd,
// ds = sum(dY x gamma), db = sum(dY gamma), b = (db mean - ds) a^3 / N, c = -b mean - db a / N,
// dx = a dY gamma + b x + c; dgamma = dY (x - mean) a and dbeta = dY, summed over the leading
// axes (by the reverse pass). The order of the products is the kernel's: dY x gamma is 0 where
// x = 0 and gamma = 1e306 even when dY gamma overflows.
template <std::size_t K, num Eps>
struct layer_norm_backward {
    static constexpr const char* name = "layer_norm";
    template <std::size_t I, class G, class X>
    static constexpr auto vjp(G g, X xf) { return grad<I>(g, xf, lit<1>); }
    template <std::size_t I, class G, class X, class W>
    static constexpr auto vjp(G g, X xf, W w) { return grad<I>(g, xf, w); }
    template <std::size_t I, class G, class X, class W, class B>
    static constexpr auto vjp(G g, X xf, W w, B) {
        if constexpr (I == 2) return g;
        else return grad<I>(g, xf, w);
    }
    template <std::size_t I, class G, class X, class W>
    static constexpr auto grad(G dy, X xf, W gamma) {
        constexpr last_axes_t<K> over{};
        auto mu = mean(xf, over, keepdim);
        auto a = lit<1> / sqrt(mean(square(xf - mu), over, keepdim) + lit<Eps>);  // the forward's nodes
        if constexpr (I == 0) {
            auto scale = inv_count_over(xf, over);
            auto ds = sum(dy * xf * gamma, over, keepdim);
            auto db = sum(dy * gamma, over, keepdim);
            auto b = (db * mu - ds) * a * a * a * scale;
            auto c = -(b * mu) - db * a * scale;
            return a * dy * gamma + b * xf + c;
        } else {
            return dy * (xf - mu) * a;
        }
    }
};
template <std::size_t K, num Eps, expression X>
constexpr auto rms_normalize(X x) {
    auto xf = widened(x);
    constexpr last_axes_t<K> over{};
    return xf * (lit<1> / sqrt(mean(square(xf), over, keepdim) + lit<Eps>));
}
// The result in the promoted dtype of the inputs (rounded once).
template <expression Y, expression... Likes>
constexpr auto narrowed(Y y, Likes... likes) {
    if constexpr (std::is_same_v<typename Y::value_type, double>) return y;
    else return make_node<narrow_like_op>(y, likes...);
}

}  // namespace detail

#define TYPEGRAD_DETAIL_CHECK_NORM_PARAM(fname, P)                                                         \
    static_assert(detail::normalized_shape_matches<X, P, K>(),                                           \
                  "typegrad: " fname "<K>(x, weight, ...) needs weight and bias of rank K whose extents " \
                  "equal x's last K extents (PyTorch's normalized_shape)")

// torch.nn.functional.layer_norm(x, x.shape[-K:], weight, bias, eps)
template <std::size_t K = 1, num Eps = 1e-5, expression X>
constexpr auto layer_norm(X in) {
    detail::check_norm_axes<K, X>("layer_norm");
    auto x = detail::fp32_on_cuda_entry(in);
    auto xf = detail::widened(x);
    return detail::narrowed(
        detail::value_with_vjp<detail::layer_norm_backward<K, Eps>>(detail::layer_normalize_composite<K, Eps>(xf), xf), x);
}
// layer_norm with an elementwise weight of shape x.shape[-K:] and no bias.
template <std::size_t K = 1, num Eps = 1e-5, expression X, expression W>
constexpr auto layer_norm(X in, W weight) {
    detail::check_norm_axes<K, X>("layer_norm");
    TYPEGRAD_DETAIL_CHECK_NORM_PARAM("layer_norm", W);
    auto x = detail::fp32_on_cuda_entry(in);
    auto w = detail::fp32_on_cuda_entry(weight);
    auto xf = detail::widened(x);
    auto wf = detail::widened(w);
    return detail::narrowed(detail::value_with_vjp<detail::layer_norm_backward<K, Eps>>(
                                detail::layer_normalize_composite<K, Eps>(xf) * wf, xf, wf),
                            x, w);
}
// layer_norm with an elementwise weight and bias of shape x.shape[-K:] (nn.LayerNorm's affine form).
template <std::size_t K = 1, num Eps = 1e-5, expression X, expression W, expression B>
constexpr auto layer_norm(X in, W weight, B bias) {
    detail::check_norm_axes<K, X>("layer_norm");
    TYPEGRAD_DETAIL_CHECK_NORM_PARAM("layer_norm", W);
    TYPEGRAD_DETAIL_CHECK_NORM_PARAM("layer_norm", B);
    auto x = detail::fp32_on_cuda_entry(in);
    auto w = detail::fp32_on_cuda_entry(weight);
    auto b = detail::fp32_on_cuda_entry(bias);
    auto xf = detail::widened(x);
    auto wf = detail::widened(w);
    auto bf = detail::widened(b);
    return detail::narrowed(detail::value_with_vjp<detail::layer_norm_backward<K, Eps>>(
                                detail::layer_normalize_composite<K, Eps>(xf) * wf + bf, xf, wf, bf),
                            x, w, b);
}

// torch.nn.functional.rms_norm(x, x.shape[-K:], weight, eps): x / sqrt(mean(x^2) + eps) * weight.
// A negative Eps (the default) means PyTorch's default, the machine epsilon of x's dtype.
template <std::size_t K = 1, num Eps = -1, expression X>
constexpr auto rms_norm(X x) {
    detail::check_norm_axes<K, X>("rms_norm");
    constexpr double eps = Eps.value() < 0 ? detail::machine_epsilon<typename X::value_type>() : Eps.value();
    return detail::narrowed(detail::rms_normalize<K, eps>(x), x);
}
// rms_norm with an elementwise weight of shape x.shape[-K:] (nn.RMSNorm's affine form).
template <std::size_t K = 1, num Eps = -1, expression X, expression W>
constexpr auto rms_norm(X x, W weight) {
    detail::check_norm_axes<K, X>("rms_norm");
    TYPEGRAD_DETAIL_CHECK_NORM_PARAM("rms_norm", W);
    constexpr double eps = Eps.value() < 0 ? detail::machine_epsilon<typename X::value_type>() : Eps.value();
    return detail::narrowed(detail::rms_normalize<K, eps>(x) * detail::widened(weight), x, weight);
}
#undef TYPEGRAD_DETAIL_CHECK_NORM_PARAM

}  // namespace typegrad
