#pragma once
// A compiled step flattened to plain data (step_view): its forward and backward nodes, how the
// backward uses each forward value, and the fused loops of its plans. describe(), to_dot()
// (inspect/) and the TYPEGRAD_LOG=graphs hook below read it.
//
// Only the step's *type* is read, through its nested plans<> (see exec/step.hpp); this header
// does not include step.hpp, so step.hpp can include it for the log hook.
#include <algorithm>
#include <array>
#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <typegrad/core/dtype.hpp>
#include <typegrad/exec/program.hpp>
#include <typegrad/graph/node.hpp>
#include <typegrad/graph/type_list.hpp>

namespace typegrad {
namespace detail {

// ---- extension point ----------------------------------------------------------------------
//
// Extra text and Graphviz attributes for the nodes of one op (hooks use it). Either specialise
// this trait for Op, or give Op the static member functions
//     static std::string describe_extra();   // appended to the node's describe() line and
//                                            // as a last line of its DOT label
//     static std::string dot_attributes();   // extra DOT attributes, e.g. `color="#7b1fa2"`
// The members need no include of this header, so an op header can provide them freely.
template <class Op>
struct describe_node_extra {
    static std::string text() {
        if constexpr (requires { { Op::describe_extra() } -> std::convertible_to<std::string>; })
            return std::string(Op::describe_extra());
        else return {};
    }
    static std::string dot_attributes() {
        if constexpr (requires { { Op::dot_attributes() } -> std::convertible_to<std::string>; })
            return std::string(Op::dot_attributes());
        else return {};
    }
};

// ---- a step, flattened to plain data --------------------------------------------------------
//
// Per step type there are only constexpr tables (step_tables<Step>) and one small function;
// the rest is ordinary run-time code (cold: it runs once, if ever), compiled once per
// translation unit however many steps it describes.

// What program::info lacks about a node; its type knows it.
struct node_facts {
    std::string_view dtype;
    leaf_role role = leaf_role::input;
    double value = 0;                           // constants
    std::string (*extra)() = nullptr;           // describe_node_extra<Op>::text
    std::string (*dot_attributes)() = nullptr;  // describe_node_extra<Op>::dot_attributes
};

// Keyed by the node's row key (program.hpp): a function of the node type would be named with
// its subgraph.
template <class Key>
struct facts_of;
template <class Name, class T, class S, leaf_role R>
struct facts_of<leaf<Name, T, S, R>> {
    static constexpr node_facts value{.dtype = dtype_name<T>(), .role = R};
};
template <std::uint64_t V>
struct facts_of<constant<V>> {
    static constexpr node_facts value{.dtype = dtype_name<typename constant<V>::value_type>(),
                                      .value = constant<V>::value};
};
template <class Op, std::size_t Arity, class Shape, class Value, class Buffer>
struct facts_of<op_row_key<Op, Arity, Shape, Value, Buffer>> {
    static constexpr node_facts value{.dtype = dtype_name<Value>(),
                                      .extra = &describe_node_extra<Op>::text,
                                      .dot_attributes = &describe_node_extra<Op>::dot_attributes};
};

// A plan_provider's tables (exec/execute.hpp), with `ids[i]`: the step_view id of the plan's node i.
struct plan_ref : plan_tables {
    const std::size_t* ids = nullptr;
};

struct step_ref {
    const node_info* info = nullptr;  // the value_and_grad (joint) program
    const node_facts* facts = nullptr;
    const std::size_t* first = nullptr;  // id of the first node of the same type
    std::size_t size = 0;
    plan_ref joint, fwd;
    std::size_t loss = 0;
    const std::string_view* wrt_names = nullptr;
    const std::size_t* wrt_ids = nullptr;
    std::size_t wrt_count = 0;
};

template <class Plan, class ToView>
constexpr plan_ref plan_ref_of(const ToView& ids) {
    return {plan_tables_of<Plan>(), ids.data()};
}

template <class... Ns>
constexpr std::array<node_facts, sizeof...(Ns)> facts_table(type_list<Ns...>) {
    return {facts_of<typename row_key<Ns>::type>::value...};
}
// Each node's id in the program Prog (a hash look-up each: index_of, a comparison with every
// node, made this table O(N^2) and 60% of the front end of a 200-op chain's compile in clang).
template <class Prog, class... Ns>
constexpr std::array<std::size_t, sizeof...(Ns)> id_table(type_list<Ns...>) {
    return {Prog::template id_of<Ns>::value...};
}
template <class... Ls>
constexpr std::array<std::string_view, sizeof...(Ls)> name_table(type_list<Ls...>) {
    return {Ls::name()...};
}

template <class Step>
struct step_tables {
    using plans = typename Step::template plans<>;
    using joint = typename plans::joint;
    using fwd = typename plans::forward;
    using nodes = typename joint::program::nodes;
    static constexpr std::size_t m = joint::program::size;
    static constexpr auto facts = detail::facts_table(nodes{});
    static constexpr auto first = detail::id_table<typename joint::program>(nodes{});
    static constexpr auto fwd_ids = detail::id_table<typename joint::program>(typename fwd::program::nodes{});
    static constexpr auto wrt_names = detail::name_table(typename Step::wrt_list{});
    static constexpr auto wrt_ids = detail::id_table<typename joint::program>(typename Step::wrt_list{});

    static step_ref ref() {
        step_ref r;
        r.info = joint::program::info.data();
        r.facts = facts.data();
        r.first = first.data();
        r.size = m;
        r.joint = plan_ref_of<joint>(first);  // the joint program's ids are the view's ids
        r.fwd = plan_ref_of<fwd>(fwd_ids);
        r.loss = joint::program::template id_of<typename Step::loss_node>::value;
        r.wrt_names = wrt_names.data();
        r.wrt_ids = wrt_ids.data();
        r.wrt_count = wrt_names.size();
        return r;
    }
};

// How the backward part uses a forward node.
enum class backward_use : unsigned char { none, leaf, constant, recomputed, saved };

struct loop_view {
    std::size_t stage = 0;
    std::size_t iter = 0;  // node whose shape is the iteration space
    std::vector<std::size_t> inputs, body, reductions, materialized, saved, stores;  // node ids
};

struct kernel_view {
    std::size_t node = 0;
    std::size_t stage = 0;  // runs before the loops of its stage
};

struct plan_view {
    std::vector<loop_view> loops;
    std::vector<kernel_view> kernels;  // matmul, custom ops, tensor hooks: their own routines
    std::vector<char> computed;        // per node: this plan writes its buffer
};

struct node_view {
    std::string_view dtype;
    leaf_role role = leaf_role::input;
    double value = 0;
    std::string extra, dot_attributes;
};

struct step_view {
    std::vector<node_info> info;  // the value_and_grad (joint) program; ids are its ids
    std::vector<node_view> facts;
    std::vector<char> listed;     // first occurrence of its type (later ones are never used)
    std::vector<char> forward;    // part of the loss's own graph
    std::vector<backward_use> use;
    std::vector<std::vector<std::size_t>> grad_of;  // per node: indices into wrt
    std::vector<std::string_view> wrt_names;
    std::vector<std::size_t> wrt_ids;                // the leaves (size() if absent)
    std::size_t loss = 0;
    plan_view joint, fwd;

    std::size_t size() const { return info.size(); }
};

// Loops that materialise elementwise values into scratch (newer planners) list them apart.
template <class LP>
std::pair<std::size_t, std::size_t> materialized_range(const LP& lp) {
    if constexpr (requires { lp.mat_begin; lp.mat_end; }) return {lp.mat_begin, lp.mat_end};
    else return {0, 0};
}

// `info` is indexed by the view's ids.
[[gnu::cold]] inline plan_view make_plan_view(const plan_ref& p, const node_info* info,
                                              std::size_t view_size) {
    plan_view v;
    v.computed.assign(view_size, 0);
    for (std::size_t n = 0; n < p.node_count; ++n) {
        if (!p.computed[n]) continue;
        v.computed[p.ids[n]] = 1;
        if (info[p.ids[n]].kind == op_kind::kernel) v.kernels.push_back({p.ids[n], p.stage[n]});
    }
    auto ids = [&](std::size_t b, std::size_t e) {
        std::vector<std::size_t> r;
        for (std::size_t k = b; k < e; ++k) r.push_back(p.ids[p.members[k]]);
        return r;
    };
    for (std::size_t l = 0; l < p.loop_count; ++l) {
        const loop_plan& lp = p.loops[l];
        loop_view lv;
        lv.stage = lp.stage;
        lv.iter = p.ids[lp.iter];
        lv.inputs = ids(lp.in_begin, lp.in_end);
        lv.body = ids(lp.body_begin, lp.body_end);
        lv.reductions = ids(lp.red_begin, lp.red_end);
        const auto [mb, me] = materialized_range(lp);
        for (std::size_t k = mb; k < me; ++k)  // values saved for later stages, apart
            (p.saved[p.members[k]] ? lv.saved : lv.materialized).push_back(p.ids[p.members[k]]);
        for (std::size_t k = lp.store_begin; k < lp.store_end; ++k)  // members hold store indices
            lv.stores.push_back(p.ids[p.stores[p.members[k]]]);
        v.loops.push_back(std::move(lv));
    }
    return v;
}

// Marks the forward values the gradient nodes read. Reductions and kernels (matmul, custom
// ops) that the forward pass computes are saved, as step::is_saved keeps them; leaves and
// constants are read as they are; everything else (elementwise values, views, shape-derived
// scalars) is evaluated again, so its own inputs are followed.
[[gnu::cold]] inline void mark_backward_uses(step_view& v) {
    const std::size_t m = v.size();
    std::vector<char> reach(m, 0);
    for (std::size_t n = 0; n < m; ++n)
        if (v.listed[n] && (!v.forward[n] || !v.grad_of[n].empty())) reach[n] = 1;
    v.use.assign(m, backward_use::none);
    for (std::size_t n = m; n-- > 0;) {
        if (!reach[n]) continue;
        const node_info& ni = v.info[n];
        if (v.forward[n]) {
            if (ni.kind == op_kind::leaf) v.use[n] = backward_use::leaf;
            else if (ni.kind == op_kind::constant) v.use[n] = backward_use::constant;
            else if ((ni.kind == op_kind::reduce || ni.kind == op_kind::kernel) && v.fwd.computed[n])
                v.use[n] = backward_use::saved;
            else v.use[n] = backward_use::recomputed;
            if (v.use[n] != backward_use::recomputed) continue;
        }
        for (std::size_t c = 0; c < ni.arity; ++c)
            if (!ni.shape_only[c]) reach[ni.child[c]] = 1;
    }
}

[[gnu::cold]] inline step_view build_step_view(const step_ref& r) {
    const std::size_t m = r.size;
    step_view v;
    v.info.assign(r.info, r.info + m);
    v.facts.resize(m);
    v.listed.assign(m, 0);
    for (std::size_t i = 0; i < m; ++i) {
        const node_facts& f = r.facts[i];
        v.facts[i] = {f.dtype, f.role, f.value, f.extra ? f.extra() : std::string(),
                      f.dot_attributes ? f.dot_attributes() : std::string()};
        v.listed[i] = r.first[i] == i;
    }
    v.forward.assign(m, 0);
    for (std::size_t i = 0; i < r.fwd.node_count; ++i) v.forward[r.fwd.ids[i]] = 1;
    v.joint = make_plan_view(r.joint, r.info, m);
    v.fwd = make_plan_view(r.fwd, r.info, m);
    v.loss = r.loss;
    v.wrt_names.assign(r.wrt_names, r.wrt_names + r.wrt_count);
    v.wrt_ids.assign(r.wrt_ids, r.wrt_ids + r.wrt_count);
    v.grad_of.assign(m, {});
    // value_and_grad stores the gradients in wrt order, then an elementwise loss.
    for (std::size_t w = 0; w < r.wrt_count; ++w) v.grad_of[r.joint.stores[w]].push_back(w);
    mark_backward_uses(v);
    return v;
}

template <class Step>
step_view make_step_view() {
    return build_step_view(step_tables<Step>::ref());
}

// ---- TYPEGRAD_LOG -----------------------------------------------------------------------

// TYPEGRAD_LOG is a comma- or space-separated list of topics; "graphs" (or "all") turns this on.
inline bool log_topic_enabled(const char* setting, std::string_view topic) {
    if (setting == nullptr) return false;
    const std::string_view s(setting);
    std::size_t i = 0;
    while (i < s.size()) {
        const std::size_t j = std::min(s.find_first_of(", ", i), s.size());
        const std::string_view t = s.substr(i, j - i);
        if (t == topic || t == "all") return true;
        i = j + 1;
    }
    return false;
}

inline bool log_graphs_enabled() {
    static const bool on = log_topic_enabled(std::getenv("TYPEGRAD_LOG"), "graphs");
    return on;
}

// The text TYPEGRAD_LOG=graphs prints: inspect/describe.hpp installs describe()'s when it is
// included (the umbrella header includes it). Exec does not include inspect, so the printer is a
// pointer set at static initialisation rather than a call.
using step_view_print_fn = void (*)(const step_view&);
inline std::atomic<step_view_print_fn> step_view_printer{nullptr};

// The step hook for TYPEGRAD_LOG=graphs: prints describe() to stderr on the first call of each
// step type (thread-safe). With the variable unset it costs one branch and allocates nothing.
// Define TYPEGRAD_NO_LOG to compile it out entirely (the step's view is then not instantiated for
// every step). The flag is constant-initialized: clang tries to evaluate the initializer of a
// static local at compile time, and the failure note of an immediately-invoked lambda spells the
// lambda's body, here the whole graph type (60 s of a 2-block transformer's compile).
template <class Step>
void log_graphs_once() {
#ifndef TYPEGRAD_NO_LOG
    if (!log_graphs_enabled()) return;
    static std::atomic<bool> printed{false};
    if (printed.load(std::memory_order_relaxed) || printed.exchange(true)) return;
    if (const step_view_print_fn print = step_view_printer.load()) {
        print(make_step_view<Step>());
    } else {
        static constexpr char note[] =
            "typegrad: TYPEGRAD_LOG=graphs prints a step's graphs where <typegrad/inspect/describe.hpp> "
            "is included (<typegrad/typegrad.hpp> includes it)\n";
        std::fwrite(note, 1, sizeof note - 1, stderr);
    }
#endif
}

}  // namespace detail
}  // namespace typegrad
