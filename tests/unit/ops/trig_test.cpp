// sin, cos, tanh and sigmoid (ops/trig.hpp): gradients against finite differences in double.
#include <check_gradient.hpp>

namespace tg = typegrad;
using tg::testing::at;
using tg::testing::check_gradient;
using tg::testing::uniform;

namespace {
constexpr auto x = tg::param<"x", double, tg::shape<tg::dyn>>;
}  // namespace

TEST_CASE("sin, cos, tanh and sigmoid match finite differences", "[ops][trig][gradient]") {
    for (std::size_t n : {1u, 7u, 16u, 33u}) {
        [[maybe_unused]] auto any = uniform(n, -2.0, 2.0, n);
        [[maybe_unused]] auto pos = uniform(n, 0.2, 3.0, n + 1);
        check_gradient(tg::sum(tg::sin(x)), at(x, any, {n}));
        check_gradient(tg::sum(tg::cos(x)), at(x, any, {n}));
        check_gradient(tg::sum(tg::tanh(x)), at(x, any, {n}));
        check_gradient(tg::sum(tg::sigmoid(x)), at(x, any, {n}));
    }
}
