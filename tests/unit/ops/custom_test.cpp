// Custom ops and mutations in the backward (AOTAutograd PR #128409 semantics), with exact values.
#include <check_gradient.hpp>

namespace tg = typegrad;

namespace {
constexpr auto a = tg::param<"a", float, tg::shape<3, 3>>;
constexpr auto b = tg::param<"b", float, tg::shape<3, 3>>;

// F(x) = x; its backward doubles x in place (a data mutation of a forward input) and passes g.
struct double_input_in_backward {
    static constexpr auto backward_mutates = tg::mutates(tg::data<0>);
    template <class Ctx>
    static void forward(Ctx& ctx) {
        auto out = ctx.output();
        auto [x] = ctx.inputs();
        for (std::size_t i = 0; i < out.size(); ++i) out[i] = x[i];
    }
    template <class Ctx>
    static void backward(Ctx& ctx) {
        auto [x] = ctx.inputs();
        for (auto& v : x) v *= 2;
        auto g = ctx.grad_output();
        auto [gx] = ctx.grad_inputs();
        for (std::size_t i = 0; i < g.size(); ++i) gx[i] = g[i];
    }
};

// y = x + (x2 *= 5); the backward zeroes x1. Inputs: x, x1, x2.
struct scale_then_zero {
    static constexpr auto forward_mutates = tg::mutates(tg::data<2>);
    static constexpr auto backward_mutates = tg::mutates(tg::data<1>);
    template <class Ctx>
    static void forward(Ctx& ctx) {
        auto [x, x1, x2] = ctx.inputs();
        (void)x1;
        auto y = ctx.output();
        for (std::size_t i = 0; i < y.size(); ++i) {
            x2[i] *= 5;
            y[i] = x[i] + x2[i];
        }
    }
    template <class Ctx>
    static void backward(Ctx& ctx) {
        auto [x, x1, x2] = ctx.inputs();
        (void)x;
        (void)x2;
        for (auto& v : x1) v = 0;
        auto g = ctx.grad_output();
        auto [gx, gx1, gx2] = ctx.grad_inputs();  // x1, x2 need no gradient: left at 0
        (void)gx1;
        (void)gx2;
        for (std::size_t i = 0; i < g.size(); ++i) gx[i] = g[i];
    }
};

// Identity whose backward doubles its (own copy of the) incoming gradient.
struct double_grad_output {
    static constexpr auto backward_mutates = tg::mutates(tg::grad_output_data);
    template <class Ctx>
    static void forward(Ctx& ctx) {
        auto out = ctx.output();
        auto [x] = ctx.inputs();
        for (std::size_t i = 0; i < out.size(); ++i) out[i] = x[i];
    }
    template <class Ctx>
    static void backward(Ctx& ctx) {
        auto g = ctx.grad_output();
        for (auto& v : g) v *= 2;
        auto [gx] = ctx.grad_inputs();
        for (std::size_t i = 0; i < g.size(); ++i) gx[i] = g[i];
    }
};

// A straight-through estimator: round in the forward, identity gradient; expression VJP, so it
// composes with higher order.
struct straight_through_round {
    template <class Ctx>
    static void forward(Ctx& ctx) {
        auto out = ctx.output();
        auto [x] = ctx.inputs();
        for (std::size_t i = 0; i < out.size(); ++i) out[i] = std::round(x[i]);
    }
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X) { return g; }
};

// round(x), declared to carry no gradient (ctx.mark_non_differentiable): no backward, no vjp.
struct rounded_no_grad {
    static constexpr bool differentiable = false;
    template <class Ctx>
    static void forward(Ctx& ctx) {
        auto out = ctx.output();
        auto [x] = ctx.inputs();
        for (std::size_t i = 0; i < out.size(); ++i) out[i] = std::round(x[i]);
    }
};
}  // namespace

TEST_CASE("a backward that mutates a forward input: f(a, b) = a * F(b)", "[custom][mutation]") {
    std::vector<float> ad(9, 1.f), bd(9, 1.f), ga(9), gb(9);
    auto step = tg::compile(tg::sum(a * tg::custom<double_input_in_backward>(b)), tg::wrt(a, b));
    auto ctx = step.forward(tg::bind(a, ad), tg::bind(b, bd));
    CHECK(ctx.value() == 9.f);
    CHECK(bd == std::vector<float>(9, 1.f));  // untouched by the forward
    step.backward(ctx, tg::grad_into(a, ga), tg::grad_into(b, gb));
    CHECK(bd == std::vector<float>(9, 2.f));  // mutated by the backward, in the caller's buffer
    CHECK(ga == std::vector<float>(9, 1.f));
    CHECK(gb == std::vector<float>(9, 1.f));
}

TEST_CASE("forward and backward mutations of different inputs", "[custom][mutation]") {
    constexpr auto x = tg::param<"x", float, tg::shape<3>>;
    constexpr auto x1 = tg::input<"x1", float, tg::shape<3>>;
    constexpr auto x2 = tg::input<"x2", float, tg::shape<3>>;
    std::vector<float> xd{1, 2, 3}, x1d{4, 5, 6}, x2d{1, 1, 1}, gx(3);
    auto y = tg::custom<scale_then_zero>(x, x1, x2);
    auto step = tg::compile(tg::sum(y) * tg::lit<2>, tg::wrt(x));
    auto values = tg::compile(y, tg::wrt(x)).forward(tg::bind(x, xd), tg::bind(x1, x1d), tg::bind(x2, x2d));
    CHECK(std::vector<float>(values.values().begin(), values.values().end()) == std::vector<float>{6, 7, 8});
    CHECK(x2d == std::vector<float>{5, 5, 5});
    x2d = {1, 1, 1};
    auto ctx = step.forward(tg::bind(x, xd), tg::bind(x1, x1d), tg::bind(x2, x2d));
    CHECK(ctx.value() == 2.f * (6 + 7 + 8));
    CHECK(x2d == std::vector<float>{5, 5, 5});
    step.backward(ctx, tg::grad_into(x, gx));
    CHECK(x1d == std::vector<float>{0, 0, 0});
    CHECK(gx == std::vector<float>{2, 2, 2});
    CHECK(x2d == std::vector<float>{5, 5, 5});  // the forward ran once: saved, not recomputed
}

TEST_CASE("mutating the incoming gradient stays local to the backward", "[custom][mutation]") {
    std::vector<float> ad(9, 1.f), bd(9, 1.f), ga(9), gb(9);
    auto loss = tg::sum(tg::custom<double_grad_output>(a * b)) * tg::lit<2>;
    tg::compile(loss, tg::wrt(a, b)).value_and_grad(tg::bind(a, ad), tg::bind(b, bd), tg::grad_into(a, ga), tg::grad_into(b, gb));
    CHECK(ga == std::vector<float>(9, 4.f));
    CHECK(gb == std::vector<float>(9, 4.f));
}

TEST_CASE("custom ops compose with fused neighbours and higher order", "[custom]") {
    constexpr auto v = tg::param<"v", double, tg::shape<4>>;
    std::vector<double> vd{0.2, 1.7, -0.6, 2.4}, g(4);
    auto r = tg::custom<straight_through_round>(v);
    const double l = tg::compile(tg::sum(tg::exp(v) * r), tg::wrt(v)).value_and_grad(tg::bind(v, vd), tg::grad_into(v, g));
    double expect = 0;
    for (int i = 0; i < 4; ++i) expect += std::exp(vd[i]) * std::round(vd[i]);
    CHECK_THAT(l, Catch::Matchers::WithinRel(expect, 1e-14));
    for (int i = 0; i < 4; ++i) CHECK_THAT(g[i], Catch::Matchers::WithinRel(std::exp(vd[i]) * (std::round(vd[i]) + 1), 1e-14));
    // grad of grad through the expression VJP: d/dv sum(grad) = sum(exp(v) (round(v) + 2))
    auto gg = tg::sum(tg::grad(tg::sum(tg::exp(v) * r), v));
    std::vector<double> h(4);
    tg::compile(gg, tg::wrt(v)).value_and_grad(tg::bind(v, vd), tg::grad_into(v, h));
    for (int i = 0; i < 4; ++i) CHECK_THAT(h[i], Catch::Matchers::WithinRel(std::exp(vd[i]) * (std::round(vd[i]) + 2), 1e-14));
}

TEST_CASE("a custom op declared not differentiable: its value flows, no gradient, its input needs no detach",
          "[custom]") {
    constexpr auto v = tg::param<"v", double, tg::shape<4>>;
    auto r = tg::custom<rounded_no_grad>(v);
    STATIC_REQUIRE(decltype(v)::requires_grad);
    STATIC_REQUIRE_FALSE(decltype(r)::requires_grad);
    std::vector<double> vd{0.2, 1.7, -0.6, 2.4}, g(4);
    // d/dv sum(v^2 + v round(v)) with round(v) held constant: 2 v + round(v)
    const double l = tg::compile(tg::sum(v * v + v * r), tg::wrt(v)).value_and_grad(tg::bind(v, vd), tg::grad_into(v, g));
    double expect = 0;
    for (int i = 0; i < 4; ++i) expect += vd[i] * vd[i] + vd[i] * std::round(vd[i]);
    CHECK_THAT(l, Catch::Matchers::WithinRel(expect, 1e-14));
    for (int i = 0; i < 4; ++i) CHECK_THAT(g[i], Catch::Matchers::WithinRel(2 * vd[i] + std::round(vd[i]), 1e-15));
}

TEST_CASE("a custom op rejects a strided input before writing, and takes tg::contiguous of it", "[custom][errors]") {
    constexpr auto m = tg::param<"m", double, tg::shape<2, 3>>;
    std::vector<double> md{0.2, 1.7, -0.6, 2.4, 3.1, -1.2}, g(6, 7.0);
    auto strided = tg::compile(tg::sum(tg::custom<straight_through_round>(tg::transpose(m))), tg::wrt(m));
    CHECK_THROWS_AS(strided.value_and_grad(tg::bind(m, md), tg::grad_into(m, g)), tg::shape_error);
    CHECK_THROWS_WITH(strided.value_and_grad(tg::bind(m, md), tg::grad_into(m, g)),
                      Catch::Matchers::Contains("custom op's inputs must be dense"));
    CHECK(g == std::vector<double>(6, 7.0));
    auto dense = tg::compile(tg::sum(tg::custom<straight_through_round>(tg::contiguous(tg::transpose(m)))), tg::wrt(m));
    double expect = 0;
    for (double x : md) expect += std::round(x);
    CHECK(dense.value_and_grad(tg::bind(m, md), tg::grad_into(m, g)) == expect);
    CHECK(g == std::vector<double>(6, 1.0));
}

TEST_CASE("create_graph with a mutating backward is rejected at run time; the check is free otherwise", "[custom][mutation]") {
    std::vector<float> ad(9, 1.f), bd(9, 1.f), ga(9), gb(9);
    auto step = tg::compile(tg::sum(a * tg::custom<double_input_in_backward>(b)), tg::wrt(a, b));
    // b requires grad and is mutated by the backward: exactly one hazard, known at compile time
    STATIC_REQUIRE(decltype(step)::create_graph_hazard_count<false, std::remove_const_t<decltype(a)>::node_type,
                                                             std::remove_const_t<decltype(b)>::node_type>() == 1);
    auto ctx = step.forward(tg::bind(a, ad), tg::bind(b, bd));
    CHECK_THROWS_AS(step.backward(ctx, tg::grad_into(a, ga), tg::grad_into(b, gb), tg::create_graph), tg::mutation_error);
    CHECK(bd == std::vector<float>(9, 1.f));  // the mutation did not happen
    CHECK(ga == std::vector<float>(9, 0.f));
    // without mutations the list is empty and the check compiles to nothing
    auto plain = tg::compile(tg::sum(a * b), tg::wrt(a, b));
    STATIC_REQUIRE(decltype(plain)::create_graph_hazard_count<false, std::remove_const_t<decltype(a)>::node_type>() == 0);
    auto c2 = plain.forward(tg::bind(a, ad), tg::bind(b, bd));
    plain.backward(c2, tg::grad_into(a, ga), tg::create_graph);
    CHECK(ga == std::vector<float>(9, 1.f));
}

TEST_CASE("errors leave every buffer untouched, mutated inputs included", "[custom][mutation][errors]") {
    const std::vector<float> ro(9, 1.f);
    std::vector<float> ad(9, 1.f), ga(9, 3.f), gb(9, 3.f);
    auto step = tg::compile(tg::sum(a * tg::custom<double_input_in_backward>(b)), tg::wrt(a, b));
    // b is mutated by the backward but bound read-only
    CHECK_THROWS_AS(step.value_and_grad(tg::bind(a, ad), tg::bind(b, ro), tg::grad_into(a, ga), tg::grad_into(b, gb)),
                    tg::binding_error);
    CHECK(ro == std::vector<float>(9, 1.f));
    CHECK(ga == std::vector<float>(9, 3.f));
    // a wrong-sized gradient buffer: nothing runs, b is not doubled
    std::vector<float> bd(9, 1.f), small(4, 3.f);
    CHECK_THROWS_AS(step.value_and_grad(tg::bind(a, ad), tg::bind(b, bd), tg::grad_into(a, small)), tg::shape_error);
    CHECK(bd == std::vector<float>(9, 1.f));
    CHECK(small == std::vector<float>(4, 3.f));
}

namespace {
// y = x / max(x), the scale treated as a constant (a "stop-gradient" normaliser). The forward
// saves the scale and the argmax in ctx; the backward reads them instead of recomputing.
struct normalise_by_max {
    struct saved_type {
        float scale;
        std::size_t argmax;
    };
    template <class Ctx>
    static void forward(Ctx& ctx) {
        auto [x] = ctx.inputs();
        auto& s = ctx.saved();
        s.argmax = 0;
        for (std::size_t i = 1; i < x.size(); ++i)
            if (x[i] > x[s.argmax]) s.argmax = i;
        s.scale = x[s.argmax];
        auto y = ctx.output();
        for (std::size_t i = 0; i < y.size(); ++i) y[i] = x[i] / s.scale;
    }
    template <class Ctx>
    static void backward(Ctx& ctx) {
        const auto& s = ctx.saved();
        static_assert(std::is_const_v<std::remove_reference_t<decltype(s)>>, "read-only in backward");
        auto g = ctx.grad_output();
        auto [gx] = ctx.grad_inputs();
        for (std::size_t i = 0; i < g.size(); ++i) gx[i] = g[i] / s.scale + (i == s.argmax ? 1000.0f : 0.0f);
    }
};
}  // namespace

TEST_CASE("custom op: values saved in ctx reach the backward", "[custom]") {
    constexpr auto x = tg::param<"x", float, tg::shape<tg::dyn>>;
    constexpr auto w = tg::input<"w", float, tg::shape<tg::dyn>>;
    auto step = tg::compile(tg::sum(tg::custom<normalise_by_max>(x) * w), tg::wrt(x));
    const std::vector<float> xs{1, 4, 2, -8}, ws{1, 2, 3, 4};
    std::vector<float> gx(4);
    const float v = step.value_and_grad(tg::bind(x, xs), tg::bind(w, ws), tg::grad_into(x, gx));
    CHECK(v == 1.0f / 4 + 2.0f + 3.0f * 2 / 4 + 4.0f * -8 / 4);
    // the marker 1000 proves the backward read the saved argmax (index 1), not a recomputation
    CHECK(gx == std::vector<float>{0.25f, 0.5f + 1000.0f, 0.75f, 1.0f});
    // split forward / backward: the saved values travel in the forward context
    const std::vector<float> x2{3, 1, 6, 2, 5};
    const std::vector<float> w2{1, 1, 1, 1, 1};
    auto ctx = step.forward(tg::bind(x, x2), tg::bind(w, w2));
    std::vector<float> g2(5);
    step.backward(ctx, tg::grad_into(x, g2));
    CHECK(g2 == std::vector<float>{1.0f / 6, 1.0f / 6, 1.0f / 6 + 1000.0f, 1.0f / 6, 1.0f / 6});
}

TEST_CASE("describe() and to_dot() show the mutations a custom op declares", "[custom][mutation][describe]") {
    constexpr auto x = tg::param<"x", float, tg::shape<3>>;
    constexpr auto x1 = tg::input<"x1", float, tg::shape<3>>;
    constexpr auto x2 = tg::input<"x2", float, tg::shape<3>>;
    auto step = tg::compile(tg::sum(tg::custom<scale_then_zero>(x, x1, x2)), tg::wrt(x));
    const std::string text = tg::describe(step);
    INFO(text);
    // on the forward node: both; on the backward node, where the backward's write happens: its own
    CHECK(text.find("[forward mutates input 2 (data); backward mutates input 1 (data)]") != std::string::npos);
    CHECK(text.find("[backward mutates input 1 (data)]") != std::string::npos);
    const std::string dot = tg::to_dot(step);
    CHECK(dot.find("forward mutates input 2 (data); backward mutates input 1 (data)") != std::string::npos);
    CHECK(dot.find("color=\"#c62828\"") != std::string::npos);

    auto local = tg::compile(tg::sum(tg::custom<double_grad_output>(x)), tg::wrt(x));
    CHECK(tg::describe(local).find("backward mutates its copy of grad_output") != std::string::npos);
    // an op without mutations shows none
    auto plain = tg::compile(tg::sum(tg::custom<straight_through_round>(x)), tg::wrt(x));
    CHECK(tg::describe(plain).find("mutates") == std::string::npos);
    CHECK(tg::to_dot(plain).find("#c62828") == std::string::npos);
}
