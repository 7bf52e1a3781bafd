#pragma once
// value_and_grad / forward / backward of a compiled step on the device. step.value_and_grad(...)
// hands a call with any device argument here (exec/device.hpp). The plans are the CPU's (same
// program, same fusion, same saved values); only the evaluation differs.
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <tuple>
#include <type_traits>
#include <vector>

#include <typegrad/autodiff/step.hpp>
#include <typegrad/cuda/execute.hpp>
#include <typegrad/cuda/tensor.hpp>

namespace typegrad::cuda {

// The saved context of a forward pass on the device: the bound device inputs (they must stay
// alive and unchanged until backward), the reductions and kernel outputs the backward reads,
// and the output. Move-only.
template <class Step, class FwdPP>
class forward_context {
public:
    // Marks the context as a device argument, so that step.backward(ctx, ...) runs on the device.
    static constexpr bool typegrad_device_argument = true;
    // The step that made the context.
    using step_type = Step;
    // The forward plan (its saved values are what backward reads).
    using plan_type = FwdPP;
    // The output's dtype.
    using value_type = typename Step::value_type;

    forward_context() = default;
    // Moves the device buffers; contexts are not copyable.
    forward_context(forward_context&&) noexcept = default;
    // Move assignment (frees the previous device buffers).
    forward_context& operator=(forward_context&&) noexcept = default;

    // The scalar output (copied to the host on first use).
    value_type value() const {
        static_assert(Step::scalar_loss, "typegrad: value() is for scalar outputs; use values().");
        return values()[0];
    }
    // The output's elements in row-major order, copied to the host on first use.
    std::span<const value_type> values() const {
        if (host_.size() != size_) {
            host_.resize(size_);
            detail::copy_to_host(host_.data(), output_, size_ * sizeof(value_type));
        }
        return {host_.data(), host_.size()};
    }
    // The output on the device (dense, row-major; valid while the context lives).
    const value_type* device_values() const { return output_; }
    // The number of output elements.
    std::size_t size() const { return size_; }

private:
    typename FwdPP::state_type state_{};
    detail::device_buffer storage_;
    const value_type* output_ = nullptr;
    std::size_t size_ = 0;
    mutable std::vector<value_type> host_;
    template <class>
    friend struct typegrad::detail::device_backend;
};

}  // namespace typegrad::cuda

namespace typegrad::detail {

template <class Policy, class Loss, class... Wrt>
struct device_backend<step<Policy, Loss, Wrt...>> {
    using step_type = step<Policy, Loss, Wrt...>;
    using T = typename step_type::value_type;
    using seed_leaf = typename step_type::seed_leaf;

    template <class Arg>
    static constexpr bool is_leaf_arg = cuda::detail::is_device_leaf_binding_v<Arg>;
    template <class Arg>
    static constexpr bool is_grad_arg = cuda::detail::is_device_grad_binding_v<Arg>;
    template <class Arg>
    static constexpr bool is_seed_arg = cuda::detail::is_device_seed_binding_v<Arg>;
    template <class Arg>
    static constexpr bool is_neutral_arg = std::is_same_v<Arg, create_graph_t>;

    template <class Arg>
    static constexpr auto grad_list_of() {
        if constexpr (is_grad_arg<Arg>) return type_list<typename Arg::leaf_type>{};
        else return type_list<>{};
    }
    template <class Grads, bool Seeded>
    static constexpr auto grad_nodes() {
        return []<class... Ls>(type_list<Ls...>) {
            return type_list<typename step_type::template grad_node<Ls, Seeded>...>{};
        }(Grads{});
    }
    static constexpr auto loss_store() {
        if constexpr (Loss::kind == op_kind::elementwise) return type_list<Loss>{};
        else return type_list<>{};
    }
    static constexpr auto loss_required() {
        if constexpr (Loss::kind != op_kind::elementwise && Loss::kind != op_kind::constant) return type_list<Loss>{};
        else return type_list<>{};
    }
    template <class FwdPP>
    struct saved_in {
        template <class N>
        struct test : saved_by<FwdPP, N> {};
    };
    template <class Nodes, class FwdPP>
    static constexpr auto saved_reductions() {
        return filter_t<Nodes, saved_in<FwdPP>::template test>{};
    }


    // The plans of each entry point (also what tg::cuda::generated_source shows).
    template <class Grads>
    using joint_plan = plan_provider<
        graph_of_t<concat_t<type_list<Loss>, decltype(grad_nodes<Grads, false>()), decltype(loss_store())>,
                   typename step_type::template grad_refs<false>>,
        concat_t<decltype(grad_nodes<Grads, false>()), decltype(loss_store())>, decltype(loss_required()), type_list<>, T>;
    using forward_plan =
        plan_provider<topo<Loss>, decltype(loss_store()), decltype(loss_required()), type_list<>, T>;
    template <class Grads, bool Seeded, class FwdPP>
    using backward_plan = plan_provider<
        graph_of_t<decltype(grad_nodes<Grads, Seeded>()), typename step_type::template grad_refs<Seeded>>,
        decltype(grad_nodes<Grads, Seeded>()), type_list<>,
        decltype(saved_reductions<topo_of_t<decltype(grad_nodes<Grads, Seeded>()), typename step_type::template grad_refs<Seeded>>,
                                  FwdPP>()),
        T>;

    static void check_policy() {
        static_assert(!Policy::anomaly,
                      "typegrad: cuda: detect_anomaly checks values on the host; run the step with host "
                      "bindings to use it (docs/cuda.md)");
        static_assert(!is_reduced_precision_v<storage_t<T>>,
                      "typegrad: cuda: this step's output is bf16/f16, which the device path does not return yet; "
                      "end the graph in f32 (tg::cast<float>, or a loss, which autocast computes in f32) (docs/cuda.md)");
    }

    // Host bindings mixed with device ones: a run-time device_error before anything runs.
    template <class... Args>
    static void reject_host_arguments(const char* entry) {
        constexpr bool all_device = ((is_leaf_arg<Args> || is_grad_arg<Args> || is_seed_arg<Args> ||
                                      is_neutral_arg<Args>) && ...);
        if constexpr (!all_device)
            throw device_error(message("typegrad: ", entry,
                                       ": host and device bindings are mixed in one call; bind every leaf, "
                                       "gradient and seed to device memory (tg::cuda::tensor) or every one to "
                                       "host memory; nothing was run"));
    }

    template <class L, class... Args>
    static constexpr std::size_t count_leaf() {
        return (std::size_t(is_leaf_arg<Args> && std::is_same_v<typename binding_leaf_of<Args>::type, L>) + ... + 0);
    }
    template <class B>
    struct binding_leaf_of {
        using type = void;
    };
    template <class B>
        requires requires { typename B::leaf_type; }
    struct binding_leaf_of<B> {
        using type = typename B::leaf_type;
    };
    template <class L, class... Args>
    static constexpr std::size_t count_grad() {
        return (std::size_t(is_grad_arg<Args> && std::is_same_v<typename binding_leaf_of<Args>::type, L>) + ... + 0);
    }
    template <class L, class... Args>
    static constexpr std::size_t leaf_index() {
        constexpr bool hit[] = {(is_leaf_arg<Args> && std::is_same_v<typename binding_leaf_of<Args>::type, L>)..., true};
        std::size_t i = 0;
        while (!hit[i]) ++i;
        return i;
    }

    // The compile-time checks of the host entry points, for device bindings.
    template <class PP, bool LeavesFromArgs, class... Args>
    static constexpr void check_calls() {
        cuda::detail::check_plan_on_device<PP>();
        using nodes = typename PP::program::nodes;
        auto one = [&]<class Arg>(std::type_identity<Arg>) {
            if constexpr (is_leaf_arg<Arg>) {
                using L = typename Arg::leaf_type;
                static_assert(contains_v<L, nodes> || !LeavesFromArgs,
                              "typegrad: a tg::bind(...) names a leaf that the compiled graph does not use.");
                static_assert(count_leaf<L, Args...>() <= 1, "typegrad: a leaf is bound twice in one call; bind each leaf once.");
            } else if constexpr (is_grad_arg<Arg>) {
                using L = typename Arg::leaf_type;
                static_assert(sizeof(check_grad_target<L, typename step_type::wrt_list, topo<Loss>>));
                static_assert(count_grad<L, Args...>() <= 1, "typegrad: grad_into names the same leaf twice in one call.");
            }
        };
        (one(std::type_identity<Args>{}), ...);
        (void)one;
        if constexpr (!LeavesFromArgs) {
            static_assert(!(is_leaf_arg<Args> || ...),
                          "typegrad: backward(ctx, ...) reads the inputs bound in forward(...); it takes only "
                          "tg::grad_into(...) and tg::seed(...).");
        } else {
            [&]<std::size_t... Ns>(std::index_sequence<Ns...>) {
                (check_leaf_node<PP, Ns, Args...>(), ...);
            }(std::make_index_sequence<PP::M>{});
        }
    }
    template <class PP, std::size_t N, class... Args>
    static constexpr void check_leaf_node() {
        using node = typename PP::program::template node_at<N>;
        if constexpr (is_bound_leaf<node>()) {
            constexpr bool bound = count_leaf<node, Args...>() > 0;
            static_assert(sizeof(check_has_binding<node, bound, PP::plan.needed[N]>) &&
                          sizeof(check_shape_known<node, bound, !node::shape_type::is_static>));
        }
    }

    template <class PP, class... Args>
    static void bind_leaves(typename PP::state_type& st, const Args&... args) {
        auto all = std::forward_as_tuple(args...);
        [&]<std::size_t... Ns>(std::index_sequence<Ns...>) {
            (bind_leaf_node<PP, Ns, Args...>(st, all), ...);
        }(std::make_index_sequence<PP::M>{});
    }
    template <class PP, std::size_t N, class... Args, class Tuple>
    static void bind_leaf_node(typename PP::state_type& st, const Tuple& all) {
        using node = typename PP::program::template node_at<N>;
        if constexpr (is_bound_leaf<node>()) {
            std::size_t* e = st.ext.data() + PP::rank_offset[N];
            using S = typename node::shape_type;
            if constexpr (count_leaf<node, Args...>() > 0) {
                const auto& b = std::get<leaf_index<node, Args...>()>(all);
                for (std::size_t a = 0; a < S::rank; ++a) {
                    if (S::extents[a] != dyn && b.extents[a] != S::extents[a])
                        throw shape_error(message("typegrad: bind(", node::name(), ", ...): axis ", a, " has extent ",
                                                  b.extents[a], " but the leaf declares ", S::extents[a]));
                    e[a] = b.extents[a];
                }
                if (b.data == nullptr && PP::plan.needed[N]) {
                    std::size_t n = 1;
                    for (std::size_t a = 0; a < S::rank; ++a) n *= e[a];
                    if (n != 0) throw binding_error(message("typegrad: bind(", node::name(), ", ...) got a null device address"));
                }
                st.ptr[N] = b.data;
            } else {
                for (std::size_t a = 0; a < S::rank; ++a) e[a] = S::extents[a];
            }
        }
    }
    template <class PP, class... Args>
    static void check_leaf_sizes(const typename PP::state_type& st, const Args&... args) {
        auto one = [&](const auto& b) {
            using B = std::remove_cvref_t<decltype(b)>;
            if constexpr (is_leaf_arg<B>) {
                using L = typename B::leaf_type;
                constexpr std::size_t id = PP::program::template id_of<L>::value;
                const std::size_t need = checked_numel<PP>(st, id);
                if (b.size != unknown_size && b.size != need)
                    throw shape_error(message("typegrad: bind(", L::name(), ", ...): the device buffer has ", b.size,
                                              " elements but extents ",
                                              extents_text(st.ext.data() + PP::rank_offset[id], L::shape_type::rank),
                                              " need ", need));
            }
        };
        (one(args), ...);
    }

    // Gradient destinations: sizes, null addresses, then overlap with every input and each other.
    template <class PP, class... Args>
    static void bind_grads(typename PP::state_type& st, const Args&... args) {
        std::vector<std::pair<std::uintptr_t, std::uintptr_t>> in, out;
        [&]<std::size_t... Ns>(std::index_sequence<Ns...>) {
            auto leaf_range = [&]<std::size_t N>(std::integral_constant<std::size_t, N>) {
                using node = typename PP::program::template node_at<N>;
                if constexpr (is_leaf_v<node>) {
                    const auto p = reinterpret_cast<std::uintptr_t>(st.ptr[N]);
                    if (p) in.emplace_back(p, p + node_numel<PP>(st, N) * sizeof(typename node::value_type));
                }
            };
            (leaf_range(std::integral_constant<std::size_t, Ns>{}), ...);
        }(std::make_index_sequence<PP::M>{});
        std::size_t gi = 0;
        auto one = [&](const auto& b) {
            using B = std::remove_cvref_t<decltype(b)>;
            if constexpr (is_grad_arg<B>) {
                using L = typename B::leaf_type;
                const std::size_t need = node_numel<PP>(st, PP::stores[gi]);
                if (b.size != need)
                    throw shape_error(message("typegrad: grad_into(", display_name<L>(), ", ...): the device buffer has ",
                                              b.size, " elements but the gradient has ", need));
                if (b.data == nullptr && need != 0)
                    throw binding_error(message("typegrad: grad_into(", display_name<L>(), ", ...) got a null device address"));
                const auto p = reinterpret_cast<std::uintptr_t>(b.data);
                if (p && need) out.emplace_back(p, p + need * sizeof(typename B::value_type));
                st.out[gi++] = b.data;
            }
        };
        (one(args), ...);
        auto overlap = [](const auto& a, const auto& b) { return a.first < b.second && b.first < a.second; };
        for (std::size_t i = 0; i < out.size(); ++i) {
            for (const auto& r : in)
                if (overlap(out[i], r))
                    throw aliasing_error("typegrad: a grad_into device buffer overlaps a bound input; gradients "
                                         "need their own buffers");
            for (std::size_t j = i + 1; j < out.size(); ++j)
                if (overlap(out[i], out[j]))
                    throw aliasing_error("typegrad: two grad_into device buffers overlap");
        }
    }

    template <class Grads, class... Args>
    static constexpr auto accumulate_flags() {
        std::array<bool, Grads::size + 1> r{};
        std::size_t i = 0;
        auto one = [&]<class Arg>(std::type_identity<Arg>) {
            if constexpr (is_grad_arg<Arg>) r[i++] = Arg::accumulate;
        };
        (one(std::type_identity<Args>{}), ...);
        (void)one;
        return r;
    }

    // ---- entry points ------------------------------------------------------------------------
    template <class... Args>
    static T value_and_grad(const step_type&, const Args&... args) {
        reject_host_arguments<Args...>("value_and_grad");
        if constexpr (((is_leaf_arg<Args> || is_grad_arg<Args> || is_seed_arg<Args> || is_neutral_arg<Args>) && ...)) {
            static_assert(step_type::scalar_loss,
                          "typegrad: value_and_grad(...) needs a scalar loss; for a non-scalar output use "
                          "forward(...) then backward(ctx, ..., tg::seed(buffer)).");
            check_policy();
            using grads = decltype((type_list<>{} + ... + grad_list_of<Args>()));
            using PP = joint_plan<grads>;
            check_calls<PP, true, Args...>();
            step_type::check_autocast_context();
            typename PP::state_type st{};
            bind_leaves<PP>(st, args...);
            cuda::detail::compute_device_shapes<PP>(st);
            check_leaf_sizes<PP>(st, args...);
            bind_grads<PP>(st, args...);
            const cuda::detail::compiled_module& m = cuda::detail::module_for<PP>();
            cuda::detail::device_run<PP> run;
            run.layout(st, sizeof(T));
            cuda::detail::device_buffer& arena = cuda::detail::thread_arena<PP>();
            arena.reserve(run.bytes());
            run.bind(st, arena.data());
            void* loss_slot = run.extra(arena.data());
            if constexpr (Loss::kind == op_kind::elementwise) st.out[PP::NS - 1] = loss_slot;
            run.run(st, m, accumulate_flags<grads, Args...>());
            return read_loss<PP>(st, loss_slot);
        } else {
            return T{};
        }
    }

    template <class... Args>
    static auto forward(const step_type&, const Args&... args) {
        using PP = forward_plan;
        using context = cuda::forward_context<step_type, PP>;
        static_assert(!(is_grad_arg<Args> || ...) && !(is_seed_arg<Args> || ...),
                      "typegrad: forward(...) takes only tg::bind(...); gradients are requested from backward(ctx, ...).");
        reject_host_arguments<Args...>("forward");
        context ctx;
        if constexpr (((is_leaf_arg<Args> || is_neutral_arg<Args>) && ...)) {
            check_policy();
            check_calls<PP, true, Args...>();
            auto& st = ctx.state_;
            bind_leaves<PP>(st, args...);
            cuda::detail::compute_device_shapes<PP>(st);
            check_leaf_sizes<PP>(st, args...);
            const cuda::detail::compiled_module& m = cuda::detail::module_for<PP>();
            constexpr std::size_t loss_id = PP::program::template id_of<Loss>::value;
            const std::size_t loss_n = node_numel<PP>(st, loss_id);
            cuda::detail::device_run<PP> run;
            run.layout(st, loss_n * sizeof(T));
            ctx.storage_ = cuda::detail::device_buffer(run.bytes());
            run.bind(st, ctx.storage_.data());
            T* out = static_cast<T*>(run.extra(ctx.storage_.data()));
            if constexpr (Loss::kind == op_kind::elementwise) st.out[PP::NS - 1] = out;
            run.run(st, m, std::array<bool, PP::NS + 1>{});
            if constexpr (Loss::kind == op_kind::constant) {
                std::vector<T> fill(loss_n, static_cast<T>(Loss::value));
                cuda::detail::copy_to_device(out, fill.data(), loss_n * sizeof(T));
            } else if constexpr (Loss::kind != op_kind::elementwise) {
                cuda::detail::gather(m, cuda::detail::gather_fn<T>(), st.ptr[loss_id], out, loss_n,
                                     PP::program::info[loss_id].rank, st.ext.data() + PP::rank_offset[loss_id],
                                     st.stride.data() + PP::rank_offset[loss_id]);
            }
            ctx.output_ = out;
            ctx.size_ = loss_n;
        }
        return ctx;
    }

    template <class Ctx, class... Args>
    static void backward(const step_type&, const Ctx& ctx, const Args&... args) {
        constexpr bool device_ctx = requires { Ctx::typegrad_device_argument; };
        if constexpr (!device_ctx) {
            throw device_error("typegrad: backward(ctx, ...): the forward context is a host one but the "
                               "bindings are device ones; run forward with device bindings too; nothing was run");
        } else {
            reject_host_arguments<Args...>("backward");
            if constexpr (((is_grad_arg<Args> || is_seed_arg<Args> || is_neutral_arg<Args>) && ...)) {
                using FwdPP = typename Ctx::plan_type;
                static_assert(std::is_same_v<typename Ctx::step_type, step_type>,
                              "typegrad: backward(ctx, ...) got a context from another step.");
                constexpr bool seeded = (is_seed_arg<Args> || ...);
                static_assert(seeded || step_type::scalar_loss,
                              "typegrad: backward(ctx, ...) of a non-scalar output needs a seed: pass "
                              "tg::seed(buffer) with the output's shape.");
                using grads = decltype((type_list<>{} + ... + grad_list_of<Args>()));
                using PP = backward_plan<grads, seeded, FwdPP>;
                check_calls<PP, false, Args...>();
                step_type::check_autocast_context();
                typename PP::state_type st{};
                [&]<std::size_t... Ns>(std::index_sequence<Ns...>) {
                    (restore_node<PP, FwdPP, Ns>(st, ctx.state_), ...);
                }(std::make_index_sequence<PP::M>{});
                if constexpr (seeded) bind_seed<PP, FwdPP>(st, ctx.state_, args...);
                cuda::detail::compute_device_shapes<PP>(st);
                if constexpr (seeded) check_seed_size<PP>(st, args...);
                bind_grads<PP>(st, args...);
                const cuda::detail::compiled_module& m = cuda::detail::module_for<PP>();
                cuda::detail::device_run<PP> run;
                run.layout(st, 0);
                cuda::detail::device_buffer& arena = cuda::detail::thread_arena<PP>();
                arena.reserve(run.bytes());
                run.bind(st, arena.data());
                run.run(st, m, accumulate_flags<grads, Args...>());
            }
        }
    }

    template <class PP>
    static T read_loss(const typename PP::state_type& st, const void* slot) {
        T v{};
        if constexpr (Loss::kind == op_kind::constant) return static_cast<T>(Loss::value);
        else if constexpr (Loss::kind == op_kind::elementwise) cuda::detail::copy_to_host(&v, slot, sizeof v);
        else cuda::detail::copy_to_host(&v, st.ptr[PP::program::template id_of<Loss>::value], sizeof v);
        return v;
    }

    template <class PP, class FwdPP, std::size_t N, class FwdState>
    static void restore_node(typename PP::state_type& st, const FwdState& fst) {
        using node = typename PP::program::template node_at<N>;
        if constexpr (contains_v<node, typename FwdPP::program::nodes>) {
            constexpr std::size_t f = FwdPP::program::template id_of<node>::value;
            if constexpr (node::kind == op_kind::leaf) {
                for (std::size_t a = 0; a < node::shape_type::rank; ++a)
                    st.ext[PP::rank_offset[N] + a] = fst.ext[FwdPP::rank_offset[f] + a];
                st.ptr[N] = fst.ptr[f];
            } else {
                if (FwdPP::plan.computed[f]) st.ptr[N] = fst.ptr[f];
            }
        } else if constexpr (is_bound_leaf<node>()) {
            static_assert(node::shape_type::is_static,
                          "typegrad: backward(ctx, ...) needs the extents of a wrt leaf that the forward pass did "
                          "not bind; bind it in forward(...).");
            for (std::size_t a = 0; a < node::shape_type::rank; ++a)
                st.ext[PP::rank_offset[N] + a] = node::shape_type::extents[a];
        }
    }
    template <class PP, class FwdPP, class FwdState, class... Args>
    static void bind_seed(typename PP::state_type& st, const FwdState& fst, const Args&... args) {
        if constexpr (contains_v<seed_leaf, typename PP::program::nodes>) {
            constexpr std::size_t id = PP::program::template id_of<seed_leaf>::value;
            static_assert((std::size_t(is_seed_arg<Args>) + ... + 0) == 1, "typegrad: backward(ctx, ...) takes one tg::seed(...).");
            auto set = [&](const auto& b) {
                using B = std::remove_cvref_t<decltype(b)>;
                if constexpr (is_seed_arg<B>) {
                    static_assert(std::is_same_v<typename B::value_type, T>, "typegrad: tg::seed(buffer) needs the output's dtype.");
                    st.ptr[id] = b.data;
                }
            };
            (set(args), ...);
            using S = typename seed_leaf::shape_type;
            for (std::size_t a = 0; a < S::rank; ++a)
                st.ext[PP::rank_offset[id] + a] = fst.ext[FwdPP::rank_offset[FwdPP::program::template id_of<Loss>::value] + a];
        }
    }
    template <class PP, class... Args>
    static void check_seed_size(const typename PP::state_type& st, const Args&... args) {
        if constexpr (contains_v<seed_leaf, typename PP::program::nodes>) {
            constexpr std::size_t id = PP::program::template id_of<seed_leaf>::value;
            auto check = [&](const auto& b) {
                using B = std::remove_cvref_t<decltype(b)>;
                if constexpr (is_seed_arg<B>) {
                    const std::size_t need = node_numel<PP>(st, id);
                    if (b.size != need)
                        throw shape_error(message("typegrad: tg::seed(buffer) has ", b.size, " elements but the output has ", need));
                    if (b.data == nullptr && need != 0)
                        throw binding_error("typegrad: tg::seed(buffer) got a null device address");
                }
            };
            (check(args), ...);
        }
    }
};

}  // namespace typegrad::detail

namespace typegrad::cuda {

// The CUDA source the backend generates for a step (inspection, and the PTX tests): the
// value_and_grad plan with every wrt leaf, the forward plan and the backward plan after it.
template <class Step>
struct step_sources {
    // The value_and_grad plan with every wrt leaf (empty for a non-scalar output).
    std::string joint;
    // The forward plan.
    std::string forward;
    // The backward plan after it.
    std::string backward;
};
// The CUDA C++ source generated for a step's plans (what NVRTC compiles; for inspection).
template <class Policy, class Loss, class... Wrt>
step_sources<step<Policy, Loss, Wrt...>> generated_source(const step<Policy, Loss, Wrt...>&) {
    using B = typegrad::detail::device_backend<step<Policy, Loss, Wrt...>>;
    using grads = typegrad::detail::type_list<Wrt...>;
    constexpr bool seeded = !B::step_type::scalar_loss;
    using fwd = typename B::forward_plan;
    using bwd = typename B::template backward_plan<grads, seeded, fwd>;
    step_sources<step<Policy, Loss, Wrt...>> s;
    if constexpr (B::step_type::scalar_loss) {
        using joint = typename B::template joint_plan<grads>;
        detail::check_plan_on_device<joint>();
        s.joint = detail::generate_source<joint>();
    }
    detail::check_plan_on_device<fwd>();
    detail::check_plan_on_device<bwd>();
    s.forward = detail::generate_source<fwd>();
    s.backward = detail::generate_source<bwd>();
    return s;
}

// Compiles CUDA source to PTX with NVRTC for a virtual architecture (default compute_90);
// needs no GPU. Throws tg::device_error with NVRTC's log when it does not compile.
inline std::string compile_ptx(const std::string& source, const std::string& arch = "compute_90") {
    return detail::compile_to_ptx(source, arch);
}

}  // namespace typegrad::cuda
