// Needs a GPU (skips, saying so, without one): every test graph evaluated on the device gives the
// CPU's value and gradients within the dtype's tolerance, through value_and_grad for scalar
// losses and forward + seeded backward for the non-scalar output; an MLP trains the same on both.
#include "compare.hpp"
#include "emulator.hpp"
#include "graph_tests.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <span>
#include <tuple>
#include <algorithm>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

namespace tg = typegrad;
using namespace cuda_compare;

TEST_CASE("every test graph gives the CPU's values and gradients on the device, part 1", "[cuda][device]") {
    cuda_graph_tests::compare_on_device<0>();
}
TEST_CASE("every test graph gives the CPU's values and gradients in host emulation, part 1", "[cuda][emulation]") {
    cuda_graph_tests::emulate<0>(0);
}
TEST_CASE("every test graph gives the CPU's values and gradients in host emulation, part 2", "[cuda][emulation]") {
    cuda_graph_tests::emulate<0>(1);
}

TEST_CASE("large fused reductions: split over many blocks, deterministic", "[cuda][device]") {
    if (skip_without_device()) return;
    constexpr auto x = tg::param<"x", float, tg::shape<tg::dyn>>;
    constexpr auto y = tg::input<"y", float, tg::shape<tg::dyn>>;
    auto step = tg::compile(tg::sum(tg::exp(x) * y), tg::wrt(x));
    const std::size_t n = (std::size_t(1) << 22) + 17;
    std::vector<float> xs(n), ys(n);
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (std::size_t i = 0; i < n; ++i) {
        xs[i] = u(rng);
        ys[i] = u(rng);
    }
    auto dx = tg::cuda::tensor<float, tg::shape<tg::dyn>>::from_host(xs);
    auto dy = tg::cuda::tensor<float, tg::shape<tg::dyn>>::from_host(ys);
    tg::cuda::tensor<float, tg::shape<tg::dyn>> dg({n});
    const float first = step.value_and_grad(tg::bind(x, dx), tg::bind(y, dy), tg::grad_into(x, dg));
    const float second = step.value_and_grad(tg::bind(x, dx), tg::bind(y, dy), tg::grad_into(x, dg));
    CHECK(first == second);  // the same order every time
    double ref = 0;
    for (std::size_t i = 0; i < n; ++i) ref += std::exp(double(xs[i])) * double(ys[i]);
    CHECK(std::abs(double(first) - ref) <= 1e-4 * (1 + std::abs(ref)) + 1e-2);
    const auto g = dg.to_host();
    for (std::size_t i = 0; i < n; i += 4099) CHECK(std::abs(g[i] - std::exp(xs[i]) * ys[i]) <= 1e-5f * (1 + std::abs(g[i])));
}

TEST_CASE("an invalid class label on the device is a shape_error before any gradient is written", "[cuda][device]") {
    if (skip_without_device()) return;
    using namespace cuda_tests;
    auto step = tg::compile(tg::cross_entropy(A, labels), tg::wrt(A));
    std::vector<float> a(15, 0.5f);
    std::vector<std::int32_t> l = {0, 7, 1};
    auto da = tg::cuda::tensor<float, tg::shape<tg::dyn, 5>>::from_host(a, {3, 5});
    auto dl = tg::cuda::tensor<std::int32_t, tg::shape<tg::dyn>>::from_host(l);
    tg::cuda::tensor<float, tg::shape<tg::dyn, 5>> dg({3, 5});
    dg.copy_from(std::vector<float>(15, -7.f));
    CHECK_THROWS_AS(step.value_and_grad(tg::bind(A, da), tg::bind(labels, dl), tg::grad_into(A, dg)), tg::shape_error);
    CHECK(dg.to_host() == std::vector<float>(15, -7.f));
}

// On the device when there is one, else in host emulation: kernel ops report bad ids from their
// kernels, and the host throws the CPU's error before any gradient is written.
TEST_CASE("a device backward checks its seed as the host's does: size, null address, overlap", "[cuda][emulation]") {
    std::optional<cuda_emulation::scoped_emulator> emulate;
    if (!tg::cuda::available()) emulate.emplace();
    using cuda_tests::A;
    using cuda_tests::B;
    using dense = tg::cuda::tensor<float, tg::shape<tg::dyn, 5>>;
    auto step = tg::compile(tg::exp(A) * B, tg::wrt(A, B));
    const std::vector<float> a(10, 0.5f), b(10, 2.f), ones(10, 1.f), untouched(10, -7.f);
    auto da = dense::from_host(a, {2, 5});
    auto db = dense::from_host(b, {2, 5});
    auto seed = dense::from_host(ones, {2, 5});
    dense ga({2, 5});
    ga.copy_from(untouched);
    auto ctx = step.forward(tg::bind(A, da), tg::bind(B, db));
    CHECK_THROWS_AS(step.backward(ctx, tg::grad_into(A, ga), tg::cuda::seed(tg::cuda::device_ptr<const float>{seed.data()}, 9)),
                    tg::shape_error);
    CHECK_THROWS_AS(step.backward(ctx, tg::grad_into(A, ga), tg::cuda::seed(tg::cuda::device_ptr<const float>{}, 10)),
                    tg::binding_error);
    // a gradient written over the seed it reads, or over a bound input
    CHECK_THROWS_AS(step.backward(ctx, tg::grad_into(A, seed), tg::seed(seed)), tg::aliasing_error);
    CHECK_THROWS_AS(step.backward(ctx, tg::grad_into(A, ga), tg::grad_into(B, da), tg::seed(seed)), tg::aliasing_error);
    CHECK(ga.to_host() == untouched);
    CHECK(seed.to_host() == ones);
    CHECK(da.to_host() == a);
    step.backward(ctx, tg::grad_into(A, ga), tg::seed(seed));
    for (float g : ga.to_host()) CHECK(g == Approx(2.0 * std::exp(0.5)).epsilon(1e-6));
}

TEST_CASE("a bad id or start in a device kernel is the CPU's shape_error, gradients untouched", "[cuda][emulation]") {
    std::optional<cuda_emulation::scoped_emulator> emulate;
    if (!tg::cuda::available()) emulate.emplace();
    using namespace cuda_tests;
    auto error_of = [](auto&& call) {
        try {
            call();
        } catch (const tg::shape_error& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    const std::vector<float> e(20, 0.5f), untouched(20, -7.f);
    auto de = tg::cuda::tensor<float, tg::shape<5, 4>>::from_host(e);
    tg::cuda::tensor<float, tg::shape<5, 4>> dg;
    auto embed = tg::compile(tg::sum(tg::square(tg::embedding(tokens, E))), tg::wrt(E));
    for (const std::vector<std::int64_t>& ids : {std::vector<std::int64_t>{0, 7, 1, 9}, std::vector<std::int64_t>{2, -1}}) {
        auto dt = tg::cuda::tensor<std::int64_t, tg::shape<tg::dyn>>::from_host(ids);
        std::vector<float> cpu_grad(untouched);
        const std::string cpu = error_of([&] { embed.value_and_grad(tg::bind(tokens, ids), tg::bind(E, e), tg::grad_into(E, cpu_grad)); });
        dg.copy_from(untouched);
        const std::string gpu = error_of([&] { embed.value_and_grad(tg::bind(tokens, dt), tg::bind(E, de), tg::grad_into(E, dg)); });
        CHECK(cpu.find(ids[1] == 7 ? "id 7 at position 1 is out of range for 5 rows" : "id -1 at position 1") != std::string::npos);
        CHECK(gpu == cpu);
        CHECK(dg.to_host() == untouched);
        CHECK(cpu_grad == untouched);
    }
    // ids computed on the device (argmax along axis 1 of a [n, 5] tensor) index a 3-row table
    constexpr auto T3 = tg::param<"T3", float, tg::shape<3, 4>>;
    auto computed = tg::compile(tg::sum(tg::embedding(tg::argmax(A, tg::axes<1>), T3)), tg::wrt(T3));
    const std::vector<float> a = {0, 1, 0, 0, 0, /* argmax 4: */ 0, 0, 0, 0, 1};
    const std::vector<float> t(12, 1.f), t_untouched(12, -7.f);
    auto da = tg::cuda::tensor<float, tg::shape<tg::dyn, 5>>::from_host(a, {2, 5});
    auto dt3 = tg::cuda::tensor<float, tg::shape<3, 4>>::from_host(t);
    tg::cuda::tensor<float, tg::shape<3, 4>> dg3;
    dg3.copy_from(t_untouched);
    const std::string gpu = error_of([&] { computed.value_and_grad(tg::bind(A, da), tg::bind(T3, dt3), tg::grad_into(T3, dg3)); });
    CHECK(gpu.find("id 4 at position 1 is out of range for 3 rows") != std::string::npos);
    CHECK(dg3.to_host() == t_untouched);
    // a start beyond the axis
    auto sliced = tg::compile(tg::sum(tg::dynamic_slice<1, 3>(A, start)), tg::wrt(A));
    const std::vector<std::int64_t> s = {3};
    auto ds = tg::cuda::tensor<std::int64_t, tg::shape<1>>::from_host(s);
    const std::vector<float> ten(10, -7.f);
    std::vector<float> cpu_grad(ten);
    const std::string cpu = error_of([&] { sliced.value_and_grad(tg::bind(A, a, {2, 5}), tg::bind(start, s), tg::grad_into(A, cpu_grad)); });
    tg::cuda::tensor<float, tg::shape<tg::dyn, 5>> dga({2, 5});
    dga.copy_from(ten);
    const std::string gpu_start =
        error_of([&] { sliced.value_and_grad(tg::bind(A, da), tg::bind(start, ds), tg::grad_into(A, dga)); });
    CHECK(cpu.find("start 3 leaves the axis' extent 5") != std::string::npos);
    CHECK(gpu_start == cpu);
    CHECK(dga.to_host() == ten);
    // narrow's length: read by the shape pass (copied from the device), thrown before any launch
    auto narrowed = tg::compile(tg::sum(tg::narrow<1>(A, start, count)), tg::wrt(A));
    const std::vector<std::int64_t> s0 = {0}, nine = {9};
    auto ds0 = tg::cuda::tensor<std::int64_t, tg::shape<1>>::from_host(s0);
    auto dnine = tg::cuda::tensor<std::int64_t, tg::shape<>>::from_host(nine);
    std::vector<float> cpu_narrow(ten);
    const std::string cpu_length = error_of([&] {
        narrowed.value_and_grad(tg::bind(A, a, {2, 5}), tg::bind(start, s0), tg::bind(count, nine), tg::grad_into(A, cpu_narrow));
    });
    const std::string gpu_length = error_of(
        [&] { narrowed.value_and_grad(tg::bind(A, da), tg::bind(start, ds0), tg::bind(count, dnine), tg::grad_into(A, dga)); });
    CHECK(cpu_length.find("length 9 is not within the axis' extent 5") != std::string::npos);
    CHECK(gpu_length == cpu_length);
    CHECK(cpu_narrow == ten);
    CHECK(dga.to_host() == ten);
    // class labels: the first bad row, as the CPU's loop finds it
    auto ce = tg::compile(tg::cross_entropy(A, labels), tg::wrt(A));
    const std::vector<std::int32_t> l = {0, 7, -2, 1};
    const std::vector<float> scores(20, 0.5f), twenty(20, -7.f);
    std::vector<float> cpu_ce(twenty);
    const std::string cpu_label = error_of([&] {
        ce.value_and_grad(tg::bind(A, scores, {4, 5}), tg::bind(labels, l), tg::grad_into(A, cpu_ce));
    });
    auto dscores = tg::cuda::tensor<float, tg::shape<tg::dyn, 5>>::from_host(scores, {4, 5});
    auto dl = tg::cuda::tensor<std::int32_t, tg::shape<tg::dyn>>::from_host(l);
    tg::cuda::tensor<float, tg::shape<tg::dyn, 5>> dce({4, 5});
    dce.copy_from(twenty);
    const std::string gpu_label =
        error_of([&] { ce.value_and_grad(tg::bind(A, dscores), tg::bind(labels, dl), tg::grad_into(A, dce)); });
    CHECK(cpu_label.find("label 7 of row 1 is not a class in [0, 5)") != std::string::npos);
    CHECK(gpu_label == cpu_label);
    CHECK(dce.to_host() == twenty);
}

// conv's padding is no input (ops/conv.hpp): an infinity in W (forward) or in g (the weight
// gradient) must not turn the GEMM's padding zeros into NaN; the device's fix-up passes give the
// CPU's direct results.
TEST_CASE("conv2d on the device: an infinity meets no padding, as on the CPU", "[cuda][emulation]") {
    std::optional<cuda_emulation::scoped_emulator> emulate;
    if (!tg::cuda::available()) emulate.emplace();
    constexpr auto xi = tg::param<"xi", float, tg::shape<2, 2, 4, 5>>;
    constexpr auto wi = tg::param<"wi", float, tg::shape<3, 2, 3, 3>>;
    constexpr auto ui = tg::input<"ui", float, tg::shape<2, 3, 4, 5>>;
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> u(0.5f, 1.5f);  // no zeros: inf * x is never NaN
    std::vector<float> x(80), w(54), us(120);
    for (float& v : x) v = u(rng);
    for (float& v : w) v = u(rng);
    for (float& v : us) v = u(rng);
    const float inf = std::numeric_limits<float>::infinity();
    auto same = [](float gpu, float cpu) {
        if (std::isnan(cpu)) return std::isnan(gpu);
        if (std::isinf(cpu)) return gpu == cpu;
        return std::abs(gpu - cpu) <= 1e-4f * (1 + std::abs(cpu));
    };
    auto dx = tg::cuda::tensor<float, tg::shape<2, 2, 4, 5>>::from_host(x);
    {  // W[1, 0, 0, 0] = inf: output channel 1's first row and column read it in the padding only
        std::vector<float> wf = w;
        wf[18] = inf;
        auto step = tg::compile(tg::conv2d<1, 1>(xi, wi), tg::wrt(wi));
        auto dw = tg::cuda::tensor<float, tg::shape<3, 2, 3, 3>>::from_host(wf);
        const auto cpu = step.forward(tg::bind(xi, x), tg::bind(wi, wf));
        const auto gpu = step.forward(tg::bind(xi, dx), tg::bind(wi, dw));
        const auto c = cpu.values();
        const auto g = gpu.values();
        REQUIRE(c.size() == g.size());
        CHECK(std::isfinite(c[20]));  // image 0, channel 1, pixel (0, 0)
        CHECK(std::isinf(c[26]));     // pixel (1, 1) reads the infinity
        for (std::size_t i = 0; i < c.size(); ++i) {
            INFO("y[" << i << "]: gpu " << g[i] << " cpu " << c[i]);
            CHECK(same(g[i], c[i]));
        }
    }
    {  // g[0, 0, 0, 0] = inf: taps (0, j) and (i, 0) meet it in the padding only
        std::vector<float> uf = us;
        uf[0] = inf;
        auto step = tg::compile(tg::sum(tg::conv2d<1, 1>(xi, wi) * ui), tg::wrt(wi));
        auto dw = tg::cuda::tensor<float, tg::shape<3, 2, 3, 3>>::from_host(w);
        auto du = tg::cuda::tensor<float, tg::shape<2, 3, 4, 5>>::from_host(uf);
        tg::cuda::tensor<float, tg::shape<3, 2, 3, 3>> dg;
        std::vector<float> cpu_grad(54);
        const float cpu = step.value_and_grad(tg::bind(xi, x), tg::bind(wi, w), tg::bind(ui, uf), tg::grad_into(wi, cpu_grad));
        const float gpu = step.value_and_grad(tg::bind(xi, dx), tg::bind(wi, dw), tg::bind(ui, du), tg::grad_into(wi, dg));
        CHECK(same(gpu, cpu));
        const auto g = dg.to_host();
        CHECK(std::isfinite(cpu_grad[0]));  // tap (0, 0) of channel 0
        CHECK(std::isinf(cpu_grad[4]));     // tap (1, 1) reads x[0, 0, 0, 0] at the infinity
        for (std::size_t i = 0; i < g.size(); ++i) {
            INFO("dW[" << i << "]: gpu " << g[i] << " cpu " << cpu_grad[i]);
            CHECK(same(g[i], cpu_grad[i]));
        }
    }
}

TEST_CASE("the MLP trains the same on the device as on the CPU", "[cuda][device]") {
    if (skip_without_device()) return;
    using namespace cuda_tests;
    const std::size_t n = 256;
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<float> xd(n * 2);
    std::vector<std::int32_t> yd(n);
    for (std::size_t i = 0; i < n; ++i) {
        yd[i] = std::int32_t(i % 2);
        xd[2 * i] = normal(rng) + (yd[i] ? 1.f : -1.f);
        xd[2 * i + 1] = normal(rng);
    }
    auto train = tg::compile(tg::cross_entropy(tg::linear(tg::relu(tg::linear(X, W1, b1)), W2, b2), labels),
                             tg::wrt(W1, b1, W2, b2));
    std::vector<float> w1(hidden * 2), c1(hidden, 0.f), w2(2 * hidden), c2(2, 0.f);
    for (auto& x : w1) x = 0.5f * normal(rng);
    for (auto& x : w2) x = 0.3f * normal(rng);
    std::vector<float> g1(w1.size()), gc1(c1.size()), g2(w2.size()), gc2(c2.size());
    // the device copy of the parameters, updated on the host each step and uploaded
    auto dX = tg::cuda::tensor<float, tg::shape<tg::dyn, 2>>::from_host(xd, {n, 2});
    auto dy = tg::cuda::tensor<std::int32_t, tg::shape<tg::dyn>>::from_host(yd);
    tg::cuda::tensor<float, tg::shape<hidden, 2>> dw1, dg1;
    tg::cuda::tensor<float, tg::shape<hidden>> dc1, dgc1;
    tg::cuda::tensor<float, tg::shape<2, hidden>> dw2, dg2;
    tg::cuda::tensor<float, tg::shape<2>> dc2, dgc2;
    std::vector<float> gw1(w1.size()), gwc1(c1.size()), gw2(w2.size()), gwc2(c2.size());
    for (int epoch = 0; epoch < 30; ++epoch) {
        dw1.copy_from(w1);
        dc1.copy_from(c1);
        dw2.copy_from(w2);
        dc2.copy_from(c2);
        const float cpu = train.value_and_grad(tg::bind(X, xd, {n, 2}), tg::bind(labels, yd), tg::bind(W1, w1),
                                               tg::bind(b1, c1), tg::bind(W2, w2), tg::bind(b2, c2), tg::grad_into(W1, g1),
                                               tg::grad_into(b1, gc1), tg::grad_into(W2, g2), tg::grad_into(b2, gc2));
        const float gpu = train.value_and_grad(tg::bind(X, dX), tg::bind(labels, dy), tg::bind(W1, dw1), tg::bind(b1, dc1),
                                               tg::bind(W2, dw2), tg::bind(b2, dc2), tg::grad_into(W1, dg1),
                                               tg::grad_into(b1, dgc1), tg::grad_into(W2, dg2), tg::grad_into(b2, dgc2));
        INFO("epoch " << epoch);
        CHECK(std::abs(cpu - gpu) <= 1e-4f * (1 + std::abs(cpu)));
        dg1.copy_to(gw1);
        dgc1.copy_to(gwc1);
        dg2.copy_to(gw2);
        dgc2.copy_to(gwc2);
        check_close<float>("dW1", gw1, g1, 1e-3);
        check_close<float>("db2", gwc2, gc2, 1e-3);
        for (std::size_t i = 0; i < w1.size(); ++i) w1[i] -= 0.5f * g1[i];
        for (std::size_t i = 0; i < c1.size(); ++i) c1[i] -= 0.5f * gc1[i];
        for (std::size_t i = 0; i < w2.size(); ++i) w2[i] -= 0.5f * g2[i];
        for (std::size_t i = 0; i < c2.size(); ++i) c2[i] -= 0.5f * gc2[i];
    }
}

// One matrix whose T x T scores pass the device's chunk (attention_device_chunk, 2^24): its queries
// go in ranges, the later ones adding their dK and dV through a temporary.
TEST_CASE("fused attention on the device: a long sequence in ranges of queries", "[cuda][emulation]") {
    std::optional<cuda_emulation::scoped_emulator> emulate;
    if (!tg::cuda::available()) emulate.emplace();
    constexpr auto x = tg::param<"x", float, tg::shape<1, tg::dyn, 2>>;
    constexpr auto u = tg::input<"u", float, tg::shape<1, tg::dyn, 2>>;
    const std::size_t t = 4500;  // 2.0e7 scores: two ranges of queries
    static_assert(4500 * 4500 > tg::detail::attention_device_chunk);
    std::mt19937 rng(9);
    std::uniform_real_distribution<float> dist(-1.f, 1.f);
    std::vector<float> xs(2 * t), us(2 * t);
    for (float& e : xs) e = dist(rng);
    for (float& e : us) e = dist(rng);
    auto step = tg::compile(tg::sum(tg::scaled_dot_product_attention(x, x * tg::lit<0.5>, tg::tanh(x), tg::causal) * u), tg::wrt(x));
    std::vector<float> cpu_g(2 * t);
    const float cpu = step.value_and_grad(tg::bind(x, xs, {1, t, 2}), tg::bind(u, us, {1, t, 2}), tg::grad_into(x, cpu_g));
    using dense = tg::cuda::tensor<float, tg::shape<1, tg::dyn, 2>>;
    auto dx = dense::from_host(xs, {1, t, 2});
    auto du = dense::from_host(us, {1, t, 2});
    dense dg({1, t, 2});
    const float gpu = step.value_and_grad(tg::bind(x, dx), tg::bind(u, du), tg::grad_into(x, dg));
    CHECK(std::abs(gpu - cpu) <= 1e-4f * (1 + std::abs(cpu)));
    const auto g = dg.to_host();
    std::size_t off = 0;
    for (std::size_t i = 0; i < g.size(); ++i) off += !(std::abs(g[i] - cpu_g[i]) <= 1e-4f * (1 + std::abs(cpu_g[i])));
    CHECK(off == 0);
}
