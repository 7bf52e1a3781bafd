// Views, axis reductions, softmax family, matmul/linear and losses: gradients against finite
// differences (double) over several shapes, size-1 axes and broadcasting, plus closed forms.
#include <check_gradient.hpp>

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

TEST_CASE("axis reductions with and without keepdim", "[ops][reduce][gradient]") {
    auto tv = uniform(24, -1.0, 1.0, 21);
    check_gradient(tg::sum(tg::square(tg::sum(t, tg::axes<1>))), at(t, tv));
    check_gradient(tg::sum(tg::exp(tg::mean(t, tg::axes<0, 2>))), at(t, tv));
    check_gradient(tg::sum(t * tg::mean(t, tg::axes<-1>, tg::keepdim)), at(t, tv));
    check_gradient(tg::sum(tg::max(t, tg::axes<2>) * tg::min(t, tg::axes<2>)), at(t, tv));
    check_gradient(tg::sum(t / tg::max(tg::abs(t), tg::axes<0, 1>, tg::keepdim)), at(t, tv));
    STATIC_REQUIRE(std::is_same_v<decltype(tg::sum(t, tg::axes<1>))::shape_type, tg::shape<2, 4>>);
    STATIC_REQUIRE(std::is_same_v<decltype(tg::sum(t, tg::axes<1>, tg::keepdim))::shape_type, tg::shape<2, 1, 4>>);
    STATIC_REQUIRE(std::is_same_v<decltype(tg::mean(m, tg::axes<0>))::shape_type, tg::shape<3>>);
    for (std::size_t rows : {1u, 3u}) {
        auto mv = uniform(rows * 3, -2.0, 2.0, 7 + rows);
        check_gradient(tg::sum(tg::square(tg::mean(m, tg::axes<0>))), at(m, mv, {rows, 3}));
        check_gradient(tg::sum(tg::sum(m, tg::axes<1>) * tg::sum(m, tg::axes<1>)), at(m, mv, {rows, 3}));
    }
}

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

TEST_CASE("matmul for every rank combination, dot and linear", "[ops][matmul][gradient]") {
    constexpr auto a = tg::param<"a", double, tg::shape<tg::dyn, 4>>;
    constexpr auto b = tg::param<"b", double, tg::shape<4, 3>>;
    constexpr auto c = tg::param<"c", double, tg::shape<2, 3, 4>>;
    constexpr auto d = tg::param<"d", double, tg::shape<2, 4, 5>>;
    constexpr auto w = tg::param<"w", double, tg::shape<4>>;
    constexpr auto bias = tg::param<"bias", double, tg::shape<3>>;
    for (std::size_t rows : {1u, 3u, 7u}) {
        auto av = uniform(rows * 4, -1.0, 1.0, rows);
        auto bv = uniform(12, -1.0, 1.0, 40);
        check_gradient(tg::sum(tg::square(tg::matmul(a, b))), at(a, av, {rows, 4}), at(b, bv));
        check_gradient(tg::sum(tg::tanh(tg::linear(a, tg::transpose(b), bias))), at(a, av, {rows, 4}), at(b, bv),
                       at(bias, uniform(3, -1.0, 1.0, 41)));
        check_gradient(tg::sum(tg::matmul(tg::transpose(a), tg::exp(a))), at(a, av, {rows, 4}));
    }
    auto cv = uniform(24, -1.0, 1.0, 50), dv = uniform(40, -1.0, 1.0, 51), wv = uniform(4, -1.0, 1.0, 52);
    check_gradient(tg::sum(tg::sin(tg::matmul(c, d))), at(c, cv), at(d, dv));                  // batched
    check_gradient(tg::sum(tg::square(tg::matmul(c, b))), at(c, cv), at(b, uniform(12, -1.0, 1.0, 53)));  // batch x 2-D
    check_gradient(tg::sum(tg::matmul(c, w)), at(c, cv), at(w, wv));                            // 3-D x 1-D
    check_gradient(tg::sum(tg::square(tg::matmul(w, b))), at(w, wv), at(b, uniform(12, -1.0, 1.0, 54)));  // 1-D x 2-D
    check_gradient(tg::square(tg::dot(w, w)), at(w, wv));                                        // 1-D x 1-D
    // closed form: [[1, 1]] x [[1, 2], [3, 4]] = [[4, 6]]
    constexpr auto p = tg::param<"p", float, tg::shape<1, 2>>;
    constexpr auto q = tg::param<"q", float, tg::shape<2, 2>>;
    std::vector<float> pv{1, 1}, qv{1, 2, 3, 4}, gp(2), gq(4);
    const float l = tg::compile(tg::sum(tg::matmul(p, q)), tg::wrt(p, q))
                        .value_and_grad(tg::bind(p, pv), tg::bind(q, qv), tg::grad_into(p, gp), tg::grad_into(q, gq));
    CHECK(l == 10.f);
    CHECK(gp == std::vector<float>{3, 7});
    CHECK(gq == std::vector<float>{1, 1, 1, 1});
}

TEST_CASE("losses", "[ops][loss][gradient]") {
    constexpr auto logits = tg::param<"logits", double, tg::shape<tg::dyn, 4>>;
    constexpr auto labels = tg::input<"labels", std::int32_t, tg::shape<tg::dyn>>;
    constexpr auto target = tg::param<"target", double, tg::shape<tg::dyn, 4>>;
    std::vector<std::int32_t> lab{3, 0, 1};
    auto lv = uniform(12, -2.0, 2.0, 60), tv = uniform(12, 0.0, 1.0, 61);
    check_gradient(tg::cross_entropy(logits, labels), fixed(tg::bind(labels, lab)), at(logits, lv, {3, 4}));
    check_gradient(tg::nll_loss(tg::log_softmax(logits, tg::axes<1>), labels), fixed(tg::bind(labels, lab)),
                   at(logits, lv, {3, 4}));
    check_gradient(tg::mse_loss(logits, target), at(logits, lv, {3, 4}), at(target, tv, {3, 4}));
    check_gradient(tg::binary_cross_entropy_with_logits(logits, target), at(logits, lv, {3, 4}), at(target, tv, {3, 4}));
    // closed form: uniform logits give log(C) and gradient (softmax - onehot) / N
    std::vector<double> zeros(12, 0.0), g(12);
    const double l = tg::compile(tg::cross_entropy(logits, labels), tg::wrt(logits))
                         .value_and_grad(tg::bind(logits, zeros, {3, 4}), tg::bind(labels, lab), tg::grad_into(logits, g));
    CHECK_THAT(l, Catch::Matchers::WithinRel(std::log(4.0), 1e-14));
    CHECK_THAT(g[3], Catch::Matchers::WithinRel((0.25 - 1) / 3, 1e-14));
    CHECK_THAT(g[0], Catch::Matchers::WithinRel(0.25 / 3, 1e-14));
    // a label outside [0, C) throws before anything is written
    std::vector<std::int32_t> bad{3, 4, 0};
    std::vector<double> g0(12, 7.0);
    CHECK_THROWS_AS(tg::compile(tg::cross_entropy(logits, labels), tg::wrt(logits))
                        .value_and_grad(tg::bind(logits, zeros, {3, 4}), tg::bind(labels, bad), tg::grad_into(logits, g0)),
                    tg::shape_error);
    CHECK(g0 == std::vector<double>(12, 7.0));
}

TEST_CASE("grad of grad: Hessian-vector products against differences of gradients", "[autodiff][higher-order]") {
    constexpr auto x = tg::param<"x", double, tg::shape<3>>;
    constexpr auto vv = tg::input<"vv", double, tg::shape<3>>;
    constexpr auto M = tg::input<"M", double, tg::shape<3, 3>>;
    auto f = tg::log_sum_exp(tg::matmul(M, tg::tanh(x))) + tg::sum(tg::exp(x) * tg::sin(x));
    auto hvp = tg::sum(tg::grad(f, x) * vv);   // x -> H(x) v, through grad(f, x)
    std::vector<double> xv{0.3, -0.2, 0.5}, dir{1.0, -2.0, 0.5}, Mv{1, 2, 0, -1, 0.5, 1, 0.3, -0.7, 2};
    std::vector<double> hv(3);
    tg::compile(hvp, tg::wrt(x)).value_and_grad(tg::bind(x, xv), tg::bind(vv, dir), tg::bind(M, Mv), tg::grad_into(x, hv));
    auto gstep = tg::compile(f, tg::wrt(x));
    auto grad_at = [&](std::vector<double> p) {
        std::vector<double> g(3);
        gstep.value_and_grad(tg::bind(x, p), tg::bind(M, Mv), tg::grad_into(x, g));
        return g;
    };
    const double h = 1e-5;
    std::vector<double> up = xv, down = xv;
    for (int i = 0; i < 3; ++i) {
        up[i] += h * dir[i];
        down[i] -= h * dir[i];
    }
    auto gu = grad_at(up), gd = grad_at(down);
    for (int i = 0; i < 3; ++i) CHECK_THAT(hv[i], Catch::Matchers::WithinAbs((gu[i] - gd[i]) / (2 * h), 1e-7));
}

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
