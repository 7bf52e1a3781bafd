// The evaluator: bindings, static and dynamic shapes, odd sizes, broadcasting, accumulation,
// forward/backward with a saved context, seeds, and errors that leave every buffer untouched.
#include <check_gradient.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <numeric>
#include <span>
#include <string>

namespace tg = typegrad;

namespace {
constexpr auto x = tg::param<"x", float, tg::shape<tg::dyn>>;
constexpr auto y = tg::param<"y", float, tg::shape<tg::dyn>>;
constexpr auto xs = tg::param<"x", float, tg::shape<5>>;
constexpr auto ys = tg::param<"y", float, tg::shape<5>>;

// The same math in double, for reference.
double expmul_ref(const std::vector<float>& a, const std::vector<float>& b) {
    double s = 0;
    for (std::size_t i = 0; i < a.size(); ++i) s += std::exp(double(a[i])) * double(b[i]);
    return s;
}
}  // namespace

TEST_CASE("odd sizes around the SIMD width and a million", "[exec]") {
    auto step = tg::compile(tg::sum(tg::exp(x) * y), tg::wrt(x, y));
    const std::size_t W = tg::simd::width<float>;
    for (std::size_t n : {std::size_t(0), std::size_t(1), W - 1, W, W + 1, 3 * W + 5, std::size_t(1000000)}) {
        std::vector<float> a(n), b(n), ga(n, -7.f), gb(n, -7.f);
        for (std::size_t i = 0; i < n; ++i) {
            a[i] = float(std::sin(double(i))) * 0.5f;
            b[i] = float(std::cos(double(i)));
        }
        const float l = step.value_and_grad(tg::bind(x, a), tg::bind(y, b), tg::grad_into(x, ga), tg::grad_into(y, gb));
        INFO("n = " << n);
        CHECK(std::abs(double(l) - expmul_ref(a, b)) <= 1e-5 * (1.0 + double(n)));
        for (std::size_t i = 0; i < n; ++i) {
            const float e = std::exp(a[i]);
            if (std::abs(ga[i] - e * b[i]) > 1e-5f * (1 + std::abs(e * b[i])) ||
                std::abs(gb[i] - e) > 1e-5f * e) {
                FAIL("gradient mismatch at " << i);
            }
        }
    }
}

TEST_CASE("static and dynamic shapes give the same results", "[exec]") {
    std::vector<float> a{0.1f, -0.2f, 0.3f, 0.4f, -0.5f}, b{1, 2, 3, 4, 5};
    std::vector<float> g1(5), g2(5), h1(5), h2(5);
    const float l1 = tg::compile(tg::sum(tg::tanh(x) * y), tg::wrt(x, y))
                         .value_and_grad(tg::bind(x, a), tg::bind(y, b), tg::grad_into(x, g1), tg::grad_into(y, h1));
    const float l2 = tg::compile(tg::sum(tg::tanh(xs) * ys), tg::wrt(xs, ys))
                         .value_and_grad(tg::bind(xs, a), tg::bind(ys, b), tg::grad_into(xs, g2), tg::grad_into(ys, h2));
    CHECK(l1 == l2);
    CHECK(g1 == g2);
    CHECK(h1 == h2);
}

TEST_CASE("bindings take vectors, spans, arrays, C arrays and pointer + extents", "[exec][bind]") {
    auto step = tg::compile(tg::sum(xs * ys), tg::wrt(xs));
    float ca[5] = {1, 2, 3, 4, 5};
    std::array<float, 5> sa{1, 1, 1, 1, 1};
    std::vector<float> g(5);
    CHECK(step.value_and_grad(tg::bind(xs, ca), tg::bind(ys, sa), tg::grad_into(xs, g)) == 15.f);
    CHECK(g == std::vector<float>{1, 1, 1, 1, 1});
    std::span<const float> sp(ca);
    const float* p = sa.data();
    float garr[5];
    CHECK(step.value_and_grad(tg::bind(xs, sp), tg::bind(ys, p, {5}), tg::grad_into(xs, garr)) == 15.f);
    CHECK(garr[4] == 1.f);
    constexpr auto m = tg::param<"m", double, tg::shape<tg::dyn, tg::dyn>>;
    std::vector<double> md(6, 0.5), gm(6);
    CHECK(tg::compile(tg::sum(m), tg::wrt(m)).value_and_grad(tg::bind(m, md, {2, 3}), tg::grad_into(m, gm)) == 3.0);
    CHECK(gm == std::vector<double>(6, 1.0));
}

TEST_CASE("broadcast operands receive summed gradients", "[exec][broadcast]") {
    constexpr auto a = tg::param<"a", double, tg::shape<tg::dyn, 3>>;
    constexpr auto r = tg::param<"r", double, tg::shape<3>>;
    constexpr auto s = tg::param<"s", double>;
    auto step = tg::compile(tg::sum(a * r + s), tg::wrt(a, r, s));
    std::vector<double> ad{1, 2, 3, 4, 5, 6}, rd{1, 10, 100}, sd{0.5}, ga(6), gr(3), gs(1);
    const double l = step.value_and_grad(tg::bind(a, ad, {2, 3}), tg::bind(r, rd), tg::bind(s, sd),
                                         tg::grad_into(a, ga), tg::grad_into(r, gr), tg::grad_into(s, gs));
    CHECK(l == (1 + 20 + 300 + 4 + 50 + 600) + 6 * 0.5);
    CHECK(ga == std::vector<double>{1, 10, 100, 1, 10, 100});
    CHECK(gr == std::vector<double>{5, 7, 9});
    CHECK(gs == std::vector<double>{6});
}

TEST_CASE("grad_into overwrites by default and can accumulate", "[exec][bind]") {
    auto step = tg::compile(tg::sum(xs * ys), tg::wrt(xs, ys));
    std::vector<float> a{1, 2, 3, 4, 5}, b{2, 2, 2, 2, 2}, ga(5, 100.f), gb(5, 100.f);
    step.value_and_grad(tg::bind(xs, a), tg::bind(ys, b), tg::grad_into(xs, ga), tg::grad_into(ys, gb, tg::accumulate));
    CHECK(ga == std::vector<float>{2, 2, 2, 2, 2});
    CHECK(gb == std::vector<float>{101, 102, 103, 104, 105});
}

TEST_CASE("forward then backward equals value_and_grad", "[exec][context]") {
    auto step = tg::compile(tg::log_sum_exp(tg::sin(x) * y) + tg::max(x), tg::wrt(x, y));
    std::vector<float> a{0.5f, -1.f, 2.f, 0.25f}, b{1.f, 3.f, -2.f, 0.5f};
    std::vector<float> g1(4), g2(4), h1(4), h2(4);
    const float l = step.value_and_grad(tg::bind(x, a), tg::bind(y, b), tg::grad_into(x, g1), tg::grad_into(y, h1));
    auto ctx = step.forward(tg::bind(x, a), tg::bind(y, b));
    CHECK(ctx.value() == l);
    auto moved = std::move(ctx);  // the context owns its saved values
    step.backward(moved, tg::grad_into(x, g2), tg::grad_into(y, h2));
    for (int i = 0; i < 4; ++i) {
        CHECK_THAT(g2[i], Catch::Matchers::WithinRel(g1[i], 1e-6f));
        CHECK_THAT(h2[i], Catch::Matchers::WithinRel(h1[i], 1e-6f));
    }
}

TEST_CASE("a non-scalar output is differentiated with a seed", "[exec][context]") {
    constexpr auto v = tg::param<"v", double, tg::shape<3>>;
    auto step = tg::compile(tg::exp(v) * v, tg::wrt(v));
    std::vector<double> d{0, 1, 2}, seed{1, 2, 3}, g(3);
    auto ctx = step.forward(tg::bind(v, d));
    REQUIRE(ctx.values().size() == 3);
    CHECK_THAT(ctx.values()[1], Catch::Matchers::WithinRel(std::exp(1.0), 1e-15));
    step.backward(ctx, tg::grad_into(v, g), tg::seed(seed));
    for (int i = 0; i < 3; ++i) CHECK_THAT(g[i], Catch::Matchers::WithinRel(seed[i] * std::exp(d[i]) * (1 + d[i]), 1e-14));
}

TEST_CASE("run-time errors throw before anything is written", "[exec][errors]") {
    auto step = tg::compile(tg::sum(tg::exp(x) * y), tg::wrt(x, y));
    std::vector<float> a{1, 2, 3}, b{1, 2}, ga{9, 9, 9}, gb{9, 9};
    const auto a0 = a, b0 = b, ga0 = ga, gb0 = gb;
    CHECK_THROWS_AS(step.value_and_grad(tg::bind(x, a), tg::bind(y, b), tg::grad_into(x, ga), tg::grad_into(y, gb)),
                    tg::shape_error);
    CHECK((a == a0 && b == b0 && ga == ga0 && gb == gb0));
    // wrong gradient size
    std::vector<float> b3{1, 2, 3};
    CHECK_THROWS_AS(step.value_and_grad(tg::bind(x, a), tg::bind(y, b3), tg::grad_into(x, ga), tg::grad_into(y, gb)),
                    tg::shape_error);
    CHECK(ga == ga0);
    // explicit extents that disagree with the buffer
    CHECK_THROWS_AS(step.value_and_grad(tg::bind(x, a, {4}), tg::bind(y, b3)), tg::shape_error);
    // static extent contradicted
    constexpr auto s3 = tg::param<"s", float, tg::shape<3>>;
    CHECK_THROWS_AS(tg::compile(tg::sum(s3), tg::wrt(s3)).value_and_grad(tg::bind(s3, b)), tg::shape_error);
    // a gradient written over an input, or two gradients over each other
    std::vector<float> both(3, 1.f);
    const auto both0 = both;
    CHECK_THROWS_AS(step.value_and_grad(tg::bind(x, both), tg::bind(y, b3), tg::grad_into(x, both)), tg::aliasing_error);
    CHECK(both == both0);
    std::vector<float> shared(3, 5.f);
    CHECK_THROWS_AS(step.value_and_grad(tg::bind(x, a), tg::bind(y, b3), tg::grad_into(x, shared),
                                        tg::grad_into(y, std::span<float>(shared))),
                    tg::aliasing_error);
    CHECK(shared == std::vector<float>(3, 5.f));
    // all typegrad errors share one base
    CHECK_THROWS_AS(step.value_and_grad(tg::bind(x, a), tg::bind(y, b)), tg::error);
}

TEST_CASE("values saved for later loops give the bits of recomputing them", "[exec][plan]") {
    // value_and_grad's plan saves exp (log_sum_exp, softmax) and tanh for its later loops;
    // backward(ctx) recomputes them: the results must agree to the bit, at sizes around the SIMD
    // width (vector body and scalar tail) and across the threaded split
    constexpr auto m = tg::param<"m", float, tg::shape<tg::dyn, tg::dyn>>;
    constexpr auto w = tg::input<"w", float, tg::shape<tg::dyn, tg::dyn>>;
    auto step = tg::compile(tg::sum(tg::log_sum_exp(tg::tanh(m) * w, tg::axes<1>)) +
                                tg::sum(tg::softmax(m, tg::axes<1>) * w) + tg::log_sum_exp(m),
                            tg::wrt(m));
    const std::size_t W = tg::simd::width<float>;
    for (std::size_t rows : {std::size_t(1), std::size_t(3), std::size_t(700)}) {
        for (std::size_t cols : {std::size_t(1), W - 1, W + 3, 3 * W}) {
            const std::size_t n = rows * cols;
            std::vector<float> a(n), b(n), g1(n), g2(n);
            for (std::size_t i = 0; i < n; ++i) {
                a[i] = float(std::sin(0.7 * double(i)) * 3);
                b[i] = float(std::cos(0.3 * double(i)));
            }
            const float l1 = step.value_and_grad(tg::bind(m, a, {rows, cols}), tg::bind(w, b, {rows, cols}),
                                                 tg::grad_into(m, g1));
            auto ctx = step.forward(tg::bind(m, a, {rows, cols}), tg::bind(w, b, {rows, cols}));
            step.backward(ctx, tg::grad_into(m, g2));
            INFO(rows << " x " << cols);
            const float l2 = ctx.value();
            CHECK(std::memcmp(&l1, &l2, sizeof l1) == 0);
            CHECK(std::memcmp(g1.data(), g2.data(), n * sizeof(float)) == 0);
        }
    }
    // tanh(m) is saved by stage 0's loop over [rows, cols]; the loop over [2, rows, cols] of the
    // same stage (first in order) computes it in place: the buffer is not written yet
    constexpr auto q = tg::input<"q", float, tg::shape<2, tg::dyn, tg::dyn>>;
    auto t = tg::tanh(m);
    auto broad = tg::compile(tg::sum(t * q) + tg::sum(t * tg::sum(t)), tg::wrt(m));
    for (std::size_t cols : {std::size_t(1), W + 3}) {
        const std::size_t rows = 5, n = rows * cols;
        std::vector<float> a(n), qv(2 * n), g1(n), g2(n);
        for (std::size_t i = 0; i < n; ++i) a[i] = float(std::sin(0.9 * double(i)));
        for (std::size_t i = 0; i < 2 * n; ++i) qv[i] = float(std::cos(0.4 * double(i)));
        const float l1 = broad.value_and_grad(tg::bind(m, a, {rows, cols}), tg::bind(q, qv, {2, rows, cols}),
                                              tg::grad_into(m, g1));
        double lref = 0, s = 0;
        for (std::size_t i = 0; i < n; ++i) s += std::tanh(double(a[i]));
        for (std::size_t i = 0; i < n; ++i) {
            const double ti = std::tanh(double(a[i]));
            lref += ti * (double(qv[i]) + double(qv[n + i])) + ti * s;
            g2[i] = float((1 - ti * ti) * (double(qv[i]) + double(qv[n + i]) + 2 * s));
        }
        CHECK_THAT(double(l1), Catch::Matchers::WithinAbs(lref, 1e-4 * (1 + std::abs(lref))));
        for (std::size_t i = 0; i < n; ++i) CHECK_THAT(g1[i], Catch::Matchers::WithinAbs(g2[i], 1e-4f * (1 + std::abs(g2[i]))));
    }
}

namespace {
// y <- 0.9 tanh(y) + 0.1, N times: three fused nodes a link in the forward, more in the backward.
template <int N, class E>
auto long_chain(E e) {
    if constexpr (N == 0) return e;
    else return long_chain<N - 1>(tg::tanh(e) * tg::lit<0.9> + tg::lit<0.1>);
}
// The nodes of the first loop a describe() section lists as fused.
std::size_t fused_count(const std::string& text, const std::string& section) {
    const std::size_t at = text.find(section);
    REQUIRE(at != std::string::npos);
    const std::size_t line = text.find("fused:", at);
    REQUIRE(line != std::string::npos);
    const std::size_t end = text.find('\n', line);
    return std::size_t(std::count(text.begin() + std::ptrdiff_t(line), text.begin() + std::ptrdiff_t(end), '%'));
}
}  // namespace

TEST_CASE("a loop body longer than a chunk computes what the chain rule gives, in and out of anomaly mode", "[exec][plan]") {
    constexpr int links = 60;
    constexpr auto xd = tg::param<"x", double, tg::shape<tg::dyn>>;
    constexpr auto zd = tg::input<"z", double, tg::shape<tg::dyn>>;
    const auto chain = long_chain<links>(xd);
    auto step = tg::compile(tg::sum(chain), tg::wrt(xd));
    // one loop each, cut into chunks (exec/cpu/kernel.hpp, body_chunk): 2 in the forward, 4 in the joint
    const std::string text = tg::describe(step);
    CHECK(fused_count(text, "kernel plan: forward") > tg::detail::body_chunk);
    CHECK(fused_count(text, "kernel plan: value_and_grad") > 3 * tg::detail::body_chunk);

    // a run that is not a multiple of the SIMD width, so the tail batch goes through the chunks too
    const std::size_t n = 3 * tg::simd::width<double> + 3;
    std::vector<double> a(n), g(n, -7.0);
    for (std::size_t i = 0; i < n; ++i) a[i] = -2.0 + 4.0 * double(i) / double(n - 1);
    const double l = step.value_and_grad(tg::bind(xd, a), tg::grad_into(xd, g));
    double lref = 0;
    for (std::size_t i = 0; i < n; ++i) {
        double y = a[i], dy = 1;  // forward-mode derivative along the chain
        for (int k = 0; k < links; ++k) {
            const double t = std::tanh(y);
            dy *= 0.9 * (1 - t * t);
            y = 0.9 * t + 0.1;
        }
        lref += y;
        INFO("element " << i);
        CHECK_THAT(g[i], Catch::Matchers::WithinAbs(dy, 1e-13 * (1 + std::abs(dy))));
    }
    CHECK_THAT(l, Catch::Matchers::WithinRel(lref, 1e-13));
    CHECK(step.forward(tg::bind(xd, a)).value() == l);  // the forward plan's chunks: the same bits
    tg::testing::check_gradient(tg::sum(chain), tg::testing::at(xd, tg::testing::uniform(9, -2, 2), {9}));

    // anomaly mode: the log at the chain's end (in its loop's last chunk) is named
    auto checked = tg::compile<tg::detect_anomaly>(tg::sum(tg::log(chain - zd)), tg::wrt(xd));
    std::vector<double> z(n, -1.0), g2(n, -7.0);  // chain > -1: clean
    CHECK(std::isfinite(checked.value_and_grad(tg::bind(xd, a), tg::bind(zd, z), tg::grad_into(xd, g2))));
    z[n - 1] = 5.0;  // the last element only, in the tail batch: log of a negative number
    std::vector<double> g3(n, -7.0);
    try {
        checked.value_and_grad(tg::bind(xd, a), tg::bind(zd, z), tg::grad_into(xd, g3));
        FAIL("no anomaly_error");
    } catch (const tg::anomaly_error& e) {
        const std::string what = e.what();
        INFO(what);
        CHECK(what.find("'log'") != std::string::npos);
        CHECK(what.find("forward") != std::string::npos);
    }
    CHECK(g3 == std::vector<double>(n, -7.0));  // nothing written
}

namespace {
// Loops of a loss's joint plan that resolve a where once per row (exec/cpu/kernel.hpp,
// loop_desc::select); Check: in anomaly mode's layout.
template <bool Check, class Loss, class... Wrt>
constexpr std::size_t row_select_loops(Loss, Wrt...) {
    using plan = typename decltype(tg::compile(Loss{}, tg::wrt(Wrt{}...)))::template plans<>::joint;
    using layout = tg::detail::loop_layout<plan, tg::detail::grad_mask<>, Check>;
    std::size_t n = 0;
    for (std::size_t l = 0; l < layout::count; ++l)
        n += layout::table.desc[layout::table.desc_start[l] + tg::detail::loop_desc::select] != 0;
    return n;
}
}  // namespace

TEST_CASE("a where whose condition is the same along each row is resolved once per row", "[exec][plan]") {
    constexpr auto m = tg::param<"m", float, tg::shape<tg::dyn, tg::dyn>>;
    constexpr auto c = tg::input<"c", float, tg::shape<tg::dyn, 1>>;
    const auto loss = tg::sum(tg::where(c, tg::log(m), m * m));
    // which loops qualify: a condition broadcast along the row (the backward's where, and the
    // forward's), not one that varies along it, not in anomaly mode; prod's gradient
    STATIC_REQUIRE(row_select_loops<false>(loss, m) >= 1);
    STATIC_REQUIRE(row_select_loops<true>(loss, m) == 0);
    STATIC_REQUIRE(row_select_loops<false>(tg::sum(tg::where(tg::gt(m, tg::lit<0>), tg::log(m), m * m)), m) == 0);
    STATIC_REQUIRE(row_select_loops<false>(tg::sum(tg::prod(m, tg::axes<1>)), m) >= 1);
    STATIC_REQUIRE(row_select_loops<false>(tg::sum(m * m), m) == 0);

    auto step = tg::compile(loss, tg::wrt(m));
    auto checked = tg::compile<tg::detect_anomaly>(loss, tg::wrt(m));
    const std::size_t W = tg::simd::width<float>;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    // nonzero, zero, NaN (nonzero: a NaN condition selects the first operand), -0 (zero)
    const std::vector<float> conds{1.0f, 0.0f, nan, -0.0f, 2.0f, 0.0f, -3.0f};
    for (std::size_t cols : {std::size_t(1), W - 1, W + 3, 4 * W + 5}) {
        const std::size_t rows = conds.size(), n = rows * cols;
        std::vector<float> a(n), g1(n, -7.0f), g3(n, -7.0f);
        for (std::size_t i = 0; i < n; ++i) a[i] = float(std::sin(0.7 * double(i)) * 2);  // negative too: log NaN, not chosen
        tg::set_num_threads(1);
        const float l1 = step.value_and_grad(tg::bind(m, a, {rows, cols}), tg::bind(c, conds, {rows, 1}), tg::grad_into(m, g1));
        tg::set_num_threads(3);
        const float l3 = step.value_and_grad(tg::bind(m, a, {rows, cols}), tg::bind(c, conds, {rows, 1}), tg::grad_into(m, g3));
        tg::set_num_threads(0);
        INFO(rows << " x " << cols);
        CHECK(std::memcmp(&l1, &l3, sizeof l1) == 0);
        CHECK(std::memcmp(g1.data(), g3.data(), n * sizeof(float)) == 0);
        bool log_nan = false;
        for (std::size_t r = 0; r < rows; ++r)
            for (std::size_t j = 0; j < cols; ++j) {
                const std::size_t i = r * cols + j;
                const double v = a[i];
                const bool first = !(conds[r] == 0.0f);
                log_nan = log_nan || (first && v < 0);
                const double want = first ? 1 / v : 2 * v;
                INFO("row " << r << " column " << j);
                if (first && v < 0) CHECK(g1[i] == float(want));  // 1 / v: the reciprocal's rounding, whatever log(v) is
                else CHECK_THAT(g1[i], Catch::Matchers::WithinAbs(want, 1e-6 * (1 + std::abs(want))));
            }
        CHECK(std::isnan(l1) == log_nan);
        // every value finite (rows of positive m where the log is chosen, no NaN condition):
        // anomaly mode, whose loops compute every where in full, gives the same bits
        std::vector<float> pos(a), conds2(conds), gc(n, -7.0f), gp(n, -7.0f);
        for (float& v : pos) v = std::abs(v) + 0.25f;
        conds2[2] = 5.0f;
        const float lp = step.value_and_grad(tg::bind(m, pos, {rows, cols}), tg::bind(c, conds2, {rows, 1}), tg::grad_into(m, gp));
        const float lc = checked.value_and_grad(tg::bind(m, pos, {rows, cols}), tg::bind(c, conds2, {rows, 1}), tg::grad_into(m, gc));
        CHECK(std::memcmp(&lp, &lc, sizeof lp) == 0);
        CHECK(std::memcmp(gp.data(), gc.data(), n * sizeof(float)) == 0);
    }
}
