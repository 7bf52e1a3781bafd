// exp, log, sqrt, square and pow (ops/exp_log.hpp): gradients against finite differences in double,
// closed forms, and C's and PyTorch's special values (zero bases, subnormals, overflow).
#include <check_gradient.hpp>
#include <special_values.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
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

TEST_CASE("exp, log, sqrt, square and pow match finite differences", "[ops][exp_log][gradient]") {
    at_unary_points([](std::size_t n, const auto& any, const auto& pos) {
        check_gradient(tg::sum(tg::exp(x)), at(x, any, {n}));
        check_gradient(tg::sum(tg::log(x)), at(x, pos, {n}));
        check_gradient(tg::sum(tg::sqrt(x)), at(x, pos, {n}));
        check_gradient(tg::sum(tg::square(x)), at(x, any, {n}));
        check_gradient(tg::sum(tg::pow(x, tg::lit<3>)), at(x, any, {n}));
        check_gradient(tg::sum(tg::pow(x, tg::lit<2.5>)), at(x, pos, {n}));
    });
}

TEST_CASE("pow with a tensor exponent matches finite differences, both operands", "[ops][pow][gradient]") {
    at_binary_points([](std::size_t n, const auto& a, const auto& b) {
        check_gradient(tg::sum(tg::pow(y, x)), at(x, a, {n}), at(y, b, {n}));
    });
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

TEST_CASE("d/dy x^y at x = 0 is 0 (no NaN), as in PyTorch", "[ops][pow]") {
    constexpr auto v = tg::param<"v", double, tg::shape<3>>;
    constexpr auto w = tg::param<"w", double, tg::shape<3>>;
    std::vector<double> gw(3);
    std::vector<double> zero{0.0, 0.0, 0.0}, expo{2.0, 2.0, 2.0};
    tg::compile(tg::sum(tg::pow(v, w)), tg::wrt(w))
        .value_and_grad(tg::bind(v, zero), tg::bind(w, expo), tg::grad_into(w, gw));
    CHECK(gw == std::vector<double>{0, 0, 0});
}

TEST_CASE("pow follows C's (and PyTorch's) special values, zero bases included", "[ops][pow][edge]") {
    constexpr auto x = tg::param<"x", float, tg::shape<tg::dyn>>;
    constexpr auto y = tg::param<"y", float, tg::shape<tg::dyn>>;
    auto step = tg::compile(tg::pow(x, y), tg::wrt(x, y));
    const std::vector<float> special{0.f, -0.f, 1.f, -1.f, 0.5f, -0.5f, 2.f, -2.f, 2.5f, -3.f, 3.f,
                                     inf, -inf, qnan, 1e-40f, -1e-40f, 1e30f, -1e30f};
    // all pairs, more than a SIMD width: batch bodies and loop tails
    std::vector<float> xd, yd;
    for (float a : special)
        for (float b : special) xd.push_back(a), yd.push_back(b);
    const auto r = values_of<float>(step, tg::bind(x, xd, {xd.size()}), tg::bind(y, yd, {yd.size()}));
    for (std::size_t i = 0; i < xd.size(); ++i) {
        const double want = double(std::pow(xd[i], yd[i]));  // float pow, rounded as typegrad's
        INFO("pow(" << xd[i] << ", " << yd[i] << ") = " << r[i] << ", C gives " << want);
        CHECK(same_special(r[i], want));
    }
    // gradients at a zero base, against PyTorch's pow_backward: d/dx is 0 where y == 0
    auto grads = tg::compile(tg::sum(tg::pow(x, y)), tg::wrt(x, y));
    std::vector<float> x0{0, 0, 0, 0, 0}, y0{1, 0, 2, 0.5f, -1}, gx(5), gy(5);
    const float v = grads.value_and_grad(tg::bind(x, x0, {5}), tg::bind(y, y0, {5}), tg::grad_into(x, gx), tg::grad_into(y, gy));
    CHECK(v == inf);  // 0 + 1 + 0 + 0 + inf
    CHECK(gx[0] == 1.f);   // 1 * 0^0
    CHECK(gx[1] == 0.f);   // masked: 0 * 0^-1 would be NaN
    CHECK(gx[2] == 0.f);   // 2 * 0^1
    CHECK(gx[3] == inf);   // 0.5 * 0^-0.5
    CHECK(gx[4] == -inf);  // -1 * 0^-2
    for (int i = 0; i < 4; ++i) CHECK(gy[i] == 0.f);  // x == 0, y >= 0: 0 by convention
    // pow(x, constant) and the gradient away from the special points
    constexpr auto xd64 = tg::param<"x", double, tg::shape<3>>;
    tg::testing::check_gradient(tg::sum(tg::pow(xd64, tg::lit<3>)), tg::testing::at(xd64, std::vector<double>{0.0, -1.5, 2.0}));
}

TEST_CASE("exp reaches subnormal results and overflows only past the largest float", "[ops][exp][edge]") {
    constexpr auto x = tg::param<"x", float, tg::shape<tg::dyn>>;
    auto step = tg::compile(tg::exp(x), tg::wrt(x));
    std::vector<float> xd(33, -90.f);
    xd[3] = 88.7f;
    xd[20] = 89.f;
    xd[32] = -104.f;
    const auto r = values_of<float>(step, tg::bind(x, xd));
    CHECK(r[0] == std::exp(-90.f));  // 8.2e-40, was 0
    CHECK(r[3] == std::exp(88.7f));  // 3.3e38, was inf
    CHECK(r[20] == inf);
    CHECK(r[32] == 0.f);
    // infinite and NaN lanes beside subnormal results (first batch) and in batches of their own
    // (masked logits)
    std::vector<float> xi(48, -inf);
    xi[1] = -90.f;
    xi[2] = inf;
    xi[3] = std::numeric_limits<float>::quiet_NaN();
    xi[17] = inf;
    const auto ri = values_of<float>(step, tg::bind(x, xi));
    CHECK(ri[0] == 0.f);
    CHECK(ri[1] == std::exp(-90.f));
    CHECK(ri[2] == inf);
    CHECK(std::isnan(ri[3]));
    CHECK(ri[17] == inf);
    for (std::size_t i = 4; i < xi.size(); ++i)
        if (i != 17) CHECK(ri[i] == 0.f);
    constexpr auto xd64 = tg::param<"x", double, tg::shape<2>>;
    std::vector<double> d{-720.0, 709.5};
    auto s64 = tg::compile(tg::exp(xd64), tg::wrt(xd64)).forward(tg::bind(xd64, d));
    CHECK(s64.values()[0] == std::exp(-720.0));
    CHECK(s64.values()[1] == std::exp(709.5));
}

TEST_CASE("log and pow of subnormal doubles", "[ops][log][edge]") {
    // xsimd 8.1's double log of a subnormal was off by up to ln(2^52): found by the differential test
    constexpr auto x = tg::param<"x", double, tg::shape<tg::dyn>>;
    std::vector<double> xd(11, 4.9406564584124654e-321);
    xd[2] = 1e-310;
    xd[9] = 2.5;
    auto lg = tg::compile(tg::log(x), tg::wrt(x)).forward(tg::bind(x, xd));
    auto pw = tg::compile(tg::pow(x, tg::lit<-0.5>), tg::wrt(x)).forward(tg::bind(x, xd));
    for (std::size_t i = 0; i < xd.size(); ++i) {
        INFO("x = " << xd[i]);
        CHECK_THAT(lg.values()[i], Catch::Matchers::WithinRel(std::log(xd[i]), 1e-14));
        CHECK_THAT(pw.values()[i], Catch::Matchers::WithinRel(std::pow(xd[i], -0.5), 1e-12));
    }
}
