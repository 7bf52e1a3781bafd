// cast (ops/cast.hpp): dtypes, and gradients through a section in another dtype.
#include <check_gradient.hpp>

#include <cmath>
#include <type_traits>
#include <vector>

namespace tg = typegrad;
using tg::testing::at;
using tg::testing::check_gradient;
using tg::testing::fixed;
using tg::testing::uniform;

TEST_CASE("cast between float and double", "[ops][cast][gradient]") {
    constexpr auto f = tg::param<"f", float, tg::shape<tg::dyn>>;
    constexpr auto d = tg::param<"d", double, tg::shape<tg::dyn>>;
    STATIC_REQUIRE(std::is_same_v<decltype(tg::cast<double>(f))::value_type, double>);
    // through a float section: finite differences would measure float rounding, so closed form
    auto dv5 = uniform(5, -1.0, 1.0, 70);
    std::vector<double> g5(5);
    tg::compile(tg::sum(tg::exp(tg::cast<float>(d)) * tg::cast<float>(tg::square(d))), tg::wrt(d))
        .value_and_grad(tg::bind(d, dv5), tg::grad_into(d, g5));
    for (int i = 0; i < 5; ++i)
        CHECK_THAT(g5[i], Catch::Matchers::WithinAbs(std::exp(dv5[i]) * (dv5[i] * dv5[i] + 2 * dv5[i]), 1e-6));
    // a float leaf in a double computation gets its gradient in float
    std::vector<float> fv{0.5f, 1.5f}, gf(2);
    std::vector<double> dv{2.0, 3.0}, gd(2);
    const double l = tg::compile(tg::sum(tg::cast<double>(f) * d), tg::wrt(f, d))
                         .value_and_grad(tg::bind(f, fv), tg::bind(d, dv), tg::grad_into(f, gf), tg::grad_into(d, gd));
    CHECK(l == 0.5 * 2 + 1.5 * 3);
    CHECK(gf == std::vector<float>{2, 3});
    CHECK(gd == std::vector<double>{0.5, 1.5});
}
