// erf, expm1 and log1p (ops/special.hpp): C's and PyTorch's values at signed zeros, and erf's
// accuracy in double.
#include <check_gradient.hpp>
#include <special_values.hpp>

#include <cmath>
#include <limits>
#include <vector>

namespace tg = typegrad;
using tg::testing::inf;
using tg::testing::values_of;
using tg::testing::qnan;
using tg::testing::same_special;

TEST_CASE("expm1 and log1p keep the sign of a zero, as C and PyTorch", "[ops][special][edge]") {
    // Finding 20 (graph 2213): expm1(-0) was +0 (xsimd 8.1), so pow(expm1(-0), -1) was +inf.
    constexpr auto x = tg::param<"x", double, tg::shape<tg::dyn>>;
    constexpr auto xf = tg::param<"xf", float, tg::shape<tg::dyn>>;
    std::vector<double> xd(19, -0.0);  // SIMD batches and the scalar tail
    std::vector<float> xfd(19, -0.0f);
    auto e = tg::compile(tg::expm1(x), tg::wrt(x));
    auto l = tg::compile(tg::log1p(x), tg::wrt(x));
    auto ef = tg::compile(tg::expm1(xf), tg::wrt(xf));
    auto lf = tg::compile(tg::log1p(xf), tg::wrt(xf));
    for (const double v : values_of<float>(e, tg::bind(x, xd))) CHECK(std::signbit(v));
    for (const double v : values_of<float>(l, tg::bind(x, xd))) CHECK(std::signbit(v));
    for (const double v : values_of<float>(ef, tg::bind(xf, xfd))) CHECK(std::signbit(v));
    for (const double v : values_of<float>(lf, tg::bind(xf, xfd))) CHECK(std::signbit(v));
    constexpr auto c = tg::param<"c", double, tg::shape<tg::dyn>>;
    std::vector<double> cd(19, -0.0);
    auto p = tg::compile(tg::pow(tg::expm1(c), tg::lit<-1>), tg::wrt(c));
    for (const double v : values_of<float>(p, tg::bind(c, cd))) CHECK(v == -std::numeric_limits<double>::infinity());
}

TEST_CASE("double erf is within an ulp of C's, so gelu's derivative near its zero keeps its digits",
          "[ops][gelu][special][edge]") {
    // Finding 21: xsimd 8.1's double erf was up to 68 ulps off in [-6, 6] (13 at -0.53), and the
    // derivative of gelu, 0.5 (1 + erf(x / sqrt 2)) + x phi(x), a difference of terms of 0.23 near
    // its zero, 5e-12 off relative (graph 2205: 1.2149285364e-5 against 1.2149285363e-5).
    constexpr auto x = tg::param<"x", double, tg::shape<tg::dyn>>;
    std::vector<double> xd;
    for (int i = -600; i <= 600; ++i) xd.push_back(i / 100.0 + 1.0 / 7);  // SIMD batches and a tail
    for (double v : {-2.2000484202803889, -2.2001370200178507, -0.53183011018228, 0.65, -0.65, 2.2})
        xd.push_back(v);
    auto e = tg::compile(tg::erf(x), tg::wrt(x));
    auto ctx = e.forward(tg::bind(x, xd));
    for (std::size_t i = 0; i < xd.size(); ++i) {
        INFO("x = " << xd[i]);
        const double want = std::erf(xd[i]);
        const double ulp = std::abs(std::nextafter(want, 0.0) - want);
        CHECK(std::abs(ctx.values()[i] - want) <= ulp);
    }
    // gelu's derivative against its closed form in long double, near its zero (x = -0.7518) and
    // elsewhere: within a few ulps of its terms (|0.5 (1 + erf)| <= 1)
    std::vector<double> pts{-0.75211910128477333};
    for (int i = 0; i < 40; ++i) pts.push_back(-0.80 + i * 0.0025);
    std::vector<double> gx(pts.size());
    tg::compile(tg::sum(tg::gelu(x)), tg::wrt(x)).value_and_grad(tg::bind(x, pts), tg::grad_into(x, gx));
    for (std::size_t i = 0; i < pts.size(); ++i) {
        INFO("x = " << pts[i]);
        const long double p = pts[i];
        const long double cdf = 0.5L * (1 + std::erf(p / std::sqrt(2.0L)));
        const long double want = cdf + p * std::exp(-p * p / 2) / std::sqrt(2 * 3.14159265358979323846264338327950288L);
        CHECK(std::abs(gx[i] - double(want)) <= 4 * std::numeric_limits<double>::epsilon() * double(cdf));
    }
}
