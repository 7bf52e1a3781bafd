#pragma once
// batch_norm over the channel axis 1 of [N, C], [N, C, L] or [N, C, H, W]
// (torch.nn.functional.batch_norm):
//
//   batch_norm<eps>(x[, w, b])                           training: batch statistics, no running stats
//   batch_norm<true, momentum, eps>(x, rm, rv, w, b)     training, and rm, rv updated in place
//   batch_norm<false, momentum, eps>(x, rm, rv, w, b)    evaluation: normalised by rm, rv
//
// Training normalises by the batch mean and the biased variance over every axis but 1 (a fused
// composite, as layer_norm: two passes, f32 statistics for bf16/f16 input); the backward is the
// formula of PyTorch's CPU kernel (batch_norm_backward below). With running stats, the forward also updates them as PyTorch does:
// rm = (1 - momentum) rm + momentum mean, rv = (1 - momentum) rv + momentum var * n / (n - 1)
// (the unbiased variance), written into the caller's rm and rv buffers (tg::input leaves of shape
// [C]). The update is a custom op that declares the data mutation of those two inputs
// (ops/custom.hpp, forward_mutates) and no gradient, recomputing the statistics from x in double
// once per forward. Its output is a scalar -0 added to the normalised value (y + -0 is y, bit for
// bit, for every y): the addition orders the update before y's readers and costs one operand of
// y's fused loop, where passing y through the op had copied y, and detaching x had copied x.
// rm and rv must have x's dtype.
//
// Autocast: on no PyTorch list (promote); the statistics run in f32 for bf16/f16 input anyway.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <utility>

#include <typegrad/core/cpu/thread_pool.hpp>
#include <typegrad/core/error.hpp>
#include <typegrad/ops/compare.hpp>
#include <typegrad/ops/custom.hpp>
#include <typegrad/ops/norm.hpp>
#include <typegrad/ops/view.hpp>

namespace typegrad {
namespace detail {

// axes<0, 2, 3, ...>: every axis but the channel axis
template <std::size_t R, std::size_t... Is>
auto batch_axes_impl(std::index_sequence<Is...>) -> axes_t<0, int(Is + 2)...>;
template <std::size_t R>
using batch_axes_t = decltype(batch_axes_impl<R>(std::make_index_sequence<R - 2>{}));

// [C] as [C, 1, ...] against a rank-R input
template <std::size_t R, expression P>
constexpr auto per_channel(P p) {
    if constexpr (R == 2) return p;
    else if constexpr (R == 3) return reshape<shape<P::shape_type::extents[0], 1>>(p);
    else return reshape<shape<P::shape_type::extents[0], 1, 1>>(p);
}

template <num Eps, expression X>
constexpr auto batch_normalize(X xf) {
    constexpr batch_axes_t<X::shape_type::rank> over{};
    auto centred = xf - mean(xf, over, keepdim);
    auto var = mean(square(centred), over, keepdim);
    return centred * (lit<1> / sqrt(var + lit<Eps>));
}
// PyTorch's CPU batch_norm backward in training (batch_norm_cpu_backward_contiguous_impl), per
// channel: sum = sum(dy), dotp = sum((x - mean) dy), k = dotp invstd^2 / N,
// dx = (dy - sum / N - (x - mean) k) invstd w, dw = dotp invstd, db = sum; the weight multiplies
// last (through the composite, dy w would come first: NaN where dy is 0 and w infinite).
// Operands: x (widened), and the weight and bias as [C, 1, ...] when there are any.
template <num Eps>
struct batch_norm_backward {
    static constexpr const char* name = "batch_normalize";
    template <std::size_t I, class G, class X>
    static constexpr auto vjp(G g, X xf) {
        return vjp<I>(g, xf, lit<1>, lit<0>);
    }
    template <std::size_t I, class G, class X, class W, class B>
    static constexpr auto vjp(G g, X xf, W w, B) {
        constexpr batch_axes_t<X::shape_type::rank> over{};
        auto centred = xf - mean(xf, over, keepdim);
        auto invstd = lit<1> / sqrt(mean(square(centred), over, keepdim) + lit<Eps>);  // the forward's nodes
        auto s = sum(g, over, keepdim);
        auto dotp = sum(centred * g, over, keepdim);
        if constexpr (I == 0) {
            auto scale = inv_count_over(xf, over);
            auto k = dotp * invstd * invstd * scale;
            return (g - s * scale - centred * k) * invstd * w;  // * lit<1> folds away
        } else if constexpr (I == 1) {
            return dotp * invstd;
        } else {
            return s;
        }
    }
};
template <num Eps, expression X>
constexpr auto batch_normalize_plain(X x) {
    auto xf = widened(x);
    return value_with_vjp<batch_norm_backward<Eps>>(batch_normalize<Eps>(xf), xf);
}

// rm and rv get the running-average update from x's batch statistics; the output is -0.
template <std::uint64_t MomentumBits>
struct batch_norm_running_update {
    static constexpr auto forward_mutates = mutates(data<1>, data<2>);
    static constexpr bool differentiable = false;  // statistics: no gradient, and x needs no detach
    static constexpr double momentum = std::bit_cast<double>(MomentumBits);
    template <class X, class... Rs>
    struct result {
        using value_type = typename X::value_type;
        using shape_type = scalar_shape;
    };
    template <class Ctx>
    static void forward(Ctx& ctx) {
        auto [x, rm, rv] = ctx.inputs();
        const auto ext = x.extents();
        const std::size_t n = ext[0], c = ext[1];
        std::size_t inner = 1;
        for (std::size_t a = 2; a < ext.size(); ++a) inner *= ext[a];
        if (rm.size() != c || rv.size() != c)
            fail<shape_error>({"typegrad: batch_norm: running_mean and running_var need ", c,
                               " elements (x's channels), not ", rm.size(), " and ", rv.size()});
        const std::size_t count = n * inner;
        if (count < 2)  // PyTorch: "Expected more than 1 value per channel when training"
            throw shape_error("typegrad: batch_norm in training mode needs more than one value per channel");
        // Per channel, in double: sums over eight lanes (a chain of dependent adds ran at one add
        // per four cycles), combined in a fixed order, so any thread count gives the same bits.
        using T = std::remove_cvref_t<decltype(rm[0])>;
        const auto* xp = x.data();
        T* rmp = rm.data();
        T* rvp = rv.data();
        parallel_ranges(c, 2 * count, [&](std::size_t c0, std::size_t c1) {
            for (std::size_t ch = c0; ch < c1; ++ch) {
                const double mu = channel_sum<false>(xp, n, c, inner, ch, 0.0) / double(count);
                const double var = channel_sum<true>(xp, n, c, inner, ch, mu) / double(count - 1);  // unbiased, as PyTorch's running_var
                rmp[ch] = T((1 - momentum) * double(rmp[ch]) + momentum * mu);
                rvp[ch] = T((1 - momentum) * double(rvp[ch]) + momentum * var);
            }
        });
        ctx.output()[0] = T(-0.0);
    }
    // The sum over channel ch of [n, c, inner] x of x, or of (x - mu)^2, in double over eight lanes
    // (element k of the channel into lane k mod 8, whatever the rows).
    template <bool Squares, class X>
    static double channel_sum(const X* x, std::size_t n, std::size_t c, std::size_t inner, std::size_t ch, double mu) {
        constexpr std::size_t lanes = 8;
        double acc[lanes] = {};
        auto add = [&](std::size_t l, X xe) {
            const double v = double(xe);
            acc[l] += Squares ? (v - mu) * (v - mu) : v;
        };
        std::size_t l = 0;
        for (std::size_t b = 0; b < n; ++b) {
            const X* row = x + (b * c + ch) * inner;
            std::size_t e = 0;
            for (; e < inner && l != 0; ++e, l = (l + 1) % lanes) add(l, row[e]);  // up to lane 0
            for (; e + lanes <= inner; e += lanes)                                  // whole blocks: vectorised
                for (std::size_t k = 0; k < lanes; ++k) add(k, row[e + k]);
            for (; e < inner; ++e, l = (l + 1) % lanes) add(l, row[e]);
        }
        return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    }
};

template <class X, class P>
constexpr bool is_channel_param() {
    using SX = typename X::shape_type;
    using SP = typename P::shape_type;
    return SP::rank == 1 && (SX::extents[1] == dyn || SP::extents[0] == dyn || SX::extents[1] == SP::extents[0]);
}

}  // namespace detail

#define TYPEGRAD_DETAIL_CHECK_BATCH_NORM(X)                                                                        \
    static_assert(X::shape_type::rank >= 2 && X::shape_type::rank <= 4,                                           \
                  "typegrad: batch_norm(x, ...) takes x of shape [N, C], [N, C, L] or [N, C, H, W].");           \
    static_assert(is_dtype_v<typename X::value_type>, "typegrad: batch_norm(x, ...) takes a floating x.")
#define TYPEGRAD_DETAIL_CHECK_CHANNEL_PARAM(X, P, what)                                                             \
    static_assert(::typegrad::detail::is_channel_param<X, P>(),                                                   \
                  "typegrad: batch_norm(x, ...) needs " what " of shape [C], C being x's extent on axis 1.")

// F.batch_norm(x, None, None, training=True, eps=Eps)
template <num Eps = 1e-5, expression X>
constexpr auto batch_norm(X x) {
    TYPEGRAD_DETAIL_CHECK_BATCH_NORM(X);
    return detail::narrowed(detail::batch_normalize_plain<Eps>(x), x);
}
// F.batch_norm(x, None, None, w, b, training=True, eps=Eps)
template <num Eps = 1e-5, expression X, expression W, expression B>
constexpr auto batch_norm(X x, W w, B b) {
    TYPEGRAD_DETAIL_CHECK_BATCH_NORM(X);
    TYPEGRAD_DETAIL_CHECK_CHANNEL_PARAM(X, W, "the weight");
    TYPEGRAD_DETAIL_CHECK_CHANNEL_PARAM(X, B, "the bias");
    constexpr std::size_t R = X::shape_type::rank;
    auto xf = detail::widened(x);
    auto wf = detail::per_channel<R>(detail::widened(w));
    auto bf = detail::per_channel<R>(detail::widened(b));
    return detail::narrowed(detail::value_with_vjp<detail::batch_norm_backward<Eps>>(
                                detail::batch_normalize<Eps>(xf) * wf + bf, xf, wf, bf),
                            x, detail::per_channel<R>(w), detail::per_channel<R>(b));
}
// F.batch_norm(x, running_mean, running_var, w, b, training=Training, momentum=Momentum, eps=Eps)
template <bool Training, num Momentum = 0.1, num Eps = 1e-5, expression X, expression RM, expression RV,
          expression W, expression B>
constexpr auto batch_norm(X x, RM running_mean, RV running_var, W w, B b) {
    TYPEGRAD_DETAIL_CHECK_BATCH_NORM(X);
    TYPEGRAD_DETAIL_CHECK_CHANNEL_PARAM(X, RM, "running_mean");
    TYPEGRAD_DETAIL_CHECK_CHANNEL_PARAM(X, RV, "running_var");
    TYPEGRAD_DETAIL_CHECK_CHANNEL_PARAM(X, W, "the weight");
    TYPEGRAD_DETAIL_CHECK_CHANNEL_PARAM(X, B, "the bias");
    static_assert(std::is_same_v<typename RM::value_type, typename X::value_type> &&
                      std::is_same_v<typename RV::value_type, typename X::value_type>,
                  "typegrad: batch_norm(x, running_mean, running_var, w, b) needs running stats of x's dtype.");
    constexpr std::size_t R = X::shape_type::rank;
    if constexpr (Training) {
        auto y = batch_norm<Eps>(x, w, b);
        return y + custom<detail::batch_norm_running_update<Momentum.bits>>(contiguous(x), running_mean, running_var);
    } else {
        using detail::per_channel;
        auto inv = lit<1> / sqrt(per_channel<R>(detail::widened(running_var)) + lit<Eps>);
        return detail::narrowed((detail::widened(x) - per_channel<R>(detail::widened(running_mean))) * inv *
                                        per_channel<R>(detail::widened(w)) +
                                    per_channel<R>(detail::widened(b)),
                                x, per_channel<R>(w), per_channel<R>(b));
    }
}
#undef TYPEGRAD_DETAIL_CHECK_BATCH_NORM
#undef TYPEGRAD_DETAIL_CHECK_CHANNEL_PARAM

}  // namespace typegrad
