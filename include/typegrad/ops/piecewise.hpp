#pragma once
// relu, abs, and elementwise minimum/maximum (binary tg::min / tg::max).
#include <typegrad/exec/cpu/simd.hpp>
#include <typegrad/ops/arithmetic.hpp>
#include <typegrad/ops/compare.hpp>

namespace typegrad {
namespace detail {

struct relu_op : elementwise_op {
    static constexpr const char* name = "relu";
    static constexpr const char* device = "tg_max({0}, (T)0)";
    // max() propagates NaN, as torch.relu does.
    template <class V> static V apply(const V& x) { return simd::max(x, V(0)); }
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X x) { return gmul(g, gt(x, lit<0>)); }
};
struct abs_op : elementwise_op {
    static constexpr const char* name = "abs";
    static constexpr const char* device = "tg_abs({0})";
    template <class V> static V apply(const V& x) { return simd::abs(x); }
    // sign(x), 0 at 0 (torch.sgn).
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X x) { return gmul(g, gt(x, lit<0>) - lt(x, lit<0>)); }
};
// Ties send half the gradient to each side, as torch.maximum / torch.minimum.
struct maximum_op : elementwise_op {
    static constexpr const char* name = "maximum";
    static constexpr const char* device = "tg_max({0}, {1})";
    template <class V> static V apply(const V& a, const V& b) { return simd::max(a, b); }
    template <std::size_t I, class G, class Out, class A, class B>
    static constexpr auto vjp(G g, Out, A a, B b) {
        if constexpr (I == 0) return gmul(g, gt(a, b) + lit<0.5> * eq(a, b));
        else return gmul(g, gt(b, a) + lit<0.5> * eq(a, b));
    }
};
struct minimum_op : elementwise_op {
    static constexpr const char* name = "minimum";
    static constexpr const char* device = "tg_min({0}, {1})";
    template <class V> static V apply(const V& a, const V& b) { return simd::min(a, b); }
    template <std::size_t I, class G, class Out, class A, class B>
    static constexpr auto vjp(G g, Out, A a, B b) {
        if constexpr (I == 0) return gmul(g, lt(a, b) + lit<0.5> * eq(a, b));
        else return gmul(g, lt(b, a) + lit<0.5> * eq(a, b));
    }
};

}  // namespace detail

template <expression X> constexpr auto relu(X x) { return detail::make_node<detail::relu_op>(x); }
template <expression X> constexpr auto abs(X x) { return detail::make_node<detail::abs_op>(x); }
template <expression A, expression B>
constexpr auto max(A a, B b) {
    TYPEGRAD_DETAIL_CHECK_BROADCAST("max(a, b)", A, B);
    return detail::make_node<detail::maximum_op>(a, b);
}
template <expression A, expression B>
constexpr auto min(A a, B b) {
    TYPEGRAD_DETAIL_CHECK_BROADCAST("min(a, b)", A, B);
    return detail::make_node<detail::minimum_op>(a, b);
}

}  // namespace typegrad
