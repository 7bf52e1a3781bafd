// Inspecting a compiled step: tg::describe prints the forward graph, what the gradient adds and
// the fused loops; tg::to_dot draws the same as a Graphviz graph (rendered to graph.png next to
// this binary when `dot` is installed). TYPEGRAD_LOG=graphs prints describe() on a first call.
#include <typegrad/typegrad.hpp>
#include <typegrad/inspect/describe.hpp>
#include <typegrad/inspect/dot.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace tg = typegrad;

// A tiny scorer: tanh(x * W + b) per sample and feature, pooled by log-sum-exp, plus a weight
// penalty. x has a run-time number of rows.
constexpr auto W = tg::param<"W", float, tg::shape<4>>;
constexpr auto b = tg::param<"b", float>;
constexpr auto x = tg::input<"x", float, tg::shape<tg::dyn, 4>>;

namespace {
bool contains(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }

bool check(bool ok, const char* what) {
    if (!ok) std::fprintf(stderr, "inspect: FAILED: %s\n", what);
    return ok;
}
}  // namespace

int main(int, char** argv) {
    auto loss = tg::log_sum_exp(tg::tanh(x * W + b)) + tg::lit<0.1> * tg::mean(tg::square(W));
    auto step = tg::compile(loss, tg::wrt(W, b));

    // The step runs as usual; inspection only reads its type.
    std::vector<float> wd{0.5f, -0.25f, 1.0f, 0.75f}, xd(3 * 4), gw(4);
    float bd = 0.1f, gb = 0.0f;
    for (std::size_t i = 0; i < xd.size(); ++i) xd[i] = 0.1f * float(i) - 0.5f;
    const float value = step.value_and_grad(tg::bind(W, wd), tg::bind(b, &bd, {}), tg::bind(x, xd, {3, 4}),
                                            tg::grad_into(W, gw), tg::grad_into(b, &gb, 1));
    std::printf("loss %.6f  dloss/db %.6f\n\n", double(value), double(gb));

    const std::string text = tg::describe(step);
    std::fputs(text.c_str(), stdout);

    const std::string dot = tg::to_dot(step);
    const std::filesystem::path dir = std::filesystem::absolute(argv[0]).parent_path();
    const std::filesystem::path dot_file = dir / "inspect_graph.dot";
    std::ofstream(dot_file) << dot;
    std::printf("\nDOT written to %s\n", dot_file.c_str());

    bool ok = check(std::isfinite(value) && std::isfinite(gb), "finite loss and gradient");
    ok &= check(contains(text, "forward graph (") && contains(text, "backward graph (") &&
                    contains(text, "kernel plan: value_and_grad (") && contains(text, "kernel plan: forward ("),
                "describe() has its sections");
    ok &= check(contains(text, "= param W") && contains(text, "= param b") && contains(text, "= input x"),
                "describe() names the leaves");
    ok &= check(contains(text, "[grad of W]") && contains(text, "[grad of b]") && contains(text, "[loss]"),
                "describe() labels the gradients and the loss");
    ok &= check(contains(text, "[saved]") && contains(text, "[recomputed]"),
                "describe() marks saved and recomputed forward values");
    ok &= check(contains(dot, "subgraph cluster_forward") && contains(dot, "subgraph cluster_backward"),
                "the DOT has both clusters");

    // Render only where Graphviz is installed; a failing `dot` is a failure.
    if (std::system("command -v dot > /dev/null 2>&1") == 0) {
        const std::filesystem::path png = dir / "graph.png";
        std::string cmd = "dot -Tpng \"";
        cmd.append(dot_file.string()).append("\" -o \"").append(png.string()).append("\"");
        ok &= check(std::system(cmd.c_str()) == 0 && std::filesystem::file_size(png) > 0, "dot renders the graph");
        std::printf("rendered %s\n", png.c_str());
    } else {
        std::printf("dot not found; skipped rendering\n");
    }
    return ok ? 0 : 1;
}
