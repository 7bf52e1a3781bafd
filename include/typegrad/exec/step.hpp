#pragma once
// tg::compile(loss, tg::wrt(a, b, ...)) -> a step whose forward and backward are planned at
// compile time. value_and_grad runs forward and backward as one fused plan; forward/backward
// split it and pass reduction results through a saved context.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>


#include <typegrad/autocast/guard.hpp>
#include <typegrad/autocast/rewrite.hpp>
#include <typegrad/autodiff/gradients.hpp>
#include <typegrad/autodiff/policy.hpp>
#include <typegrad/autodiff/reverse.hpp>
#include <typegrad/core/cpu/buffer_pool.hpp>
#include <typegrad/core/error.hpp>
#include <typegrad/exec/bind.hpp>
#include <typegrad/exec/call.hpp>
#include <typegrad/exec/custom_checks.hpp>
#include <typegrad/exec/device.hpp>
#include <typegrad/exec/execute.hpp>
#include <typegrad/exec/forward_context.hpp>
#include <typegrad/exec/post_hooks.hpp>
#include <typegrad/exec/step_view.hpp>
#include <typegrad/ops/custom.hpp>

namespace typegrad {

// The number of distinct plans (graph x call signature) run so far in this process.
inline std::size_t plan_count();


namespace detail {

// Thread-local scratch per plan: steps are immutable and reentrant across threads, and after
// the first call at a given size nothing is allocated.
template <class Plan>
scratch_unit* scratch_buffer(std::size_t units) {
    thread_local std::vector<scratch_unit> arena;
    if (arena.size() < units + 8) arena.resize(units + 8);
    auto addr = reinterpret_cast<std::uintptr_t>(arena.data());
    const std::size_t skip = ((64 - addr % 64) % 64) / sizeof(scratch_unit);
    return arena.data() + skip;
}

// How many distinct plans this process has run: a plan is a type, built by the compiler, so a
// step with dynamic extents runs every size with one plan (tg::plan_count() observes it).
inline std::atomic<std::size_t>& plan_counter() {
    static std::atomic<std::size_t> n{0};
    return n;
}
template <class Plan>
void note_plan_use() {
    static const bool counted = (plan_counter().fetch_add(1, std::memory_order_relaxed), true);
    (void)counted;
}

}  // namespace detail

// A compiled value-and-gradient step, as returned by tg::compile(loss, tg::wrt(...)): the
// forward and backward plans are derived from the graph type at compile time (PyTorch:
// torch.compile'd forward plus AOTAutograd's backward; JAX: jax.jit(jax.value_and_grad(f))).
// Calls take bindings (tg::bind, tg::grad_into, tg::seed, tg::params, tg::grads_into) in any order;
// a missing or extra binding is a static_assert, run-time errors throw before any caller buffer
// is written.
template <class Policy, class Loss, class... Wrt>
class step {
public:
    // The loss (output) node type.
    using loss_node = Loss;
    // The loss's dtype.
    using value_type = typename Loss::value_type;
    // The leaves given to tg::wrt.
    using wrt_list = detail::type_list<Wrt...>;
    // True for a scalar output (value_and_grad); otherwise backward needs tg::seed.
    static constexpr bool scalar_loss = detail::is_scalar_loss_v<Loss>;
    // The leaf tg::seed binds for a non-scalar output (the output's dtype and shape).
    using seed_leaf = leaf<name_of_t<"seed">, value_type, typename Loss::shape_type, leaf_role::seed>;

    // The spec of the autocast region wrapping the whole loss (no_autocast when none).
    using ambient_autocast = typename Policy::ambient;
    // The spec the backward ops run under, from the backward_autocast policy.
    using backward_autocast_spec = typename Policy::backward_spec;

    // The gradient nodes for a unit seed (scalar losses) or an explicit seed leaf, and what
    // resolves their references (detail::step_gradients).
    template <bool Seeded>
    using gradients = detail::step_gradients<
        Loss, std::conditional_t<Seeded, seed_leaf, detail::node_of_t<decltype(lit<1>)>>, backward_autocast_spec>;
    // Gradient node of Leaf for a unit seed (scalar losses) or an explicit seed leaf, with the
    // backward ops under the backward's autocast spec.
    template <class Leaf, bool Seeded>
    using grad_node = typename gradients<Seeded>::template node<Leaf>;
    // What resolves the references the gradient nodes hold (graph_of_t's second argument).
    template <bool Seeded>
    using grad_refs = typename gradients<Seeded>::refs;

    // The loss and the gradients in one fused call: returns the scalar loss and writes the gradient
    // of every leaf named in a tg::grad_into / tg::grads_into argument (others are not computed).
    // Arguments: tg::bind for every leaf of the graph, grad_into for any subset of the wrt leaves.
    // Throws shape_error (sizes), binding_error (null buffers), aliasing_error (outputs overlapping
    // inputs), autocast_mismatch (tg::autocast_guard contradicts the policy), anomaly_error (with
    // tg::detect_anomaly): all before any buffer is written. PyTorch: loss.backward() after the
    // forward; JAX: jax.value_and_grad.
    template <class... Args>
        requires(!detail::any_device_argument<Args...>)
    value_type value_and_grad(const Args&... args) const {
        static_assert(scalar_loss,
                      "typegrad: value_and_grad(...) needs a scalar loss; for a non-scalar output "
                      "use forward(...) then backward(ctx, ..., tg::seed(buffer)).");
        using grads = grads_of<Args...>;
        using Plan = typename calls::template joint_plan<grads>;
        typename Plan::state_type state{};
        check_calls<Plan, true, Args...>();
        check_autocast_context();
        calls::template bind_leaves<Plan>(state, args...);
        detail::compute_shapes<Plan>(state);
        calls::template check_leaf_sizes<Plan>(state, args...);
        calls::template bind_grads<Plan>(state, args...);
        std::array<std::size_t, Plan::M + 1> offset{};
        const std::size_t scratch_size = detail::scratch_layout<Plan>(state, offset) + 16;
        detail::scratch_unit* scratch = detail::scratch_buffer<Plan>(scratch_size);
        using hooks = detail::post_hook_schedule<Plan, Plan, grads, post_hooks>;  // nothing unless hooked
        if constexpr (post_hooks::size > 0)
            detail::check_post_hook_params(hooks::table, state.mut.data(), Plan::program::info.data());
        detail::check_custom_mutations<Plan>(state);
        detail::note_plan_use<Plan>();
        value_type loss_slot{};
        if constexpr (Loss::kind == op_kind::elementwise) state.out[Plan::NS - 1] = &loss_slot;
        if constexpr (anomaly) dry_run<Plan, accumulate_mask<grads, Args...>>(state, scratch, offset);
        detail::prepare_scratch<Plan>(state, scratch, offset);
        detail::save_in_place<Plan, accumulate_mask<grads, Args...>>(state);
        // the post-accumulate hooks run inside, each once its gradient is final
        if constexpr (post_hooks::size > 0)
            detail::run_loops<Plan, accumulate_mask<grads, Args...>>(
                state, detail::post_hook_calls_of(hooks::table, state.mut.data(), state.ext.data()));
        else
            detail::run_loops<Plan, accumulate_mask<grads, Args...>>(state);
        return read_loss<Plan>(state, loss_slot);
    }

    // The forward pass alone: returns a forward_context holding the output and what the backward
    // needs. The bound buffers must stay alive and unchanged until backward. Throws as value_and_grad.
    template <class... Args>
        requires(!detail::any_device_argument<Args...>)
    auto forward(const Args&... args) const {
        using Plan = typename calls::forward_plan;
        forward_context<step, Plan> ctx;
        check_calls<Plan, true, Args...>();
        calls::template bind_leaves<Plan>(ctx.state_, args...);
        detail::compute_shapes<Plan>(ctx.state_);
        calls::template check_leaf_sizes<Plan>(ctx.state_, args...);
        std::array<std::size_t, Plan::M + 1> offset{};
        const std::size_t n = detail::scratch_layout<Plan>(ctx.state_, offset);
        const std::size_t loss_n = detail::node_numel<Plan>(ctx.state_, Plan::program::template id_of<Loss>::value);
        ctx.storage_ = detail::pooled_buffer<detail::scratch_unit>(n + loss_n + 8);
        value_type* loss_buf = reinterpret_cast<value_type*>(ctx.storage_.data() + n);
        if constexpr (Loss::kind == op_kind::elementwise) ctx.state_.out[Plan::NS - 1] = loss_buf;
        detail::check_custom_mutations<Plan>(ctx.state_);
        detail::note_plan_use<Plan>();
        detail::prepare_scratch<Plan>(ctx.state_, ctx.storage_.data(), offset);
        if constexpr (anomaly) {
            detail::anomaly_node() = detail::no_anomaly;
            detail::run_loops<Plan, detail::grad_mask<>, true>(ctx.state_);
            report_anomaly<Plan>();
        } else {
            detail::run_loops<Plan, detail::grad_mask<>>(ctx.state_);
        }
        if constexpr (Loss::kind != op_kind::elementwise)
            copy_node_value<Plan, Loss>(ctx.state_, loss_buf, loss_n);
        ctx.loss_ = loss_buf;
        ctx.loss_size_ = loss_n;
        return ctx;
    }

    // The backward of a forward_context from this step: writes the gradients named by grad_into
    // arguments; a non-scalar output needs tg::seed(buffer) (the output's gradient; PyTorch:
    // out.backward(grad)). Throws as value_and_grad, and mutation_error for tg::create_graph with a
    // mutating custom backward.
    template <class Ctx, class... Args>
        requires(!detail::any_device_argument<Ctx, Args...>)
    void backward(const Ctx& ctx, const Args&... args) const {
        using ForwardPlan = typename Ctx::plan_type;
        static_assert(std::is_same_v<typename Ctx::step_type, step>,
                      "typegrad: backward(ctx, ...) got a context from another step.");
        constexpr bool seeded = detail::any_true({detail::is_seed_binding_v<Args>...});
        static_assert(seeded || scalar_loss,
                      "typegrad: backward(ctx, ...) of a non-scalar output needs a seed: pass "
                      "tg::seed(buffer) with the output's shape.");
        using grads = grads_of<Args...>;
        using Plan = typename calls::template backward_plan<grads, seeded, ForwardPlan>;
        typename Plan::state_type state{};
        check_calls<Plan, false, Args...>();
        check_autocast_context();
        // Leaves come from the forward call, the seed from this one.
        calls::template restore_nodes<Plan, ForwardPlan>(state, ctx.state_);
        if constexpr (seeded) calls::template bind_seed<Plan, ForwardPlan>(state, ctx.state_, args...);
        detail::compute_shapes<Plan>(state);
        if constexpr (seeded) calls::template check_seed_size<Plan>(state, args...);
        calls::template bind_grads<Plan>(state, args...);
        std::array<std::size_t, Plan::M + 1> offset{};
        const std::size_t scratch_size = detail::scratch_layout<Plan>(state, offset) + 16;
        detail::scratch_unit* scratch = detail::scratch_buffer<Plan>(scratch_size);
        // params are bound in the forward's state (the backward plan may not read them)
        using hooks = detail::post_hook_schedule<Plan, ForwardPlan, grads, post_hooks>;
        if constexpr (post_hooks::size > 0)
            detail::check_post_hook_params(hooks::table, ctx.state_.mut.data(), ForwardPlan::program::info.data());
        detail::check_custom_mutations<Plan>(state);
        check_create_graph<Plan>(args...);
        detail::note_plan_use<Plan>();
        if constexpr (anomaly) dry_run<Plan, accumulate_mask<grads, Args...>>(state, scratch, offset);
        detail::prepare_scratch<Plan>(state, scratch, offset);
        detail::save_in_place<Plan, accumulate_mask<grads, Args...>>(state);
        if constexpr (post_hooks::size > 0)
            detail::run_loops<Plan, accumulate_mask<grads, Args...>>(
                state, detail::post_hook_calls_of(hooks::table, ctx.state_.mut.data(), ctx.state_.ext.data()));
        else
            detail::run_loops<Plan, accumulate_mask<grads, Args...>>(state);
    }

    // A call with a device binding (tg::cuda::tensor, tg::cuda::bind) or a device forward context
    // runs on the device backend (typegrad/cuda.hpp), which rejects host bindings mixed in
    // (device_error). value_and_grad with device bindings: the loss, gradients written on the device.
    template <class... Args>
        requires detail::any_device_argument<Args...>
    value_type value_and_grad(const Args&... args) const {
        return detail::device_backend<step>::value_and_grad(*this, args...);
    }
    // forward with device bindings: returns a tg::cuda::forward_context.
    template <class... Args>
        requires detail::any_device_argument<Args...>
    auto forward(const Args&... args) const {
        return detail::device_backend<step>::forward(*this, args...);
    }
    // backward of a tg::cuda::forward_context, with device gradient bindings.
    template <class Ctx, class... Args>
        requires detail::any_device_argument<Ctx, Args...>
    void backward(const Ctx& ctx, const Args&... args) const {
        detail::device_backend<step>::backward(*this, ctx, args...);
    }

private:
    // The call layer shared with the device backend (exec/call.hpp).
    using calls = detail::call_layer<step>;
    template <class... Args>
    using grads_of = typename calls::template grads_of<Args...>;
    template <class Grads, class... Args>
    struct accumulate_mask_of {
        static constexpr auto words = calls::template accumulate_words<Grads, Args...>();
        template <std::size_t... Ws>
        static detail::grad_mask<words[Ws]...> make(std::index_sequence<Ws...>);
        using type = decltype(make(std::make_index_sequence<words.size()>{}));
    };
    // The run loops' accumulate flags: one bit per grad_into binding, in call order.
    template <class Grads, class... Args>
    using accumulate_mask = typename accumulate_mask_of<Grads, Args...>::type;

    template <class Plan, bool LeavesFromArgs, class... Args>
    static void check_calls() {
        detail::log_graphs_once<step>();  // TYPEGRAD_LOG=graphs: describe() on the first call
        static_assert(sizeof(typename calls::template call_check<Plan, LeavesFromArgs, Args...>));
    }

    // The graph's post-accumulate hook nodes, in registration order; a call runs those whose
    // leaf it writes a gradient for, inside the schedule (detail::post_hook_schedule).
    template <class N>
    struct is_post_hook : std::bool_constant<detail::is_post_hook_v<N>> {};
    using post_hooks = detail::filter_t<detail::topo_t<Loss>, is_post_hook>;

    // create_graph: fails exactly when a custom backward mutates an input that requires grad.
    // The list of such (node, input) pairs is a compile-time constant; when it is empty this
    // compiles to nothing.
    template <class Plan, class... Args>
    static void check_create_graph(const Args&... args) {
        constexpr auto hazards = detail::create_graph_hazards<Plan>();
        if constexpr (hazards.size() > 0) {
            bool requested = false;
            auto see = [&](const auto& a) {
                if constexpr (std::is_same_v<std::remove_cvref_t<decltype(a)>, create_graph_t>) requested = requested || a.enabled;
            };
            detail::for_each_arg(see, args...);
            if (requested) {
                std::string what = "typegrad: backward(..., tg::create_graph): a custom op's backward mutates input";
                for (const auto& h : hazards)
                    what += detail::message(" ", h.input, " (of node ", h.node, " '", Plan::program::info[h.node].name, "')");
                what += ", which requires grad; the backward cannot be differentiated";
                throw mutation_error(what);
            }
        }
    }

public:
    // The create_graph hazards of a backward call with these arguments (for static_asserts).
    template <bool Seeded, class... GradLeaves>
    static constexpr std::size_t create_graph_hazard_count() {
        using stores = detail::type_list<grad_node<GradLeaves, Seeded>...>;
        using nodes = detail::graph_of_t<stores, grad_refs<Seeded>>;
        using Plan = detail::plan_provider<nodes, stores, detail::type_list<>, detail::type_list<>, value_type>;
        return detail::create_graph_hazards<Plan>().size();
    }

private:
    static constexpr bool anomaly = Policy::anomaly;

    // A backward under an autocast_guard that contradicts the spec it was compiled for.
    static void check_autocast_context() {
        if constexpr (Policy::check_mismatch) {
            const detail::guard_slot& g = detail::current_guard();
            constexpr autocast_state expected = autocast_state_of<backward_autocast_spec>();
            if (g.active && !(g.state == expected))
                detail::fail<autocast_mismatch>({
                                                 "typegrad: the backward runs under an autocast_guard declaring ", describe_autocast(g.state),
                                                 ", but its step was compiled for a backward under ", describe_autocast(expected),
                                                 "; compile it with the matching tg::backward_autocast policy (or add "
                                                 "tg::on_autocast_mismatch::ignore)"});
        }
    }

    // Anomaly mode: run the whole plan once with every value checked and the outputs redirected
    // to temporaries; only a clean run is repeated for real.
    template <class Plan, class Acc>
    static void dry_run(const typename Plan::state_type& state, detail::scratch_unit* scratch,
                        const std::array<std::size_t, Plan::M + 1>& offset) {
        static_assert(detail::create_graph_hazard_count<Plan>() == 0 && !mutates_anything<Plan>(),
                      "typegrad: detect_anomaly runs a step twice (a checked dry run first); it cannot be "
                      "combined with custom ops that mutate their inputs.");
        typename Plan::state_type dry = state;
        std::array<std::vector<detail::scratch_unit>, Plan::NS + 1> temp;
        for (std::size_t i = 0; i < Plan::NS; ++i) {
            const std::size_t bytes = detail::node_numel<Plan>(state, Plan::stores[i]) * Plan::program::info[Plan::stores[i]].elem_size;
            temp[i].assign(bytes / sizeof(detail::scratch_unit) + 1, detail::scratch_unit{});
            dry.out[i] = temp[i].data();
        }
        detail::prepare_scratch<Plan>(dry, scratch, offset);
        detail::anomaly_node() = detail::no_anomaly;
        detail::run_loops<Plan, Acc, true>(dry);
        report_anomaly<Plan>();
    }
    template <class Plan>
    static void report_anomaly() {
        const std::size_t n = detail::anomaly_node();
        if (n == detail::no_anomaly) return;
        constexpr auto forward_nodes = []<class... Ns>(detail::type_list<Ns...>) {
            return std::array<bool, Plan::M>{(detail::topo<Loss>::template id_of<Ns>::value != detail::no_parent)...};
        }(typename Plan::program::nodes{});
        detail::fail<anomaly_error>({"typegrad: anomaly: node %", n, " '", Plan::program::info[n].name, "' (",
                                     forward_nodes[n] ? "forward" : "backward",
                                     ") produced NaN or Inf; nothing was written"});
    }
    template <class Plan>
    static constexpr bool mutates_anything() {
        return []<class... Ns>(detail::type_list<Ns...>) {
            return detail::any_true({mutating_custom<Ns>()...});
        }(typename Plan::program::nodes{});
    }
    template <class N>
    static constexpr bool mutating_custom() {
        using ci = detail::custom_kernel_info<N>;
        if constexpr (!ci::is_custom) return false;
        else return []<std::size_t... Ks>(std::index_sequence<Ks...>) {
            return (detail::declares_mutation<typename ci::op, ci::backward, Ks>() || ...);
        }(std::make_index_sequence<N::children::size>{});
    }

    // A bf16/f16 reduction is held in float: its value rounds once, here.
    template <class B>
    static value_type value_from(B x) {
        if constexpr (std::is_same_v<B, value_type>) return x;
        else return value_type(x);
    }
    template <class Plan>
    static value_type read_loss(const typename Plan::state_type& state, value_type slot) {
        if constexpr (Loss::kind == op_kind::elementwise) return slot;
        else if constexpr (Loss::kind == op_kind::constant) return static_cast<value_type>(Loss::value);
        else return value_from(*static_cast<const detail::buffer_t<Loss>*>(state.ptr[Plan::program::template id_of<Loss>::value]));
    }
    template <class Plan, class N>
    static void copy_node_value(const typename Plan::state_type& state, value_type* dst, std::size_t n) {
        if constexpr (N::kind == op_kind::constant) {
            std::fill(dst, dst + n, static_cast<value_type>(N::value));
        } else {
            // the output may be a strided view: walk it in row-major order
            constexpr std::size_t id = Plan::program::template id_of<N>::value;
            constexpr std::size_t rank = N::shape_type::rank;
            const auto* src = static_cast<const detail::buffer_t<N>*>(state.ptr[id]);
            for (std::size_t e = 0; e < n; ++e) {
                std::size_t r = e;
                std::ptrdiff_t off = 0;
                for (std::size_t a = rank; a-- > 0;) {
                    const std::size_t ext = state.ext[Plan::rank_offset[id] + a];
                    off += std::ptrdiff_t(r % ext) * state.stride[Plan::rank_offset[id] + a];
                    r /= ext;
                }
                dst[e] = value_from(src[off]);
            }
        }
    }

    template <class, class>
    friend class forward_context;
    template <class>
    friend struct detail::device_backend;  // shares the host checks (autocast context)

public:
    // The plans value_and_grad and forward use when every wrt leaf gets a gradient; inspection
    // (describe, to_dot) reads them. A template, so that nothing is planned unless asked for.
    template <class Unused = void>
    struct plans {
        // The gradient nodes of every wrt leaf.
        using grad_stores = typename calls::template grad_stores<wrt_list, false>;
        // The gradients and the loss: what value_and_grad stores.
        using joint_stores = typename calls::template joint_stores<wrt_list>;
        // The plan of value_and_grad.
        using joint = typename calls::template joint_plan<wrt_list>;
        // The plan of forward.
        using forward = typename calls::forward_plan;
    };
};

inline std::size_t plan_count() { return detail::plan_counter().load(); }

// compile<Policies...>(loss, wrt(...)): derives the backward of `loss` for the wrt leaves and returns
// a step (the C++ form of torch.compile with AOTAutograd; JAX: jax.jit(jax.value_and_grad(f))).
// Policies, at most one of each: backward_autocast::same_as_forward (the default),
// backward_autocast::off or backward_autocast::custom<Spec>; tg::detect_anomaly;
// on_autocast_mismatch::ignore. The ambient autocast spec is that of a tg::autocast region
// wrapping the whole loss.
template <class... Policies, class Loss, class... Leaves>
constexpr auto compile(Loss, wrt_t<Leaves...>) {
    static_assert(is_expr_v<std::remove_cvref_t<Loss>>,
                  "typegrad: compile(loss, wrt(...)) takes a typegrad expression as the loss.");
    using raw = typename Loss::node_type;
    using L = detail::unalias_t<raw>;  // a region around the whole loss is its ambient spec
    return step<detail::step_policy<detail::ambient_autocast_t<raw>, Policies...>, L, Leaves...>{};
}

}  // namespace typegrad
