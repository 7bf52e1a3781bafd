#pragma once
// tg::to_dot(step): the step as a Graphviz digraph. Edges go child -> parent (data flow).
//   cluster_forward   the loss's graph          cluster_backward  the nodes the gradients add
//   cluster_plan      one box per fused loop of value_and_grad, in that loop's colour
// A node's fill is the colour of the loop(s) that compute it (stripes when several loops
// recompute it; white: leaves and constants; grey: computed outside the loops). Forward values
// the backward recomputes have a dashed border, saved reductions a thick red one, gradients
// and the loss a double border. Ops add attributes through detail::describe_node_extra.
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include <typegrad/inspect/describe.hpp>

namespace typegrad {
namespace detail {

// Text inside a DOT "..." string; `\n` in the result is Graphviz's centred line break.
inline std::string dot_quote(std::string_view s) {
    std::string r = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') r += '\\';
        if (c == '\n') {
            r += "\\n";
            continue;
        }
        r += c;
    }
    return r + "\"";
}

// ColorBrewer Set3: light enough for black text, distinct enough for a dozen loops.
inline constexpr std::string_view loop_palette[] = {"#8dd3c7", "#ffffb3", "#bebada", "#fb8072",
                                                    "#80b1d3", "#fdb462", "#b3de69", "#fccde5",
                                                    "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f"};

inline std::string_view loop_colour(std::size_t l) {
    return loop_palette[l % (sizeof loop_palette / sizeof loop_palette[0])];
}

inline std::string dot_node(const step_view& v, std::size_t n, const std::vector<std::vector<std::size_t>>& loops_of) {
    const node_info& ni = v.info[n];
    std::string label = op_text(v, n) + "\n" + type_text(v, n);
    std::string tags;
    auto tag = [&](std::string_view t) {
        if (t.empty()) return;
        if (!tags.empty()) tags += ", ";
        tags += t;
    };
    if (v.use[n] == backward_use::saved) tag("saved");
    tag(output_labels(v, n));
    tag(v.facts[n].extra);
    if (!tags.empty()) label += "\n" + tags;

    std::string tooltip = id_text(n) + " = " + definition_text(v, n);
    if (v.use[n] != backward_use::none) tooltip += " [" + std::string(use_text(v.use[n])) + "]";

    std::string attrs = "label=" + dot_quote(label) + ", tooltip=" + dot_quote(tooltip);
    std::vector<std::string_view> style;
    if (ni.kind == op_kind::leaf || ni.kind == op_kind::constant) {
        attrs += ", shape=ellipse";
        style.push_back("filled");
        attrs += ni.kind == op_kind::constant ? ", fillcolor=\"#f4f4f4\"" : ", fillcolor=\"#ffffff\"";
        if (ni.kind == op_kind::leaf && v.facts[n].role == leaf_role::param) attrs += ", penwidth=1.6";
    } else if (loops_of[n].empty()) {
        style.push_back("filled");
        attrs += ", fillcolor=\"#e0e0e0\"";
    } else if (loops_of[n].size() == 1) {
        style.push_back("filled");
        attrs += ", fillcolor=\"" + std::string(loop_colour(loops_of[n][0])) + "\"";
    } else {
        style.push_back("striped");
        std::string colours;
        for (std::size_t l : loops_of[n]) {
            if (!colours.empty()) colours += ':';
            colours += loop_colour(l);
        }
        attrs += ", fillcolor=\"" + colours + "\"";
    }
    if (v.use[n] == backward_use::recomputed) style.push_back("dashed");
    if (v.use[n] == backward_use::saved) attrs += ", color=\"#d62728\", penwidth=2.5";
    if (!v.grad_of[n].empty() || n == v.loss) attrs += ", peripheries=2";
    std::string style_text;
    for (std::string_view s : style) style_text += (style_text.empty() ? "" : ",") + std::string(s);
    attrs += ", style=" + dot_quote(style_text);
    if (!v.facts[n].dot_attributes.empty()) attrs += ", " + v.facts[n].dot_attributes;
    return "    n" + std::to_string(n) + " [" + attrs + "];\n";
}

inline std::string loop_summary(const step_view& v, const loop_view& lp, std::size_t l) {
    std::string s = "loop " + std::to_string(l) + " (stage " + std::to_string(lp.stage) + ")\nover " +
                    shape_text(v.info[lp.iter]) + ", " + std::to_string(lp.body.size()) + " fused ops";
    auto names = [&](std::string_view what, const std::vector<std::size_t>& ids) {
        if (ids.empty()) return;
        s += "\n" + std::string(what) + ":";
        for (std::size_t n : ids) {
            const std::string labels = output_labels(v, n);
            s += " " + (labels.empty() ? op_text(v, n) : labels);
        }
    };
    names("reduces", lp.reductions);
    names("materializes", lp.materialized);
    names("stores", lp.stores);
    return s;
}

inline std::string to_dot_view(const step_view& v) {
    std::vector<std::vector<std::size_t>> loops_of(v.size());
    for (std::size_t l = 0; l < v.joint.loops.size(); ++l) {
        const loop_view& lp = v.joint.loops[l];
        for (const auto* part : {&lp.body, &lp.reductions, &lp.materialized, &lp.stores})
            for (std::size_t n : *part)
                if (loops_of[n].empty() || loops_of[n].back() != l) loops_of[n].push_back(l);
    }

    std::string out = "digraph typegrad {\n";
    out += "  graph [fontname=\"Helvetica\", fontsize=12, newrank=true, nodesep=0.3, ranksep=0.4];\n";
    out += "  node [fontname=\"Helvetica\", fontsize=10, shape=box, color=\"#444444\"];\n";
    out += "  edge [color=\"#666666\", arrowsize=0.6];\n";
    auto cluster = [&](std::string_view name, std::string_view label, std::string_view colour, bool forward) {
        out += "  subgraph " + std::string(name) + " {\n";
        out += "    label=" + dot_quote(label) + "; labeljust=l; style=rounded; color=\"" + std::string(colour) +
               "\"; fontcolor=\"" + std::string(colour) + "\";\n";
        for (std::size_t n = 0; n < v.size(); ++n)
            if (v.listed[n] && bool(v.forward[n]) == forward) out += dot_node(v, n, loops_of);
        out += "  }\n";
    };
    cluster("cluster_forward", "forward", "#1f77b4", true);
    cluster("cluster_backward", "backward", "#e6550d", false);

    out += "  subgraph cluster_plan {\n";
    out += "    label=" + dot_quote("value_and_grad: " + count_text(v.joint.loops.size(), "fused loop", "fused loops")) +
           "; labeljust=l; style=rounded; color=\"#555555\"; fontcolor=\"#555555\";\n";
    for (std::size_t l = 0; l < v.joint.loops.size(); ++l)
        out += "    loop" + std::to_string(l) + " [shape=note, style=filled, fillcolor=\"" +
               std::string(loop_colour(l)) + "\", label=" + dot_quote(loop_summary(v, v.joint.loops[l], l)) + "];\n";
    out += "    key [shape=plaintext, fontsize=9, label=" +
           dot_quote("fill: the loop(s) computing a node\ndashed: recomputed by the backward\n"
                     "red: saved reduction\ndouble border: gradient or loss") +
           "];\n";
    // Stack the loop boxes in execution order.
    for (std::size_t l = 0; l < v.joint.loops.size(); ++l)
        out += "    " + (l ? "loop" + std::to_string(l - 1) : std::string("key")) + " -> loop" + std::to_string(l) +
               " [style=invis];\n";
    out += "  }\n";

    for (std::size_t n = 0; n < v.size(); ++n) {
        if (!v.listed[n]) continue;
        const node_info& ni = v.info[n];
        for (std::size_t c = 0; c < ni.arity; ++c) {
            out += "  n" + std::to_string(ni.child[c]) + " -> n" + std::to_string(n);
            out += ni.shape_only[c] ? " [style=dashed, color=\"#aaaaaa\", arrowhead=empty, tooltip=\"shape only\"];\n"
                                    : ";\n";
        }
    }
    return out + "}\n";
}

}  // namespace detail

template <inspectable_step Step>
std::string to_dot(const Step&) {
    return detail::to_dot_view(detail::make_step_view<Step>());
}

}  // namespace typegrad
