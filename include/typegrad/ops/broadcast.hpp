#pragma once
// broadcast_to (expand) and its adjoint, the reduction to a shape (reduce_op, sum_to): the pair
// that gradients of broadcasting use, each the other's VJP, so they share a header; the user's
// reductions over axes build on them (ops/reduce.hpp).
#include <typegrad/ops/arithmetic.hpp>
#include <typegrad/ops/reduce_kind.hpp>

namespace typegrad {
namespace detail {

// Reduce X down to Target: Target is X's shape with some axes set to 1 or dropped in front.
template <reduce_kind K, class Target>
struct reduce_op {
    static constexpr op_kind kind = op_kind::reduce;
    static constexpr reduce_kind combine = K;
    static constexpr const char* name = reduce_kinds[std::size_t(K)].name;
    static constexpr bool differentiable = true;
    static constexpr bool shape_only(std::size_t) { return false; }
    // Autocast runs sum in float on CUDA and prod in float on both devices, as PyTorch's lists
    // (max and min are exact in any dtype).
    static constexpr autocast_class autocast_on(device_kind d) {
        return K == reduce_kind::sum    ? fp32_on_cuda(d)
               : K == reduce_kind::prod ? autocast_class::fp32
                                        : autocast_class::promote;
    }
    using target_shape = Target;
    template <class X>
    struct rule {
        using value_type = typename X::value_type;
        using shape_type = Target;
    };
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out out, X x);
};

template <class Target, class Full>
constexpr bool reduces_to() {
    if (Target::rank > Full::rank) return false;
    const std::size_t lead = Full::rank - Target::rank;
    for (std::size_t i = 0; i < Target::rank; ++i) {
        const std::size_t t = Target::extents[i], f = Full::extents[i + lead];
        if (t != f && t != 1) return false;
    }
    return true;
}

// The value an elementwise root is stored as: x broadcast to Like's shape.
struct expand_op {
    static constexpr op_kind kind = op_kind::elementwise;
    static constexpr const char* name = "expand";
    static constexpr const char* device = "{0}";
    static constexpr unsigned cost = 0;  // an identity: no instruction to recompute
    static constexpr bool differentiable = true;
    static constexpr bool shape_only(std::size_t i) { return i == 1; }
    template <class X, class Like>
    struct rule {
        using value_type = promote_t<typename X::value_type, typename Like::value_type>;
        using shape_type = typename Like::shape_type;
    };
    template <class V> static V apply(const V& x) { return x; }
    template <std::size_t I, class G, class Out, class X, class Like>
    static constexpr auto vjp(G g, Out, X, Like);
};

template <class Target, expression X>
constexpr auto sum_to(X x) {
    if constexpr (std::is_same_v<Target, typename X::shape_type>) return x;
    else return make_node<reduce_op<reduce_kind::sum, Target>>(x);
}

}  // namespace detail

// broadcast_like(x, like): x expanded to like's (run-time) shape; the gradient sums back to x's
// shape.
template <expression X, expression Like>
constexpr auto broadcast_like(X x, Like like) {
    static_assert(detail::reduces_to<typename X::shape_type, typename Like::shape_type>(),
                  "typegrad: broadcast_like(x, like) needs x's shape to broadcast to like's shape "
                  "(x's extents equal like's or are 1, right-aligned)");
    if constexpr (std::is_same_v<typename X::shape_type, typename Like::shape_type> &&
                  std::is_same_v<typename X::value_type,
                                 promote_t<typename X::value_type, typename Like::value_type>>)
        return x;
    else return detail::make_node<detail::expand_op>(x, like);
}

namespace detail {
template <std::size_t I, class G, class Out, class X, class Like>
constexpr auto expand_op::vjp(G g, Out, X, Like) { return sum_to<typename X::shape_type>(g); }
}  // namespace detail
}  // namespace typegrad
