#pragma once
// Scans along one axis: cumsum<axis>(x) (torch.cumsum) and the first-order linear recurrence
// linear_recurrence<axis>(a, b):
//
//   h_0 = b_0,   h_t = a_t h_{t-1} + b_t   (t = 1 .. T-1, along the axis; a_0 is not read)
//
// the state update of linear RNNs and diagonal state-space models, an AR(1) process, a discounted
// return (a = gamma, read backwards), and cumsum itself (a = 1). JAX writes it as an
// associative_scan over (a, b) pairs; this kernel runs the multiply-adds of a hand-written loop,
// in its order (one pass per line of the axis; cumsum adds without multiplying by one).
// a broadcasts to b's shape (a scalar decay, a per-channel decay [D] against [B, T, D]).
//
// Gradients, with g the incoming gradient and h the result:
//   db = R(a, g),  R the reverse recurrence r_{T-1} = g_{T-1}, r_t = a_{t+1} r_{t+1} + g_t
//                  (the adjoint of the forward recurrence as a linear map of b)
//   da = R(a, g) * shift(h),  shift(h)_t = h_{t-1}, shift(h)_0 = 0
// The reverse recurrence's gradients are forward recurrences and shifts again (shift's adjoint
// is the shift the other way; cumsum's gradient is the reversed running sum), so every order of
// derivative is these kernel ops.
//
// Kernel ops over strided operands, computed in the compute dtype (f32 for bf16/f16, as
// torch.cumsum accumulates) and rounded once per element, each with its device kernel beside it
// (one thread per line: the same operations in the same order, so the same values). Autocast:
// f32 on CUDA (cumsum is on PyTorch's fp32 list there), the operands' dtype on the CPU.
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include <typegrad/core/device_kernel.hpp>
#include <typegrad/core/error.hpp>
#include <typegrad/ops/arithmetic.hpp>
#include <typegrad/ops/broadcast.hpp>
#include <typegrad/ops/op_base.hpp>
#include <typegrad/ops/reduce.hpp>

namespace typegrad {
namespace detail {

enum class recurrence_mode : unsigned char {
    forward,         // (a, b): out_0 = b_0, out_t = a_t out_{t-1} + b_t
    reverse,         // (a, b): out_{T-1} = b_{T-1}, out_t = a_{t+1} out_{t+1} + b_t
    cumsum,          // (x): forward with a = 1
    cumsum_reverse,  // (x): reverse with a = 1
    shift_right,     // (x): out_0 = 0, out_t = x_{t-1}
    shift_left,      // (x): out_{T-1} = 0, out_t = x_{t+1}
};

// A strided operand read along one axis: the offset of line (o, i), o over the axes before the
// axis and i over those after it (row-major), and the step along the axis.
template <class Ref>
struct axis_lines {
    const Ref& r;
    std::size_t axis;
    std::ptrdiff_t line(std::size_t o, std::size_t i) const {
        std::ptrdiff_t off = 0;
        for (std::size_t a = r.rank; a-- > axis + 1;) {
            off += std::ptrdiff_t(i % r.ext[a]) * r.stride[a];
            i /= r.ext[a];
        }
        for (std::size_t a = axis; a-- > 0;) {
            off += std::ptrdiff_t(o % r.ext[a]) * r.stride[a];
            o /= r.ext[a];
        }
        return off;
    }
    std::ptrdiff_t step() const { return r.stride[axis]; }
};

template <recurrence_mode Mode, std::size_t Axis>
struct recurrence_op : kernel_op_base {
    static constexpr bool binary = Mode == recurrence_mode::forward || Mode == recurrence_mode::reverse;
    static constexpr bool backwards = Mode == recurrence_mode::reverse || Mode == recurrence_mode::cumsum_reverse;
    static constexpr bool shift = Mode == recurrence_mode::shift_right || Mode == recurrence_mode::shift_left;
    static constexpr const char* name = Mode == recurrence_mode::forward          ? "linear_recurrence"
                                        : Mode == recurrence_mode::reverse        ? "linear_recurrence_reverse"
                                        : Mode == recurrence_mode::cumsum         ? "cumsum"
                                        : Mode == recurrence_mode::cumsum_reverse ? "cumsum_reverse"
                                        : Mode == recurrence_mode::shift_right    ? "shift_right"
                                                                                  : "shift_left";
    static constexpr bool shape_only(std::size_t) { return false; }
    static constexpr autocast_class autocast_on(device_kind d) { return fp32_on_cuda(d); }
    // the device kernel: one thread per line of the axis, the CPU's operations in its order
    static constexpr const char* device_source = R"CUDA(
// linear_recurrence, cumsum and their adjoints (ops/recurrence.hpp). Mode: 0 forward, 1 reverse,
// 2 cumsum, 3 cumsum_reverse, 4 shift right, 5 shift left. w: out, axis, x ref, a ref (modes 0, 1)
template <int Mode, int T, int B, int BA> __device__ void tg_recurrence(const tg_node_args& p) {
    typedef typename tg_ty<T>::C C;
    typename tg_ty<T>::S* out = (typename tg_ty<T>::S*)p.w[0];
    const int axis = (int)p.w[1];
    const tg_ref x = tg_ref_at(p, 2);
    const tg_ref a = Mode < 2 ? tg_ref_at(p, 4 + 2 * x.rank) : x;
    const typename tg_ty<B>::S* xp = (const typename tg_ty<B>::S*)x.p;
    const typename tg_ty<BA>::S* ap = (const typename tg_ty<BA>::S*)a.p;
    const tg_i64 len = (tg_i64)x.ext[axis];
    tg_i64 outer = 1, inner = 1;
    for (int d = 0; d < x.rank; ++d) {
        if (d < axis) outer *= (tg_i64)x.ext[d];
        else if (d > axis) inner *= (tg_i64)x.ext[d];
    }
    if (len == 0) return;
    TG_GRID_LOOP(line, outer * inner) {
        const tg_i64 first = (line / inner) * len * inner + line % inner;  // (o, 0, i), row-major
        auto xv = [&](tg_i64 t) { return (C)tg_ty<B>::from(xp[tg_ref_offset(x, first + t * inner)]); };
        auto av = [&](tg_i64 t) { return (C)tg_ty<BA>::from(ap[tg_ref_offset(a, first + t * inner)]); };
        if (Mode >= 4) {
            for (tg_i64 t = 0; t < len; ++t) {
                const bool edge = Mode == 4 ? t == 0 : t + 1 == len;
                out[first + t * inner] = tg_ty<T>::to(edge ? (C)0 : xv(Mode == 4 ? t - 1 : t + 1));
            }
        } else if (Mode == 0 || Mode == 2) {
            C h = xv(0);
            out[first] = tg_ty<T>::to(h);
            for (tg_i64 t = 1; t < len; ++t) {
                h = Mode == 0 ? av(t) * h + xv(t) : h + xv(t);
                out[first + t * inner] = tg_ty<T>::to(h);
            }
        } else {
            C r = xv(len - 1);
            out[first + (len - 1) * inner] = tg_ty<T>::to(r);
            for (tg_i64 t = len - 1; t-- > 0;) {
                r = Mode == 1 ? av(t + 1) * r + xv(t) : r + xv(t);
                out[first + t * inner] = tg_ty<T>::to(r);
            }
        }
    }
}
)CUDA";
    template <class N>
    static std::string device_call() {
        using X = type_at_t<binary ? 1 : 0, typename N::children>;
        using A = type_at_t<0, typename N::children>;
        return device_template_call("tg_recurrence", {int(Mode), device_type_code<buffer_t<N>>(),
                                                      device_type_code<buffer_t<X>>(), device_type_code<buffer_t<A>>()});
    }
    template <class N, class Ref>
    static std::size_t device_words(const Ref* in, void* out, const std::size_t*, std::uint64_t* w, void*) {
        const Ref& x = in[binary ? 1 : 0];
        w[0] = device_word(out);
        w[1] = Axis;
        const std::size_t next = put_device_ref(w, 2, x);
        if constexpr (binary) put_device_ref(w, next, in[0]);
        std::size_t lines = 1;
        for (std::size_t a = 0; a < x.rank; ++a)
            if (a != Axis) lines *= x.ext[a];
        return x.ext[Axis] == 0 ? 0 : lines;
    }
    template <class... Cs>
    struct rule {
        using value_type = promote_t<typename Cs::value_type...>;
        using shape_type = typename type_at_t<sizeof...(Cs) - 1, type_list<Cs...>>::shape_type;
    };
    template <class N, class Ref>
    static void extents(const Ref* in, std::size_t* ext) {
        const Ref& x = in[binary ? 1 : 0];
        if constexpr (binary)
            for (std::size_t a = 0; a < x.rank; ++a)
                if (in[0].ext[a] != x.ext[a])
                    fail<shape_error>({"typegrad: ", name, "(a, b): a's extent ", in[0].ext[a], " on axis ", a,
                                       " differs from b's ", x.ext[a]});
        for (std::size_t a = 0; a < x.rank; ++a) ext[a] = x.ext[a];
    }
    template <class N, class Ref, class T>
    static void run(const Ref* in, T* out, const std::size_t*) {
        using X = type_at_t<binary ? 1 : 0, typename N::children>;
        using A = type_at_t<0, typename N::children>;  // X itself when unary (not read then)
        using C = compute_t<T>;
        const Ref& xr = in[binary ? 1 : 0];
        std::size_t outer = 1, inner = 1;
        const std::size_t len = xr.ext[Axis];
        for (std::size_t a = 0; a < xr.rank; ++a)
            if (a < Axis) outer *= xr.ext[a];
            else if (a > Axis) inner *= xr.ext[a];
        if (len == 0) return;
        const axis_lines<Ref> xl{xr, Axis}, al{in[0], Axis};
        const auto* xp = static_cast<const buffer_t<X>*>(xr.data);
        const auto* ap = static_cast<const buffer_t<A>*>(in[0].data);
        for (std::size_t o = 0; o < outer; ++o)
            for (std::size_t i = 0; i < inner; ++i) {
                T* dst = out + o * len * inner + i;  // the output is dense, row-major
                const std::ptrdiff_t xb = xl.line(o, i), xs = xl.step();
                const std::ptrdiff_t ab = binary ? al.line(o, i) : 0, as = al.step();  // a is read by the recurrences only
                auto x_at = [&](std::size_t t) {
                    return C(static_cast<compute_t<buffer_t<X>>>(xp[xb + std::ptrdiff_t(t) * xs]));
                };
                auto a_at = [&](std::size_t t) {
                    if constexpr (binary) return C(static_cast<compute_t<buffer_t<A>>>(ap[ab + std::ptrdiff_t(t) * as]));
                    else return C(1);
                };
                if constexpr (shift) {
                    constexpr bool right = Mode == recurrence_mode::shift_right;
                    dst[right ? 0 : (len - 1) * inner] = T(0);
                    for (std::size_t t = right ? 1 : 0; t < (right ? len : len - 1); ++t)
                        dst[t * inner] = T(x_at(right ? t - 1 : t + 1));
                } else if constexpr (!backwards) {
                    C h = x_at(0);
                    dst[0] = T(h);
                    for (std::size_t t = 1; t < len; ++t) {
                        if constexpr (binary) h = a_at(t) * h + x_at(t);
                        else h = h + x_at(t);  // cumsum: no multiply by one (the same value, fewer operations)
                        dst[t * inner] = T(h);
                    }
                } else {
                    C r = x_at(len - 1);
                    dst[(len - 1) * inner] = T(r);
                    for (std::size_t t = len - 1; t-- > 0;) {
                        if constexpr (binary) r = a_at(t + 1) * r + x_at(t);
                        else r = r + x_at(t);
                        dst[t * inner] = T(r);
                    }
                }
            }
    }
    // Unary modes: each one's adjoint is its mirror image.
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X) {
        constexpr recurrence_mode mirror = Mode == recurrence_mode::cumsum           ? recurrence_mode::cumsum_reverse
                                           : Mode == recurrence_mode::cumsum_reverse ? recurrence_mode::cumsum
                                           : Mode == recurrence_mode::shift_right    ? recurrence_mode::shift_left
                                                                                     : recurrence_mode::shift_right;
        return make_node<recurrence_op<mirror, Axis>>(g);
    }
    // The recurrences: the mirror recurrence of g is the gradient of b; a_t multiplies h_{t-1}
    // (forward) or a_{t+1} multiplies r_{t+1} (reverse), so a's gradient pairs one sequence with
    // the other shifted by one (a_0 is not read: its gradient is 0).
    template <std::size_t I, class G, class Out, class A, class B>
    static constexpr auto vjp(G g, Out out, A a, B) {
        using shift_right_op = recurrence_op<recurrence_mode::shift_right, Axis>;
        constexpr recurrence_mode mirror =
            Mode == recurrence_mode::forward ? recurrence_mode::reverse : recurrence_mode::forward;
        auto gb = make_node<recurrence_op<mirror, Axis>>(a, g);
        if constexpr (I == 1) return gb;
        else if constexpr (Mode == recurrence_mode::forward) return gb * make_node<shift_right_op>(out);
        else return make_node<shift_right_op>(gb) * out;
    }
};

}  // namespace detail

// linear_recurrence<axis>(a, b): h_0 = b_0, h_t = a_t h_{t-1} + b_t along axis (negative: from the
// end); a broadcasts to b's shape. Differentiable in a and b (any order).
template <int Axis, expression A, expression B>
constexpr auto linear_recurrence(A a, B b) {
    using S = typename B::shape_type;
    static_assert(S::rank >= 1, "typegrad: linear_recurrence<axis>(a, b) needs b of rank 1 or more (a scan runs along an axis).");
    static_assert(detail::axes_valid<S, Axis>(), "typegrad: linear_recurrence<axis>(a, b) names an axis b does not have.");
    static_assert(is_dtype_v<typename A::value_type> && is_dtype_v<typename B::value_type>,
                  "typegrad: linear_recurrence<axis>(a, b) takes floating a and b.");
    static_assert(detail::reduces_to<typename A::shape_type, S>(),
                  "typegrad: linear_recurrence<axis>(a, b) needs a's shape to broadcast to b's (a's extents equal b's "
                  "or are 1, right-aligned).");
    return detail::make_node<detail::recurrence_op<detail::recurrence_mode::forward, detail::normalize_axis<S>(Axis)>>(
        broadcast_like(a, b), b);
}

// cumsum<axis>(x): the running sum along axis (torch.cumsum(x, dim=axis)); its gradient is the
// reversed running sum of the incoming gradient.
template <int Axis, expression X>
constexpr auto cumsum(X x) {
    using S = typename X::shape_type;
    static_assert(S::rank >= 1, "typegrad: cumsum<axis>(x) needs x of rank 1 or more.");
    static_assert(detail::axes_valid<S, Axis>(), "typegrad: cumsum<axis>(x) names an axis x does not have.");
    static_assert(is_dtype_v<typename X::value_type>, "typegrad: cumsum<axis>(x) takes a floating x.");
    return detail::make_node<detail::recurrence_op<detail::recurrence_mode::cumsum, detail::normalize_axis<S>(Axis)>>(x);
}

}  // namespace typegrad
