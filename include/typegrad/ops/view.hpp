#pragma once
// Views: permute/transpose, reshape, unsqueeze/squeeze, slice. A view is never a copy: it gives
// its (materialised) input new extents and strides. broadcast_to is elementwise (fused), and
// contiguous() is the explicit copy reshape inserts when its input is strided.
#include <algorithm>
#include <array>
#include <cstring>
#include <string>

#include <typegrad/core/device_kernel.hpp>
#include <typegrad/core/error.hpp>
#include <typegrad/ops/arithmetic.hpp>
#include <typegrad/ops/broadcast.hpp>

namespace typegrad {
namespace detail {

template <class Derived>
struct view_op_base {
    static constexpr op_kind kind = op_kind::view;
    static constexpr bool differentiable = true;
    static constexpr bool shape_only(std::size_t i) { return i > 0; }
};

// ---- permute --------------------------------------------------------------------------------
template <std::size_t... Ps>
struct permute_op : view_op_base<permute_op<Ps...>> {
    static constexpr const char* name = "permute";
    static constexpr std::array<std::size_t, sizeof...(Ps)> perm{Ps...};
    static constexpr bool keeps_contiguity = [] {
        for (std::size_t i = 0; i < perm.size(); ++i)
            if (perm[i] != i) return false;
        return true;
    }();
    template <class X>
    struct rule {
        using value_type = typename X::value_type;
        using shape_type = shape<X::shape_type::extents[Ps]...>;
    };
    template <class N, class Ref>
    static void layout(const Ref* in, std::size_t* ext, std::ptrdiff_t* stride, std::ptrdiff_t& offset) {
        for (std::size_t i = 0; i < perm.size(); ++i) {
            ext[i] = in[0].ext[perm[i]];
            stride[i] = in[0].stride[perm[i]];
        }
        offset = 0;
    }
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X);
};

template <std::size_t... Ps>
constexpr bool is_permutation() {
    std::array<std::size_t, sizeof...(Ps)> p{Ps...};
    std::sort(p.begin(), p.end());
    for (std::size_t i = 0; i < p.size(); ++i)
        if (p[i] != i) return false;
    return true;
}

// The permutation that undoes permute<Ps...>.
template <std::size_t... Ps>
constexpr std::array<std::size_t, sizeof...(Ps)> inverse_perm() {
    constexpr std::array<std::size_t, sizeof...(Ps)> p{Ps...};
    std::array<std::size_t, sizeof...(Ps)> r{};
    for (std::size_t i = 0; i < p.size(); ++i) r[p[i]] = i;
    return r;
}

// A node that is a permute of its one operand: its permutation and that operand.
template <class N>
struct permute_node : std::false_type {};
template <std::size_t... Qs, class Y>
struct permute_node<node<permute_op<Qs...>, Y>> : std::true_type {
    static constexpr std::array<std::size_t, sizeof...(Qs)> perm{Qs...};
    using operand = Y;
};

// ---- reshape (contiguous input; one dynamic extent may be inferred) --------------------------
template <class Target>
struct reshape_op : view_op_base<reshape_op<Target>> {
    static constexpr const char* name = "reshape";
    static constexpr bool keeps_contiguity = true;
    template <class X>
    struct rule {
        using value_type = typename X::value_type;
        using shape_type = Target;
    };
    template <class N, class Ref>
    static void layout(const Ref* in, std::size_t* ext, std::ptrdiff_t* stride, std::ptrdiff_t& offset) {
        std::size_t total = 1;
        for (std::size_t a = 0; a < in[0].rank; ++a) total *= in[0].ext[a];
        std::size_t fixed = 1;
        for (std::size_t a = 0; a < Target::rank; ++a)
            if (Target::extents[a] != dyn) fixed *= Target::extents[a];
        for (std::size_t a = 0; a < Target::rank; ++a) {
            ext[a] = Target::extents[a];
            if (ext[a] == dyn) ext[a] = fixed ? total / fixed : 0;
        }
        if (fixed * (Target::dyn_count ? ext_of_dyn(ext) : 1) != total)
            fail<shape_error>({"typegrad: reshape cannot view ", total, " elements as the target shape"});
        std::ptrdiff_t s = 1;
        for (std::size_t a = Target::rank; a-- > 0;) {
            stride[a] = s;
            s *= static_cast<std::ptrdiff_t>(ext[a]);
        }
        offset = 0;
    }
    static std::size_t ext_of_dyn(const std::size_t* ext) {
        for (std::size_t a = 0; a < Target::rank; ++a)
            if (Target::extents[a] == dyn) return ext[a];
        return 1;
    }
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X x);
};

// reshape to the (run-time) shape of another node: the adjoint of reshape.
struct reshape_like_op : view_op_base<reshape_like_op> {
    static constexpr const char* name = "reshape_like";
    static constexpr bool keeps_contiguity = true;
    template <class X, class Like>
    struct rule {
        using value_type = typename X::value_type;
        using shape_type = typename Like::shape_type;
    };
    template <class N, class Ref>
    static void layout(const Ref* in, std::size_t* ext, std::ptrdiff_t* stride, std::ptrdiff_t& offset) {
        std::size_t total = 1, like = 1;
        for (std::size_t a = 0; a < in[0].rank; ++a) total *= in[0].ext[a];
        for (std::size_t a = 0; a < in[1].rank; ++a) like *= (ext[a] = in[1].ext[a]);
        if (total != like)
            fail<shape_error>({"typegrad: reshape_like cannot view ", total, " elements as ", like});
        std::ptrdiff_t s = 1;
        for (std::size_t a = in[1].rank; a-- > 0;) {
            stride[a] = s;
            s *= static_cast<std::ptrdiff_t>(ext[a]);
        }
        offset = 0;
    }
    template <std::size_t I, class G, class Out, class X, class Like>
    static constexpr auto vjp(G g, Out, X x, Like);
};

// ---- unsqueeze / squeeze ---------------------------------------------------------------------
template <std::size_t Axis>
struct unsqueeze_op : view_op_base<unsqueeze_op<Axis>> {
    static constexpr const char* name = "unsqueeze";
    static constexpr bool keeps_contiguity = true;
    template <class X, class Seq = std::make_index_sequence<X::shape_type::rank + 1>>
    struct rule_impl;
    template <class X, std::size_t... Is>
    struct rule_impl<X, std::index_sequence<Is...>> {
        using type = shape<(Is < Axis ? X::shape_type::extents[Is] : Is == Axis ? 1 : X::shape_type::extents[Is - 1])...>;
    };
    template <class X>
    struct rule {
        using value_type = typename X::value_type;
        using shape_type = typename rule_impl<X>::type;
    };
    template <class N, class Ref>
    static void layout(const Ref* in, std::size_t* ext, std::ptrdiff_t* stride, std::ptrdiff_t& offset) {
        for (std::size_t a = 0, b = 0; a < in[0].rank + 1; ++a) {
            if (a == Axis) {
                ext[a] = 1;
                stride[a] = b < in[0].rank ? in[0].stride[b] * std::ptrdiff_t(in[0].ext[b]) : 1;
            } else {
                ext[a] = in[0].ext[b];
                stride[a] = in[0].stride[b];
                ++b;
            }
        }
        offset = 0;
    }
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X);
};

template <std::size_t Axis>
struct squeeze_op : view_op_base<squeeze_op<Axis>> {
    static constexpr const char* name = "squeeze";
    static constexpr bool keeps_contiguity = true;
    template <class X, class Seq = std::make_index_sequence<X::shape_type::rank - 1>>
    struct rule_impl;
    template <class X, std::size_t... Is>
    struct rule_impl<X, std::index_sequence<Is...>> {
        using type = shape<X::shape_type::extents[Is < Axis ? Is : Is + 1]...>;
    };
    template <class X>
    struct rule {
        using value_type = typename X::value_type;
        using shape_type = typename rule_impl<X>::type;
    };
    template <class N, class Ref>
    static void layout(const Ref* in, std::size_t* ext, std::ptrdiff_t* stride, std::ptrdiff_t& offset) {
        for (std::size_t a = 0, b = 0; a < in[0].rank; ++a) {
            if (a == Axis) continue;
            ext[b] = in[0].ext[a];
            stride[b] = in[0].stride[a];
            ++b;
        }
        offset = 0;
    }
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X);
};

// ---- slice along one axis, [Begin, End) -------------------------------------------------------
template <std::size_t Axis, std::size_t Begin, std::size_t End>
struct slice_op : view_op_base<slice_op<Axis, Begin, End>> {
    static constexpr const char* name = "slice";
    static constexpr bool keeps_contiguity = false;
    template <class X, class Seq = std::make_index_sequence<X::shape_type::rank>>
    struct rule_impl;
    template <class X, std::size_t... Is>
    struct rule_impl<X, std::index_sequence<Is...>> {
        using type = shape<(Is == Axis ? End - Begin : X::shape_type::extents[Is])...>;
    };
    template <class X>
    struct rule {
        using value_type = typename X::value_type;
        using shape_type = typename rule_impl<X>::type;
    };
    template <class N, class Ref>
    static void layout(const Ref* in, std::size_t* ext, std::ptrdiff_t* stride, std::ptrdiff_t& offset) {
        if (End > in[0].ext[Axis])
            fail<shape_error>({"typegrad: slice<", Axis, ", ", Begin, ", ", End, "> of an axis with extent ",
                               in[0].ext[Axis]});
        for (std::size_t a = 0; a < in[0].rank; ++a) {
            ext[a] = a == Axis ? End - Begin : in[0].ext[a];
            stride[a] = in[0].stride[a];
        }
        offset = std::ptrdiff_t(Begin) * in[0].stride[Axis];
    }
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X x);
};

// The adjoint of slice: zeros of X's shape with G written into [Begin, End) of Axis.
template <std::size_t Axis, std::size_t Begin, std::size_t End>
struct slice_backward_op : kernel_op_base {
    static constexpr const char* name = "slice_backward";
    static constexpr bool shape_only(std::size_t i) { return i == 1; }
    template <class G, class X>
    struct rule {
        using value_type = typename G::value_type;
        using shape_type = typename X::shape_type;
    };
    template <class N, class Ref>
    static void extents(const Ref* in, std::size_t* ext) {
        for (std::size_t a = 0; a < in[1].rank; ++a) ext[a] = in[1].ext[a];
    }
    template <class N, class Ref, class T>
    static void run(const Ref* in, T* out, const std::size_t* ext) {
        const std::size_t rank = in[1].rank;
        std::size_t outer = 1, inner = 1;
        for (std::size_t a = 0; a < Axis; ++a) outer *= ext[a];
        for (std::size_t a = Axis + 1; a < rank; ++a) inner *= ext[a];
        const std::size_t len = ext[Axis];
        std::fill(out, out + outer * len * inner, T(0));
        const auto* g = static_cast<const T*>(in[0].data);
        // g is dense only if materialised by a loop; walk it through its strides
        std::array<std::size_t, max_rank> idx{};
        const std::size_t gn = outer * (End - Begin) * inner;
        for (std::size_t e = 0; e < gn; ++e) {
            std::size_t r = e;
            std::ptrdiff_t goff = 0;
            for (std::size_t a = rank; a-- > 0;) {
                const std::size_t ea = a == Axis ? End - Begin : ext[a];
                idx[a] = r % ea;
                r /= ea;
                goff += std::ptrdiff_t(idx[a]) * in[0].stride[a];
            }
            std::size_t o = 0;
            for (std::size_t a = 0; a < rank; ++a) o = o * ext[a] + (a == Axis ? idx[a] + Begin : idx[a]);
            out[o] = g[goff];
        }
    }
    // the device kernel (docs/cuda.md): one thread per element of the result
    static constexpr const char* device_source = R"CUDA(
// slice_backward. w: out, axis, begin, length, g ref, out extents
template <int T> __device__ void tg_slice_backward(const tg_node_args& p) {
    typedef typename tg_ty<T>::S S;
    S* out = (S*)p.w[0];
    const int axis = (int)p.w[1];
    const tg_i64 begin = (tg_i64)p.w[2], length = (tg_i64)p.w[3];
    const tg_ref g = tg_ref_at(p, 4);
    const tg_u64* oext = p.w + 6 + 2 * g.rank;
    const S* gp = (const S*)g.p;
    tg_i64 n = 1;
    for (int a = 0; a < g.rank; ++a) n *= (tg_i64)oext[a];
    TG_GRID_LOOP(e, n) {
        tg_i64 r = e, off = 0;
        bool inside = true;
        for (int a = g.rank - 1; a >= 0; --a) {
            tg_i64 i = r % (tg_i64)oext[a];
            r /= (tg_i64)oext[a];
            if (a == axis) {
                inside = i >= begin && i < begin + length;
                i -= begin;
            }
            off += i * (tg_i64)g.stride[a];
        }
        out[e] = inside ? gp[off] : tg_ty<T>::to((typename tg_ty<T>::C)0);
    }
}
)CUDA";
    template <class N>
    static std::string device_call() {
        return device_template_call("tg_slice_backward", {device_type_code<typename N::value_type>()});
    }
    template <class N, class Ref>
    static std::size_t device_words(const Ref* in, void* out, const std::size_t* ext, std::uint64_t* w, void*) {
        w[0] = device_word(out);
        w[1] = Axis;
        w[2] = Begin;
        w[3] = End - Begin;
        const std::size_t at = put_device_ref(w, 4, in[0]);
        std::size_t n = 1;
        for (std::size_t a = 0; a < in[1].rank; ++a) {
            w[at + a] = ext[a];
            n *= ext[a];
        }
        return n;
    }
    template <std::size_t I, class G, class Out, class Gr, class X>
    static constexpr auto vjp(G g, Out, Gr, X);
};

// An explicit dense copy.
struct contiguous_op : elementwise_op {
    static constexpr const char* name = "contiguous";
    static constexpr const char* device = "{0}";
    template <class V> static V apply(const V& x) { return x; }
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X) { return g; }
};

template <class Target>
struct expand_to_op : elementwise_op {
    static constexpr const char* name = "broadcast_to";
    static constexpr const char* device = "{0}";
    template <class X>
    struct rule {
        using value_type = typename X::value_type;
        using shape_type = Target;
    };
    template <class V> static V apply(const V& x) { return x; }
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X) { return sum_to<typename X::shape_type>(g); }
};

template <class Shape>
constexpr std::size_t normalize_axis(int axis) {
    return axis < 0 ? std::size_t(int(Shape::rank) + axis) : std::size_t(axis);
}

}  // namespace detail

// ---- public functions -------------------------------------------------------------------------
template <std::size_t... Ps, expression X>
constexpr auto permute(X x) {
    static_assert(sizeof...(Ps) == X::shape_type::rank,
                  "typegrad: permute<axes...>(x) needs one axis per dimension of x.");
    static_assert(detail::is_permutation<Ps...>(),
                  "typegrad: permute<axes...>(x) needs a permutation of 0 .. rank-1.");
    if constexpr (detail::permute_op<Ps...>::keeps_contiguity) {
        return x;
    } else if constexpr (detail::permute_node<typename X::node_type>::value) {
        // A permute of a permute is one view (none when they cancel): transpose(transpose(x)) is
        // x, so that a VJP that transposes a transposed product hands the GEMM's result on as is.
        using inner = detail::permute_node<typename X::node_type>;
        return permute<inner::perm[Ps]...>(expr<typename inner::operand>{});
    } else {
        return detail::make_node<detail::permute_op<Ps...>>(x);
    }
}

// Swaps axes A and B (default: the last two), as torch.transpose.
template <int A = -2, int B = -1, expression X>
constexpr auto transpose(X x) {
    using S = typename X::shape_type;
    static_assert(S::rank >= 2 || (A == -2 && B == -1 && S::rank < 2),
                  "typegrad: transpose(x) swaps two axes; x has fewer than two.");
    if constexpr (S::rank < 2) {
        return x;  // like torch's .t() on 0-D and 1-D tensors
    } else {
        constexpr std::size_t a = detail::normalize_axis<S>(A), b = detail::normalize_axis<S>(B);
        static_assert(a < S::rank && b < S::rank, "typegrad: transpose<a, b>(x) names an axis x does not have.");
        return [&]<std::size_t... Is>(std::index_sequence<Is...>) {
            return permute<(Is == a ? b : Is == b ? a : Is)...>(x);
        }(std::make_index_sequence<S::rank>{});
    }
}

// reshape<tg::shape<...>>(x): the same elements, row-major, in another shape (at most one dynamic
// extent, inferred); a view where x is contiguous.
template <class Target, expression X>
constexpr auto reshape(X x) {
    static_assert(detail::is_shape_v<Target>, "typegrad: reshape<tg::shape<...>>(x) takes a tg::shape.");
    static_assert(Target::dyn_count <= 1, "typegrad: reshape<shape>(x) can infer at most one dynamic extent.");
    using S = typename X::shape_type;
    static_assert(!(S::is_static && Target::is_static) || S::static_numel == Target::static_numel,
                  "typegrad: reshape<shape>(x) needs the same number of elements as x.");
    static_assert(!(S::is_static && Target::dyn_count == 1) ||
                      (Target::static_numel != 0 && S::static_numel % Target::static_numel == 0),
                  "typegrad: reshape<shape>(x): x's element count is not a multiple of the target's static extents.");
    if constexpr (std::is_same_v<S, Target>) return x;
    else if constexpr (X::node_type::contiguous) return detail::make_node<detail::reshape_op<Target>>(x);
    else return detail::make_node<detail::reshape_op<Target>>(detail::make_node<detail::contiguous_op>(x));
}

// unsqueeze<axis>(x): a new axis of extent 1 (negative axes count from the end), as
// torch.unsqueeze.
template <int Axis, expression X>
constexpr auto unsqueeze(X x) {
    using S = typename X::shape_type;
    constexpr std::size_t a = Axis < 0 ? std::size_t(int(S::rank) + 1 + Axis) : std::size_t(Axis);
    static_assert(a <= S::rank, "typegrad: unsqueeze<axis>(x): the axis is out of range.");
    static_assert(S::rank + 1 <= detail::max_rank, "typegrad: unsqueeze<axis>(x) would exceed 8 axes.");
    return detail::make_node<detail::unsqueeze_op<a>>(x);
}

// squeeze<axis>(x): drops an axis of static extent 1.
template <int Axis, expression X>
constexpr auto squeeze(X x) {
    using S = typename X::shape_type;
    constexpr std::size_t a = detail::normalize_axis<S>(Axis);
    static_assert(a < S::rank, "typegrad: squeeze<axis>(x): the axis is out of range.");
    static_assert(S::extents[a] == 1, "typegrad: squeeze<axis>(x) needs a static extent 1 on that axis.");
    return detail::make_node<detail::squeeze_op<a>>(x);
}

// slice<axis, begin, end>(x): elements begin .. end-1 along axis (x.narrow), a view.
template <int Axis, std::size_t Begin, std::size_t End, expression X>
constexpr auto slice(X x) {
    using S = typename X::shape_type;
    constexpr std::size_t a = detail::normalize_axis<S>(Axis);
    static_assert(a < S::rank, "typegrad: slice<axis, begin, end>(x): the axis is out of range.");
    static_assert(Begin <= End, "typegrad: slice<axis, begin, end>(x) needs begin <= end.");
    static_assert(S::extents[a] == dyn || End <= S::extents[a],
                  "typegrad: slice<axis, begin, end>(x): end is past the axis' static extent.");
    return detail::make_node<detail::slice_op<a, Begin, End>>(x);
}

// broadcast_to<tg::shape<...>>(x): x expanded to a shape (torch.broadcast_to); the gradient sums
// back.
template <class Target, expression X>
constexpr auto broadcast_to(X x) {
    static_assert(detail::reduces_to<typename X::shape_type, Target>(),
                  "typegrad: broadcast_to<shape>(x) needs x's extents to equal the target's or be 1 "
                  "(right-aligned).");
    if constexpr (std::is_same_v<typename X::shape_type, Target>) return x;
    else return detail::make_node<detail::expand_to_op<Target>>(x);
}

// contiguous(x): x itself when it is contiguous, else a row-major copy (Tensor.contiguous).
template <expression X>
constexpr auto contiguous(X x) {
    if constexpr (X::node_type::contiguous) return x;
    else return detail::make_node<detail::contiguous_op>(x);
}

namespace detail {
template <std::size_t... Ps>
template <std::size_t I, class G, class Out, class X>
constexpr auto permute_op<Ps...>::vjp(G g, Out, X) {
    constexpr auto inv = inverse_perm<Ps...>();
    return [&]<std::size_t... Is>(std::index_sequence<Is...>) {
        return typegrad::permute<inv[Is]...>(g);  // composes with a permute g (permute_node)
    }(std::make_index_sequence<sizeof...(Ps)>{});
}
template <class Target>
template <std::size_t I, class G, class Out, class X>
constexpr auto reshape_op<Target>::vjp(G g, Out, X x) {
    return make_node<reshape_like_op>(contiguous(g), x);
}
template <std::size_t I, class G, class Out, class X, class Like>
constexpr auto reshape_like_op::vjp(G g, Out, X x, Like) {
    return make_node<reshape_like_op>(contiguous(g), x);
}
template <std::size_t Axis>
template <std::size_t I, class G, class Out, class X>
constexpr auto unsqueeze_op<Axis>::vjp(G g, Out, X) { return make_node<squeeze_op<Axis>>(g); }
template <std::size_t Axis>
template <std::size_t I, class G, class Out, class X>
constexpr auto squeeze_op<Axis>::vjp(G g, Out, X) { return make_node<unsqueeze_op<Axis>>(g); }
template <std::size_t Axis, std::size_t Begin, std::size_t End>
template <std::size_t I, class G, class Out, class X>
constexpr auto slice_op<Axis, Begin, End>::vjp(G g, Out, X x) {
    return make_node<slice_backward_op<Axis, Begin, End>>(g, x);
}
template <std::size_t Axis, std::size_t Begin, std::size_t End>
template <std::size_t I, class G, class Out, class Gr, class X>
constexpr auto slice_backward_op<Axis, Begin, End>::vjp(G g, Out, Gr, X) {
    return make_node<slice_op<Axis, Begin, End>>(g);
}
}  // namespace detail
}  // namespace typegrad
