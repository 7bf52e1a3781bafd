// Compiled steps (autodiff/step.hpp): dynamic shapes run every size with one plan.
#include <check_gradient.hpp>

#include <vector>

namespace tg = typegrad;

namespace {
constexpr auto x = tg::param<"x", float, tg::shape<10, 10>>;
constexpr auto p = tg::param<"p", float, tg::shape<3>>;

// A tensor hook: clip the whole gradient to a global L2 norm of 1.
struct clip_to_unit_norm {
    void operator()(tg::grad_view<float> g) const {
        double n = 0;
        for (float v : g) n += double(v) * v;
        n = std::sqrt(n);
        if (n > 1)
            for (float& v : g) v = float(v / n);
    }
};
}  // namespace

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
