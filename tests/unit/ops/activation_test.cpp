// Activations and special functions (ops/activation.hpp, ops/special.hpp): gradients against
// finite differences in double over several shapes (size-1 axes, broadcasting), values against
// closed forms and PyTorch's numbers, PyTorch's edge rules, SIMD body against scalar tail, and
// the autocast classes.
#include <check_gradient.hpp>

#include <cmath>
#include <limits>

namespace tg = typegrad;
using tg::testing::at;
using tg::testing::check_gradient;
using tg::testing::uniform;

namespace {
constexpr auto x = tg::param<"x", double, tg::shape<tg::dyn>>;
constexpr auto m = tg::param<"m", double, tg::shape<4, 3>>;
constexpr auto r = tg::param<"r", double, tg::shape<3>>;
constexpr auto c = tg::param<"c", double, tg::shape<4, 1>>;
constexpr auto u = tg::param<"u", double, tg::shape<1, 1>>;

// The forward values of f(v) for double data.
template <class F>
std::vector<double> values_of(F f, const std::vector<double>& data) {
    constexpr auto v = tg::param<"v", double, tg::shape<tg::dyn>>;
    auto step = tg::compile(f(v), tg::wrt(v));
    auto ctx = step.forward(tg::bind(v, data));
    return {ctx.values().begin(), ctx.values().end()};
}
// The gradient of sum(f(v)) for double data.
template <class F>
std::vector<double> grad_of(F f, const std::vector<double>& data) {
    constexpr auto v = tg::param<"v", double, tg::shape<tg::dyn>>;
    std::vector<double> g(data.size());
    tg::compile(tg::sum(f(v)), tg::wrt(v)).value_and_grad(tg::bind(v, data), tg::grad_into(v, g));
    return g;
}

// Points that stay away from the kinks (0 for leaky_relu/elu, the bounds of clamp, the
// threshold of softplus): finite differences across a kink measure neither side.
std::vector<double> away_from(std::vector<double> v, std::initializer_list<double> kinks) {
    for (double& e : v)
        for (double k : kinks)
            if (std::abs(e - k) < 1e-3) e = k + 0.01;
    return v;
}
}  // namespace

TEST_CASE("activations and special functions match finite differences", "[ops][activation][gradient]") {
    for (std::size_t n : {1u, 7u, 16u, 33u}) {
        auto any = away_from(uniform(n, -3.0, 3.0, 40 + n), {0.0, -1.0, 1.0});
        auto big = away_from(uniform(n, -30.0, 30.0, 50 + n), {0.0, 10.0, 20.0});
        auto above = uniform(n, -0.9, 3.0, 60 + n);  // log1p's domain
        check_gradient(tg::sum(tg::erf(x)), at(x, any, {n}));
        check_gradient(tg::sum(tg::log1p(x)), at(x, above, {n}));
        check_gradient(tg::sum(tg::expm1(x)), at(x, any, {n}));
        check_gradient(tg::sum(tg::gelu(x)), at(x, any, {n}));
        check_gradient(tg::sum(tg::gelu<tg::approximate::tanh>(x)), at(x, any, {n}));
        check_gradient(tg::sum(tg::silu(x)), at(x, any, {n}));
        check_gradient(tg::sum(tg::softplus(x)), at(x, big, {n}));
        check_gradient(tg::sum(tg::softplus<2, 10>(x)), at(x, any, {n}));
        check_gradient(tg::sum(tg::softplus<0.5, 3>(x)), at(x, big, {n}));
        check_gradient(tg::sum(tg::leaky_relu(x)), at(x, any, {n}));
        check_gradient(tg::sum(tg::leaky_relu<0.2>(x)), at(x, any, {n}));
        check_gradient(tg::sum(tg::elu(x)), at(x, any, {n}));
        check_gradient(tg::sum(tg::elu<0.5>(x)), at(x, any, {n}));
        check_gradient(tg::sum(tg::clamp(x, tg::lit<-1>, tg::lit<1>)), at(x, any, {n}));
        check_gradient(tg::sum(tg::clamp_min(x, tg::lit<-1>)), at(x, any, {n}));
        check_gradient(tg::sum(tg::clamp_max(x, tg::lit<1>)), at(x, any, {n}));
        // a weighted sum, so that an error proportional to the value would show
        check_gradient(tg::sum(tg::gelu(x) * tg::exp(x * tg::lit<0.3>)), at(x, any, {n}));
    }
}

TEST_CASE("activations compose, broadcast and differentiate twice", "[ops][activation][gradient][broadcast]") {
    auto mv = away_from(uniform(12, -2.0, 2.0, 71), {0.0});
    auto rv = uniform(3, -1.0, 1.0, 72);
    auto cv = uniform(4, 0.5, 1.5, 73);
    std::vector<double> uv{0.4};
    // [4,3] with [3], [4,1] and [1,1] operands: gradients are summed down to each operand's shape
    check_gradient(tg::sum(tg::gelu(m * r) + tg::silu(m + c)), at(m, mv), at(r, rv), at(c, cv));
    check_gradient(tg::sum(tg::softplus(m * c) * tg::erf(r)), at(m, mv), at(r, rv), at(c, cv));
    check_gradient(tg::sum(tg::elu(m - u) + tg::leaky_relu<0.1>(m * u)), at(m, mv), at(u, uv));
    check_gradient(tg::sum(tg::log1p(tg::square(m)) * tg::expm1(c)), at(m, mv), at(c, cv));
    // second order: d/dx sum(d/dx sum(f(x)) * w) for the activations whose derivative is smooth
    for (std::size_t n : {1u, 9u}) {
        auto any = uniform(n, -2.0, 2.0, 80 + n);
        check_gradient(tg::sum(tg::square(tg::grad(tg::sum(tg::gelu(x)), x))), at(x, any, {n}));
        check_gradient(tg::sum(tg::square(tg::grad(tg::sum(tg::gelu<tg::approximate::tanh>(x)), x))),
                       at(x, any, {n}));
        check_gradient(tg::sum(tg::square(tg::grad(tg::sum(tg::silu(x) + tg::erf(x)), x))), at(x, any, {n}));
        check_gradient(tg::sum(tg::square(tg::grad(tg::sum(tg::softplus<2>(x) + tg::expm1(x)), x))),
                       at(x, any, {n}));
    }
}

TEST_CASE("clamp with tensor bounds: gradients to x, lo and hi", "[ops][activation][gradient][broadcast]") {
    constexpr auto lo = tg::param<"lo", double, tg::shape<3>>;
    constexpr auto hi = tg::param<"hi", double, tg::shape<4, 1>>;
    auto mv = uniform(12, -2.0, 2.0, 91);
    std::vector<double> lov{-1.0, 0.3, -0.5}, hiv{1.5, 0.5, 1.0, -0.2};  // hi < lo on some pairs
    // keep x away from both bounds (a bound tie is a kink)
    for (std::size_t i = 0; i < 12; ++i)
        for (double b : {lov[i % 3], hiv[i / 3]})
            if (std::abs(mv[i] - b) < 1e-3) mv[i] = b + 0.05;
    check_gradient(tg::sum(tg::clamp(m, lo, hi) * tg::exp(m)), at(m, mv), at(lo, lov), at(hi, hiv));

    // closed form: x = [-2, 0.5, 3] against lo = [-1, 1, 0], hi = [1, 2, -1] (the last has lo > hi)
    constexpr auto v = tg::param<"v", double, tg::shape<3>>;
    constexpr auto l3 = tg::param<"l3", double, tg::shape<3>>;
    constexpr auto h3 = tg::param<"h3", double, tg::shape<3>>;
    std::vector<double> xd{-2, 0.5, 3}, ld{-1, 1, 0}, hd{1, 2, -1}, gx(3), gl(3), gh(3);
    auto step = tg::compile(tg::sum(tg::clamp(v, l3, h3)), tg::wrt(v, l3, h3));
    const double total = step.value_and_grad(tg::bind(v, xd), tg::bind(l3, ld), tg::bind(h3, hd), tg::grad_into(v, gx),
                                             tg::grad_into(l3, gl), tg::grad_into(h3, gh));
    CHECK(total == -1 + 1 + -1);  // lo > hi gives hi, as torch.clamp
    CHECK(gx == std::vector<double>{0, 0, 0});
    CHECK(gl == std::vector<double>{1, 1, 0});  // x < lo and lo < hi
    CHECK(gh == std::vector<double>{0, 0, 1});  // x > hi or hi < lo
}

TEST_CASE("activation values match closed forms and PyTorch", "[ops][activation]") {
    const std::vector<double> pts{-3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 25.0};
    const auto gelu = values_of([](auto v) { return tg::gelu(v); }, pts);
    const auto gelu_t = values_of([](auto v) { return tg::gelu<tg::approximate::tanh>(v); }, pts);
    const auto silu = values_of([](auto v) { return tg::silu(v); }, pts);
    const auto softplus = values_of([](auto v) { return tg::softplus(v); }, pts);
    const auto erf = values_of([](auto v) { return tg::erf(v); }, pts);
    const auto log1p = values_of([](auto v) { return tg::log1p(v); }, std::vector<double>{1e-10, 0.5, 3.0});
    const auto expm1 = values_of([](auto v) { return tg::expm1(v); }, std::vector<double>{1e-10, -0.5, 3.0});
    for (std::size_t i = 0; i < pts.size(); ++i) {
        const double p = pts[i];
        INFO("x = " << p);
        CHECK_THAT(gelu[i], Catch::Matchers::WithinAbs(0.5 * p * (1 + std::erf(p / std::sqrt(2.0))), 1e-15));
        const double inner = std::sqrt(2 / M_PI) * (p + 0.044715 * p * p * p);
        CHECK_THAT(gelu_t[i], Catch::Matchers::WithinAbs(0.5 * p * (1 + std::tanh(inner)), 1e-14));
        CHECK_THAT(silu[i], Catch::Matchers::WithinAbs(p / (1 + std::exp(-p)), 1e-14));
        CHECK_THAT(softplus[i], Catch::Matchers::WithinAbs(p > 20 ? p : std::log1p(std::exp(p)), 1e-14));
        CHECK_THAT(erf[i], Catch::Matchers::WithinAbs(std::erf(p), 1e-15 + 4e-16 * 4));  // xsimd erf: a few ulp
    }
    // torch.nn.functional.gelu(torch.tensor(1.0, dtype=torch.float64)) and friends
    CHECK_THAT(gelu[5], Catch::Matchers::WithinRel(0.8413447460685429, 1e-14));
    CHECK_THAT(gelu_t[5], Catch::Matchers::WithinRel(0.8411919906082768, 1e-14));
    CHECK_THAT(silu[5], Catch::Matchers::WithinRel(0.7310585786300049, 1e-14));
    CHECK_THAT(softplus[5], Catch::Matchers::WithinRel(1.3132616875182228, 1e-14));
    CHECK(softplus[7] == 25.0);  // beyond the threshold softplus is x itself
    // log1p and expm1 keep the precision near 0 that log(1 + x) and exp(x) - 1 lose
    CHECK_THAT(log1p[0], Catch::Matchers::WithinRel(std::log1p(1e-10), 1e-15));
    CHECK_THAT(expm1[0], Catch::Matchers::WithinRel(std::expm1(1e-10), 1e-15));
    CHECK_THAT(log1p[2], Catch::Matchers::WithinRel(std::log1p(3.0), 1e-15));
    CHECK_THAT(expm1[1], Catch::Matchers::WithinRel(std::expm1(-0.5), 1e-15));

    const auto lrelu = values_of([](auto v) { return tg::leaky_relu<0.2>(v); }, pts);
    const auto elu = values_of([](auto v) { return tg::elu<0.5>(v); }, pts);
    const auto clamp = values_of([](auto v) { return tg::clamp(v, tg::lit<-0.5>, tg::lit<1>); }, pts);
    for (std::size_t i = 0; i < pts.size(); ++i) {
        const double p = pts[i];
        CHECK(lrelu[i] == (p > 0 ? p : 0.2 * p));
        CHECK_THAT(elu[i], Catch::Matchers::WithinAbs(p > 0 ? p : 0.5 * std::expm1(p), 1e-15));
        CHECK(clamp[i] == std::min(std::max(p, -0.5), 1.0));
    }
}

TEST_CASE("activation edge rules follow PyTorch", "[ops][activation]") {
    const std::vector<double> kinks{-1.0, 0.0, 1.0};
    // leaky_relu'(0) = negative_slope, elu'(0) = alpha (PyTorch: x <= 0 takes the negative side)
    CHECK(grad_of([](auto v) { return tg::leaky_relu<0.2>(v); }, kinks) == std::vector<double>{0.2, 0.2, 1});
    const auto ge = grad_of([](auto v) { return tg::elu<0.5>(v); }, kinks);
    CHECK_THAT(ge[0], Catch::Matchers::WithinRel(0.5 * std::exp(-1.0), 1e-15));
    CHECK(ge[1] == 0.5);
    CHECK(ge[2] == 1);
    // clamp passes the gradient where lo <= x <= hi: both bounds included
    CHECK(grad_of([](auto v) { return tg::clamp(v, tg::lit<-1>, tg::lit<1>); }, std::vector<double>{-1.5, -1, 0, 1, 1.5}) ==
          std::vector<double>{0, 1, 1, 1, 0});
    // softplus: the gradient is exactly 1 past the threshold (x * beta > threshold), sigmoid before
    const auto gs = grad_of([](auto v) { return tg::softplus<2, 10>(v); }, std::vector<double>{5.0, 5.5, 0.0});
    CHECK_THAT(gs[0], Catch::Matchers::WithinRel(1 / (1 + std::exp(-10.0)), 1e-15));
    CHECK(gs[1] == 1);
    CHECK(gs[2] == 0.5);
    // NaN propagates through clamp (torch.clamp), and through the others
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const std::vector<double> with_nan{nan, 2.0};
    CHECK(std::isnan(values_of([](auto v) { return tg::clamp(v, tg::lit<-1>, tg::lit<1>); }, with_nan)[0]));
    CHECK(std::isnan(values_of([](auto v) { return tg::leaky_relu(v); }, with_nan)[0]));
    CHECK(std::isnan(values_of([](auto v) { return tg::elu(v); }, with_nan)[0]));
    CHECK(std::isnan(values_of([](auto v) { return tg::gelu(v); }, with_nan)[0]));
    // infinities
    const double inf = std::numeric_limits<double>::infinity();
    const auto at_inf = values_of([](auto v) { return tg::softplus(v) + tg::erf(v); }, std::vector<double>{-inf, inf});
    CHECK(at_inf[0] == -1);
    CHECK(at_inf[1] == inf);
    CHECK(values_of([](auto v) { return tg::log1p(v); }, std::vector<double>{-1.0})[0] == -inf);
    CHECK(values_of([](auto v) { return tg::expm1(v); }, std::vector<double>{-inf})[0] == -1);
}

TEMPLATE_TEST_CASE("float SIMD bodies and scalar tails agree with a double reference", "[ops][activation]", float,
                   double) {
    // 37 elements: whole batches plus a tail, whatever the SIMD width
    constexpr auto v = tg::param<"v", TestType, tg::shape<tg::dyn>>;
    const auto pts = uniform(37, -6.0, 6.0, 99);
    std::vector<TestType> data(pts.begin(), pts.end());
    auto check = [&](auto f, auto reference, double tol) {
        auto ctx = tg::compile(f(v), tg::wrt(v)).forward(tg::bind(v, data));
        for (std::size_t i = 0; i < data.size(); ++i) {
            INFO("x = " << double(data[i]));
            CHECK_THAT(double(ctx.values()[i]), Catch::Matchers::WithinAbs(reference(double(data[i])), tol));
        }
    };
    const double tol = std::is_same_v<TestType, float> ? 2e-6 : 1e-14;
    check([](auto e) { return tg::erf(e); }, [](double p) { return std::erf(p); }, tol);
    check([](auto e) { return tg::expm1(e * tg::lit<0.5>); }, [](double p) { return std::expm1(p * 0.5); }, tol * 20);
    check([](auto e) { return tg::log1p(tg::abs(e)); }, [](double p) { return std::log1p(std::abs(p)); }, tol);
    check([](auto e) { return tg::gelu(e); }, [](double p) { return 0.5 * p * (1 + std::erf(p / std::sqrt(2.0))); },
          tol * 4);
    check([](auto e) { return tg::gelu<tg::approximate::tanh>(e); },
          [](double p) { return 0.5 * p * (1 + std::tanh(std::sqrt(2 / M_PI) * (p + 0.044715 * p * p * p))); }, tol * 4);
    check([](auto e) { return tg::silu(e); }, [](double p) { return p / (1 + std::exp(-p)); }, tol * 4);
    check([](auto e) { return tg::softplus<2, 4>(e); },
          [](double p) { return 2 * p > 4 ? p : std::log1p(std::exp(2 * p)) / 2; }, tol * 4);
}

TEST_CASE("activation autocast classes follow PyTorch's lists", "[ops][activation][autocast]") {
    constexpr auto h = tg::param<"h", tg::f16, tg::shape<4>>;
    using tg::f16;
    // CUDA fp32 list: softplus, log1p, expm1 run in f32 on f16 input
    STATIC_REQUIRE(std::is_same_v<decltype(tg::autocast<tg::cuda_f16>(tg::softplus(h)))::value_type, float>);
    STATIC_REQUIRE(std::is_same_v<decltype(tg::autocast<tg::cuda_f16>(tg::log1p(h)))::value_type, float>);
    STATIC_REQUIRE(std::is_same_v<decltype(tg::autocast<tg::cuda_f16>(tg::expm1(h)))::value_type, float>);
    // on no list: they keep their input's dtype
    STATIC_REQUIRE(std::is_same_v<decltype(tg::autocast<tg::cuda_f16>(tg::erf(h)))::value_type, f16>);
    STATIC_REQUIRE(std::is_same_v<decltype(tg::autocast<tg::cuda_f16>(tg::gelu(h)))::value_type, f16>);
    STATIC_REQUIRE(std::is_same_v<decltype(tg::autocast<tg::cuda_f16>(tg::silu(h)))::value_type, f16>);
    STATIC_REQUIRE(std::is_same_v<decltype(tg::autocast<tg::cuda_f16>(tg::clamp(h, tg::lit<0>, tg::lit<1>)))::value_type, f16>);
    // CPU: none of them is on a CPU list
    STATIC_REQUIRE(std::is_same_v<decltype(tg::autocast<tg::cpu_f16>(tg::softplus(h)))::value_type, f16>);
    STATIC_REQUIRE(std::is_same_v<decltype(tg::autocast<tg::cpu_f16>(tg::log1p(h)))::value_type, f16>);
}

TEST_CASE("dropout: Philox mask, scale, regenerated in the backward", "[ops][dropout]") {
    constexpr auto v = tg::param<"v", double, tg::shape<tg::dyn, 7>>;
    constexpr auto rng = tg::input<"rng", std::int64_t, tg::shape<2>>;
    constexpr auto q = tg::input<"q", double, tg::shape<tg::dyn, 7>>;
    const std::size_t rows = 1500, n = rows * 7;
    const auto xv = uniform(n, 0.5, 1.5, 7);
    const auto qv = uniform(n, -1.0, 1.0, 8);
    const std::array<std::int64_t, 2> r{1234567890123LL, 17};
    // the mask, computed here from core/philox.hpp: element e uses word e % 4 of block offset + e / 4
    std::vector<bool> keep(n);
    const auto key = tg::philox_key_from_seed(std::uint64_t(r[0]));
    for (std::size_t e = 0; e < n; ++e)
        keep[e] = tg::uniform_float(tg::philox4x32_10(tg::philox_counter_at(std::uint64_t(r[1]) + e / 4), key)[e % 4]) <
                  0.7f;
    const std::size_t kept = std::size_t(std::count(keep.begin(), keep.end(), true));
    // 10500 draws at 0.7: the standard deviation of the count is 47
    CHECK(std::abs(double(kept) - 0.7 * double(n)) < 4 * 47.0);

    auto step = tg::compile(tg::sum(tg::dropout<0.3>(v, rng) * q), tg::wrt(v));
    std::vector<double> g(n);
    const double total = step.value_and_grad(tg::bind(v, xv, {rows, 7}), tg::bind(rng, r), tg::bind(q, qv, {rows, 7}),
                                             tg::grad_into(v, g));
    double expect = 0;
    std::size_t mismatches = 0;
    for (std::size_t e = 0; e < n; ++e) {
        const double m = keep[e] ? 1 / 0.7 : 0.0;
        expect += xv[e] * m * qv[e];
        mismatches += g[e] != qv[e] * m;
    }
    CHECK(mismatches == 0);
    CHECK_THAT(total, Catch::Matchers::WithinRel(expect, 1e-12));
    // forward then backward later: the backward regenerates the same mask (no stored mask: the
    // backward graph holds a dropout node of the gradient)
    auto fwd = step.forward(tg::bind(v, xv, {rows, 7}), tg::bind(rng, r), tg::bind(q, qv, {rows, 7}));
    std::vector<double> g2(n);
    step.backward(fwd, tg::grad_into(v, g2));
    CHECK(g2 == g);
    STATIC_REQUIRE(tg::op_dtypes_t<tg::backward_nodes_t<decltype(step)>, "dropout">::size == 1);
    // another offset, another mask; the gradient is linear in x: finite differences agree
    const std::array<std::int64_t, 2> r2{1234567890123LL, 18};
    std::vector<double> g3(n);
    step.value_and_grad(tg::bind(v, xv, {rows, 7}), tg::bind(rng, r2), tg::bind(q, qv, {rows, 7}), tg::grad_into(v, g3));
    CHECK(g3 != g);
    const auto small = uniform(14, -1.0, 1.0, 9);
    check_gradient(tg::sum(tg::square(tg::dropout<0.5>(v, rng))), tg::testing::fixed(tg::bind(rng, r)),
                   at(v, small, {2, 7}));
    // p = 0 and inference are the identity; p = 1 zeroes
    STATIC_REQUIRE(std::is_same_v<decltype(tg::dropout<0.0>(v, rng)), std::remove_cvref_t<decltype(v)>>);
    STATIC_REQUIRE(std::is_same_v<decltype(tg::dropout<0.3, false>(v, rng)), std::remove_cvref_t<decltype(v)>>);
    auto all = tg::compile(tg::dropout<1.0>(v, rng), tg::wrt(v)).forward(tg::bind(v, xv, {rows, 7}), tg::bind(rng, r));
    CHECK(std::all_of(all.values().begin(), all.values().end(), [](double e) { return e == 0; }));
}
