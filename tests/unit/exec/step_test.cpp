// Compiled steps (exec/step.hpp): dynamic shapes run every size with one plan.
#include <check_gradient.hpp>

#include <cmath>
#include <vector>

namespace tg = typegrad;

TEST_CASE("dynamic shapes run every size with one plan", "[dynamic]") {
    constexpr auto d = tg::param<"d_plan_probe", double, tg::shape<tg::dyn>>;
    auto step = tg::compile(tg::sum(tg::exp(d) * d), tg::wrt(d));
    auto call = [&](std::size_t n) {
        std::vector<double> v(n, 0.5), g(n);
        return step.value_and_grad(tg::bind(d, v), tg::grad_into(d, g));
    };
    call(10);
    const std::size_t plans = tg::plan_count();
    for (std::size_t n : {100u, 10u, 15u}) CHECK_THAT(call(n), Catch::Matchers::WithinRel(double(n) * 0.5 * std::exp(0.5), 1e-12));
    CHECK(tg::plan_count() == plans);  // no new plan for new sizes
}
