// log_sum_exp, softmax and log_softmax over an axis (ops/log_sum_exp.hpp): gradients against
// finite differences in double, precision at large inputs, and PyTorch's results with infinities.
#include <check_gradient.hpp>
#include <special_values.hpp>

#include <cmath>
#include <limits>
#include <vector>

namespace tg = typegrad;
using tg::testing::at;
using tg::testing::check_gradient;
using tg::testing::fixed;
using tg::testing::uniform;
using tg::testing::inf;
using tg::testing::values_of;
using tg::testing::qnan;
using tg::testing::same_special;

namespace {
constexpr auto m = tg::param<"m", double, tg::shape<tg::dyn, 3>>;
}  // namespace

TEST_CASE("log_sum_exp, softmax and log_softmax over an axis", "[ops][softmax][gradient]") {
    for (std::size_t rows : {1u, 4u}) {
        auto mv = uniform(rows * 3, -3.0, 3.0, 30 + rows);
        check_gradient(tg::sum(tg::log_sum_exp(m, tg::axes<1>)), at(m, mv, {rows, 3}));
        check_gradient(tg::sum(tg::softmax(m) * tg::sin(m)), at(m, mv, {rows, 3}));
        check_gradient(tg::sum(tg::log_softmax(m, tg::axes<0>) * tg::cos(m)), at(m, mv, {rows, 3}));
    }
    constexpr auto s = tg::param<"s", float, tg::shape<2, 3>>;
    std::vector<float> big{1000, 1001, 1002, -5, 0, 5}, g(6);
    auto step = tg::compile(tg::sum(tg::softmax(s) * tg::lit<0>) + tg::sum(tg::log_softmax(s, tg::axes<1>)), tg::wrt(s));
    const float l = step.value_and_grad(tg::bind(s, big), tg::grad_into(s, g));
    CHECK(std::isfinite(l));
    for (float x : g) CHECK(std::isfinite(x));
}

TEST_CASE("log_softmax and softmax keep their precision at large inputs (float)", "[ops][softmax][edge]") {
    constexpr auto x = tg::param<"x", float, tg::shape<3>>;
    auto ls = tg::compile(tg::log_softmax(x), tg::wrt(x));
    auto sm = tg::compile(tg::softmax(x), tg::wrt(x));
    // [c, c+1, c+2] is exact in float; the result does not depend on c
    const double lse = std::log(1 + std::exp(1.0) + std::exp(2.0));
    for (float c : {0.f, 1e3f, 1e5f, -1e6f}) {
        INFO("c = " << c);
        std::vector<float> xd{c, c + 1, c + 2};
        const auto l = values_of<float>(ls, tg::bind(x, xd));
        const auto s = values_of<float>(sm, tg::bind(x, xd));
        for (int i = 0; i < 3; ++i) {
            CHECK(std::abs(l[i] - (i - lse)) <= 1e-6);  // was 1e-3 at c = 1e5: rounded at c's scale
            CHECK(std::abs(s[i] - std::exp(i - lse)) <= 1e-6 * std::exp(i - lse));
        }
    }
    // cross_entropy inherits it
    constexpr auto logits = tg::param<"logits", float, tg::shape<tg::dyn, 3>>;
    constexpr auto labels = tg::input<"labels", std::int64_t, tg::shape<tg::dyn>>;
    std::vector<float> ld{1e5f, 1e5f + 1, 1e5f + 2}, g(3);
    std::vector<std::int64_t> lab{2};
    const float l = tg::compile(tg::cross_entropy(logits, labels), tg::wrt(logits))
                        .value_and_grad(tg::bind(logits, ld, {1, 3}), tg::bind(labels, lab), tg::grad_into(logits, g));
    CHECK(std::abs(l - (lse - 2)) <= 1e-6);
    CHECK(std::abs(g[2] - (std::exp(2 - lse) - 1)) <= 1e-6);
}

TEST_CASE("log_sum_exp with +inf: gradient 0 to every finite input, as PyTorch's exp(x - lse)",
          "[ops][log_sum_exp][edge]") {
    // finding 14: the shift was 0 when the maximum is +inf, and exp(x) / inf is NaN where exp(x)
    // overflows (x > 88.7 in float). PyTorch: {0, NaN, 0, ...}.
    constexpr auto b = tg::param<"b", float, tg::shape<tg::dyn>>;
    auto step = tg::compile(tg::log_sum_exp(b), tg::wrt(b));
    for (std::size_t n : {3u, 20u}) {  // loop tail and SIMD body
        INFO("n = " << n);
        std::vector<float> bd(n, 1.f), g(n);
        bd[1] = inf;
        bd[2] = 1e36f;
        if (n > 3) bd[n - 1] = 100.f;
        const float l = step.value_and_grad(tg::bind(b, bd), tg::grad_into(b, g));
        CHECK(same_special(l, inf));
        for (std::size_t i = 0; i < n; ++i) {
            INFO("i = " << i);
            CHECK(same_special(g[i], i == 1 ? std::nan("") : 0.0));
        }
    }
    // along an axis (keepdim form), double: a row with +inf, a row of -inf (NaN weights in
    // PyTorch too: exp(-inf - (-inf))) and a finite row, whose softmax weights are unchanged
    constexpr auto c = tg::param<"c", double, tg::shape<3, tg::dyn>>;
    constexpr double dinf = std::numeric_limits<double>::infinity();
    std::vector<double> cd{1, dinf, 800, -dinf, -dinf, -dinf, 0, 1, 2}, gc(9);
    auto rows = tg::compile(tg::sum(tg::log_sum_exp(c, tg::axes<1>) * tg::lit<0.5>), tg::wrt(c));
    const double l = rows.value_and_grad(tg::bind(c, cd, {3, 3}), tg::grad_into(c, gc));
    CHECK(std::isnan(l));  // inf + (-inf)
    CHECK(gc[0] == 0);
    CHECK(std::isnan(gc[1]));
    CHECK(gc[2] == 0);
    for (int i = 3; i < 6; ++i) CHECK(std::isnan(gc[i]));
    const double lse = std::log(1 + std::exp(1.0) + std::exp(2.0));
    for (int i = 0; i < 3; ++i) CHECK(std::abs(gc[6 + i] - 0.5 * std::exp(i - lse)) <= 1e-15);
}

TEST_CASE("softmax and log_softmax of a row holding +inf are NaN everywhere, as in PyTorch", "[ops][softmax][edge]") {
    // PyTorch's CPU kernels shift by the row maximum: for [inf, 0], x - max = [NaN, -inf], the sum
    // of exp is NaN, and both softmax and log_softmax are [NaN, NaN] (LibTorch 1.13; the
    // differential test's graphs 1001 and 1002 compare with it). typegrad shifted by 0 when the
    // maximum was infinite and gave [NaN, 0] and [NaN, -inf]. An all -inf row is NaN in both; a
    // masked (-inf) entry next to finite ones is 0 (-inf).
    constexpr auto x = tg::param<"x", float, tg::shape<tg::dyn, 2>>;
    std::vector<float> xd{inf, 0.f, 0.f, inf, -inf, -inf, 0.f, -inf, inf, inf, qnan, 1.f}, g(12);
    auto sm = tg::compile(tg::softmax(x), tg::wrt(x));
    auto ls = tg::compile(tg::log_softmax(x), tg::wrt(x));
    const auto s = values_of<float>(sm, tg::bind(x, xd, {6, 2}));
    const auto l = values_of<float>(ls, tg::bind(x, xd, {6, 2}));
    const double nan = std::nan("");
    const std::vector<double> want_s{nan, nan, nan, nan, nan, nan, 1, 0, nan, nan, nan, nan};
    const std::vector<double> want_l{nan, nan, nan, nan, nan, nan, 0, -INFINITY, nan, nan, nan, nan};
    for (std::size_t i = 0; i < 12; ++i) {
        INFO("i = " << i);
        CHECK(same_special(s[i], want_s[i]));
        CHECK(same_special(l[i], want_l[i]));
    }
    // the gradient of sum(softmax(x) * q): NaN in the +inf rows, 0 in the masked row
    constexpr auto q = tg::input<"q", float, tg::shape<tg::dyn, 2>>;
    std::vector<float> qd{1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2};
    tg::compile(tg::sum(tg::softmax(x) * q), tg::wrt(x))
        .value_and_grad(tg::bind(x, xd, {6, 2}), tg::bind(q, qd, {6, 2}), tg::grad_into(x, g));
    for (std::size_t i = 0; i < 12; ++i) {
        INFO("i = " << i);
        CHECK(same_special(g[i], i == 6 || i == 7 ? 0.0 : nan));
    }
}

