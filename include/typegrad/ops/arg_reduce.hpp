#pragma once
// argmax / argmin (torch.argmax, torch.argmin): the index of the largest (smallest) element,
// over all elements (the index into the flattened tensor) or along one axis (tg::axes<a>,
// optionally tg::keepdim). The result is a std::int64_t tensor, as PyTorch's: an output of a
// step, or the ids of an index op. No gradient flows through it.
//
// PyTorch's rules: ties give the first index; NaN counts as the extreme (the index of the first
// NaN); a reduction over no elements is an error (tg::shape_error, thrown when the extents are
// known, before anything is written). Autocast leaves it alone (its input keeps its dtype).
//
// A kernel op: it reads its materialised input through strides; its device kernel sits beside it.
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include <typegrad/core/device_kernel.hpp>
#include <typegrad/core/error.hpp>
#include <typegrad/ops/op_base.hpp>
#include <typegrad/ops/reduce.hpp>

namespace typegrad {
namespace detail {

// S without axis A (A = S::rank: all axes, a scalar)
template <class S, std::size_t A, bool Keep>
struct arg_reduce_shape {
    template <std::size_t... Is>
    static auto drop(std::index_sequence<Is...>) -> shape<S::extents[Is < A ? Is : Is + 1]...>;
    template <std::size_t... Is>
    static auto keep(std::index_sequence<Is...>) -> shape<(Is == A ? 1 : S::extents[Is])...>;
    static auto make() {
        if constexpr (A == S::rank) return scalar_shape{};
        else if constexpr (Keep) return decltype(keep(std::make_index_sequence<S::rank>{})){};
        else return decltype(drop(std::make_index_sequence<S::rank - 1>{})){};
    }
    using type = decltype(make());
};

// Axis == rank of the input: over all elements.
template <bool Largest, std::size_t Axis, bool Keep>
struct arg_reduce_op : kernel_op_base {
    static constexpr const char* name = Largest ? "argmax" : "argmin";
    // the device kernel: one thread per output element, the CPU's scan (first extreme, first NaN)
    static constexpr const char* device_source = R"CUDA(
// argmax/argmin. w: out (int64), axis (rank: all), x ref
template <int Largest, int V, int B> __device__ void tg_arg_reduce(const tg_node_args& p) {
    typedef typename tg_ty<V>::C C;
    tg_i64* out = (tg_i64*)p.w[0];
    const int axis = (int)p.w[1];
    const tg_ref x = tg_ref_at(p, 2);
    const typename tg_ty<B>::S* xp = (const typename tg_ty<B>::S*)x.p;
    const bool all = axis == x.rank;
    tg_i64 outer = 1, len = 1;
    for (int a = 0; a < x.rank; ++a) {
        if (all || a == axis) len *= (tg_i64)x.ext[a];
        else outer *= (tg_i64)x.ext[a];
    }
    TG_GRID_LOOP(o, outer) {
        tg_i64 base = 0;
        if (!all) {
            tg_i64 r = o;
            for (int a = x.rank - 1; a >= 0; --a) {
                if (a == axis) continue;
                base += (r % (tg_i64)x.ext[a]) * (tg_i64)x.stride[a];
                r /= (tg_i64)x.ext[a];
            }
        }
        tg_i64 best = 0;
        C best_v = 0;
        for (tg_i64 i = 0; i < len; ++i) {
            const tg_i64 off = all ? tg_ref_offset(x, i) : base + i * (tg_i64)x.stride[axis];
            const C v = (C)tg_ty<B>::from(xp[off]);
            if (i == 0) {
                best_v = v;
                continue;
            }
            if (best_v != best_v) break;  // a NaN wins, the first one
            if (v != v || (Largest ? v > best_v : v < best_v)) {
                best = i;
                best_v = v;
            }
        }
        out[o] = best;
    }
}
)CUDA";
    template <class N>
    static std::string device_call() {
        using X = type_at_t<0, typename N::children>;
        return device_template_call("tg_arg_reduce", {int(Largest), device_type_code<typename X::value_type>(),
                                                      device_type_code<buffer_t<X>>()});
    }
    template <class N, class Ref>
    static std::size_t device_words(const Ref* in, void* out, const std::size_t*, std::uint64_t* w, void*) {
        w[0] = device_word(out);
        w[1] = Axis;
        put_device_ref(w, 2, in[0]);
        std::size_t outer = 1;
        for (std::size_t a = 0; a < in[0].rank; ++a)
            if (Axis != in[0].rank && a != Axis) outer *= in[0].ext[a];
        return outer;
    }
    static constexpr bool differentiable = false;
    static constexpr bool shape_only(std::size_t) { return false; }
    template <class X>
    struct rule {
        using value_type = std::int64_t;
        using shape_type = typename arg_reduce_shape<typename X::shape_type, Axis, Keep>::type;
    };

    template <class N, class Ref>
    static void extents(const Ref* in, std::size_t* ext) {
        const Ref& x = in[0];
        std::size_t reduced = 1;
        for (std::size_t a = 0, b = 0; a < x.rank; ++a) {
            if (Axis == x.rank || a == Axis) {
                reduced *= x.ext[a];
                if (Keep && Axis != x.rank) ext[b++] = 1;
            } else {
                ext[b++] = x.ext[a];
            }
        }
        if (reduced == 0)
            fail<shape_error>({"typegrad: ", name, " over an axis with no elements has no result (as in PyTorch)"});
    }

    template <class N, class Ref, class T>
    static void run(const Ref* in, T* out, const std::size_t*) {
        using C = type_at_t<0, typename N::children>;
        using B = buffer_t<C>;
        using V = compute_t<typename C::value_type>;
        const Ref& x = in[0];
        const auto* data = static_cast<const B*>(x.data);
        // outer index space: every axis but the reduced one(s); inner: the reduced one(s)
        std::size_t outer = 1, len = 1;
        for (std::size_t a = 0; a < x.rank; ++a) (Axis == x.rank || a == Axis ? len : outer) *= x.ext[a];
        for (std::size_t o = 0; o < outer; ++o) {
            // the offset of the outer element o (axes other than Axis, row-major)
            std::ptrdiff_t base = 0;
            if constexpr (Axis != C::shape_type::rank) {
                std::size_t r = o;
                for (std::size_t a = x.rank; a-- > 0;) {
                    if (a == Axis) continue;
                    base += std::ptrdiff_t(r % x.ext[a]) * x.stride[a];
                    r /= x.ext[a];
                }
            }
            std::int64_t best = 0;
            V best_v{};
            for (std::size_t i = 0; i < len; ++i) {
                std::ptrdiff_t off = base;
                if constexpr (Axis != C::shape_type::rank) {
                    off += std::ptrdiff_t(i) * x.stride[Axis];
                } else {
                    std::size_t r = i;
                    for (std::size_t a = x.rank; a-- > 0;) {
                        off += std::ptrdiff_t(r % x.ext[a]) * x.stride[a];
                        r /= x.ext[a];
                    }
                }
                const V v = static_cast<V>(static_cast<compute_t<B>>(data[off]));
                if (i == 0) {
                    best_v = v;
                    continue;
                }
                if (best_v != best_v) break;  // a NaN wins, the first one
                if (v != v || (Largest ? v > best_v : v < best_v)) {
                    best = std::int64_t(i);
                    best_v = v;
                }
            }
            out[o] = T(best);
        }
    }
};

template <bool Largest, bool Keep, int Axis, expression X>
constexpr auto arg_reduce(X x) {
    using S = typename X::shape_type;
    static_assert(is_dtype_v<typename X::value_type>,
                  "typegrad: argmax/argmin take a floating expression (not labels or constants).");
    static_assert(axes_valid<S, Axis>(), "typegrad: argmax/argmin(x, tg::axes<a>) names an axis x does not have.");
    return make_node<arg_reduce_op<Largest, normalize_axis<S>(Axis), Keep>>(x);
}

}  // namespace detail

// Index of the largest element (flattened, row-major) as std::int64_t (torch.argmax); not
// differentiable. With tg::axes<a>: along axis a (tg::keepdim keeps it as extent 1).
template <expression X>
constexpr auto argmax(X x) {
    static_assert(is_dtype_v<typename X::value_type>, "typegrad: argmax(x) takes a floating expression.");
    return detail::make_node<detail::arg_reduce_op<true, X::shape_type::rank, false>>(x);
}
// Index of the largest element along axis Axis, the axis dropped (torch.argmax(x, dim=Axis)).
template <expression X, int Axis>
constexpr auto argmax(X x, axes_t<Axis>) { return detail::arg_reduce<true, false, Axis>(x); }
// Index of the largest element along axis Axis, kept as extent 1 (torch.argmax(x, dim, keepdim=True)).
template <expression X, int Axis>
constexpr auto argmax(X x, axes_t<Axis>, keepdim_t) { return detail::arg_reduce<true, true, Axis>(x); }

// Index of the smallest element (torch.argmin); the forms of argmax.
template <expression X>
constexpr auto argmin(X x) {
    static_assert(is_dtype_v<typename X::value_type>, "typegrad: argmin(x) takes a floating expression.");
    return detail::make_node<detail::arg_reduce_op<false, X::shape_type::rank, false>>(x);
}
// Index of the smallest element along axis Axis, the axis dropped (torch.argmin(x, dim=Axis)).
template <expression X, int Axis>
constexpr auto argmin(X x, axes_t<Axis>) { return detail::arg_reduce<false, false, Axis>(x); }
// Index of the smallest element along axis Axis, kept as extent 1 (torch.argmin(x, dim, keepdim=True)).
template <expression X, int Axis>
constexpr auto argmin(X x, axes_t<Axis>, keepdim_t) { return detail::arg_reduce<false, true, Axis>(x); }

}  // namespace typegrad
