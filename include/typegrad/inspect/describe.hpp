#pragma once
// tg::describe(step): what a compiled step computes, as text (the TORCH_LOGS=compiled_autograd
// of typegrad). Three sections:
//   forward graph   every node of the loss, children first
//   backward graph  the nodes the gradients add, and the forward values they read: recomputed
//                   (not kept by forward(); backward(ctx) evaluates them again) or saved
//                   (reductions, kernel results)
//   kernel plan     the fused loops of value_and_grad and of forward, with the values a loop
//                   saves for later loops (`saves:`)
// TYPEGRAD_LOG=graphs prints the same text to stderr on the first call of each step type.
//
// Only the step's *type* is read, through its nested plans<> (see autodiff/step.hpp); this
// header does not include step.hpp, so step.hpp can include it for the log hook.
#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
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

// A plan_provider's plan, by address (`ids[i]`: the step_view id of the plan's node i).
struct plan_ref {
    const loop_plan* loops = nullptr;
    std::size_t loop_count = 0;
    const std::size_t* members = nullptr;
    const bool* computed = nullptr;
    const bool* saved = nullptr;
    const std::size_t* stage = nullptr;
    const std::size_t* stores = nullptr;
    const std::size_t* ids = nullptr;
    std::size_t size = 0;
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

template <class PP, class ToView>
constexpr plan_ref plan_ref_of(const ToView& ids) {
    return {PP::plan.loops.data(),    PP::plan.loop_count,   PP::plan.members.data(),
            PP::plan.computed.data(), PP::plan.saved.data(), PP::plan.stage.data(),
            PP::stores.data(),        ids.data(),            PP::M};
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
    for (std::size_t n = 0; n < p.size; ++n) {
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
    for (std::size_t i = 0; i < r.fwd.size; ++i) v.forward[r.fwd.ids[i]] = 1;
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

// ---- text -------------------------------------------------------------------------------

// Concatenation by appending only: `"literal" + std::string(...)` inserts at the front, which
// trips GCC 12's -Wrestrict false positive at -O3.
template <class... Parts>
std::string cat(const Parts&... parts) {
    std::string s;
    (s.append(std::string_view(parts)), ...);
    return s;
}

[[gnu::cold]] inline std::string number_text(double x) {
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, x);
    return std::string(buf, r.ptr);
}

[[gnu::cold]] inline std::string shape_text(const node_info& ni) {
    std::string s = "[";
    for (std::size_t a = 0; a < ni.rank; ++a) {
        if (a) s += ", ";
        s += ni.ext[a] == dyn ? std::string("dyn") : std::to_string(ni.ext[a]);
    }
    s += ']';
    return s;
}

[[gnu::cold]] inline std::string type_text(const step_view& v, std::size_t n) {
    return cat(v.facts[n].dtype, " ", shape_text(v.info[n]));
}

[[gnu::cold]] inline std::string id_text(std::size_t n) { return cat("%", std::to_string(n)); }

// "x", "1", "exp": what a node is, in one word (a leaf's name, a constant's value).
[[gnu::cold]] inline std::string op_text(const step_view& v, std::size_t n) {
    const node_info& ni = v.info[n];
    if (ni.kind == op_kind::constant) return number_text(v.facts[n].value);
    return std::string(ni.name);
}

// "param x", "constant 1", "expand(%17, shape=%5)"
[[gnu::cold]] inline std::string definition_text(const step_view& v, std::size_t n) {
    const node_info& ni = v.info[n];
    if (ni.kind == op_kind::leaf) {
        const leaf_role r = v.facts[n].role;
        return cat(r == leaf_role::param ? "param " : r == leaf_role::input ? "input " : "seed ", ni.name);
    }
    if (ni.kind == op_kind::constant) return cat("constant ", number_text(v.facts[n].value));
    std::string s = cat(ni.name, "(");
    for (std::size_t c = 0; c < ni.arity; ++c) {
        if (c) s += ", ";
        if (ni.shape_only[c]) s += "shape=";
        s += id_text(ni.child[c]);
    }
    s += ')';
    return s;
}

// "grad of x", "loss": the outputs a node is.
[[gnu::cold]] inline std::string output_labels(const step_view& v, std::size_t n) {
    std::string s;
    for (std::size_t w : v.grad_of[n]) {
        if (!s.empty()) s += ", ";
        s += "grad of ";
        s += v.wrt_names[w];
    }
    if (n == v.loss) s += s.empty() ? "loss" : ", loss";
    return s;
}

inline std::string_view use_text(backward_use u) {
    switch (u) {
        case backward_use::leaf: return "leaf";
        case backward_use::constant: break;  // "constant 2" says it already
        case backward_use::recomputed: return "recomputed";
        case backward_use::saved: return "saved";
        case backward_use::none: break;
    }
    return "";
}

// One node per line: "  %3 = mul(%1, %2)    f32 [1000]    [loss]".
[[gnu::cold]] inline void append_node_lines(std::string& out, const step_view& v,
                                            const std::vector<std::size_t>& ids, bool show_use) {
    std::size_t w1 = 0, w2 = 0;
    std::vector<std::string> lhs, types;
    for (std::size_t n : ids) {
        lhs.push_back(cat(id_text(n), " = ", definition_text(v, n)));
        types.push_back(type_text(v, n));
        w1 = std::max(w1, lhs.back().size());
        w2 = std::max(w2, types.back().size());
    }
    w1 = std::min<std::size_t>(w1, 48);
    for (std::size_t i = 0; i < ids.size(); ++i) {
        const std::size_t n = ids[i];
        std::string tags;
        auto tag = [&](std::string_view t) {
            if (t.empty()) return;
            if (!tags.empty()) tags += ", ";
            tags += t;
        };
        if (show_use) tag(use_text(v.use[n]));
        tag(output_labels(v, n));
        tag(v.facts[n].extra);
        out += "  ";
        out += lhs[i];
        out.append(w1 + 2 > lhs[i].size() ? w1 + 2 - lhs[i].size() : 1, ' ');
        out += types[i];
        if (!tags.empty()) {
            out.append(w2 + 2 - types[i].size(), ' ');
            out += cat("[", tags, "]");
        }
        out += '\n';
    }
}

[[gnu::cold]] inline std::string count_text(std::size_t n, std::string_view one, std::string_view many) {
    return cat(std::to_string(n), " ", n == 1 ? one : many);
}

[[gnu::cold]] inline void append_id_list(std::string& out, const step_view& v,
                                         const std::vector<std::size_t>& ids, bool labelled) {
    for (std::size_t i = 0; i < ids.size(); ++i) {
        if (i) out += ", ";
        const bool is_constant = v.info[ids[i]].kind == op_kind::constant;
        out += cat(id_text(ids[i]), is_constant ? " constant " : " ", op_text(v, ids[i]));
        const std::string labels = labelled ? output_labels(v, ids[i]) : std::string();
        if (!labels.empty()) out += cat(" (", labels, ")");
    }
}

// In execution order: per stage, its kernels, then its loops (see exec/execute.hpp).
[[gnu::cold]] inline void append_plan(std::string& out, const step_view& v, const plan_view& p,
                                      std::string_view title) {
    out += cat("kernel plan: ", title, " (", count_text(p.loops.size(), "loop", "loops"));
    if (!p.kernels.empty()) out += cat(", ", count_text(p.kernels.size(), "kernel", "kernels"));
    out += ")\n";
    auto list = [&](std::string_view what, const std::vector<std::size_t>& ids, bool labelled) {
        if (ids.empty()) return;
        out += cat("    ", what, ":");
        out.append(what.size() < 13 ? 13 - what.size() : 1, ' ');
        append_id_list(out, v, ids, labelled);
        out += '\n';
    };
    std::size_t last_stage = 0;
    for (const loop_view& lp : p.loops) last_stage = std::max(last_stage, lp.stage);
    for (const kernel_view& k : p.kernels) last_stage = std::max(last_stage, k.stage);
    for (std::size_t st = 0; st <= last_stage; ++st) {
        for (const kernel_view& k : p.kernels) {
            if (k.stage != st) continue;
            out += cat("  kernel ", id_text(k.node), " = ", definition_text(v, k.node), ": stage ",
                       std::to_string(st), ", ", type_text(v, k.node));
            const std::string labels = output_labels(v, k.node);
            if (!labels.empty()) out += cat(" (", labels, ")");
            out += '\n';
        }
        for (std::size_t l = 0; l < p.loops.size(); ++l) {
            const loop_view& lp = p.loops[l];
            if (lp.stage != st) continue;
            out += cat("  loop ", std::to_string(l), ": stage ", std::to_string(lp.stage), ", over ",
                       shape_text(v.info[lp.iter]), " (shape of ", id_text(lp.iter), ")\n");
            list("reads", lp.inputs, false);
            list("fused", lp.body, false);
            list("reduces", lp.reductions, true);
            list("materializes", lp.materialized, true);
            list("saves", lp.saved, true);
            list("stores", lp.stores, true);
        }
    }
}

[[gnu::cold]] inline std::string describe_view(const step_view& v) {
    std::string out = cat("typegrad step: loss ", id_text(v.loss), " ", op_text(v, v.loss), " (",
                          type_text(v, v.loss), "), wrt ");
    for (std::size_t w = 0; w < v.wrt_names.size(); ++w) {
        if (w) out += ", ";
        out += v.wrt_names[w];
        if (v.wrt_ids[w] < v.size()) out += cat(" (", id_text(v.wrt_ids[w]), ")");
    }
    if (v.wrt_names.empty()) out += "nothing";
    out += "\n\n";

    std::vector<std::size_t> fwd_ids, bwd_ids;
    std::size_t added = 0, saved = 0, recomputed = 0, read = 0;
    for (std::size_t n = 0; n < v.size(); ++n) {
        if (!v.listed[n]) continue;
        if (v.forward[n]) fwd_ids.push_back(n);
        if (!v.forward[n] || v.use[n] != backward_use::none) bwd_ids.push_back(n);
        if (!v.forward[n]) ++added;
        saved += v.use[n] == backward_use::saved;
        recomputed += v.use[n] == backward_use::recomputed;
        read += v.use[n] == backward_use::leaf || v.use[n] == backward_use::constant;
    }
    out += cat("forward graph (", count_text(fwd_ids.size(), "node", "nodes"), ")\n");
    append_node_lines(out, v, fwd_ids, false);
    out += cat("\nbackward graph (", count_text(added, "new node", "new nodes"), "; from the forward graph: ",
               std::to_string(saved), " saved, ", std::to_string(recomputed), " recomputed, ",
               std::to_string(read), " read as is)\n");
    append_node_lines(out, v, bwd_ids, true);
    out += '\n';
    append_plan(out, v, v.joint, "value_and_grad");
    out += '\n';
    append_plan(out, v, v.fwd, "forward");
    return out;
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

}  // namespace detail

// A compiled step (tg::compile(...)): what describe and to_dot accept.
template <class S>
concept inspectable_step = requires {
    typename S::template plans<>::joint;
    typename S::template plans<>::forward;
    typename S::loss_node;
    typename S::wrt_list;
};

// The step as text: forward graph, backward graph, kernel plans (docs/inspection.md).
template <inspectable_step Step>
std::string describe(const Step&) {
    return detail::describe_view(detail::make_step_view<Step>());
}

namespace detail {

template <class Step>
void print_graphs() {
    const std::string text = cat("typegrad: TYPEGRAD_LOG=graphs\n", describe_view(make_step_view<Step>()));
    std::fwrite(text.data(), 1, text.size(), stderr);
    std::fflush(stderr);
}
// The step hook for TYPEGRAD_LOG=graphs: prints describe() to stderr on the first call of each
// step type (thread-safe). With the variable unset it costs one branch and allocates nothing.
// Define TYPEGRAD_NO_LOG to compile it out entirely (describe() is then not instantiated for
// every step). The flag is constant-initialized: clang tries to evaluate the initializer of a
// static local at compile time, and the failure note of an immediately-invoked lambda spells the
// lambda's body, here the whole graph type (60 s of a 2-block transformer's compile).
template <class Step>
void log_graphs_once() {
#ifndef TYPEGRAD_NO_LOG
    if (!log_graphs_enabled()) return;
    static std::atomic<bool> printed{false};
    if (!printed.load(std::memory_order_relaxed) && !printed.exchange(true)) print_graphs<Step>();
#endif
}

}  // namespace detail
}  // namespace typegrad
