// Arithmetic (ops/arithmetic.hpp: +, -, *, /, negation): gradients against finite differences in
// double, and closed forms where an operand is repeated.
#include <check_gradient.hpp>

namespace tg = typegrad;
using tg::testing::at;
using tg::testing::check_gradient;
using tg::testing::at_binary_points;
using tg::testing::at_unary_points;

namespace {
constexpr auto x = tg::param<"x", double, tg::shape<tg::dyn>>;
constexpr auto y = tg::param<"y", double, tg::shape<tg::dyn>>;
}  // namespace

TEST_CASE("negation matches finite differences", "[ops][arithmetic][gradient]") {
    at_unary_points([](std::size_t n, const auto& any, const auto&) {
        check_gradient(tg::sum(-x), at(x, any, {n}));
    });
}

TEST_CASE("+, -, * and / match finite differences, both operands", "[ops][arithmetic][gradient]") {
    at_binary_points([](std::size_t n, const auto& a, const auto& b) {
        check_gradient(tg::sum(x + y), at(x, a, {n}), at(y, b, {n}));
        check_gradient(tg::sum(x - y), at(x, a, {n}), at(y, b, {n}));
        check_gradient(tg::sum(x * y), at(x, a, {n}), at(y, b, {n}));
        check_gradient(tg::sum(x / y), at(x, a, {n}), at(y, b, {n}));
    });
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
