// Indexing (ops/index.hpp): embedding (padding_idx, repeated ids, ids of several ranks, id
// errors before any write), index_select, concat and stack: gradients against finite
// differences in double, values, dtypes, and second order through concat.
#include <check_gradient.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

namespace tg = typegrad;
using tg::testing::at;
using tg::testing::check_gradient;
using tg::testing::fixed;
using tg::testing::uniform;
using tg::testing::values_of;

TEST_CASE("embedding: values, gradient by finite differences, padding_idx", "[ops][index][gradient]") {
    constexpr auto table = tg::param<"table", double, tg::shape<tg::dyn, 3>>;
    constexpr auto ids1 = tg::input<"ids1", std::int64_t, tg::shape<tg::dyn>>;
    constexpr auto ids2 = tg::input<"ids2", std::int32_t, tg::shape<2, 3>>;
    constexpr auto q = tg::input<"q", double, tg::shape<2, 3, 3>>;
    auto tv = uniform(15, -1.0, 1.0, 1);
    // repeated ids accumulate; every id used at least once or not at all
    const std::vector<std::int64_t> i1{4, 0, 4, 2, 4};
    const std::vector<std::int32_t> i2{1, 1, 0, 3, 4, 1};
    auto qv = uniform(18, -1.0, 1.0, 2);
    check_gradient(tg::sum(tg::square(tg::embedding(ids1, table))), fixed(tg::bind(ids1, i1, {5})), at(table, tv, {5, 3}));
    check_gradient(tg::sum(tg::exp(tg::embedding(ids2, table)) * q), fixed(tg::bind(ids2, i2), tg::bind(q, qv)),
                   at(table, tv, {5, 3}));
    // a single id of shape [1, 1]
    constexpr auto one = tg::input<"one", std::int64_t, tg::shape<1, 1>>;
    const std::vector<std::int64_t> iv{3};
    check_gradient(tg::sum(tg::sin(tg::embedding(one, table))), fixed(tg::bind(one, iv)), at(table, tv, {5, 3}));

    // values and the padding row's gradient (PyTorch: padding_idx rows get no gradient)
    auto fwd = tg::compile(tg::embedding(ids2, table), tg::wrt(table)).forward(tg::bind(ids2, i2), tg::bind(table, tv, {5, 3}));
    REQUIRE(fwd.values().size() == 18);
    for (std::size_t e = 0; e < 6; ++e)
        for (std::size_t j = 0; j < 3; ++j) CHECK(fwd.values()[e * 3 + j] == tv[std::size_t(i2[e]) * 3 + j]);
    std::vector<double> g(15, -7), gneg(15, -7);
    tg::compile(tg::sum(tg::embedding<1>(ids2, table) * q), tg::wrt(table))
        .value_and_grad(tg::bind(ids2, i2), tg::bind(q, qv), tg::bind(table, tv, {5, 3}), tg::grad_into(table, g));
    tg::compile(tg::sum(tg::embedding<-4>(ids2, table) * q), tg::wrt(table))  // -4 of 5 rows is row 1
        .value_and_grad(tg::bind(ids2, i2), tg::bind(q, qv), tg::bind(table, tv, {5, 3}), tg::grad_into(table, gneg));
    for (std::size_t j = 0; j < 3; ++j) {
        CHECK(g[1 * 3 + j] == 0);                    // the padding row
        CHECK(g[0 * 3 + j] == qv[2 * 3 + j]);        // id 0 at position 2
        CHECK(g[3 * 3 + j] == qv[3 * 3 + j]);
        CHECK(g[2 * 3 + j] == 0);                    // id 2 is not used
    }
    CHECK(g == gneg);
}

TEST_CASE("embedding ids out of range throw before anything is written", "[ops][index]") {
    constexpr auto table = tg::param<"table", float, tg::shape<4, 2>>;
    constexpr auto ids = tg::input<"ids", std::int64_t, tg::shape<tg::dyn>>;
    auto step = tg::compile(tg::sum(tg::embedding(ids, table)), tg::wrt(table));
    const std::vector<float> tv(8, 1.0f);
    std::vector<float> g(8, 42.0f);
    for (std::vector<std::int64_t> bad : {std::vector<std::int64_t>{0, 4}, std::vector<std::int64_t>{-1, 2}}) {
        CHECK_THROWS_AS(step.value_and_grad(tg::bind(ids, bad), tg::bind(table, tv), tg::grad_into(table, g)),
                        tg::shape_error);
        CHECK(g == std::vector<float>(8, 42.0f));
    }
    const std::vector<std::int64_t> ok{3, 3, 0};
    CHECK(step.value_and_grad(tg::bind(ids, ok), tg::bind(table, tv), tg::grad_into(table, g)) == 6.0f);
    CHECK(g == std::vector<float>{1, 1, 0, 0, 0, 0, 2, 2});
    // a bf16 table: bf16 values, a bf16 gradient accumulated in f32
    constexpr auto tb = tg::param<"tb", tg::bf16, tg::shape<4, 2>>;
    STATIC_REQUIRE(std::is_same_v<decltype(tg::embedding(ids, tb))::value_type, tg::bf16>);
    const std::vector<tg::bf16> tbv(8, tg::bf16(0.5f));
    std::vector<tg::bf16> gb(8);
    const std::vector<std::int64_t> many(300, 2);  // 300 in bf16 accumulation would stall at 256
    tg::compile(tg::sum(tg::cast<float>(tg::embedding(ids, tb))), tg::wrt(tb))
        .value_and_grad(tg::bind(ids, many), tg::bind(tb, tbv), tg::grad_into(tb, gb));
    CHECK(float(gb[4]) == 300.0f);
    CHECK(float(gb[0]) == 0.0f);
}

TEST_CASE("embedding's backward on several threads: the bits of one thread, a double scatter-add", "[ops][index][threads]") {
    // Large enough to be split over the pool (core/cpu/thread_pool.hpp: from parallel_min_work = 2^16
    // operations): each table into ranges of rows, and with 18000 ids the pass over the ids (their
    // rows and g's offsets) into ranges of ids too. Ids of rank 2, each row used about 9 or 12
    // times, every 10th id the padding row; a bf16 table accumulates in f32.
    struct restore_threads {
        ~restore_threads() { tg::set_num_threads(0); }
    } restore;
    constexpr std::int64_t pad = 5;
    constexpr auto ids = tg::input<"ids", std::int32_t, tg::shape<tg::dyn, 3>>;
    constexpr auto r = tg::input<"r", float, tg::shape<tg::dyn, 3, tg::dyn>>;
    constexpr auto table = tg::param<"table", float, tg::shape<tg::dyn, tg::dyn>>;
    constexpr auto tb = tg::param<"tb", tg::bf16, tg::shape<tg::dyn, tg::dyn>>;
    auto step = tg::compile(tg::sum(tg::embedding<pad>(ids, table) * r), tg::wrt(table));
    auto step_b = tg::compile(tg::sum(tg::cast<float>(tg::embedding<pad>(ids, tb)) * r), tg::wrt(tb));
    struct size {
        std::size_t rows, dim, n;  // n rows of 3 ids
        bool bf16;
    };
    for (const size z : {size{300, 72, 1200, false}, size{2000, 8, 6000, false}, size{300, 40, 1200, true}}) {
        INFO("rows " << z.rows << ", dim " << z.dim << ", ids " << 3 * z.n << (z.bf16 ? ", bf16" : ", f32"));
        const std::size_t m = 3 * z.n;
        std::vector<std::int32_t> iv(m);
        for (std::size_t e = 0; e < m; ++e) iv[e] = e % 10 == 3 ? std::int32_t(pad) : std::int32_t((e * 7919 + e / 7) % z.rows);
        const auto rd = uniform(m * z.dim, -1.0, 1.0, 41);
        const std::vector<float> rv(rd.begin(), rd.end());
        const std::vector<float> tv(z.rows * z.dim, 0.5f);
        const std::vector<tg::bf16> tbv(tv.size(), tg::bf16(0.5f));
        // the gradient as doubles, on `threads` threads (a bf16 table's gradient holds bf16 values)
        auto grad = [&](std::size_t threads) {
            tg::set_num_threads(threads);
            std::vector<double> out(tv.size());
            if (z.bf16) {
                std::vector<tg::bf16> g(tv.size(), tg::bf16(-7.0f));
                step_b.value_and_grad(tg::bind(ids, iv, {z.n, 3}), tg::bind(tb, tbv, {z.rows, z.dim}),
                                      tg::bind(r, rv, {z.n, 3, z.dim}), tg::grad_into(tb, g));
                for (std::size_t i = 0; i < g.size(); ++i) out[i] = double(float(g[i]));
            } else {
                std::vector<float> g(tv.size(), -7.0f);
                step.value_and_grad(tg::bind(ids, iv, {z.n, 3}), tg::bind(table, tv, {z.rows, z.dim}),
                                    tg::bind(r, rv, {z.n, 3, z.dim}), tg::grad_into(table, g));
                for (std::size_t i = 0; i < g.size(); ++i) out[i] = double(g[i]);
            }
            return out;
        };
        const auto one = grad(1);
        for (std::size_t threads : {2u, 3u, 8u}) {
            INFO("threads " << threads);
            const auto many = grad(threads);
            REQUIRE(many.size() == one.size());
            for (std::size_t i = 0; i < one.size(); ++i) REQUIRE(many[i] == one[i]);  // (no NaNs: == is bitwise here)
        }
        // a plain scatter-add in double (of g's bf16 values for the bf16 table), within rounding
        std::vector<double> ref(tv.size(), 0.0), mag(tv.size(), 0.0);
        for (std::size_t e = 0; e < m; ++e) {
            if (iv[e] == pad) continue;
            for (std::size_t j = 0; j < z.dim; ++j) {
                const double t = z.bf16 ? double(float(tg::bf16(rv[e * z.dim + j]))) : double(rv[e * z.dim + j]);
                ref[std::size_t(iv[e]) * z.dim + j] += t;
                mag[std::size_t(iv[e]) * z.dim + j] += std::abs(t);
            }
        }
        for (std::size_t i = 0; i < ref.size(); ++i) {
            const double tol = 1e-6 * mag[i] + (z.bf16 ? 0x1p-8 * std::abs(ref[i]) : 0.0);
            REQUIRE(std::abs(one[i] - ref[i]) <= tol);
        }
        for (std::size_t j = 0; j < z.dim; ++j) REQUIRE(one[std::size_t(pad) * z.dim + j] == 0.0);  // the padding row
    }
}

TEST_CASE("embedding's lookup on several threads: each row the table's, on any thread count", "[ops][index][threads]") {
    struct restore_threads {
        ~restore_threads() { tg::set_num_threads(0); }
    } restore;
    constexpr auto ids = tg::input<"ids", std::int64_t, tg::shape<tg::dyn>>;
    constexpr auto table = tg::param<"table", float, tg::shape<tg::dyn, 24>>;
    constexpr auto tb = tg::param<"tb", tg::bf16, tg::shape<tg::dyn, 24>>;
    const std::size_t rows = 500, n = 9000;  // 9000 x 24 copies: split over the pool
    std::vector<std::int64_t> iv(n);
    for (std::size_t e = 0; e < n; ++e) iv[e] = std::int64_t((e * 7919 + 3) % rows);
    const auto td = uniform(rows * 24, -2.0, 2.0, 51);
    const std::vector<float> tv(td.begin(), td.end());
    const std::vector<tg::bf16> tbv(tv.begin(), tv.end());
    auto step = tg::compile(tg::embedding<7>(ids, table), tg::wrt(table));
    auto step_b = tg::compile(tg::cast<float>(tg::embedding(ids, tb)), tg::wrt(tb));
    for (std::size_t threads : {1u, 2u, 3u}) {
        INFO("threads " << threads);
        tg::set_num_threads(threads);
        auto f = step.forward(tg::bind(ids, iv), tg::bind(table, tv, {rows, 24}));
        auto fb = step_b.forward(tg::bind(ids, iv), tg::bind(tb, tbv, {rows, 24}));
        REQUIRE(f.values().size() == n * 24);
        REQUIRE(fb.values().size() == n * 24);
        for (std::size_t e = 0; e < n; ++e)
            for (std::size_t j = 0; j < 24; ++j) {
                REQUIRE(f.values()[e * 24 + j] == tv[std::size_t(iv[e]) * 24 + j]);  // the padding row too (forward)
                REQUIRE(fb.values()[e * 24 + j] == float(tbv[std::size_t(iv[e]) * 24 + j]));
            }
    }
}

TEST_CASE("index_select along an axis matches finite differences", "[ops][index][gradient]") {
    constexpr auto x = tg::param<"x", double, tg::shape<4, 3>>;
    constexpr auto ids = tg::input<"ids", std::int32_t, tg::shape<tg::dyn>>;
    auto xv = uniform(12, -1.0, 1.0, 3);
    for (const std::vector<std::int32_t>& iv : {std::vector<std::int32_t>{2}, std::vector<std::int32_t>{0, 2, 2, 1, 0}}) {
        const std::size_t n = iv.size();
        check_gradient(tg::sum(tg::square(tg::index_select<0>(x, ids)) * tg::lit<0.5> + tg::index_select<0>(x, ids)),
                       fixed(tg::bind(ids, iv, {n})), at(x, xv));
        if (std::all_of(iv.begin(), iv.end(), [](int i) { return i < 3; }))
            check_gradient(tg::sum(tg::exp(tg::index_select<-1>(x, ids))), fixed(tg::bind(ids, iv, {n})), at(x, xv));
    }
    const std::vector<std::int32_t> iv{2, 0};
    auto fwd = tg::compile(tg::index_select<1>(x, ids), tg::wrt(x)).forward(tg::bind(x, xv), tg::bind(ids, iv, {2}));
    STATIC_REQUIRE(std::is_same_v<decltype(tg::index_select<1>(x, ids))::shape_type, tg::shape<4, tg::dyn>>);
    for (std::size_t r = 0; r < 4; ++r) {
        CHECK(fwd.values()[r * 2] == xv[r * 3 + 2]);
        CHECK(fwd.values()[r * 2 + 1] == xv[r * 3 + 0]);
    }
    const std::vector<std::int32_t> bad{3};
    CHECK_THROWS_AS(tg::compile(tg::index_select<1>(x, ids), tg::wrt(x)).forward(tg::bind(x, xv), tg::bind(ids, bad, {1})),
                    tg::shape_error);
}

TEST_CASE("index_select's backward on several threads: the bits of one thread, a double scatter-add",
          "[ops][index][threads]") {
    struct restore_threads {
        ~restore_threads() { tg::set_num_threads(0); }
    } restore;
    // x [A, E, I] selected along axis 1 by 3000 ids (repeats; E = 50 rows), and along axis 0
    constexpr auto x = tg::param<"x", float, tg::shape<tg::dyn, tg::dyn, tg::dyn>>;
    constexpr auto xb = tg::param<"xb", tg::bf16, tg::shape<tg::dyn, tg::dyn, tg::dyn>>;
    constexpr auto ids = tg::input<"ids", std::int64_t, tg::shape<tg::dyn>>;
    constexpr auto q1 = tg::input<"q1", float, tg::shape<tg::dyn, tg::dyn, tg::dyn>>;
    const std::size_t A = 3, E = 50, I = 20, n = 3000;
    std::vector<std::int64_t> iv(n);
    for (std::size_t k = 0; k < n; ++k) iv[k] = std::int64_t((k * 7919 + k / 3) % E);
    const std::vector<float> xv(A * E * I, 0.25f);
    const std::vector<tg::bf16> xbv(xv.size(), tg::bf16(0.25f));
    const auto qd = uniform(A * n * I, -1.0, 1.0, 61);
    const std::vector<float> qv(qd.begin(), qd.end());
    auto step = tg::compile(tg::sum(tg::index_select<1>(x, ids) * q1), tg::wrt(x));
    auto step_b = tg::compile(tg::sum(tg::cast<float>(tg::index_select<1>(xb, ids)) * q1), tg::wrt(xb));
    auto grad = [&](std::size_t threads, bool bf16) {
        tg::set_num_threads(threads);
        std::vector<double> out(xv.size());
        if (bf16) {
            std::vector<tg::bf16> gb(xv.size(), tg::bf16(-7.0f));
            step_b.value_and_grad(tg::bind(xb, xbv, {A, E, I}), tg::bind(ids, iv), tg::bind(q1, qv, {A, n, I}),
                                  tg::grad_into(xb, gb));
            for (std::size_t i = 0; i < gb.size(); ++i) out[i] = double(float(gb[i]));
        } else {
            std::vector<float> g(xv.size(), -7.0f);
            step.value_and_grad(tg::bind(x, xv, {A, E, I}), tg::bind(ids, iv), tg::bind(q1, qv, {A, n, I}), tg::grad_into(x, g));
            for (std::size_t i = 0; i < g.size(); ++i) out[i] = double(g[i]);
        }
        return out;
    };
    for (const bool bf16 : {false, true}) {
        INFO((bf16 ? "bf16" : "f32"));
        const auto one = grad(1, bf16);
        for (std::size_t threads : {2u, 3u, 8u}) {
            INFO("threads " << threads);
            const auto many = grad(threads, bf16);
            for (std::size_t i = 0; i < one.size(); ++i) REQUIRE(many[i] == one[i]);
        }
        // a plain scatter-add in double (of q's bf16 roundings for the bf16 x), within rounding
        std::vector<double> ref(xv.size(), 0.0), mag(xv.size(), 0.0);
        for (std::size_t a = 0; a < A; ++a)
            for (std::size_t k = 0; k < n; ++k)
                for (std::size_t i = 0; i < I; ++i) {
                    const float qf = qv[(a * n + k) * I + i];
                    const double t = bf16 ? double(float(tg::bf16(qf))) : double(qf);
                    const std::size_t o = (a * E + std::size_t(iv[k])) * I + i;
                    ref[o] += t;
                    mag[o] += std::abs(t);
                }
        for (std::size_t i = 0; i < ref.size(); ++i)
            REQUIRE(std::abs(one[i] - ref[i]) <= 1e-6 * mag[i] + (bf16 ? 0x1p-8 * std::abs(ref[i]) : 0.0));
    }
}

TEST_CASE("concat and stack match finite differences and values", "[ops][index][gradient]") {
    constexpr auto a = tg::param<"a", double, tg::shape<2, 3>>;
    constexpr auto b = tg::param<"b", double, tg::shape<tg::dyn, 3>>;
    constexpr auto c = tg::param<"c", double, tg::shape<2, 1>>;
    auto av = uniform(6, -1.0, 1.0, 4);
    auto bv = uniform(9, -1.0, 1.0, 5);
    auto cv = uniform(2, -1.0, 1.0, 6);
    check_gradient(tg::sum(tg::square(tg::concat<0>(a, b)) * tg::lit<0.5> + tg::sin(tg::concat<0>(a, b))),
                   at(a, av), at(b, bv, {3, 3}));
    check_gradient(tg::sum(tg::exp(tg::concat<1>(a, c, a))), at(a, av), at(c, cv));
    check_gradient(tg::sum(tg::exp(tg::concat<-1>(c, tg::exp(a)))), at(a, av), at(c, cv));
    // seven operands: chained concat nodes of at most five
    check_gradient(tg::sum(tg::square(tg::concat<1>(a, c, a, c, tg::sin(a), c, a))), at(a, av), at(c, cv));
    check_gradient(tg::sum(tg::square(tg::stack<0>(a, tg::exp(a), a)) * tg::stack<0>(a, a, a)), at(a, av));
    check_gradient(tg::sum(tg::exp(tg::stack<2>(a, c * a))), at(a, av), at(c, cv));
    // second order through concat's gradient views
    check_gradient(tg::sum(tg::square(tg::grad(tg::sum(tg::square(tg::concat<1>(a, c))), a))), at(a, av), at(c, cv));

    auto fwd = tg::compile(tg::concat<0>(a, b), tg::wrt(a)).forward(tg::bind(a, av), tg::bind(b, bv, {3, 3}));
    STATIC_REQUIRE(std::is_same_v<decltype(tg::concat<0>(a, b))::shape_type, tg::shape<tg::dyn, 3>>);
    STATIC_REQUIRE(std::is_same_v<decltype(tg::concat<1>(a, c, a))::shape_type, tg::shape<2, 7>>);
    STATIC_REQUIRE(std::is_same_v<decltype(tg::stack<1>(a, a))::shape_type, tg::shape<2, 2, 3>>);
    for (std::size_t i = 0; i < 6; ++i) CHECK(fwd.values()[i] == av[i]);
    for (std::size_t i = 0; i < 9; ++i) CHECK(fwd.values()[6 + i] == bv[i]);
    // dynamic extents that disagree off the concatenated axis
    constexpr auto d = tg::param<"d", double, tg::shape<2, tg::dyn>>;
    const std::vector<double> dv(8, 1.0);
    CHECK_THROWS_AS(tg::compile(tg::concat<0>(a, d), tg::wrt(a)).forward(tg::bind(a, av), tg::bind(d, dv, {2, 4})),
                    tg::shape_error);
    // cat promotes to the widest input
    constexpr auto h = tg::param<"h", tg::bf16, tg::shape<2, 3>>;
    constexpr auto f = tg::param<"f", float, tg::shape<2, 3>>;
    STATIC_REQUIRE(std::is_same_v<decltype(tg::concat<0>(h, f))::value_type, float>);
    STATIC_REQUIRE(std::is_same_v<decltype(tg::stack<0>(h, h))::value_type, tg::bf16>);
}

TEST_CASE("gather's backward on several threads: the bits of one thread, a double scatter-add", "[ops][index][threads]") {
    struct restore_threads {
        ~restore_threads() { tg::set_num_threads(0); }
    } restore;
    // x [A, E, I]; index [A, n, J] (J < I: torch.gather's smaller index) along axis 1, and
    // index0 [m, E, J] along axis 0
    constexpr auto x = tg::param<"x", float, tg::shape<tg::dyn, tg::dyn, tg::dyn>>;
    constexpr auto index = tg::input<"index", std::int64_t, tg::shape<tg::dyn, tg::dyn, tg::dyn>>;
    constexpr auto index0 = tg::input<"index0", std::int32_t, tg::shape<tg::dyn, tg::dyn, tg::dyn>>;
    constexpr auto q = tg::input<"q", float, tg::shape<tg::dyn, tg::dyn, tg::dyn>>;
    constexpr auto q0 = tg::input<"q0", float, tg::shape<tg::dyn, tg::dyn, tg::dyn>>;
    const std::size_t A = 3, E = 50, I = 20, J = 17, n = 400, m = 300;
    std::vector<std::int64_t> iv(A * n * J);
    for (std::size_t k = 0; k < iv.size(); ++k) iv[k] = std::int64_t((k * 7919 + k / 5) % E);
    std::vector<std::int32_t> i0(m * E * J);
    for (std::size_t k = 0; k < i0.size(); ++k) i0[k] = std::int32_t((k * 104729 + 7) % A);
    const std::vector<float> xv(A * E * I, 0.5f);
    const auto qd = uniform(A * n * J, -1.0, 1.0, 71), q0d = uniform(m * E * J, -1.0, 1.0, 72);
    const std::vector<float> qv(qd.begin(), qd.end()), q0v(q0d.begin(), q0d.end());
    auto step = tg::compile(tg::sum(tg::gather<1>(x, index) * q) + tg::sum(tg::gather<0>(x, index0) * q0), tg::wrt(x));
    auto grad = [&](std::size_t threads) {
        tg::set_num_threads(threads);
        std::vector<float> g(xv.size(), -7.0f);
        step.value_and_grad(tg::bind(x, xv, {A, E, I}), tg::bind(index, iv, {A, n, J}), tg::bind(q, qv, {A, n, J}),
                            tg::bind(index0, i0, {m, E, J}), tg::bind(q0, q0v, {m, E, J}), tg::grad_into(x, g));
        return g;
    };
    const auto one = grad(1);
    for (std::size_t threads : {2u, 3u, 8u}) {
        INFO("threads " << threads);
        const auto many = grad(threads);
        for (std::size_t i = 0; i < one.size(); ++i) REQUIRE(many[i] == one[i]);
    }
    std::vector<double> ref(xv.size(), 0.0), mag(xv.size(), 0.0);
    auto add = [&](std::size_t o, double t) {
        ref[o] += t;
        mag[o] += std::abs(t);
    };
    for (std::size_t a = 0; a < A; ++a)
        for (std::size_t k = 0; k < n; ++k)
            for (std::size_t j = 0; j < J; ++j)
                add((a * E + std::size_t(iv[(a * n + k) * J + j])) * I + j, qv[(a * n + k) * J + j]);
    for (std::size_t k = 0; k < m; ++k)
        for (std::size_t e = 0; e < E; ++e)
            for (std::size_t j = 0; j < J; ++j)
                add((std::size_t(i0[(k * E + e) * J + j]) * E + e) * I + j, q0v[(k * E + e) * J + j]);
    for (std::size_t i = 0; i < ref.size(); ++i) REQUIRE(std::abs(double(one[i]) - ref[i]) <= 1e-6 * mag[i]);
    for (std::size_t e = 0; e < E; ++e) REQUIRE(one[e * I + J] == 0.0f);  // columns no index reaches
}

TEST_CASE("gather along an axis matches finite differences and torch.gather", "[ops][index][gradient]") {
    constexpr auto x = tg::param<"x", double, tg::shape<3, 4>>;
    constexpr auto i0 = tg::input<"i0", std::int64_t, tg::shape<2, 4>>;
    constexpr auto i1 = tg::input<"i1", std::int32_t, tg::shape<3, tg::dyn>>;
    auto xv = uniform(12, -1.0, 1.0, 11);
    const std::vector<std::int64_t> v0{2, 0, 1, 2, 0, 0, 2, 1};             // along axis 0 (repeats in a column)
    const std::vector<std::int32_t> v1{3, 3, 1, 0, 0, 2};                   // along axis 1, [3, 2]
    check_gradient(tg::sum(tg::square(tg::gather<0>(x, i0)) * tg::lit<0.5> + tg::gather<0>(x, i0)),
                   fixed(tg::bind(i0, v0)), at(x, xv));
    check_gradient(tg::sum(tg::exp(tg::gather<-1>(x, i1))), fixed(tg::bind(i1, v1, {3, 2})), at(x, xv));
    // second order: gather's gradient (a scatter-add) is differentiable again
    check_gradient(tg::sum(tg::square(tg::grad(tg::sum(tg::square(tg::gather<1>(x, i1))), x))),
                   fixed(tg::bind(i1, v1, {3, 2})), at(x, xv));
    // values: torch.gather(x, 1, index)[i][j] = x[i][index[i][j]]
    auto fwd = tg::compile(tg::gather<1>(x, i1), tg::wrt(x)).forward(tg::bind(x, xv), tg::bind(i1, v1, {3, 2}));
    for (std::size_t r = 0; r < 3; ++r)
        for (std::size_t j = 0; j < 2; ++j) CHECK(fwd.values()[r * 2 + j] == xv[r * 4 + std::size_t(v1[r * 2 + j])]);
    // an index out of range, or an index extent larger than x's off the axis: errors
    const std::vector<std::int32_t> bad{4, 0, 0, 0, 0, 0};
    CHECK_THROWS_AS(tg::compile(tg::gather<1>(x, i1), tg::wrt(x)).forward(tg::bind(x, xv), tg::bind(i1, bad, {3, 2})),
                    tg::shape_error);
    constexpr auto wide = tg::input<"wide", std::int32_t, tg::shape<tg::dyn, 5>>;
    const std::vector<std::int32_t> w(5, 0);
    CHECK_THROWS_AS(tg::compile(tg::gather<0>(x, wide), tg::wrt(x)).forward(tg::bind(x, xv), tg::bind(wide, w, {1, 5})),
                    tg::shape_error);
}

TEST_CASE("dynamic_slice: run-time start, values, gradients, range errors", "[ops][index][gradient]") {
    constexpr auto x = tg::param<"x", double, tg::shape<3, tg::dyn, 2>>;
    constexpr auto start = tg::input<"start", std::int64_t, tg::shape<1>>;
    const std::size_t len = 6;
    auto xv = uniform(3 * len * 2, -1.0, 1.0, 41);
    auto y = tg::dynamic_slice<1, 4>(x, start);
    STATIC_REQUIRE(std::is_same_v<decltype(y)::shape_type, tg::shape<3, 4, 2>>);
    auto step = tg::compile(y, tg::wrt(x));
    for (std::int64_t s : {0, 1, 2, -4, -6}) {
        const std::vector<std::int64_t> sv{s};
        const std::size_t b = std::size_t(s < 0 ? s + std::int64_t(len) : s);
        std::vector<double> want;
        for (std::size_t i = 0; i < 3; ++i)
            for (std::size_t j = b; j < b + 4; ++j)
                for (std::size_t k = 0; k < 2; ++k) want.push_back(xv[(i * len + j) * 2 + k]);
        CHECK(values_of(step, tg::bind(x, xv, {3, len, 2}), tg::bind(start, sv)) == want);
        check_gradient(tg::sum(tg::square(tg::dynamic_slice<1, 4>(x, start)) * tg::sin(tg::dynamic_slice<1, 4>(x, start))),
                       fixed(tg::bind(start, sv)), at(x, xv, {3, len, 2}));
        // second order: the backward's adjoint is the slice again
        auto inner = tg::sum(tg::sin(tg::dynamic_slice<-2, 4>(x, start)));
        check_gradient(tg::sum(tg::square(tg::grad(inner, x))), fixed(tg::bind(start, sv)), at(x, xv, {3, len, 2}));
    }
    // a start past the end (or before the beginning) throws before anything is written
    auto loss = tg::compile(tg::sum(tg::dynamic_slice<1, 4>(x, start)), tg::wrt(x));
    std::vector<double> g(xv.size(), 7.0);
    for (std::int64_t s : {3, 7, -7}) {
        const std::vector<std::int64_t> sv{s};
        CHECK_THROWS_AS(loss.value_and_grad(tg::bind(x, xv, {3, len, 2}), tg::bind(start, sv), tg::grad_into(x, g)),
                        tg::shape_error);
    }
    CHECK(g == std::vector<double>(xv.size(), 7.0));
    // a computed start: the window of 2 columns starting at the argmax of a row
    constexpr auto r = tg::input<"r", double, tg::shape<5>>;
    const std::vector<double> rv{0.1, 0.3, 0.9, 0.2, 0.0};
    auto w = tg::dynamic_slice<1, 2>(x, tg::argmax(r, tg::axes<0>, tg::keepdim));
    CHECK(values_of(tg::compile(w, tg::wrt(x)), tg::bind(x, xv, {3, len, 2}), tg::bind(r, rv)) ==
          values_of(tg::compile(tg::slice<1, 2, 4>(x), tg::wrt(x)), tg::bind(x, xv, {3, len, 2})));
}

TEST_CASE("narrow: run-time start and length, one step for every length, values, gradients, errors",
          "[ops][index][gradient]") {
    constexpr auto x = tg::param<"x", double, tg::shape<3, tg::dyn, 2>>;
    constexpr auto start = tg::input<"start", std::int64_t, tg::shape<1>>;
    constexpr auto n = tg::input<"n", std::int32_t, tg::shape<>>;
    const std::size_t len = 6;
    auto xv = uniform(3 * len * 2, -1.0, 1.0, 43);
    auto y = tg::narrow<1>(x, start, n);
    STATIC_REQUIRE(std::is_same_v<decltype(y)::shape_type, tg::shape<3, tg::dyn, 2>>);
    auto step = tg::compile(y, tg::wrt(x));
    // sum(narrow(x)): the gradient is 1 inside the window, 0 outside (closed form)
    auto total = tg::compile(tg::sum(tg::narrow<-2>(x, start, n)), tg::wrt(x));
    const std::pair<std::int64_t, std::int32_t> windows[] = {{0, 0}, {0, 6}, {1, 3}, {-4, 2}, {5, 1}, {6, 0}, {-6, 6}};
    for (auto [s, l] : windows) {
        const std::vector<std::int64_t> sv{s};
        const std::vector<std::int32_t> lv{l};
        const std::size_t b = std::size_t(s < 0 ? s + std::int64_t(len) : s);
        std::vector<double> want;
        for (std::size_t i = 0; i < 3; ++i)
            for (std::size_t j = b; j < b + std::size_t(l); ++j)
                for (std::size_t k = 0; k < 2; ++k) want.push_back(xv[(i * len + j) * 2 + k]);
        auto fwd = step.forward(tg::bind(x, xv, {3, len, 2}), tg::bind(start, sv), tg::bind(n, lv));
        CHECK(std::vector<double>(fwd.values().begin(), fwd.values().end()) == want);
        std::vector<double> g(xv.size(), -7.0);
        double sum = total.value_and_grad(tg::bind(x, xv, {3, len, 2}), tg::bind(start, sv), tg::bind(n, lv), tg::grad_into(x, g));
        double want_sum = 0;
        for (double v : want) want_sum += v;
        CHECK(sum == Approx(want_sum).margin(1e-12));
        for (std::size_t i = 0; i < 3; ++i)
            for (std::size_t j = 0; j < len; ++j)
                for (std::size_t k = 0; k < 2; ++k) CHECK(g[(i * len + j) * 2 + k] == (j >= b && j < b + std::size_t(l) ? 1.0 : 0.0));
        // the window meets another run-time extent, and the gradients by finite differences
        constexpr auto w = tg::input<"w", double, tg::shape<3, tg::dyn, 1>>;
        auto wv = uniform(3 * std::size_t(l), -2.0, 2.0, 44);
        check_gradient(tg::sum(tg::square(tg::narrow<1>(x, start, n)) * tg::sin(tg::narrow<1>(x, start, n)) * w),
                       fixed(tg::bind(start, sv), tg::bind(n, lv), tg::bind(w, wv, {3, std::size_t(l), 1})),
                       at(x, xv, {3, len, 2}));
        // second order: the backward's adjoint is the narrow again
        auto inner = tg::sum(tg::sin(tg::narrow<1>(x, start, n)));
        check_gradient(tg::sum(tg::square(tg::grad(inner, x))), fixed(tg::bind(start, sv), tg::bind(n, lv)),
                       at(x, xv, {3, len, 2}));
    }
    // lengths outside [0, extent] and windows leaving the axis throw before anything is written
    std::vector<double> g(xv.size(), 7.0);
    const std::pair<std::int64_t, std::int32_t> bad[] = {{0, -1}, {0, 7}, {5, 2}, {-1, 2}, {7, 0}, {-7, 1}};
    for (auto [s, l] : bad) {
        const std::vector<std::int64_t> sv{s};
        const std::vector<std::int32_t> lv{l};
        CHECK_THROWS_AS(total.value_and_grad(tg::bind(x, xv, {3, len, 2}), tg::bind(start, sv), tg::bind(n, lv),
                                             tg::grad_into(x, g)),
                        tg::shape_error);
    }
    CHECK(g == std::vector<double>(xv.size(), 7.0));
    // a length of more than one element
    constexpr auto nn = tg::input<"nn", std::int64_t, tg::shape<tg::dyn>>;
    const std::vector<std::int64_t> two{1, 2}, sv0{0};
    CHECK_THROWS_AS(tg::compile(tg::sum(tg::narrow<1>(x, start, nn)), tg::wrt(x))
                        .value_and_grad(tg::bind(x, xv, {3, len, 2}), tg::bind(start, sv0), tg::bind(nn, two, {2}),
                                        tg::grad_into(x, g)),
                    tg::shape_error);
    CHECK(g == std::vector<double>(xv.size(), 7.0));
    // a computed start (argmax of a row) with a run-time length: the same as the static slice
    constexpr auto r = tg::input<"r", double, tg::shape<5>>;
    const std::vector<double> rv{0.1, 0.3, 0.9, 0.2, 0.0};
    const std::vector<std::int32_t> three{3};
    CHECK(values_of(tg::compile(tg::narrow<1>(x, tg::argmax(r, tg::axes<0>, tg::keepdim), n), tg::wrt(x)),
                    tg::bind(x, xv, {3, len, 2}), tg::bind(r, rv), tg::bind(n, three)) ==
          values_of(tg::compile(tg::slice<1, 2, 5>(x), tg::wrt(x)), tg::bind(x, xv, {3, len, 2})));
}
