// Saved values written into a gradient's buffer (exec/execute.hpp, in_place_saves): which plans
// qualify (compile-time facts), and the values those plans give against closed forms: overwrite,
// tg::accumulate, several threads, backward() from a forward context, a post-accumulate hook.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include <typegrad/typegrad.hpp>

namespace tg = typegrad;
namespace td = tg::detail;

namespace {
constexpr auto x = tg::param<"x", float, tg::shape<tg::dyn>>;
constexpr auto y = tg::param<"y", float, tg::shape<tg::dyn>>;
constexpr auto m = tg::param<"m", float, tg::shape<tg::dyn, 3>>;
constexpr auto b = tg::param<"b", float, tg::shape<3>>;

// The in-place saves of a loss's joint plan when the stores whose bits Mask sets accumulate.
template <class Mask, class Loss, class... Wrt>
constexpr std::size_t in_place_count(Mask, Loss, Wrt...) {
    using plan = typename decltype(tg::compile(Loss{}, tg::wrt(Wrt{}...)))::template plans<>::joint;
    return td::in_place_saves<plan, Mask>::value.count;
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
