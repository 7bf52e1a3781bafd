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

#include <typegrad/exec/cuda/execute.hpp>
#include <typegrad/exec/cuda/tensor.hpp>
#include <typegrad/exec/step.hpp>

namespace typegrad::cuda {

// The saved context of a forward pass on the device: the bound device inputs (they must stay
// alive and unchanged until backward), the reductions and kernel outputs the backward reads,
// and the output. Move-only.
template <class Step, class ForwardPlan>
class forward_context
    : public typegrad::detail::forward_context_base<forward_context<Step, ForwardPlan>, Step, ForwardPlan> {
public:
    // Marks the context as a device argument, so that step.backward(ctx, ...) runs on the device.
    static constexpr bool typegrad_device_argument = true;
    using typename typegrad::detail::forward_context_base<forward_context, Step, ForwardPlan>::value_type;

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
    detail::device_buffer storage_;
    const value_type* output_ = nullptr;
    std::size_t size_ = 0;
    mutable std::vector<value_type> host_;
    template <class>
    friend struct typegrad::detail::device_backend;
};

}  // namespace typegrad::cuda

namespace typegrad::detail {

// The device side of a step's three entry points: the call layer is the host's
// (exec/call.hpp: plans, checks, binding, seeds, aliasing); what differs is the run
// (generated kernels on device memory) and where the output is read.
template <class Policy, class Loss, class... Wrt>
struct device_backend<step<Policy, Loss, Wrt...>> {
    using step_type = step<Policy, Loss, Wrt...>;
    using T = typename step_type::value_type;
    using calls = call_layer<step_type>;

    // The plans of each entry point (also what tg::cuda::generated_source shows).
    template <class Grads>
    using joint_plan = typename calls::template joint_plan<Grads>;
    using forward_plan = typename calls::forward_plan;
    template <class Grads, bool Seeded, class ForwardPlan>
    using backward_plan = typename calls::template backward_plan<Grads, Seeded, ForwardPlan>;

    static void check_policy() {
        static_assert(!Policy::anomaly,
                      "typegrad: cuda: detect_anomaly checks values on the host; run the step with host "
                      "bindings to use it (docs/cuda.md)");
        static_assert(!is_reduced_precision_v<storage_t<T>>,
                      "typegrad: cuda: this step's output is bf16/f16, which the device path does not return yet; "
                      "end the graph in f32 (tg::cast<float>, or a loss, which autocast computes in f32) (docs/cuda.md)");
    }

    // Every argument is a device binding or tg::create_graph.
    template <class... Args>
    static constexpr bool all_device = all_true({(binding_space_v<Args> == memory_space::device ||
                                                  std::is_same_v<Args, create_graph_t>)...});
    // Host bindings mixed with device ones: a run-time device_error before anything runs.
    template <class... Args>
    static void reject_host_arguments(const char* entry) {
        if constexpr (!all_device<Args...>)
            fail<device_error>({"typegrad: ", entry,
                                ": host and device bindings are mixed in one call; bind every leaf, "
                                "gradient and seed to device memory (tg::cuda::tensor) or every one to "
                                "host memory; nothing was run"});
    }
    // The call's checks, and the plan's on the device.
    template <class Plan, bool LeavesFromArgs, class... Args>
    static void check_calls() {
        cuda::detail::check_plan_on_device<Plan>();
        static_assert(sizeof(typename calls::template call_check<Plan, LeavesFromArgs, Args...>));
    }
    // The kernels' accumulate flags, one per grad_into binding in call order.
    template <class Grads, class... Args>
    static constexpr auto accumulate_flags() {
        constexpr auto words = calls::template accumulate_words<Grads, Args...>();
        std::array<bool, Grads::size + 1> r{};
        for (std::size_t i = 0; i < Grads::size; ++i) r[i] = (words[i / 64] >> (i % 64)) & 1;
        return r;
    }

    // ---- entry points ------------------------------------------------------------------------
    template <class... Args>
    static T value_and_grad(const step_type&, const Args&... args) {
        reject_host_arguments<Args...>("value_and_grad");
        if constexpr (all_device<Args...>) {
            static_assert(step_type::scalar_loss,
                          "typegrad: value_and_grad(...) needs a scalar loss; for a non-scalar output use "
                          "forward(...) then backward(ctx, ..., tg::seed(buffer)).");
            check_policy();
            using grads = typename calls::template grads_of<Args...>;
            using Plan = joint_plan<grads>;
            check_calls<Plan, true, Args...>();
            step_type::check_autocast_context();
            typename Plan::state_type state{};
            calls::template bind_leaves<Plan>(state, args...);
            cuda::detail::compute_device_shapes<Plan>(state);
            calls::template check_leaf_sizes<Plan>(state, args...);
            calls::template bind_grads<Plan>(state, args...);
            const cuda::detail::compiled_module& m = cuda::detail::module_for<Plan>();
            cuda::detail::device_run<Plan> run;
            run.layout(state, sizeof(T));
            cuda::detail::device_buffer& arena = cuda::detail::thread_arena<Plan>();
            arena.reserve(run.bytes());
            run.bind(state, arena.data());
            void* loss_slot = run.extra(arena.data());
            if constexpr (Loss::kind == op_kind::elementwise) state.out[Plan::NS - 1] = loss_slot;
            run.run(state, m, accumulate_flags<grads, Args...>());
            return read_loss<Plan>(state, loss_slot);
        } else {
            return T{};
        }
    }

    template <class... Args>
    static auto forward(const step_type&, const Args&... args) {
        using Plan = forward_plan;
        using context = cuda::forward_context<step_type, Plan>;
        static_assert(!any_true({is_grad_binding_v<Args>...}) && !any_true({is_seed_binding_v<Args>...}),
                      "typegrad: forward(...) takes only tg::bind(...); gradients are requested from backward(ctx, ...).");
        reject_host_arguments<Args...>("forward");
        context ctx;
        if constexpr (all_device<Args...>) {
            check_policy();
            check_calls<Plan, true, Args...>();
            auto& state = ctx.state_;
            calls::template bind_leaves<Plan>(state, args...);
            cuda::detail::compute_device_shapes<Plan>(state);
            calls::template check_leaf_sizes<Plan>(state, args...);
            const cuda::detail::compiled_module& m = cuda::detail::module_for<Plan>();
            constexpr std::size_t loss_id = Plan::program::template id_of<Loss>::value;
            const std::size_t loss_n = node_numel<Plan>(state, loss_id);
            cuda::detail::device_run<Plan> run;
            run.layout(state, loss_n * sizeof(T));
            ctx.storage_ = cuda::detail::device_buffer(run.bytes());
            run.bind(state, ctx.storage_.data());
            T* out = static_cast<T*>(run.extra(ctx.storage_.data()));
            if constexpr (Loss::kind == op_kind::elementwise) state.out[Plan::NS - 1] = out;
            run.run(state, m, std::array<bool, Plan::NS + 1>{});
            if constexpr (Loss::kind == op_kind::constant) {
                std::vector<T> fill(loss_n, static_cast<T>(Loss::value));
                cuda::detail::copy_to_device(out, fill.data(), loss_n * sizeof(T));
            } else if constexpr (Loss::kind != op_kind::elementwise) {
                cuda::detail::gather(m, cuda::detail::gather_fn<T>(), state.ptr[loss_id], out, loss_n,
                                     Plan::program::info[loss_id].rank, state.ext.data() + Plan::rank_offset[loss_id],
                                     state.stride.data() + Plan::rank_offset[loss_id]);
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
            if constexpr (all_device<Args...>) {
                using ForwardPlan = typename Ctx::plan_type;
                static_assert(std::is_same_v<typename Ctx::step_type, step_type>,
                              "typegrad: backward(ctx, ...) got a context from another step.");
                constexpr bool seeded = any_true({is_seed_binding_v<Args>...});
                static_assert(seeded || step_type::scalar_loss,
                              "typegrad: backward(ctx, ...) of a non-scalar output needs a seed: pass "
                              "tg::seed(buffer) with the output's shape.");
                using grads = typename calls::template grads_of<Args...>;
                using Plan = backward_plan<grads, seeded, ForwardPlan>;
                check_calls<Plan, false, Args...>();
                step_type::check_autocast_context();
                typename Plan::state_type state{};
                // Leaves come from the forward call, the seed from this one.
                calls::template restore_nodes<Plan, ForwardPlan>(state, ctx.state_);
                if constexpr (seeded) calls::template bind_seed<Plan, ForwardPlan>(state, ctx.state_, args...);
                cuda::detail::compute_device_shapes<Plan>(state);
                if constexpr (seeded) calls::template check_seed_size<Plan>(state, args...);
                calls::template bind_grads<Plan>(state, args...);
                const cuda::detail::compiled_module& m = cuda::detail::module_for<Plan>();
                cuda::detail::device_run<Plan> run;
                run.layout(state, 0);
                cuda::detail::device_buffer& arena = cuda::detail::thread_arena<Plan>();
                arena.reserve(run.bytes());
                run.bind(state, arena.data());
                run.run(state, m, accumulate_flags<grads, Args...>());
            }
        }
    }

    template <class Plan>
    static T read_loss(const typename Plan::state_type& state, const void* slot) {
        T v{};
        if constexpr (Loss::kind == op_kind::constant) return static_cast<T>(Loss::value);
        else if constexpr (Loss::kind == op_kind::elementwise) cuda::detail::copy_to_host(&v, slot, sizeof v);
        else cuda::detail::copy_to_host(&v, state.ptr[Plan::program::template id_of<Loss>::value], sizeof v);
        return v;
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
