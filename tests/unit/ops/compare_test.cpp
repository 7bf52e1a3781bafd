// detach, masks and where (ops/compare.hpp): values flow forward, gradients do not.
#include <check_gradient.hpp>

#include <array>
#include <vector>

namespace tg = typegrad;

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
