#pragma once
// log_sum_exp, softmax and log_softmax, numerically stable: the shift by the maximum is
// detached, so the gradient is exactly softmax and no exp overflows.
#include <limits>

#include <typegrad/ops/autocast_entry.hpp>
#include <typegrad/ops/exp_log.hpp>
#include <typegrad/ops/reduce.hpp>

namespace typegrad {
namespace detail {
// x, with +inf read as -inf. log_sum_exp shifts by the largest input below +inf: with +inf among
// the inputs, exp(x - shift) then overflows at +inf only, and every finite input gets PyTorch's
// gradient exp(x - lse) = 0 instead of exp(x) / inf, NaN where exp(x) overflows (finding 14).
struct below_inf_op : nondifferentiable_elementwise_op {
    static constexpr const char* name = "below_inf";
    static constexpr const char* device = "({0} == tg_infinity<T>() ? -tg_infinity<T>() : {0})";
    template <class V>
    static V apply(const V& a) {
        const V inf(std::numeric_limits<double>::infinity());
        return simd::select(a == inf, -inf, a);
    }
};

template <expression X>
constexpr auto finite_or_zero(X x) { return make_node<finite_or_zero_op>(x); }
template <expression X>
constexpr auto below_inf(X x) { return make_node<below_inf_op>(x); }

// softmax / log_softmax shift by the row maximum itself, as PyTorch's CPU kernels: a row holding
// +inf is NaN everywhere (x - max is NaN at +inf and -inf elsewhere, and the sum of exp is NaN),
// an all -inf row too (-inf - -inf), and a NaN row stays NaN.
template <int Axis, expression X>
constexpr auto softmax_shift(X x) { return detach(max(x, axes<Axis>, keepdim)); }

template <int Axis, expression X>
constexpr auto log_sum_exp_keepdim(X x) {
    auto shift = detach(finite_or_zero(max(below_inf(x), axes<Axis>, keepdim)));
    return shift + log(sum(exp(x - shift), axes<Axis>, keepdim));
}
}  // namespace detail

// Over all elements; an all -inf input gives -inf, a +inf input +inf (gradient 0 to the finite
// inputs, NaN to the +inf ones, as PyTorch's exp(x - lse)).
template <expression X>
constexpr auto log_sum_exp(X in) {
    auto x = detail::fp32_on_cuda_entry(in);
    auto shift = detach(detail::finite_or_zero(max(detail::below_inf(x))));
    return shift + log(sum(exp(x - shift)));
}
// log(sum(exp(x))) along axis Axis, the axis dropped, computed stably (torch.logsumexp(x, dim)).
template <expression X, int Axis>
constexpr auto log_sum_exp(X x, axes_t<Axis>) {
    static_assert(detail::axes_valid<typename X::shape_type, Axis>(),
                  "typegrad: log_sum_exp(x, tg::axes<a>) names an axis x does not have.");
    return detail::drop_axes<typename X::shape_type, Axis>(detail::log_sum_exp_keepdim<Axis>(detail::fp32_on_cuda_entry(x)));
}
// log_sum_exp along axis Axis, kept as extent 1 (torch.logsumexp(x, dim, keepdim=True)).
template <expression X, int Axis>
constexpr auto log_sum_exp(X x, axes_t<Axis>, keepdim_t) {
    static_assert(detail::axes_valid<typename X::shape_type, Axis>(),
                  "typegrad: log_sum_exp(x, tg::axes<a>) names an axis x does not have.");
    return detail::log_sum_exp_keepdim<Axis>(detail::fp32_on_cuda_entry(x));
}

// log(softmax(x)) along axis Axis (default the last), as (x - max) - log(sum(exp(x - max)))
// (torch.log_softmax(x, dim), jax.nn.log_softmax). On CUDA it runs in f32 under autocast.
template <expression X, int Axis = -1>
constexpr auto log_softmax(X x, axes_t<Axis> = {}) {
    static_assert(detail::axes_valid<typename X::shape_type, Axis>(),
                  "typegrad: log_softmax(x, tg::axes<a>) names an axis x does not have.");
    // (x - max) - log(sum(exp(x - max))), as PyTorch's CPU kernel: the exact subtraction comes
    // first, so the result does not round at the scale of x (x - lse(x) loses ~|x| ulp).
    auto e = detail::fp32_on_cuda_entry(x);
    auto shifted = e - detail::softmax_shift<Axis>(e);
    return shifted - log(sum(exp(shifted), axes<Axis>, keepdim));
}
// exp(x - max) / sum(exp(x - max)) along axis Axis (default the last) (torch.softmax(x, dim),
// jax.nn.softmax). A bad axis is a static_assert.
template <expression X, int Axis = -1>
constexpr auto softmax(X x, axes_t<Axis> a = {}) {
    static_assert(detail::axes_valid<typename X::shape_type, Axis>(),
                  "typegrad: softmax(x, tg::axes<a>) names an axis x does not have.");
    if constexpr (!detail::axes_valid<typename X::shape_type, Axis>()) return x;  // one error, not two
    else return exp(log_softmax(x, a));
}

}  // namespace typegrad
