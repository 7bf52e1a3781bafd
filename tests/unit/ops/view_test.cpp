// Views (ops/view.hpp: permute, transpose, reshape, unsqueeze/squeeze, slice, broadcast_to):
// gradients against finite differences in double, and their run-time shape errors.
#include <check_gradient.hpp>

#include <vector>

namespace tg = typegrad;
using tg::testing::at;
using tg::testing::check_gradient;
using tg::testing::fixed;
using tg::testing::uniform;

namespace {
constexpr auto m = tg::param<"m", double, tg::shape<tg::dyn, 3>>;
constexpr auto t = tg::param<"t", double, tg::shape<2, 3, 4>>;
constexpr auto u = tg::param<"u", double, tg::shape<4, 1>>;
}  // namespace

TEST_CASE("views: permute, transpose, reshape, unsqueeze/squeeze, slice, broadcast_to", "[ops][views][gradient]") {
    auto tv = uniform(24, -1.0, 1.0, 11);
    check_gradient(tg::sum(tg::exp(tg::permute<2, 0, 1>(t)) * tg::permute<2, 0, 1>(t)), at(t, tv));
    check_gradient(tg::sum(tg::transpose<0, 2>(t) * tg::reshape<tg::shape<4, 3, 2>>(t)), at(t, tv));
    check_gradient(tg::sum(tg::sin(tg::reshape<tg::shape<tg::dyn, 4>>(tg::transpose(t)))), at(t, tv));
    check_gradient(tg::sum(tg::squeeze<1>(tg::unsqueeze<1>(t)) * t), at(t, tv));
    check_gradient(tg::sum(tg::square(tg::slice<2, 1, 3>(t))) + tg::sum(tg::slice<0, 1, 2>(t)), at(t, tv));
    check_gradient(tg::sum(tg::broadcast_to<tg::shape<2, 4, 1>>(u) * tg::lit<3>), at(u, uniform(4, -1.0, 1.0, 12)));
    for (std::size_t rows : {1u, 2u, 5u}) {
        auto mv = uniform(rows * 3, -1.0, 1.0, rows);
        check_gradient(tg::sum(tg::transpose(m) * tg::transpose(tg::exp(m))), at(m, mv, {rows, 3}));
        check_gradient(tg::sum(tg::slice<1, 0, 2>(tg::tanh(m))), at(m, mv, {rows, 3}));
    }
}

TEST_CASE("dynamic shape errors of tensor ops throw before writing", "[ops][errors]") {
    constexpr auto a = tg::param<"a", double, tg::shape<tg::dyn, tg::dyn>>;
    constexpr auto b = tg::param<"b", double, tg::shape<tg::dyn, tg::dyn>>;
    std::vector<double> av(6, 1.0), bv(6, 1.0), ga(6, 9.0), gb(6, 9.0);
    auto step = tg::compile(tg::sum(tg::matmul(a, b)), tg::wrt(a, b));
    CHECK_THROWS_AS(step.value_and_grad(tg::bind(a, av, {2, 3}), tg::bind(b, bv, {2, 3}), tg::grad_into(a, ga),
                                        tg::grad_into(b, gb)),
                    tg::shape_error);  // inner extents 3 and 2
    CHECK((ga == std::vector<double>(6, 9.0) && gb == std::vector<double>(6, 9.0)));
    auto r = tg::compile(tg::sum(tg::reshape<tg::shape<4, tg::dyn>>(a)), tg::wrt(a));
    CHECK_THROWS_AS(r.value_and_grad(tg::bind(a, av, {2, 3}), tg::grad_into(a, ga)), tg::shape_error);  // 6 % 4
    CHECK(ga == std::vector<double>(6, 9.0));
    auto s = tg::compile(tg::sum(tg::slice<1, 1, 3>(a)), tg::wrt(a));
    CHECK_THROWS_AS(s.value_and_grad(tg::bind(a, av, {3, 2}), tg::grad_into(a, ga)), tg::shape_error);  // end 3 > 2
    CHECK(ga == std::vector<double>(6, 9.0));
}
