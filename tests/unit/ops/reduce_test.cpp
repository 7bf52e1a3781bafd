// Whole-tensor reductions, prod and log_sum_exp.
#include <check_gradient.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

namespace tg = typegrad;
using tg::testing::at;
using tg::testing::check_gradient;
using tg::testing::uniform;
using tg::testing::values_of;

namespace {
constexpr auto x = tg::param<"x", double, tg::shape<tg::dyn>>;
constexpr auto m = tg::param<"m", double, tg::shape<5, 3>>;

// value_and_grad of a step over one float vector leaf on 1 and on 3 threads: the value's and the
// gradient's bits must agree; returns the one-thread value and gradient
template <class Step, class Leaf>
std::pair<float, std::vector<float>> same_bits_on_1_and_3_threads(const Step& step, Leaf f, const std::vector<float>& d) {
    const std::size_t n = d.size();
    std::vector<float> g1(n), g3(n);
    tg::set_num_threads(1);
    const float v1 = step.value_and_grad(tg::bind(f, d, {n}), tg::grad_into(f, g1));
    tg::set_num_threads(3);
    const float v3 = step.value_and_grad(tg::bind(f, d, {n}), tg::grad_into(f, g3));
    tg::set_num_threads(0);
    CHECK(std::memcmp(&v1, &v3, sizeof v1) == 0);
    CHECK(std::memcmp(g1.data(), g3.data(), n * sizeof(float)) == 0);
    return {v1, g1};
}
}  // namespace

TEST_CASE("sum, mean, max, min match finite differences", "[ops][gradient][reduce]") {
    for (std::size_t n : {1u, 8u, 31u}) {
        auto a = uniform(n, -2.0, 2.0, n);
        check_gradient(tg::mean(tg::exp(x)), at(x, a, {n}));
        check_gradient(tg::max(tg::sin(x)) * tg::lit<3>, at(x, a, {n}));
        check_gradient(tg::min(x * x), at(x, a, {n}));
        check_gradient(tg::sum(x) * tg::mean(x), at(x, a, {n}));
    }
    auto mv = uniform(15, -1.0, 1.0, 3);
    check_gradient(tg::mean(tg::square(m)) + tg::max(m), at(m, mv));
}

TEST_CASE("log_sum_exp matches finite differences and stays finite", "[ops][gradient][reduce]") {
    for (std::size_t n : {1u, 4u, 19u}) {
        check_gradient(tg::log_sum_exp(x), at(x, uniform(n, -3.0, 3.0, n), {n}));
        check_gradient(tg::log_sum_exp(tg::square(x)) * tg::sum(x), at(x, uniform(n, -1.0, 1.0, n), {n}));
    }
    constexpr auto f = tg::param<"f", float, tg::shape<tg::dyn>>;
    std::vector<float> big{1000.f, 1000.f, 990.f}, g(3);
    const float l = tg::compile(tg::log_sum_exp(f), tg::wrt(f)).value_and_grad(tg::bind(f, big), tg::grad_into(f, g));
    const double s = 2 + std::exp(-10.0);
    REQUIRE_THAT(l, Catch::Matchers::WithinRel(1000 + std::log(s), 1e-6));
    CHECK_THAT(g[0], Catch::Matchers::WithinRel(1 / s, 1e-5));
    CHECK_THAT(g[2], Catch::Matchers::WithinRel(std::exp(-10.0) / s, 1e-4));
    // all -inf: the stabilising shift is 0, the result -inf (as torch.logsumexp)
    std::vector<float> ninf(3, -std::numeric_limits<float>::infinity());
    const float l2 = tg::compile(tg::log_sum_exp(f), tg::wrt(f)).value_and_grad(tg::bind(f, ninf));
    CHECK(l2 == -std::numeric_limits<float>::infinity());
}

TEST_CASE("max shares its gradient among ties", "[ops][reduce]") {
    constexpr auto v = tg::param<"v", double, tg::shape<4>>;
    std::vector<double> d{3, 1, 3, 2}, g(4);
    const double l = tg::compile(tg::max(v), tg::wrt(v)).value_and_grad(tg::bind(v, d), tg::grad_into(v, g));
    CHECK(l == 3);
    CHECK(g == std::vector<double>{0.5, 0, 0.5, 0});
    tg::compile(tg::min(v), tg::wrt(v)).value_and_grad(tg::bind(v, d), tg::grad_into(v, g));
    CHECK(g == std::vector<double>{0, 1, 0, 0});
}

TEST_CASE("mean over a dynamic size divides by the run-time count", "[ops][reduce]") {
    constexpr auto f = tg::param<"f", float, tg::shape<tg::dyn, 3>>;
    auto step = tg::compile(tg::mean(f), tg::wrt(f));
    for (std::size_t rows : {1u, 2u, 5u}) {
        std::vector<float> d(rows * 3, 2.0f), g(rows * 3);
        CHECK(step.value_and_grad(tg::bind(f, d, {rows, 3}), tg::grad_into(f, g)) == 2.0f);
        for (float gi : g) CHECK_THAT(gi, Catch::Matchers::WithinRel(1.0f / float(rows * 3), 1e-6f));
    }
}

TEST_CASE("a maximum recomputed in another loop finds its element again", "[ops][reduce][regression]") {
    // exp(a) is evaluated in two loops that split rows differently between SIMD body and tail;
    // the gradient of max(exp(a)) needs bit-identical values in both (differential test graph 1000).
    constexpr auto a = tg::param<"a", double, tg::shape<tg::dyn, tg::dyn>>;
    constexpr auto b = tg::input<"b", double, tg::shape<1, tg::dyn>>;
    auto e = tg::exp(a);
    auto step = tg::compile(tg::max(e) + tg::sum(e * b), tg::wrt(a));
    for (std::size_t cols : {3u, 9u, 17u}) {
        const std::size_t rows = 5;
        auto av = uniform(rows * cols, -2.0, 2.0, cols), bv = uniform(cols, -2.0, 2.0, cols + 1);
        std::vector<double> g(rows * cols);
        step.value_and_grad(tg::bind(a, av, {rows, cols}), tg::bind(b, bv, {1, cols}), tg::grad_into(a, g));
        const std::size_t arg = std::size_t(std::max_element(av.begin(), av.end()) - av.begin());
        for (std::size_t i = 0; i < rows * cols; ++i) {
            const double expect = std::exp(av[i]) * bv[i % cols] + (i == arg ? std::exp(av[i]) : 0.0);
            CHECK_THAT(g[i], Catch::Matchers::WithinRel(expect, 1e-12));
        }
    }
}

TEST_CASE("prod matches finite differences, over all elements and along axes", "[ops][gradient][reduce]") {
    for (std::size_t n : {1u, 8u, 31u}) {
        // both signs, no zero: the out / x branch
        auto a = uniform(n, 0.5, 1.5, n);
        for (std::size_t i = 0; i < n; i += 3) a[i] = -a[i];
        check_gradient(tg::prod(x), at(x, a, {n}));
        check_gradient(tg::prod(tg::sin(x)) * tg::sum(x), at(x, a, {n}));
    }
    constexpr auto t = tg::param<"t", double, tg::shape<3, 4, 2>>;
    auto tv = uniform(24, -1.5, 1.5, 5);
    check_gradient(tg::sum(tg::square(tg::prod(t, tg::axes<1>))), at(t, tv));
    check_gradient(tg::sum(tg::exp(tg::prod(t, tg::axes<0, 2>))), at(t, tv));
    check_gradient(tg::sum(t * tg::prod(t, tg::axes<-1>, tg::keepdim)), at(t, tv));
    // second order without a zero: the gradient out / x
    check_gradient(tg::sum(tg::square(tg::grad(tg::prod(m), m))), at(m, uniform(15, 0.5, 1.5, 6)));
}

TEST_CASE("prod's gradient with zeros is torch.prod's", "[ops][reduce]") {
    constexpr auto v = tg::param<"v", double, tg::shape<4>>;
    auto step = tg::compile(tg::prod(v), tg::wrt(v));
    std::vector<double> g(4);
    auto run = [&](std::vector<double> d) { return step.value_and_grad(tg::bind(v, d), tg::grad_into(v, g)); };
    CHECK(run({2, -3, 4, 0.5}) == -12);
    CHECK(g == std::vector<double>{-6, 4, -3, -24});
    // one zero: the product of the others there, 0 elsewhere
    CHECK(run({2, 0, 4, -0.5}) == 0);
    CHECK(g == std::vector<double>{0, -4, 0, 0});
    CHECK(run({-0.0, 3, 2, 1}) == 0);
    CHECK(g == std::vector<double>{6, 0, 0, 0});
    // two zeros: every element's "others" hold a zero
    CHECK(run({0, 3, 0, 5}) == 0);
    CHECK(g == std::vector<double>{0, 0, 0, 0});
    // an infinity without a zero: out / x, NaN at the infinity itself (result / input, as PyTorch)
    CHECK(run({2, INFINITY, 4, 1}) == INFINITY);
    CHECK(std::isnan(g[1]));
    CHECK(g[0] == INFINITY);
    CHECK(g[3] == INFINITY);

    // along an axis, each row by its own zero count
    constexpr auto r = tg::param<"r", float, tg::shape<tg::dyn, 3>>;
    auto rows = tg::compile(tg::sum(tg::prod(r, tg::axes<1>)), tg::wrt(r));
    std::vector<float> d{1, 2, 3, 0, 5, 6, 0, 0, 7, -1, 2, -2}, gr(12);
    CHECK(rows.value_and_grad(tg::bind(r, d, {4, 3}), tg::grad_into(r, gr)) == 6 + 0 + 0 + 4);
    CHECK(gr == std::vector<float>{6, 3, 2, 30, 0, 0, 0, 0, 0, -4, 2, -2});

    // an infinite g: g * 0 at the others of a slice's only zero (NaN, as PyTorch), exactly 0 with
    // two zeros (PyTorch's zeros_like)
    constexpr auto w = tg::input<"w", float, tg::shape<tg::dyn>>;
    auto weighted = tg::compile(tg::sum(tg::prod(r, tg::axes<1>) * w), tg::wrt(r));
    std::vector<float> d2{0, 2, 3, 0, 0, 7}, g2(6), inf2(2, INFINITY);
    weighted.value_and_grad(tg::bind(r, d2, {2, 3}), tg::bind(w, inf2, {2}), tg::grad_into(r, g2));
    CHECK(g2[0] == INFINITY);
    CHECK(std::isnan(g2[1]));
    CHECK(std::isnan(g2[2]));
    CHECK(g2[3] == 0);
    CHECK(g2[4] == 0);
    CHECK(g2[5] == 0);

    // a 0-d tensor passes the gradient through, even at infinity
    constexpr auto s = tg::param<"s", double, tg::scalar_shape>;
    std::vector<double> sv{INFINITY}, gs(1);
    CHECK(tg::compile(tg::prod(s), tg::wrt(s)).value_and_grad(tg::bind(s, sv), tg::grad_into(s, gs)) == INFINITY);
    CHECK(gs[0] == 1);
}

namespace {
// torch.prod's gradient of sum(prod(slices) * w) over slices given as lists of element indices
// of x, in double: out / x without a zero; the others' product at a slice's only zero and 0
// elsewhere; 0 everywhere with two zeros.
std::vector<double> prod_grad_reference(const std::vector<double>& x, const std::vector<std::vector<std::size_t>>& slices,
                                        const std::vector<double>& w) {
    std::vector<double> g(x.size(), -1.0);
    for (std::size_t s = 0; s < slices.size(); ++s) {
        std::size_t zeros = 0;
        for (std::size_t i : slices[s]) zeros += x[i] == 0;
        for (std::size_t i : slices[s]) {
            double others = 1;
            for (std::size_t j : slices[s])
                if (j != i) others *= x[j];
            g[i] = zeros >= 2 ? 0.0 : w[s] * others;
        }
    }
    return g;
}
}  // namespace

TEST_CASE("prod's zero statistics per slice: along axes, through a view, under underflow and NaN", "[ops][reduce]") {
    // [3, 4, 5]: the slices of axis 1 (15 of 4 elements) hold no zero, one or two; those of
    // axes 0 and 2 (4 of 15) likewise
    constexpr auto t = tg::param<"t", double, tg::shape<3, 4, 5>>;
    std::vector<double> tv = uniform(60, 0.6, 1.4, 21);
    for (std::size_t i = 0; i < 60; i += 7) tv[i] = -tv[i];
    for (std::size_t i : {5u, 12u, 17u, 26u, 33u, 46u}) tv[i] = 0.0;
    tv[26] = -0.0;
    const std::size_t along1 = 15, along02 = 4;
    std::vector<std::vector<std::size_t>> s1(along1), s02(along02);
    for (std::size_t a = 0; a < 3; ++a)
        for (std::size_t b = 0; b < 4; ++b)
            for (std::size_t c = 0; c < 5; ++c) {
                s1[a * 5 + c].push_back(a * 20 + b * 5 + c);
                s02[b].push_back(a * 20 + b * 5 + c);
            }
    std::size_t one_zero = 0, two_zeros = 0;
    for (const auto& sl : s1) {
        const auto z = std::count_if(sl.begin(), sl.end(), [&](std::size_t i) { return tv[i] == 0; });
        one_zero += z == 1, two_zeros += z >= 2;
    }
    REQUIRE(one_zero >= 3);  // the data exercise every branch
    REQUIRE(two_zeros >= 1);
    std::vector<double> w1 = uniform(along1, -2, 2, 22), w02 = uniform(along02, -2, 2, 23), g(60);
    constexpr auto w15 = tg::input<"w15", double, tg::shape<3, 5>>;
    constexpr auto w4 = tg::input<"w4", double, tg::shape<1, 4, 1>>;
    auto check = [&](const std::vector<double>& expect) {
        for (std::size_t i = 0; i < 60; ++i) {
            INFO("element " << i);
            if (expect[i] == 0) CHECK(g[i] == 0);
            else CHECK_THAT(g[i], Catch::Matchers::WithinRel(expect[i], 1e-12));
        }
    };
    tg::compile(tg::sum(tg::prod(t, tg::axes<1>) * w15), tg::wrt(t))
        .value_and_grad(tg::bind(t, tv), tg::bind(w15, w1), tg::grad_into(t, g));
    check(prod_grad_reference(tv, s1, w1));
    tg::compile(tg::sum(tg::prod(t, tg::axes<0, 2>, tg::keepdim) * w4), tg::wrt(t))
        .value_and_grad(tg::bind(t, tv), tg::bind(w4, w02), tg::grad_into(t, g));
    check(prod_grad_reference(tv, s02, w02));
    // through a transposed view ([5, 4, 3] read with strides 1, 5, 20): the same slices
    constexpr auto u = tg::param<"u", double, tg::shape<5, 4, 3>>;
    std::vector<double> uv(60), gu(60);
    for (std::size_t a = 0; a < 3; ++a)
        for (std::size_t b = 0; b < 4; ++b)
            for (std::size_t c = 0; c < 5; ++c) uv[c * 12 + b * 3 + a] = tv[a * 20 + b * 5 + c];
    tg::compile(tg::sum(tg::prod(tg::permute<2, 1, 0>(u), tg::axes<1>) * w15), tg::wrt(u))
        .value_and_grad(tg::bind(u, uv), tg::bind(w15, w1), tg::grad_into(u, gu));
    for (std::size_t a = 0; a < 3; ++a)
        for (std::size_t b = 0; b < 4; ++b)
            for (std::size_t c = 0; c < 5; ++c) g[a * 20 + b * 5 + c] = gu[c * 12 + b * 3 + a];
    check(prod_grad_reference(tv, s1, w1));

    // A product that underflows to 0 without a zero factor, and a NaN factor: the slice is read,
    // no zero found, and the gradient is out / x (0 and NaN), as torch.prod's.
    constexpr auto r = tg::param<"r", float, tg::shape<tg::dyn, 3>>;
    auto rows = tg::compile(tg::sum(tg::prod(r, tg::axes<1>)), tg::wrt(r));
    std::vector<float> d{1e-30f, 1e-30f, 2, NAN, 2, 3, 4, 0, NAN}, gr(9);
    rows.value_and_grad(tg::bind(r, d, {3, 3}), tg::grad_into(r, gr));
    CHECK(gr[0] == 0);
    CHECK(gr[1] == 0);
    CHECK(gr[2] == 0);
    CHECK(std::isnan(gr[3]));
    CHECK(std::isnan(gr[4]));
    CHECK(std::isnan(gr[5]));
    // one zero beside a NaN: the product of the others (NaN) at the zero, g * 0 at the others
    CHECK(gr[6] == 0);
    CHECK(std::isnan(gr[7]));
    CHECK(gr[8] == 0);

    // second order at a slice's only zero: the gradient there is the product of the others, whose
    // own gradient is that product over each other factor, finite (a division that zeros do not
    // reach had made it NaN). The others' gradient there is g * 0, a constant, which lacks its
    // derivative with respect to the zero (as before this change); the square multiplies that
    // term by the others' gradient, 0, so the check below is exact without it.
    auto mv = uniform(15, 0.5, 1.5, 6);
    mv[4] = 0.0;
    check_gradient(tg::sum(tg::square(tg::grad(tg::prod(m), m))), at(m, mv));
    check_gradient(tg::sum(tg::square(tg::grad(tg::sum(tg::prod(m, tg::axes<1>)), m))), at(m, mv));
}

TEST_CASE("a long prod is one pass, the same bits on any thread count", "[ops][reduce][threads]") {
    // 300007 factors near 1 (the fused loop splits into blocks above 2^16 element-operations):
    // the value against a double product, the gradient against value / x
    constexpr auto f = tg::param<"f", float, tg::shape<tg::dyn>>;
    const std::size_t n = 300007;
    std::vector<float> d(n);
    auto u = uniform(n, 0.9995, 1.0005, 11);
    double exact = 1;
    for (std::size_t i = 0; i < n; ++i) {
        d[i] = float(i % 7 == 0 ? -u[i] : u[i]);
        exact *= double(d[i]);
    }
    const auto [p1, g1] = same_bits_on_1_and_3_threads(tg::compile(tg::prod(f), tg::wrt(f)), f, d);
    // 300007 float roundings: the kernel's order (blocks of 8192, four chains of 16 lanes) is off
    // by 2.9e-4 here, a float loop of the same order too (the bound is n u = 0.018)
    CHECK_THAT(double(p1), Catch::Matchers::WithinRel(exact, 1e-3));
    for (std::size_t i = 0; i < n; i += 9973) CHECK_THAT(g1[i], Catch::Matchers::WithinRel(p1 / d[i], 1e-6f));
}

namespace {
// Each kind of reduction over a vector of length n and along the rows of a 3 x n matrix, against
// double references: sums and products within rounding, max and min exact. Lengths around one
// and four SIMD batches (float and double) and past them, with a scalar tail: a kernel that
// splits a row's accumulation over several registers (benchmarks/README.md, "Four
// accumulators") must pass these unchanged.
template <class T>
void check_reductions(std::size_t n) {
    constexpr auto v = tg::param<"v", T, tg::shape<tg::dyn>>;
    constexpr auto w = tg::param<"w", T, tg::shape<3, tg::dyn>>;
    std::vector<T> d(3 * n);
    const auto u = uniform(3 * n, 0.5, 1.5, unsigned(n) + 7);
    for (std::size_t i = 0; i < 3 * n; ++i) d[i] = T(i % 3 == 0 ? -u[i] : u[i]);
    const std::vector<T> head(d.begin(), d.begin() + std::ptrdiff_t(n));
    const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-13;
    // row r's references (r = 0: the head's)
    struct references {
        double sum_sq, max, min_neg, prod;
    };
    auto reference = [&](std::size_t r) {
        const double first = double(d[r * n]);
        references ref{0.0, first, -first, 1.0};
        for (std::size_t i = r * n; i < (r + 1) * n; ++i) {
            const double e = double(d[i]);
            ref.sum_sq += e * e, ref.max = std::max(ref.max, e), ref.min_neg = std::min(ref.min_neg, -e), ref.prod *= e;
        }
        return ref;
    };
    INFO("n = " << n << (std::is_same_v<T, float> ? ", float" : ", double"));
    const auto sum_sq = tg::compile(tg::sum(v * v), tg::wrt());
    const auto max = tg::compile(tg::max(v), tg::wrt());
    const auto min_neg = tg::compile(tg::min(-v), tg::wrt());
    const auto prod = tg::compile(tg::prod(v), tg::wrt());
    const auto vb = tg::bind(v, head, {n});
    const auto wb = tg::bind(w, d, {3, n});
    auto close = [&](double got, double want) { CHECK_THAT(got, Catch::Matchers::WithinRel(want, tol)); };
    const references head_ref = reference(0);
    close(values_of(sum_sq, vb)[0], head_ref.sum_sq);
    CHECK(values_of(max, vb)[0] == head_ref.max);
    CHECK(values_of(min_neg, vb)[0] == head_ref.min_neg);
    close(values_of(prod, vb)[0], head_ref.prod);
    const auto rows_sum = values_of(tg::compile(tg::sum(w * w, tg::axes<1>), tg::wrt()), wb);
    const auto rows_max = values_of(tg::compile(tg::max(w, tg::axes<1>), tg::wrt()), wb);
    const auto rows_min = values_of(tg::compile(tg::min(-w, tg::axes<1>), tg::wrt()), wb);
    const auto rows_prod = values_of(tg::compile(tg::prod(w, tg::axes<1>), tg::wrt()), wb);
    for (std::size_t r = 0; r < 3; ++r) {
        const references ref = reference(r);
        close(rows_sum[r], ref.sum_sq);
        CHECK(rows_max[r] == ref.max);
        CHECK(rows_min[r] == ref.min_neg);
        close(rows_prod[r], ref.prod);
    }
    // a NaN anywhere, in the vector body or the tail, reaches the result of every kind
    for (std::size_t at_ : {std::size_t(0), n / 2, n - 1}) {
        std::vector<T> nan_head = head;
        nan_head[at_] = std::numeric_limits<T>::quiet_NaN();
        const auto nb = tg::bind(v, nan_head, {n});
        CHECK(std::isnan(values_of(sum_sq, nb)[0]));
        CHECK(std::isnan(values_of(max, nb)[0]));
        CHECK(std::isnan(values_of(min_neg, nb)[0]));
        CHECK(std::isnan(values_of(prod, nb)[0]));
    }
}
}  // namespace

TEST_CASE("every reduction kind at every length around the SIMD batches", "[ops][reduce]") {
    for (std::size_t n : {1u, 15u, 16u, 17u, 31u, 32u, 33u, 63u, 64u, 65u, 79u, 127u, 128u, 129u, 200u, 1000u}) {
        check_reductions<float>(n);
        check_reductions<double>(n);
    }
}

TEST_CASE("a long sum of squares and max gives the same bits on any thread count", "[ops][reduce][threads]") {
    // 300007 elements: the loop splits into blocks, each accumulating on its own
    constexpr auto f = tg::param<"f", float, tg::shape<tg::dyn>>;
    const std::size_t n = 300007;
    const auto u = uniform(n, -1.0, 1.0, 5);
    std::vector<float> d(u.begin(), u.end());
    double exact = 0, hi = -INFINITY;
    for (float e : d) exact += double(e) * double(e), hi = std::max(hi, double(e));
    const float v1 = same_bits_on_1_and_3_threads(tg::compile(tg::sum(f * f) + tg::max(f), tg::wrt(f)), f, d).first;
    CHECK_THAT(double(v1), Catch::Matchers::WithinRel(exact + hi, 1e-5));
}

TEST_CASE("a reduction gets the same bits from forward() and value_and_grad()", "[ops][reduce][plan]") {
    // value_and_grad's first loop also computes the gradient (two more divisions), the forward
    // plan's loop only the loss: the order in which the reduction adds must not depend on what
    // else its loop computes (a kernel choosing its accumulation by the body's cost broke this)
    constexpr auto a = tg::param<"a", float, tg::shape<tg::dyn>>;
    constexpr auto b = tg::input<"b", float, tg::shape<tg::dyn>>;
    constexpr auto rows = tg::param<"r", float, tg::shape<3, tg::dyn>>;
    auto step = tg::compile(tg::sum(a / b / b), tg::wrt(a));
    auto row_step = tg::compile(tg::sum(tg::sum(rows / tg::lit<3> / tg::lit<7>, tg::axes<1>)), tg::wrt(rows));
    for (std::size_t n : {std::size_t(100), std::size_t(1027), std::size_t(300007)}) {
        const auto u = uniform(3 * n, 0.5, 2.0, unsigned(n));
        std::vector<float> x(u.begin(), u.begin() + std::ptrdiff_t(n)), y(u.begin() + std::ptrdiff_t(n), u.begin() + std::ptrdiff_t(2 * n));
        std::vector<float> m(u.begin(), u.end()), g(n), gm(3 * n);
        INFO("n = " << n);
        const float v1 = step.value_and_grad(tg::bind(a, x, {n}), tg::bind(b, y, {n}), tg::grad_into(a, g));
        const float v2 = step.forward(tg::bind(a, x, {n}), tg::bind(b, y, {n})).value();
        CHECK(std::memcmp(&v1, &v2, sizeof v1) == 0);
        const float r1 = row_step.value_and_grad(tg::bind(rows, m, {3, n}), tg::grad_into(rows, gm));
        const float r2 = row_step.forward(tg::bind(rows, m, {3, n})).value();
        CHECK(std::memcmp(&r1, &r2, sizeof r1) == 0);
    }
}

TEST_CASE("a count of a mask is exact, in four chains, and has the same bits in every plan", "[ops][reduce][plan]") {
    // A sum of a comparison (a user's count) keeps four accumulator chains like every row
    // reduction, and its value is an integer: exact. Fused with a product and a plain sum, in
    // value_and_grad (which also reads prod's zero statistics) and forward, on 1 and 3 threads,
    // and along rows.
    constexpr auto a = tg::param<"a", float, tg::shape<tg::dyn>>;
    constexpr auto rows = tg::param<"r", float, tg::shape<3, tg::dyn>>;
    auto step = tg::compile(tg::sum(tg::gt(a, tg::lit<1>)) + tg::prod(a) + tg::sum(a * a), tg::wrt(a));
    auto count = tg::compile(tg::sum(tg::gt(a, tg::lit<1>)), tg::wrt());
    auto row_counts = tg::compile(tg::sum(tg::eq(rows, tg::lit<0>), tg::axes<1>), tg::wrt());
    for (std::size_t n : {std::size_t(5), std::size_t(67), std::size_t(1027), std::size_t(300007)}) {
        const auto u = uniform(3 * n, 0.999, 1.001, unsigned(n + 11));
        std::vector<float> x(u.begin(), u.begin() + std::ptrdiff_t(n)), m(3 * n), g1(n), g3(n);
        std::size_t above = 0;
        for (std::size_t i = 0; i < n; ++i) above += x[i] > 1.0f;
        std::size_t zeros[3] = {0, 0, 0};
        for (std::size_t i = 0; i < 3 * n; ++i) {
            m[i] = (i * 7919) % 5 == 0 ? 0.0f : float(u[i]);
            zeros[i / n] += m[i] == 0.0f;
        }
        INFO("n = " << n << ", " << above << " above 1");
        CHECK(values_of(count, tg::bind(a, x, {n}))[0] == float(above));
        const auto counted = values_of(row_counts, tg::bind(rows, m, {3, n}));
        for (std::size_t r = 0; r < 3; ++r) CHECK(counted[r] == float(zeros[r]));
        tg::set_num_threads(1);
        const float v1 = step.value_and_grad(tg::bind(a, x, {n}), tg::grad_into(a, g1));
        const float v2 = step.forward(tg::bind(a, x, {n})).value();
        tg::set_num_threads(3);
        const float v3 = step.value_and_grad(tg::bind(a, x, {n}), tg::grad_into(a, g3));
        tg::set_num_threads(0);
        CHECK(std::memcmp(&v1, &v2, sizeof v1) == 0);
        CHECK(std::memcmp(&v1, &v3, sizeof v1) == 0);
        CHECK(std::memcmp(g1.data(), g3.data(), n * sizeof(float)) == 0);
        long double p = 1, sq = 0;
        for (std::size_t i = 0; i < n; ++i) p *= x[i], sq += (long double)x[i] * x[i];
        CHECK_THAT(double(v1), Catch::Matchers::WithinRel(double(above + p + sq), 1e-3));
    }
}

TEST_CASE("products and maxima in four chains get the same bits from forward() and value_and_grad()", "[ops][reduce][plan]") {
    // A row's max, min, prod and sum keep four accumulator chains: value_and_grad's loops also
    // compute the gradient, the forward plan's only the loss, and the chains must be the same in
    // both; on 1 and 3 threads too.
    constexpr auto a = tg::param<"a", float, tg::shape<tg::dyn>>;
    constexpr auto b = tg::input<"b", float, tg::shape<tg::dyn>>;
    constexpr auto rows = tg::param<"r", float, tg::shape<3, tg::dyn>>;
    auto step = tg::compile(tg::prod(a / b) + tg::max(a * b) * tg::min(a - b) + tg::sum(a * a), tg::wrt(a));
    auto prod_step = tg::compile(tg::prod(a * b), tg::wrt(a));
    auto row_step = tg::compile(tg::sum(tg::prod(rows / tg::lit<3>, tg::axes<1>) + tg::max(rows, tg::axes<1>)), tg::wrt(rows));
    for (std::size_t n : {std::size_t(5), std::size_t(100), std::size_t(1027), std::size_t(300007)}) {
        const auto u = uniform(3 * n, 0.999, 1.001, unsigned(n + 3));
        std::vector<float> x(u.begin(), u.begin() + std::ptrdiff_t(n)), y(u.begin() + std::ptrdiff_t(n), u.begin() + std::ptrdiff_t(2 * n));
        std::vector<float> m(3 * n), g1(n), g3(n), gm(3 * n);
        for (std::size_t i = 0; i < 3 * n; ++i) m[i] = float(3 * u[i]);
        INFO("n = " << n);
        tg::set_num_threads(1);
        const float v1 = step.value_and_grad(tg::bind(a, x, {n}), tg::bind(b, y, {n}), tg::grad_into(a, g1));
        const float v2 = step.forward(tg::bind(a, x, {n}), tg::bind(b, y, {n})).value();
        const float r1 = row_step.value_and_grad(tg::bind(rows, m, {3, n}), tg::grad_into(rows, gm));
        const float r2 = row_step.forward(tg::bind(rows, m, {3, n})).value();
        tg::set_num_threads(3);
        const float v3 = step.value_and_grad(tg::bind(a, x, {n}), tg::bind(b, y, {n}), tg::grad_into(a, g3));
        const float r3 = row_step.forward(tg::bind(rows, m, {3, n})).value();
        tg::set_num_threads(0);
        std::vector<float> gp(n);
        const float p1 = prod_step.value_and_grad(tg::bind(a, x, {n}), tg::bind(b, y, {n}), tg::grad_into(a, gp));
        const float p2 = prod_step.forward(tg::bind(a, x, {n}), tg::bind(b, y, {n})).value();
        CHECK(std::memcmp(&p1, &p2, sizeof p1) == 0);
        CHECK(std::memcmp(&v1, &v2, sizeof v1) == 0);
        CHECK(std::memcmp(&v1, &v3, sizeof v1) == 0);
        CHECK(std::memcmp(g1.data(), g3.data(), n * sizeof(float)) == 0);
        CHECK(std::memcmp(&r1, &r2, sizeof r1) == 0);
        CHECK(std::memcmp(&r1, &r3, sizeof r1) == 0);
        // and the values themselves, against double
        long double p = 1, hi = -INFINITY, lo = INFINITY, sq = 0, rp = 0;
        for (std::size_t i = 0; i < n; ++i) {
            p *= (long double)x[i] / y[i];
            hi = std::max(hi, (long double)x[i] * y[i]);
            lo = std::min(lo, (long double)x[i] - y[i]);
            sq += (long double)x[i] * x[i];
        }
        for (std::size_t r = 0; r < 3; ++r) {
            long double q = 1, mx = -INFINITY;
            for (std::size_t i = 0; i < n; ++i) q *= (long double)m[r * n + i] / 3, mx = std::max(mx, (long double)m[r * n + i]);
            rp += q + mx;
        }
        CHECK_THAT(double(v1), Catch::Matchers::WithinRel(double(p + hi * lo + sq), 1e-3));
        CHECK_THAT(double(r1), Catch::Matchers::WithinRel(double(rp), 1e-3));
    }
}

TEST_CASE("axis reductions with and without keepdim", "[ops][reduce][gradient]") {
    constexpr auto m = tg::param<"m", double, tg::shape<tg::dyn, 3>>;
    constexpr auto t = tg::param<"t", double, tg::shape<2, 3, 4>>;
    auto tv = uniform(24, -1.0, 1.0, 21);
    check_gradient(tg::sum(tg::square(tg::sum(t, tg::axes<1>))), at(t, tv));
    check_gradient(tg::sum(tg::exp(tg::mean(t, tg::axes<0, 2>))), at(t, tv));
    check_gradient(tg::sum(t * tg::mean(t, tg::axes<-1>, tg::keepdim)), at(t, tv));
    check_gradient(tg::sum(tg::max(t, tg::axes<2>) * tg::min(t, tg::axes<2>)), at(t, tv));
    check_gradient(tg::sum(t / tg::max(tg::abs(t), tg::axes<0, 1>, tg::keepdim)), at(t, tv));
    STATIC_REQUIRE(std::is_same_v<decltype(tg::sum(t, tg::axes<1>))::shape_type, tg::shape<2, 4>>);
    STATIC_REQUIRE(std::is_same_v<decltype(tg::sum(t, tg::axes<1>, tg::keepdim))::shape_type, tg::shape<2, 1, 4>>);
    STATIC_REQUIRE(std::is_same_v<decltype(tg::mean(m, tg::axes<0>))::shape_type, tg::shape<3>>);
    for (std::size_t rows : {1u, 3u}) {
        auto mv = uniform(rows * 3, -2.0, 2.0, 7 + rows);
        check_gradient(tg::sum(tg::square(tg::mean(m, tg::axes<0>))), at(m, mv, {rows, 3}));
        check_gradient(tg::sum(tg::sum(m, tg::axes<1>) * tg::sum(m, tg::axes<1>)), at(m, mv, {rows, 3}));
    }
}
