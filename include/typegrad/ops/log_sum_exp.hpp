#pragma once
// log(sum(exp(x))) without overflow: shift by the (detached) maximum.
#include <typegrad/ops/exp_log.hpp>
#include <typegrad/ops/reduce.hpp>

namespace typegrad {
namespace detail {
template <expression X>
constexpr auto finite_or_zero(X x) { return make_node<finite_or_zero_op>(x); }
}  // namespace detail

// The shift carries no gradient, so d/dx = softmax(x) exactly; an all -inf input gives -inf.
template <expression X>
constexpr auto log_sum_exp(X x) {
    auto shift = detach(detail::finite_or_zero(max(x)));
    return shift + log(sum(exp(x - shift)));
}

}  // namespace typegrad
