#pragma once
// sin, cos, tanh, sigmoid.
#include <typegrad/core/cpu/simd.hpp>
#include <typegrad/ops/arithmetic.hpp>

namespace typegrad {
namespace detail {

struct sin_op : elementwise_op {
    static constexpr unsigned cost = 16;
    static constexpr const char* name = "sin";
    static constexpr const char* device = "tg_sin({0})";
    template <class V> static V apply(const V& x) { return simd::sin(x); }
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X x);
};
struct cos_op : elementwise_op {
    static constexpr unsigned cost = 16;
    static constexpr const char* name = "cos";
    static constexpr const char* device = "tg_cos({0})";
    template <class V> static V apply(const V& x) { return simd::cos(x); }
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X x);
};
struct tanh_op : elementwise_op {
    static constexpr unsigned cost = 16;
    static constexpr const char* name = "tanh";
    static constexpr const char* device = "tg_tanh({0})";
    template <class V> static V apply(const V& x) { return simd::tanh(x); }
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out out, X) { return grad_mul(g, lit<1> - out * out); }
};
struct sigmoid_op : elementwise_op {
    static constexpr unsigned cost = 14;
    static constexpr const char* name = "sigmoid";
    static constexpr const char* device = "tg_sigmoid({0})";
    // 1 / (1 + exp(-x)) overflows to 0 for large negative x and saturates to 1: both correct.
    template <class V> static V apply(const V& x) { return V(1) / (V(1) + simd::exp(-x)); }
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out out, X) { return grad_mul(g, out * (lit<1> - out)); }
};

}  // namespace detail

// Elementwise sine (torch.sin).
template <expression X> constexpr auto sin(X x) { return detail::make_node<detail::sin_op>(x); }
// Elementwise cosine (torch.cos).
template <expression X> constexpr auto cos(X x) { return detail::make_node<detail::cos_op>(x); }
// Elementwise hyperbolic tangent (torch.tanh).
template <expression X> constexpr auto tanh(X x) { return detail::make_node<detail::tanh_op>(x); }
// Elementwise logistic function 1 / (1 + exp(-x)) (torch.sigmoid).
template <expression X> constexpr auto sigmoid(X x) { return detail::make_node<detail::sigmoid_op>(x); }

namespace detail {
template <std::size_t I, class G, class Out, class X>
constexpr auto sin_op::vjp(G g, Out, X x) { return grad_mul(g, cos(x)); }
template <std::size_t I, class G, class Out, class X>
constexpr auto cos_op::vjp(G g, Out, X x) { return -grad_mul(g, sin(x)); }
}  // namespace detail
}  // namespace typegrad
