#pragma once
// Activations with PyTorch's semantics: gelu (exact erf form and approximate = tanh), silu,
// softplus(beta, threshold), leaky_relu(negative_slope), elu(alpha), and clamp(x, lo, hi).
//
// Hyperparameters are part of the graph's type, as every number in a graph is: they are
// template arguments (tg::leaky_relu<0.2>(x)) and become constant operands of the node, so the
// CPU kernel and the CUDA expression read them like any other operand. clamp takes its bounds as
// expressions: constants (tg::lit<...>) or tensors, which then get PyTorch's bound gradients.
//
// Autocast: softplus is on PyTorch's CUDA fp32 list; the others are on no list (they promote).
// Edge rules (PyTorch's derivative formulas): relu-like kinks take the left derivative
// (leaky_relu'(0) = slope, elu'(0) = alpha); clamp passes the gradient where lo <= x <= hi.
#include <limits>

#include <typegrad/core/cpu/simd.hpp>
#include <typegrad/ops/arithmetic.hpp>
#include <typegrad/ops/compare.hpp>
#include <typegrad/ops/exp_log.hpp>
#include <typegrad/ops/special.hpp>
#include <typegrad/ops/trig.hpp>

namespace typegrad {

// torch.nn.functional.gelu's `approximate`: "none" (the erf form) or "tanh".
enum class approximate { none, tanh };

namespace detail {

inline constexpr double sqrt1_2 = 0.70710678118654752440;           // 1 / sqrt(2)
inline constexpr double inv_sqrt_2pi = 0.39894228040143267794;      // 1 / sqrt(2 pi)
inline constexpr double gelu_beta = 0.79788456080286535588;         // sqrt(2 / pi)
inline constexpr double gelu_kappa = 0.044715;

// x * 0.5 * (1 + erf(x / sqrt 2))
struct gelu_op : elementwise_op {
    static constexpr unsigned cost = 20;
    static constexpr const char* name = "gelu";
    static constexpr const char* device =
        "({0} * (T)0.5 * ((T)1 + (sizeof(T) == 4 ? (T)erff((float)({0} * (T)0.70710678118654752440)) "
        ": (T)erf((double)({0} * (T)0.70710678118654752440)))))";
    template <class V>
    static V apply(const V& x) { return x * V(0.5) * (V(1) + simd::erf(x * V(sqrt1_2))); }
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X x);
};
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
struct gelu_tanh_op : elementwise_op {
    static constexpr unsigned cost = 20;
    static constexpr const char* name = "gelu_tanh";
    static constexpr const char* device =
        "((T)0.5 * {0} * ((T)1 + tg_tanh((T)0.79788456080286535588 * ({0} + (T)0.044715 * {0} * {0} * {0}))))";
    template <class V>
    static V apply(const V& x) {
        const V inner = V(gelu_beta) * (x + V(gelu_kappa) * (x * x * x));
        return V(0.5) * x * (V(1) + simd::tanh(inner));
    }
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X x);
};
// x * sigmoid(x), computed as x / (1 + exp(-x)) as PyTorch does
struct silu_op : elementwise_op {
    static constexpr unsigned cost = 14;
    static constexpr const char* name = "silu";
    static constexpr const char* device = "({0} / ((T)1 + tg_exp(-{0})))";
    template <class V>
    static V apply(const V& x) { return x / (V(1) + simd::exp(-x)); }
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X x);
};
// Operands: x, beta, threshold. x where x * beta > threshold, else log1p(exp(beta x)) / beta.
struct softplus_op : elementwise_op {
    static constexpr unsigned cost = 24;
    static constexpr const char* name = "softplus";
    static constexpr autocast_class autocast_on(device_kind d) { return fp32_on_cuda(d); }
    static constexpr const char* device =
        "(({0} * {1}) > {2} ? {0} : (sizeof(T) == 4 ? (T)log1pf((float)tg_exp({0} * {1})) "
        ": (T)log1p((double)tg_exp({0} * {1}))) / {1})";
    template <class V>
    static V apply(const V& x, const V& beta, const V& threshold) {
        const V bx = x * beta;
        return simd::select(bx > threshold, x, simd::log1p(simd::exp(bx)) / beta);
    }
    template <std::size_t I, class G, class Out, class X, class B, class Th>
    static constexpr auto vjp(G g, Out, X x, B beta, Th threshold);
};
// Operands: x, negative_slope.
struct leaky_relu_op : elementwise_op {
    static constexpr const char* name = "leaky_relu";
    static constexpr const char* device = "({0} > (T)0 ? {0} : {0} * {1})";
    template <class V>
    static V apply(const V& x, const V& slope) { return simd::select(x > V(0), x, x * slope); }
    template <std::size_t I, class G, class Out, class X, class S>
    static constexpr auto vjp(G g, Out, X x, S slope);
};
// Operands: x, alpha. x where x > 0, else alpha * expm1(x).
struct elu_op : elementwise_op {
    static constexpr unsigned cost = 14;
    static constexpr const char* name = "elu";
    static constexpr const char* device =
        "({0} > (T)0 ? {0} : {1} * (sizeof(T) == 4 ? (T)expm1f((float)({0})) : (T)expm1((double)({0}))))";
    template <class V>
    static V apply(const V& x, const V& alpha) { return simd::select(x > V(0), x, alpha * simd::expm1(x)); }
    template <std::size_t I, class G, class Out, class X, class A>
    static constexpr auto vjp(G g, Out, X x, A alpha);
};
// Operands: x, lo, hi. min(max(x, lo), hi): NaN in x stays NaN, and lo > hi gives hi, as
// torch.clamp.
struct clamp_op : elementwise_op {
    static constexpr const char* name = "clamp";
    static constexpr const char* device = "tg_min(tg_max({0}, {1}), {2})";
    template <class V>
    static V apply(const V& x, const V& lo, const V& hi) { return simd::min(simd::max(x, lo), hi); }
    template <std::size_t I, class G, class Out, class X, class L, class H>
    static constexpr auto vjp(G g, Out, X x, L lo, H hi);
};

}  // namespace detail

// torch.nn.functional.gelu(x, approximate): tg::gelu(x) (erf form) or
// tg::gelu<tg::approximate::tanh>(x).
template <approximate A = approximate::none, expression X>
constexpr auto gelu(X x) {
    if constexpr (A == approximate::tanh) return detail::make_node<detail::gelu_tanh_op>(x);
    else return detail::make_node<detail::gelu_op>(x);
}
// torch.nn.functional.silu: x * sigmoid(x).
template <expression X>
constexpr auto silu(X x) { return detail::make_node<detail::silu_op>(x); }

// torch.nn.functional.softplus(x, beta, threshold)
template <num Beta = 1, num Threshold = 20, expression X>
constexpr auto softplus(X x) {
    static_assert(Beta.value() != 0.0, "typegrad: softplus<beta, threshold>(x) needs a nonzero beta.");
    return detail::make_node<detail::softplus_op>(x, lit<Beta>, lit<Threshold>);
}
// torch.nn.functional.leaky_relu(x, negative_slope)
template <num NegativeSlope = 0.01, expression X>
constexpr auto leaky_relu(X x) { return detail::make_node<detail::leaky_relu_op>(x, lit<NegativeSlope>); }
// torch.nn.functional.elu(x, alpha)
template <num Alpha = 1, expression X>
constexpr auto elu(X x) { return detail::make_node<detail::elu_op>(x, lit<Alpha>); }

// torch.clamp(x, lo, hi): bounds are expressions (tg::lit<...> or tensors, broadcast with x).
template <expression X, expression L, expression H>
constexpr auto clamp(X x, L lo, H hi) {
    TYPEGRAD_DETAIL_CHECK_BROADCAST("clamp(x, lo, hi)", X, L);
    TYPEGRAD_DETAIL_CHECK_BROADCAST("clamp(x, lo, hi)", X, H);
    TYPEGRAD_DETAIL_CHECK_BROADCAST("clamp(x, lo, hi)", L, H);
    return detail::make_node<detail::clamp_op>(x, lo, hi);
}
// torch.clamp(x, min=lo).
template <expression X, expression L>
constexpr auto clamp_min(X x, L lo) {
    return clamp(x, lo, lit<std::numeric_limits<double>::infinity()>);
}
// torch.clamp(x, max=hi).
template <expression X, expression H>
constexpr auto clamp_max(X x, H hi) {
    return clamp(x, lit<-std::numeric_limits<double>::infinity()>, hi);
}

namespace detail {
template <std::size_t I, class G, class Out, class X>
constexpr auto gelu_op::vjp(G g, Out, X x) {
    // 0.5 (1 + erf(x / sqrt 2)) + x exp(-x^2 / 2) / sqrt(2 pi)
    return grad_mul(g, lit<0.5> * (lit<1> + erf(x * lit<sqrt1_2>)) + x * exp(square(x) * lit<-0.5>) * lit<inv_sqrt_2pi>);
}
template <std::size_t I, class G, class Out, class X>
constexpr auto gelu_tanh_op::vjp(G g, Out, X x) {
    // PyTorch's formula: 0.5 (1 + t) + 0.5 x (1 - t^2) beta (1 + 3 kappa x^2), t = tanh(inner)
    auto x2 = square(x);
    auto t = tanh((x + x * x2 * lit<gelu_kappa>) * lit<gelu_beta>);
    return grad_mul(g, lit<0.5> * (lit<1> + t) +
                       lit<0.5> * x * (lit<1> - square(t)) * (lit<1> + x2 * lit<3 * gelu_kappa>) * lit<gelu_beta>);
}
template <std::size_t I, class G, class Out, class X>
constexpr auto silu_op::vjp(G g, Out, X x) {
    auto s = sigmoid(x);
    return grad_mul(g, s * (lit<1> + x * (lit<1> - s)));
}
template <std::size_t I, class G, class Out, class X, class B, class Th>
constexpr auto softplus_op::vjp(G g, Out, X x, B beta, Th threshold) {
    static_assert(I == 0, "typegrad: internal: softplus's beta and threshold are constants");
    // PyTorch's softplus_backward: z / (z + 1) with z = exp(beta x), not sigmoid(beta x), which is
    // 1 / (1 + exp(-beta x)) = 0 in float once exp(-beta x) overflows (beta x < -88.7: z is subnormal)
    auto z = exp(x * beta);
    return where(gt(x * beta, threshold), g, grad_mul(g, z / (z + lit<1>)));
}
template <std::size_t I, class G, class Out, class X, class S>
constexpr auto leaky_relu_op::vjp(G g, Out, X x, S slope) {
    static_assert(I == 0, "typegrad: internal: leaky_relu's slope is a constant");
    return where(gt(x, lit<0>), g, g * slope);
}
template <std::size_t I, class G, class Out, class X, class A>
constexpr auto elu_op::vjp(G g, Out, X x, A alpha) {
    static_assert(I == 0, "typegrad: internal: elu's alpha is a constant");
    return where(le(x, lit<0>), grad_mul(g, exp(x) * alpha), g);
}
template <std::size_t I, class G, class Out, class X, class L, class H>
constexpr auto clamp_op::vjp(G g, Out, X x, L lo, H hi) {
    // torch's clamp_backward and clamp_backward_min_max: where(pred, grad, 0), a selection, so a
    // NaN or infinite grad does not reach the operands it does not pass to (NaN * 0 would)
    if constexpr (I == 0) return where(ge(x, lo) * le(x, hi), g, lit<0>);
    else if constexpr (I == 1) return where(lt(x, lo) * lt(lo, hi), g, lit<0>);
    else return where(gt(gt(x, hi) + lt(hi, lo), lit<0>), g, lit<0>);
}
}  // namespace detail
}  // namespace typegrad
