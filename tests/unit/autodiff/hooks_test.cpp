// Hooks as graph nodes, post-accumulate hooks, retain_grad, run-time tape segments and dynamic
// shapes without new plans.
#include <check_gradient.hpp>

#include <cmath>
#include <numeric>
#include <string>

namespace tg = typegrad;

namespace {
constexpr auto x = tg::param<"x", float, tg::shape<10, 10>>;
constexpr auto p = tg::param<"p", float, tg::shape<3>>;

// A tensor hook: clip the whole gradient to a global L2 norm of 1.
struct clip_to_unit_norm {
    void operator()(tg::grad_view<float> g) const {
        double n = 0;
        for (float v : g) n += double(v) * v;
        n = std::sqrt(n);
        if (n > 1)
            for (float& v : g) v = float(v / n);
    }
};
}  // namespace

TEST_CASE("an elementwise hook transforms the gradient inside the fused backward", "[hooks]") {
    std::vector<float> xd(100, 1.f), g(100);
    auto step = tg::compile(tg::sum(tg::hook(x, [](auto gr) { return gr + 10; })), tg::wrt(x));
    step.value_and_grad(tg::bind(x, xd), tg::grad_into(x, g));
    CHECK(g == std::vector<float>(100, 11.f));
    // the hook is visible in the backward graph that describe() prints
    const std::string text = tg::describe(step);
    CHECK(text.find("hook(") != std::string::npos);
    // the hook is a node of the gradient's type
    using G = tg::grad_t<decltype(tg::sum(tg::hook(x, [](auto gr) { return gr + 10; }))), decltype(x)>;
    STATIC_REQUIRE(G::node_type::kind == tg::op_kind::elementwise);
}

TEST_CASE("hooks on one node run in registration order; hooks on intermediates", "[hooks]") {
    std::vector<float> pd{1, 2, 3}, g(3);
    auto twice = tg::hook(tg::hook(p, [](auto gr) { return gr + 1; }), [](auto gr) { return gr * 2; });
    tg::compile(tg::sum(twice), tg::wrt(p)).value_and_grad(tg::bind(p, pd), tg::grad_into(p, g));
    CHECK(g == std::vector<float>{4, 4, 4});  // (1 + 1) * 2, not 1 * 2 + 1
    // on an intermediate: d/dp sum(exp(p)) with the gradient into exp(p) doubled
    auto e = tg::hook(tg::exp(p), [](auto gr) { return gr * 2; });
    tg::compile(tg::sum(e), tg::wrt(p)).value_and_grad(tg::bind(p, pd), tg::grad_into(p, g));
    for (int i = 0; i < 3; ++i) CHECK_THAT(g[i], Catch::Matchers::WithinRel(2 * std::exp(pd[i]), 1e-6f));
}

TEST_CASE("a tensor hook sees the whole gradient", "[hooks]") {
    std::vector<float> xd(100, 1.f), g(100);
    auto step = tg::compile(tg::sum(tg::hook(x, clip_to_unit_norm{}) * tg::lit<3>), tg::wrt(x));
    step.value_and_grad(tg::bind(x, xd), tg::grad_into(x, g));
    // every element was 3, the norm 30: clipped to 0.1 each
    for (float v : g) CHECK_THAT(v, Catch::Matchers::WithinRel(0.1f, 1e-6f));
}

TEST_CASE("pre-hook, accumulation, then post-accumulate hook", "[hooks][post]") {
    std::vector<float> pd{1, 1, 1}, g{100, 100, 100};
    auto hooked = tg::post_accumulate_grad_hook(tg::hook(p, [](auto gr) { return gr - 2; }),
                                                [](tg::grad_view<float>, tg::grad_view<float> gr) {
                                                    for (float& v : gr) v += 0.5f;
                                                });
    tg::compile(tg::sum(hooked * tg::lit<5>), tg::wrt(p))
        .value_and_grad(tg::bind(p, pd), tg::grad_into(p, g, tg::accumulate));
    // 5 - 2 = 3 added to 100, then + 0.5
    CHECK(g == std::vector<float>{103.5f, 103.5f, 103.5f});
}

TEST_CASE("a post-accumulate hook can update the param (an optimizer step in the backward)", "[hooks][post]") {
    std::vector<float> pd{0.5f, 0.5f, 0.5f}, g(3), seed{2, 2, 2};
    auto hooked = tg::post_accumulate_grad_hook(p, [](tg::grad_view<float> param, tg::grad_view<float> grad) {
        for (std::size_t i = 0; i < grad.size(); ++i) {
            param[i] *= grad[i];
            grad[i] *= 5;
        }
    });
    auto step = tg::compile(hooked * tg::lit<1>, tg::wrt(p));
    auto ctx = step.forward(tg::bind(p, pd));
    step.backward(ctx, tg::grad_into(p, g), tg::seed(seed));
    CHECK(pd == std::vector<float>{1, 1, 1});
    CHECK(g == std::vector<float>{10, 10, 10});
    // a read-only binding cannot be updated: an error before anything is written
    const std::vector<float> ro{0.5f, 0.5f, 0.5f};
    std::vector<float> g2{7, 7, 7};
    CHECK_THROWS_AS(tg::compile(tg::sum(hooked), tg::wrt(p)).value_and_grad(tg::bind(p, ro), tg::grad_into(p, g2)),
                    tg::binding_error);
    CHECK(g2 == std::vector<float>{7, 7, 7});
}

TEST_CASE("retain_grad exposes an intermediate's gradient", "[hooks][retain]") {
    std::vector<float> xd(100, 1.f), ge(100), gx(100);
    auto e = tg::retain_grad(tg::exp(x));
    tg::compile(tg::sum(e * e), tg::wrt(x)).value_and_grad(tg::bind(x, xd), tg::grad_into(e, ge), tg::grad_into(x, gx));
    CHECK_THAT(ge[0], Catch::Matchers::WithinRel(2 * std::exp(1.f), 1e-6f));
    CHECK_THAT(gx[0], Catch::Matchers::WithinRel(2 * std::exp(2.f), 1e-6f));
}

TEST_CASE("op(x, x).sum() gradients with hooks present stay exact", "[hooks]") {
    std::vector<float> pd{1, 2, 3}, g(3);
    auto hp = tg::hook(p, [](auto gr) { return gr; });
    auto run = [&](auto loss) {
        tg::compile(loss, tg::wrt(p)).value_and_grad(tg::bind(p, pd), tg::grad_into(p, g));
        return g;
    };
    CHECK(run(tg::sum(hp + hp)) == std::vector<float>{2, 2, 2});
    CHECK(run(tg::sum(hp - hp)) == std::vector<float>{0, 0, 0});
    CHECK(run(tg::sum(hp * hp)) == std::vector<float>{2, 4, 6});
    CHECK(run(tg::sum(hp / hp)) == std::vector<float>{0, 0, 0});
}

TEST_CASE("a tape runs one backward through run-time segments", "[tape]") {
    SECTION("x + 10 | + 10 | sum in three segments gives ones") {
        constexpr auto v = tg::param<"v", float, tg::shape<tg::dyn>>;
        auto add10 = tg::compile(v + tg::lit<10>, tg::wrt(v));
        auto total = tg::compile(tg::sum(v), tg::wrt(v));
        std::vector<float> xd{1, 2, 3, 4};
        tg::tape<float> tape;
        auto a = tape.record(add10, v, tg::bind(v, xd));
        auto b = tape.record(add10, v, tg::bind(v, a));
        auto c = tape.record(total, v, tg::bind(v, b));
        CHECK(c[0] == 1 + 2 + 3 + 4 + 80.f);
        CHECK(tape.size() == 3);
        std::vector<float> one{1.f};
        tape.backward(one);
        CHECK(tape.size() == 0);  // saved values freed as the backward passed
        CHECK(std::vector<float>(tape.carried_grad().begin(), tape.carried_grad().end()) == std::vector<float>(4, 1.f));
    }
    SECTION("a recurrent cell applied T times equals the unrolled static graph") {
        constexpr auto h = tg::param<"h", double, tg::shape<4>>;
        constexpr auto xin = tg::input<"x", double, tg::shape<4>>;
        constexpr auto W = tg::param<"W", double, tg::shape<4, 4>>;
        auto cell = tg::compile(tg::tanh(tg::matmul(W, h) + xin), tg::wrt(h, W));
        auto head = tg::compile(tg::sum(tg::square(h)), tg::wrt(h));
        std::vector<double> w(16), h0{0.1, -0.2, 0.3, 0.4}, gw(16, 0.0);
        for (int i = 0; i < 16; ++i) w[i] = 0.1 * ((i * 7) % 5 - 2);
        std::vector<std::vector<double>> xs{{1, 0, 0, 0}, {0, 1, 0, 0}, {0, 0, 1, 0}};
        tg::tape<double> tape;
        std::span<const double> state = h0;
        for (auto& xt : xs)  // T known only at run time
            state = tape.record(cell, h, tg::bind(h, state), tg::bind(xin, xt), tg::bind(W, w), tg::grad_into(W, gw));
        const double l = tape.record(head, h, tg::bind(h, state))[0];
        std::vector<double> one{1.0};
        tape.backward(one);

        constexpr auto x0 = tg::input<"x0", double, tg::shape<4>>;
        constexpr auto x1 = tg::input<"x1", double, tg::shape<4>>;
        constexpr auto x2 = tg::input<"x2", double, tg::shape<4>>;
        auto s3 = tg::tanh(tg::matmul(W, tg::tanh(tg::matmul(W, tg::tanh(tg::matmul(W, h) + x0)) + x1)) + x2);
        std::vector<double> gw2(16), gh2(4);
        const double l2 = tg::compile(tg::sum(tg::square(s3)), tg::wrt(h, W))
                              .value_and_grad(tg::bind(h, h0), tg::bind(x0, xs[0]), tg::bind(x1, xs[1]), tg::bind(x2, xs[2]),
                                              tg::bind(W, w), tg::grad_into(W, gw2), tg::grad_into(h, gh2));
        CHECK_THAT(l, Catch::Matchers::WithinRel(l2, 1e-14));
        for (int i = 0; i < 16; ++i) CHECK_THAT(gw[i], Catch::Matchers::WithinAbs(gw2[i], 1e-14));
        for (int i = 0; i < 4; ++i) CHECK_THAT(tape.carried_grad()[i], Catch::Matchers::WithinAbs(gh2[i], 1e-14));
    }
}

TEST_CASE("dynamic shapes run every size with one plan", "[dynamic]") {
    constexpr auto d = tg::param<"d_plan_probe", double, tg::shape<tg::dyn>>;
    auto step = tg::compile(tg::sum(tg::exp(d) * d), tg::wrt(d));
    auto call = [&](std::size_t n) {
        std::vector<double> v(n, 0.5), g(n);
        return step.value_and_grad(tg::bind(d, v), tg::grad_into(d, g));
    };
    call(10);
    const std::size_t plans = tg::plan_count();
    for (std::size_t n : {100u, 10u, 15u}) CHECK_THAT(call(n), Catch::Matchers::WithinRel(double(n) * 0.5 * std::exp(0.5), 1e-12));
    CHECK(tg::plan_count() == plans);  // no new plan for new sizes
}
