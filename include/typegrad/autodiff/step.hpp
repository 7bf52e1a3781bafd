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


#include <typegrad/autodiff/reverse.hpp>
#include <typegrad/ops/autocast.hpp>
#include <typegrad/ops/custom.hpp>
#include <typegrad/core/error.hpp>
#include <typegrad/exec/bind.hpp>
#include <typegrad/exec/cpu/buffer_pool.hpp>
#include <typegrad/exec/device.hpp>
#include <typegrad/exec/execute.hpp>
#include <typegrad/inspect/describe.hpp>

namespace typegrad {

// The number of distinct plans (graph x call signature) run so far in this process.
inline std::size_t plan_count();

// The leaves a step differentiates with respect to, as built by tg::wrt.
template <class... Leaves>
struct wrt_t {
    // The leaf types, in the order given to tg::wrt.
    using leaves = detail::type_list<Leaves...>;
};

// The params to differentiate with respect to: tg::compile(loss, tg::wrt(W, b)) (torch.autograd.grad's
// inputs, jax.grad's argnums). Expressions, inputs and repeated leaves are static_asserts.
template <class... Es>
constexpr auto wrt(Es...) {
    static_assert(detail::all_true({is_leaf_v<typename Es::node_type>...}),
                  "typegrad: wrt(...) takes leaves (tg::param), not expressions.");
    static_assert(detail::all_true({(Es::node_type::role == leaf_role::param)...}),
                  "typegrad: wrt(...) got a tg::input; only a tg::param has a gradient (declare "
                  "the leaf with tg::param to differentiate with respect to it).");
    static_assert(detail::distinct<typename Es::node_type...>(),
                  "typegrad: wrt(...) names the same leaf twice.");
    return wrt_t<typename Es::node_type...>{};
}

// Passed to backward(): the caller will differentiate the gradient again.
struct create_graph_t {
    // Whether the gradient will be differentiated again (as create_graph=True).
    bool enabled = true;
};
// Pass to backward(ctx, ..., tg::create_graph) when the caller will differentiate the gradient
// again (torch.autograd.grad(create_graph=True)); throws mutation_error if a custom op's backward
// mutates an input that requires grad.
inline constexpr create_graph_t create_graph{};

// Policy for compile<>: check every forward and backward value for NaN/Inf and throw
// tg::anomaly_error naming the first node that produced one (a checked dry run precedes the
// real one, so no caller buffer is written when it throws).
struct detect_anomaly {};


namespace detail {

template <class Binding, class Leaf>
inline constexpr bool grads_leaf_v = false;
template <class Leaf, bool A>
inline constexpr bool grads_leaf_v<grad_binding<Leaf, A>, Leaf> = true;

template <class B> struct binding_leaf { using type = void; };
template <class L> struct binding_leaf<leaf_binding<L>> { using type = L; };
template <class L, bool A> struct binding_leaf<grad_binding<L, A>> { using type = L; };

// Compile-time checks of a call's arguments are class templates with static_asserts, forced by
// sizeof: g++ gives every function and variable it instantiates a mangled name, and these are
// named with the graph (or with every argument): for each such name g++ makes a large allocation,
// and past a few blocks each one walks its whole list of free pages (about 10 ms a name at 8 GPT
// blocks). A class with only static_asserts is never named. Counts are builtin comparisons in a
// braced list (a fold over 256 operands is rejected by clang; a variable per pair is named).
template <class Leaf, class Nodes>
struct check_leaf_binding_usable {
    static_assert(contains_v<Leaf, Nodes>,
                  "typegrad: a tg::bind(...) names a leaf that the compiled graph does not use.");
};
template <class Leaf, std::size_t Count>
struct check_bound_once {
    static_assert(Count <= 1, "typegrad: a leaf is bound twice in one call; bind each leaf once.");
};
template <class Leaf, bool Bound, bool Needed>
struct check_has_binding {
    static_assert(Bound || !Needed,
                  "typegrad: the call has no tg::bind(...) for a leaf that the graph reads (the "
                  "leaf is named in the instantiation below); bind every leaf of the loss.");
};
template <class Leaf, bool Bound, bool DynamicShape>
struct check_shape_known {
    static_assert(Bound || !DynamicShape,
                  "typegrad: a leaf with a dynamic extent has no binding, so its size is unknown; "
                  "bind it (tg::bind) in this call.");
};
template <class Leaf, class WrtList, class LossGraph>
struct check_grad_target {
    static_assert(contains_v<Leaf, WrtList> ||
                      (retained_node_v<Leaf> && LossGraph::template id_of<Leaf>::value != no_parent),
                  "typegrad: grad_into(leaf, buffer) names a leaf that is not in the step's "
                  "tg::wrt(...) list.");
};
// One argument of a call (Args: all of them, for the counts).
template <class Nodes, class WrtList, class LossGraph, class Arg, class... Args>
struct arg_check {
    static_assert(is_seed_binding_v<Arg> || __is_same(Arg, create_graph_t),
                  "typegrad: arguments of value_and_grad/forward/backward are tg::bind(...), "
                  "tg::grad_into(...) and tg::seed(...).");
};
template <class Nodes, class WrtList, class LossGraph, class L, class... Args>
struct arg_check<Nodes, WrtList, LossGraph, leaf_binding<L>, Args...> {
    static_assert(sizeof(check_leaf_binding_usable<L, Nodes>) &&
                  sizeof(check_bound_once<L, count_true({__is_same(Args, leaf_binding<L>)...})>));
};
template <class Nodes, class WrtList, class LossGraph, class L, bool A, class... Args>
struct arg_check<Nodes, WrtList, LossGraph, grad_binding<L, A>, Args...> {
    static_assert(sizeof(check_grad_target<L, WrtList, LossGraph>));
    static_assert(count_true({(__is_same(Args, grad_binding<L, true>) || __is_same(Args, grad_binding<L, false>))...}) <= 1,
                  "typegrad: grad_into names the same leaf twice in one call.");
};
// A leaf node of the plan: bound when needed, and when its shape is dynamic.
template <class Node, bool BoundLeaf, bool Needed, class... Args>
struct leaf_node_check {};
template <class Node, bool Needed, class... Args>
struct leaf_node_check<Node, true, Needed, Args...> {
    static_assert(sizeof(check_has_binding<Node, any_true({__is_same(Args, leaf_binding<Node>)...}), Needed>) &&
                  sizeof(check_shape_known<Node, any_true({__is_same(Args, leaf_binding<Node>)...}),
                                           !Node::shape_type::is_static>));
};

template <class T>
struct span_c {
    const void* begin;
    const void* end;
};
inline bool overlaps(const void* a0, const void* a1, const void* b0, const void* b1) {
    return std::less<>{}(a0, b1) && std::less<>{}(b0, a1);
}

// Thread-local scratch per plan: steps are immutable and reentrant across threads, and after
// the first call at a given size nothing is allocated.
template <class PP>
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
template <class PP>
void note_plan_use() {
    static const bool counted = (plan_counter().fetch_add(1, std::memory_order_relaxed), true);
    (void)counted;
}

// A readable name for messages: a leaf's, or the op of a retained node.
template <class N>
constexpr std::string_view display_name() {
    if constexpr (is_leaf_v<N>) return N::name();
    else return "retain_grad(...)";
}

// A leaf bound by the caller (every leaf but a backward seed).
template <class N>
constexpr bool is_bound_leaf() {
    if constexpr (is_leaf_v<N>) return N::role != leaf_role::seed;
    else return false;
}

}  // namespace detail

namespace detail {
template <class P>
inline constexpr bool is_backward_policy_v = std::is_same_v<P, backward_autocast::same_as_forward> ||
                                             std::is_same_v<P, backward_autocast::off>;
template <class S>
inline constexpr bool is_backward_policy_v<backward_autocast::custom<S>> = true;
template <class P>
inline constexpr bool is_known_policy_v = is_backward_policy_v<P> || std::is_same_v<P, detect_anomaly> ||
                                          std::is_same_v<P, on_autocast_mismatch::raise> ||
                                          std::is_same_v<P, on_autocast_mismatch::ignore>;

// The backward's autocast spec under policy P, given the forward's ambient spec.
template <class P, class Ambient>
struct backward_spec_of {
    using type = Ambient;  // same_as_forward
};
template <class Ambient>
struct backward_spec_of<backward_autocast::off, Ambient> {
    using type = no_autocast;
};
template <class S, class Ambient>
struct backward_spec_of<backward_autocast::custom<S>, Ambient> {
    using type = S;
};

// compile<Ps...>'s policies, with the ambient autocast spec of the compiled expression.
template <class Ambient, class... Ps>
struct step_policy {
    static_assert((is_known_policy_v<Ps> && ...),
                  "typegrad: compile<...> got an unknown policy; the policies are tg::backward_autocast::"
                  "same_as_forward, ::off, ::custom<Spec>, tg::detect_anomaly and tg::on_autocast_mismatch::ignore.");
    static_assert((std::size_t(is_backward_policy_v<Ps>) + ... + 0) <= 1,
                  "typegrad: compile<...> got more than one backward_autocast policy.");
    using backward_policy = type_at_t<0, decltype((type_list<>{} + ... +
                                                   std::conditional_t<is_backward_policy_v<Ps>, type_list<Ps>, type_list<>>{}) +
                                                  type_list<backward_autocast::same_as_forward>{})>;
    using ambient = Ambient;
    using backward_spec = typename backward_spec_of<backward_policy, Ambient>::type;
    static constexpr bool anomaly = (std::is_same_v<Ps, detect_anomaly> || ...);
    static constexpr bool check_mismatch = !(std::is_same_v<Ps, on_autocast_mismatch::ignore> || ...);
};


template <class N>
constexpr std::string_view op_name_of() {
    if constexpr (requires { N::op::name; }) return N::op::name;
    else return "";
}
template <fixed_string Name>
struct named {
    template <class N>
    struct test : std::bool_constant<op_name_of<N>() == Name.view()> {};
};
template <class... Ms>
type_list<typename Ms::value_type...> value_types(type_list<Ms...>);
template <fixed_string Name, class... Ns>
auto op_dtypes(type_list<Ns...>) -> decltype(detail::value_types(filter_t<type_list<Ns...>, named<Name>::template test>{}));

// Whether the forward plan FwdPP computed node N, a reduction or a kernel (matmul, custom ops),
// which the backward then reads: they are never recomputed, and a custom op's forward mutations
// must not run twice. A class, not a function of N: g++ names every function it instantiates,
// constant-evaluated ones too, and a function of N is named with N's subgraph (one per node of a
// backward).
template <class FwdPP, class N, bool Candidate = N::kind == op_kind::reduce || N::kind == op_kind::kernel>
struct saved_by : std::false_type {};
template <class FwdPP, class N>
struct saved_by<FwdPP, N, true>
    : std::bool_constant<FwdPP::program::template contains<N>::value &&
                         FwdPP::plan.computed[FwdPP::program::template id_of<N>::value]> {};

// A step's gradient nodes (`node<Leaf>`) and the context that resolves their references
// (`refs`, for graph_of_t). Without a backward autocast spec, the backward graph of the reverse
// pass, whose nodes read forward values and adjoints through references; with one, the nested
// gradient graph, whose backward nodes (those not in the forward graph) the autocast rewrite
// reads and rewrites under the spec.
template <class Loss, class Seed, class Spec, bool Rewrite = Spec::enabled>
struct step_gradients {
    using refs = reverse_pass<Loss, Seed>;
    template <class Leaf>
    using node = gradient_ref_t<refs, Leaf>;
};
template <class Loss, class Seed, class Spec>
struct step_gradients<Loss, Seed, Spec, true> {
    using refs = no_refs;
    template <class Leaf>
    using node = typename canonical_gradient<Leaf, rewrite_t<gradient_node_t<Loss, Seed, Leaf>, Spec, topo<Loss>>>::type;
};
}  // namespace detail

// The dtypes of the nodes named Name (an op name, e.g. "matmul") in a list of node types such as
// step::backward_nodes, in topological order: compile-time evidence of the dtype a (backward) op
// runs in, e.g. static_assert(std::is_same_v<tg::op_dtypes_t<S::backward_nodes, "matmul">,
// tg::type_list<tg::bf16>>).
template <class Nodes, fixed_string Name>
using op_dtypes_t = decltype(detail::op_dtypes<Name>(Nodes{}));
// A list of types (of nodes, dtypes), as op_dtypes_t and backward_nodes_t give them.
template <class... Ts>
using type_list = detail::type_list<Ts...>;

namespace detail {
// The id of the leaf an argument binds (PP::M for other arguments); a type, not a variable (see
// arg_check).
template <class PP, class Arg>
struct bound_leaf_id : std::integral_constant<std::size_t, PP::M> {};
template <class PP, class Leaf>
struct bound_leaf_id<PP, leaf_binding<Leaf>> : PP::program::template id_of<Leaf> {};

template <class Arg>
void check_leaf_size(const Arg& b, [[maybe_unused]] std::size_t need, [[maybe_unused]] const std::size_t* ext) {
    if constexpr (is_leaf_binding_v<Arg>) {
        using L = typename Arg::leaf_type;
        if (b.size != unknown_size && b.size != need)
            throw shape_error(message("typegrad: bind(", L::name(), ", ...): the buffer has ", b.size,
                                      " elements but extents ", extents_text(ext, L::shape_type::rank), " need ", need));
    }
}
// A leaf's binding: its extents (checked against the leaf's static ones), data and writable data.
template <class Arg>
void bind_leaf(const Arg& b, [[maybe_unused]] std::size_t* e, [[maybe_unused]] const void** ptr,
               [[maybe_unused]] void** mut, [[maybe_unused]] std::size_t id, [[maybe_unused]] bool needed) {
    if constexpr (is_leaf_binding_v<Arg>) {
        using L = typename Arg::leaf_type;
        using S = typename L::shape_type;
        for (std::size_t a = 0; a < S::rank; ++a) {
            if (S::extents[a] != dyn && b.extents[a] != S::extents[a])
                throw shape_error(message("typegrad: bind(", L::name(), ", ...): axis ", a, " has extent ",
                                          b.extents[a], " but the leaf declares ", S::extents[a]));
            // tg::dyn (SIZE_MAX) marks a dynamic extent inside the plan: never a size
            if (b.extents[a] == dyn)
                throw shape_error(message("typegrad: bind(", L::name(), ", ...): axis ", a,
                                          " has extent tg::dyn (SIZE_MAX), which is not a size"));
            e[a] = b.extents[a];
        }
        if (b.data == nullptr && needed) {
            std::size_t n = 1;
            for (std::size_t a = 0; a < S::rank; ++a) n *= e[a];
            if (n != 0) throw binding_error(message("typegrad: bind(", L::name(), ", ...) got a null pointer"));
        }
        ptr[id] = b.data;
        mut[id] = b.mutable_data;
    }
}
// The byte range of a bound buffer, for the aliasing checks (numel: a leaf's element count when
// its binding does not give one).
template <class B>
void note_range(const B& b, [[maybe_unused]] std::size_t numel, [[maybe_unused]] const void** in_ranges,
                [[maybe_unused]] std::size_t& n_in, [[maybe_unused]] const void** out_ranges,
                [[maybe_unused]] std::size_t& n_out) {
    if constexpr (is_leaf_binding_v<B> || is_seed_binding_v<B> || is_grad_binding_v<B>) {
        std::size_t n = b.size;
        if constexpr (is_leaf_binding_v<B>)
            if (n == unknown_size) n = numel;
        if (b.data == nullptr) return;  // rejected elsewhere (or empty): no arithmetic on null
        const auto* p = reinterpret_cast<const unsigned char*>(b.data);
        const void** r = is_grad_binding_v<B> ? out_ranges : in_ranges;
        std::size_t& k = is_grad_binding_v<B> ? n_out : n_in;
        r[2 * k] = p;
        r[2 * k + 1] = p + n * sizeof(typename B::value_type);
        ++k;
    }
}
// A grad_into destination: store gi of the plan (the gradient node has the leaf's shape; the leaf
// itself may not be in a backward plan at all: the gradient of B in sum(detach(A) * B) is detach(A)).
template <class Arg>
void bind_grad(const Arg& b, [[maybe_unused]] void** out, [[maybe_unused]] const std::size_t* need,
               [[maybe_unused]] std::size_t& gi) {
    if constexpr (is_grad_binding_v<Arg>) {
        using L = typename Arg::leaf_type;
        if (b.size != need[gi])
            throw shape_error(message("typegrad: grad_into(", display_name<L>(), ", ...): the buffer has ", b.size,
                                      " elements but the gradient has ", need[gi]));
        if (b.data == nullptr && need[gi] != 0)
            throw binding_error(message("typegrad: grad_into(", display_name<L>(), ", ...) got a null pointer"));
        out[gi++] = b.data;
    }
}

// ---- post-accumulate hooks inside the schedule ------------------------------------------------
// A hook node's callables on a param buffer and its gradient: one function per (callables, dtype,
// rank), never per graph; the schedule walk calls it through post_hook_schedule's table.
template <class F, class T, std::size_t Rank>
void call_post_hook(void* param, void* grad, const std::size_t* ext) {
    const std::span<const std::size_t> e(ext, Rank);
    F{}(grad_view<T>{static_cast<T*>(param), e}, grad_view<T>{static_cast<T*>(grad), e});
}
template <class H>
using post_hook_leaf_t = typename underlying_leaf<type_at_t<0, typename H::children>>::type;

template <std::size_t K>
struct post_hook_table {
    std::size_t count = 0;
    std::size_t after[K + 1]{};
    post_hook_fn fn[K + 1]{};
    std::size_t store[K + 1]{};
    std::size_t param[K + 1]{};
    std::size_t param_ext[K + 1]{};
};

// When each post-accumulate hook of a call runs, as PyTorch: once its param's gradient is final,
// hooks of different params in the order their gradients complete (so a gradient all-reduce can
// start while the rest of the backward computes). A hook runs right after the later of two
// schedule steps of plan PP: the loop that writes the gradient (store Grads-index of its leaf;
// nothing writes it again), and the last step that reads the param's buffer, because a hook may
// update the param (an optimizer in the backward) and later loops must still see the old value
// (dX = dY W^T reads W). Ties keep registration order (the hooks' order in the loss graph).
// Hooks: the step's post-accumulate hook nodes; those whose leaf has no grad_into do not run.
// ParamPP: the plan whose state binds the params (value_and_grad: PP; backward: the forward's,
// which holds every leaf even where the backward plan does not read it).
template <class PP, class ParamPP, class Grads, class Hooks>
struct post_hook_schedule;
template <class PP, class ParamPP, class Grads, class... Hs>
struct post_hook_schedule<PP, ParamPP, Grads, type_list<Hs...>> {
    static constexpr std::size_t K = sizeof...(Hs);
    static constexpr post_hook_table<K> make() {
        post_hook_table<K> t;
        if constexpr (K > 0) {
            constexpr std::size_t store[] = {index_of<post_hook_leaf_t<Hs>, Grads>::value...};
            constexpr std::size_t in_plan[] = {PP::program::template id_of<post_hook_leaf_t<Hs>>::value...};
            constexpr std::size_t param[] = {ParamPP::program::template id_of<post_hook_leaf_t<Hs>>::value...};
            constexpr post_hook_fn fn[] = {
                &call_post_hook<typename Hs::op::hook_type, typename post_hook_leaf_t<Hs>::value_type,
                                post_hook_leaf_t<Hs>::shape_type::rank>...};
            constexpr auto& steps = buffer_steps_v<PP>;
            for (std::size_t h = 0; h < K; ++h) {
                if (store[h] >= Grads::size) continue;  // no grad_into: the hook does not run
                const std::size_t written = steps.store[store[h]];
                const std::size_t read = in_plan[h] < PP::M ? steps.read[in_plan[h]] : no_step;
                const std::size_t after = written == no_step ? no_step : read != no_step && read > written ? read : written;
                // insertion by step, after the entries of the same step (registration order)
                std::size_t k = t.count++;
                for (; k > 0 && t.after[k - 1] > after; --k) {
                    t.after[k] = t.after[k - 1];
                    t.fn[k] = t.fn[k - 1];
                    t.store[k] = t.store[k - 1];
                    t.param[k] = t.param[k - 1];
                    t.param_ext[k] = t.param_ext[k - 1];
                }
                t.after[k] = after;
                t.fn[k] = fn[h];
                t.store[k] = store[h];
                t.param[k] = param[h];
                t.param_ext[k] = ParamPP::rank_offset[param[h]];
            }
        }
        return t;
    }
    static constexpr post_hook_table<K> table = make();
};
// The calls for run_loops (functions of the table's size, not of the plan: see exec/execute.hpp);
// mut and ext: the state of the plan that binds the params.
template <std::size_t K>
post_hook_calls post_hook_calls_of(const post_hook_table<K>& t, void* const* mut, const std::size_t* ext) {
    return {t.count, t.after, t.fn, t.store, t.param, t.param_ext, mut, ext};
}
// A hook may update its param: it must have been bound writable (checked before anything runs).
template <std::size_t K>
void check_post_hook_params(const post_hook_table<K>& t, void* const* mut, const node_info* info) {
    for (std::size_t k = 0; k < t.count; ++k)
        if (mut[t.param[k]] == nullptr)
            throw binding_error(message("typegrad: post_accumulate_grad_hook on ", info[t.param[k]].name,
                                        " writes the param, but it was bound read-only; bind a writable buffer"));
}

}  // namespace detail

template <class Step, class FwdPP>
class forward_context;

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
        using stores = detail::concat_t<decltype(grad_nodes<grads, false>()), decltype(loss_store())>;
        using nodes = detail::graph_of_t<detail::concat_t<detail::type_list<Loss>, stores>, grad_refs<false>>;
        using PP = detail::plan_provider<nodes, stores, decltype(loss_required()), detail::type_list<>,
                                         value_type>;
        typename PP::state_type st{};
        check_calls<PP, grads>(args...);
        check_autocast_context();
        bind_leaves<PP>(st, args...);
        detail::compute_shapes<PP>(st);
        check_leaf_sizes<PP>(st, args...);
        bind_grads<PP, grads>(st, args...);
        std::array<std::size_t, PP::M + 1> offset{};
        const std::size_t scratch_size = detail::scratch_layout<PP>(st, offset) + 16;
        detail::scratch_unit* scratch = detail::scratch_buffer<PP>(scratch_size);
        using hooks = detail::post_hook_schedule<PP, PP, grads, post_hooks>;  // nothing unless hooked
        if constexpr (post_hooks::size > 0)
            detail::check_post_hook_params(hooks::table, st.mut.data(), PP::program::info.data());
        detail::check_custom_mutations<PP>(st);
        detail::note_plan_use<PP>();
        value_type loss_slot{};
        if constexpr (Loss::kind == op_kind::elementwise) st.out[PP::NS - 1] = &loss_slot;
        if constexpr (anomaly) dry_run<PP, accumulate_mask<grads, Args...>>(st, scratch, offset);
        detail::prepare_scratch<PP>(st, scratch, offset);
        // the post-accumulate hooks run inside, each once its gradient is final
        if constexpr (post_hooks::size > 0)
            detail::run_loops<PP, accumulate_mask<grads, Args...>>(
                st, detail::post_hook_calls_of(hooks::table, st.mut.data(), st.ext.data()));
        else
            detail::run_loops<PP, accumulate_mask<grads, Args...>>(st);
        return read_loss<PP>(st, loss_slot);
    }

    // The forward pass alone: returns a forward_context holding the output and what the backward
    // needs. The bound buffers must stay alive and unchanged until backward. Throws as value_and_grad.
    template <class... Args>
        requires(!detail::any_device_argument<Args...>)
    auto forward(const Args&... args) const {
        using stores = decltype(loss_store());
        using nodes = detail::topo<Loss>;
        using PP = detail::plan_provider<nodes, stores, decltype(loss_required()), detail::type_list<>,
                                         value_type>;
        forward_context<step, PP> ctx;
        check_calls<PP, detail::type_list<>>(args...);
        bind_leaves<PP>(ctx.state_, args...);
        detail::compute_shapes<PP>(ctx.state_);
        check_leaf_sizes<PP>(ctx.state_, args...);
        std::array<std::size_t, PP::M + 1> offset{};
        const std::size_t n = detail::scratch_layout<PP>(ctx.state_, offset);
        const std::size_t loss_n = detail::node_numel<PP>(ctx.state_, PP::program::template id_of<Loss>::value);
        ctx.storage_ = detail::pooled_buffer<detail::scratch_unit>(n + loss_n + 8);
        value_type* loss_buf = reinterpret_cast<value_type*>(ctx.storage_.data() + n);
        if constexpr (Loss::kind == op_kind::elementwise) ctx.state_.out[PP::NS - 1] = loss_buf;
        detail::check_custom_mutations<PP>(ctx.state_);
        detail::note_plan_use<PP>();
        detail::prepare_scratch<PP>(ctx.state_, ctx.storage_.data(), offset);
        if constexpr (anomaly) {
            detail::anomaly_node() = detail::no_anomaly;
            detail::run_loops<PP, detail::grad_mask<>, true>(ctx.state_);
            report_anomaly<PP>();
        } else {
            detail::run_loops<PP, detail::grad_mask<>>(ctx.state_);
        }
        if constexpr (Loss::kind != op_kind::elementwise)
            copy_node_value<PP, Loss>(ctx.state_, loss_buf, loss_n);
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
        using FwdPP = typename Ctx::plan_type;
        static_assert(std::is_same_v<typename Ctx::step_type, step>,
                      "typegrad: backward(ctx, ...) got a context from another step.");
        constexpr bool seeded = detail::any_true({detail::is_seed_binding_v<Args>...});
        static_assert(seeded || scalar_loss,
                      "typegrad: backward(ctx, ...) of a non-scalar output needs a seed: pass "
                      "tg::seed(buffer) with the output's shape.");
        using grads = grads_of<Args...>;
        using stores = decltype(grad_nodes<grads, seeded>());
        using nodes = detail::graph_of_t<stores, grad_refs<seeded>>;
        using given = decltype(saved_reductions<typename nodes::type, FwdPP>());
        using PP = detail::plan_provider<nodes, stores, detail::type_list<>, given, value_type>;
        typename PP::state_type st{};
        check_calls<PP, grads, false>(args...);
        check_autocast_context();
        // Leaves come from the forward call, the seed from this one.
        restore_nodes<PP, FwdPP>(st, ctx.state_);
        if constexpr (seeded) bind_seed<PP, FwdPP>(st, ctx.state_, args...);
        detail::compute_shapes<PP>(st);
        if constexpr (seeded) check_seed_size<PP>(st, args...);
        bind_grads<PP, grads>(st, args...);
        std::array<std::size_t, PP::M + 1> offset{};
        const std::size_t scratch_size = detail::scratch_layout<PP>(st, offset) + 16;
        detail::scratch_unit* scratch = detail::scratch_buffer<PP>(scratch_size);
        // params are bound in the forward's state (the backward plan may not read them)
        using hooks = detail::post_hook_schedule<PP, FwdPP, grads, post_hooks>;
        if constexpr (post_hooks::size > 0)
            detail::check_post_hook_params(hooks::table, ctx.state_.mut.data(), FwdPP::program::info.data());
        detail::check_custom_mutations<PP>(st);
        check_create_graph<PP>(args...);
        detail::note_plan_use<PP>();
        if constexpr (anomaly) dry_run<PP, accumulate_mask<grads, Args...>>(st, scratch, offset);
        detail::prepare_scratch<PP>(st, scratch, offset);
        if constexpr (post_hooks::size > 0)
            detail::run_loops<PP, accumulate_mask<grads, Args...>>(
                st, detail::post_hook_calls_of(hooks::table, ctx.state_.mut.data(), ctx.state_.ext.data()));
        else
            detail::run_loops<PP, accumulate_mask<grads, Args...>>(st);
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
    template <class Arg>
    struct is_grad_arg : std::bool_constant<detail::is_grad_binding_v<Arg>> {};
    template <class... Bs>
    static detail::type_list<typename Bs::leaf_type...> leaves_of(detail::type_list<Bs...>);
    // The leaves of the call's grad_into bindings, in order.
    template <class... Args>
    using grads_of = decltype(leaves_of(detail::filter_t<detail::type_list<Args...>, is_grad_arg>{}));
    template <class Grads, bool Seeded>
    static constexpr auto grad_nodes() {
        return []<class... Ls>(detail::type_list<Ls...>) {
            return detail::type_list<grad_node<Ls, Seeded>...>{};
        }(Grads{});
    }
    static constexpr auto loss_store() {
        if constexpr (Loss::kind == op_kind::elementwise) return detail::type_list<Loss>{};
        else return detail::type_list<>{};
    }
    static constexpr auto loss_required() {
        if constexpr (Loss::kind != op_kind::elementwise && Loss::kind != op_kind::constant)
            return detail::type_list<Loss>{};
        else return detail::type_list<>{};
    }
    // Reductions the forward pass computed that the backward reads instead of recomputing.

    template <class FwdPP>
    struct saved_in {
        template <class N>
        struct test : detail::saved_by<FwdPP, N> {};
    };
    template <class Nodes, class FwdPP>
    static constexpr auto saved_reductions() {
        return detail::filter_t<Nodes, saved_in<FwdPP>::template test>{};
    }

    // One bit per grad_into binding, in call order: set where it accumulates.
    template <class Grads, class... Args>
    static constexpr auto accumulate_words() {
        constexpr bool is_grad[] = {detail::is_grad_binding_v<Args>..., false};
        constexpr bool accumulates[] = {detail::accumulates<Args>::value..., false};
        std::array<std::uint64_t, Grads::size / 64 + 1> words{};
        for (std::size_t a = 0, i = 0; a < sizeof...(Args); ++a) {
            if (!is_grad[a]) continue;
            if (accumulates[a]) words[i / 64] |= std::uint64_t(1) << (i % 64);
            ++i;
        }
        return words;
    }
    template <class Grads, class... Args>
    struct accumulate_mask_of {
        static constexpr auto words = accumulate_words<Grads, Args...>();
        template <std::size_t... Ws>
        static detail::grad_mask<words[Ws]...> make(std::index_sequence<Ws...>);
        using type = decltype(make(std::make_index_sequence<words.size()>{}));
    };
    template <class Grads, class... Args>
    using accumulate_mask = typename accumulate_mask_of<Grads, Args...>::type;

    template <class PP, class Grads, bool LeavesFromArgs = true, class... Args>
    static void check_calls(const Args&...) {
        detail::log_graphs_once<step>();  // TYPEGRAD_LOG=graphs: describe() on the first call
        // Compile-time checks, class templates forced by sizeof (see arg_check): no function or
        // variable per argument or per leaf is instantiated (each would spell the plan in its name).
        static_assert(detail::all_true(
            {(sizeof(detail::arg_check<typename PP::program::nodes, wrt_list, detail::topo<Loss>, Args, Args...>) >
              0)...}));
        if constexpr (!LeavesFromArgs) {
            static_assert(!detail::any_true({detail::is_leaf_binding_v<Args>...}),
                          "typegrad: backward(ctx, ...) reads the inputs bound in forward(...); it "
                          "takes only tg::grad_into(...) and tg::seed(...).");
        } else {
            // every leaf the plan reads must be bound; dynamic leaves needed for shapes too
            // (leaves only: see exec/node_filter.hpp)
            static_assert(sizeof(leaf_nodes_check<PP, std::make_index_sequence<
                                                          detail::node_ids_of_kind<typename PP::program, op_kind::leaf>.size()>,
                                                  Args...>));
        }
    }
    template <class PP, class Seq, class... Args>
    struct leaf_nodes_check;
    template <class PP, std::size_t... Is, class... Args>
    struct leaf_nodes_check<PP, std::index_sequence<Is...>, Args...> {
        template <std::size_t I>
        using node = typename PP::program::template node_at<detail::node_ids_of_kind<typename PP::program, op_kind::leaf>[I]>;
        static_assert(detail::all_true(
            {(sizeof(detail::leaf_node_check<node<Is>, detail::is_bound_leaf<node<Is>>(),
                                             PP::plan.needed[detail::node_ids_of_kind<typename PP::program, op_kind::leaf>[Is]],
                                             Args...>) > 0)...}));
    };

    template <class PP, class... Args>
    static void bind_leaves(typename PP::state_type& st, const Args&... args) {
        constexpr std::array<std::size_t, sizeof...(Args) + 1> ids{detail::bound_leaf_id<PP, Args>::value..., PP::M};
        // Leaves no argument binds have static shapes (check_calls): their extents.
        constexpr std::array<bool, PP::M + 1> unbound = [&] {
            std::array<bool, PP::M + 1> r{};
            for (std::size_t n = 0; n < PP::M; ++n) r[n] = PP::program::info[n].kind == op_kind::leaf;
            for (std::size_t i = 0; i < sizeof...(Args); ++i) r[ids[i]] = false;
            return r;
        }();
        for (std::size_t n = 0; n < PP::M; ++n)
            if (unbound[n])
                for (std::size_t a = 0; a < PP::program::info[n].rank; ++a)
                    st.ext[PP::rank_offset[n] + a] = PP::program::info[n].ext[a];
        constexpr std::array<bool, sizeof...(Args) + 1> needed = [&] {
            std::array<bool, sizeof...(Args) + 1> r{};
            for (std::size_t i = 0; i < sizeof...(Args); ++i) r[i] = ids[i] < PP::M && PP::plan.needed[ids[i]];
            return r;
        }();
        std::size_t i = 0;
        [[maybe_unused]] const int in_order[] = {
            0, (detail::bind_leaf(args, st.ext.data() + PP::rank_offset[ids[i]], st.ptr.data(), st.mut.data(), ids[i],
                                  needed[i]),
                ++i, 0)...};
    }
    // Per-argument checks are free functions of the argument's type alone, fed run-time values
    // (a function per argument named by the plan would make symbol text quadratic).
    template <class PP, class... Args>
    static void check_leaf_sizes(const typename PP::state_type& st, const Args&... args) {
        constexpr std::array<std::size_t, sizeof...(Args) + 1> ids{detail::bound_leaf_id<PP, Args>::value..., PP::M};
        std::array<std::size_t, sizeof...(Args) + 1> need{};
        for (std::size_t i = 0; i < sizeof...(Args); ++i)
            if (ids[i] != PP::M) need[i] = detail::checked_numel<PP>(st, ids[i]);
        std::size_t i = 0;
        [[maybe_unused]] const int in_order[] = {
            0, (detail::check_leaf_size(args, need[i], st.ext.data() + PP::rank_offset[ids[i]]), ++i, 0)...};
    }

    // Grad destinations: sizes, then aliasing against every input and each other.
    template <class PP, class Grads, class... Args>
    static void bind_grads(typename PP::state_type& st, const Args&... args) {
        std::array<const void*, 2 * (sizeof...(Args) + PP::M) + 2> in_ranges{};
        std::array<const void*, 2 * (sizeof...(Args) + PP::M) + 2> out_ranges{};
        std::size_t n_in = 0, n_out = 0;
        constexpr std::array<std::size_t, sizeof...(Args) + 1> ids{detail::bound_leaf_id<PP, Args>::value..., PP::M};
        std::size_t arg = 0;
        [[maybe_unused]] const int ranges_in_order[] = {
            0, (detail::note_range(args, ids[arg] < PP::M ? detail::node_numel<PP>(st, ids[arg]) : 0, in_ranges.data(),
                                   n_in, out_ranges.data(), n_out),
                ++arg, 0)...};
        // Leaves bound earlier (a forward pass whose context this backward reads) count as inputs.
        for (std::size_t n = 0; n < PP::M; ++n) {
            if (PP::program::info[n].kind != op_kind::leaf || st.ptr[n] == nullptr) continue;
            const auto* p = static_cast<const unsigned char*>(st.ptr[n]);
            in_ranges[2 * n_in] = p;
            in_ranges[2 * n_in + 1] = p + detail::node_numel<PP>(st, n) * PP::program::info[n].elem_size;
            ++n_in;
        }
        std::array<std::size_t, PP::NS + 1> need{};
        for (std::size_t g = 0; g < PP::NS; ++g) need[g] = detail::node_numel<PP>(st, PP::stores[g]);
        std::size_t gi = 0;
        [[maybe_unused]] const int in_order[] = {0, (detail::bind_grad(args, st.out.data(), need.data(), gi), 0)...};
        for (std::size_t i = 0; i < n_out; ++i) {
            if (out_ranges[2 * i] == out_ranges[2 * i + 1]) continue;
            for (std::size_t j = 0; j < n_in; ++j)
                if (detail::overlaps(out_ranges[2 * i], out_ranges[2 * i + 1], in_ranges[2 * j], in_ranges[2 * j + 1]))
                    throw aliasing_error("typegrad: a grad_into buffer overlaps a bound input; "
                                         "gradients are written while inputs are read");
            for (std::size_t j = 0; j < i; ++j)
                if (detail::overlaps(out_ranges[2 * i], out_ranges[2 * i + 1], out_ranges[2 * j], out_ranges[2 * j + 1]))
                    throw aliasing_error("typegrad: two grad_into buffers overlap");
        }
    }
    // The graph's post-accumulate hook nodes, in registration order; a call runs those whose
    // leaf it writes a gradient for, inside the schedule (detail::post_hook_schedule).
    template <class N>
    struct is_post_hook : std::bool_constant<detail::is_post_hook_v<N>> {};
    using post_hooks = detail::filter_t<detail::topo_t<Loss>, is_post_hook>;

    // create_graph: fails exactly when a custom backward mutates an input that requires grad.
    // The list of such (node, input) pairs is a compile-time constant; when it is empty this
    // compiles to nothing.
    template <class PP, class... Args>
    static void check_create_graph(const Args&... args) {
        constexpr auto hazards = detail::create_graph_hazards<PP>();
        if constexpr (hazards.size() > 0) {
            bool requested = false;
            auto see = [&](const auto& a) {
                if constexpr (std::is_same_v<std::remove_cvref_t<decltype(a)>, create_graph_t>) requested = requested || a.enabled;
            };
            detail::for_each_arg(see, args...);
            if (requested) {
                std::string what = "typegrad: backward(..., tg::create_graph): a custom op's backward mutates input";
                for (const auto& h : hazards)
                    what += detail::message(" ", h.input, " (of node ", h.node, " '", PP::program::info[h.node].name, "')");
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
        using PP = detail::plan_provider<nodes, stores, detail::type_list<>, detail::type_list<>, value_type>;
        return detail::create_graph_hazards<PP>().size();
    }

private:
    static constexpr bool anomaly = Policy::anomaly;

    // A backward under an autocast_guard that contradicts the spec it was compiled for.
    static void check_autocast_context() {
        if constexpr (Policy::check_mismatch) {
            const detail::guard_slot& g = detail::current_guard();
            constexpr autocast_state expected = autocast_state_of<backward_autocast_spec>();
            if (g.active && !(g.state == expected))
                throw autocast_mismatch(detail::message(
                    "typegrad: the backward runs under an autocast_guard declaring ", describe_autocast(g.state),
                    ", but its step was compiled for a backward under ", describe_autocast(expected),
                    "; compile it with the matching tg::backward_autocast policy (or add "
                    "tg::on_autocast_mismatch::ignore)"));
        }
    }

    // Anomaly mode: run the whole plan once with every value checked and the outputs redirected
    // to temporaries; only a clean run is repeated for real.
    template <class PP, class Acc>
    static void dry_run(const typename PP::state_type& st, detail::scratch_unit* scratch,
                        const std::array<std::size_t, PP::M + 1>& offset) {
        static_assert(detail::create_graph_hazard_count<PP>() == 0 && !mutates_anything<PP>(),
                      "typegrad: detect_anomaly runs a step twice (a checked dry run first); it cannot be "
                      "combined with custom ops that mutate their inputs.");
        typename PP::state_type dry = st;
        std::array<std::vector<detail::scratch_unit>, PP::NS + 1> temp;
        for (std::size_t i = 0; i < PP::NS; ++i) {
            const std::size_t bytes = detail::node_numel<PP>(st, PP::stores[i]) * PP::program::info[PP::stores[i]].elem_size;
            temp[i].assign(bytes / sizeof(detail::scratch_unit) + 1, detail::scratch_unit{});
            dry.out[i] = temp[i].data();
        }
        detail::prepare_scratch<PP>(dry, scratch, offset);
        detail::anomaly_node() = detail::no_anomaly;
        detail::run_loops<PP, Acc, true>(dry);
        report_anomaly<PP>();
    }
    template <class PP>
    static void report_anomaly() {
        const std::size_t n = detail::anomaly_node();
        if (n == detail::no_anomaly) return;
        constexpr auto forward_nodes = []<class... Ns>(detail::type_list<Ns...>) {
            return std::array<bool, PP::M>{(detail::topo<Loss>::template id_of<Ns>::value != detail::no_parent)...};
        }(typename PP::program::nodes{});
        throw anomaly_error(detail::message("typegrad: anomaly: node %", n, " '", PP::program::info[n].name, "' (",
                                            forward_nodes[n] ? "forward" : "backward",
                                            ") produced NaN or Inf; nothing was written"));
    }
    template <class PP>
    static constexpr bool mutates_anything() {
        return []<class... Ns>(detail::type_list<Ns...>) {
            return detail::any_true({mutating_custom<Ns>()...});
        }(typename PP::program::nodes{});
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
    template <class PP>
    static value_type read_loss(const typename PP::state_type& st, value_type slot) {
        if constexpr (Loss::kind == op_kind::elementwise) return slot;
        else if constexpr (Loss::kind == op_kind::constant) return static_cast<value_type>(Loss::value);
        else return value_from(*static_cast<const detail::buffer_t<Loss>*>(st.ptr[PP::program::template id_of<Loss>::value]));
    }
    template <class PP, class N>
    static void copy_node_value(const typename PP::state_type& st, value_type* dst, std::size_t n) {
        if constexpr (N::kind == op_kind::constant) {
            std::fill(dst, dst + n, static_cast<value_type>(N::value));
        } else {
            // the output may be a strided view: walk it in row-major order
            constexpr std::size_t id = PP::program::template id_of<N>::value;
            constexpr std::size_t rank = N::shape_type::rank;
            const auto* src = static_cast<const detail::buffer_t<N>*>(st.ptr[id]);
            for (std::size_t e = 0; e < n; ++e) {
                std::size_t r = e;
                std::ptrdiff_t off = 0;
                for (std::size_t a = rank; a-- > 0;) {
                    const std::size_t ext = st.ext[PP::rank_offset[id] + a];
                    off += std::ptrdiff_t(r % ext) * st.stride[PP::rank_offset[id] + a];
                    r /= ext;
                }
                dst[e] = value_from(src[off]);
            }
        }
    }

    // A run-time walk over a table of forward ids (a function per node would spell the plan in
    // each of O(N) symbol names).
    template <class PP, class FwdPP, std::size_t... Ns>
    static constexpr std::array<std::size_t, PP::M + 1> forward_ids(std::index_sequence<Ns...>) {
        return {FwdPP::program::template id_of<typename PP::program::template node_at<Ns>>::value..., FwdPP::M};
    }
    template <class N, bool InForward>
    static constexpr bool restorable = InForward || !detail::is_bound_leaf<N>() || N::shape_type::is_static;
    template <class PP, class FwdPP, std::size_t... Ns>
    static constexpr bool all_restorable(std::index_sequence<Ns...>) {
        return detail::all_true({restorable<typename PP::program::template node_at<Ns>,
                                            FwdPP::program::template contains<typename PP::program::template node_at<Ns>>::value>...});
    }
    template <class PP, class FwdPP, class FwdState>
    static void restore_nodes(typename PP::state_type& st, const FwdState& fst) {
        static_assert(all_restorable<PP, FwdPP>(std::make_index_sequence<PP::M>{}),
                      "typegrad: backward(ctx, ...) needs the extents of a wrt leaf that the "
                      "forward pass did not bind; bind it in forward(...).");
        constexpr auto fwd = forward_ids<PP, FwdPP>(std::make_index_sequence<PP::M>{});
        constexpr std::size_t seed = PP::program::template id_of<seed_leaf>::value;
        constexpr auto& info = PP::program::info;
        for (std::size_t n = 0; n < PP::M; ++n) {
            const std::size_t f = fwd[n];
            if (f != FwdPP::M) {
                if (info[n].kind == op_kind::leaf) {
                    for (std::size_t a = 0; a < info[n].rank; ++a)
                        st.ext[PP::rank_offset[n] + a] = fst.ext[FwdPP::rank_offset[f] + a];
                    st.ptr[n] = fst.ptr[f];
                    st.mut[n] = fst.mut[f];
                } else if (FwdPP::plan.computed[f]) {
                    st.ptr[n] = fst.ptr[f];
                }
            } else if (info[n].kind == op_kind::leaf && n != seed) {
                for (std::size_t a = 0; a < info[n].rank; ++a) st.ext[PP::rank_offset[n] + a] = info[n].ext[a];
            }
        }
    }
    template <class PP, class FwdPP, class FwdState, class... Args>
    static void bind_seed(typename PP::state_type& st, const FwdState& fst, const Args&... args) {
        if constexpr (!PP::program::template contains<seed_leaf>::value) {
            return;  // no gradient requested: nothing reads the seed
        } else {
        constexpr std::size_t id = PP::program::template id_of<seed_leaf>::value;
        static_assert(detail::count_true({detail::is_seed_binding_v<Args>...}) == 1,
                      "typegrad: backward(ctx, ...) takes one tg::seed(...).");
        auto set = [&](const auto& b) {
            using B = std::remove_cvref_t<decltype(b)>;
            if constexpr (detail::is_seed_binding_v<B>) {
                static_assert(std::is_same_v<typename B::value_type, value_type>,
                              "typegrad: tg::seed(buffer) needs the output's dtype.");
                st.ptr[id] = b.data;
            }
        };
        detail::for_each_arg(set, args...);
        using S = typename seed_leaf::shape_type;
        for (std::size_t a = 0; a < S::rank; ++a)
            st.ext[PP::rank_offset[id] + a] =
                fst.ext[FwdPP::rank_offset[FwdPP::program::template id_of<Loss>::value] + a];
        }
    }
    template <class PP, class... Args>
    static void check_seed_size(const typename PP::state_type& st, const Args&... args) {
        if constexpr (PP::program::template contains<seed_leaf>::value) {
            constexpr std::size_t id = PP::program::template id_of<seed_leaf>::value;
            auto check = [&](const auto& b) {
                using B = std::remove_cvref_t<decltype(b)>;
                if constexpr (detail::is_seed_binding_v<B>) {
                    const std::size_t need = detail::node_numel<PP>(st, id);
                    if (b.size != need)
                        throw shape_error(detail::message("typegrad: tg::seed(buffer) has ", b.size,
                                                          " elements but the output has ", need));
                }
            };
            detail::for_each_arg(check, args...);
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
        using grad_stores = decltype(grad_nodes<wrt_list, false>());
        // The gradients and the loss: what value_and_grad stores.
        using joint_stores = detail::concat_t<grad_stores, decltype(loss_store())>;
        // The plan of value_and_grad.
        using joint = detail::plan_provider<
            detail::graph_of_t<detail::concat_t<detail::type_list<Loss>, joint_stores>, grad_refs<false>>,
            joint_stores, decltype(loss_required()), detail::type_list<>, value_type>;
        // The plan of forward.
        using forward = detail::plan_provider<detail::topo<Loss>,
                                              decltype(loss_store()), decltype(loss_required()),
                                              detail::type_list<>, value_type>;
    };
};

// The saved context of a forward pass: the loss value, the extents and addresses of the bound
// inputs (they must stay alive and unchanged until backward), and the reductions the backward
// reads. Move-only: the saved addresses point into its own storage.
template <class Step, class FwdPP>
class forward_context {
public:
    // The step that made the context.
    using step_type = Step;
    // The forward plan (its saved values are what backward reads).
    using plan_type = FwdPP;
    // The output's dtype.
    using value_type = typename Step::value_type;

    forward_context() = default;
    // Moves the saved state; contexts are not copyable.
    forward_context(forward_context&&) noexcept = default;
    // Move assignment.
    forward_context& operator=(forward_context&&) noexcept = default;
    forward_context(const forward_context&) = delete;
    forward_context& operator=(const forward_context&) = delete;

    // The scalar loss.
    value_type value() const {
        static_assert(Step::scalar_loss, "typegrad: value() is for scalar outputs; use values().");
        return *loss_;
    }
    // The output's elements in row-major order.
    std::span<const value_type> values() const { return {loss_, loss_size_}; }

private:
    typename FwdPP::state_type state_{};
    detail::pooled_buffer<detail::scratch_unit> storage_;  // (reused across calls: exec/cpu/buffer_pool.hpp)
    const value_type* loss_ = nullptr;
    std::size_t loss_size_ = 0;
    template <class, class, class...>
    friend class step;
};

inline std::size_t plan_count() { return detail::plan_counter().load(); }

namespace detail {
template <class Loss>
struct not_in_forward {
    template <class N>
    struct test : std::bool_constant<topo<Loss>::template id_of<N>::value == no_parent> {};
};
template <class Step, class... Ls>
auto backward_nodes_of(type_list<Ls...>)
    -> filter_t<topo_of_t<type_list<typename Step::template grad_node<Ls, !Step::scalar_loss>...>,
                          typename Step::template grad_refs<!Step::scalar_loss>>,
                not_in_forward<typename Step::loss_node>::template test>;
}  // namespace detail

// The nodes of a step's backward graph for all its wrt leaves (forward nodes excluded), e.g. to
// static_assert the dtype a backward op runs in: tg::op_dtypes_t<tg::backward_nodes_t<S>, "matmul">.
template <class Step>
using backward_nodes_t = decltype(detail::backward_nodes_of<Step>(typename Step::wrt_list{}));

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
