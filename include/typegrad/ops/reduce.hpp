#pragma once
// Reductions: over the whole tensor (tg::sum(x)) or over chosen axes (tg::sum(x, tg::axes<0, 2>),
// with tg::keepdim to keep them as extent 1), for sum, mean, max, min and prod.
#include <cstddef>
#include <cstdint>
#include <string>

#include <typegrad/core/device_kernel.hpp>
#include <typegrad/ops/broadcast.hpp>
#include <typegrad/ops/compare.hpp>
#include <typegrad/ops/op_base.hpp>
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

// prod's gradient at zeros: per slice of the reduction (an element of the product p), Part 0 is
// the number of zeros in x's slice (2 standing for two or more) and Part 1 the product of the
// slice's nonzero elements where it holds exactly one zero (else 0). A product that is neither 0
// nor NaN has no zero factor (0 times a finite number is 0 and times an infinity NaN, in any
// order), so its slice is not read: x is scanned only where p is 0 or NaN. (Counting the zeros
// and forming the product of the others in the forward's fused loop cost six instructions a
// batch beside the product's one: prod was 2.2x the hand-written loop.) Operands: p detached,
// x. Part 1's gradient is rest / x off the zero (the product of the slice's other nonzero
// factors), which second derivatives at a zero need; Part 0 is piecewise constant.
template <int Part>
struct prod_zeros_op : kernel_op_base {
    static constexpr const char* name = Part == 0 ? "prod_zero_count" : "prod_others";
    static constexpr bool differentiable = Part == 1;
    template <class P, class X>
    struct rule {
        using value_type = typename X::value_type;
        using shape_type = typename P::shape_type;
    };
    template <class N, class Ref>
    static void extents(const Ref* in, std::size_t* ext) {
        for (std::size_t a = 0; a < in[0].rank; ++a) ext[a] = in[0].ext[a];
    }
    // x's axis a is reduced where p lacks it (p may drop leading axes) or has extent 1 there
    template <class Ref>
    static bool reduced(const Ref& p, const Ref& x, std::size_t a) {
        const std::size_t lead = x.rank - p.rank;
        return a < lead || p.ext[a - lead] == 1;
    }
    template <class N, class Ref, class T>
    static void run(const Ref* in, T* out, const std::size_t*) {
        using P = type_at_t<0, typename N::children>;
        using X = type_at_t<1, typename N::children>;
        using V = typename X::value_type;
        using C = compute_t<V>;
        const Ref& p = in[0];
        const Ref& x = in[1];
        const auto* pp = static_cast<const buffer_t<P>*>(p.data);
        const auto* xp = static_cast<const buffer_t<X>*>(x.data);
        const std::size_t lead = x.rank - p.rank, slices = numel_of(p);
        std::size_t len = 1;
        for (std::size_t a = 0; a < x.rank; ++a)
            if (reduced(p, x, a)) len *= x.ext[a];
        // p is a reduction's dense result as a rule: read in order, no index arithmetic per slice
        // (many short slices, prod over rows of 4, had spent more here than in the product)
        const bool dense = is_row_major(p);
        for (std::size_t o = 0; o < slices; ++o) {
            const auto at = dense ? std::ptrdiff_t(o) : strided_offset(p, o);
            const C v = static_cast<C>(static_cast<compute_t<buffer_t<P>>>(pp[at]));
            out[o] = T(0.0f);
            if (v != C(0) && v == v) [[likely]]
                continue;
            C count = 0, rest = 1;
            // the slice's first element: o's index on p's kept axes (0 on its extent-1 ones)
            std::ptrdiff_t base = 0;
            for (std::size_t b = p.rank, r = o; b-- > 0;) {
                base += std::ptrdiff_t(r % p.ext[b]) * x.stride[b + lead];
                r /= p.ext[b];
            }
            for (std::size_t i = 0; i < len; ++i) {
                std::ptrdiff_t off = base;
                for (std::size_t a = x.rank, r = i; a-- > 0;) {
                    if (!reduced(p, x, a)) continue;
                    off += std::ptrdiff_t(r % x.ext[a]) * x.stride[a];
                    r /= x.ext[a];
                }
                const C e = static_cast<C>(static_cast<compute_t<buffer_t<X>>>(xp[off]));
                if (e == C(0)) count += C(1);
                else rest *= e;
            }
            const C result = Part == 0 ? (count < C(2) ? count : C(2)) : (count == C(1) ? rest : C(0));
            out[o] = convert_element<T, V>(result);
        }
    }
    // the device kernel: one thread per slice, the CPU's loop
    static constexpr const char* device_source = R"CUDA(
// prod's zero count (Part 0) and product of the others (Part 1). w: out, p ref, x ref
template <int Part, int V, int PB, int XB, int OB> __device__ void tg_prod_zeros(const tg_node_args& w) {
    typedef typename tg_ty<V>::C C;
    typename tg_ty<OB>::S* out = (typename tg_ty<OB>::S*)w.w[0];
    const tg_ref p = tg_ref_at(w, 1);
    const tg_ref x = tg_ref_at(w, 3 + 2 * p.rank);
    const typename tg_ty<PB>::S* pp = (const typename tg_ty<PB>::S*)p.p;
    const typename tg_ty<XB>::S* xp = (const typename tg_ty<XB>::S*)x.p;
    const int lead = x.rank - p.rank;
    tg_i64 len = 1;
    for (int a = 0; a < x.rank; ++a)
        if (a < lead || p.ext[a - lead] == 1) len *= (tg_i64)x.ext[a];
    TG_GRID_LOOP(o, tg_numel(p)) {
        const C v = (C)tg_ty<PB>::from(pp[tg_ref_offset(p, o)]);
        if (v != (C)0 && v == v) {
            out[o] = tg_ty<OB>::to((typename tg_ty<OB>::C)0);
            continue;
        }
        tg_i64 base = 0, r = o;
        for (int b = p.rank - 1; b >= 0; --b) {
            base += (r % (tg_i64)p.ext[b]) * (tg_i64)x.stride[b + lead];
            r /= (tg_i64)p.ext[b];
        }
        C count = 0, rest = 1;
        for (tg_i64 i = 0; i < len; ++i) {
            tg_i64 off = base, q = i;
            for (int a = x.rank - 1; a >= 0; --a) {
                if (!(a < lead || p.ext[a - lead] == 1)) continue;
                off += (q % (tg_i64)x.ext[a]) * (tg_i64)x.stride[a];
                q /= (tg_i64)x.ext[a];
            }
            const C e = (C)tg_ty<XB>::from(xp[off]);
            if (e == (C)0) count += (C)1;
            else rest *= e;
        }
        const C result = Part == 0 ? (count < (C)2 ? count : (C)2) : (count == (C)1 ? rest : (C)0);
        out[o] = tg_ty<OB>::to((typename tg_ty<OB>::C)result);
    }
}
)CUDA";
    template <class N>
    static std::string device_call() {
        using P = type_at_t<0, typename N::children>;
        using X = type_at_t<1, typename N::children>;
        return device_template_call("tg_prod_zeros", {Part, device_type_code<typename X::value_type>(),
                                                      device_type_code<buffer_t<P>>(), device_type_code<buffer_t<X>>(),
                                                      device_type_code<buffer_t<N>>()});
    }
    template <class N, class Ref>
    static std::size_t device_words(const Ref* in, void* out, const std::size_t*, std::uint64_t* w, void*) {
        w[0] = device_word(out);
        put_device_ref(w, put_device_ref(w, 1, in[0]), in[1]);
        const std::size_t n = numel_of(in[0]);
        return n > 0 ? n : 1;
    }
    // Part 1: d rest / d x = rest / x off the zero (rest is the product of the slice's other
    // nonzero factors); 0 at the zero, and where rest is 0 (no single zero: rest is constant)
    template <std::size_t I, class G, class Out, class P, class X>
    static constexpr auto vjp(G g, Out rest, P, X x) {
        static_assert(I == 1, "typegrad: internal: prod_others' product operand is detached");
        return where(eq(x, lit<0>), lit<0>, where(eq(rest, lit<0>), lit<0>, broadcast_like(g, x) * (rest / x)));
    }
};

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
            // zero g times the product of the others (prod_zeros_op, which reads x only where out
            // is 0 or NaN), and g * 0 at the slice's other elements; with two or more zeros exactly
            // 0, even for an infinite g (PyTorch's zeros_like). PyTorch's exclusive cumulative
            // products give NaN where a slice mixes a zero with inf or NaN elements; here the
            // others' gradient stays g * 0 (docs/reliability.md).
            // The slice's statistics enter per slice, not per element: the value its only zero
            // equals (NaN, equal to nothing, unless it has exactly one), the zero's and the others'
            // gradient, and whether x is the divisor (1 where the slice has a zero: the quotient
            // is not selected there, and out / 0 would make its second derivative NaN). Where the
            // slice holds no zero an element costs its division alone (the where on `none`,
            // below); elsewhere a comparison and selects (a product of masks per element had made
            // this loop 1.25x the hand-written one).
            auto zeros = make_node<prod_zeros_op<0>>(detach(out), x);
            auto rest = make_node<prod_zeros_op<1>>(detach(out), x);
            auto one = eq(zeros, lit<1>);
            auto none = eq(zeros, lit<0>);
            auto only_zero = where(one, lit<0>, lit<__builtin_nan("")>);
            auto others = where(one, g * lit<0>, lit<0>);
            // `none` outermost: it is the same along a reduced slice, so a fused loop resolves it
            // once per row (exec/cpu/kernel.hpp) and a slice without a zero runs the division alone.
            return where(none, grad_mul(broadcast_like(g, x), out / where(none, x, lit<1>)),
                         where(eq(x, only_zero), grad_mul(g, rest), others));
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
