#pragma once
// tg::to_dot(step): the step as a Graphviz digraph. Edges go child -> parent (data flow).
//   cluster_forward   the loss's graph          cluster_backward  the nodes the gradients add
//   cluster_plan      one box per fused loop of value_and_grad, in that loop's colour
// A node's fill is the colour of the loop(s) that compute it (stripes when several loops
// recompute it; white: leaves and constants; grey: outside the loops, a 3-D box for kernels).
// Forward values the backward recomputes have a dashed border, saved ones a thick red one,
// gradients and the loss a double border. Ops add attributes through detail::describe_node_extra.
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include <typegrad/inspect/describe.hpp>

namespace typegrad {
namespace detail {

// Text inside a DOT "..." string; `\n` in the result is Graphviz's centred line break.
[[gnu::cold]] inline std::string dot_quote(std::string_view s) {
    std::string r = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') r += '\\';
        if (c == '\n') {
            r += "\\n";
            continue;
        }
        r += c;
    }
    r += '"';
    return r;
}

// ColorBrewer Set3: light enough for black text, distinct enough for a dozen loops.
inline constexpr std::string_view loop_palette[] = {"#8dd3c7", "#ffffb3", "#bebada", "#fb8072",
                                                    "#80b1d3", "#fdb462", "#b3de69", "#fccde5",
                                                    "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f"};

inline std::string_view loop_colour(std::size_t l) {
    return loop_palette[l % (sizeof loop_palette / sizeof loop_palette[0])];
}

[[gnu::cold]] inline std::string dot_node(const step_view& v, std::size_t n,
                                          const std::vector<std::vector<std::size_t>>& loops_of) {
    const node_info& ni = v.info[n];
    std::string label = message(op_text(v, n), "\n", type_text(v, n));
    std::string tags;
    auto tag = [&](std::string_view t) {
        if (t.empty()) return;
        if (!tags.empty()) tags += ", ";
        tags += t;
    };
    if (v.use[n] == backward_use::saved) tag("saved");
    tag(output_labels(v, n));
    tag(v.facts[n].extra);
    if (!tags.empty()) label += message("\n", tags);

    std::string tooltip = message(id_text(n), " = ", definition_text(v, n));
    if (!use_text(v.use[n]).empty()) tooltip += message(" [", use_text(v.use[n]), "]");

    std::string attrs = message("label=", dot_quote(label), ", tooltip=", dot_quote(tooltip));
    std::string style;
    if (ni.kind == op_kind::leaf || ni.kind == op_kind::constant) {
        attrs += ni.kind == op_kind::constant ? ", shape=ellipse, fillcolor=\"#f4f4f4\""
                                              : ", shape=ellipse, fillcolor=\"#ffffff\"";
        if (ni.kind == op_kind::leaf && v.facts[n].role == leaf_role::param) attrs += ", penwidth=1.6";
        style = "filled";
    } else if (loops_of[n].empty()) {
        // Kernels (matmul, custom ops), views and shape-derived scalars.
        if (ni.kind == op_kind::kernel) attrs += ", shape=box3d";
        attrs += ", fillcolor=\"#e0e0e0\"";
        style = "filled";
    } else {
        // Several loops compute the same value: one stripe per loop.
        std::string colours;
        for (std::size_t l : loops_of[n]) {
            if (!colours.empty()) colours += ':';
            colours += loop_colour(l);
        }
        attrs += message(", fillcolor=\"", colours, "\"");
        style = loops_of[n].size() == 1 ? "filled" : "striped";
    }
    if (v.use[n] == backward_use::recomputed) style += ",dashed";
    if (v.use[n] == backward_use::saved) attrs += ", color=\"#d62728\", penwidth=2.5";
    if (!v.grad_of[n].empty() || n == v.loss) attrs += ", peripheries=2";
    attrs += message(", style=", dot_quote(style));
    if (!v.facts[n].dot_attributes.empty()) attrs += message(", ", v.facts[n].dot_attributes);
    return message("    n", std::to_string(n), " [", attrs, "];\n");
}

[[gnu::cold]] inline std::string loop_summary(const step_view& v, const loop_view& lp, std::size_t l) {
    std::string s = message("loop ", std::to_string(l), " (stage ", std::to_string(lp.stage), ")\nover ",
                        shape_text(v.info[lp.iter]), ", ", std::to_string(lp.body.size()), " fused ops");
    auto names = [&](std::string_view what, const std::vector<std::size_t>& ids) {
        if (ids.empty()) return;
        s += message("\n", what, ":");
        for (std::size_t n : ids) {
            const std::string labels = output_labels(v, n);
            s += message(" ", labels.empty() ? op_text(v, n) : labels);
        }
    };
    names("reduces", lp.reductions);
    names("materializes", lp.materialized);
    names("saves", lp.saved);
    names("stores", lp.stores);
    return s;
}

[[gnu::cold]] inline std::string to_dot_view(const step_view& v) {
    std::vector<std::vector<std::size_t>> loops_of(v.size());
    for (std::size_t l = 0; l < v.joint.loops.size(); ++l) {
        const loop_view& lp = v.joint.loops[l];
        for (const auto* part : {&lp.body, &lp.reductions, &lp.materialized, &lp.saved, &lp.stores})
            for (std::size_t n : *part)
                if (loops_of[n].empty() || loops_of[n].back() != l) loops_of[n].push_back(l);
    }

    std::string out = "digraph typegrad {\n";
    out += "  graph [fontname=\"Helvetica\", fontsize=12, newrank=true, nodesep=0.3, ranksep=0.4];\n";
    out += "  node [fontname=\"Helvetica\", fontsize=10, shape=box, color=\"#444444\"];\n";
    out += "  edge [color=\"#666666\", arrowsize=0.6];\n";
    auto cluster = [&](std::string_view name, std::string_view label, std::string_view colour, bool forward) {
        out += message("  subgraph ", name, " {\n");
        out += message("    label=", dot_quote(label), "; labeljust=l; style=rounded; color=\"", colour,
                   "\"; fontcolor=\"", colour, "\";\n");
        for (std::size_t n = 0; n < v.size(); ++n)
            if (v.listed[n] && bool(v.forward[n]) == forward) out += dot_node(v, n, loops_of);
        out += "  }\n";
    };
    cluster("cluster_forward", "forward", "#1f77b4", true);
    cluster("cluster_backward", "backward", "#e6550d", false);

    out += "  subgraph cluster_plan {\n";
    std::string plan_title =
        message("value_and_grad: ", count_text(v.joint.loops.size(), "fused loop", "fused loops"));
    if (!v.joint.kernels.empty())
        plan_title += message(", ", count_text(v.joint.kernels.size(), "kernel", "kernels"));
    out += message("    label=", dot_quote(plan_title),
               "; labeljust=l; style=rounded; color=\"#555555\"; fontcolor=\"#555555\";\n");
    for (std::size_t l = 0; l < v.joint.loops.size(); ++l)
        out += message("    loop", std::to_string(l), " [shape=note, style=filled, fillcolor=\"", loop_colour(l),
                   "\", label=", dot_quote(loop_summary(v, v.joint.loops[l], l)), "];\n");
    out += message("    key [shape=plaintext, fontsize=9, label=",
               dot_quote("fill: the loop(s) computing a node\ngrey: outside the loops (3-D: kernel)\n"
                         "dashed: recomputed by the backward\nred: saved for the backward\n"
                         "double border: gradient or loss"),
               "];\n");
    // Stack the loop boxes in execution order under the key.
    for (std::size_t l = 0; l < v.joint.loops.size(); ++l)
        out += message("    ", l ? message("loop", std::to_string(l - 1)) : std::string("key"), " -> loop",
                   std::to_string(l), " [style=invis];\n");
    out += "  }\n";

    // Edges child -> parent; a shape-only operand (expand's `like`) is a dashed, hollow arrow.
    constexpr std::string_view shape_edge =
        " [style=dashed, color=\"#aaaaaa\", arrowhead=empty, tooltip=\"shape only\"];\n";
    for (std::size_t n = 0; n < v.size(); ++n) {
        if (!v.listed[n]) continue;
        const node_info& ni = v.info[n];
        for (std::size_t c = 0; c < ni.arity; ++c)
            out += message("  n", std::to_string(ni.child[c]), " -> n", std::to_string(n),
                       ni.shape_only[c] ? shape_edge : ";\n");
    }
    out += "}\n";
    return out;
}

}  // namespace detail

// The step as Graphviz source (render with `dot -Tpng`; docs/inspection.md).
template <inspectable_step Step>
std::string to_dot(const Step&) {
    return detail::to_dot_view(detail::make_step_view<Step>());
}

}  // namespace typegrad
