// relu, abs, max and min (ops/piecewise.hpp): gradients against finite differences in double away
// from the kinks, PyTorch's rules at them (relu'(0) = 0, ties split), and NaN propagation.
#include <check_gradient.hpp>
#include <special_values.hpp>

#include <cmath>
#include <limits>
#include <vector>

namespace tg = typegrad;
using tg::testing::at;
using tg::testing::check_gradient;
using tg::testing::at_binary_points;
using tg::testing::at_unary_points;
using tg::testing::inf;
using tg::testing::values_of;
using tg::testing::qnan;
using tg::testing::same_special;

namespace {
constexpr auto x = tg::param<"x", double, tg::shape<tg::dyn>>;
constexpr auto y = tg::param<"y", double, tg::shape<tg::dyn>>;
}  // namespace

TEST_CASE("relu and abs match finite differences", "[ops][piecewise][gradient]") {
    at_unary_points([](std::size_t n, const auto& any, const auto&) {
        check_gradient(tg::sum(tg::relu(x)), at(x, any, {n}));
        check_gradient(tg::sum(tg::abs(x)), at(x, any, {n}));
    });
}

TEST_CASE("max and min match finite differences, both operands", "[ops][piecewise][gradient]") {
    at_binary_points([](std::size_t n, const auto& a, const auto& b) {
        check_gradient(tg::sum(tg::max(x, y)), at(x, a, {n}), at(y, b, {n}));
        check_gradient(tg::sum(tg::min(x, y)), at(x, a, {n}), at(y, b, {n}));
    });
}

TEST_CASE("relu, abs and max at their kinks follow PyTorch: relu'(0) = 0, sgn, ties split", "[ops][piecewise]") {
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
}

// Found by the differential test's special values: xsimd 8.1's batch `!=` is false for NaN on
// AVX and AVX-512, so NaN checks written `a != a` saw no NaN in SIMD batches (only in tails).
TEST_CASE("NaN propagates through relu, min/max and reductions in SIMD batches, with PyTorch's gradients",
          "[ops][nan][edge]") {
    constexpr auto x = tg::param<"x", float, tg::shape<tg::dyn>>;
    constexpr auto y = tg::param<"y", float, tg::shape<tg::dyn>>;
    const std::size_t n = 37;  // batches and a tail, whatever the SIMD width
    for (std::size_t at : {std::size_t(0), std::size_t(5), std::size_t(36)}) {
        INFO("NaN at " << at);
        std::vector<float> xd(n), yd(n, 0.5f), gx(n), gy(n);
        for (std::size_t i = 0; i < n; ++i) xd[i] = float(i % 7) - 3;
        xd[at] = qnan;
        // relu(NaN) is NaN and passes the gradient (threshold_backward: 0 only where x <= 0)
        auto r = tg::compile(tg::sum(tg::relu(x)), tg::wrt(x));
        CHECK(std::isnan(r.value_and_grad(tg::bind(x, xd), tg::grad_into(x, gx))));
        CHECK(gx[at] == 1.f);
        // max / min reductions: NaN; the gradient goes to the NaN element (evenly_distribute_backward)
        auto mx = tg::compile(tg::max(x), tg::wrt(x));
        CHECK(std::isnan(mx.value_and_grad(tg::bind(x, xd), tg::grad_into(x, gx))));
        for (std::size_t i = 0; i < n; ++i) CHECK(gx[i] == (i == at ? 1.f : 0.f));
        auto mn = tg::compile(tg::min(x), tg::wrt(x));
        CHECK(std::isnan(mn.value_and_grad(tg::bind(x, xd), tg::grad_into(x, gx))));
        CHECK(gx[at] == 1.f);
        // maximum / minimum: NaN; both sides get the whole gradient (no order)
        auto bin = tg::compile(tg::sum(tg::max(x, y) + tg::min(x, y)), tg::wrt(x, y));
        CHECK(std::isnan(bin.value_and_grad(tg::bind(x, xd), tg::bind(y, yd), tg::grad_into(x, gx), tg::grad_into(y, gy))));
        CHECK(gx[at] == 2.f);
        CHECK(gy[at] == 2.f);
        CHECK(gx[(at + 1) % n] + gy[(at + 1) % n] == 2.f);
        // where: a NaN condition is nonzero, so true
        constexpr auto c = tg::input<"c", float, tg::shape<tg::dyn>>;
        auto w = tg::compile(tg::where(c, c * tg::lit<0>, y), tg::wrt(y));
        const auto v = values_of<float>(w, tg::bind(c, xd), tg::bind(y, yd));
        CHECK(std::isnan(v[at]));
    }
}
