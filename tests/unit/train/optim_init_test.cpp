// Philox, initialisers, optimizers, schedules and clipping: the numerics of training, each checked
// against published vectors or a closed-form computation written out here in double.
#include <catch2/catch.hpp>

#include <typegrad/core/philox.hpp>
#include <typegrad/core/threads.hpp>
#include <typegrad/train/init.hpp>
#include <typegrad/train/optim.hpp>
#include <typegrad/train/schedule.hpp>
#include <typegrad/version.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace tg = typegrad;

// Random123's kat_vectors file (counter[4], key[2] -> output[4]).
TEST_CASE("philox4x32 reproduces the Random123 known-answer vectors", "[philox]") {
    struct kat {
        tg::philox_counter ctr;
        tg::philox_key key;
        tg::philox_counter out7, out10;
    };
    constexpr std::array<kat, 3> kats{{
        {{0, 0, 0, 0}, {0, 0},
         {0x5f6fb709, 0x0d893f64, 0x4f121f81, 0x4f730a48},
         {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
         {0x5207ddc2, 0x45165e59, 0x4d8ee751, 0x8c52f662},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
         {0x4dfccaba, 0x190a87f0, 0xc47362ba, 0xb6b5242a},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    }};
    for (const auto& k : kats) {
        CHECK(tg::philox4x32_10(k.ctr, k.key) == k.out10);
        CHECK(tg::philox4x32<10>(k.ctr, k.key) == k.out10);
        CHECK(tg::philox4x32<7>(k.ctr, k.key) == k.out7);
    }
    // Usable in constant expressions (so tables and tests can be built at compile time).
    STATIC_REQUIRE(tg::philox4x32_10({0, 0, 0, 0}, {0, 0})[0] == 0x6627e8d5u);
}

TEST_CASE("philox seeds and counters split 64-bit values low word first", "[philox]") {
    CHECK(tg::philox_key_from_seed(0x0123456789abcdefull) == tg::philox_key{0x89abcdef, 0x01234567});
    CHECK(tg::philox_counter_at(0x1'0000'0002ull, 0x3'0000'0004ull) ==
          tg::philox_counter{2, 1, 4, 3});
}

TEST_CASE("uniform mappings cover [0, 1) with the documented rules", "[philox]") {
    // PyTorch's rule: low 24 bits.
    CHECK(tg::uniform_float(0u) == 0.0f);
    CHECK(tg::uniform_float(0xFF00'0000u) == 0.0f);
    CHECK(tg::uniform_float(0x0080'0000u) == 0.5f);
    CHECK(tg::uniform_float(0xFFFF'FFFFu) == 1.0f - 0x1p-24f);
    CHECK(tg::uniform_float(1u) == 0x1p-24f);
    // JAX's rule: high 23 bits.
    CHECK(tg::uniform_float_jax(0u) == 0.0f);
    CHECK(tg::uniform_float_jax(0x0000'01FFu) == 0.0f);
    CHECK(tg::uniform_float_jax(0x8000'0000u) == 0.5f);
    CHECK(tg::uniform_float_jax(0xFFFF'FFFFu) == 1.0f - 0x1p-23f);
    // Double: 53 low bits.
    CHECK(tg::uniform_double(0u, 0u) == 0.0);
    CHECK(tg::uniform_double(0xFFFF'FFFFu, 0xFFFF'FFFFu) == 1.0 - 0x1p-53);
    CHECK(tg::uniform_double(0u, 0x0010'0000u) == 0.5);
    CHECK(tg::uniform_double(0u, 0x0020'0000u) == 0.0);  // bit 53 is dropped
    const auto block = tg::philox4x32_10({0, 0, 0, 0}, {0, 0});
    const auto u = tg::philox_uniform4({0, 0, 0, 0}, {0, 0});
    for (int i = 0; i < 4; ++i) CHECK(u[i] == static_cast<float>(block[i] & 0xFFFFFFu) / 16777216.0f);
}

TEST_CASE("philox uniforms are uniform: mean and variance of 2^16 draws", "[philox]") {
    double sum = 0, sum_sq = 0;
    constexpr int blocks = 1 << 14;
    for (int i = 0; i < blocks; ++i)
        for (float v : tg::philox_uniform4(tg::philox_counter_at(i), tg::philox_key_from_seed(42))) {
            sum += v;
            sum_sq += double(v) * v;
        }
    const double n = 4.0 * blocks, mean = sum / n, var = sum_sq / n - mean * mean;
    // Standard error of the mean is sqrt(1/12/n) = 0.0011; 5 sigma.
    CHECK(std::abs(mean - 0.5) < 0.0057);
    CHECK(std::abs(var - 1.0 / 12.0) < 0.002);
}

TEST_CASE("version macros agree with each other and with typegrad::version", "[package]") {
    STATIC_REQUIRE(TYPEGRAD_VERSION ==
                   TYPEGRAD_VERSION_MAJOR * 10000 + TYPEGRAD_VERSION_MINOR * 100 + TYPEGRAD_VERSION_PATCH);
    STATIC_REQUIRE(tg::version.major == TYPEGRAD_VERSION_MAJOR && tg::version.minor == TYPEGRAD_VERSION_MINOR &&
                   tg::version.patch == TYPEGRAD_VERSION_PATCH);
    const std::string expected = std::to_string(TYPEGRAD_VERSION_MAJOR) + "." + std::to_string(TYPEGRAD_VERSION_MINOR) +
                                 "." + std::to_string(TYPEGRAD_VERSION_PATCH);
    CHECK(expected == TYPEGRAD_VERSION_STRING);
}

TEST_CASE("set_num_threads sets the count in effect; 0 restores the default", "[package]") {
    const std::size_t before = tg::num_threads();
    tg::set_num_threads(3);
    CHECK(tg::num_threads() == 3);
    tg::set_num_threads(1);
    CHECK(tg::num_threads() == 1);
    tg::set_num_threads(0);
    CHECK(tg::num_threads() == before);
}

// ---- optimizers -----------------------------------------------------------------------------
namespace {

struct pset {
    BOOST_HANA_DEFINE_STRUCT(pset, (std::vector<double>, w), (std::vector<float>, f));
};

// A parameter set whose buffers are long enough for SIMD bodies and tails (19 and 37 elements).
pset start_params() {
    pset p{std::vector<double>(19), std::vector<float>(37)};
    for (std::size_t i = 0; i < p.w.size(); ++i) p.w[i] = 0.5 - 0.07 * double(i);
    for (std::size_t i = 0; i < p.f.size(); ++i) p.f[i] = float(0.3 - 0.02 * double(i));
    return p;
}
// Gradients that change with the step and change sign across elements.
pset grads_at(int t) {
    pset g{std::vector<double>(19), std::vector<float>(37)};
    for (std::size_t i = 0; i < g.w.size(); ++i) g.w[i] = std::sin(1.0 + double(i) * 0.7 + t * 1.3);
    for (std::size_t i = 0; i < g.f.size(); ++i) g.f[i] = float(std::cos(0.5 + double(i) * 0.3 - t * 0.9));
    return g;
}

// The update rules as PyTorch documents them (torch.optim.SGD / Adam / AdamW pseudo-code), one
// element at a time in double: the reference the optimizers' SIMD loops are checked against.
struct reference_state {
    double m = 0, v = 0, vmax = 0, buf = 0;
};
double reference_sgd(double p, double g, reference_state& s, int t, const tg::sgd_options& o) {
    if (o.weight_decay != 0) g += o.weight_decay * p;
    if (o.momentum != 0) {
        s.buf = t == 1 ? g : o.momentum * s.buf + (1 - o.dampening) * g;
        g = o.nesterov ? g + o.momentum * s.buf : s.buf;
    }
    return p - o.lr * g;
}
double reference_adam(double p, double g, reference_state& s, int t, const tg::adam_options& o, bool decoupled) {
    if (o.weight_decay != 0) {
        if (decoupled) p *= 1 - o.lr * o.weight_decay;
        else g += o.weight_decay * p;
    }
    s.m = o.beta1 * s.m + (1 - o.beta1) * g;
    s.v = o.beta2 * s.v + (1 - o.beta2) * g * g;
    const double m_hat = s.m / (1 - std::pow(o.beta1, t));
    s.vmax = std::max(s.vmax, s.v);
    const double v_hat = (o.amsgrad ? s.vmax : s.v) / (1 - std::pow(o.beta2, t));
    return p - o.lr * m_hat / (std::sqrt(v_hat) + o.eps);
}

template <class Opt, class Ref>
void check_against_reference(Opt& opt, Ref ref, int steps) {
    pset p = start_params();
    pset expected = p;
    std::vector<reference_state> sw(p.w.size()), sf(p.f.size());
    std::vector<double> pf(p.f.begin(), p.f.end());  // the float params' reference runs in double
    for (int t = 1; t <= steps; ++t) {
        const pset g = grads_at(t);
        opt.step(p, g);
        for (std::size_t i = 0; i < p.w.size(); ++i) expected.w[i] = ref(expected.w[i], g.w[i], sw[i], t);
        for (std::size_t i = 0; i < p.f.size(); ++i) pf[i] = ref(pf[i], double(g.f[i]), sf[i], t);
    }
    for (std::size_t i = 0; i < p.w.size(); ++i) CHECK_THAT(p.w[i], Catch::Matchers::WithinRel(expected.w[i], 1e-12));
    for (std::size_t i = 0; i < p.f.size(); ++i)
        CHECK_THAT(double(p.f[i]), Catch::Matchers::WithinAbs(pf[i], 2e-5));
    CHECK(opt.steps == std::vector<std::int64_t>{steps, steps});
}

}  // namespace

TEST_CASE("sgd: plain, momentum with dampening and weight decay, nesterov", "[optim]") {
    SECTION("plain: p - lr * g, exactly") {
        tg::sgd opt(start_params(), {.lr = 0.25});
        pset p = start_params();
        const pset g = grads_at(1);
        opt.step(p, g);
        for (std::size_t i = 0; i < p.w.size(); ++i) CHECK(p.w[i] == start_params().w[i] - 0.25 * g.w[i]);
        for (std::size_t i = 0; i < p.f.size(); ++i) CHECK(p.f[i] == start_params().f[i] - 0.25f * g.f[i]);
    }
    SECTION("constant gradient, momentum 0.9: the velocity after 3 steps is g (1 + 0.9 + 0.81)") {
        pset p{{1.0}, {}};
        tg::sgd opt(p, {.lr = 0.1, .momentum = 0.9});
        const pset g{{2.0}, {}};
        for (int t = 0; t < 3; ++t) opt.step(p, g);
        CHECK_THAT(opt.momentum_buffer.w[0], Catch::Matchers::WithinRel(2.0 * 2.71, 1e-15));
        CHECK_THAT(p.w[0], Catch::Matchers::WithinRel(1.0 - 0.1 * 2.0 * (1 + 1.9 + 2.71), 1e-15));
    }
    for (const tg::sgd_options o : {tg::sgd_options{.lr = 0.05, .momentum = 0.9, .dampening = 0.25, .weight_decay = 0.01},
                                    tg::sgd_options{.lr = 0.05, .momentum = 0.8, .weight_decay = 0.1, .nesterov = true}}) {
        tg::sgd opt(start_params(), o);
        check_against_reference(opt, [&](double p, double g, reference_state& s, int t) { return reference_sgd(p, g, s, t, o); }, 7);
    }
    CHECK_THROWS_AS(tg::sgd(start_params(), {.lr = 0.1, .nesterov = true}), tg::error);
}

TEST_CASE("adam: the first step moves each param by lr * g / (|g| + eps)", "[optim]") {
    pset p{{1.0, -2.0, 0.5}, {}};
    tg::adam opt(p, {.lr = 0.01});
    const pset g{{0.3, -4.0, 1e-3}, {}};
    opt.step(p, g);
    const std::vector<double> p0{1.0, -2.0, 0.5};
    for (std::size_t i = 0; i < 3; ++i)
        CHECK_THAT(p.w[i], Catch::Matchers::WithinRel(p0[i] - 0.01 * g.w[i] / (std::abs(g.w[i]) + 1e-8), 1e-13));
    CHECK_THAT(opt.exp_avg.w[1], Catch::Matchers::WithinRel(0.1 * -4.0, 1e-15));
    CHECK_THAT(opt.exp_avg_sq.w[1], Catch::Matchers::WithinRel(0.001 * 16.0, 1e-13));
}

TEST_CASE("adam and adamw follow PyTorch's rules over many steps (weight decay, amsgrad)", "[optim]") {
    for (const bool amsgrad : {false, true})
        for (const double wd : {0.0, 0.05}) {
            const tg::adam_options o{.lr = 0.02, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = wd, .amsgrad = amsgrad};
            tg::adam a(start_params(), o);
            check_against_reference(a, [&](double p, double g, reference_state& s, int t) { return reference_adam(p, g, s, t, o, false); }, 9);
            tg::adamw w(start_params(), o);
            check_against_reference(w, [&](double p, double g, reference_state& s, int t) { return reference_adam(p, g, s, t, o, true); }, 9);
        }
    // amsgrad keeps the running maximum of exp_avg_sq.
    tg::adam a(start_params(), {.amsgrad = true});
    pset p = start_params();
    a.step(p, grads_at(1));
    pset small = grads_at(2);
    for (auto& v : small.w) v *= 1e-3;
    a.step(p, small);
    for (std::size_t i = 0; i < p.w.size(); ++i) CHECK(a.max_exp_avg_sq.w[i] >= a.exp_avg_sq.w[i]);
    CHECK(a.max_exp_avg_sq.w[0] > a.exp_avg_sq.w[0]);
}

TEST_CASE("optimizer layout errors are thrown before any param or state is written", "[optim]") {
    pset p = start_params();
    tg::adam opt(p, {});
    pset g = grads_at(1);
    g.f.resize(36);
    const pset before = p;
    CHECK_THROWS_AS(opt.step(p, g), tg::shape_error);
    CHECK(p.w == before.w);
    CHECK(p.f == before.f);
    CHECK(opt.exp_avg.w == std::vector<double>(19, 0.0));
}

TEST_CASE("clip_grad_norm scales all gradients together to the maximum norm", "[optim]") {
    pset g{{3.0}, {4.0f}};
    CHECK(tg::clip_grad_norm(g, 10.0) == 5.0);
    CHECK(g.w[0] == 3.0);  // below the maximum: untouched
    CHECK(tg::clip_grad_norm(g, 1.0) == 5.0);
    CHECK_THAT(g.w[0], Catch::Matchers::WithinRel(3.0 / (5.0 + 1e-6), 1e-15));
    CHECK_THAT(double(g.f[0]), Catch::Matchers::WithinRel(4.0 / (5.0 + 1e-6), 1e-7));
    pset bad{{std::numeric_limits<double>::infinity()}, {1.0f}};
    CHECK_THROWS_AS(tg::clip_grad_norm(bad, 1.0), tg::anomaly_error);
    CHECK(bad.f[0] == 1.0f);
}

TEST_CASE("zeros_like and zero_grad", "[optim]") {
    const pset z = tg::zeros_like(start_params());
    CHECK(z.w == std::vector<double>(19, 0.0));
    CHECK(z.f.size() == 37);
    pset g = grads_at(1);
    tg::zero_grad(g);
    CHECK(g.f == std::vector<float>(37, 0.0f));
}

TEST_CASE("learning-rate schedules match PyTorch's closed forms", "[schedule]") {
    const tg::step_lr s{.base_lr = 0.1, .step_size = 3, .gamma = 0.5};
    CHECK(s(0) == 0.1);
    CHECK(s(2) == 0.1);
    CHECK(s(3) == 0.05);
    CHECK(s(7) == 0.025);
    const tg::cosine_annealing_lr c{.base_lr = 1.0, .t_max = 10, .eta_min = 0.1};
    CHECK(c(0) == 1.0);
    CHECK_THAT(c(5), Catch::Matchers::WithinRel(0.55, 1e-15));
    CHECK_THAT(c(10), Catch::Matchers::WithinAbs(0.1, 1e-15));
    const tg::linear_lr l{.base_lr = 0.3, .start_factor = 0.5, .end_factor = 1.0, .total_iters = 4};
    CHECK(l(0) == 0.15);
    CHECK_THAT(l(2), Catch::Matchers::WithinRel(0.225, 1e-15));
    CHECK(l(4) == 0.3);
    CHECK(l(100) == 0.3);
    const tg::warmup_lr w{4, c};
    CHECK(w(0) == 0.0);
    CHECK(w(2) == 0.5);
    CHECK(w(4) == 1.0);
    CHECK_THAT(w(9), Catch::Matchers::WithinRel(0.55, 1e-15));
}

// ---- initialisation ---------------------------------------------------------------------------
namespace {
struct moments {
    double mean, std, min, max;
};
template <class R>
moments moments_of(const R& v) {
    double s = 0, s2 = 0, lo = 1e300, hi = -1e300;
    for (double x : v) {
        s += x;
        s2 += x * x;
        lo = std::min(lo, x);
        hi = std::max(hi, x);
    }
    const double n = double(std::size(v)), m = s / n;
    return {m, std::sqrt(s2 / n - m * m), lo, hi};
}
}  // namespace

TEST_CASE("fans and gains follow torch.nn.init", "[init]") {
    const std::array<std::size_t, 4> conv{64, 3, 5, 5};
    CHECK(tg::compute_fans(conv).in == 75);
    CHECK(tg::compute_fans(conv).out == 1600);
    const std::array<std::size_t, 2> linear{10, 4};
    CHECK(tg::compute_fans(linear).in == 4);
    CHECK(tg::compute_fans(linear).out == 10);
    const std::array<std::size_t, 1> vec{10};
    CHECK_THROWS_AS(tg::compute_fans(vec), tg::shape_error);
    CHECK(tg::calculate_gain(tg::nonlinearity::relu) == std::sqrt(2.0));
    CHECK(tg::calculate_gain(tg::nonlinearity::tanh) == 5.0 / 3);
    CHECK(tg::calculate_gain(tg::nonlinearity::leaky_relu, 0.2) == std::sqrt(2.0 / 1.04));
    CHECK(tg::calculate_gain(tg::nonlinearity::sigmoid) == 1.0);
    CHECK(tg::calculate_gain(tg::nonlinearity::selu) == 0.75);
}

TEST_CASE("erfinv inverts erf", "[init]") {
    for (double y : {-0.999999, -0.9, -0.5, -1e-9, 0.0, 0.3, 0.77, 0.99, 0.9999999})
        CHECK_THAT(std::erf(tg::erfinv(y)), Catch::Matchers::WithinAbs(y, 1e-15));
    CHECK(std::isinf(tg::erfinv(1.0)));
}

TEST_CASE("initialisers are counter-based: element i depends on (seed, stream, i) only", "[init]") {
    std::vector<float> a(1000), b(10), c(1000);
    tg::generator g1{.seed = 7}, g2{.seed = 7}, g3{.seed = 8};
    tg::uniform(a, -1, 1, g1);
    tg::uniform(b, -1, 1, g2);
    tg::uniform(c, -1, 1, g3);
    for (std::size_t i = 0; i < b.size(); ++i) CHECK(a[i] == b[i]);  // prefix: independent of the length
    std::size_t same = 0;
    for (std::size_t i = 0; i < a.size(); ++i) same += a[i] == c[i];
    CHECK(same < 5);
    // Each call takes the next stream.
    CHECK(g1.stream == 1);
    std::vector<float> next(10);
    tg::uniform(next, -1, 1, g1);
    CHECK(next != b);
    // Element 0 is the documented mapping of Philox block 0, word 0 (Philox itself is KAT-tested).
    const auto block = tg::philox4x32_10(tg::philox_counter_at(0, 0), tg::philox_key_from_seed(7));
    CHECK(a[0] == tg::uniform_float(block[0]) * 2.0f - 1.0f);
    CHECK(a[5] == tg::uniform_float(tg::philox4x32_10(tg::philox_counter_at(1, 0), tg::philox_key_from_seed(7))[1]) * 2.0f - 1.0f);
}

TEST_CASE("uniform, normal and trunc_normal have their distributions' moments", "[init]") {
    tg::generator gen{.seed = 123};
    std::vector<double> u(40000), n(40000), t(40000);
    tg::uniform(u, 2, 5, gen);
    tg::normal(n, -1, 3, gen);
    tg::trunc_normal(t, 0, 1, -2, 2, gen);
    const moments mu = moments_of(u), mn = moments_of(n), mt = moments_of(t);
    // 5 standard errors.
    CHECK(std::abs(mu.mean - 3.5) < 5 * 0.866 / 200);
    CHECK(std::abs(mu.std - std::sqrt(0.75)) < 0.01);
    CHECK(mu.min >= 2);
    CHECK(mu.max < 5);
    CHECK(std::abs(mn.mean + 1) < 5 * 3.0 / 200);
    CHECK(std::abs(mn.std - 3) < 0.04);
    CHECK(mn.max - mn.min > 6 * 3);
    // The standard normal truncated to [-2, 2]: sd 0.87963.
    CHECK(std::abs(mt.mean) < 5 * 0.88 / 200);
    CHECK(std::abs(mt.std - 0.87963) < 0.01);
    CHECK(mt.min >= -2);
    CHECK(mt.max <= 2);
    CHECK(mt.max > 1.98);
}

TEST_CASE("xavier and kaiming use PyTorch's bounds and standard deviations", "[init]") {
    constexpr auto W = tg::param<"W", float, tg::shape<200, 100>>;
    tg::generator gen{.seed = 5};
    std::vector<float> ku(200 * 100), kn(200 * 100), xu(200 * 100), xn(200 * 100), from_leaf(200 * 100);
    tg::kaiming_uniform(ku, {200, 100}, gen);
    tg::kaiming_normal(kn, {200, 100}, gen, {.mode = tg::fan_mode::fan_out, .nonlin = tg::nonlinearity::relu});
    tg::xavier_uniform(xu, {200, 100}, gen, 2.0);
    tg::xavier_normal(xn, {200, 100}, gen);
    const double ku_bound = std::sqrt(2.0) * std::sqrt(3.0 / 100);  // gain(leaky_relu, 0) sqrt(3 / fan_in)
    const moments a = moments_of(ku), b = moments_of(kn), c = moments_of(xu), d = moments_of(xn);
    CHECK(a.max < ku_bound);
    CHECK(a.min >= -ku_bound);
    CHECK(a.max > 0.99 * ku_bound);
    CHECK(std::abs(a.std - ku_bound / std::sqrt(3.0)) < 0.02 * ku_bound);
    CHECK(std::abs(b.std - std::sqrt(2.0 / 200)) < 0.02 * std::sqrt(2.0 / 200));
    const double xu_bound = 2.0 * std::sqrt(6.0 / 300);
    CHECK(c.max < xu_bound);
    CHECK(c.max > 0.99 * xu_bound);
    CHECK(std::abs(d.std - std::sqrt(2.0 / 300)) < 0.02 * std::sqrt(2.0 / 300));
    // The extents can come from a static-shaped param: the same stream gives the same values.
    tg::generator again{.seed = 5};
    tg::kaiming_uniform(from_leaf, W, again);
    CHECK(from_leaf == ku);
    CHECK_THROWS_AS(tg::kaiming_uniform(from_leaf, {200, 99}, gen), tg::shape_error);
}
