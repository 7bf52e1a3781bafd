// dropout (ops/dropout.hpp): the Philox mask, the 1 / (1 - p) scale, and the same mask regenerated
// in the backward.
#include <check_gradient.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace tg = typegrad;
using tg::testing::at;
using tg::testing::check_gradient;
using tg::testing::uniform;

namespace {

// The mask, computed here from core/philox.hpp: element e uses word e % 4 of block offset + e / 4,
// kept when its uniform float is below 1 - p (the kernel's comparison, in double).
std::vector<bool> philox_keep(std::int64_t seed, std::int64_t offset, std::size_t n, double p) {
    std::vector<bool> keep(n);
    const auto key = tg::philox_key_from_seed(std::uint64_t(seed));
    for (std::size_t e = 0; e < n; ++e)
        keep[e] = double(tg::uniform_float(tg::philox4x32_10(tg::philox_counter_at(std::uint64_t(offset) + e / 4), key)[e % 4])) <
                  1.0 - p;
    return keep;
}

}  // namespace

TEST_CASE("dropout: Philox mask, scale, regenerated in the backward", "[ops][dropout]") {
    constexpr auto v = tg::param<"v", double, tg::shape<tg::dyn, 7>>;
    constexpr auto rng = tg::input<"rng", std::int64_t, tg::shape<2>>;
    constexpr auto q = tg::input<"q", double, tg::shape<tg::dyn, 7>>;
    const std::size_t rows = 1500, n = rows * 7;
    const auto xv = uniform(n, 0.5, 1.5, 7);
    const auto qv = uniform(n, -1.0, 1.0, 8);
    const std::array<std::int64_t, 2> r{1234567890123LL, 17};
    const std::vector<bool> keep = philox_keep(r[0], r[1], n, 0.3);
    const std::size_t kept = std::size_t(std::count(keep.begin(), keep.end(), true));
    // 10500 draws at 0.7: the standard deviation of the count is 47
    CHECK(std::abs(double(kept) - 0.7 * double(n)) < 4 * 47.0);

    auto step = tg::compile(tg::sum(tg::dropout<0.3>(v, rng) * q), tg::wrt(v));
    std::vector<double> g(n);
    const double total = step.value_and_grad(tg::bind(v, xv, {rows, 7}), tg::bind(rng, r), tg::bind(q, qv, {rows, 7}),
                                             tg::grad_into(v, g));
    double expect = 0;
    std::size_t mismatches = 0;
    for (std::size_t e = 0; e < n; ++e) {
        const double m = keep[e] ? 1 / 0.7 : 0.0;
        expect += xv[e] * m * qv[e];
        mismatches += g[e] != qv[e] * m;
    }
    CHECK(mismatches == 0);
    CHECK_THAT(total, Catch::Matchers::WithinRel(expect, 1e-12));
    // forward then backward later: the backward regenerates the same mask (no stored mask: the
    // backward graph holds a dropout node of the gradient)
    auto fwd = step.forward(tg::bind(v, xv, {rows, 7}), tg::bind(rng, r), tg::bind(q, qv, {rows, 7}));
    std::vector<double> g2(n);
    step.backward(fwd, tg::grad_into(v, g2));
    CHECK(g2 == g);
    STATIC_REQUIRE(tg::op_dtypes_t<tg::backward_nodes_t<decltype(step)>, "dropout">::size == 1);
    // another offset, another mask; the gradient is linear in x: finite differences agree
    const std::array<std::int64_t, 2> r2{1234567890123LL, 18};
    std::vector<double> g3(n);
    step.value_and_grad(tg::bind(v, xv, {rows, 7}), tg::bind(rng, r2), tg::bind(q, qv, {rows, 7}), tg::grad_into(v, g3));
    CHECK(g3 != g);
    const auto small = uniform(14, -1.0, 1.0, 9);
    check_gradient(tg::sum(tg::square(tg::dropout<0.5>(v, rng))), tg::testing::fixed(tg::bind(rng, r)),
                   at(v, small, {2, 7}));
    // p = 0 and inference are the identity; p = 1 zeroes
    STATIC_REQUIRE(std::is_same_v<decltype(tg::dropout<0.0>(v, rng)), std::remove_cvref_t<decltype(v)>>);
    STATIC_REQUIRE(std::is_same_v<decltype(tg::dropout<0.3, false>(v, rng)), std::remove_cvref_t<decltype(v)>>);
    auto all = tg::compile(tg::dropout<1.0>(v, rng), tg::wrt(v)).forward(tg::bind(v, xv, {rows, 7}), tg::bind(rng, r));
    CHECK(std::all_of(all.values().begin(), all.values().end(), [](double e) { return e == 0; }));
}

TEST_CASE("dropout: x times the mask, as PyTorch: a dropped inf or NaN is NaN", "[ops][dropout]") {
    constexpr auto v = tg::param<"v", float, tg::shape<tg::dyn>>;
    constexpr auto rng = tg::input<"rng", std::int64_t, tg::shape<2>>;
    constexpr auto q = tg::input<"q", float, tg::shape<tg::dyn>>;
    const std::size_t n = 64;
    const std::array<std::int64_t, 2> r{42, 3};
    const std::vector<bool> keep = philox_keep(r[0], r[1], n, 0.5);
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> x(n), g(n), gx(n, -1.0f);
    for (std::size_t e = 0; e < n; ++e) {
        x[e] = e % 3 == 0 ? inf : e % 3 == 1 ? nan : -1.5f;
        g[e] = e % 2 == 0 ? -inf : 0.25f;
    }
    REQUIRE(std::count(keep.begin(), keep.end(), false) > 8);
    auto fwd = tg::compile(tg::dropout<0.5>(v, rng), tg::wrt(v)).forward(tg::bind(v, x, {n}), tg::bind(rng, r));
    // the gradient reaching dropout is g: sum(dropout(v) * q) with q = g
    auto step = tg::compile(tg::sum(tg::dropout<0.5>(v, rng) * q), tg::wrt(v));
    std::vector<float> ones(n, 1.0f);
    step.value_and_grad(tg::bind(v, ones, {n}), tg::bind(rng, r), tg::bind(q, g, {n}), tg::grad_into(v, gx));
    std::size_t wrong = 0;
    for (std::size_t e = 0; e < n; ++e) {
        const float m = keep[e] ? 2.0f : 0.0f;
        const float want = x[e] * m, want_g = g[e] * m;  // inf * 0 = NaN
        const float got = fwd.values()[e];
        wrong += !(std::isnan(want) ? std::isnan(got) : got == want);
        wrong += !(std::isnan(want_g) ? std::isnan(gx[e]) : gx[e] == want_g);
    }
    CHECK(wrong == 0);
    // p = 1: x * 0, so inf and NaN give NaN and finite values 0
    auto all = tg::compile(tg::dropout<1.0>(v, rng), tg::wrt(v)).forward(tg::bind(v, x, {n}), tg::bind(rng, r));
    for (std::size_t e = 0; e < n; ++e) {
        const float got = all.values()[e];
        CHECK((std::isfinite(x[e]) ? got == 0 : std::isnan(got)));
    }
}
