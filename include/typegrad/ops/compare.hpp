#pragma once
// Comparison masks (0/1 in the operands' dtype, no gradient), where(), detach().
#include <typegrad/core/cpu/simd.hpp>
#include <typegrad/ops/op_base.hpp>

namespace typegrad {
namespace detail {

#define TYPEGRAD_DETAIL_MASK_OP(fn)                                                     \
    struct fn##_op : nondifferentiable_elementwise_op {                                  \
        static constexpr const char* name = #fn;                                         \
        static constexpr const char* device = "tg_" #fn "({0}, {1})";                    \
        template <class V> static V apply(const V& a, const V& b) { return simd::fn(a, b); } \
    };
TYPEGRAD_DETAIL_MASK_OP(gt)
TYPEGRAD_DETAIL_MASK_OP(ge)
TYPEGRAD_DETAIL_MASK_OP(lt)
TYPEGRAD_DETAIL_MASK_OP(le)
TYPEGRAD_DETAIL_MASK_OP(eq)
#undef TYPEGRAD_DETAIL_MASK_OP

struct detach_op : nondifferentiable_elementwise_op {
    static constexpr unsigned cost = 0;  // an identity: no instruction to recompute
    static constexpr const char* name = "detach";
    static constexpr const char* device = "{0}";
    template <class V> static V apply(const V& a) { return a; }
};
// x where finite, else 0: keeps stabilising shifts (log_sum_exp's max) finite.
struct finite_or_zero_op : nondifferentiable_elementwise_op {
    static constexpr const char* name = "finite_or_zero";
    static constexpr const char* device = "(tg_isfinite({0}) ? {0} : (T)0)";
    template <class V> static V apply(const V& a) { return simd::select(simd::is_finite(a), a, V(0)); }
};

// where(cond, a, b): cond is a mask (nonzero = true). Gradient flows to the chosen side only.
struct where_op : elementwise_op {
    static constexpr const char* name = "where";
    // apply(c, a, b) is a where c != 0, else b, lane by lane: a fused loop may resolve a
    // condition that is the same along its row once per row (exec/cpu/kernel.hpp).
    static constexpr bool selects = true;
    static constexpr const char* device = "({0} != (T)0 ? {1} : {2})";
    template <class V>
    // !(c == 0), not c != 0: a NaN condition is nonzero, and xsimd's batch != is false for NaN
    static V apply(const V& c, const V& a, const V& b) { return simd::select(c == V(0), b, a); }
    template <std::size_t I, class G, class Out, class C, class A, class B>
    static constexpr auto vjp(G g, Out, C c, A, B);
};

}  // namespace detail

#define TYPEGRAD_DETAIL_MASK_FN(fn)                                                     \
    template <expression A, expression B>                                              \
    constexpr auto fn(A a, B b) {                                                      \
        TYPEGRAD_DETAIL_CHECK_BROADCAST(#fn "(a, b)", A, B);                           \
        return detail::make_node<detail::fn##_op>(a, b);                               \
    }
// Elementwise a > b as a mask: 1 or 0 in the operands' dtype (torch.gt, which gives
// bool), broadcasting; no gradient flows through it.
TYPEGRAD_DETAIL_MASK_FN(gt)
// Elementwise a >= b as a mask: 1 or 0 in the operands' dtype (torch.ge, which gives
// bool), broadcasting; no gradient flows through it.
TYPEGRAD_DETAIL_MASK_FN(ge)
// Elementwise a < b as a mask: 1 or 0 in the operands' dtype (torch.lt, which gives
// bool), broadcasting; no gradient flows through it.
TYPEGRAD_DETAIL_MASK_FN(lt)
// Elementwise a <= b as a mask: 1 or 0 in the operands' dtype (torch.le, which gives
// bool), broadcasting; no gradient flows through it.
TYPEGRAD_DETAIL_MASK_FN(le)
// Elementwise a == b as a mask: 1 or 0 in the operands' dtype (torch.eq, which gives
// bool), broadcasting; no gradient flows through it.
TYPEGRAD_DETAIL_MASK_FN(eq)
#undef TYPEGRAD_DETAIL_MASK_FN

// The value of `a` with no gradient flowing back into it (torch.Tensor.detach, jax.lax.stop_gradient).
template <expression A>
constexpr auto detach(A a) { return detail::make_node<detail::detach_op>(a); }

// Elementwise c != 0 ? a : b, broadcasting all three (torch.where, jnp.where); the gradient flows
// to `a` where c holds and to `b` elsewhere, none to `c`. A shape mismatch is a static_assert.
template <expression C, expression A, expression B>
constexpr auto where(C c, A a, B b) {
    TYPEGRAD_DETAIL_CHECK_BROADCAST("where(cond, a, b)", A, B);
    TYPEGRAD_DETAIL_CHECK_BROADCAST("where(cond, a, b)", C, A);
    return detail::make_node<detail::where_op>(c, a, b);
}

namespace detail {
template <std::size_t I, class G, class Out, class C, class A, class B>
constexpr auto where_op::vjp(G g, Out, C c, A, B) {
    static_assert(I != 0, "typegrad: internal: where's condition carries no gradient");
    if constexpr (I == 1) return where(c, g, lit<0>);
    else return where(c, lit<0>, g);
}
}  // namespace detail
}  // namespace typegrad
