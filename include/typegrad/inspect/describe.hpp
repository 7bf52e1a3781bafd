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
// The text is rendered from the step's plain-data view (exec/step_view.hpp).
#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include <typegrad/core/error.hpp>
#include <typegrad/exec/step_view.hpp>

namespace typegrad {
namespace detail {

// ---- text -------------------------------------------------------------------------------

// Texts are joined by error.hpp's message() (one out-of-line join_text for every call site).

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
    return message(v.facts[n].dtype, " ", shape_text(v.info[n]));
}

[[gnu::cold]] inline std::string id_text(std::size_t n) { return message("%", std::to_string(n)); }

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
        return message(r == leaf_role::param ? "param " : r == leaf_role::input ? "input " : "seed ", ni.name);
    }
    if (ni.kind == op_kind::constant) return message("constant ", number_text(v.facts[n].value));
    std::string s = message(ni.name, "(");
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
        lhs.push_back(message(id_text(n), " = ", definition_text(v, n)));
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
            out += message("[", tags, "]");
        }
        out += '\n';
    }
}

[[gnu::cold]] inline std::string count_text(std::size_t n, std::string_view one, std::string_view many) {
    return message(std::to_string(n), " ", n == 1 ? one : many);
}

[[gnu::cold]] inline void append_id_list(std::string& out, const step_view& v,
                                         const std::vector<std::size_t>& ids, bool labelled) {
    for (std::size_t i = 0; i < ids.size(); ++i) {
        if (i) out += ", ";
        const bool is_constant = v.info[ids[i]].kind == op_kind::constant;
        out += message(id_text(ids[i]), is_constant ? " constant " : " ", op_text(v, ids[i]));
        const std::string labels = labelled ? output_labels(v, ids[i]) : std::string();
        if (!labels.empty()) out += message(" (", labels, ")");
    }
}

// In execution order: per stage, its kernels, then its loops (see exec/execute.hpp).
[[gnu::cold]] inline void append_plan(std::string& out, const step_view& v, const plan_view& p,
                                      std::string_view title) {
    out += message("kernel plan: ", title, " (", count_text(p.loops.size(), "loop", "loops"));
    if (!p.kernels.empty()) out += message(", ", count_text(p.kernels.size(), "kernel", "kernels"));
    out += ")\n";
    auto list = [&](std::string_view what, const std::vector<std::size_t>& ids, bool labelled) {
        if (ids.empty()) return;
        out += message("    ", what, ":");
        out.append(what.size() < 13 ? 13 - what.size() : 1, ' ');
        append_id_list(out, v, ids, labelled);
        out += '\n';
    };
    std::size_t last_stage = 0;
    for (const loop_view& lp : p.loops) last_stage = std::max(last_stage, lp.stage);
    for (const kernel_view& k : p.kernels) last_stage = std::max(last_stage, k.stage);
    for (std::size_t stage = 0; stage <= last_stage; ++stage) {
        for (const kernel_view& k : p.kernels) {
            if (k.stage != stage) continue;
            out += message("  kernel ", id_text(k.node), " = ", definition_text(v, k.node), ": stage ",
                       std::to_string(stage), ", ", type_text(v, k.node));
            const std::string labels = output_labels(v, k.node);
            if (!labels.empty()) out += message(" (", labels, ")");
            out += '\n';
        }
        for (std::size_t l = 0; l < p.loops.size(); ++l) {
            const loop_view& lp = p.loops[l];
            if (lp.stage != stage) continue;
            out += message("  loop ", std::to_string(l), ": stage ", std::to_string(lp.stage), ", over ",
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
    std::string out = message("typegrad step: loss ", id_text(v.loss), " ", op_text(v, v.loss), " (",
                          type_text(v, v.loss), "), wrt ");
    for (std::size_t w = 0; w < v.wrt_names.size(); ++w) {
        if (w) out += ", ";
        out += v.wrt_names[w];
        if (v.wrt_ids[w] < v.size()) out += message(" (", id_text(v.wrt_ids[w]), ")");
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
    out += message("forward graph (", count_text(fwd_ids.size(), "node", "nodes"), ")\n");
    append_node_lines(out, v, fwd_ids, false);
    out += message("\nbackward graph (", count_text(added, "new node", "new nodes"), "; from the forward graph: ",
               std::to_string(saved), " saved, ", std::to_string(recomputed), " recomputed, ",
               std::to_string(read), " read as is)\n");
    append_node_lines(out, v, bwd_ids, true);
    out += '\n';
    append_plan(out, v, v.joint, "value_and_grad");
    out += '\n';
    append_plan(out, v, v.fwd, "forward");
    return out;
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

// TYPEGRAD_LOG=graphs prints describe()'s text (exec/step_view.hpp calls it on a step's first
// call). Installed when this header is first included: a program that leaves inspection out logs
// one line that says so.
[[gnu::cold]] inline void print_step_view(const step_view& v) {
    const std::string text = message("typegrad: TYPEGRAD_LOG=graphs\n", describe_view(v));
    std::fwrite(text.data(), 1, text.size(), stderr);
    std::fflush(stderr);
}
inline const bool step_view_printer_installed = (step_view_printer.store(&print_step_view), true);

}  // namespace detail
}  // namespace typegrad
