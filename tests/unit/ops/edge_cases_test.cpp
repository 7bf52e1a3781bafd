// Edge cases where typegrad must give PyTorch's documented results (issue 17): precision of
// softmax at large inputs, masked (-inf) logits, pow's special values, several post-accumulate
// hooks, and one broadcasting rule for dynamic extents in every entry point.
#include <check_gradient.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace tg = typegrad;

namespace {
constexpr float inf = std::numeric_limits<float>::infinity();
constexpr float qnan = std::numeric_limits<float>::quiet_NaN();

template <class Step, class... Bs>
std::vector<float> values_of(Step& step, Bs... bs) {
    auto ctx = step.forward(bs...);
    return std::vector<float>(ctx.values().begin(), ctx.values().end());
}

// Same value, with NaN equal to NaN and the sign of zeros and infinities compared.
bool same_special(float got, double want) {
    if (std::isnan(want)) return std::isnan(got);
    if (std::isinf(want) || want == 0) return double(got) == want && std::signbit(got) == std::signbit(want);
    // exp(y log|x|) in float: |y log x| ulps of error at most, and subnormals are coarse
    return std::abs(got - want) <= 1e-5 * std::abs(want) + 2 * std::numeric_limits<float>::denorm_min();
}
}  // namespace

TEST_CASE("log_softmax and softmax keep their precision at large inputs (float)", "[ops][softmax][edge]") {
    constexpr auto x = tg::param<"x", float, tg::shape<3>>;
    auto ls = tg::compile(tg::log_softmax(x), tg::wrt(x));
    auto sm = tg::compile(tg::softmax(x), tg::wrt(x));
    // [c, c+1, c+2] is exact in float; the result does not depend on c
    const double lse = std::log(1 + std::exp(1.0) + std::exp(2.0));
    for (float c : {0.f, 1e3f, 1e5f, -1e6f}) {
        INFO("c = " << c);
        std::vector<float> xd{c, c + 1, c + 2};
        const auto l = values_of(ls, tg::bind(x, xd));
        const auto s = values_of(sm, tg::bind(x, xd));
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

TEST_CASE("cross_entropy with a masked (-inf) logit of another class is finite, as in PyTorch", "[ops][loss][edge]") {
    constexpr auto logits = tg::param<"logits", float, tg::shape<tg::dyn, 3>>;
    constexpr auto labels = tg::input<"labels", std::int64_t, tg::shape<tg::dyn>>;
    auto step = tg::compile(tg::cross_entropy(logits, labels), tg::wrt(logits));
    std::vector<float> ld{0, -inf, 0, -inf, 1, -inf}, g(6);
    std::vector<std::int64_t> lab{0, 1};
    const float l = step.value_and_grad(tg::bind(logits, ld, {2, 3}), tg::bind(labels, lab), tg::grad_into(logits, g));
    // rows: log 2 and 0 (PyTorch: torch.nn.functional.cross_entropy gives the same)
    CHECK_THAT(l, Catch::Matchers::WithinRel(float(std::log(2.0) / 2), 1e-6f));
    const std::vector<float> want{-0.25f, 0, 0.25f, 0, 0, 0};
    for (int i = 0; i < 6; ++i) CHECK_THAT(g[i], Catch::Matchers::WithinAbs(want[i], 1e-7));
    // nll_loss on log-probabilities with -inf entries: the same
    auto nll = tg::compile(tg::nll_loss(tg::log_softmax(logits, tg::axes<1>), labels), tg::wrt(logits));
    CHECK_THAT(nll.value_and_grad(tg::bind(logits, ld, {2, 3}), tg::bind(labels, lab), tg::grad_into(logits, g)),
               Catch::Matchers::WithinRel(float(std::log(2.0) / 2), 1e-6f));
    // the label's own logit masked: +inf, as in PyTorch
    std::vector<std::int64_t> masked{1, 1};
    CHECK(step.value_and_grad(tg::bind(logits, ld, {2, 3}), tg::bind(labels, masked), tg::grad_into(logits, g)) == inf);
}

TEST_CASE("pow follows C's (and PyTorch's) special values, zero bases included", "[ops][pow][edge]") {
    constexpr auto x = tg::param<"x", float, tg::shape<tg::dyn>>;
    constexpr auto y = tg::param<"y", float, tg::shape<tg::dyn>>;
    auto step = tg::compile(tg::pow(x, y), tg::wrt(x, y));
    const std::vector<float> special{0.f, -0.f, 1.f, -1.f, 0.5f, -0.5f, 2.f, -2.f, 2.5f, -3.f, 3.f,
                                     inf, -inf, qnan, 1e-40f, -1e-40f, 1e30f, -1e30f};
    // all pairs, more than a SIMD width: batch bodies and loop tails
    std::vector<float> xd, yd;
    for (float a : special)
        for (float b : special) xd.push_back(a), yd.push_back(b);
    const auto r = values_of(step, tg::bind(x, xd, {xd.size()}), tg::bind(y, yd, {yd.size()}));
    for (std::size_t i = 0; i < xd.size(); ++i) {
        const double want = double(std::pow(xd[i], yd[i]));  // float pow, rounded as typegrad's
        INFO("pow(" << xd[i] << ", " << yd[i] << ") = " << r[i] << ", C gives " << want);
        CHECK(same_special(r[i], want));
    }
    // gradients at a zero base, against PyTorch's pow_backward: d/dx is 0 where y == 0
    auto grads = tg::compile(tg::sum(tg::pow(x, y)), tg::wrt(x, y));
    std::vector<float> x0{0, 0, 0, 0, 0}, y0{1, 0, 2, 0.5f, -1}, gx(5), gy(5);
    const float v = grads.value_and_grad(tg::bind(x, x0, {5}), tg::bind(y, y0, {5}), tg::grad_into(x, gx), tg::grad_into(y, gy));
    CHECK(v == inf);  // 0 + 1 + 0 + 0 + inf
    CHECK(gx[0] == 1.f);   // 1 * 0^0
    CHECK(gx[1] == 0.f);   // masked: 0 * 0^-1 would be NaN
    CHECK(gx[2] == 0.f);   // 2 * 0^1
    CHECK(gx[3] == inf);   // 0.5 * 0^-0.5
    CHECK(gx[4] == -inf);  // -1 * 0^-2
    for (int i = 0; i < 4; ++i) CHECK(gy[i] == 0.f);  // x == 0, y >= 0: 0 by convention
    // pow(x, constant) and the gradient away from the special points
    constexpr auto xd64 = tg::param<"x", double, tg::shape<3>>;
    tg::testing::check_gradient(tg::sum(tg::pow(xd64, tg::lit<3>)), tg::testing::at(xd64, std::vector<double>{0.0, -1.5, 2.0}));
}

namespace {
std::vector<int> post_hook_calls;
}  // namespace

TEST_CASE("several post-accumulate hooks on one param run in registration order", "[hooks][post][edge]") {
    constexpr auto p = tg::param<"p", float, tg::shape<3>>;
    auto hooked = tg::post_accumulate_grad_hook(
        tg::post_accumulate_grad_hook(p, [](tg::grad_view<float>, tg::grad_view<float>) { post_hook_calls.push_back(1); }),
        [](tg::grad_view<float> param, tg::grad_view<float> grad) {
            post_hook_calls.push_back(2);
            for (std::size_t i = 0; i < param.size(); ++i) param[i] -= grad[i];  // an SGD step
        });
    std::vector<float> pd{1, 2, 3}, g(3);
    post_hook_calls.clear();
    tg::compile(tg::sum(tg::square(hooked)), tg::wrt(p)).value_and_grad(tg::bind(p, pd), tg::grad_into(p, g));
    CHECK(post_hook_calls == std::vector<int>{1, 2});
    CHECK(g == std::vector<float>{2, 4, 6});
    CHECK(pd == std::vector<float>{-1, -2, -3});
}

TEST_CASE("a dynamic matmul batch extent bound as 1 does not broadcast, in forward() as in value_and_grad()",
          "[ops][matmul][dynamic][edge]") {
    constexpr auto a = tg::param<"a", float, tg::shape<tg::dyn, 2, 3>>;
    constexpr auto w = tg::param<"w", float, tg::shape<2, 3, 4>>;
    auto step = tg::compile(tg::sum(tg::matmul(a, w)), tg::wrt(a, w));
    std::vector<float> ad(6, 1.f), wd(24, 1.f), ga(6, 7.f), gw(24, 7.f);
    CHECK_THROWS_AS(step.forward(tg::bind(a, ad, {1, 2, 3}), tg::bind(w, wd)), tg::shape_error);
    CHECK_THROWS_AS(step.value_and_grad(tg::bind(a, ad, {1, 2, 3}), tg::bind(w, wd), tg::grad_into(a, ga),
                                        tg::grad_into(w, gw)),
                    tg::shape_error);
    CHECK(ga == std::vector<float>(6, 7.f));
    // a static 1 broadcasts, in both
    constexpr auto a1 = tg::param<"a1", float, tg::shape<1, 2, 3>>;
    auto bcast = tg::compile(tg::sum(tg::matmul(a1, w)), tg::wrt(a1, w));
    CHECK(bcast.forward(tg::bind(a1, ad), tg::bind(w, wd)).value() == 48.f);
    CHECK(bcast.value_and_grad(tg::bind(a1, ad), tg::bind(w, wd), tg::grad_into(a1, ga), tg::grad_into(w, gw)) == 48.f);
    CHECK(ga == std::vector<float>(6, 8.f));
}

// Found by the differential test's special values: xsimd 8.1's batch `!=` is false for NaN on
// AVX and AVX-512, so NaN checks written `a != a` saw no NaN in SIMD batches (only in tails).
TEST_CASE("NaN propagates through relu, min/max and reductions in SIMD batches, with PyTorch's gradients",
          "[ops][nan][edge]") {
    constexpr auto x = tg::param<"x", float, tg::shape<tg::dyn>>;
    constexpr auto y = tg::param<"y", float, tg::shape<tg::dyn>>;
    const std::size_t n = 37;  // batches and a tail, whatever the SIMD width
    for (std::size_t at : {std::size_t(0), std::size_t(5), std::size_t(36)}) {
        INFO("NaN at " << at);
        std::vector<float> xd(n), yd(n, 0.5f), gx(n), gy(n);
        for (std::size_t i = 0; i < n; ++i) xd[i] = float(i % 7) - 3;
        xd[at] = qnan;
        // relu(NaN) is NaN and passes the gradient (threshold_backward: 0 only where x <= 0)
        auto r = tg::compile(tg::sum(tg::relu(x)), tg::wrt(x));
        CHECK(std::isnan(r.value_and_grad(tg::bind(x, xd), tg::grad_into(x, gx))));
        CHECK(gx[at] == 1.f);
        // max / min reductions: NaN; the gradient goes to the NaN element (evenly_distribute_backward)
        auto mx = tg::compile(tg::max(x), tg::wrt(x));
        CHECK(std::isnan(mx.value_and_grad(tg::bind(x, xd), tg::grad_into(x, gx))));
        for (std::size_t i = 0; i < n; ++i) CHECK(gx[i] == (i == at ? 1.f : 0.f));
        auto mn = tg::compile(tg::min(x), tg::wrt(x));
        CHECK(std::isnan(mn.value_and_grad(tg::bind(x, xd), tg::grad_into(x, gx))));
        CHECK(gx[at] == 1.f);
        // maximum / minimum: NaN; both sides get the whole gradient (no order)
        auto bin = tg::compile(tg::sum(tg::max(x, y) + tg::min(x, y)), tg::wrt(x, y));
        CHECK(std::isnan(bin.value_and_grad(tg::bind(x, xd), tg::bind(y, yd), tg::grad_into(x, gx), tg::grad_into(y, gy))));
        CHECK(gx[at] == 2.f);
        CHECK(gy[at] == 2.f);
        CHECK(gx[(at + 1) % n] + gy[(at + 1) % n] == 2.f);
        // where: a NaN condition is nonzero, so true
        constexpr auto c = tg::input<"c", float, tg::shape<tg::dyn>>;
        auto w = tg::compile(tg::where(c, c * tg::lit<0>, y), tg::wrt(y));
        const auto v = values_of(w, tg::bind(c, xd), tg::bind(y, yd));
        CHECK(std::isnan(v[at]));
    }
}

TEST_CASE("exp reaches subnormal results and overflows only past the largest float", "[ops][exp][edge]") {
    constexpr auto x = tg::param<"x", float, tg::shape<tg::dyn>>;
    auto step = tg::compile(tg::exp(x), tg::wrt(x));
    std::vector<float> xd(33, -90.f);
    xd[3] = 88.7f;
    xd[20] = 89.f;
    xd[32] = -104.f;
    const auto r = values_of(step, tg::bind(x, xd));
    CHECK(r[0] == std::exp(-90.f));  // 8.2e-40, was 0
    CHECK(r[3] == std::exp(88.7f));  // 3.3e38, was inf
    CHECK(r[20] == inf);
    CHECK(r[32] == 0.f);
    // infinite and NaN lanes stay on the vector path (xsimd's exp is right there), beside lanes
    // that take the C library's (first batch) and in batches of their own (masked logits)
    std::vector<float> xi(48, -inf);
    xi[1] = -90.f;
    xi[2] = inf;
    xi[3] = std::numeric_limits<float>::quiet_NaN();
    xi[17] = inf;
    const auto ri = values_of(step, tg::bind(x, xi));
    CHECK(ri[0] == 0.f);
    CHECK(ri[1] == std::exp(-90.f));
    CHECK(ri[2] == inf);
    CHECK(std::isnan(ri[3]));
    CHECK(ri[17] == inf);
    for (std::size_t i = 4; i < xi.size(); ++i)
        if (i != 17) CHECK(ri[i] == 0.f);
    constexpr auto xd64 = tg::param<"x", double, tg::shape<2>>;
    std::vector<double> d{-720.0, 709.5};
    auto s64 = tg::compile(tg::exp(xd64), tg::wrt(xd64)).forward(tg::bind(xd64, d));
    CHECK(s64.values()[0] == std::exp(-720.0));
    CHECK(s64.values()[1] == std::exp(709.5));
}

TEST_CASE("log and pow of subnormal doubles", "[ops][log][edge]") {
    // xsimd 8.1's double log of a subnormal was off by up to ln(2^52): found by the differential test
    constexpr auto x = tg::param<"x", double, tg::shape<tg::dyn>>;
    std::vector<double> xd(11, 4.9406564584124654e-321);
    xd[2] = 1e-310;
    xd[9] = 2.5;
    auto lg = tg::compile(tg::log(x), tg::wrt(x)).forward(tg::bind(x, xd));
    auto pw = tg::compile(tg::pow(x, tg::lit<-0.5>), tg::wrt(x)).forward(tg::bind(x, xd));
    for (std::size_t i = 0; i < xd.size(); ++i) {
        INFO("x = " << xd[i]);
        CHECK_THAT(lg.values()[i], Catch::Matchers::WithinRel(std::log(xd[i]), 1e-14));
        CHECK_THAT(pw.values()[i], Catch::Matchers::WithinRel(std::pow(xd[i], -0.5), 1e-12));
    }
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
    const auto s = values_of(sm, tg::bind(x, xd, {6, 2}));
    const auto l = values_of(ls, tg::bind(x, xd, {6, 2}));
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

namespace {
// PyTorch's CPU layer_norm backward for x (LayerNormBackwardKernelImplInternal, LibTorch 1.13), in
// double, over one row: ds = sum(dY x gamma), db = sum(dY gamma), dx = a dY gamma + b x + c.
std::vector<double> torch_layer_norm_dx(const std::vector<double>& x, const std::vector<double>& dy,
                                        const std::vector<double>& gamma, double eps) {
    const double n = double(x.size());
    double mean = 0, var = 0, db = 0, ds = 0;
    for (double v : x) mean += v / n;
    for (double v : x) var += (v - mean) * (v - mean) / n;
    for (std::size_t i = 0; i < x.size(); ++i) {
        ds += dy[i] * x[i] * gamma[i];
        db += dy[i] * gamma[i];
    }
    const double a = 1 / std::sqrt(var + eps), scale = 1 / n;
    const double b = (db * mean - ds) * a * a * a * scale, c = -b * mean - db * a * scale;
    std::vector<double> dx(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) dx[i] = a * dy[i] * gamma[i] + b * x[i] + c;
    return dx;
}
}  // namespace

TEST_CASE("layer_norm's gradient with an infinite incoming gradient is PyTorch's, not NaN everywhere",
          "[ops][norm][edge]") {
    // Finding 19 (graph 2002): the derivative of the composite sums the gradient through the mean
    // and through the variance separately, and an infinite g made every element NaN; PyTorch's
    // kernel gives +-inf where its formula a g + b x + c does (NaN where x or a g cancel it).
    constexpr auto x = tg::param<"x", double, tg::shape<tg::dyn, 6>>;
    constexpr auto q = tg::input<"q", double, tg::shape<tg::dyn, 6>>;
    constexpr double dinf = std::numeric_limits<double>::infinity();
    std::vector<double> xd{1, 2, 3, 1, -100, 0, 0.5, -1, 2, 3, -4, 1}, qd{0.5, 0, 0, -dinf, 0, 0.25, 1, -1, 2, 0.5, 0, 1},
        g(12);
    const auto step = tg::compile(tg::sum(tg::layer_norm(x) * q), tg::wrt(x));
    step.value_and_grad(tg::bind(x, xd, {2, 6}), tg::bind(q, qd, {2, 6}), tg::grad_into(x, g));
    for (std::size_t r = 0; r < 2; ++r) {
        const std::vector<double> xr(xd.begin() + 6 * r, xd.begin() + 6 * r + 6), qr(qd.begin() + 6 * r, qd.begin() + 6 * r + 6);
        const auto want = torch_layer_norm_dx(xr, qr, std::vector<double>(6, 1.0), 1e-5);
        for (std::size_t i = 0; i < 6; ++i) {
            INFO("row " << r << ", i = " << i << ": " << g[6 * r + i] << " against " << want[i]);
            if (std::isfinite(want[i])) CHECK(std::abs(g[6 * r + i] - want[i]) <= 1e-12 * (1 + std::abs(want[i])));
            else CHECK((std::isnan(want[i]) ? std::isnan(g[6 * r + i]) : g[6 * r + i] == want[i]));
        }
    }
    // row 0 by hand: b = +inf (db = -inf, mean < 0), so +inf where x > 0 and NaN at x <= 0
    CHECK(g[0] == dinf);
    CHECK(g[1] == dinf);
    CHECK(std::isnan(g[3]));
    CHECK(std::isnan(g[4]));
    // with a weight, the kernel's order of products: dY gamma = -720 * 1e306 overflows to -inf, but
    // dY x gamma at x = 0 is 0, so ds is finite and dx is +inf where LibTorch's is (graph 2002)
    constexpr auto w = tg::param<"w", double, tg::shape<6>>;
    std::vector<double> x1{-2.0949096326959271, 2.3092231435622619, 0.76731257638245953, 0.47851377568577025,
                           -0.88742855058058367, 0},
        w1{1.3147260750630738, 1.182002930117819, -720, 709.5, 1.3427477734532451, 1e306},
        q1{-0.83302792870116715, -1, 0.97591607830086979, -0.64701204457559003, -0.22842579285386655, -720}, g1(6), gw(6);
    tg::compile(tg::sum(tg::layer_norm(x, w) * q), tg::wrt(x, w))
        .value_and_grad(tg::bind(x, x1, {1, 6}), tg::bind(w, w1), tg::bind(q, q1, {1, 6}), tg::grad_into(x, g1),
                        tg::grad_into(w, gw));
    const auto want1 = torch_layer_norm_dx(x1, q1, w1, 1e-5);
    for (std::size_t i = 0; i < 6; ++i) {
        INFO("i = " << i << ": " << g1[i] << " against " << want1[i]);
        if (std::isfinite(want1[i])) CHECK(std::abs(g1[i] - want1[i]) <= 1e-12 * (1 + std::abs(want1[i])));
        else CHECK((std::isnan(want1[i]) ? std::isnan(g1[i]) : g1[i] == want1[i]));
    }
    CHECK(g1[0] == dinf);  // LibTorch 1.13: inf (was NaN: ds = sum((dY gamma) x) = -inf * 0)
}

TEST_CASE("batch_norm's gradient with an infinite incoming gradient is PyTorch's, not NaN everywhere",
          "[ops][batch_norm][edge]") {
    // Finding 19 (graph 2006). PyTorch (batch_norm_cpu_backward_contiguous_impl), per channel:
    // dx = (dy - sum(dy) / N - (x - mean) dotp invstd^2 / N) invstd w, dotp = sum((x - mean) dy).
    constexpr auto x = tg::param<"x", double, tg::shape<4, 1>>;
    constexpr auto w = tg::param<"w", double, tg::shape<1>>;
    constexpr auto b = tg::param<"b", double, tg::shape<1>>;
    constexpr auto q = tg::input<"q", double, tg::shape<4, 1>>;
    constexpr double dinf = std::numeric_limits<double>::infinity();
    std::vector<double> xd{1, 2, 4, -3}, qd{0.5, dinf, 0, 1}, wd{2}, bd{0.5}, gx(4), gw(1), gb(1);
    tg::compile(tg::sum(tg::batch_norm(x, w, b) * q), tg::wrt(x, w, b))
        .value_and_grad(tg::bind(x, xd), tg::bind(w, wd), tg::bind(b, bd), tg::bind(q, qd), tg::grad_into(x, gx),
                        tg::grad_into(w, gw), tg::grad_into(b, gb));
    double mean = 0, var = 0, sum = 0, dotp = 0;
    for (double v : xd) mean += v / 4;
    for (double v : xd) var += (v - mean) * (v - mean) / 4;
    for (int i = 0; i < 4; ++i) {
        sum += qd[i];
        dotp += (xd[i] - mean) * qd[i];
    }
    const double invstd = 1 / std::sqrt(var + 1e-5), k = dotp * invstd * invstd / 4;
    for (int i = 0; i < 4; ++i) {
        const double want = (qd[i] - sum / 4 - (xd[i] - mean) * k) * invstd * wd[0];
        INFO("i = " << i << ": " << gx[i] << " against " << want);
        CHECK((std::isnan(want) ? std::isnan(gx[i]) : gx[i] == want));
    }
    // mean 1, dotp = +inf: NaN at x = mean (0 * inf), at the inf and at x < mean; -inf at x = 4
    CHECK(gx[2] == -dinf);
    CHECK(gw[0] == dinf);  // dotp invstd
    CHECK(gb[0] == dinf);  // sum(dy)
}

TEST_CASE("conv1d/conv2d: the padding takes part in no product, so an infinite weight or gradient stays +-inf",
          "[ops][conv][edge]") {
    // Finding 19 (graph 2003): the im2col GEMM multiplied the zeros standing for the padding by the
    // other operand, and 0 * inf is NaN; PyTorch's float CPU path (oneDNN) and cuDNN read no
    // padding. x = [1, 2, 3], w = [w0, w1, w2], padding 1: y_l = w0 x_{l-1} + w1 x_l + w2 x_{l+1}.
    constexpr auto x = tg::param<"x", float, tg::shape<1, 1, 3>>;
    constexpr auto w = tg::param<"w", float, tg::shape<1, 1, 3>>;
    constexpr auto q = tg::input<"q", float, tg::shape<1, 1, 3>>;
    std::vector<float> xd{1, 2, 3}, wd{inf, 1, 1}, qd{1, 1, 1}, gx(3), gw(3);
    auto y = tg::compile(tg::conv1d<1, 1>(x, w), tg::wrt(x));
    const auto yv = values_of(y, tg::bind(x, xd), tg::bind(w, wd));
    CHECK(yv[0] == 3.f);  // w0 meets the padding only: 1 * 1 + 1 * 2 (was NaN)
    CHECK(yv[1] == inf);
    CHECK(yv[2] == inf);
    // dw_k = sum_l q_l x_{l+k-1} over the positions inside x; q_0 = inf meets the padding at k = 0
    wd = {1, 1, 1};
    qd = {inf, 1, 1};
    tg::compile(tg::sum(tg::conv1d<1, 1>(x, w) * q), tg::wrt(x, w))
        .value_and_grad(tg::bind(x, xd), tg::bind(w, wd), tg::bind(q, qd), tg::grad_into(x, gx), tg::grad_into(w, gw));
    CHECK(gw[0] == 3.f);  // 1 * x_0 + 1 * x_1 (was NaN)
    CHECK(gw[1] == inf);
    CHECK(gw[2] == inf);
    CHECK(gx[0] == inf);  // dx_j = sum_l q_l w_{j-l+1}
    CHECK(gx[1] == inf);
    CHECK(gx[2] == 2.f);
    // conv2d, stride 2: the same through the direct loops
    constexpr auto x2 = tg::param<"x2", double, tg::shape<1, 1, 3, 3>>;
    constexpr auto w2 = tg::param<"w2", double, tg::shape<1, 1, 2, 2>>;
    constexpr double dinf = std::numeric_limits<double>::infinity();
    std::vector<double> x2d{1, 2, 3, 4, 5, 6, 7, 8, 9}, w2d{dinf, 1, 1, 1}, g2(4);
    // outputs 2 x 2 of windows at rows/cols {-1, 1}: y_00 = w3 x_00, y_01 = w2 x_01 + w3 x_02, ...
    const auto y2 = tg::compile(tg::conv2d<2, 1>(x2, w2), tg::wrt(x2)).forward(tg::bind(x2, x2d), tg::bind(w2, w2d));
    const std::vector<double> v2(y2.values().begin(), y2.values().end());
    CHECK(v2[0] == 1);
    CHECK(v2[1] == 2 + 3);
    CHECK(v2[2] == 4 + 7);
    CHECK(v2[3] == dinf);
}

TEST_CASE("conv2d with groups and dilation: the direct loops for non-finite operands read each group's own channels",
          "[ops][conv][edge]") {
    // An infinite weight of output channel 2 (group 1) sends conv2d through the direct loops; every
    // other output channel must equal the GEMM path's result with that weight set to 0, and so must
    // channel 2 where that tap reads the padding.
    constexpr auto x = tg::param<"x", double, tg::shape<1, 4, 5, 5>>;
    constexpr auto w = tg::param<"w", double, tg::shape<4, 2, 2, 2>>;  // groups 2: 2 input channels each
    constexpr auto q = tg::input<"q", double, tg::shape<1, 4, 7, 7>>;
    constexpr double dinf = std::numeric_limits<double>::infinity();
    std::vector<double> xd(100), wd(32), qd(196, 1.0);
    for (std::size_t i = 0; i < xd.size(); ++i) xd[i] = std::sin(0.37 * double(i) + 0.1);
    for (std::size_t i = 0; i < wd.size(); ++i) wd[i] = std::cos(0.53 * double(i) + 0.2);
    // stride 1, padding 2, dilation 2 (a 3 x 3 span), groups 2: 7 x 7 outputs
    const auto conv = tg::conv2d<1, 2, 2, 2>(x, w);
    const auto step = tg::compile(conv, tg::wrt(x));
    std::vector<double> w_zero = wd, w_inf = wd;
    w_zero[2 * 8 + 3] = 0;  // channel 2, input channel 0 of its group, tap (1, 1): reads x[oh, ow]
    w_inf[2 * 8 + 3] = dinf;
    const auto ref = values_of(step, tg::bind(x, xd), tg::bind(w, w_zero));
    const auto got = values_of(step, tg::bind(x, xd), tg::bind(w, w_inf));
    REQUIRE(got.size() == 196);
    for (std::size_t o = 0; o < 4; ++o)
        for (std::size_t oh = 0; oh < 7; ++oh)
            for (std::size_t ow = 0; ow < 7; ++ow) {
                const std::size_t e = (o * 7 + oh) * 7 + ow;
                if (o == 2 && oh < 5 && ow < 5) CHECK(std::isinf(got[e]));
                else CHECK(got[e] == Approx(ref[e]).epsilon(1e-12));
            }
    // the weight gradient with an infinite incoming gradient at one pixel of channel 0 (group 0):
    // channels 1 to 3 get the GEMM path's gradient
    std::vector<double> q_inf = qd, gw_ref(32), gw_got(32), gx(100);
    q_inf[0] = dinf;
    const auto grad_step = tg::compile(tg::sum(conv * q), tg::wrt(x, w));
    grad_step.value_and_grad(tg::bind(x, xd), tg::bind(w, wd), tg::bind(q, qd), tg::grad_into(x, gx),
                             tg::grad_into(w, gw_ref));
    grad_step.value_and_grad(tg::bind(x, xd), tg::bind(w, wd), tg::bind(q, q_inf), tg::grad_into(x, gx),
                             tg::grad_into(w, gw_got));
    for (std::size_t i = 8; i < 32; ++i) CHECK(gw_got[i] == Approx(gw_ref[i]).epsilon(1e-12));
}

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
    for (const double v : values_of(e, tg::bind(x, xd))) CHECK(std::signbit(v));
    for (const double v : values_of(l, tg::bind(x, xd))) CHECK(std::signbit(v));
    for (const double v : values_of(ef, tg::bind(xf, xfd))) CHECK(std::signbit(v));
    for (const double v : values_of(lf, tg::bind(xf, xfd))) CHECK(std::signbit(v));
    constexpr auto c = tg::param<"c", double, tg::shape<tg::dyn>>;
    std::vector<double> cd(19, -0.0);
    auto p = tg::compile(tg::pow(tg::expm1(c), tg::lit<-1>), tg::wrt(c));
    for (const double v : values_of(p, tg::bind(c, cd))) CHECK(v == -std::numeric_limits<double>::infinity());
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
