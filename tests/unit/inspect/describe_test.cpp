// tg::describe and tg::to_dot: the structure they report matches the step's plans.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <typegrad/typegrad.hpp>
#include <typegrad/inspect/describe.hpp>
#include <typegrad/inspect/dot.hpp>

namespace tg = typegrad;

namespace {

bool contains(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }

// The lines of the section that starts with `header` (up to the next blank line).
std::vector<std::string> section(const std::string& text, std::string_view header) {
    std::istringstream in(text);
    std::vector<std::string> lines;
    std::string line;
    bool inside = false;
    while (std::getline(in, line)) {
        if (!inside) {
            inside = line.rfind(header, 0) == 0;
            continue;
        }
        if (line.empty()) break;
        lines.push_back(line);
    }
    return lines;
}

// The one line of `lines` containing `part` ("" when none or several).
std::string line_with(const std::vector<std::string>& lines, std::string_view part) {
    std::string hit;
    int count = 0;
    for (const auto& l : lines)
        if (contains(l, part)) hit = l, ++count;
    return count == 1 ? hit : std::string();
}

bool braces_balanced(const std::string& dot) {
    long depth = 0;
    bool quoted = false;
    for (std::size_t i = 0; i < dot.size(); ++i) {
        const char c = dot[i];
        if (quoted) {
            if (c == '\\') ++i;
            else if (c == '"') quoted = false;
            continue;
        }
        if (c == '"') quoted = true;
        else if (c == '{') ++depth;
        else if (c == '}' && --depth < 0) return false;
    }
    return depth == 0 && !quoted;
}

bool have_dot() { return std::system("command -v dot > /dev/null 2>&1") == 0; }

// Runs `dot -Tsvg` on the text; true when Graphviz accepts it.
bool dot_accepts(const std::string& dot) {
    static std::atomic<int> counter{0};
    const auto dir = std::filesystem::temp_directory_path();
    std::string stem = "typegrad_describe_test_";
    stem.append(std::to_string(std::random_device{}())).append("_").append(std::to_string(counter++));
    const auto in = dir / (stem + ".dot");
    const auto out = dir / (stem + ".svg");
    std::ofstream(in) << dot;
    std::string cmd = "dot -Tsvg \"";
    cmd.append(in.string()).append("\" -o \"").append(out.string()).append("\" 2>&1");
    const bool ok = std::system(cmd.c_str()) == 0 && std::filesystem::file_size(out) > 0;
    std::filesystem::remove(in);
    std::filesystem::remove(out);
    return ok;
}

// An identity op that carries inspection extras, as a hook op would.
struct tagged_op : tg::detail::elementwise_op {
    static constexpr const char* name = "tagged";
    template <class V> static V apply(const V& a) { return a; }
    template <std::size_t I, class G, class Out, class A>
    static constexpr auto vjp(G g, Out, A) { return g; }
    static std::string describe_extra() { return "hook: probe"; }
    static std::string dot_attributes() { return "color=\"#7b1fa2\""; }
};

// A kernel-kind op (its own routine, like matmul). Only planned here, never run.
struct twice_op {
    static constexpr tg::op_kind kind = tg::op_kind::kernel;
    static constexpr const char* name = "twice";
    static constexpr bool differentiable = true;
    static constexpr bool shape_only(std::size_t) { return false; }
    template <class X>
    struct rule {
        using value_type = typename X::value_type;
        using shape_type = typename X::shape_type;
    };
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X) { return g * tg::lit<2>; }
};

}  // namespace

TEST_CASE("describe: sum(exp(x) * y) fuses forward and backward into one loop", "[inspect]") {
    constexpr auto x = tg::param<"x", float, tg::shape<1000>>;
    constexpr auto y = tg::input<"y", float, tg::shape<1000>>;
    const auto step = tg::compile(tg::sum(tg::exp(x) * y), tg::wrt(x));
    const std::string text = tg::describe(step);
    INFO(text);

    CHECK(contains(text, "typegrad step: loss %4 sum (f32 []), wrt x (%0)"));
    const auto fwd = section(text, "forward graph (5 nodes)");
    REQUIRE(fwd.size() == 5);
    CHECK(contains(fwd[0], "%0 = param x"));
    CHECK(contains(fwd[0], "f32 [1000]"));
    CHECK(contains(fwd[1], "%1 = exp(%0)"));
    CHECK(contains(fwd[2], "%2 = input y"));
    CHECK(contains(fwd[3], "%3 = mul(%1, %2)"));
    CHECK(contains(fwd[4], "%4 = sum(%3)"));
    CHECK(contains(fwd[4], "[loss]"));

    const auto bwd = section(text, "backward graph (");
    CHECK(contains(text, "backward graph (1 new node; from the forward graph: 0 saved, 1 recomputed, 2 read as is)"));
    CHECK(contains(line_with(bwd, "= exp(%0)"), "[recomputed]"));
    CHECK(contains(line_with(bwd, "= param x"), "[leaf]"));
    CHECK(contains(line_with(bwd, "= input y"), "[leaf]"));
    CHECK(line_with(bwd, "= sum(").empty());  // the loss is not read by its own gradient
    CHECK(line_with(bwd, "[saved]").empty());
    const std::string grad = line_with(bwd, "[grad of x]");
    CHECK(contains(grad, "= mul(%2, %1)"));
    CHECK(contains(grad, "f32 [1000]"));

    CHECK(contains(text, "kernel plan: value_and_grad (1 loop)"));
    CHECK(contains(text, "kernel plan: forward (1 loop)"));
    const auto joint = section(text, "kernel plan: value_and_grad");
    CHECK(contains(line_with(joint, "loop 0:"), "stage 0, over [1000]"));
    CHECK(contains(line_with(joint, "reads:"), "%0 x, %2 y"));
    CHECK(contains(line_with(joint, "fused:"), "%1 exp"));
    CHECK(contains(line_with(joint, "reduces:"), "%4 sum (loss)"));
    CHECK(contains(line_with(joint, "stores:"), "(grad of x)"));
}

TEST_CASE("describe: log_sum_exp lists its saved reductions and loops", "[inspect]") {
    constexpr auto x = tg::param<"x", double, tg::shape<tg::dyn>>;
    using step_t = decltype(tg::compile(tg::log_sum_exp(x), tg::wrt(x)));
    const std::string text = tg::describe(step_t{});
    INFO(text);

    CHECK(contains(section(text, "forward graph (")[0], "f64 [dyn]"));
    const auto bwd = section(text, "backward graph (");
    CHECK(contains(text, "from the forward graph: 2 saved"));
    CHECK(contains(line_with(bwd, "= max(%1)"), "[saved]"));
    CHECK(contains(line_with(bwd, "= sum(%6)"), "[saved]"));
    CHECK(contains(line_with(bwd, "= exp(%5)"), "[recomputed]"));
    CHECK(contains(line_with(bwd, "[grad of x]"), "f64 [dyn]"));

    // Forward: the max, the shifted sum, then the scalar tail. The joint plan is what the
    // planner says it is (its count is checked against the plan, not hard-coded).
    CHECK(contains(text, "kernel plan: forward (3 loops)"));
    const auto fwd = section(text, "kernel plan: forward");
    CHECK(contains(line_with(fwd, "loop 0:"), "stage 0"));
    CHECK(contains(line_with(fwd, "stores:"), "(loss)"));
    constexpr std::size_t joint_loops = step_t::plans<>::joint::plan.loop_count;
    STATIC_REQUIRE(joint_loops >= 3);
    std::string joint_header = "kernel plan: value_and_grad (";
    joint_header.append(std::to_string(joint_loops)).append(" loops)");
    CHECK(contains(text, joint_header));
    const auto joint = section(text, "kernel plan: value_and_grad");
    std::size_t loop_lines = 0, reduce_max = 0, reduce_sum = 0, grad_stores = 0;
    for (const auto& l : joint) {
        loop_lines += l.rfind("  loop ", 0) == 0;
        reduce_max += contains(l, "reduces:") && contains(l, "%2 max");
        reduce_sum += contains(l, "reduces:") && contains(l, "%7 sum");
        grad_stores += contains(l, "stores:") && contains(l, "(grad of x)");
    }
    CHECK(loop_lines == joint_loops);
    CHECK(reduce_max == 1);
    CHECK(reduce_sum == 1);
    CHECK(grad_stores == 1);
    // value_and_grad saves exp(x - max) in the sum's loop and the gradient's loop reads it; the
    // forward plan alone recomputes nothing later and saves nothing
    std::size_t saves_exp = 0, reads_exp = 0;
    for (const auto& l : joint) {
        saves_exp += contains(l, "saves:") && contains(l, "%6 exp");
        reads_exp += contains(l, "reads:") && contains(l, "%6 exp");
    }
    CHECK(saves_exp == 1);
    CHECK(reads_exp == 1);
    for (const auto& l : fwd) CHECK_FALSE(contains(l, "saves:"));
}

TEST_CASE("describe: several wrt leaves, each gradient labelled", "[inspect]") {
    constexpr auto W = tg::param<"W", double, tg::shape<tg::dyn, 4>>;
    constexpr auto b = tg::param<"b", double, tg::shape<4>>;
    const auto step = tg::compile(tg::mean(tg::square(W + b)) + tg::lit<0.5>, tg::wrt(W, b));
    const std::string text = tg::describe(step);
    INFO(text);
    CHECK(contains(text, "wrt W (%0), b (%1)"));
    const auto bwd = section(text, "backward graph (");
    CHECK(contains(line_with(bwd, "[grad of W]"), "f64 [dyn, 4]"));
    CHECK(contains(line_with(bwd, "[grad of b]"), "f64 [4]"));
    CHECK(contains(text, "constant 0.5"));
    CHECK(contains(line_with(bwd, "= inv_count(shape=%3)"), "[recomputed]"));
}

TEST_CASE("describe: op extras (the hook extension point)", "[inspect]") {
    STATIC_REQUIRE(std::is_same_v<decltype(tg::detail::describe_node_extra<tg::detail::exp_op>::text()), std::string>);
    CHECK(tg::detail::describe_node_extra<tg::detail::exp_op>::text().empty());
    CHECK(tg::detail::describe_node_extra<tg::detail::exp_op>::dot_attributes().empty());

    constexpr auto x = tg::param<"x", float, tg::shape<8>>;
    const auto step = tg::compile(tg::sum(tg::detail::make_node<tagged_op>(tg::exp(x))), tg::wrt(x));
    const std::string text = tg::describe(step);
    INFO(text);
    CHECK(contains(line_with(section(text, "forward graph ("), "= tagged(%1)"), "[hook: probe]"));
    const std::string dot = tg::to_dot(step);
    CHECK(contains(dot, "tagged\\nf32 [8]\\nhook: probe"));
    CHECK(contains(dot, "color=\"#7b1fa2\""));
}

TEST_CASE("describe: kernels are scheduled per stage and saved for the backward", "[inspect]") {
    constexpr auto x = tg::param<"x", float, tg::shape<tg::dyn>>;
    const auto step = tg::compile(tg::sum(tg::tanh(tg::detail::make_node<twice_op>(x))), tg::wrt(x));
    const std::string text = tg::describe(step);
    INFO(text);
    CHECK(contains(line_with(section(text, "backward graph ("), "= twice(%0)"), "[saved]"));
    const auto joint = section(text, "kernel plan: value_and_grad");
    CHECK(contains(text, "kernel plan: forward (1 loop, 1 kernel)"));
    CHECK(contains(line_with(joint, "kernel %1 = twice(%0)"), "stage 0, f32 [dyn]"));
    CHECK(contains(line_with(joint, "loop 0:"), "stage 0"));
    CHECK(joint[0].rfind("  kernel %1", 0) == 0);  // a stage's kernels run before its loops
    const std::string dot = tg::to_dot(step);
    CHECK(contains(dot, "shape=box3d"));
    if (have_dot()) CHECK(dot_accepts(dot));
}

TEST_CASE("to_dot: clusters, edges, highlights; Graphviz accepts it", "[inspect][dot]") {
    constexpr auto x = tg::param<"x", float, tg::shape<tg::dyn>>;
    constexpr auto y = tg::input<"y", float, tg::shape<tg::dyn>>;
    const auto simple = tg::compile(tg::sum(tg::exp(x) * y), tg::wrt(x));
    const auto lse = tg::compile(tg::log_sum_exp(x * y), tg::wrt(x));
    for (const std::string& dot : {tg::to_dot(simple), tg::to_dot(lse)}) {
        INFO(dot);
        CHECK(dot.rfind("digraph typegrad {", 0) == 0);
        CHECK(braces_balanced(dot));
        CHECK(contains(dot, "subgraph cluster_forward {"));
        CHECK(contains(dot, "subgraph cluster_backward {"));
        CHECK(contains(dot, "subgraph cluster_plan {"));
        CHECK(contains(dot, "label=\"x\\nf32 [dyn]\""));
        CHECK(contains(dot, "n0 -> n"));  // child -> parent: x feeds its consumers
        CHECK(contains(dot, "grad of x\""));
        CHECK(contains(dot, "peripheries=2"));
        if (have_dot()) CHECK(dot_accepts(dot));
    }
    const std::string dot = tg::to_dot(lse);
    CHECK(contains(dot, "saved\", tooltip="));   // the saved reductions' labels end in "saved"
    CHECK(contains(dot, "color=\"#d62728\""));
    CHECK(contains(dot, "dashed"));              // recomputed forward values
    CHECK(contains(dot, "arrowhead=empty"));     // expand's shape-only edge
    if (!have_dot()) WARN("dot not installed: Graphviz syntax not checked");
}

TEST_CASE("TYPEGRAD_LOG parsing", "[inspect]") {
    using tg::detail::log_topic_enabled;
    CHECK_FALSE(log_topic_enabled(nullptr, "graphs"));
    CHECK_FALSE(log_topic_enabled("", "graphs"));
    CHECK(log_topic_enabled("graphs", "graphs"));
    CHECK(log_topic_enabled("all", "graphs"));
    CHECK(log_topic_enabled("kernels,graphs", "graphs"));
    CHECK(log_topic_enabled("kernels graphs", "graphs"));
    CHECK_FALSE(log_topic_enabled("graph", "graphs"));
    CHECK_FALSE(log_topic_enabled("graphsx,kernels", "graphs"));
    // The hook compiles for any step and is callable repeatedly.
    constexpr auto x = tg::param<"x", float>;
    using step_t = decltype(tg::compile(tg::square(x), tg::wrt(x)));
    tg::detail::log_graphs_once<step_t>();
    tg::detail::log_graphs_once<step_t>();
}

TEST_CASE("tg::dyn is written dyn in compile-time shape diagnostics, as in describe()", "[inspect][shape]") {
    // A failing broadcast or matmul check names the shapes through this text in GCC's note
    // (the compiler itself lists tg::dyn in template arguments as 18446744073709551615).
    using tg::detail::shape_text_v;
    STATIC_REQUIRE(std::string_view(shape_text_v<tg::shape<tg::dyn, 3>, true>.text) == "[dyn, 3]");
    STATIC_REQUIRE(std::string_view(shape_text_v<tg::shape<4>, true>.text) == "[4]");
    STATIC_REQUIRE(std::string_view(shape_text_v<tg::shape<>, true>.text) == "[]");
    STATIC_REQUIRE(std::string_view(shape_text_v<tg::shape<tg::dyn - 1, 0, tg::dyn>, true>.text) ==
                   "[18446744073709551614, 0, dyn]");
    // a passing check spells nothing
    STATIC_REQUIRE(std::string_view(shape_text_v<tg::shape<tg::dyn, 3>, false>.text).empty());
}
