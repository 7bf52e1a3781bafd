#pragma once
// + - * / and negation: operators on expressions, constant folding, and the identities that
// keep gradient graphs small (x*1, x+0, -(-x)).
#include <bit>
#include <cstdint>

#include <typegrad/ops/op_base.hpp>

namespace typegrad {
namespace detail {

struct add_op : elementwise_op {
    static constexpr const char* name = "add";
    static constexpr const char* device = "({0} + {1})";
    template <class V> static V apply(const V& a, const V& b) { return a + b; }
    template <std::size_t I, class G, class Out, class A, class B>
    static constexpr auto vjp(G g, Out, A, B) { return g; }
};
struct sub_op : elementwise_op {
    static constexpr const char* name = "sub";
    static constexpr const char* device = "({0} - {1})";
    template <class V> static V apply(const V& a, const V& b) { return a - b; }
    template <std::size_t I, class G, class Out, class A, class B>
    static constexpr auto vjp(G g, Out, A, B);
};
struct mul_op : elementwise_op {
    static constexpr const char* name = "mul";
    static constexpr const char* device = "({0} * {1})";
    template <class V> static V apply(const V& a, const V& b) { return a * b; }
    template <std::size_t I, class G, class Out, class A, class B>
    static constexpr auto vjp(G g, Out, A a, B b);
};
struct div_op : elementwise_op {
    static constexpr unsigned cost = 4;
    static constexpr const char* name = "div";
    static constexpr const char* device = "({0} / {1})";
    template <class V> static V apply(const V& a, const V& b) { return a / b; }
    template <std::size_t I, class G, class Out, class A, class B>
    static constexpr auto vjp(G g, Out out, A a, B b);
};
struct neg_op : elementwise_op {
    static constexpr const char* name = "neg";
    static constexpr const char* device = "(-{0})";
    template <class V> static V apply(const V& a) { return -a; }
    template <std::size_t I, class G, class Out, class A>
    static constexpr auto vjp(G g, Out, A);
};

template <class N>
inline constexpr bool is_neg_v = false;
template <class X>
inline constexpr bool is_neg_v<node<neg_op, X>> = true;

// A constant folds into the other operand only when that cannot change the result's shape.
template <class Keep, class Const>
inline constexpr bool identity_applies_v = std::is_same_v<typename Const::shape_type, scalar_shape>;

}  // namespace detail

// Elementwise a + b with numpy broadcasting (static extents equal or 1; dynamic extents never
// broadcast).
template <expression A, expression B>
constexpr auto operator+(A a, B b) {
    TYPEGRAD_DETAIL_CHECK_BROADCAST("operator+(a, b)", A, B);
    using NA = typename A::node_type;
    using NB = typename B::node_type;
    if constexpr (is_constant_v<NA> && is_constant_v<NB>) return lit<NA::value + NB::value>;
    else if constexpr ((detail::constant_of<NB>::value == 0.0)) return a;
    else if constexpr ((detail::constant_of<NA>::value == 0.0)) return b;
    else return detail::make_node<detail::add_op>(a, b);
}
// Elementwise a - b, broadcast as operator+.
template <expression A, expression B>
constexpr auto operator-(A a, B b) {
    TYPEGRAD_DETAIL_CHECK_BROADCAST("operator-(a, b)", A, B);
    using NA = typename A::node_type;
    using NB = typename B::node_type;
    if constexpr (is_constant_v<NA> && is_constant_v<NB>) return lit<NA::value - NB::value>;
    else if constexpr ((detail::constant_of<NB>::value == 0.0)) return a;
    else return detail::make_node<detail::sub_op>(a, b);
}
// Elementwise a * b, broadcast as operator+.
template <expression A, expression B>
constexpr auto operator*(A a, B b) {
    TYPEGRAD_DETAIL_CHECK_BROADCAST("operator*(a, b)", A, B);
    using NA = typename A::node_type;
    using NB = typename B::node_type;
    if constexpr (is_constant_v<NA> && is_constant_v<NB>) return lit<NA::value * NB::value>;
    else if constexpr ((detail::constant_of<NB>::value == 1.0)) return a;
    else if constexpr ((detail::constant_of<NA>::value == 1.0)) return b;
    else return detail::make_node<detail::mul_op>(a, b);
}
// Elementwise a / b, broadcast as operator+.
template <expression A, expression B>
constexpr auto operator/(A a, B b) {
    TYPEGRAD_DETAIL_CHECK_BROADCAST("operator/(a, b)", A, B);
    using NA = typename A::node_type;
    using NB = typename B::node_type;
    if constexpr (is_constant_v<NA> && is_constant_v<NB>) return lit<NA::value / NB::value>;
    else if constexpr ((detail::constant_of<NB>::value == 1.0)) return a;
    else return detail::make_node<detail::div_op>(a, b);
}
// Elementwise negation.
template <expression A>
constexpr auto operator-(A a) {
    using NA = typename A::node_type;
    if constexpr (is_constant_v<NA>) return lit<-NA::value>;
    else if constexpr (detail::is_neg_v<NA>) return expr<detail::type_at_t<0, typename NA::children>>{};
    else return detail::make_node<detail::neg_op>(a);
}
// Elementwise negation, the same as -a.
template <expression A>
constexpr auto neg(A a) { return -a; }

// Plain numbers are not graph values: say what to write instead.
#define TYPEGRAD_DETAIL_REJECT_NUMBER_OPERATOR(op)                                                \
    template <expression A, class S>                                                              \
        requires std::is_arithmetic<S>::value                                                          \
    constexpr auto operator op(A, S) {                                                            \
        TYPEGRAD_DETAIL_NO_RUNTIME_NUMBER("operator" #op "(expression, number)");                 \
        return A{};                                                                               \
    }                                                                                             \
    template <class S, expression A>                                                              \
        requires std::is_arithmetic<S>::value                                                          \
    constexpr auto operator op(S, A) {                                                            \
        TYPEGRAD_DETAIL_NO_RUNTIME_NUMBER("operator" #op "(number, expression)");                 \
        return A{};                                                                               \
    }
// Rejected with a `typegrad:` static_assert: `expression + number` (either order) with a plain
// number; write a compile-time constant, tg::lit<2.5>, or bind a run-time value through a tg::input.
TYPEGRAD_DETAIL_REJECT_NUMBER_OPERATOR(+)
// Rejected with a `typegrad:` static_assert: `expression - number` (either order) with a plain
// number; write a compile-time constant, tg::lit<2.5>, or bind a run-time value through a tg::input.
TYPEGRAD_DETAIL_REJECT_NUMBER_OPERATOR(-)
// Rejected with a `typegrad:` static_assert: `expression * number` (either order) with a plain
// number; write a compile-time constant, tg::lit<2.5>, or bind a run-time value through a tg::input.
TYPEGRAD_DETAIL_REJECT_NUMBER_OPERATOR(*)
// Rejected with a `typegrad:` static_assert: `expression / number` (either order) with a plain
// number; write a compile-time constant, tg::lit<2.5>, or bind a run-time value through a tg::input.
TYPEGRAD_DETAIL_REJECT_NUMBER_OPERATOR(/)
#undef TYPEGRAD_DETAIL_REJECT_NUMBER_OPERATOR

namespace detail {
// Gradient products. An adjoint that is a broadcast constant (the seed of a sum, say) times a
// value of the same shape is just the constant times the value: the graph stays small and the
// kernels do not multiply by 1. Constant factors also merge where that is exact: c1 * (y * c2) is
// y * (c1 * c2) bit for bit when c1 or c2 is a power of two (scaling by 2^k commutes with
// rounding), so `-0.5 * square(z) * s`'s gradient is one multiply, z * -s, as a hand loop writes
// it. (Out of float's range the merged product is the closer one: z * 2 no longer overflows.)
struct expand_op;
template <class N>
struct constant_expand {
    static constexpr bool value = false;
};
template <std::uint64_t V, class Like>
struct constant_expand<node<expand_op, constant<V>, Like>> {
    static constexpr bool value = true;
    static constexpr double c = constant<V>::value;
    using like = Like;
};
// A value as base * c for a compile-time c: y * c, c * y and -y; `value` false for any other.
template <class N>
struct scaled {
    static constexpr bool value = false;
};
template <class Y, std::uint64_t V>
struct scaled<node<mul_op, Y, constant<V>>> {
    static constexpr bool value = true;
    static constexpr double c = constant<V>::value;
    using base = Y;
};
template <class Y, std::uint64_t V>
    requires(!is_constant_v<Y>)
struct scaled<node<mul_op, constant<V>, Y>> : scaled<node<mul_op, Y, constant<V>>> {};
template <class Y>
struct scaled<node<neg_op, Y>> {
    static constexpr bool value = true;
    static constexpr double c = -1.0;
    using base = Y;
};
// +-2^k, a normal double: multiplying by it is exact.
constexpr bool power_of_two(double c) {
    const auto bits = std::bit_cast<std::uint64_t>(c);
    const auto exponent = (bits >> 52) & 0x7ff;
    return (bits & 0xfffffffffffffULL) == 0 && exponent != 0 && exponent != 0x7ff;
}
// a * b exact and within float's normal range, so that rounding it to the kernel's dtype once
// equals rounding the factors (for values in range; out of it the merged product is the closer).
constexpr bool exact_product(double a, double b) {
    const double p = a * b < 0 ? -(a * b) : a * b;
    return (power_of_two(a) || power_of_two(b)) && p >= 0x1p-126 && p <= 0x1p127;
}
// e * K with constant factors merged where exact; otherwise when they are not. (K as its bits:
// clang 14 takes no floating-point template arguments.)
template <std::uint64_t KBits, expression E, class Otherwise>
constexpr auto scale(E, Otherwise otherwise) {
    constexpr double K = std::bit_cast<double>(KBits);
    using N = typename E::node_type;
    if constexpr (constant_expand<N>::value) {
        if constexpr (exact_product(constant_expand<N>::c, K))
            return make_node<expand_op>(lit<constant_expand<N>::c * K>, expr<typename constant_expand<N>::like>{});
        else return otherwise;
    } else if constexpr (scaled<N>::value) {
        if constexpr (exact_product(scaled<N>::c, K)) {
            constexpr double p = scaled<N>::c * K;
            using base = expr<typename scaled<N>::base>;
            if constexpr (p == 1.0) return base{};
            else if constexpr (p == -1.0) return -base{};
            else return base{} * lit<p>;
        } else return otherwise;
    } else return otherwise;
}
template <class G, class X>
constexpr bool folds_into() {
    using NG = typename G::node_type;
    if constexpr (constant_expand<NG>::value)
        return std::is_same_v<typename constant_expand<NG>::like::shape_type, typename X::shape_type>;
    else return false;
}
template <expression G, expression X>
constexpr auto grad_mul(G g, X x) {
    using NG = typename G::node_type;
    using NX = typename X::node_type;
    if constexpr (folds_into<G, X>())
        return scale<std::bit_cast<std::uint64_t>(constant_expand<NG>::c)>(x, lit<constant_expand<NG>::c> * x);
    else if constexpr (is_constant_v<NX>) return scale<std::bit_cast<std::uint64_t>(NX::value)>(g, g * x);
    else return g * x;
}
template <expression G, expression X>
constexpr auto grad_div(G g, X x) {
    using NX = typename X::node_type;
    if constexpr (folds_into<G, X>()) return expr<type_at_t<0, typename G::node_type::children>>{} / x;
    else if constexpr (power_of_two(constant_of<NX>::value))
        return scale<std::bit_cast<std::uint64_t>(1.0 / NX::value)>(g, g / x);
    else return g / x;
}
template <expression G>
constexpr auto grad_neg(G g) { return scale<std::bit_cast<std::uint64_t>(-1.0)>(g, -g); }

template <std::size_t I, class G, class Out, class A, class B>
constexpr auto sub_op::vjp(G g, Out, A, B) {
    if constexpr (I == 0) return g; else return grad_neg(g);
}
template <std::size_t I, class G, class Out, class A, class B>
constexpr auto mul_op::vjp(G g, Out, A a, B b) {
    if constexpr (I == 0) return grad_mul(g, b); else return grad_mul(g, a);
}
template <std::size_t I, class G, class Out, class A, class B>
constexpr auto div_op::vjp(G g, Out out, A, B b) {
    if constexpr (I == 0) return grad_div(g, b); else return -(grad_mul(g, out) / b);
}
template <std::size_t I, class G, class Out, class A>
constexpr auto neg_op::vjp(G g, Out, A) { return grad_neg(g); }
}  // namespace detail

}  // namespace typegrad
