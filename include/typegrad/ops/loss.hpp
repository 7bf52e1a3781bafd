#pragma once
// Losses: mse_loss, cross_entropy (logits + integer class labels), nll_loss and
// binary_cross_entropy_with_logits, each a mean over the batch as PyTorch's default reduction.
#include <cstdint>
#include <string>

#include <typegrad/core/device_kernel.hpp>
#include <typegrad/core/error.hpp>
#include <typegrad/ops/autocast_entry.hpp>
#include <typegrad/ops/exp_log.hpp>
#include <typegrad/ops/log_sum_exp.hpp>
#include <typegrad/ops/piecewise.hpp>
#include <typegrad/ops/reduce.hpp>

namespace typegrad {
namespace detail {

// one_hot_like(labels, like): a (N, C) tensor of like's dtype and shape, 1 where the column is
// the row's label. Labels outside [0, C) throw before anything is written (labels are leaves,
// so this kernel runs before every loop).
struct one_hot_op : kernel_op_base {
    static constexpr const char* name = "one_hot";
    static constexpr bool differentiable = false;
    static constexpr bool shape_only(std::size_t i) { return i == 1; }
    template <class Labels, class Like>
    struct rule {
        using value_type = typename Like::value_type;
        using shape_type = typename Like::shape_type;
    };
    template <class N, class Ref>
    static void extents(const Ref* in, std::size_t* ext) {
        if (in[0].ext[0] != in[1].ext[0])
            fail<shape_error>({"typegrad: cross_entropy/nll_loss: ", in[0].ext[0], " labels for ",
                               in[1].ext[0], " rows"});
        ext[0] = in[1].ext[0];
        ext[1] = in[1].ext[1];
    }
    template <class L>
    [[noreturn]] static void bad_label(L l, std::size_t row, std::size_t classes) {
        fail<shape_error>({"typegrad: cross_entropy/nll_loss: label ", std::size_t(l < 0 ? -l : l),
                           l < 0 ? " (negative)" : "", " of row ", row, " is not a class in [0, ", classes, ")"});
    }
    template <class N, class Ref, class T>
    static void run(const Ref* in, T* out, const std::size_t* ext) {
        using label_t = typename type_at_t<0, typename N::children>::value_type;
        const auto* labels = static_cast<const label_t*>(in[0].data);
        const std::size_t rows = ext[0], classes = ext[1];
        for (std::size_t i = 0; i < rows; ++i) {
            const label_t l = labels[std::ptrdiff_t(i) * in[0].stride[0]];
            if (l < 0 || std::size_t(l) >= classes) bad_label(l, i, classes);
        }
        std::fill(out, out + rows * classes, T(0));
        for (std::size_t i = 0; i < rows; ++i) out[i * classes + std::size_t(labels[std::ptrdiff_t(i) * in[0].stride[0]])] = T(1);
    }

    // the device kernel (docs/cuda.md): one thread per element; a bad label records its row, and
    // the host throws the CPU's error before anything else runs
    static constexpr const char* device_source = R"CUDA(
// one_hot. w: out, rows, classes, flag, labels ref
template <int L, int T> __device__ void tg_one_hot(const tg_node_args& p) {
    typename tg_ty<T>::S* out = (typename tg_ty<T>::S*)p.w[0];
    const tg_i64 rows = (tg_i64)p.w[1], classes = (tg_i64)p.w[2];
    const tg_ref labels = tg_ref_at(p, 4);
    TG_GRID_LOOP(e, classes > 0 ? rows * classes : rows) {
        const tg_i64 i = classes > 0 ? e / classes : e, j = classes > 0 ? e % classes : 0;
        const tg_i64 l = tg_id<L>(labels, i);
        if (l < 0 || l >= classes) tg_report(p.w[3], i);
        if (classes > 0) out[e] = tg_ty<T>::to((typename tg_ty<T>::C)(l == j ? 1 : 0));
    }
}
)CUDA";
    template <class N>
    static std::string device_call() {
        return device_template_call("tg_one_hot", {device_type_code<typename type_at_t<0, typename N::children>::value_type>(),
                                                   device_type_code<typename N::value_type>()});
    }
    template <class N, class Ref>
    static std::size_t device_words(const Ref* in, void* out, const std::size_t* ext, std::uint64_t* w, void* flag) {
        w[0] = device_word(out);
        w[1] = ext[0];
        w[2] = ext[1];
        w[3] = device_word(flag);
        put_device_ref(w, 4, in[0]);
        return ext[1] > 0 ? ext[0] * ext[1] : ext[0];
    }
    template <class N, class Ref>
    static void device_check(const Ref* in, std::size_t row, device_copy copy) {
        using label_t = typename type_at_t<0, typename N::children>::value_type;
        label_t l{};
        copy(&l, static_cast<const label_t*>(in[0].data) + std::ptrdiff_t(row) * in[0].stride[0], sizeof l);
        bad_label(l, row, in[1].ext[1]);
    }
};

template <class Labels, class Like>
constexpr void check_labels() {
    static_assert(is_index_type_v<typename Labels::value_type>,
                  "typegrad: cross_entropy/nll_loss take integer class labels (a tg::input of "
                  "std::int32_t or std::int64_t).");
    static_assert(Labels::shape_type::rank == 1 && Like::shape_type::rank == 2,
                  "typegrad: cross_entropy/nll_loss take (N, C) scores and N labels.");
}

}  // namespace detail

// torch.nn.functional.mse_loss(a, b) with reduction='mean': mean((a - b)^2).
template <expression A, expression B>
constexpr auto mse_loss(A a, B b) {
    TYPEGRAD_DETAIL_CHECK_BROADCAST("mse_loss(a, b)", A, B);
    return mean(square(detail::fp32_entry(a) - detail::fp32_entry(b)));
}

// log_probs: (N, C) log-probabilities; labels: N integer classes.
template <expression L, expression Y>
constexpr auto nll_loss(L log_probs, Y labels) {
    detail::check_labels<Y, L>();
    auto lp = detail::fp32_entry(log_probs);
    // Select the label's entry rather than multiply by the one-hot: a -inf log-probability of
    // another class (a masked logit) times 0 would be NaN, where PyTorch's loss stays finite.
    auto picked = where(detail::make_node<detail::one_hot_op>(labels, lp), lp, lit<0>);
    return -mean(sum(picked, axes<1>));
}

// logits: (N, C) scores; labels: N integer classes.
template <expression L, expression Y>
constexpr auto cross_entropy(L logits, Y labels) {
    detail::check_labels<Y, L>();
    return nll_loss(log_softmax(detail::fp32_entry(logits), axes<1>), labels);
}

// mean(max(x, 0) - x y + log(1 + exp(-|x|))): stable for large |x|.
template <expression X, expression Y>
constexpr auto binary_cross_entropy_with_logits(X logits, Y targets) {
    TYPEGRAD_DETAIL_CHECK_BROADCAST("binary_cross_entropy_with_logits(x, y)", X, Y);
    auto x = detail::fp32_entry(logits);
    auto y = detail::fp32_entry(targets);
    return mean(relu(x) - x * y + log(lit<1> + exp(-abs(x))));
}

}  // namespace typegrad
