#pragma once
// The call layer of a compiled step, shared by the host step (exec/step.hpp) and the device
// backend (exec/cuda/step.hpp): which plan each entry point runs, the compile-time checks of a call's
// arguments, and the run-time binding of leaves, gradient destinations and seeds into a plan's
// state (extents, sizes, null buffers, aliasing), all before anything runs. The two backends
// differ only in where the bindings' buffers live (exec/bind.hpp's memory_space, which words the
// messages) and in what runs the plan.
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>
#include <type_traits>
#include <utility>

#include <typegrad/autodiff/policy.hpp>
#include <typegrad/core/error.hpp>
#include <typegrad/exec/bind.hpp>
#include <typegrad/exec/execute.hpp>

namespace typegrad::detail {

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
// One argument of a call (Args: all of them, for the counts). A call's bindings all live in one
// memory space (a device argument sends the call to the device backend, which rejects host ones).
template <class Nodes, class WrtList, class LossGraph, class Arg, class... Args>
struct arg_check {
    static_assert(is_seed_binding_v<Arg> || __is_same(Arg, create_graph_t),
                  "typegrad: arguments of value_and_grad/forward/backward are tg::bind(...), "
                  "tg::grad_into(...) and tg::seed(...).");
};
template <class Nodes, class WrtList, class LossGraph, class L, memory_space S, class... Args>
struct arg_check<Nodes, WrtList, LossGraph, leaf_binding<L, S>, Args...> {
    static_assert(sizeof(check_leaf_binding_usable<L, Nodes>) &&
                  sizeof(check_bound_once<L, count_true({__is_same(Args, leaf_binding<L, S>)...})>));
};
template <class Nodes, class WrtList, class LossGraph, class L, bool A, memory_space S, class... Args>
struct arg_check<Nodes, WrtList, LossGraph, grad_binding<L, A, S>, Args...> {
    static_assert(sizeof(check_grad_target<L, WrtList, LossGraph>));
    static_assert(count_true({(__is_same(Args, grad_binding<L, true, S>) || __is_same(Args, grad_binding<L, false, S>))...}) <= 1,
                  "typegrad: grad_into names the same leaf twice in one call.");
};
// A leaf node of the plan: bound when needed, and when its shape is dynamic.
template <class Node, bool BoundLeaf, bool Needed, memory_space S, class... Args>
struct leaf_node_check {};
template <class Node, bool Needed, memory_space S, class... Args>
struct leaf_node_check<Node, true, Needed, S, Args...> {
    static_assert(sizeof(check_has_binding<Node, any_true({__is_same(Args, leaf_binding<Node, S>)...}), Needed>) &&
                  sizeof(check_shape_known<Node, any_true({__is_same(Args, leaf_binding<Node, S>)...}),
                                           !Node::shape_type::is_static>));
};

// The memory space of a call's bindings (host unless one is a device binding).
template <class... Args>
inline constexpr memory_space call_space_v =
    any_true({binding_space_v<Args> == memory_space::device...}) ? memory_space::device : memory_space::host;

// What the messages call a binding's buffer and a missing one, by memory space.
template <memory_space S>
inline constexpr std::string_view buffer_word = S == memory_space::device ? "device buffer" : "buffer";
template <memory_space S>
inline constexpr std::string_view null_word = S == memory_space::device ? "null device address" : "null pointer";

inline bool overlaps(const void* a0, const void* a1, const void* b0, const void* b1) {
    return std::less<>{}(a0, b1) && std::less<>{}(b0, a1);
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

// Whether the forward plan ForwardPlan computed node N, a reduction or a kernel (matmul, custom ops),
// which the backward then reads: they are never recomputed, and a custom op's forward mutations
// must not run twice. A class, not a function of N: g++ names every function it instantiates,
// constant-evaluated ones too, and a function of N is named with N's subgraph (one per node of a
// backward).
template <class ForwardPlan, class N, bool Candidate = N::kind == op_kind::reduce || N::kind == op_kind::kernel>
struct saved_by : std::false_type {};
template <class ForwardPlan, class N>
struct saved_by<ForwardPlan, N, true>
    : std::bool_constant<ForwardPlan::program::template contains<N>::value &&
                         ForwardPlan::plan.computed[ForwardPlan::program::template id_of<N>::value]> {};

// The id of the leaf an argument binds (Plan::M for other arguments); a type, not a variable (see
// arg_check).
template <class Plan, class Arg>
struct bound_leaf_id : std::integral_constant<std::size_t, Plan::M> {};
template <class Plan, class Leaf, memory_space S>
struct bound_leaf_id<Plan, leaf_binding<Leaf, S>> : Plan::program::template id_of<Leaf> {};

// Per-argument checks are free functions of the argument's type alone, fed run-time values (a
// function per argument named by the plan would make symbol text quadratic). Their messages are
// built by the cold functions below, one for every leaf: a message built in each instantiation
// was a fifth of the binding code g++ generated per leaf.
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_leaf_size(std::string_view name, std::string_view buffer,
                                                               std::size_t size, const std::size_t* ext,
                                                               std::size_t rank, std::size_t need) {
    fail<shape_error>({"typegrad: bind(", name, ", ...): the ", buffer, " has ", size, " elements but extents ",
                       extents_text(ext, rank), " need ", need});
}
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_leaf_extent(std::string_view name, std::size_t axis,
                                                                 std::size_t given, std::size_t declared) {
    if (declared != dyn && given != declared)
        fail<shape_error>({"typegrad: bind(", name, ", ...): axis ", axis, " has extent ", given,
                           " but the leaf declares ", declared});
    // tg::dyn (SIZE_MAX) marks a dynamic extent inside the plan: never a size
    fail<shape_error>({"typegrad: bind(", name, ", ...): axis ", axis,
                       " has extent tg::dyn (SIZE_MAX), which is not a size"});
}
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_null_binding(std::string_view call, std::string_view name,
                                                                  std::string_view null) {
    fail<binding_error>({"typegrad: ", call, "(", name, ", ...) got a ", null});
}
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_grad_size(std::string_view name, std::string_view buffer,
                                                               std::size_t size, std::size_t need) {
    fail<shape_error>({"typegrad: grad_into(", name, ", ...): the ", buffer, " has ", size,
                       " elements but the gradient has ", need});
}
template <class Arg>
void check_leaf_size(const Arg& b, [[maybe_unused]] std::size_t need, [[maybe_unused]] const std::size_t* ext) {
    if constexpr (is_leaf_binding_v<Arg>) {
        using L = typename Arg::leaf_type;
        if (b.size != unknown_size && b.size != need)
            throw_leaf_size(L::name(), buffer_word<Arg::space>, b.size, ext, L::shape_type::rank, need);
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
            if ((S::extents[a] != dyn && b.extents[a] != S::extents[a]) || b.extents[a] == dyn)
                throw_leaf_extent(L::name(), a, b.extents[a], S::extents[a]);
            e[a] = b.extents[a];
        }
        if (b.data == nullptr && needed) {
            std::size_t n = 1;
            for (std::size_t a = 0; a < S::rank; ++a) n *= e[a];
            if (n != 0) throw_null_binding("bind", L::name(), null_word<Arg::space>);
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
        if (b.size != need[gi]) throw_grad_size(display_name<L>(), buffer_word<Arg::space>, b.size, need[gi]);
        if (b.data == nullptr && need[gi] != 0) throw_null_binding("grad_into", display_name<L>(), null_word<Arg::space>);
        out[gi++] = b.data;
    }
}

// The plans and the call checks of a step (exec/step.hpp's detail::step), for both backends.
// Step provides loss_node, value_type, wrt_list, scalar_loss, seed_leaf, grad_node<Leaf, Seeded>
// and grad_refs<Seeded>.
template <class Step>
struct call_layer {
    using Loss = typename Step::loss_node;
    using T = typename Step::value_type;
    using seed_leaf = typename Step::seed_leaf;

    template <class Arg>
    struct is_grad_arg : std::bool_constant<is_grad_binding_v<Arg>> {};
    template <class... Bs>
    static type_list<typename Bs::leaf_type...> leaves_of(type_list<Bs...>);
    // The leaves of the call's grad_into bindings, in order.
    template <class... Args>
    using grads_of = decltype(leaves_of(filter_t<type_list<Args...>, is_grad_arg>{}));

    template <class Grads, bool Seeded>
    static constexpr auto grad_nodes() {
        return []<class... Ls>(type_list<Ls...>) {
            return type_list<typename Step::template grad_node<Ls, Seeded>...>{};
        }(Grads{});
    }
    // The gradient nodes of Grads: the stores of a backward plan.
    template <class Grads, bool Seeded>
    using grad_stores = decltype(grad_nodes<Grads, Seeded>());
    // A fused loss is stored by the plan; a reduction or kernel loss is read from its buffer.
    using loss_store = std::conditional_t<Loss::kind == op_kind::elementwise, type_list<Loss>, type_list<>>;
    using loss_required = std::conditional_t<Loss::kind != op_kind::elementwise && Loss::kind != op_kind::constant,
                                             type_list<Loss>, type_list<>>;

    // Reductions the forward pass computed that the backward reads instead of recomputing.
    template <class ForwardPlan>
    struct saved_in {
        template <class N>
        struct test : saved_by<ForwardPlan, N> {};
    };
    template <class Nodes, class ForwardPlan>
    static constexpr auto saved_reductions() {
        return filter_t<Nodes, saved_in<ForwardPlan>::template test>{};
    }

    // ---- the plans of the three entry points ----------------------------------------------
    // value_and_grad: the loss and the gradients of Grads, one plan.
    template <class Grads>
    using joint_stores = concat_t<grad_stores<Grads, false>, loss_store>;
    template <class Grads>
    using joint_plan = plan_provider<graph_of_t<concat_t<type_list<Loss>, joint_stores<Grads>>, typename Step::template grad_refs<false>>,
                                     joint_stores<Grads>, loss_required, type_list<>, T>;
    // forward: the loss alone.
    using forward_plan = plan_provider<topo<Loss>, loss_store, loss_required, type_list<>, T>;
    // backward after forward plan ForwardPlan: the gradients of Grads, reading what ForwardPlan saved.
    template <class Grads, bool Seeded, class ForwardPlan>
    struct backward_plan_of {
        using nodes = graph_of_t<grad_stores<Grads, Seeded>, typename Step::template grad_refs<Seeded>>;
        using given = decltype(saved_reductions<typename nodes::type, ForwardPlan>());
        using type = plan_provider<nodes, grad_stores<Grads, Seeded>, type_list<>, given, T>;
    };
    template <class Grads, bool Seeded, class ForwardPlan>
    using backward_plan = typename backward_plan_of<Grads, Seeded, ForwardPlan>::type;

    // One bit per grad_into binding, in call order: set where it accumulates.
    template <class Grads, class... Args>
    static constexpr auto accumulate_words() {
        constexpr bool is_grad[] = {is_grad_binding_v<Args>..., false};
        constexpr bool accumulates_into[] = {accumulates<Args>::value..., false};
        std::array<std::uint64_t, Grads::size / 64 + 1> words{};
        for (std::size_t a = 0, i = 0; a < sizeof...(Args); ++a) {
            if (!is_grad[a]) continue;
            if (accumulates_into[a]) words[i / 64] |= std::uint64_t(1) << (i % 64);
            ++i;
        }
        return words;
    }

    // ---- compile-time checks of a call ----------------------------------------------------
    // Every leaf node of plan Plan: bound when needed, and when its shape is dynamic.
    template <class Plan, class Seq, class... Args>
    struct leaf_nodes_check;
    template <class Plan, std::size_t... Is, class... Args>
    struct leaf_nodes_check<Plan, std::index_sequence<Is...>, Args...> {
        template <std::size_t I>
        using node = typename Plan::program::template node_at<node_ids_of_kind<typename Plan::program, op_kind::leaf>[I]>;
        static_assert(all_true({(sizeof(leaf_node_check<node<Is>, is_bound_leaf<node<Is>>(),
                                                        Plan::plan.needed[node_ids_of_kind<typename Plan::program, op_kind::leaf>[Is]],
                                                        call_space_v<Args...>, Args...>) > 0)...}));
    };

    // Class templates with static_asserts, forced by sizeof (see arg_check): no function or
    // variable per argument or per leaf is instantiated (each would spell the plan in its name).
    // LeavesFromArgs: value_and_grad and forward bind leaves; backward reads the forward's.
    template <class Plan, bool LeavesFromArgs, class... Args>
    struct call_check {
        static_assert(all_true(
            {(sizeof(arg_check<typename Plan::program::nodes, typename Step::wrt_list, topo<Loss>, Args, Args...>) > 0)...}));
        static_assert(LeavesFromArgs || !any_true({is_leaf_binding_v<Args>...}),
                      "typegrad: backward(ctx, ...) reads the inputs bound in forward(...); it "
                      "takes only tg::grad_into(...) and tg::seed(...).");
        // every leaf the plan reads must be bound; dynamic leaves needed for shapes too (leaves
        // only: see exec/node_filter.hpp)
        static_assert(sizeof(std::conditional_t<
                             LeavesFromArgs,
                             leaf_nodes_check<Plan, std::make_index_sequence<node_ids_of_kind<typename Plan::program, op_kind::leaf>.size()>,
                                              Args...>,
                             std::true_type>));
    };
    // ---- run-time binding: everything is checked before anything runs ---------------------
    template <class Plan, class... Args>
    static void bind_leaves(typename Plan::state_type& state, const Args&... args) {
        constexpr std::array<std::size_t, sizeof...(Args) + 1> ids{bound_leaf_id<Plan, Args>::value..., Plan::M};
        // Leaves no argument binds have static shapes (check_calls): their extents.
        constexpr std::array<bool, Plan::M + 1> unbound = [&] {
            std::array<bool, Plan::M + 1> r{};
            for (std::size_t n = 0; n < Plan::M; ++n) r[n] = Plan::program::info[n].kind == op_kind::leaf;
            for (std::size_t i = 0; i < sizeof...(Args); ++i) r[ids[i]] = false;
            return r;
        }();
        for (const std::size_t n : node_ids_of_kind<typename Plan::program, op_kind::leaf>)  // not all M nodes
            if (unbound[n])
                for (std::size_t a = 0; a < Plan::program::info[n].rank; ++a)
                    state.ext[Plan::rank_offset[n] + a] = Plan::program::info[n].ext[a];
        constexpr std::array<bool, sizeof...(Args) + 1> needed = [&] {
            std::array<bool, sizeof...(Args) + 1> r{};
            for (std::size_t i = 0; i < sizeof...(Args); ++i) r[i] = ids[i] < Plan::M && Plan::plan.needed[ids[i]];
            return r;
        }();
        std::size_t i = 0;
        [[maybe_unused]] const int in_order[] = {
            0, (bind_leaf(args, state.ext.data() + Plan::rank_offset[ids[i]], state.ptr.data(), state.mut.data(), ids[i], needed[i]),
                ++i, 0)...};
    }
    // After the shapes are computed: each leaf buffer holds what its extents need.
    template <class Plan, class... Args>
    static void check_leaf_sizes(const typename Plan::state_type& state, const Args&... args) {
        constexpr std::array<std::size_t, sizeof...(Args) + 1> ids{bound_leaf_id<Plan, Args>::value..., Plan::M};
        std::array<std::size_t, sizeof...(Args) + 1> need{};
        for (std::size_t i = 0; i < sizeof...(Args); ++i)
            if (ids[i] != Plan::M) need[i] = checked_numel<Plan>(state, ids[i]);
        std::size_t i = 0;
        [[maybe_unused]] const int in_order[] = {
            0, (check_leaf_size(args, need[i], state.ext.data() + Plan::rank_offset[ids[i]]), ++i, 0)...};
    }

    // Grad destinations: sizes, then aliasing against every input and each other.
    template <class Plan, class... Args>
    static void bind_grads(typename Plan::state_type& state, const Args&... args) {
        // room for every argument and every leaf (not every node: zeroing arrays of the plan's
        // size was a large part of a small call's fixed cost), filled from the front
        constexpr std::size_t room = 2 * (sizeof...(Args) + node_ids_of_kind<typename Plan::program, op_kind::leaf>.size()) + 2;
        std::array<const void*, room> in_ranges{};
        std::array<const void*, room> out_ranges{};
        std::size_t n_in = 0, n_out = 0;
        constexpr std::array<std::size_t, sizeof...(Args) + 1> ids{bound_leaf_id<Plan, Args>::value..., Plan::M};
        std::size_t arg = 0;
        [[maybe_unused]] const int ranges_in_order[] = {
            0, (note_range(args, ids[arg] < Plan::M ? node_numel<Plan>(state, ids[arg]) : 0, in_ranges.data(), n_in,
                           out_ranges.data(), n_out),
                ++arg, 0)...};
        // Leaves bound earlier (a forward pass whose context this backward reads) count as inputs.
        for (const std::size_t n : node_ids_of_kind<typename Plan::program, op_kind::leaf>) {
            if (state.ptr[n] == nullptr) continue;
            const auto* p = static_cast<const unsigned char*>(state.ptr[n]);
            in_ranges[2 * n_in] = p;
            in_ranges[2 * n_in + 1] = p + node_numel<Plan>(state, n) * Plan::program::info[n].elem_size;
            ++n_in;
        }
        std::array<std::size_t, Plan::NS + 1> need{};
        for (std::size_t g = 0; g < Plan::NS; ++g) need[g] = node_numel<Plan>(state, Plan::stores[g]);
        std::size_t gi = 0;
        [[maybe_unused]] const int in_order[] = {0, (bind_grad(args, state.out.data(), need.data(), gi), 0)...};
        constexpr std::string_view buffer = buffer_word<call_space_v<Args...>>;
        for (std::size_t i = 0; i < n_out; ++i) {
            if (out_ranges[2 * i] == out_ranges[2 * i + 1]) continue;
            for (std::size_t j = 0; j < n_in; ++j)
                if (overlaps(out_ranges[2 * i], out_ranges[2 * i + 1], in_ranges[2 * j], in_ranges[2 * j + 1]))
                    fail<aliasing_error>({"typegrad: a grad_into ", buffer,
                                          " overlaps a bound input; gradients are written while inputs are read"});
            for (std::size_t j = 0; j < i; ++j)
                if (overlaps(out_ranges[2 * i], out_ranges[2 * i + 1], out_ranges[2 * j], out_ranges[2 * j + 1]))
                    fail<aliasing_error>({"typegrad: two grad_into ", buffer, "s overlap"});
        }
    }

    // A backward's state from its forward's: leaves (extents and buffers), and the values the
    // forward computed. A run-time walk over a table of forward ids (a function per node would
    // spell the plan in each of O(N) symbol names).
    template <class Plan, class ForwardPlan, std::size_t... Ns>
    static constexpr std::array<std::size_t, Plan::M + 1> forward_ids(std::index_sequence<Ns...>) {
        return {ForwardPlan::program::template id_of<typename Plan::program::template node_at<Ns>>::value..., ForwardPlan::M};
    }
    template <class N, bool InForward>
    static constexpr bool restorable = InForward || !is_bound_leaf<N>() || N::shape_type::is_static;
    template <class Plan, class ForwardPlan, std::size_t... Ns>
    static constexpr bool all_restorable(std::index_sequence<Ns...>) {
        return all_true({restorable<typename Plan::program::template node_at<Ns>,
                                    ForwardPlan::program::template contains<typename Plan::program::template node_at<Ns>>::value>...});
    }
    template <class Plan, class ForwardPlan, class FwdState>
    static void restore_nodes(typename Plan::state_type& state, const FwdState& fwd_state) {
        static_assert(all_restorable<Plan, ForwardPlan>(std::make_index_sequence<Plan::M>{}),
                      "typegrad: backward(ctx, ...) needs the extents of a wrt leaf that the "
                      "forward pass did not bind; bind it in forward(...).");
        constexpr auto fwd = forward_ids<Plan, ForwardPlan>(std::make_index_sequence<Plan::M>{});
        constexpr std::size_t seed = Plan::program::template id_of<seed_leaf>::value;
        constexpr auto& info = Plan::program::info;
        for (std::size_t n = 0; n < Plan::M; ++n) {
            const std::size_t f = fwd[n];
            if (f != ForwardPlan::M) {
                if (info[n].kind == op_kind::leaf) {
                    for (std::size_t a = 0; a < info[n].rank; ++a)
                        state.ext[Plan::rank_offset[n] + a] = fwd_state.ext[ForwardPlan::rank_offset[f] + a];
                    state.ptr[n] = fwd_state.ptr[f];
                    state.mut[n] = fwd_state.mut[f];
                } else if (ForwardPlan::plan.computed[f]) {
                    state.ptr[n] = fwd_state.ptr[f];
                }
            } else if (info[n].kind == op_kind::leaf && n != seed) {
                for (std::size_t a = 0; a < info[n].rank; ++a) state.ext[Plan::rank_offset[n] + a] = info[n].ext[a];
            }
        }
    }
    // The seed of a non-scalar output's backward: its buffer, with the output's extents.
    template <class Plan, class ForwardPlan, class FwdState, class... Args>
    static void bind_seed(typename Plan::state_type& state, const FwdState& fwd_state, const Args&... args) {
        if constexpr (Plan::program::template contains<seed_leaf>::value) {  // else nothing reads the seed
            constexpr std::size_t id = Plan::program::template id_of<seed_leaf>::value;
            static_assert(count_true({is_seed_binding_v<Args>...}) == 1, "typegrad: backward(ctx, ...) takes one tg::seed(...).");
            auto set = [&](const auto& b) {
                using B = std::remove_cvref_t<decltype(b)>;
                if constexpr (is_seed_binding_v<B>) {
                    static_assert(std::is_same_v<typename B::value_type, T>, "typegrad: tg::seed(buffer) needs the output's dtype.");
                    state.ptr[id] = b.data;
                }
            };
            for_each_arg(set, args...);
            using S = typename seed_leaf::shape_type;
            for (std::size_t a = 0; a < S::rank; ++a)
                state.ext[Plan::rank_offset[id] + a] = fwd_state.ext[ForwardPlan::rank_offset[ForwardPlan::program::template id_of<Loss>::value] + a];
        }
    }
    template <class Plan, class... Args>
    static void check_seed_size(const typename Plan::state_type& state, const Args&... args) {
        if constexpr (Plan::program::template contains<seed_leaf>::value) {
            constexpr std::size_t id = Plan::program::template id_of<seed_leaf>::value;
            auto check = [&](const auto& b) {
                using B = std::remove_cvref_t<decltype(b)>;
                if constexpr (is_seed_binding_v<B>) {
                    const std::size_t need = node_numel<Plan>(state, id);
                    if (b.size != need)
                        fail<shape_error>({"typegrad: tg::seed(buffer) has ", b.size, " elements but the output has ", need});
                    if (b.data == nullptr && need != 0)
                        fail<binding_error>({"typegrad: tg::seed(buffer) got a ", null_word<B::space>});
                }
            };
            for_each_arg(check, args...);
        }
    }
};

}  // namespace typegrad::detail
