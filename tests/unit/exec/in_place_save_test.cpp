// Saved values and kernel results written into a gradient's buffer (exec/execute.hpp,
// in_place_saves, kernel_stores): which plans qualify (compile-time facts), and the values those
// plans give against closed forms: overwrite, tg::accumulate, several threads, backward() from a
// forward context, a post-accumulate hook.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <vector>

#include <typegrad/typegrad.hpp>

namespace tg = typegrad;
namespace td = tg::detail;

namespace {
constexpr auto x = tg::param<"x", float, tg::shape<tg::dyn>>;
constexpr auto y = tg::param<"y", float, tg::shape<tg::dyn>>;
constexpr auto m = tg::param<"m", float, tg::shape<tg::dyn, 3>>;
constexpr auto b = tg::param<"b", float, tg::shape<3>>;
constexpr auto a2 = tg::param<"a2", float, tg::shape<tg::dyn, tg::dyn>>;
constexpr auto w2 = tg::param<"w2", float, tg::shape<tg::dyn, tg::dyn>>;
constexpr auto r2 = tg::input<"r2", float, tg::shape<tg::dyn, tg::dyn>>;
constexpr auto ids = tg::input<"ids", std::int32_t, tg::shape<tg::dyn>>;

// The in-place saves of a loss's joint plan when the stores whose bits Mask sets accumulate.
template <class Mask, class Loss, class... Wrt>
constexpr std::size_t in_place_count(Mask, Loss, Wrt...) {
    using plan = typename decltype(tg::compile(Loss{}, tg::wrt(Wrt{}...)))::template plans<>::joint;
    return td::in_place_saves<plan, Mask>::value.count;
}

// The loops skipped because a kernel writes a gradient into its buffer (kernel_stores).
template <class Mask, class Loss, class... Wrt>
constexpr std::size_t kernel_store_count(Mask, Loss, Wrt...) {
    using plan = typename decltype(tg::compile(Loss{}, tg::wrt(Wrt{}...)))::template plans<>::joint;
    return td::kernel_stores<plan, Mask>::value.count;
}

std::vector<float> inputs(std::size_t n, float scale) {
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = scale * std::sin(0.37f * float(i) + 0.5f);
    return v;
}
// what the post-accumulate hook below saw (a hook is stateless: part of the graph's type)
std::vector<float>& hook_seen() {
    static std::vector<float> seen;
    return seen;
}
// d/dx log(sum(exp(x))) = softmax(x), in double
std::vector<double> softmax(const std::vector<float>& v) {
    double hi = -INFINITY, s = 0;
    for (float a : v) hi = std::max(hi, double(a));
    for (float a : v) s += std::exp(double(a) - hi);
    std::vector<double> r;
    for (float a : v) r.push_back(std::exp(double(a) - hi) / s);
    return r;
}
}  // namespace

TEST_CASE("which saved values are written into a gradient's buffer", "[exec][in-place]") {
    // log_sum_exp saves exp(x - max) for the gradient's loop, its last reader: in place
    STATIC_REQUIRE(in_place_count(td::grad_mask<>{}, tg::log_sum_exp(x), x) == 1);
    // ... unless that gradient is added to its buffer (tg::accumulate: store 0's bit)
    STATIC_REQUIRE(in_place_count(td::grad_mask<1>{}, tg::log_sum_exp(x), x) == 0);
    // a loss that saves nothing (one fused loop) has nothing to place
    STATIC_REQUIRE(in_place_count(td::grad_mask<>{}, tg::sum(tg::exp(x) * y), x, y) == 0);
    // row-wise log_sum_exp over a [n, 3] matrix: the saved [n, 3] exp has the gradient's shape
    STATIC_REQUIRE(in_place_count(td::grad_mask<>{}, tg::sum(tg::log_sum_exp(m, tg::axes<1>)), m) == 1);
    // a gradient of another shape (b's, summed over the rows) does not take the [n, 3] value
    STATIC_REQUIRE(in_place_count(td::grad_mask<>{}, tg::sum(tg::log_sum_exp(m + b, tg::axes<1>)), b) == 0);
}

TEST_CASE("gradients through in-place saves match closed forms", "[exec][in-place]") {
    for (std::size_t n : {1u, 5u, 16u, 17u, 1000u, 100003u}) {
        const auto xs = inputs(n, 6.0f);
        const auto want = softmax(xs);
        const auto step = tg::compile(tg::log_sum_exp(x), tg::wrt(x));
        std::vector<float> g(n, -1.0f);
        step.value_and_grad(tg::bind(x, xs), tg::grad_into(x, g));
        for (std::size_t i = 0; i < n; ++i) REQUIRE(g[i] == Approx(want[i]).margin(1e-7).epsilon(1e-5));
        // tg::accumulate adds (no in-place save): 1 + softmax
        std::vector<float> acc(n, 1.0f);
        step.value_and_grad(tg::bind(x, xs), tg::grad_into(x, acc, tg::accumulate));
        for (std::size_t i = 0; i < n; ++i) REQUIRE(acc[i] == Approx(1.0 + want[i]).epsilon(1e-5));
        // backward() from a forward context: the same bits as value_and_grad
        std::vector<float> gb(n);
        const auto ctx = step.forward(tg::bind(x, xs));
        step.backward(ctx, tg::grad_into(x, gb));
        REQUIRE(gb == g);
        // three threads: the same bits as one
        tg::set_num_threads(3);
        std::vector<float> gt(n);
        step.value_and_grad(tg::bind(x, xs), tg::grad_into(x, gt));
        tg::set_num_threads(0);
        REQUIRE(gt == g);
    }
}

TEST_CASE("a row-wise softmax gradient saved in place, and a second gradient beside it", "[exec][in-place]") {
    const std::size_t rows = 7;
    const auto ms = inputs(rows * 3, 4.0f);
    const auto ys = inputs(rows, 1.5f);
    // d/dm sum(y * log_sum_exp(m, rows)) = y[r] * softmax(m[r, :]); d/dy = log_sum_exp(m[r, :])
    const auto step = tg::compile(tg::sum(tg::log_sum_exp(m, tg::axes<1>) * y), tg::wrt(m, y));
    std::vector<float> gm(rows * 3), gy(rows);
    step.value_and_grad(tg::bind(m, ms, {rows, 3}), tg::bind(y, ys), tg::grad_into(m, gm), tg::grad_into(y, gy));
    for (std::size_t r = 0; r < rows; ++r) {
        const std::vector<float> row(ms.begin() + 3 * r, ms.begin() + 3 * r + 3);
        const auto sm = softmax(row);
        double hi = std::max({double(row[0]), double(row[1]), double(row[2])}), s = 0;
        for (float a : row) s += std::exp(a - hi);
        CHECK(gy[r] == Approx(hi + std::log(s)).epsilon(1e-5));
        for (std::size_t c = 0; c < 3; ++c) CHECK(gm[3 * r + c] == Approx(ys[r] * sm[c]).margin(1e-6).epsilon(1e-5));
    }
}

TEST_CASE("a post-accumulate hook sees the final gradient of an in-place save", "[exec][in-place][hooks]") {
    const auto xs = inputs(40, 3.0f);
    const auto want = softmax(xs);
    std::vector<float>& seen = hook_seen();
    seen.clear();
    auto hooked = tg::post_accumulate_grad_hook(x, [](tg::grad_view<float>, tg::grad_view<float> grad) {
        hook_seen().assign(grad.begin(), grad.end());
    });
    std::vector<float> xd = xs, g(xs.size());
    tg::compile(tg::log_sum_exp(hooked), tg::wrt(x)).value_and_grad(tg::bind(x, xd), tg::grad_into(x, g));
    REQUIRE(seen.size() == g.size());
    CHECK(seen == g);
    for (std::size_t i = 0; i < g.size(); ++i) CHECK(g[i] == Approx(want[i]).margin(1e-7).epsilon(1e-5));
}

TEST_CASE("which kernel results are written into a gradient's buffer", "[exec][in-place]") {
    const auto mm = tg::sum(tg::matmul(a2, w2) * r2);
    // both of a matmul's gradients are products stored as they are
    STATIC_REQUIRE(kernel_store_count(td::grad_mask<>{}, mm, a2, w2) == 2);
    // not one that tg::accumulate adds to its buffer (store 0: a2's), nor both
    STATIC_REQUIRE(kernel_store_count(td::grad_mask<1>{}, mm, a2, w2) == 1);
    STATIC_REQUIRE(kernel_store_count(td::grad_mask<3>{}, mm, a2, w2) == 0);
    // a gradient the loop still computes from the product (the chain rule through a * a) stays
    STATIC_REQUIRE(kernel_store_count(td::grad_mask<>{}, tg::sum(tg::matmul(a2 * a2, w2) * r2), a2, w2) == 1);
    // embedding's table gradient (a scatter-add kernel)
    STATIC_REQUIRE(kernel_store_count(td::grad_mask<>{}, tg::sum(tg::embedding(ids, w2) * r2), w2) == 1);
    // elementwise gradients have no kernel
    STATIC_REQUIRE(kernel_store_count(td::grad_mask<>{}, tg::sum(tg::exp(x) * y), x, y) == 0);
}

TEST_CASE("gradients a kernel writes into their buffers match closed forms", "[exec][in-place]") {
    // d/dA sum((A W) .* R) = R W^T, d/dW = A^T R, in double
    const std::size_t m = 37, k = 29, n = 41;
    const auto as = inputs(m * k, 1.0f), ws = inputs(k * n, 0.7f), rs = inputs(m * n, 1.3f);
    std::vector<double> want_a(m * k, 0.0), want_w(k * n, 0.0);
    for (std::size_t i = 0; i < m; ++i)
        for (std::size_t p = 0; p < k; ++p)
            for (std::size_t j = 0; j < n; ++j) {
                want_a[i * k + p] += double(rs[i * n + j]) * double(ws[p * n + j]);
                want_w[p * n + j] += double(as[i * k + p]) * double(rs[i * n + j]);
            }
    const auto step = tg::compile(tg::sum(tg::matmul(a2, w2) * r2), tg::wrt(a2, w2));
    const auto bind = [&] {
        return std::tuple{tg::bind(a2, as, {m, k}), tg::bind(w2, ws, {k, n}), tg::bind(r2, rs, {m, n})};
    };
    std::vector<float> ga(m * k, -1.0f), gw(k * n, -1.0f);
    std::apply([&](const auto&... bs) { step.value_and_grad(bs..., tg::grad_into(a2, ga), tg::grad_into(w2, gw)); }, bind());
    for (std::size_t i = 0; i < ga.size(); ++i) REQUIRE(ga[i] == Approx(want_a[i]).margin(1e-5).epsilon(1e-5));
    for (std::size_t i = 0; i < gw.size(); ++i) REQUIRE(gw[i] == Approx(want_w[i]).margin(1e-5).epsilon(1e-5));
    // tg::accumulate runs the loop (adds to the buffer): 0 + g has g's bits
    std::vector<float> acc_a(m * k, 0.0f), acc_w(k * n, 0.0f);
    std::apply([&](const auto&... bs) {
        step.value_and_grad(bs..., tg::grad_into(a2, acc_a, tg::accumulate), tg::grad_into(w2, acc_w, tg::accumulate));
    }, bind());
    CHECK(acc_a == ga);
    CHECK(acc_w == gw);
    // one gradient accumulated, the other written in place
    std::vector<float> acc2(m * k, 1.0f), gw2(k * n, 5.0f);
    std::apply([&](const auto&... bs) { step.value_and_grad(bs..., tg::grad_into(a2, acc2, tg::accumulate), tg::grad_into(w2, gw2)); }, bind());
    for (std::size_t i = 0; i < acc2.size(); ++i) REQUIRE(acc2[i] == 1.0f + ga[i]);
    CHECK(gw2 == gw);
    // backward() from a forward context, and three threads: the same bits
    std::vector<float> gb_a(m * k), gb_w(k * n);
    const auto ctx = std::apply([&](const auto&... bs) { return step.forward(bs...); }, bind());
    step.backward(ctx, tg::grad_into(a2, gb_a), tg::grad_into(w2, gb_w));
    CHECK(gb_a == ga);
    CHECK(gb_w == gw);
    tg::set_num_threads(3);
    std::vector<float> gt_a(m * k), gt_w(k * n);
    std::apply([&](const auto&... bs) { step.value_and_grad(bs..., tg::grad_into(a2, gt_a), tg::grad_into(w2, gt_w)); }, bind());
    tg::set_num_threads(0);
    CHECK(gt_a == ga);
    CHECK(gt_w == gw);
}

TEST_CASE("an embedding table's gradient is scattered into its buffer", "[exec][in-place]") {
    // d/dT sum(T[ids] .* R) adds row e of R into row ids[e]; rows no id names get 0
    const std::size_t rows = 23, dim = 9, count = 50;
    std::vector<std::int32_t> is(count);
    for (std::size_t e = 0; e < count; ++e) is[e] = std::int32_t((e * 7 + e / 5) % 19);  // rows 19.. never named
    const auto ts = inputs(rows * dim, 1.0f), rs = inputs(count * dim, 0.9f);
    std::vector<double> want(rows * dim, 0.0);
    for (std::size_t e = 0; e < count; ++e)
        for (std::size_t c = 0; c < dim; ++c) want[std::size_t(is[e]) * dim + c] += double(rs[e * dim + c]);
    const auto step = tg::compile(tg::sum(tg::embedding(ids, w2) * r2), tg::wrt(w2));
    std::vector<float> g(rows * dim, std::nanf(""));  // every element overwritten, the unnamed rows with 0
    step.value_and_grad(tg::bind(ids, is), tg::bind(w2, ts, {rows, dim}), tg::bind(r2, rs, {count, dim}), tg::grad_into(w2, g));
    for (std::size_t i = 0; i < g.size(); ++i) REQUIRE(double(g[i]) == Approx(want[i]).margin(1e-6).epsilon(1e-6));
}

TEST_CASE("a post-accumulate hook sees the final gradient a kernel wrote in place", "[exec][in-place][hooks]") {
    const std::size_t m = 6, k = 5, n = 4;
    const auto as = inputs(m * k, 1.0f), ws = inputs(k * n, 0.5f), rs = inputs(m * n, 1.1f);
    std::vector<float>& seen = hook_seen();
    seen.clear();
    auto hooked = tg::post_accumulate_grad_hook(w2, [](tg::grad_view<float>, tg::grad_view<float> grad) {
        hook_seen().assign(grad.begin(), grad.end());
    });
    std::vector<float> wd = ws, g(k * n, -3.0f);
    tg::compile(tg::sum(tg::matmul(a2, hooked) * r2), tg::wrt(w2))
        .value_and_grad(tg::bind(a2, as, {m, k}), tg::bind(w2, wd, {k, n}), tg::bind(r2, rs, {m, n}), tg::grad_into(w2, g));
    REQUIRE(seen.size() == g.size());
    CHECK(seen == g);
    for (std::size_t p = 0; p < k; ++p)
        for (std::size_t j = 0; j < n; ++j) {
            double want = 0;
            for (std::size_t i = 0; i < m; ++i) want += double(as[i * k + p]) * double(rs[i * n + j]);
            CHECK(g[p * n + j] == Approx(want).margin(1e-6).epsilon(1e-5));
        }
}
