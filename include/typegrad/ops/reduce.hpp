#pragma once
// Reductions: over the whole tensor (tg::sum(x)) or over chosen axes (tg::sum(x, tg::axes<0, 2>),
// with tg::keepdim to keep them as extent 1), for sum, mean, max, min and prod.
#include <typegrad/ops/broadcast.hpp>
#include <typegrad/ops/compare.hpp>
#include <typegrad/ops/view.hpp>

namespace typegrad {

// The axes a reduction runs over, as a type: pass tg::axes<a...>. Negative axes count from the end.
template <int... Axes>
struct axes_t {};
// The axes a reduction runs over: tg::sum(x, tg::axes<0, 2>) (PyTorch: dim=(0, 2)). Negative
// axes count from the end; an axis x does not have, or one named twice, is a static_assert.
template <int... Axes>
inline constexpr axes_t<Axes...> axes{};
// Tag type of tg::keepdim.
struct keepdim_t {
    explicit constexpr keepdim_t() = default;
};
// Keep the reduced axes as extent 1: tg::sum(x, tg::axes<1>, tg::keepdim) (PyTorch: keepdim=True).
inline constexpr keepdim_t keepdim{};

namespace detail {

// mean's divisor: 1 / (product of the extents of X that a reduction to Target removes).
template <class Target>
struct inv_count_op {
    static constexpr op_kind kind = op_kind::meta;
    static constexpr const char* name = "inv_count";
    static constexpr bool differentiable = false;
    static constexpr bool shape_only(std::size_t) { return true; }
    using target_shape = Target;
    template <class X>
    struct rule {
        using value_type = typename X::value_type;
        using shape_type = scalar_shape;
    };
};

template <class S, int... Axes>
constexpr bool axes_valid() {
    std::array<bool, max_rank> seen{};
    for (int a : {Axes...}) {
        const int n = a < 0 ? int(S::rank) + a : a;
        if (n < 0 || n >= int(S::rank) || seen[std::size_t(n)]) return false;
        seen[std::size_t(n)] = true;
    }
    return true;
}
template <class S, int... Axes>
constexpr bool reduced_axis(std::size_t i) {
    for (int a : {Axes...})
        if ((a < 0 ? int(S::rank) + a : a) == int(i)) return true;
    return false;
}
// X's shape with the reduced axes set to 1.
template <class S, int... Axes>
struct keepdim_shape {
    template <std::size_t... Is>
    static auto make(std::index_sequence<Is...>) -> shape<(reduced_axis<S, Axes...>(Is) ? 1 : S::extents[Is])...>;
    using type = decltype(make(std::make_index_sequence<S::rank>{}));
};

// The reduced axes, highest first, so that squeezing them one by one keeps indices valid.
template <class S, int... Axes>
struct descending_axes {
    static constexpr auto value = [] {
        std::array<std::size_t, sizeof...(Axes)> r{std::size_t(Axes < 0 ? int(S::rank) + Axes : Axes)...};
        std::sort(r.begin(), r.end(), [](std::size_t a, std::size_t b) { return a > b; });
        return r;
    }();
};
template <std::size_t K, class Desc, expression E>
constexpr auto squeeze_chain(E e) {
    if constexpr (K == Desc::value.size()) return e;
    else return squeeze_chain<K + 1, Desc>(make_node<squeeze_op<Desc::value[K]>>(e));
}
template <class S, int... Axes, expression E>
constexpr auto drop_axes(E e) {
    return squeeze_chain<0, descending_axes<S, Axes...>>(e);
}

template <reduce_kind K, bool Keep, int... Axes, expression X>
constexpr auto reduce_axes(X x) {
    using S = typename X::shape_type;
    using target = typename keepdim_shape<S, Axes...>::type;
    auto r = make_node<reduce_op<K, target>>(x);
    if constexpr (Keep) return r;
    else return drop_axes<S, Axes...>(r);
}

}  // namespace detail

#define TYPEGRAD_DETAIL_CHECK_AXES(fname)                                                          \
    static_assert(detail::axes_valid<typename X::shape_type, Axes...>(),                           \
                  "typegrad: " fname "(x, tg::axes<...>) names an axis x does not have, or one "   \
                  "axis twice.")

// Sum of all elements (a scalar). sum(x, tg::axes<a...>) reduces the named axes, sum(x,
// tg::axes<a...>, tg::keepdim) keeps them as extent 1.
template <expression X>
constexpr auto sum(X x) {
    return detail::make_node<detail::reduce_op<detail::reduce_kind::sum, scalar_shape>>(x);
}
// Sum over the named axes, which are dropped (torch.sum(x, dim=(a, ...))).
template <expression X, int... Axes>
constexpr auto sum(X x, axes_t<Axes...>) {
    TYPEGRAD_DETAIL_CHECK_AXES("sum");
    return detail::reduce_axes<detail::reduce_kind::sum, false, Axes...>(x);
}
// Sum over the named axes, kept as extent 1 (torch.sum(x, dim, keepdim=True)).
template <expression X, int... Axes>
constexpr auto sum(X x, axes_t<Axes...>, keepdim_t) {
    TYPEGRAD_DETAIL_CHECK_AXES("sum");
    return detail::reduce_axes<detail::reduce_kind::sum, true, Axes...>(x);
}

// Mean of all elements; with tg::axes<a...> (and tg::keepdim) over those axes, as sum.
template <expression X>
constexpr auto mean(X x) {
    return sum(x) * detail::make_node<detail::inv_count_op<scalar_shape>>(x);
}
// Mean over the named axes, kept as extent 1 (torch.mean(x, dim, keepdim=True)).
template <expression X, int... Axes>
constexpr auto mean(X x, axes_t<Axes...>, keepdim_t) {
    TYPEGRAD_DETAIL_CHECK_AXES("mean");
    using target = typename detail::keepdim_shape<typename X::shape_type, Axes...>::type;
    return sum(x, axes<Axes...>, keepdim) * detail::make_node<detail::inv_count_op<target>>(x);
}
// Mean over the named axes, which are dropped (torch.mean(x, dim=(a, ...))).
template <expression X, int... Axes>
constexpr auto mean(X x, axes_t<Axes...> a) {
    return detail::drop_axes<typename X::shape_type, Axes...>(mean(x, a, keepdim));
}

// Largest element; with tg::axes<a...> (and tg::keepdim) along those axes. The gradient is shared
// evenly among tied maxima; NaN wins.
template <expression X>
constexpr auto max(X x) {
    return detail::make_node<detail::reduce_op<detail::reduce_kind::max, scalar_shape>>(x);
}
// Largest element along the named axes, which are dropped (torch.amax(x, dim)).
template <expression X, int... Axes>
constexpr auto max(X x, axes_t<Axes...>) {
    TYPEGRAD_DETAIL_CHECK_AXES("max");
    return detail::reduce_axes<detail::reduce_kind::max, false, Axes...>(x);
}
// Largest element along the named axes, kept as extent 1 (torch.amax(x, dim, keepdim=True)).
template <expression X, int... Axes>
constexpr auto max(X x, axes_t<Axes...>, keepdim_t) {
    TYPEGRAD_DETAIL_CHECK_AXES("max");
    return detail::reduce_axes<detail::reduce_kind::max, true, Axes...>(x);
}
// Smallest element; the forms and gradient rule of max.
template <expression X>
constexpr auto min(X x) {
    return detail::make_node<detail::reduce_op<detail::reduce_kind::min, scalar_shape>>(x);
}
// Smallest element along the named axes, which are dropped (torch.amin(x, dim)).
template <expression X, int... Axes>
constexpr auto min(X x, axes_t<Axes...>) {
    TYPEGRAD_DETAIL_CHECK_AXES("min");
    return detail::reduce_axes<detail::reduce_kind::min, false, Axes...>(x);
}
// Smallest element along the named axes, kept as extent 1 (torch.amin(x, dim, keepdim=True)).
template <expression X, int... Axes>
constexpr auto min(X x, axes_t<Axes...>, keepdim_t) {
    TYPEGRAD_DETAIL_CHECK_AXES("min");
    return detail::reduce_axes<detail::reduce_kind::min, true, Axes...>(x);
}
// Product of all elements (torch.prod); with tg::axes<a...> (and tg::keepdim) over those axes.
// A reduction of its own kind (one pass, any sign, zeros exact), not exp(sum(log x)). The
// gradient is torch.prod's: out / x while the reduced slice holds no zero; where it holds exactly
// one, the product of the other elements at the zero and 0 elsewhere; with more zeros, 0.
// (Where a slice holds a zero and an inf or NaN, the elements other than the zero get 0, not
// PyTorch's NaN.)
// Autocast runs it in float, on the CPU as on CUDA (PyTorch's fp32 list).
template <expression X>
constexpr auto prod(X x) {
    return detail::make_node<detail::reduce_op<detail::reduce_kind::prod, scalar_shape>>(x);
}
// Product along the named axes, which are dropped (torch.prod(x, dim); any number of axes).
template <expression X, int... Axes>
constexpr auto prod(X x, axes_t<Axes...>) {
    TYPEGRAD_DETAIL_CHECK_AXES("prod");
    return detail::reduce_axes<detail::reduce_kind::prod, false, Axes...>(x);
}
// Product along the named axes, kept as extent 1 (torch.prod(x, dim, keepdim=True)).
template <expression X, int... Axes>
constexpr auto prod(X x, axes_t<Axes...>, keepdim_t) {
    TYPEGRAD_DETAIL_CHECK_AXES("prod");
    return detail::reduce_axes<detail::reduce_kind::prod, true, Axes...>(x);
}
#undef TYPEGRAD_DETAIL_CHECK_AXES

namespace detail {
template <reduce_kind K, class Target>
template <std::size_t I, class G, class Out, class X>
constexpr auto reduce_op<K, Target>::vjp(G g, Out out, X x) {
    if constexpr (K == reduce_kind::sum) {
        return broadcast_like(g, x);
    } else if constexpr (K == reduce_kind::prod) {
        if constexpr (X::shape_type::rank == 0) {
            return g;  // torch.prod of a 0-d tensor passes g through (out / x would be NaN at inf)
        } else {
            // torch.prod's backward: g out / x without a zero (exact to rounding); at a slice's only
            // zero g times the product of the others, a second product over x that the planner
            // fuses into the forward's loop, and g * 0 at the slice's other elements; with two or
            // more zeros exactly 0, even for an infinite g (PyTorch's zeros_like). PyTorch's
            // exclusive cumulative products give NaN where a slice mixes a zero with inf or NaN
            // elements; here the others' gradient stays g * 0 (docs/reliability.md).
            auto zero = eq(x, lit<0>);
            auto zeros = sum_to<Target>(zero);
            auto rest = make_node<reduce_op<reduce_kind::prod, Target>>(where(zero, lit<1>, x));
            auto others = where(eq(zeros, lit<0>), out / x, where(zero * eq(zeros, lit<1>), rest, lit<0>));
            return where(ge(zeros, lit<2>), lit<0>, grad_mul(broadcast_like(g, x), others));
        }
    } else {
        // Ties share the gradient evenly (torch.max / torch.amax); a NaN result (max and min
        // propagate NaN) shares it among the NaN elements, as PyTorch's evenly_distribute_backward.
        // The others get 0 even where g is NaN or inf (a masked_fill in PyTorch, not a product).
        auto hit = eq(x, out) + (lit<1> - eq(x, x)) * (lit<1> - eq(out, out));
        return where(hit, broadcast_like(g, x) / sum_to<Target>(hit), lit<0>);
    }
}
}  // namespace detail
}  // namespace typegrad
