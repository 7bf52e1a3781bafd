#pragma once
// exp, log, sqrt, square, pow.
#include <typegrad/core/cpu/simd.hpp>
#include <typegrad/ops/arithmetic.hpp>
#include <typegrad/ops/compare.hpp>

namespace typegrad {
namespace detail {

struct exp_op : elementwise_op {
    static constexpr unsigned cost = 12;
    static constexpr const char* name = "exp";
    static constexpr autocast_class autocast_on(device_kind d) { return fp32_on_cuda(d); }
    static constexpr const char* device = "tg_exp({0})";
    template <class V> static V apply(const V& x) { return simd::exp(x); }
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out out, X) { return grad_mul(g, out); }
};
struct log_op : elementwise_op {
    static constexpr unsigned cost = 12;
    static constexpr const char* name = "log";
    static constexpr autocast_class autocast_on(device_kind d) { return fp32_on_cuda(d); }
    static constexpr const char* device = "tg_log({0})";
    template <class V> static V apply(const V& x) { return simd::log(x); }
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X x) { return grad_div(g, x); }
};
struct sqrt_op : elementwise_op {
    static constexpr unsigned cost = 4;
    static constexpr const char* name = "sqrt";
    static constexpr const char* device = "tg_sqrt({0})";
    template <class V> static V apply(const V& x) { return simd::sqrt(x); }
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out out, X) { return grad_mul(g, lit<0.5> / out); }
};
struct square_op : elementwise_op {
    static constexpr const char* name = "square";
    static constexpr const char* device = "({0} * {0})";
    template <class V> static V apply(const V& x) { return x * x; }
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X x) { return grad_mul(g, x * lit<2>); }
};
struct pow_op : elementwise_op {
    static constexpr unsigned cost = 24;
    static constexpr const char* name = "pow";
    static constexpr autocast_class autocast_on(device_kind d) { return fp32_on_cuda(d); }
    static constexpr const char* device = "tg_pow({0}, {1})";
    template <class V> static V apply(const V& x, const V& y) { return simd::pow(x, y); }
    template <std::size_t I, class G, class Out, class X, class Y>
    static constexpr auto vjp(G g, Out out, X x, Y y);
};

}  // namespace detail

// Elementwise e^x (torch.exp). Gradient g * exp(x).
template <expression X> constexpr auto exp(X x) { return detail::make_node<detail::exp_op>(x); }
// Elementwise natural logarithm (torch.log): -inf at 0, NaN below.
template <expression X> constexpr auto log(X x) { return detail::make_node<detail::log_op>(x); }
// Elementwise square root (torch.sqrt).
template <expression X> constexpr auto sqrt(X x) { return detail::make_node<detail::sqrt_op>(x); }
// Elementwise x * x (torch.square).
template <expression X> constexpr auto square(X x) { return detail::make_node<detail::square_op>(x); }

// pow(x, y) for tensors and for constants (tg::lit<3>); pow(x, 1) is x, pow(x, 2) is square(x).
template <expression X, expression Y>
constexpr auto pow(X x, Y y) {
    TYPEGRAD_DETAIL_CHECK_BROADCAST("pow(x, y)", X, Y);
    using NY = typename Y::node_type;
    if constexpr ((detail::constant_of<NY>::value == 1.0)) return x;
    else if constexpr ((detail::constant_of<NY>::value == 2.0)) return square(x);
    else return detail::make_node<detail::pow_op>(x, y);
}
// Rejected with a `typegrad:` static_assert: a run-time number cannot enter the graph type; write
// pow(x, tg::lit<3>) for a constant exponent, or bind a run-time one through a tg::input leaf.
template <expression X, class S>
    requires std::is_arithmetic<S>::value
constexpr auto pow(X x, S) {
    TYPEGRAD_DETAIL_NO_RUNTIME_NUMBER("pow(x, number)");
    return x;
}

namespace detail {
template <std::size_t I, class G, class Out, class X, class Y>
constexpr auto pow_op::vjp(G g, Out out, X x, Y y) {
    // d/dx x^y = y x^(y-1), taken as 0 where y == 0 (else 0 * inf at x == 0) as PyTorch does;
    // d/dy x^y = x^y log x; taken as 0 where x == 0 and y >= 0, as PyTorch does.
    if constexpr (I == 0) {
        using NY = typename Y::node_type;
        if constexpr (is_constant_v<NY> && !(constant_of<NY>::value == 0.0)) return grad_mul(g, y * pow(x, y - lit<1>));
        else return where(eq(y, lit<0>), lit<0>, grad_mul(g, y * pow(x, y - lit<1>)));
    }
    else return grad_mul(g, where(eq(x, lit<0>) * ge(y, lit<0>), lit<0>, out * log(x)));  // g * 0: NaN for NaN g
}
}  // namespace detail
}  // namespace typegrad
