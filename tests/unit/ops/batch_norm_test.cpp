// batch_norm (ops/batch_norm.hpp): training mode against a double reference and finite
// differences for [N, C], [N, C, L], [N, C, H, W]; the running statistics' in-place update
// (PyTorch's momentum rule, unbiased variance); evaluation mode; errors.
#include <check_gradient.hpp>
#include <special_values.hpp>

#include <cmath>
#include <cstring>

namespace tg = typegrad;
using tg::testing::inf;
using tg::testing::at;
using tg::testing::check_gradient;
using tg::testing::fixed;
using tg::testing::uniform;
using tg::testing::values_of;
using tg::testing::require_close;

namespace {
struct channel_stats {
    std::vector<double> mean, biased, unbiased;
};
channel_stats stats_of(const std::vector<double>& x, std::size_t n, std::size_t c, std::size_t inner) {
    channel_stats s{std::vector<double>(c), std::vector<double>(c), std::vector<double>(c)};
    for (std::size_t ch = 0; ch < c; ++ch) {
        double m = 0, v = 0;
        for (std::size_t b = 0; b < n; ++b)
            for (std::size_t e = 0; e < inner; ++e) m += x[(b * c + ch) * inner + e];
        m /= double(n * inner);
        for (std::size_t b = 0; b < n; ++b)
            for (std::size_t e = 0; e < inner; ++e) v += std::pow(x[(b * c + ch) * inner + e] - m, 2);
        s.mean[ch] = m;
        s.biased[ch] = v / double(n * inner);
        s.unbiased[ch] = v / double(n * inner - 1);
    }
    return s;
}
std::vector<double> ref_bn(const std::vector<double>& x, std::size_t n, std::size_t c, std::size_t inner,
                           const std::vector<double>& mean, const std::vector<double>& var, const std::vector<double>& w,
                           const std::vector<double>& b, double eps = 1e-5) {
    std::vector<double> y(x.size());
    for (std::size_t a = 0; a < n; ++a)
        for (std::size_t ch = 0; ch < c; ++ch)
            for (std::size_t e = 0; e < inner; ++e) {
                const std::size_t i = (a * c + ch) * inner + e;
                y[i] = (x[i] - mean[ch]) / std::sqrt(var[ch] + eps) * w[ch] + b[ch];
            }
    return y;
}
}  // namespace

TEST_CASE("batch_norm in training mode: values and gradients", "[ops][batch_norm][gradient]") {
    constexpr auto w = tg::param<"w", double, tg::shape<3>>;
    constexpr auto b = tg::param<"b", double, tg::shape<3>>;
    auto wv = uniform(3, 0.5, 1.5, 2), bv = uniform(3, -1.0, 1.0, 3);
    const std::vector<double> ones(3, 1.0), zeros(3, 0.0);

    constexpr auto x4 = tg::param<"x4", double, tg::shape<tg::dyn, 3, 2, 3>>;
    constexpr auto q4 = tg::input<"q4", double, tg::shape<tg::dyn, 3, 2, 3>>;
    auto xv = uniform(2 * 18, -2.0, 2.0, 1), qv = uniform(2 * 18, -1.0, 1.0, 4);
    auto st = stats_of(xv, 2, 3, 6);
    require_close(values_of(tg::compile(tg::batch_norm(x4, w, b), tg::wrt(x4)), tg::bind(x4, xv, {2, 3, 2, 3}),
                            tg::bind(w, wv), tg::bind(b, bv)),
                  ref_bn(xv, 2, 3, 6, st.mean, st.biased, wv, bv));
    require_close(values_of(tg::compile(tg::batch_norm<1e-3>(x4), tg::wrt(x4)), tg::bind(x4, xv, {2, 3, 2, 3})),
                  ref_bn(xv, 2, 3, 6, st.mean, st.biased, ones, zeros, 1e-3));
    check_gradient(tg::sum(tg::batch_norm(x4, w, b) * q4), fixed(tg::bind(q4, qv, {2, 3, 2, 3})),
                   at(x4, xv, {2, 3, 2, 3}), at(w, wv), at(b, bv));

    constexpr auto x2 = tg::param<"x2", double, tg::shape<4, 3>>;
    constexpr auto q2 = tg::input<"q2", double, tg::shape<4, 3>>;
    auto x2v = uniform(12, -2.0, 2.0, 5), q2v = uniform(12, -1.0, 1.0, 6);
    auto st2 = stats_of(x2v, 4, 3, 1);
    require_close(values_of(tg::compile(tg::batch_norm(x2, w, b), tg::wrt(x2)), tg::bind(x2, x2v), tg::bind(w, wv),
                            tg::bind(b, bv)),
                  ref_bn(x2v, 4, 3, 1, st2.mean, st2.biased, wv, bv));
    check_gradient(tg::sum(tg::batch_norm(x2, w, b) * q2), fixed(tg::bind(q2, q2v)), at(x2, x2v), at(w, wv), at(b, bv));

    constexpr auto x3 = tg::param<"x3", double, tg::shape<2, 3, 4>>;
    auto x3v = uniform(24, -2.0, 2.0, 7);
    check_gradient(tg::sum(tg::exp(tg::batch_norm(x3))), at(x3, x3v));
}

TEST_CASE("batch_norm updates the running statistics in place; evaluation mode uses them", "[ops][batch_norm]") {
    constexpr auto x = tg::param<"x", double, tg::shape<tg::dyn, 3, 2, 2>>;
    constexpr auto w = tg::param<"w", double, tg::shape<3>>;
    constexpr auto b = tg::param<"b", double, tg::shape<3>>;
    constexpr auto rm = tg::input<"rm", double, tg::shape<3>>;
    constexpr auto rv = tg::input<"rv", double, tg::shape<3>>;
    auto xv = uniform(2 * 12, -2.0, 2.0, 8), wv = uniform(3, 0.5, 1.5, 9), bv = uniform(3, -1.0, 1.0, 10);
    std::vector<double> mean{0.5, -0.5, 0.0}, var{1.0, 2.0, 0.5};
    const auto mean0 = mean, var0 = var;
    auto train = tg::compile(tg::sum(tg::square(tg::batch_norm<true, 0.25>(x, rm, rv, w, b))), tg::wrt(x, w, b));
    std::vector<double> gx(24), gw(3), gb(3);
    train.value_and_grad(tg::bind(x, xv, {2, 3, 2, 2}), tg::bind(w, wv), tg::bind(b, bv), tg::bind(rm, mean),
                         tg::bind(rv, var), tg::grad_into(x, gx), tg::grad_into(w, gw), tg::grad_into(b, gb));
    auto st = stats_of(xv, 2, 3, 4);
    for (std::size_t c = 0; c < 3; ++c) {
        CHECK(std::abs(mean[c] - (0.75 * mean0[c] + 0.25 * st.mean[c])) < 1e-14);
        CHECK(std::abs(var[c] - (0.75 * var0[c] + 0.25 * st.unbiased[c])) < 1e-14);
    }
    // the gradients are those of batch_norm without running stats
    auto plain = tg::compile(tg::sum(tg::square(tg::batch_norm(x, w, b))), tg::wrt(x, w, b));
    std::vector<double> px(24), pw(3), pb(3);
    plain.value_and_grad(tg::bind(x, xv, {2, 3, 2, 2}), tg::bind(w, wv), tg::bind(b, bv), tg::grad_into(x, px),
                         tg::grad_into(w, pw), tg::grad_into(b, pb));
    // equal up to rounding: the update's -0 joins y's loop, so the planner may materialise and
    // fuse otherwise than in the plain graph
    require_close(gx, px, 1e-14);
    require_close(gw, pw, 1e-14);
    require_close(gb, pb, 1e-14);

    // evaluation: normalised by the running statistics, which stay as they are
    const auto mean1 = mean, var1 = var;
    require_close(values_of(tg::compile(tg::batch_norm<false>(x, rm, rv, w, b), tg::wrt(x)), tg::bind(x, xv, {2, 3, 2, 2}),
                            tg::bind(w, wv), tg::bind(b, bv), tg::bind(rm, mean), tg::bind(rv, var)),
                  ref_bn(xv, 2, 3, 4, mean1, var1, wv, bv));
    CHECK(mean == mean1);
    CHECK(var == var1);
    constexpr auto q = tg::input<"q", double, tg::shape<tg::dyn, 3, 2, 2>>;
    auto qv = uniform(24, -1.0, 1.0, 11);
    check_gradient(tg::sum(tg::batch_norm<false>(x, rm, rv, w, b) * q),
                   fixed(tg::bind(rm, mean), tg::bind(rv, var), tg::bind(q, qv, {2, 3, 2, 2})), at(x, xv, {2, 3, 2, 2}),
                   at(w, wv), at(b, bv));
}

TEST_CASE("batch_norm with running statistics: the plain forward's values bit for bit, -0 included",
          "[ops][batch_norm]") {
    // The update adds its -0 output to y (ops/batch_norm.hpp): y + -0 is y for every y, +0 would
    // turn a -0 into +0. Channel 1 is constant (centred 0) with weight -1 and bias -0: y = -0.
    constexpr auto x = tg::param<"x", float, tg::shape<tg::dyn, 3, 2, 2>>;
    constexpr auto w = tg::param<"w", float, tg::shape<3>>;
    constexpr auto b = tg::param<"b", float, tg::shape<3>>;
    constexpr auto rm = tg::input<"rm", float, tg::shape<3>>;
    constexpr auto rv = tg::input<"rv", float, tg::shape<3>>;
    const auto xd = uniform(24, -2.0, 2.0, 15);
    std::vector<float> xv(xd.begin(), xd.end()), wv{0.75f, -1.0f, 1.25f}, bv{0.5f, -0.0f, -0.25f};
    for (std::size_t n = 0; n < 2; ++n)
        for (std::size_t e = 0; e < 4; ++e) xv[(n * 3 + 1) * 4 + e] = 1.5f;
    std::vector<float> mean(3, 0.0f), var(3, 1.0f);
    const auto with_stats = values_of<float>(tg::compile(tg::batch_norm<true>(x, rm, rv, w, b), tg::wrt(w)),
                                             tg::bind(x, xv, {2, 3, 2, 2}), tg::bind(w, wv), tg::bind(b, bv),
                                             tg::bind(rm, mean), tg::bind(rv, var));
    const auto plain = values_of<float>(tg::compile(tg::batch_norm(x, w, b), tg::wrt(w)), tg::bind(x, xv, {2, 3, 2, 2}),
                                        tg::bind(w, wv), tg::bind(b, bv));
    REQUIRE(with_stats.size() == 24);
    REQUIRE(plain.size() == 24);
    CHECK(std::memcmp(with_stats.data(), plain.data(), 24 * sizeof(float)) == 0);
    CHECK(std::signbit(with_stats[4]));
    CHECK(with_stats[4] == 0.0f);
    CHECK(mean[1] == float(0.1 * 1.5));  // and the update ran (in double)
}

TEST_CASE("batch_norm in float", "[ops][batch_norm]") {
    constexpr auto x = tg::input<"x", float, tg::shape<tg::dyn, 3, 2, 2>>;
    constexpr auto w = tg::param<"w", float, tg::shape<3>>;
    constexpr auto b = tg::param<"b", float, tg::shape<3>>;
    auto xd = uniform(24, -2.0, 2.0, 12), wd = uniform(3, 0.5, 1.5, 13), bd = uniform(3, -1.0, 1.0, 14);
    std::vector<float> xs(xd.begin(), xd.end()), ws(wd.begin(), wd.end()), bs(bd.begin(), bd.end());
    auto fwd = tg::compile(tg::batch_norm(x, w, b), tg::wrt(w)).forward(tg::bind(x, xs, {2, 3, 2, 2}), tg::bind(w, ws),
                                                                        tg::bind(b, bs));
    const std::vector<double> xr(xs.begin(), xs.end());
    auto st = stats_of(xr, 2, 3, 4);
    require_close(std::vector<double>(fwd.values().begin(), fwd.values().end()),
                  ref_bn(xr, 2, 3, 4, st.mean, st.biased, std::vector<double>(ws.begin(), ws.end()),
                         std::vector<double>(bs.begin(), bs.end())),
                  1e-5);
}

TEST_CASE("batch_norm's running statistics over many elements: the same bits on any thread count",
          "[ops][batch_norm]") {
    // 9984 values per channel in float: the statistics are summed in double over several lanes
    // (rows of 156, so every other row starts mid-lane) and the channels split over the thread
    // pool; the result is the double reference's, rounded
    constexpr std::size_t n = 64, c = 4, inner = 156;
    constexpr auto x = tg::param<"x", float, tg::shape<tg::dyn, c, 12, 13>>;
    constexpr auto w = tg::param<"w", float, tg::shape<c>>;
    constexpr auto b = tg::param<"b", float, tg::shape<c>>;
    constexpr auto rm = tg::input<"rm", float, tg::shape<c>>;
    constexpr auto rv = tg::input<"rv", float, tg::shape<c>>;
    const auto xd = uniform(n * c * inner, -3.0, 5.0, 41);
    const std::vector<float> xv(xd.begin(), xd.end()), wv(c, 1.0f), bv(c, 0.0f);
    const std::vector<double> xr(xv.begin(), xv.end());  // the float inputs, exactly
    const auto st = stats_of(xr, n, c, inner);
    auto step = tg::compile(tg::sum(tg::batch_norm<true, 0.5>(x, rm, rv, w, b)), tg::wrt(w));
    std::vector<std::vector<float>> means, vars;
    for (std::size_t threads : {1u, 2u, 3u}) {
        tg::set_num_threads(threads);
        std::vector<float> mean(c, 1.0f), var(c, 2.0f), gw(c);
        step.value_and_grad(tg::bind(x, xv, {n, c, 12, 13}), tg::bind(w, wv), tg::bind(b, bv), tg::bind(rm, mean),
                            tg::bind(rv, var), tg::grad_into(w, gw));
        for (std::size_t ch = 0; ch < c; ++ch) {
            CHECK(mean[ch] == float(0.5 * 1.0 + 0.5 * st.mean[ch]));
            CHECK(var[ch] == float(0.5 * 2.0 + 0.5 * st.unbiased[ch]));
        }
        means.push_back(mean);
        vars.push_back(var);
    }
    tg::set_num_threads(0);
    CHECK(means[1] == means[0]);
    CHECK(means[2] == means[0]);
    CHECK(vars[1] == vars[0]);
    CHECK(vars[2] == vars[0]);
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
