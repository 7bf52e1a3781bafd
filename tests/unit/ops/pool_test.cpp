// Pooling (ops/pool.hpp): max_pool2d and avg_pool2d (kernel, stride, padding), and
// adaptive_avg_pool2d, against a direct reference and finite differences; PyTorch's rules for ties (first maximum), NaN, padding; second
// order through both; the same bits on several threads (planes split over the pool).
#include <check_gradient.hpp>

#include <cmath>
#include <cstring>
#include <limits>

namespace tg = typegrad;
using tg::testing::at;
using tg::testing::check_gradient;
using tg::testing::fixed;
using tg::testing::uniform;
using tg::testing::values_of;

namespace {
// pooled planes of h x w, kernel k, stride s, padding p; max: padding is -inf, avg: divides by k * k
std::vector<double> ref_pool(const std::vector<double>& x, std::size_t planes, std::size_t h, std::size_t w,
                             std::size_t k, std::size_t s, std::size_t p, bool max) {
    const std::size_t ho = (h + 2 * p - k) / s + 1, wo = (w + 2 * p - k) / s + 1;
    std::vector<double> y;
    for (std::size_t c = 0; c < planes; ++c)
        for (std::size_t i = 0; i < ho; ++i)
            for (std::size_t j = 0; j < wo; ++j) {
                double acc = max ? -std::numeric_limits<double>::infinity() : 0.0;
                for (std::size_t a = 0; a < k; ++a)
                    for (std::size_t b = 0; b < k; ++b) {
                        const long r = long(i * s + a) - long(p), q = long(j * s + b) - long(p);
                        if (r < 0 || q < 0 || r >= long(h) || q >= long(w)) continue;
                        const double v = x[(c * h + std::size_t(r)) * w + std::size_t(q)];
                        acc = max ? std::max(acc, v) : acc + v;
                    }
                y.push_back(max ? acc : acc / double(k * k));
            }
    return y;
}
}  // namespace

TEST_CASE("max_pool2d and avg_pool2d: values and gradients", "[ops][pool][gradient]") {
    constexpr auto x = tg::param<"x", double, tg::shape<2, 2, tg::dyn, tg::dyn>>;
    const std::size_t h = 5, w = 6;
    auto xv = uniform(4 * h * w, -1.0, 1.0, 1);
    const auto bx = tg::bind(x, xv, {2, 2, h, w});
    CHECK(values_of(tg::compile(tg::max_pool2d<2>(x), tg::wrt(x)), bx) == ref_pool(xv, 4, h, w, 2, 2, 0, true));
    CHECK(values_of(tg::compile(tg::max_pool2d<3, 2, 1>(x), tg::wrt(x)), bx) == ref_pool(xv, 4, h, w, 3, 2, 1, true));
    auto avg = values_of(tg::compile(tg::avg_pool2d<3, 1, 1>(x), tg::wrt(x)), bx);
    auto avg_ref = ref_pool(xv, 4, h, w, 3, 1, 1, false);
    REQUIRE(avg.size() == avg_ref.size());
    for (std::size_t e = 0; e < avg.size(); ++e) CHECK(std::abs(avg[e] - avg_ref[e]) < 1e-15);

    constexpr auto q = tg::input<"q", double, tg::shape<2, 2, tg::dyn, tg::dyn>>;
    auto qv = uniform(4 * h * w, -1.0, 1.0, 2);
    // overlapping windows (stride < kernel) add their gradients
    auto q3 = uniform(4 * 3 * 3, -1.0, 1.0, 4);
    check_gradient(tg::sum(tg::max_pool2d<3, 2, 1>(x) * q), fixed(tg::bind(q, q3, {2, 2, 3, 3})), at(x, xv, {2, 2, h, w}));
    check_gradient(tg::sum(tg::square(tg::max_pool2d<2>(x))), at(x, xv, {2, 2, h, w}));
    check_gradient(tg::sum(tg::avg_pool2d<3, 1, 1>(x) * q), fixed(tg::bind(q, qv, {2, 2, h, w})), at(x, xv, {2, 2, h, w}));
    check_gradient(tg::sum(tg::exp(tg::avg_pool2d<2>(x))), at(x, xv, {2, 2, h, w}));
}

TEST_CASE("max_pool2d: ties, NaN and second order as PyTorch", "[ops][pool][gradient]") {
    constexpr auto x = tg::param<"x", double, tg::shape<1, 1, 2, 4>>;
    const double nan = std::numeric_limits<double>::quiet_NaN();
    // window 1: a tie (first maximum takes the gradient); window 2: two NaNs (the last one)
    const std::vector<double> xv{3, 1, nan, 0, 2, 3, 5, nan};
    auto step = tg::compile(tg::sum(tg::max_pool2d<2>(x)), tg::wrt(x));
    std::vector<double> g(8, -1);
    const double v = step.value_and_grad(tg::bind(x, xv), tg::grad_into(x, g));
    CHECK(std::isnan(v));
    CHECK(g == std::vector<double>{1, 0, 0, 0, 0, 0, 0, 1});
    // second order: the gradient of sum(pool(x)^2) is 2 pool(x) scattered; differentiate it again
    constexpr auto y = tg::param<"y", double, tg::shape<1, 2, 4, 4>>;
    auto yv = uniform(32, -1.0, 1.0, 3);
    auto inner = tg::sum(tg::square(tg::max_pool2d<2>(y)));
    check_gradient(tg::sum(tg::square(tg::grad(inner, y)) * tg::lit<0.5>), at(y, yv));
    auto inner_avg = tg::sum(tg::square(tg::avg_pool2d<2, 1>(y)));
    check_gradient(tg::sum(tg::square(tg::grad(inner_avg, y))), at(y, yv));
}

namespace {
// F.adaptive_avg_pool2d's definition: cell (i, j) averages rows [floor(i h / oh), ceil((i + 1) h / oh))
std::vector<double> ref_adaptive(const std::vector<double>& x, std::size_t planes, std::size_t h, std::size_t w,
                                 std::size_t oh, std::size_t ow) {
    std::vector<double> y;
    for (std::size_t c = 0; c < planes; ++c)
        for (std::size_t i = 0; i < oh; ++i)
            for (std::size_t j = 0; j < ow; ++j) {
                const auto r0 = std::size_t(std::floor(double(i * h) / double(oh)));
                const auto r1 = std::size_t(std::ceil(double((i + 1) * h) / double(oh)));
                const auto c0 = std::size_t(std::floor(double(j * w) / double(ow)));
                const auto c1 = std::size_t(std::ceil(double((j + 1) * w) / double(ow)));
                double s = 0;
                for (std::size_t r = r0; r < r1; ++r)
                    for (std::size_t q = c0; q < c1; ++q) s += x[(c * h + r) * w + q];
                y.push_back(s / double((r1 - r0) * (c1 - c0)));
            }
    return y;
}
}  // namespace

TEST_CASE("adaptive_avg_pool2d: values and gradients (divisible, overlapping, upsampling)", "[ops][pool][gradient]") {
    constexpr auto x = tg::param<"x", double, tg::shape<2, 3, tg::dyn, tg::dyn>>;
    for (auto [h, w] : {std::pair<std::size_t, std::size_t>{6, 4}, {7, 5}, {2, 3}, {1, 1}}) {
        auto xv = uniform(6 * h * w, -1.0, 1.0, 31);
        const auto bx = tg::bind(x, xv, {2, 3, h, w});
        auto y = tg::adaptive_avg_pool2d<3, 2>(x);
        STATIC_REQUIRE(std::is_same_v<decltype(y)::shape_type, tg::shape<2, 3, 3, 2>>);
        tg::testing::require_close(values_of(tg::compile(y, tg::wrt(x)), bx), ref_adaptive(xv, 6, h, w, 3, 2));
        tg::testing::require_close(values_of(tg::compile(tg::adaptive_avg_pool2d<1>(x), tg::wrt(x)), bx),
                                   ref_adaptive(xv, 6, h, w, 1, 1));
        check_gradient(tg::sum(tg::square(tg::adaptive_avg_pool2d<3, 2>(x))), at(x, xv, {2, 3, h, w}));
        check_gradient(tg::sum(tg::sin(tg::adaptive_avg_pool2d<4>(x))), at(x, xv, {2, 3, h, w}));
    }
    // second order: the backward is the forward's adjoint
    constexpr auto s = tg::param<"s", double, tg::shape<1, 2, 5, 3>>;
    auto sv = uniform(30, -1.0, 1.0, 32);
    auto inner = tg::sum(tg::sin(tg::adaptive_avg_pool2d<2>(s)));
    check_gradient(tg::sum(tg::square(tg::grad(inner, s))), at(s, sv));
}

TEST_CASE("pooling split over planes gives the bits of one thread", "[ops][pool][threads]") {
    // Large enough for ops/pool.hpp to split the pooling (forward, backward, max's gather) over
    // planes; one thread takes the serial path, whose values the tests above check.
    constexpr auto x = tg::param<"x", float, tg::shape<tg::dyn, 8, 32, 32>>;
    constexpr auto w = tg::param<"w", float, tg::shape<8, 8, 3, 3>>;
    const auto y = tg::relu(tg::conv2d<1, 1>(x, w));
    const auto step = tg::compile(tg::sum(tg::square(tg::max_pool2d<2>(y))) + tg::sum(tg::avg_pool2d<2>(y)), tg::wrt(x, w));
    const std::size_t n = 16;
    std::vector<float> xd(n * 8 * 32 * 32), wd(8 * 8 * 9);
    for (std::size_t i = 0; i < xd.size(); ++i) xd[i] = float((i * 37) % 101) / 50.f - 1.f;
    for (std::size_t i = 0; i < wd.size(); ++i) wd[i] = float((i * 11) % 23) / 60.f - 0.2f;
    struct result {
        float value;
        std::vector<float> gx, gw;
    };
    auto run = [&](std::size_t threads) {
        tg::set_num_threads(threads);
        result r{0, std::vector<float>(xd.size()), std::vector<float>(wd.size())};
        r.value = step.value_and_grad(tg::bind(x, xd, {n, 8, 32, 32}), tg::bind(w, wd), tg::grad_into(x, r.gx),
                                      tg::grad_into(w, r.gw));
        tg::set_num_threads(0);
        return r;
    };
    const result one = run(1);
    REQUIRE(std::isfinite(one.value));
    for (const std::size_t threads : {2, 3}) {
        const result many = run(threads);
        INFO(threads << " threads");
        CHECK(std::memcmp(&many.value, &one.value, sizeof(float)) == 0);
        CHECK(std::memcmp(many.gx.data(), one.gx.data(), one.gx.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(many.gw.data(), one.gw.data(), one.gw.size() * sizeof(float)) == 0);
    }
}

namespace {
// PyTorch's max rule per window (first maximum; a NaN wins, the last one), no padding: the flat
// index of each window's maximum
std::vector<std::size_t> ref_argmax(const std::vector<double>& x, std::size_t planes, std::size_t h, std::size_t w,
                                    std::size_t k, std::size_t s) {
    const std::size_t ho = (h - k) / s + 1, wo = (w - k) / s + 1;
    std::vector<std::size_t> best;
    for (std::size_t c = 0; c < planes; ++c)
        for (std::size_t i = 0; i < ho; ++i)
            for (std::size_t j = 0; j < wo; ++j) {
                std::size_t e = (c * h + i * s) * w + j * s;
                for (std::size_t a = 0; a < k; ++a)
                    for (std::size_t b = 0; b < k; ++b) {
                        const std::size_t f = (c * h + i * s + a) * w + j * s + b;
                        if (x[f] > x[e] || std::isnan(x[f])) e = f;
                    }
                best.push_back(e);
            }
    return best;
}
template <class T, std::size_t K, std::size_t S>
void check_wide_max_pool(const std::vector<double>& xd, std::size_t h, std::size_t w) {
    constexpr auto x = tg::param<"x", T, tg::shape<2, 3, tg::dyn, tg::dyn>>;
    constexpr auto q = tg::input<"q", T, tg::shape<2, 3, tg::dyn, tg::dyn>>;
    const std::size_t ho = (h - K) / S + 1, wo = (w - K) / S + 1;
    const std::vector<T> xv(xd.begin(), xd.end());
    const std::vector<double> xr(xv.begin(), xv.end());  // the values as T holds them
    const auto qd = uniform(6 * ho * wo, -1.0, 1.0, 9);
    const std::vector<T> qv(qd.begin(), qd.end());
    const auto best = ref_argmax(xr, 6, h, w, K, S);
    auto fwd = tg::compile(tg::max_pool2d<K, S>(x), tg::wrt(x)).forward(tg::bind(x, xv, {2, 3, h, w}));
    REQUIRE(fwd.values().size() == best.size());
    std::vector<double> dx(xv.size(), 0.0);
    for (std::size_t o = 0; o < best.size(); ++o) {
        INFO("window " << o << " of " << best.size());
        const double got = double(fwd.values()[o]), want = xr[best[o]];
        CHECK(((std::isnan(got) && std::isnan(want)) || got == want));
        dx[best[o]] += double(qv[o]);  // overlapping windows add in window order
    }
    std::vector<T> g(xv.size(), T(-7));
    tg::compile(tg::sum(tg::max_pool2d<K, S>(x) * q), tg::wrt(x))
        .value_and_grad(tg::bind(x, xv, {2, 3, h, w}), tg::bind(q, qv, {2, 3, ho, wo}), tg::grad_into(x, g));
    for (std::size_t e = 0; e < g.size(); ++e) {
        INFO("element " << e);
        CHECK(double(g[e]) == Approx(dx[e]).margin(1e-6));
    }
}
}  // namespace

TEST_CASE("max_pool2d without padding: rows of windows at the SIMD width (ties, NaN, -inf; float and double)",
          "[ops][pool][gradient]") {
    // 75 columns: 37 windows of 2 (two float batches of 16 and a tail; four double batches of 8
    // and a tail), 36 of 3 with stride 2, 74 of 2 with stride 1 (overlapping)
    const std::size_t h = 7, w = 75;
    auto xv = uniform(6 * h * w, -1.0, 1.0, 8);
    const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
    for (std::size_t c = 0; c < 6; ++c) {
        double* plane = xv.data() + c * h * w;
        for (std::size_t j = 0; j < 8; ++j) plane[j] = plane[w + j] = 0.25;  // ties across windows 0-3
        plane[2 * w + 20] = nan;                                            // one NaN
        plane[2 * w + 33] = nan;                                            // two NaNs in a window
        plane[3 * w + 32] = nan;
        for (std::size_t j = 40; j < 48; ++j) plane[4 * w + j] = plane[5 * w + j] = -inf;  // all -inf
        plane[6 * w + 74] = 5.0;                                            // the last column (tail)
    }
    check_wide_max_pool<float, 2, 2>(xv, h, w);
    check_wide_max_pool<double, 2, 2>(xv, h, w);
    check_wide_max_pool<float, 3, 2>(xv, h, w);
    check_wide_max_pool<double, 2, 1>(xv, h, w);
    // second order at that width (the gather of the max's gradient), by finite differences
    constexpr auto y = tg::param<"y", double, tg::shape<1, 2, 4, tg::dyn>>;
    auto yv = uniform(2 * 4 * 70, -1.0, 1.0, 10);
    auto inner = tg::sum(tg::square(tg::max_pool2d<2>(y)));
    check_gradient(tg::sum(tg::square(tg::grad(inner, y)) * tg::sin(y)), at(y, yv, {1, 2, 4, 70}));
}

namespace {
// 2 x 2 windows, stride 2 (ops/pool.hpp's register path): values and gradients against the
// scalar rules computed here in T, compared bit for bit (sums in the scalar order from +0, the
// first maximum, gradients added into zeros)
template <class T>
void check_tiled_pool(std::size_t h, std::size_t w) {
    constexpr auto x = tg::param<"x", T, tg::shape<1, 2, tg::dyn, tg::dyn>>;
    constexpr auto q = tg::input<"q", T, tg::shape<1, 2, tg::dyn, tg::dyn>>;
    const std::size_t ho = h / 2, wo = w / 2, planes = 2;
    const auto xd = uniform(planes * h * w, -1.0, 1.0, 11), qd = uniform(planes * ho * wo, -1.0, 1.0, 12);
    std::vector<T> xv(xd.begin(), xd.end()), qv(qd.begin(), qd.end());
    xv[0] = xv[1] = xv[w] = xv[w + 1] = T(-0.0);  // window (0, 0): -0 everywhere (the sum is +0)
    if (wo > 1) xv[3] = xv[2];                     // window (0, 1): a tie in its first row
    qv[0] = T(-0.0);                               // a -0 gradient (into zeros: +0)
    std::vector<T> max_ref(planes * ho * wo), avg_ref(max_ref.size()), gmax_ref(xv.size(), T(0)), gavg_ref(xv.size(), T(0));
    for (std::size_t c = 0; c < planes; ++c)
        for (std::size_t i = 0; i < ho; ++i)
            for (std::size_t j = 0; j < wo; ++j) {
                const std::size_t o = (c * ho + i) * wo + j, first = (c * h + 2 * i) * w + 2 * j;
                std::size_t best = first;
                T s = T(0);
                for (std::size_t a = 0; a < 2; ++a)
                    for (std::size_t b = 0; b < 2; ++b) {
                        const std::size_t e = first + a * w + b;
                        s += xv[e];
                        if (xv[e] > xv[best]) best = e;
                        gavg_ref[e] += qv[o] * T(0.25);
                    }
                max_ref[o] = xv[best];
                avg_ref[o] = s * T(0.25);
                gmax_ref[best] += qv[o];
            }
    const auto bx = tg::bind(x, xv, {1, 2, h, w});
    const auto bq = tg::bind(q, qv, {1, 2, ho, wo});
    const auto same = [](const std::vector<T>& a, const std::vector<T>& b) {
        return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
    };
    INFO(h << " x " << w << ", " << sizeof(T) * 8 << "-bit");
    CHECK(same(values_of<T>(tg::compile(tg::max_pool2d<2>(x), tg::wrt(x)), bx), max_ref));
    CHECK(same(values_of<T>(tg::compile(tg::avg_pool2d<2>(x), tg::wrt(x)), bx), avg_ref));
    std::vector<T> g(xv.size(), T(-7));
    tg::compile(tg::sum(tg::max_pool2d<2>(x) * q), tg::wrt(x)).value_and_grad(bx, bq, tg::grad_into(x, g));
    CHECK(same(g, gmax_ref));
    std::fill(g.begin(), g.end(), T(-7));
    tg::compile(tg::sum(tg::avg_pool2d<2>(x) * q), tg::wrt(x)).value_and_grad(bx, bq, tg::grad_into(x, g));
    CHECK(same(g, gavg_ref));
}
}  // namespace

TEST_CASE("2 x 2 pooling with stride 2 in registers: the scalar rules bit for bit (short, odd and long rows)",
          "[ops][pool][gradient]") {
    // pooled rows shorter than a register (the CNN's 7 and 14), one, and between one and two;
    // odd extents leave a row and a column in no window (their gradient 0)
    for (const auto& [h, w] : std::vector<std::pair<std::size_t, std::size_t>>{{2, 2}, {5, 15}, {14, 14}, {28, 28}, {3, 33}, {4, 64}, {7, 75}}) {
        check_tiled_pool<float>(h, w);
        check_tiled_pool<double>(h, w);
    }
}
