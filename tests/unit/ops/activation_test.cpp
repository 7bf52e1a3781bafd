// Activations and special functions (ops/activation.hpp, ops/special.hpp): gradients against
// finite differences in double over several shapes (size-1 axes, broadcasting), values against
// closed forms and PyTorch's numbers, PyTorch's edge rules, SIMD body against scalar tail, and
// the autocast classes.
#include <check_gradient.hpp>
#include <special_values.hpp>

#include <cmath>
#include <limits>

namespace tg = typegrad;
using tg::testing::inf;
using tg::testing::qnan;
using tg::testing::same_special;
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

TEST_CASE("erf and gelu of huge values are +-1 and x (or -0), as in PyTorch", "[ops][gelu][edge]") {
    // xsimd 8.1's double erf is NaN from |x| of about 1e100 on; PyTorch: gelu(1e300) = 1e300 with
    // gradient 1, gelu(-1e300) = -0 with gradient 0, gelu(+-inf) = inf / NaN.
    constexpr auto x = tg::param<"x", double, tg::shape<tg::dyn>>;
    constexpr double dinf = std::numeric_limits<double>::infinity();
    std::vector<double> xd{3.9e305, -3.9e305, 1e100, -1e100, 1e300, -1e300, dinf, -dinf, 6, -6, 30, -30, 1, 2, 0.5, -0.5, 1e10};
    auto g = tg::compile(tg::gelu(x), tg::wrt(x));
    auto gs = tg::compile(tg::sum(tg::gelu(x)), tg::wrt(x));
    auto gctx = g.forward(tg::bind(x, xd));
    std::vector<double> gx(xd.size());
    gs.value_and_grad(tg::bind(x, xd), tg::grad_into(x, gx));
    for (std::size_t i = 0; i < xd.size(); ++i) {
        INFO("x = " << xd[i]);
        const double want = xd[i] * 0.5 * (1 + std::erf(xd[i] / std::sqrt(2.0)));  // NaN at -inf, as PyTorch
        const double got = gctx.values()[i];
        if (std::isnan(want)) CHECK(std::isnan(got));
        else if (std::isinf(want)) CHECK(got == want);
        else CHECK(std::abs(got - want) <= 1e-14 * std::abs(want));
        if (std::abs(xd[i]) >= 1e10 && std::isfinite(xd[i])) {
            CHECK(std::signbit(got) == std::signbit(want));
            CHECK(gx[i] == (xd[i] > 0 ? 1.0 : 0.0));
        }
    }
    CHECK(std::isnan(gx[6]));  // inf * exp(-inf) ... as PyTorch: NaN at +-inf
    CHECK(std::isnan(gx[7]));
    std::vector<double> one(1);
    for (double v : {1e100, -1e100, 1e300, -dinf, 6.5, 7.5}) {
        one[0] = v;
        auto ctx = tg::compile(tg::erf(x), tg::wrt(x)).forward(tg::bind(x, one));
        CHECK(ctx.values()[0] == std::erf(v));  // exactly +-1 beyond 6
    }
}

TEST_CASE("clamp's gradient selects (NaN stays out), softplus's is z / (z + 1) down to subnormals", "[ops][clamp][softplus][edge]") {
    // PyTorch's clamp_backward is where(lo <= x <= hi, grad, 0): a NaN gradient arriving at a NaN
    // x (max of a NaN, through erf) is not passed on; typegrad multiplied by the 0/1 mask (NaN).
    constexpr auto b = tg::param<"b", float, tg::shape<tg::dyn>>;
    auto e4 = tg::clamp(tg::leaky_relu<0.2>(b), tg::lit<0.0>, tg::lit<2.0>);
    auto step = tg::compile(tg::min(tg::min(b, tg::erf(tg::max(e4)))) + tg::sum(e4), tg::wrt(b));
    std::vector<float> bd{1.4372420310974121f, -0.85728657245635986f, -1.6654031276702881f, 1.4372420310974121f, qnan};
    std::vector<float> g(5);
    const float l = step.value_and_grad(tg::bind(b, bd), tg::grad_into(b, g));
    CHECK(std::isnan(l));
    // LibTorch 1.13: min of the all-NaN minimum gives each element 1/5; the sum adds 1 where
    // 0 <= leaky_relu(b) <= 2 (b > 0: slope 1), and 0 elsewhere (clamped, or NaN)
    const float want[] = {1.2f, 0.2f, 0.2f, 1.2f, 0.2f};
    for (int i = 0; i < 5; ++i) {
        INFO("i = " << i);
        CHECK(std::abs(g[i] - want[i]) <= 1e-6f);
    }
    // softplus at beta x = -90: PyTorch's z / (z + 1) = exp(-90) = 8.2e-40 (subnormal in float);
    // sigmoid(-90) computed as 1 / (1 + exp(90)) is 0 there
    constexpr auto c = tg::param<"c", float, tg::shape<tg::dyn>>;
    std::vector<float> cd{-90.f, -20.f, 0.f, 19.f}, gc(4);
    tg::compile(tg::sum(tg::softplus<1.0>(c)), tg::wrt(c)).value_and_grad(tg::bind(c, cd), tg::grad_into(c, gc));
    for (int i = 0; i < 4; ++i) {
        INFO("x = " << cd[i]);
        const double z = std::exp(double(cd[i]));
        CHECK(same_special(gc[i], z / (z + 1)));
    }
    CHECK(gc[0] > 0);
}
