// Anomaly mode: the first node producing NaN/Inf is named, and nothing is written.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <typegrad/typegrad.hpp>

namespace tg = typegrad;

namespace {
constexpr auto x = tg::param<"x", double, tg::shape<tg::dyn>>;
}

TEST_CASE("detect_anomaly names the first node that produced NaN or Inf", "[anomaly]") {
    auto step = tg::compile<tg::detect_anomaly>(tg::sum(tg::sqrt(tg::log(x)) * x), tg::wrt(x));
    std::vector<double> ok{2.0, 3.0}, g(2, 7.0);
    const double l = step.value_and_grad(tg::bind(x, ok), tg::grad_into(x, g));  // clean: runs normally
    CHECK_THAT(l, Catch::Matchers::WithinRel(std::sqrt(std::log(2.0)) * 2 + std::sqrt(std::log(3.0)) * 3, 1e-14));
    CHECK(std::isfinite(g[0]));

    std::vector<double> bad{2.0, 0.5}, g2(2, 7.0);  // log(0.5) < 0: sqrt gives NaN in the forward
    try {
        step.value_and_grad(tg::bind(x, bad), tg::grad_into(x, g2));
        FAIL("no anomaly_error");
    } catch (const tg::anomaly_error& e) {
        const std::string what = e.what();
        CHECK(what.find("'sqrt'") != std::string::npos);
        CHECK(what.find("forward") != std::string::npos);
    }
    CHECK(g2 == std::vector<double>(2, 7.0));  // nothing written

    // a backward-only anomaly: d/dx sqrt(x) at 0 is Inf
    auto s2 = tg::compile<tg::detect_anomaly>(tg::sum(tg::sqrt(x)), tg::wrt(x));
    std::vector<double> zero{0.0, 1.0}, g3(2, 7.0);
    try {
        s2.value_and_grad(tg::bind(x, zero), tg::grad_into(x, g3));
        FAIL("no anomaly_error");
    } catch (const tg::anomaly_error& e) {
        CHECK(std::string(e.what()).find("backward") != std::string::npos);
    }
    CHECK(g3 == std::vector<double>(2, 7.0));
    // a NaN in the input is reported at the leaf
    std::vector<double> nan_in{std::numeric_limits<double>::quiet_NaN(), 1.0};
    CHECK_THROWS_AS(s2.forward(tg::bind(x, nan_in)), tg::anomaly_error);
    // without the policy the same call just computes
    std::vector<double> g4(2);
    CHECK(std::isinf(tg::compile(tg::sum(tg::sqrt(x)), tg::wrt(x)).value_and_grad(tg::bind(x, zero), tg::grad_into(x, g4)) * 0 + g4[0]));
}
