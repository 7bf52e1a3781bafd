// Parameter sets: Hana structs bound to graph params and gradients by (dotted) name.
#include <catch2/catch.hpp>

#include <typegrad/typegrad.hpp>
#include <typegrad/train/optim.hpp>
#include <typegrad/train/params.hpp>

#include <array>
#include <string>
#include <utility>
#include <vector>

namespace tg = typegrad;

namespace {

struct layer {
    BOOST_HANA_DEFINE_STRUCT(layer, (std::vector<float>, W), (std::vector<float>, b));
};
struct net {
    BOOST_HANA_DEFINE_STRUCT(net, (layer, fc1), (std::array<layer, 2>, blocks));
};
// Adapted from outside, as a struct one cannot edit would be.
struct plain {
    std::array<double, 2> a;
    std::vector<double> c;
};
struct stack {
    BOOST_HANA_DEFINE_STRUCT(stack, (std::vector<layer>, layers));
};

}  // namespace
BOOST_HANA_ADAPT_STRUCT(plain, a, c);

namespace {

constexpr auto x = tg::input<"x", float, tg::shape<3>>;
constexpr auto W = tg::param<"fc1.W", float, tg::shape<3>>;
constexpr auto b = tg::param<"fc1.b", float, tg::shape<3>>;
constexpr auto W0 = tg::param<"blocks.0.W", float, tg::shape<3>>;
constexpr auto b0 = tg::param<"blocks.0.b", float, tg::shape<3>>;
constexpr auto W1 = tg::param<"blocks.1.W", float, tg::shape<3>>;
constexpr auto b1 = tg::param<"blocks.1.b", float, tg::shape<3>>;

net make_net() {
    return {{{1, 2, 3}, {0.5f, 0.5f, 0.5f}}, {{{{1, 1, 1}, {0, 0, 1}}, {{2, 2, 2}, {1, 0, 3}}}}};
}
net zeros_net() {
    return {{std::vector<float>(3), std::vector<float>(3)},
            {{{std::vector<float>(3), std::vector<float>(3)}, {std::vector<float>(3), std::vector<float>(3)}}}};
}

}  // namespace

TEST_CASE("params and grads_into bind nested structs and arrays of blocks by dotted name", "[params]") {
    // loss = sum(x*W + b + W0*b0 + W1^2*b1): each member's value and gradient is distinguishable.
    auto loss = tg::sum(x * W + b + W0 * b0 + W1 * W1 * b1);
    auto step = tg::compile(loss, tg::wrt(W, b, W0, b0, W1, b1));
    net m = make_net(), g = zeros_net();
    const std::vector<float> xd{1, 2, 3};
    const float l = tg::value_and_grad(step, tg::bind(x, xd), tg::params(m), tg::grads_into(g));

    // The same call with every binding spelled out.
    net r = zeros_net();
    const float lr = step.value_and_grad(
        tg::bind(x, xd), tg::bind(W, m.fc1.W), tg::bind(b, m.fc1.b), tg::bind(W0, m.blocks[0].W),
        tg::bind(b0, m.blocks[0].b), tg::bind(W1, m.blocks[1].W), tg::bind(b1, m.blocks[1].b),
        tg::grad_into(W, r.fc1.W), tg::grad_into(b, r.fc1.b), tg::grad_into(W0, r.blocks[0].W),
        tg::grad_into(b0, r.blocks[0].b), tg::grad_into(W1, r.blocks[1].W), tg::grad_into(b1, r.blocks[1].b));
    CHECK(l == lr);
    // By hand: 1+4+9 + 1.5 + 1 + 4*4 = 32.5
    CHECK(l == 32.5f);
    CHECK(g.fc1.W == xd);
    CHECK(g.fc1.b == std::vector<float>{1, 1, 1});
    CHECK(g.blocks[0].W == m.blocks[0].b);
    CHECK(g.blocks[0].b == m.blocks[0].W);
    CHECK(g.blocks[1].W == std::vector<float>{4, 0, 12});  // 2 * W1 * b1
    CHECK(g.blocks[1].b == std::vector<float>{4, 4, 4});   // W1^2
    tg::for_each_param(r, [&](std::string_view, const std::vector<float>& v) { CHECK(!v.empty()); });
    CHECK(r.blocks[1].W == g.blocks[1].W);

    // tg::accumulate adds.
    tg::value_and_grad(step, tg::bind(x, xd), tg::params(m), tg::grads_into(g, tg::accumulate));
    CHECK(g.blocks[1].b == std::vector<float>{8, 8, 8});
}

TEST_CASE("a param bound explicitly takes precedence over the set, forward/backward split", "[params]") {
    auto loss = tg::sum(x * W + b + W0 * b0 + W1 * b1);
    auto step = tg::compile(loss, tg::wrt(W, b, W0, b0, W1, b1));
    net m = make_net(), g = zeros_net();
    const std::vector<float> xd{1, 1, 1}, other{10, 10, 10};
    const float l = tg::value_and_grad(step, tg::bind(x, xd), tg::bind(W, other), tg::params(m), tg::grads_into(g));
    CHECK(l == 30 + 1.5f + 1 + 2 + 0 + 6);
    std::vector<float> gW(3);
    auto ctx = tg::forward(step, tg::bind(x, xd), tg::params(m));
    CHECK(ctx.value() == 6 + 1.5f + 1 + 2 + 0 + 6);
    net g2 = zeros_net();
    g2.fc1.W.assign(3, -1.f);
    tg::backward(step, ctx, tg::grad_into(W, gW), tg::grads_into(g2));
    CHECK(gW == xd);
    CHECK(g2.fc1.W == std::vector<float>{-1, -1, -1});  // explicit grad_into took W
    CHECK(g2.blocks[1].b == m.blocks[1].W);
}

TEST_CASE("BOOST_HANA_ADAPT_STRUCT sets, double params, std::array buffers", "[params]") {
    constexpr auto a = tg::param<"a", double, tg::shape<2>>;
    constexpr auto c = tg::param<"c", double, tg::shape<tg::dyn>>;
    auto step = tg::compile(tg::sum(a * a) + tg::sum(c), tg::wrt(a, c));
    plain p{{3, 4}, {1, 2, 3, 4, 5}}, g{{0, 0}, std::vector<double>(5)};
    CHECK(tg::value_and_grad(step, tg::params(p), tg::grads_into(g)) == 25 + 15);
    CHECK(g.a == std::array<double, 2>{6, 8});
    CHECK(g.c == std::vector<double>(5, 1.0));
}

TEST_CASE("wrong sizes are shape_errors naming the member, thrown before anything is written", "[params]") {
    auto step = tg::compile(tg::sum(x * W + b + W0 * b0 + W1 * b1), tg::wrt(W, b, W0, b0, W1, b1));
    const std::vector<float> xd{1, 1, 1};
    net m = make_net(), g = zeros_net();
    for (auto& v : g.blocks[1].b) v = 7;
    m.blocks[1].W.resize(4);
    try {
        tg::value_and_grad(step, tg::bind(x, xd), tg::params(m), tg::grads_into(g));
        FAIL("no exception");
    } catch (const tg::shape_error& e) {
        CHECK(std::string(e.what()).find("'blocks.1.W' has 4 elements") != std::string::npos);
    }
    CHECK(g.blocks[1].b == std::vector<float>{7, 7, 7});
    m = make_net();
    g.fc1.b.resize(2);
    try {
        tg::value_and_grad(step, tg::bind(x, xd), tg::params(m), tg::grads_into(g));
        FAIL("no exception");
    } catch (const tg::shape_error& e) {
        CHECK(std::string(e.what()).find("'fc1.b' has 2 elements") != std::string::npos);
    }
    CHECK(g.blocks[1].b == std::vector<float>{7, 7, 7});
}

TEST_CASE("a std::vector of blocks binds by index; its size must match the graph's names", "[params]") {
    constexpr auto L0W = tg::param<"layers.0.W", float, tg::shape<3>>;
    constexpr auto L0b = tg::param<"layers.0.b", float, tg::shape<3>>;
    constexpr auto L1W = tg::param<"layers.1.W", float, tg::shape<3>>;
    constexpr auto L1b = tg::param<"layers.1.b", float, tg::shape<3>>;
    auto step = tg::compile(tg::sum(L0W * L0b + L1W * L1b), tg::wrt(L0W, L0b, L1W, L1b));
    stack s{{{{1, 2, 3}, {1, 1, 1}}, {{1, 1, 1}, {2, 2, 2}}}};
    stack g{{{std::vector<float>(3), std::vector<float>(3)}, {std::vector<float>(3), std::vector<float>(3)}}};
    CHECK(tg::value_and_grad(step, tg::params(s), tg::grads_into(g)) == 12);
    CHECK(g.layers[1].W == std::vector<float>{2, 2, 2});
    CHECK(g.layers[0].b == std::vector<float>{1, 2, 3});

    stack three = s;
    three.layers.push_back(s.layers[0]);
    CHECK_THROWS_AS(tg::value_and_grad(step, tg::params(three), tg::grads_into(g)), tg::shape_error);
    stack one{{s.layers[0]}};
    g.layers[0].W.assign(3, 5.f);
    CHECK_THROWS_AS(tg::value_and_grad(step, tg::params(one), tg::grads_into(g)), tg::shape_error);
    CHECK(g.layers[0].W == std::vector<float>{5, 5, 5});
}

TEST_CASE("for_each_param visits every buffer depth-first with its dotted name", "[params]") {
    net m = make_net();
    std::vector<std::pair<std::string, std::size_t>> seen;
    tg::for_each_param(m, [&](std::string_view name, auto& buf) { seen.emplace_back(name, buf.size()); });
    const std::vector<std::pair<std::string, std::size_t>> expected{
        {"fc1.W", 3}, {"fc1.b", 3}, {"blocks.0.W", 3}, {"blocks.0.b", 3}, {"blocks.1.W", 3}, {"blocks.1.b", 3}};
    CHECK(seen == expected);
}

namespace {
struct single {
    BOOST_HANA_DEFINE_STRUCT(single, (std::vector<float>, w), (std::vector<float>, v));
};
}  // namespace

TEST_CASE("an optimizer in the backward (post-accumulate hooks) equals one after it", "[params][optim]") {
    constexpr auto w = tg::param<"w", float, tg::shape<tg::dyn>>;
    constexpr auto v = tg::param<"v", float, tg::shape<tg::dyn>>;
    const single start{{1, 2, 3, 4, 5, 6, 7, 8, 9}, {0.5f, -1, 2, 0, 1, 1, 3, -2, 1}};
    auto loss = [](auto a, auto c) { return tg::sum(a * a * c + tg::exp(c * tg::lit<0.1>)); };

    // After the backward: gradients into a buffer, then opt.step.
    single after = start, g = tg::zeros_like(start);
    tg::adam opt_after(after, {.lr = 0.05});
    auto plain = tg::compile(loss(w, v), tg::wrt(w, v));
    // In the backward: each param is updated by its hook; no gradient struct.
    single inside = start;
    tg::adam opt_inside(inside, {.lr = 0.05});
    auto hooked = tg::compile(loss(tg::post_accumulate_grad_hook(w, tg::optimizer_step{}),
                                   tg::post_accumulate_grad_hook(v, tg::optimizer_step{})),
                              tg::wrt(w, v));
    for (int t = 0; t < 3; ++t) {
        const float l1 = tg::value_and_grad(plain, tg::params(after), tg::grads_into(g));
        opt_after.step(after, g);
        float l2 = 0;
        {
            tg::optimizer_in_backward scope(opt_inside, inside);
            l2 = tg::value_and_grad(hooked, tg::params(inside));
        }
        CHECK(l1 == l2);
    }
    for (std::size_t i = 0; i < start.w.size(); ++i) {
        CHECK_THAT(inside.w[i], Catch::Matchers::WithinRel(after.w[i], 1e-6f));
        CHECK_THAT(inside.v[i], Catch::Matchers::WithinRel(after.v[i], 1e-6f));
        CHECK(inside.w[i] != start.w[i]);
    }
    CHECK(opt_inside.steps == std::vector<std::int64_t>{3, 3});
    // Outside a scope the hook has no optimizer.
    single lone = start;
    CHECK_THROWS_AS(tg::value_and_grad(hooked, tg::params(lone)), tg::binding_error);
}
