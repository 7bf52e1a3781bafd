#pragma once
// Run-time segments: the C++ form of a graph break. A loop whose trip count is data cannot be
// one graph type, so each iteration's compiled step is recorded on a tape; backward then runs
// the segments in reverse, passing the gradient of each segment's input (the "carried" leaf,
// which held the previous segment's output) to the segment before it, with each step's hooks.
// A segment's saved values are freed as soon as its backward has run.
#include <memory>
#include <tuple>
#include <span>
#include <vector>

#include <typegrad/core/error.hpp>
#include <typegrad/exec/step.hpp>

namespace typegrad {

// Records compiled segments at run time (the C++ graph break: a loop whose trip count is data) and
// runs one backward through all of them in reverse, hooks included.
template <class T>
class tape {
public:
    // Runs step.forward(args...) and records it. `carried` is the leaf bound to the previous
    // segment's output (its gradient flows back; it must be in the step's wrt list). grad_into
    // bindings among args receive this segment's gradient contributions, added in backward.
    // Returns the segment's output, valid until the tape's backward passes this segment.
    template <class Step, class Carried, class... Args>
    std::span<const T> record(const Step& step, Carried, const Args&... args) {
        using leaf_t = typename Carried::node_type;
        static_assert(std::is_same_v<typename Step::value_type, T>,
                      "typegrad: tape<T>::record(step, ...) needs a step whose dtype is T.");
        static_assert(detail::contains_v<leaf_t, typename Step::wrt_list>,
                      "typegrad: tape::record(step, carried, ...): the carried leaf must be in the "
                      "step's tg::wrt(...) list, so that its gradient can flow to the previous segment.");
        auto seg = std::make_unique<segment<Step, leaf_t, Args...>>(step, args...);
        std::span<const T> out = seg->ctx.values();
        segments_.push_back(std::move(seg));
        return out;
    }

    // Backward through every recorded segment, last first; `seed` is the gradient of the last
    // segment's output. Afterwards the tape is empty and carried_grad() holds the gradient of
    // the first segment's carried input.
    void backward(std::span<const T> seed) {
        if (segments_.empty()) throw error("typegrad: tape::backward on an empty tape");
        if (seed.size() != segments_.back()->ctx_size())
            detail::fail<shape_error>({"typegrad: tape::backward: the seed has ", seed.size(),
                                       " elements but the last output has ", segments_.back()->ctx_size()});
        std::vector<T> current(seed.begin(), seed.end()), next;
        while (!segments_.empty()) {
            auto& seg = *segments_.back();
            next.assign(seg.input_size, T(0));
            seg.backward(current, next);
            segments_.pop_back();  // frees this segment's saved values
            current.swap(next);
        }
        carried_grad_ = std::move(current);
    }

    // After backward: the gradient of the first segment's carried input (empty before).
    std::span<const T> carried_grad() const { return carried_grad_; }
    // The number of recorded segments not yet run backward.
    std::size_t size() const { return segments_.size(); }

private:
    struct segment_base {
        virtual ~segment_base() = default;
        virtual void backward(std::span<const T> seed, std::span<T> carried_grad) = 0;
        virtual std::size_t ctx_size() const = 0;
        std::size_t input_size = 0;
    };

    template <class Step, class Leaf, class... Args>
    struct segment final : segment_base {
        Step step;
        forward_context<Step, typename Step::template plans<>::forward> ctx;
        std::tuple<Args...> args;
        segment(const Step& s, const Args&... a)
            : step(s), ctx(std::apply([&](const auto&... b) { return s.forward(b...); }, leaves_only(a...))),
              args(a...) {
            auto size_of = [&](const auto& b) -> std::size_t {
                using B = std::remove_cvref_t<decltype(b)>;
                if constexpr (detail::is_leaf_binding_v<B> && std::is_same_v<typename B::leaf_type, Leaf>) {
                    std::size_t n = 1;
                    for (std::size_t e : b.extents) n *= e;
                    return n;
                } else {
                    return 0;
                }
            };
            this->input_size = (size_of(a) + ...);
        }
        std::size_t ctx_size() const override { return ctx.values().size(); }
        void backward(std::span<const T> seed, std::span<T> carried_grad) override {
            std::apply(
                [&](const auto&... g) {
                    step.backward(ctx, grad_into(expr<Leaf>{}, carried_grad), as_accumulate(g)...,
                                  typegrad::seed(seed));
                },
                grads_only(args));
        }
    };

    template <class... As>
    static auto leaves_only(const As&... a) {
        return std::tuple_cat([](const auto& x) {
            using X = std::remove_cvref_t<decltype(x)>;
            if constexpr (detail::is_leaf_binding_v<X>) return std::make_tuple(x);
            else return std::tuple<>{};
        }(a)...);
    }

    // grad_into bindings recorded with the segment, turned into accumulating ones.
    template <class... As>
    static auto grads_only(const std::tuple<As...>& t) {
        return std::apply(
            [](const auto&... a) {
                return std::tuple_cat([](const auto& x) {
                    using X = std::remove_cvref_t<decltype(x)>;
                    if constexpr (detail::is_grad_binding_v<X>) return std::make_tuple(x);
                    else return std::tuple<>{};
                }(a)...);
            },
            t);
    }
    template <class B>
    static auto as_accumulate(const B& b) {
        return detail::grad_binding<typename B::leaf_type, true>{b.data, b.size};
    }
    std::vector<std::unique_ptr<segment_base>> segments_;
    std::vector<T> carried_grad_;
};

}  // namespace typegrad
