// Gradients of every elementwise op against finite differences, and closed forms.
#include <check_gradient.hpp>

namespace tg = typegrad;
using tg::testing::at;
using tg::testing::check_gradient;
using tg::testing::uniform;

namespace {
constexpr auto x = tg::param<"x", double, tg::shape<tg::dyn>>;
constexpr auto y = tg::param<"y", double, tg::shape<tg::dyn>>;
constexpr auto m = tg::param<"m", double, tg::shape<4, 3>>;
constexpr auto r = tg::param<"r", double, tg::shape<3>>;
constexpr auto c = tg::param<"c", double, tg::shape<4, 1>>;
constexpr auto s = tg::param<"s", double>;
}  // namespace

TEST_CASE("unary ops match finite differences", "[ops][gradient]") {
    for (std::size_t n : {1u, 7u, 16u, 33u}) {
        auto any = uniform(n, -2.0, 2.0, n);
        auto pos = uniform(n, 0.2, 3.0, n + 1);
        check_gradient(tg::sum(-x), at(x, any, {n}));
        check_gradient(tg::sum(tg::exp(x)), at(x, any, {n}));
        check_gradient(tg::sum(tg::log(x)), at(x, pos, {n}));
        check_gradient(tg::sum(tg::sqrt(x)), at(x, pos, {n}));
        check_gradient(tg::sum(tg::sin(x)), at(x, any, {n}));
        check_gradient(tg::sum(tg::cos(x)), at(x, any, {n}));
        check_gradient(tg::sum(tg::tanh(x)), at(x, any, {n}));
        check_gradient(tg::sum(tg::sigmoid(x)), at(x, any, {n}));
        check_gradient(tg::sum(tg::relu(x)), at(x, any, {n}));
        check_gradient(tg::sum(tg::abs(x)), at(x, any, {n}));
        check_gradient(tg::sum(tg::square(x)), at(x, any, {n}));
        check_gradient(tg::sum(tg::pow(x, tg::lit<3>)), at(x, any, {n}));
        check_gradient(tg::sum(tg::pow(x, tg::lit<2.5>)), at(x, pos, {n}));
    }
}

TEST_CASE("binary ops match finite differences, both operands", "[ops][gradient]") {
    for (std::size_t n : {1u, 9u, 17u}) {
        auto a = uniform(n, -2.0, 2.0, 3 * n);
        auto b = uniform(n, 0.5, 2.0, 3 * n + 1);
        check_gradient(tg::sum(x + y), at(x, a, {n}), at(y, b, {n}));
        check_gradient(tg::sum(x - y), at(x, a, {n}), at(y, b, {n}));
        check_gradient(tg::sum(x * y), at(x, a, {n}), at(y, b, {n}));
        check_gradient(tg::sum(x / y), at(x, a, {n}), at(y, b, {n}));
        check_gradient(tg::sum(tg::pow(y, x)), at(x, a, {n}), at(y, b, {n}));
        check_gradient(tg::sum(tg::max(x, y)), at(x, a, {n}), at(y, b, {n}));
        check_gradient(tg::sum(tg::min(x, y)), at(x, a, {n}), at(y, b, {n}));
    }
}

TEST_CASE("composite expressions with sharing", "[ops][gradient]") {
    const std::size_t n = 11;
    auto a = uniform(n, -1.0, 1.0, 5);
    auto b = uniform(n, 0.5, 1.5, 6);
    auto e = tg::exp(x);
    check_gradient(tg::sum(e * e * y + tg::tanh(e - y) / y), at(x, a, {n}), at(y, b, {n}));
    check_gradient(tg::sum(tg::sigmoid(x * y) * tg::log(y) + tg::sqrt(tg::square(x) + y)),
                   at(x, a, {n}), at(y, b, {n}));
    check_gradient(tg::sum(tg::sin(tg::cos(tg::sin(x)))) * tg::sum(y), at(x, a, {n}), at(y, b, {n}));
}

TEST_CASE("broadcasting: static 1, missing axes and scalars", "[ops][gradient][broadcast]") {
    auto mv = uniform(12, -1.0, 1.0, 7);
    auto rv = uniform(3, 0.5, 1.5, 8);
    auto cv = uniform(4, 0.5, 1.5, 9);
    std::vector<double> sv{0.7};
    check_gradient(tg::sum(m * r), at(m, mv), at(r, rv));
    check_gradient(tg::sum(tg::exp(m / c) + r), at(m, mv), at(c, cv), at(r, rv));
    check_gradient(tg::sum(c * r), at(c, cv), at(r, rv));           // [4,1] x [3] -> [4,3]
    check_gradient(tg::sum(tg::square(m - s) * s), at(m, mv), at(s, sv));
    check_gradient(tg::sum(tg::max(m, r)), at(m, mv), at(r, rv));
}

TEST_CASE("op(x, x).sum() at [1, 2, 3]", "[ops][closed-form]") {
    constexpr auto v = tg::param<"v", float, tg::shape<3>>;
    std::vector<float> data{1, 2, 3}, g(3);
    auto run = [&](auto loss) {
        tg::compile(loss, tg::wrt(v)).value_and_grad(tg::bind(v, data), tg::grad_into(v, g));
        return g;
    };
    CHECK(run(tg::sum(v + v)) == std::vector<float>{2, 2, 2});
    CHECK(run(tg::sum(v - v)) == std::vector<float>{0, 0, 0});
    CHECK(run(tg::sum(v * v)) == std::vector<float>{2, 4, 6});
    CHECK(run(tg::sum(v / v)) == std::vector<float>{0, 0, 0});
}

TEMPLATE_TEST_CASE("sum(exp(x) * y) at known points", "[ops][closed-form]", float, double) {
    constexpr auto xx = tg::param<"x", TestType, tg::shape<tg::dyn>>;
    constexpr auto yy = tg::param<"y", TestType, tg::shape<tg::dyn>>;
    auto step = tg::compile(tg::sum(tg::exp(xx) * yy), tg::wrt(xx, yy));
    std::vector<TestType> xd{0, 1, -1, 2}, yd{1, 2, 3, 0.5}, gx(4), gy(4);
    const TestType l = step.value_and_grad(tg::bind(xx, xd), tg::bind(yy, yd), tg::grad_into(xx, gx),
                                           tg::grad_into(yy, gy));
    const double e = std::exp(1.0);
    const double tol = std::is_same_v<TestType, float> ? 1e-6 : 1e-14;
    REQUIRE_THAT(l, Catch::Matchers::WithinRel(1 + 2 * e + 3 / e + 0.5 * e * e, tol));
    const double ex[] = {1, e, 1 / e, e * e};
    for (int i = 0; i < 4; ++i) {
        CHECK_THAT(gx[i], Catch::Matchers::WithinRel(yd[i] * ex[i], tol));
        CHECK_THAT(gy[i], Catch::Matchers::WithinRel(ex[i], tol));
    }
}

TEST_CASE("elementwise edge values follow PyTorch", "[ops]") {
    constexpr auto v = tg::param<"v", double, tg::shape<3>>;
    std::vector<double> data{-1.0, 0.0, 2.0}, g(3);
    tg::compile(tg::sum(tg::relu(v)), tg::wrt(v)).value_and_grad(tg::bind(v, data), tg::grad_into(v, g));
    CHECK(g == std::vector<double>{0, 0, 1});  // relu'(0) = 0
    tg::compile(tg::sum(tg::abs(v)), tg::wrt(v)).value_and_grad(tg::bind(v, data), tg::grad_into(v, g));
    CHECK(g == std::vector<double>{-1, 0, 1});  // sgn
    std::vector<double> same{2.0, 2.0, 2.0}, gw(3);
    constexpr auto w = tg::param<"w", double, tg::shape<3>>;
    tg::compile(tg::sum(tg::max(v, w)), tg::wrt(v, w))
        .value_and_grad(tg::bind(v, data), tg::bind(w, same), tg::grad_into(v, g), tg::grad_into(w, gw));
    CHECK(g == std::vector<double>{0, 0, 0.5});  // ties split the gradient
    CHECK(gw == std::vector<double>{1, 1, 0.5});
    // d/dy x^y at x = 0 is taken as 0 (no NaN), as in PyTorch
    std::vector<double> zero{0.0, 0.0, 0.0}, expo{2.0, 2.0, 2.0};
    tg::compile(tg::sum(tg::pow(v, w)), tg::wrt(w))
        .value_and_grad(tg::bind(v, zero), tg::bind(w, expo), tg::grad_into(w, gw));
    CHECK(gw == std::vector<double>{0, 0, 0});
}

TEST_CASE("a root that does not require grad gives zero gradients (reliability finding 7)", "[elementwise]") {
    constexpr auto x = tg::param<"x", double>;
    const auto step = tg::compile(tg::detach(tg::square(x)), tg::wrt(x));
    double xd = 3, gx = 7;
    const double v = step.value_and_grad(tg::bind(x, &xd, {}), tg::grad_into(x, &gx, 1));
    CHECK(v == 9);
    CHECK(gx == 0);
    constexpr auto y = tg::param<"y", double, tg::shape<3>>;
    const auto masked = tg::compile(tg::sum(tg::gt(y, tg::lit<0>)), tg::wrt(y));
    const std::array<double, 3> yd{-1, 2, 3};
    std::array<double, 3> gy{5, 5, 5};
    CHECK(masked.value_and_grad(tg::bind(y, yd), tg::grad_into(y, gy)) == 2);
    CHECK(gy == std::array<double, 3>{0, 0, 0});
}

TEST_CASE("split backward writes a gradient whose leaf is not in the backward graph", "[elementwise]") {
    // the gradient of b in sum(detach(a) * b) is detach(a): b itself is not read by the backward
    constexpr auto a = tg::param<"a", float, tg::shape<tg::dyn>>;
    constexpr auto b = tg::param<"b", float, tg::shape<tg::dyn>>;
    auto step = tg::compile(tg::sum(tg::detach(a) * b), tg::wrt(a, b));
    const std::vector<float> av{1, 3, 5}, bv{2, 4, 6};
    std::vector<float> ga(3, 9), gb(3, 9);
    auto ctx = step.forward(tg::bind(a, av), tg::bind(b, bv));
    CHECK(ctx.value() == 2 + 12 + 30);
    step.backward(ctx, tg::grad_into(a, ga), tg::grad_into(b, gb));
    CHECK(ga == std::vector<float>{0, 0, 0});
    CHECK(gb == av);
}
