// Whole-tensor reductions and log_sum_exp.
#include <check_gradient.hpp>

#include <algorithm>
#include <limits>

namespace tg = typegrad;
using tg::testing::at;
using tg::testing::check_gradient;
using tg::testing::uniform;

namespace {
constexpr auto x = tg::param<"x", double, tg::shape<tg::dyn>>;
constexpr auto m = tg::param<"m", double, tg::shape<5, 3>>;
}  // namespace

TEST_CASE("sum, mean, max, min match finite differences", "[ops][gradient][reduce]") {
    for (std::size_t n : {1u, 8u, 31u}) {
        auto a = uniform(n, -2.0, 2.0, n);
        check_gradient(tg::mean(tg::exp(x)), at(x, a, {n}));
        check_gradient(tg::max(tg::sin(x)) * tg::lit<3>, at(x, a, {n}));
        check_gradient(tg::min(x * x), at(x, a, {n}));
        check_gradient(tg::sum(x) * tg::mean(x), at(x, a, {n}));
    }
    auto mv = uniform(15, -1.0, 1.0, 3);
    check_gradient(tg::mean(tg::square(m)) + tg::max(m), at(m, mv));
}

TEST_CASE("log_sum_exp matches finite differences and stays finite", "[ops][gradient][reduce]") {
    for (std::size_t n : {1u, 4u, 19u}) {
        check_gradient(tg::log_sum_exp(x), at(x, uniform(n, -3.0, 3.0, n), {n}));
        check_gradient(tg::log_sum_exp(tg::square(x)) * tg::sum(x), at(x, uniform(n, -1.0, 1.0, n), {n}));
    }
    constexpr auto f = tg::param<"f", float, tg::shape<tg::dyn>>;
    std::vector<float> big{1000.f, 1000.f, 990.f}, g(3);
    const float l = tg::compile(tg::log_sum_exp(f), tg::wrt(f)).value_and_grad(tg::bind(f, big), tg::grad_into(f, g));
    const double s = 2 + std::exp(-10.0);
    REQUIRE_THAT(l, Catch::Matchers::WithinRel(1000 + std::log(s), 1e-6));
    CHECK_THAT(g[0], Catch::Matchers::WithinRel(1 / s, 1e-5));
    CHECK_THAT(g[2], Catch::Matchers::WithinRel(std::exp(-10.0) / s, 1e-4));
    // all -inf: the stabilising shift is 0, the result -inf (as torch.logsumexp)
    std::vector<float> ninf(3, -std::numeric_limits<float>::infinity());
    const float l2 = tg::compile(tg::log_sum_exp(f), tg::wrt(f)).value_and_grad(tg::bind(f, ninf));
    CHECK(l2 == -std::numeric_limits<float>::infinity());
}

TEST_CASE("max shares its gradient among ties", "[ops][reduce]") {
    constexpr auto v = tg::param<"v", double, tg::shape<4>>;
    std::vector<double> d{3, 1, 3, 2}, g(4);
    const double l = tg::compile(tg::max(v), tg::wrt(v)).value_and_grad(tg::bind(v, d), tg::grad_into(v, g));
    CHECK(l == 3);
    CHECK(g == std::vector<double>{0.5, 0, 0.5, 0});
    tg::compile(tg::min(v), tg::wrt(v)).value_and_grad(tg::bind(v, d), tg::grad_into(v, g));
    CHECK(g == std::vector<double>{0, 1, 0, 0});
}

TEST_CASE("mean over a dynamic size divides by the run-time count", "[ops][reduce]") {
    constexpr auto f = tg::param<"f", float, tg::shape<tg::dyn, 3>>;
    auto step = tg::compile(tg::mean(f), tg::wrt(f));
    for (std::size_t rows : {1u, 2u, 5u}) {
        std::vector<float> d(rows * 3, 2.0f), g(rows * 3);
        CHECK(step.value_and_grad(tg::bind(f, d, {rows, 3}), tg::grad_into(f, g)) == 2.0f);
        for (float gi : g) CHECK_THAT(gi, Catch::Matchers::WithinRel(1.0f / float(rows * 3), 1e-6f));
    }
}

TEST_CASE("a maximum recomputed in another loop finds its element again", "[ops][reduce][regression]") {
    // exp(a) is evaluated in two loops that split rows differently between SIMD body and tail;
    // the gradient of max(exp(a)) needs bit-identical values in both (differential test graph 1000).
    constexpr auto a = tg::param<"a", double, tg::shape<tg::dyn, tg::dyn>>;
    constexpr auto b = tg::input<"b", double, tg::shape<1, tg::dyn>>;
    auto e = tg::exp(a);
    auto step = tg::compile(tg::max(e) + tg::sum(e * b), tg::wrt(a));
    for (std::size_t cols : {3u, 9u, 17u}) {
        const std::size_t rows = 5;
        auto av = uniform(rows * cols, -2.0, 2.0, cols), bv = uniform(cols, -2.0, 2.0, cols + 1);
        std::vector<double> g(rows * cols);
        step.value_and_grad(tg::bind(a, av, {rows, cols}), tg::bind(b, bv, {1, cols}), tg::grad_into(a, g));
        const std::size_t arg = std::size_t(std::max_element(av.begin(), av.end()) - av.begin());
        for (std::size_t i = 0; i < rows * cols; ++i) {
            const double expect = std::exp(av[i]) * bv[i % cols] + (i == arg ? std::exp(av[i]) : 0.0);
            CHECK_THAT(g[i], Catch::Matchers::WithinRel(expect, 1e-12));
        }
    }
}
