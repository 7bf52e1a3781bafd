#pragma once
// Special functions: erf, log1p, expm1 (torch.erf, torch.log1p, torch.expm1).
//
// Autocast: log1p and expm1 are on PyTorch's CUDA fp32 list (they run in f32 in a CUDA region);
// erf is on none of its lists (erfinv is), so it promotes, as in PyTorch. None is on a CPU list.
//
// Device expressions call CUDA's erff/erf (and log1pf/log1p, expm1f/expm1) chosen by the loop's
// compute type; the branch not taken is a compile-time constant the compiler drops.
#include <typegrad/core/cpu/simd.hpp>
#include <typegrad/ops/arithmetic.hpp>
#include <typegrad/ops/exp_log.hpp>

namespace typegrad {
namespace detail {

// 2 / sqrt(pi)
inline constexpr double two_over_sqrt_pi = 1.12837916709551257390;

struct erf_op : elementwise_op {
    static constexpr unsigned cost = 16;
    static constexpr const char* name = "erf";
    static constexpr const char* device = "(sizeof(T) == 4 ? (T)erff((float)({0})) : (T)erf((double)({0})))";
    template <class V> static V apply(const V& x) { return simd::erf(x); }
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X x);
};
struct log1p_op : elementwise_op {
    static constexpr unsigned cost = 14;
    static constexpr const char* name = "log1p";
    static constexpr autocast_class autocast_on(device_kind d) { return fp32_on_cuda(d); }
    static constexpr const char* device = "(sizeof(T) == 4 ? (T)log1pf((float)({0})) : (T)log1p((double)({0})))";
    template <class V> static V apply(const V& x) { return simd::log1p(x); }
    // grad / (1 + x), as PyTorch (its -inf at x = -1 included)
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X x) { return grad_div(g, x + lit<1>); }
};
struct expm1_op : elementwise_op {
    static constexpr unsigned cost = 14;
    static constexpr const char* name = "expm1";
    static constexpr autocast_class autocast_on(device_kind d) { return fp32_on_cuda(d); }
    static constexpr const char* device = "(sizeof(T) == 4 ? (T)expm1f((float)({0})) : (T)expm1((double)({0})))";
    template <class V> static V apply(const V& x) { return simd::expm1(x); }
    // grad * (result + 1), as PyTorch
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out out, X) { return grad_mul(g, out + lit<1>); }
};

}  // namespace detail

// Elementwise error function (torch.erf).
template <expression X> constexpr auto erf(X x) { return detail::make_node<detail::erf_op>(x); }
// Elementwise log(1 + x), accurate near 0 (torch.log1p).
template <expression X> constexpr auto log1p(X x) { return detail::make_node<detail::log1p_op>(x); }
// Elementwise exp(x) - 1, accurate near 0 (torch.expm1).
template <expression X> constexpr auto expm1(X x) { return detail::make_node<detail::expm1_op>(x); }

namespace detail {
// d/dx erf(x) = 2/sqrt(pi) exp(-x^2)
template <std::size_t I, class G, class Out, class X>
constexpr auto erf_op::vjp(G g, Out, X x) {
    return grad_mul(g, exp(-square(x)) * lit<two_over_sqrt_pi>);
}
}  // namespace detail
}  // namespace typegrad
