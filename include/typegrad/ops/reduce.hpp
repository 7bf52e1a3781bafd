#pragma once
// Whole-tensor reductions: sum, mean, max, min.
#include <typegrad/ops/broadcast.hpp>
#include <typegrad/ops/compare.hpp>

namespace typegrad {

template <expression X>
constexpr auto sum(X x) {
    return detail::make_node<detail::reduce_op<detail::reduce_kind::sum, scalar_shape>>(x);
}
template <expression X>
constexpr auto mean(X x) {
    return sum(x) * detail::make_node<detail::inv_count_op<scalar_shape>>(x);
}
template <expression X>
constexpr auto max(X x) {
    return detail::make_node<detail::reduce_op<detail::reduce_kind::max, scalar_shape>>(x);
}
template <expression X>
constexpr auto min(X x) {
    return detail::make_node<detail::reduce_op<detail::reduce_kind::min, scalar_shape>>(x);
}

namespace detail {
template <reduce_kind K, class Target>
template <std::size_t I, class G, class Out, class X>
constexpr auto reduce_op<K, Target>::vjp(G g, Out out, X x) {
    if constexpr (K == reduce_kind::sum) {
        return broadcast_like(g, x);
    } else {
        // Ties share the gradient evenly (torch.max / torch.amax over all elements).
        auto hit = eq(x, out);
        return broadcast_like(g, x) * hit / sum_to<Target>(hit);
    }
}
}  // namespace detail
}  // namespace typegrad
