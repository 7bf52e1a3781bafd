// Fused loops on several threads (exec/cpu/kernel.hpp, split_loop): a loop large enough is cut
// into tasks by rows, by columns or, for a single row reduced along itself, into fixed blocks;
// its results are bitwise the same on any number of threads and agree with a double-precision
// reference.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <random>
#include <vector>

#include <typegrad/typegrad.hpp>

namespace tg = typegrad;
namespace tgd = typegrad::detail;

namespace {

// Restores the default thread count when a test leaves.
struct thread_count {
    explicit thread_count(std::size_t n) { tg::set_num_threads(n); }
    ~thread_count() { tg::set_num_threads(0); }
    thread_count(const thread_count&) = delete;
    thread_count& operator=(const thread_count&) = delete;
};

// Every task's range, checked to cover [0, n) exactly once, in order.
bool covers(std::size_t n, std::size_t tasks, std::size_t per) {
    std::size_t next = 0;
    for (std::size_t t = 0; t < tasks; ++t) {
        const std::size_t begin = t * per, end = std::min(n, begin + per);
        if (begin != next || end <= begin) return false;
        next = end;
    }
    return next == n;
}

}  // namespace

TEST_CASE("split_loop cuts large loops and keeps small ones whole", "[exec][threads]") {
    constexpr std::size_t W = 16;
    // loop_traits: a reduction shared by rows, one shared by columns, anomaly mode
    constexpr tgd::loop_traits elementwise{false, false, false};
    constexpr tgd::loop_traits row_sums{false, true, false};     // softmax statistics
    constexpr tgd::loop_traits column_sums{true, false, false};  // a bias gradient
    constexpr tgd::loop_traits loss{true, true, false};          // a reduction to one value
    const thread_count two(2);
    SECTION("a small loop is one task on one thread") {
        const auto s = tgd::split_loop(1, 1000, W, 4, elementwise, 0);
        CHECK(s.tasks == 1);
        CHECK(s.threads == 1);
    }
    SECTION("a long elementwise row is cut into columns at multiples of the SIMD width") {
        const std::size_t n = 1'000'003;
        const auto s = tgd::split_loop(1, n, W, 4, elementwise, 0);
        CHECK(s.threads == 2);
        CHECK_FALSE(s.by_rows);
        CHECK_FALSE(s.blocks);
        CHECK(s.tasks > 1);
        CHECK(s.cols % W == 0);
        CHECK(covers(n, s.tasks, s.cols));
    }
    SECTION("many rows reduced along themselves are cut into row ranges") {
        const std::size_t rows = 4097;
        const auto s = tgd::split_loop(rows, 256, W, 8, row_sums, 0);
        CHECK(s.by_rows);
        CHECK_FALSE(s.blocks);
        CHECK(s.tasks > 1);
        CHECK(covers(rows, s.tasks, s.rows));
    }
    SECTION("column sums over few rows are cut into columns") {
        const auto s = tgd::split_loop(2, 500'000, W, 8, column_sums, 500'000);
        CHECK_FALSE(s.by_rows);
        CHECK_FALSE(s.blocks);
        CHECK(s.tasks > 1);
        CHECK(covers(500'000, s.tasks, s.cols));
    }
    SECTION("a reduction whose block copies would be too large stays whole") {
        const auto s = tgd::split_loop(4096, 4096, W, 8, loss, std::size_t(1) << 20);
        CHECK(s.tasks == 1);
        CHECK_FALSE(s.blocks);
    }
    SECTION("anomaly mode runs serially") {
        const auto s = tgd::split_loop(1, 1'000'000, W, 4, {false, false, true}, 0);
        CHECK(s.threads == 1);
        CHECK(s.tasks == 1);
    }
    SECTION("shared reductions are cut into blocks that depend on the extents only") {
        struct extents {
            std::size_t outer, inner, shared;
            tgd::loop_traits traits;
        };
        for (const extents e : {extents{1, 8193, 1, loss}, extents{1, 100'000, 1, loss}, extents{1, 50'000'001, 1, loss},
                                extents{33, 300, 1, loss}, extents{4097, 256, 1, loss}, extents{1'000'000, 3, 1, loss},
                                extents{4097, 64, 64, column_sums}, extents{16384, 768, 1 + 2 * 768, loss}}) {
            tg::set_num_threads(1);
            const auto one = tgd::split_loop(e.outer, e.inner, W, 4, e.traits, e.shared);
            tg::set_num_threads(7);
            const auto seven = tgd::split_loop(e.outer, e.inner, W, 4, e.traits, e.shared);
            tgd::loop_traits anomaly_traits = e.traits;
            anomaly_traits.serial = true;
            const auto anomaly = tgd::split_loop(e.outer, e.inner, W, 4, anomaly_traits, e.shared);
            INFO(e.outer << " x " << e.inner);
            CHECK(one.blocks);
            CHECK(one.by_rows == (e.outer > 1));
            CHECK(one.tasks > 1);
            CHECK(one.tasks <= tgd::loop_max_blocks);
            CHECK(one.tasks * e.shared <= tgd::loop_block_copies);
            if (e.outer == 1) {
                CHECK(one.cols % W == 0);
                CHECK(covers(e.inner, one.tasks, one.cols));
            } else {
                CHECK(covers(e.outer, one.tasks, one.rows));
            }
            CHECK(seven.threads == (e.outer * e.inner * 4 >= tgd::parallel_min_work ? 7u : 1u));
            CHECK((seven.tasks == one.tasks && seven.cols == one.cols && seven.rows == one.rows));
            CHECK((anomaly.tasks == one.tasks && anomaly.cols == one.cols && anomaly.rows == one.rows));
        }
    }
}

namespace {

// One graph with every kind of cut: a row-wise log_sum_exp over [rows, D] (rows), a bias
// broadcast over the rows whose gradient sums columns (columns), a long vector reduced to a
// scalar (blocks), and elementwise gradients.
constexpr std::size_t D = 96;
constexpr auto x = tg::param<"x", float, tg::shape<tg::dyn, D>>;
constexpr auto b = tg::param<"b", float, tg::shape<D>>;
constexpr auto y = tg::param<"y", float, tg::shape<tg::dyn>>;
constexpr auto loss = tg::sum(tg::log_sum_exp(tg::tanh(x) + b, tg::axes<1>)) + tg::sum(tg::sin(y) * y);

struct outputs {
    float value = 0;
    std::vector<float> gx, gb, gy;
};

template <class Step>
outputs run(const Step& step, std::size_t rows, const std::vector<float>& xd, const std::vector<float>& bd,
            const std::vector<float>& yd) {
    outputs o;
    o.gx.assign(xd.size(), -1.f);
    o.gb.assign(bd.size(), -1.f);
    o.gy.assign(yd.size(), -1.f);
    o.value = step.value_and_grad(tg::bind(x, xd, {rows, D}), tg::bind(b, bd), tg::bind(y, yd, {yd.size()}),
                                  tg::grad_into(x, o.gx), tg::grad_into(b, o.gb), tg::grad_into(y, o.gy));
    return o;
}

bool same_bits(const std::vector<float>& p, const std::vector<float>& q) {
    return p.size() == q.size() && std::memcmp(p.data(), q.data(), p.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("a step's fused loops give the same bits on 1, 2, 3 and 8 threads", "[exec][threads]") {
    const auto step = tg::compile(loss, tg::wrt(x, b, y));
    // Row counts and lengths below and above the parallel threshold, odd sizes (SIMD tails).
    const std::size_t rows = GENERATE(3, 2049);
    const std::size_t n = GENERATE(1000, 300'007);
    std::mt19937 rng(static_cast<unsigned>(rows * 31 + n));
    std::uniform_real_distribution<float> d(-2.f, 2.f);
    std::vector<float> xd(rows * D), bd(D), yd(n);
    for (auto* v : {&xd, &bd, &yd})
        for (float& e : *v) e = d(rng);

    outputs serial;
    {
        const thread_count one(1);
        serial = run(step, rows, xd, bd, yd);
    }
    for (const std::size_t threads : {2, 3, 8}) {
        const thread_count many(threads);
        const outputs o = run(step, rows, xd, bd, yd);
        INFO("threads " << threads << ", rows " << rows << ", n " << n);
        CHECK(std::memcmp(&o.value, &serial.value, sizeof(float)) == 0);
        CHECK(same_bits(o.gx, serial.gx));
        CHECK(same_bits(o.gb, serial.gb));
        CHECK(same_bits(o.gy, serial.gy));
    }

    // The values themselves, against double precision: loss, d/dx = (1 - tanh^2) softmax,
    // d/db = column sums of the softmax, d/dy = sin y + y cos y.
    double value = 0;
    std::vector<double> gb(D, 0.0);
    double gx_err = 0, gy_err = 0;
    std::vector<double> z(D);
    for (std::size_t r = 0; r < rows; ++r) {
        double m = -INFINITY;
        for (std::size_t k = 0; k < D; ++k) m = std::max(m, z[k] = std::tanh(double(xd[r * D + k])) + bd[k]);
        double s = 0;
        for (std::size_t k = 0; k < D; ++k) s += std::exp(z[k] - m);
        value += m + std::log(s);
        for (std::size_t k = 0; k < D; ++k) {
            const double p = std::exp(z[k] - m) / s, t = std::tanh(double(xd[r * D + k]));
            gb[k] += p;
            gx_err = std::max(gx_err, std::abs(serial.gx[r * D + k] - (1 - t * t) * p));
        }
    }
    double sy = 0;
    for (std::size_t i = 0; i < n; ++i) {
        const double v = yd[i];
        sy += std::sin(v) * v;
        gy_err = std::max(gy_err, std::abs(serial.gy[i] - (std::sin(v) + v * std::cos(v))));
    }
    value += sy;
    CHECK(serial.value == Approx(value).epsilon(1e-5));
    CHECK(gx_err < 1e-5);
    CHECK(gy_err < 1e-5);
    for (std::size_t k = 0; k < D; ++k) CHECK(serial.gb[k] == Approx(gb[k]).epsilon(1e-5));
}

TEST_CASE("a long sum is blocked the same way on one thread and on many", "[exec][threads]") {
    // 2^20 + 13 squares: a different order of the additions would show in the last bits.
    constexpr auto v = tg::param<"v", float, tg::shape<tg::dyn>>;
    const auto step = tg::compile(tg::sum(v * v), tg::wrt(v));
    const std::size_t n = (std::size_t(1) << 20) + 13;
    std::vector<float> vd(n);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> d(-1.f, 1.f);
    for (float& e : vd) e = d(rng);
    std::vector<float> g1(n), g4(n);
    float s1 = 0, s4 = 0;
    {
        const thread_count one(1);
        s1 = step.value_and_grad(tg::bind(v, vd, {n}), tg::grad_into(v, g1));
    }
    {
        const thread_count four(4);
        s4 = step.value_and_grad(tg::bind(v, vd, {n}), tg::grad_into(v, g4));
    }
    CHECK(std::memcmp(&s1, &s4, sizeof s1) == 0);
    CHECK(same_bits(g1, g4));
    double ref = 0;
    for (float e : vd) ref += double(e) * e;
    CHECK(s1 == Approx(ref).epsilon(1e-5));
}

TEST_CASE("a loop over three axis groups walks every run of rows once, on any number of threads",
          "[exec][threads]") {
    // x [A, B, C] times w [A, 1, C] (broadcast along the middle axis) and a transposed view of
    // t [A, C, B]: the iteration splits into three axis groups, w's gradient sums over the
    // middle axis (a reduction shared by rows: cut into blocks whose rows start and end inside
    // a group), and the view is read with a stride along the row. Sizes odd (SIMD tails).
    constexpr auto x3 = tg::param<"x", float, tg::shape<tg::dyn, tg::dyn, tg::dyn>>;
    constexpr auto w3 = tg::param<"w", float, tg::shape<tg::dyn, 1, tg::dyn>>;
    constexpr auto t3 = tg::param<"t", float, tg::shape<tg::dyn, tg::dyn, tg::dyn>>;
    const auto step = tg::compile(tg::sum(tg::tanh(x3 * w3) + x3 * tg::transpose(t3)), tg::wrt(x3, w3, t3));
    const std::size_t A = 5, B = 61, C = GENERATE(std::size_t(70), std::size_t(3));
    std::mt19937 rng(static_cast<unsigned>(C));
    std::uniform_real_distribution<float> d(-1.5f, 1.5f);
    std::vector<float> xd(A * B * C), wd(A * C), td(A * C * B);
    for (auto* v : {&xd, &wd, &td})
        for (float& e : *v) e = d(rng);
    auto call = [&](std::vector<float>& gx, std::vector<float>& gw, std::vector<float>& gt) {
        gx.assign(xd.size(), -1.f);
        gw.assign(wd.size(), -1.f);
        gt.assign(td.size(), -1.f);
        return step.value_and_grad(tg::bind(x3, xd, {A, B, C}), tg::bind(w3, wd, {A, 1, C}),
                                   tg::bind(t3, td, {A, C, B}), tg::grad_into(x3, gx), tg::grad_into(w3, gw),
                                   tg::grad_into(t3, gt));
    };
    std::vector<float> gx1, gw1, gt1, gx3, gw3, gt3;
    float v1 = 0, v3 = 0;
    {
        const thread_count one(1);
        v1 = call(gx1, gw1, gt1);
    }
    {
        const thread_count three(3);
        v3 = call(gx3, gw3, gt3);
    }
    CHECK(std::memcmp(&v1, &v3, sizeof v1) == 0);
    CHECK(same_bits(gx1, gx3));
    CHECK(same_bits(gw1, gw3));
    CHECK(same_bits(gt1, gt3));

    // Closed forms in double: d/dx = (1 - tanh^2(x w)) w + t^T, d/dw = sum over b of
    // (1 - tanh^2) x, d/dt = x^T.
    double value = 0, gx_err = 0, gt_err = 0;
    std::vector<double> gw(A * C, 0.0);
    for (std::size_t a = 0; a < A; ++a)
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t c = 0; c < C; ++c) {
                const double xv = xd[(a * B + b) * C + c], wv = wd[a * C + c], tv = td[(a * C + c) * B + b];
                const double th = std::tanh(xv * wv);
                value += th + xv * tv;
                gx_err = std::max(gx_err, std::abs(gx1[(a * B + b) * C + c] - ((1 - th * th) * wv + tv)));
                gt_err = std::max(gt_err, std::abs(gt1[(a * C + c) * B + b] - xv));
                gw[a * C + c] += (1 - th * th) * xv;
            }
    CHECK(v1 == Approx(value).epsilon(1e-5));
    CHECK(gx_err < 1e-5);
    CHECK(gt_err == 0);
    for (std::size_t k = 0; k < A * C; ++k) CHECK(gw1[k] == Approx(gw[k]).epsilon(1e-5).margin(1e-5));
}
