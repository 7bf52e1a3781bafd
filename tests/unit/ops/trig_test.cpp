// sin, cos, tanh and sigmoid (ops/trig.hpp): gradients against finite differences in double.
#include <check_gradient.hpp>

namespace tg = typegrad;
using tg::testing::at;
using tg::testing::check_gradient;
using tg::testing::at_binary_points;
using tg::testing::at_unary_points;

namespace {
constexpr auto x = tg::param<"x", double, tg::shape<tg::dyn>>;
}  // namespace

TEST_CASE("sin, cos, tanh and sigmoid match finite differences", "[ops][trig][gradient]") {
    at_unary_points([](std::size_t n, const auto& any, const auto&) {
        check_gradient(tg::sum(tg::sin(x)), at(x, any, {n}));
        check_gradient(tg::sum(tg::cos(x)), at(x, any, {n}));
        check_gradient(tg::sum(tg::tanh(x)), at(x, any, {n}));
        check_gradient(tg::sum(tg::sigmoid(x)), at(x, any, {n}));
    });
}
