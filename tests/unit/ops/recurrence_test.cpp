// Scans (ops/recurrence.hpp): linear_recurrence and cumsum against hand-written loops in double
// (every axis, broadcast decays, a strided operand), their gradients against finite differences
// and the closed form (the reverse recurrence), second order, bf16 with f32 accumulation.
#include <check_gradient.hpp>

#include <cmath>

namespace tg = typegrad;
using tg::testing::at;
using tg::testing::check_gradient;
using tg::testing::fixed;
using tg::testing::require_close;
using tg::testing::uniform;
using tg::testing::values_of;

namespace {
// h along axis 1 of [n, t, d] (row-major), a given per element (the broadcast already applied)
std::vector<double> ref_recurrence(const std::vector<double>& a, const std::vector<double>& b, std::size_t n,
                                   std::size_t t, std::size_t d) {
    std::vector<double> h(b.size());
    for (std::size_t o = 0; o < n; ++o)
        for (std::size_t i = 0; i < d; ++i)
            for (std::size_t s = 0; s < t; ++s) {
                const std::size_t e = (o * t + s) * d + i;
                h[e] = s == 0 ? b[e] : a[e] * h[e - d] + b[e];
            }
    return h;
}
}  // namespace

TEST_CASE("linear_recurrence: values along each axis, broadcast decays", "[ops][recurrence]") {
    constexpr std::size_t n = 2, t = 7, d = 3;
    constexpr auto b = tg::param<"b", double, tg::shape<n, tg::dyn, d>>;
    constexpr auto a = tg::param<"a", double, tg::shape<n, tg::dyn, d>>;
    constexpr auto ad = tg::param<"ad", double, tg::shape<d>>;  // a decay per channel
    constexpr auto phi = tg::param<"phi", double>;              // one decay for all
    const auto bv = uniform(n * t * d, -1.0, 1.0, 1), av = uniform(n * t * d, -1.5, 1.5, 2), adv = uniform(d, -1.0, 1.0, 3);
    const std::vector<double> phiv{0.9};
    // along axis 1 (time), a per element
    require_close(values_of(tg::compile(tg::linear_recurrence<1>(a, b), tg::wrt(b)), tg::bind(b, bv, {n, t, d}),
                            tg::bind(a, av, {n, t, d})),
                  ref_recurrence(av, bv, n, t, d));
    // a [d] broadcast over [n, t, d], and a scalar
    std::vector<double> a_full(n * t * d), phi_full(n * t * d, 0.9);
    for (std::size_t e = 0; e < a_full.size(); ++e) a_full[e] = adv[e % d];
    require_close(values_of(tg::compile(tg::linear_recurrence<-2>(ad, b), tg::wrt(b)), tg::bind(b, bv, {n, t, d}),
                            tg::bind(ad, adv)),
                  ref_recurrence(a_full, bv, n, t, d));
    require_close(values_of(tg::compile(tg::linear_recurrence<1>(phi, b), tg::wrt(b)), tg::bind(b, bv, {n, t, d}),
                            tg::bind(phi, phiv)),
                  ref_recurrence(phi_full, bv, n, t, d));
    // along the last axis ([n * t, d] lines of d) and the first ([n] lines of one element: h = b)
    require_close(values_of(tg::compile(tg::linear_recurrence<2>(a, b), tg::wrt(b)), tg::bind(b, bv, {n, t, d}),
                            tg::bind(a, av, {n, t, d})),
                  ref_recurrence(av, bv, n * t, d, 1));
    require_close(values_of(tg::compile(tg::linear_recurrence<0>(a, b), tg::wrt(b)), tg::bind(b, bv, {n, t, d}),
                            tg::bind(a, av, {n, t, d})),
                  ref_recurrence(av, bv, 1, n, t * d));
    // a strided operand: b given as [d, t, n] and permuted
    constexpr auto bt = tg::param<"bt", double, tg::shape<d, t, n>>;
    std::vector<double> btv(bv.size());
    for (std::size_t o = 0; o < n; ++o)
        for (std::size_t s = 0; s < t; ++s)
            for (std::size_t i = 0; i < d; ++i) btv[(i * t + s) * n + o] = bv[(o * t + s) * d + i];
    require_close(values_of(tg::compile(tg::linear_recurrence<1>(ad, tg::permute<2, 1, 0>(bt)), tg::wrt(bt)),
                            tg::bind(bt, btv), tg::bind(ad, adv)),
                  ref_recurrence(a_full, bv, n, t, d));
    // one step: h = b
    const std::vector<double> b1(bv.begin(), bv.begin() + n * d), a1(av.begin(), av.begin() + n * d);
    require_close(values_of(tg::compile(tg::linear_recurrence<1>(a, b), tg::wrt(b)), tg::bind(b, b1, {n, 1, d}),
                            tg::bind(a, a1, {n, 1, d})),
                  b1, 0.0);
}

TEST_CASE("linear_recurrence: gradients (finite differences, closed form, second order)",
          "[ops][recurrence][gradient]") {
    constexpr std::size_t n = 2, t = 6, d = 3;
    constexpr auto b = tg::param<"b", double, tg::shape<n, tg::dyn, d>>;
    constexpr auto a = tg::param<"a", double, tg::shape<n, tg::dyn, d>>;
    constexpr auto ad = tg::param<"ad", double, tg::shape<d>>;
    constexpr auto q = tg::input<"q", double, tg::shape<n, tg::dyn, d>>;
    auto bv = uniform(n * t * d, -1.0, 1.0, 4), av = uniform(n * t * d, -1.2, 1.2, 5), adv = uniform(d, -1.0, 1.0, 6),
         qv = uniform(n * t * d, -1.0, 1.0, 7);
    check_gradient(tg::sum(tg::linear_recurrence<1>(a, b) * q), fixed(tg::bind(q, qv, {n, t, d})), at(a, av, {n, t, d}),
                   at(b, bv, {n, t, d}));
    check_gradient(tg::sum(tg::sin(tg::linear_recurrence<1>(ad, b))), at(ad, adv), at(b, bv, {n, t, d}));
    check_gradient(tg::sum(tg::square(tg::linear_recurrence<2>(a, b))), at(a, av, {n, t, d}), at(b, bv, {n, t, d}));
    // closed form: d sum(h q) / d b = the reverse recurrence of q, r_t = a_{t+1} r_{t+1} + q_t; and
    // d / d a_t = r_t h_{t-1} (0 at t = 0)
    std::vector<double> ga(av.size()), gb(bv.size());
    tg::compile(tg::sum(tg::linear_recurrence<1>(a, b) * q), tg::wrt(a, b))
        .value_and_grad(tg::bind(a, av, {n, t, d}), tg::bind(b, bv, {n, t, d}), tg::bind(q, qv, {n, t, d}),
                        tg::grad_into(a, ga), tg::grad_into(b, gb));
    const auto h = ref_recurrence(av, bv, n, t, d);
    std::vector<double> r(bv.size()), ra(av.size());
    for (std::size_t o = 0; o < n; ++o)
        for (std::size_t i = 0; i < d; ++i)
            for (std::size_t s = t; s-- > 0;) {
                const std::size_t e = (o * t + s) * d + i;
                r[e] = s + 1 == t ? qv[e] : av[e + d] * r[e + d] + qv[e];
                ra[e] = s == 0 ? 0.0 : r[e] * h[e - d];
            }
    require_close(gb, r, 1e-14);
    require_close(ga, ra, 1e-14);
    // second order: the gradient's own gradient goes through the reverse recurrence and shifts
    auto inner = tg::sum(tg::square(tg::linear_recurrence<1>(a, b)) * q);
    check_gradient(tg::sum(tg::square(tg::grad(inner, a))) + tg::sum(tg::grad(inner, b) * q),
                   fixed(tg::bind(q, qv, {n, t, d})), at(a, av, {n, t, d}), at(b, bv, {n, t, d}));
}

TEST_CASE("cumsum: values and gradients along an axis", "[ops][recurrence][gradient]") {
    constexpr auto x = tg::param<"x", double, tg::shape<3, tg::dyn>>;
    const std::size_t len = 5;
    auto xv = uniform(3 * len, -1.0, 1.0, 8);
    std::vector<double> rows(xv.size()), cols(xv.size());
    for (std::size_t i = 0; i < 3; ++i)
        for (std::size_t j = 0; j < len; ++j) {
            const std::size_t e = i * len + j;
            rows[e] = xv[e] + (j > 0 ? rows[e - 1] : 0.0);
            cols[e] = xv[e] + (i > 0 ? cols[e - len] : 0.0);
        }
    require_close(values_of(tg::compile(tg::cumsum<1>(x), tg::wrt(x)), tg::bind(x, xv, {3, len})), rows, 0.0);
    require_close(values_of(tg::compile(tg::cumsum<-1>(x), tg::wrt(x)), tg::bind(x, xv, {3, len})), rows, 0.0);
    require_close(values_of(tg::compile(tg::cumsum<0>(x), tg::wrt(x)), tg::bind(x, xv, {3, len})), cols, 0.0);
    check_gradient(tg::sum(tg::sin(tg::cumsum<1>(x))), at(x, xv, {3, len}));
    check_gradient(tg::sum(tg::square(tg::cumsum<0>(tg::exp(x)))), at(x, xv, {3, len}));
    // d sum(cumsum(x)) / d x_j = the number of prefixes holding j: len - j
    std::vector<double> g(xv.size()), count(xv.size());
    tg::compile(tg::sum(tg::cumsum<1>(x)), tg::wrt(x)).value_and_grad(tg::bind(x, xv, {3, len}), tg::grad_into(x, g));
    for (std::size_t e = 0; e < count.size(); ++e) count[e] = double(len - e % len);
    require_close(g, count, 0.0);
    // second order
    auto inner = tg::sum(tg::square(tg::cumsum<1>(x)) * tg::cumsum<1>(x));
    check_gradient(tg::sum(tg::square(tg::grad(inner, x))), at(x, xv, {3, len}));
}

TEST_CASE("cumsum and linear_recurrence in bf16 accumulate in f32", "[ops][recurrence]") {
    // 64 values of 1/64: every partial sum is exact in f32; a bf16 accumulator (8 bits) would stall
    constexpr auto x = tg::input<"x", tg::bf16, tg::shape<64>>;
    std::vector<tg::bf16> xv(64, tg::bf16(0.015625f));
    auto ctx = tg::compile(tg::cumsum<0>(x) * tg::lit<1>, tg::wrt()).forward(tg::bind(x, xv));
    const auto v = ctx.values();
    for (std::size_t e = 0; e < 64; ++e) CHECK(float(v[e]) == float(tg::bf16(float(e + 1) / 64.0f)));
    STATIC_REQUIRE(std::is_same_v<decltype(tg::cumsum<0>(x))::value_type, tg::bf16>);
    STATIC_REQUIRE(std::is_same_v<decltype(tg::autocast<tg::cuda_bf16>(tg::cumsum<0>(x)))::value_type, float>);
}
