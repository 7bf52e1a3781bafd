#pragma once
// relu, abs, and elementwise minimum/maximum (binary tg::min / tg::max).
#include <typegrad/core/cpu/simd.hpp>
#include <typegrad/ops/arithmetic.hpp>
#include <typegrad/ops/compare.hpp>

namespace typegrad {
namespace detail {

struct relu_op : elementwise_op {
    static constexpr const char* name = "relu";
    static constexpr const char* device = "tg_max({0}, (T)0)";
    // max() propagates NaN, as torch.relu does.
    template <class V> static V apply(const V& x) { return simd::max(x, V(0)); }
    // 0 where x <= 0 (even for a NaN or inf g), else g: a NaN input passes the gradient, as
    // torch's threshold_backward (a where, not a product with a mask)
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X x) { return where(le(x, lit<0>), lit<0>, g); }
};
struct abs_op : elementwise_op {
    static constexpr const char* name = "abs";
    static constexpr const char* device = "tg_abs({0})";
    template <class V> static V apply(const V& x) { return simd::abs(x); }
    // sign(x), 0 at 0 (torch.sgn).
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X x) { return grad_mul(g, gt(x, lit<0>) - lt(x, lit<0>)); }
};
// Ties send half the gradient to each side, as torch.maximum / torch.minimum; the side that is
// not the result gets 0, and with a NaN operand (no order) both get the whole gradient:
// where(a == b, g / 2, g).masked_fill_(a < b, 0) for maximum's a, as PyTorch's formula (a
// masked_fill: the losing side gets 0 even where g is NaN or inf).
struct maximum_op : elementwise_op {
    static constexpr const char* name = "maximum";
    static constexpr const char* device = "tg_max({0}, {1})";
    template <class V> static V apply(const V& a, const V& b) { return simd::max(a, b); }
    template <std::size_t I, class G, class Out, class A, class B>
    static constexpr auto vjp(G g, Out, A a, B b) {
        if constexpr (I == 0) return where(lt(a, b), lit<0>, grad_mul(g, lit<1> - lit<0.5> * eq(a, b)));
        else return where(lt(b, a), lit<0>, grad_mul(g, lit<1> - lit<0.5> * eq(a, b)));
    }
};
struct minimum_op : elementwise_op {
    static constexpr const char* name = "minimum";
    static constexpr const char* device = "tg_min({0}, {1})";
    template <class V> static V apply(const V& a, const V& b) { return simd::min(a, b); }
    template <std::size_t I, class G, class Out, class A, class B>
    static constexpr auto vjp(G g, Out, A a, B b) {
        if constexpr (I == 0) return where(gt(a, b), lit<0>, grad_mul(g, lit<1> - lit<0.5> * eq(a, b)));
        else return where(gt(b, a), lit<0>, grad_mul(g, lit<1> - lit<0.5> * eq(a, b)));
    }
};

}  // namespace detail

// Elementwise max(x, 0) (torch.relu); NaN passes through, gradient 0 at 0.
template <expression X> constexpr auto relu(X x) { return detail::make_node<detail::relu_op>(x); }
// Elementwise |x| (torch.abs); gradient sign(x), 0 at 0.
template <expression X> constexpr auto abs(X x) { return detail::make_node<detail::abs_op>(x); }
// Elementwise maximum of two broadcast operands (torch.maximum); NaN wins.
template <expression A, expression B>
constexpr auto max(A a, B b) {
    TYPEGRAD_DETAIL_CHECK_BROADCAST("max(a, b)", A, B);
    return detail::make_node<detail::maximum_op>(a, b);
}
// Elementwise minimum of two broadcast operands (torch.minimum); NaN wins.
template <expression A, expression B>
constexpr auto min(A a, B b) {
    TYPEGRAD_DETAIL_CHECK_BROADCAST("min(a, b)", A, B);
    return detail::make_node<detail::minimum_op>(a, b);
}

}  // namespace typegrad
