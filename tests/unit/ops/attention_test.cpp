// Attention (ops/attention.hpp): causal_mask (values, diagonals, strided input, gradient 0 where
// masked) and scaled_dot_product_attention of rank 2, 3 and 4 (plain, causal with Tq != Tk,
// additive mask, explicit scale) against a double reference and finite differences; PyTorch's
// softmax rules for -inf logits (exact 0, NaN for a fully masked row) and large logits.
#include <check_gradient.hpp>

#include <cmath>
#include <limits>

namespace tg = typegrad;
using tg::testing::at;
using tg::testing::check_gradient;
using tg::testing::fixed;
using tg::testing::uniform;
using tg::testing::values_of;
using tg::testing::require_close;

namespace {
constexpr double inf = std::numeric_limits<double>::infinity();

// softmax(q k^T * scale + mask) v over nb matrices, in double; causal: key j > query i is masked.
std::vector<double> ref_attention(const std::vector<double>& q, const std::vector<double>& k,
                                  const std::vector<double>& v, std::size_t nb, std::size_t tq, std::size_t tk,
                                  std::size_t d, std::size_t dv, double scale, bool causal,
                                  const std::vector<double>& mask = {}) {
    std::vector<double> out(nb * tq * dv, 0.0);
    for (std::size_t b = 0; b < nb; ++b)
        for (std::size_t i = 0; i < tq; ++i) {
            std::vector<double> s(tk);
            double mx = -inf;
            for (std::size_t j = 0; j < tk; ++j) {
                double acc = 0;
                for (std::size_t c = 0; c < d; ++c) acc += q[(b * tq + i) * d + c] * k[(b * tk + j) * d + c];
                s[j] = acc * scale + (mask.empty() ? 0.0 : mask[i * tk + j]);
                if (causal && j > i) s[j] = -inf;
                mx = std::max(mx, s[j]);
            }
            double z = 0;
            for (auto& e : s) z += (e = std::exp(e - mx));
            for (std::size_t j = 0; j < tk; ++j)
                for (std::size_t c = 0; c < dv; ++c) out[(b * tq + i) * dv + c] += s[j] / z * v[(b * tk + j) * dv + c];
        }
    return out;
}
}  // namespace

TEST_CASE("causal_mask: values above the diagonal are -inf, their gradient is 0", "[ops][attention][gradient]") {
    constexpr auto x = tg::param<"x", double, tg::shape<tg::dyn, 4>>;
    constexpr auto w = tg::input<"w", double, tg::shape<tg::dyn, 4>>;
    for (std::size_t rows : {1u, 3u, 6u}) {
        auto xv = uniform(rows * 4, -1.0, 1.0, 3);
        auto wv = uniform(rows * 4, -1.0, 1.0, 4);
        auto masked = values_of(tg::compile(tg::causal_mask(x), tg::wrt(x)), tg::bind(x, xv, {rows, 4}));
        auto below = values_of(tg::compile(tg::causal_mask<-1>(x), tg::wrt(x)), tg::bind(x, xv, {rows, 4}));
        auto above = values_of(tg::compile(tg::causal_mask<2>(x), tg::wrt(x)), tg::bind(x, xv, {rows, 4}));
        for (std::size_t i = 0; i < rows; ++i)
            for (std::size_t j = 0; j < 4; ++j) {
                const double xe = xv[i * 4 + j];
                CHECK(masked[i * 4 + j] == (j > i ? -inf : xe));
                CHECK(below[i * 4 + j] == (j + 1 > i ? -inf : xe));
                CHECK(above[i * 4 + j] == (j > i + 2 ? -inf : xe));
            }
        // exp(-inf) = 0: the loss is finite and the masked elements get exactly 0
        check_gradient(tg::sum(tg::exp(tg::causal_mask(x)) * w), fixed(tg::bind(w, wv, {rows, 4})),
                       at(x, xv, {rows, 4}));
        std::vector<double> g(rows * 4, 7.0);
        tg::compile(tg::sum(tg::exp(tg::causal_mask(x)) * w), tg::wrt(x))
            .value_and_grad(tg::bind(x, xv, {rows, 4}), tg::bind(w, wv, {rows, 4}), tg::grad_into(x, g));
        for (std::size_t i = 0; i < rows; ++i)
            for (std::size_t j = i + 1; j < 4; ++j) CHECK(g[i * 4 + j] == 0.0);
    }
    // a strided (transposed) batched input: the mask applies to the view's rows and columns
    constexpr auto y = tg::param<"y", float, tg::shape<2, 3, 3>>;
    std::vector<float> yv(18);
    for (std::size_t e = 0; e < 18; ++e) yv[e] = float(e);
    auto t = tg::compile(tg::causal_mask(tg::transpose(y)), tg::wrt(y)).forward(tg::bind(y, yv));
    for (std::size_t b = 0; b < 2; ++b)
        for (std::size_t i = 0; i < 3; ++i)
            for (std::size_t j = 0; j < 3; ++j)
                CHECK(t.values()[(b * 3 + i) * 3 + j] == (j > i ? -std::numeric_limits<float>::infinity()
                                                                : yv[(b * 3 + j) * 3 + i]));
}

TEST_CASE("softmax of -inf logits follows PyTorch", "[ops][attention]") {
    constexpr auto x = tg::input<"x", double, tg::shape<3, 3>>;
    const std::vector<double> xv{1.0, -inf, 2.0, -inf, -inf, -inf, 1e300, 5.0, -inf};
    auto s = values_of(tg::compile(tg::softmax(x), tg::wrt()), tg::bind(x, xv));
    const double e = std::exp(-1.0);
    CHECK(std::abs(s[0] - e / (1 + e)) < 1e-15);
    CHECK(s[1] == 0.0);  // exactly 0
    CHECK(std::abs(s[2] - 1 / (1 + e)) < 1e-15);
    for (std::size_t j = 3; j < 6; ++j) CHECK(std::isnan(s[j]));  // a fully masked row: NaN, as torch.softmax
    CHECK(s[6] == 1.0);  // large logits do not overflow
    CHECK(s[7] == 0.0);
    CHECK(s[8] == 0.0);
}

TEST_CASE("scaled_dot_product_attention of [T, d]: values and gradients", "[ops][attention][gradient]") {
    constexpr auto q = tg::param<"q", double, tg::shape<tg::dyn, 4>>;
    constexpr auto k = tg::param<"k", double, tg::shape<tg::dyn, 4>>;
    constexpr auto v = tg::param<"v", double, tg::shape<tg::dyn, 3>>;
    constexpr auto w = tg::input<"w", double, tg::shape<tg::dyn, 3>>;
    for (auto [tq, tk] : {std::pair<std::size_t, std::size_t>{3, 3}, {2, 5}, {4, 2}, {1, 1}}) {
        auto qv = uniform(tq * 4, -1.5, 1.5, 5), kv = uniform(tk * 4, -1.5, 1.5, 6), vv = uniform(tk * 3, -1.0, 1.0, 7);
        auto wv = uniform(tq * 3, -1.0, 1.0, 8);
        auto bq = tg::bind(q, qv, {tq, 4});
        auto bk = tg::bind(k, kv, {tk, 4});
        auto bv = tg::bind(v, vv, {tk, 3});
        require_close(values_of(tg::compile(tg::scaled_dot_product_attention(q, k, v), tg::wrt(q)), bq, bk, bv),
                      ref_attention(qv, kv, vv, 1, tq, tk, 4, 3, 0.5, false));
        require_close(values_of(tg::compile(tg::scaled_dot_product_attention(q, k, v, tg::causal), tg::wrt(q)), bq, bk, bv),
                      ref_attention(qv, kv, vv, 1, tq, tk, 4, 3, 0.5, true));
        require_close(values_of(tg::compile(tg::scaled_dot_product_attention<0.25>(q, k, v), tg::wrt(q)), bq, bk, bv),
                      ref_attention(qv, kv, vv, 1, tq, tk, 4, 3, 0.25, false));
        auto fw = fixed(tg::bind(w, wv, {tq, 3}));
        check_gradient(tg::sum(tg::scaled_dot_product_attention(q, k, v) * w), fw, at(q, qv, {tq, 4}),
                       at(k, kv, {tk, 4}), at(v, vv, {tk, 3}));
        check_gradient(tg::sum(tg::scaled_dot_product_attention(q, k, v, tg::causal) * w), fw, at(q, qv, {tq, 4}),
                       at(k, kv, {tk, 4}), at(v, vv, {tk, 3}));
    }
}

TEST_CASE("scaled_dot_product_attention with an additive mask", "[ops][attention][gradient]") {
    constexpr auto q = tg::param<"q", double, tg::shape<3, 2>>;
    constexpr auto k = tg::param<"k", double, tg::shape<4, 2>>;
    constexpr auto v = tg::param<"v", double, tg::shape<4, 2>>;
    constexpr auto m = tg::input<"m", double, tg::shape<3, 4>>;
    constexpr auto w = tg::input<"w", double, tg::shape<3, 2>>;
    auto qv = uniform(6, -1.0, 1.0, 9), kv = uniform(8, -1.0, 1.0, 10), vv = uniform(8, -1.0, 1.0, 11);
    auto wv = uniform(6, -1.0, 1.0, 12);
    const std::vector<double> mv{0.0, -inf, 0.5, 0.0, -inf, -inf, -inf, 0.0, 0.0, 1.0, -2.0, -inf};
    require_close(values_of(tg::compile(tg::scaled_dot_product_attention(q, k, v, m), tg::wrt(q)), tg::bind(q, qv),
                            tg::bind(k, kv), tg::bind(v, vv), tg::bind(m, mv)),
                  ref_attention(qv, kv, vv, 1, 3, 4, 2, 2, 1 / std::sqrt(2.0), false, mv));
    check_gradient(tg::sum(tg::scaled_dot_product_attention(q, k, v, m) * w), fixed(tg::bind(m, mv), tg::bind(w, wv)),
                   at(q, qv), at(k, kv), at(v, vv));
}

TEST_CASE("scaled_dot_product_attention of [batch, T, d] and [batch, heads, T, d]", "[ops][attention][gradient]") {
    constexpr auto q = tg::param<"q", double, tg::shape<2, tg::dyn, 3>>;
    constexpr auto k = tg::param<"k", double, tg::shape<2, tg::dyn, 3>>;
    constexpr auto v = tg::param<"v", double, tg::shape<2, tg::dyn, 2>>;
    constexpr auto w = tg::input<"w", double, tg::shape<2, tg::dyn, 2>>;
    const std::size_t t = 3;
    auto qv = uniform(2 * t * 3, -1.0, 1.0, 13), kv = uniform(2 * t * 3, -1.0, 1.0, 14), vv = uniform(2 * t * 2, -1.0, 1.0, 15);
    auto wv = uniform(2 * t * 2, -1.0, 1.0, 16);
    require_close(values_of(tg::compile(tg::scaled_dot_product_attention(q, k, v, tg::causal), tg::wrt(q)),
                            tg::bind(q, qv, {2, t, 3}), tg::bind(k, kv, {2, t, 3}), tg::bind(v, vv, {2, t, 2})),
                  ref_attention(qv, kv, vv, 2, t, t, 3, 2, 1 / std::sqrt(3.0), true));
    check_gradient(tg::sum(tg::scaled_dot_product_attention(q, k, v, tg::causal) * w), fixed(tg::bind(w, wv, {2, t, 2})),
                   at(q, qv, {2, t, 3}), at(k, kv, {2, t, 3}), at(v, vv, {2, t, 2}));

    // [batch 1, heads 2, T, d]: the same numbers as [2, T, d]
    constexpr auto q4 = tg::param<"q4", double, tg::shape<1, 2, tg::dyn, 3>>;
    constexpr auto k4 = tg::param<"k4", double, tg::shape<1, 2, tg::dyn, 3>>;
    constexpr auto v4 = tg::param<"v4", double, tg::shape<1, 2, tg::dyn, 2>>;
    constexpr auto w4 = tg::input<"w4", double, tg::shape<1, 2, tg::dyn, 2>>;
    require_close(values_of(tg::compile(tg::scaled_dot_product_attention(q4, k4, v4, tg::causal), tg::wrt(q4)),
                            tg::bind(q4, qv, {1, 2, t, 3}), tg::bind(k4, kv, {1, 2, t, 3}), tg::bind(v4, vv, {1, 2, t, 2})),
                  ref_attention(qv, kv, vv, 2, t, t, 3, 2, 1 / std::sqrt(3.0), true));
    check_gradient(tg::sum(tg::scaled_dot_product_attention(q4, k4, v4) * w4), fixed(tg::bind(w4, wv, {1, 2, t, 2})),
                   at(q4, qv, {1, 2, t, 3}), at(k4, kv, {1, 2, t, 3}), at(v4, vv, {1, 2, t, 2}));
}

TEST_CASE("scaled_dot_product_attention in float: large logits stay finite", "[ops][attention]") {
    constexpr auto q = tg::param<"q", float, tg::shape<4, 8>>;
    constexpr auto k = tg::input<"k", float, tg::shape<4, 8>>;
    constexpr auto v = tg::input<"v", float, tg::shape<4, 8>>;
    std::vector<float> qv(32), kv(32), vv(32), g(32);
    for (std::size_t e = 0; e < 32; ++e) {
        qv[e] = float(e % 5) * 300.0f;  // logits up to ~1e6: exp would overflow without the shift
        kv[e] = float(e % 3) * 300.0f;
        vv[e] = float(e) / 32.0f;
    }
    const float l = tg::compile(tg::sum(tg::scaled_dot_product_attention(q, k, v, tg::causal)), tg::wrt(q))
                        .value_and_grad(tg::bind(q, qv), tg::bind(k, kv), tg::bind(v, vv), tg::grad_into(q, g));
    CHECK(std::isfinite(l));
    for (float e : g) CHECK(std::isfinite(e));
}

TEST_CASE("the default scale is 1 / sqrt(d) correctly rounded", "[ops][attention]") {
    static_assert(tg::detail::sqrt_of_integer(64) == 8.0);
    std::uint64_t wrong = 0;
    for (std::uint64_t d = 1; d < (1u << 20); ++d) wrong += tg::detail::sqrt_of_integer(d) != std::sqrt(double(d));
    CHECK(wrong == 0);
}

// ---- the fused op (attention_op): the composite (tg::attention_math) is its reference --------

TEST_CASE("fused attention: values and gradients equal the composite's across blocks", "[ops][attention][gradient]") {
    constexpr auto q = tg::param<"q", double, tg::shape<tg::dyn, 3>>;
    constexpr auto k = tg::param<"k", double, tg::shape<tg::dyn, 3>>;
    constexpr auto v = tg::param<"v", double, tg::shape<tg::dyn, 5>>;
    constexpr auto w = tg::input<"w", double, tg::shape<tg::dyn, 5>>;
    // the public overloads pick the fused op for one dtype and rank, the composite otherwise
    using fused_t = decltype(tg::scaled_dot_product_attention(q, k, v, tg::causal));
    using math_t = decltype(tg::scaled_dot_product_attention(q, k, v, tg::causal, tg::attention_math));
    STATIC_REQUIRE(std::is_same_v<typename fused_t::node_type::op, tg::detail::attention_op<tg::num(1 / tg::detail::sqrt_of_integer(3)), true>>);
    STATIC_REQUIRE(!std::is_same_v<typename math_t::node_type::op, typename fused_t::node_type::op>);
    auto fused = tg::compile(tg::sum(tg::scaled_dot_product_attention(q, k, v) * w), tg::wrt(q, k, v));
    auto math = tg::compile(tg::sum(tg::scaled_dot_product_attention(q, k, v, tg::attention_math) * w), tg::wrt(q, k, v));
    auto fused_c = tg::compile(tg::sum(tg::scaled_dot_product_attention(q, k, v, tg::causal) * w), tg::wrt(q, k, v));
    auto math_c = tg::compile(tg::sum(tg::scaled_dot_product_attention(q, k, v, tg::causal, tg::attention_math) * w),
                              tg::wrt(q, k, v));
    // one block and several, a partial last block (65, 130), Tq != Tk both ways, a single key
    for (auto [tq_, tk_] : {std::pair<std::size_t, std::size_t>{1, 1}, {5, 5}, {64, 64}, {65, 65}, {130, 130}, {70, 130},
                            {130, 70}, {3, 1}}) {
        const std::size_t tq = tq_, tk = tk_;  // (clang 14 cannot capture structured bindings)
        auto qv = uniform(tq * 3, -2.0, 2.0, 21), kv = uniform(tk * 3, -2.0, 2.0, 22), vv = uniform(tk * 5, -1.0, 1.0, 23);
        auto wv = uniform(tq * 5, -1.0, 1.0, 24);
        for (int causal = 0; causal < 2; ++causal) {
            std::vector<double> g[2][3];
            double l[2];
            for (int path = 0; path < 2; ++path) {
                for (auto& e : g[path]) e.assign(1, 0.0);
                g[path][0].assign(tq * 3, 0.0);
                g[path][1].assign(tk * 3, 0.0);
                g[path][2].assign(tk * 5, 0.0);
                auto run = [&](const auto& step) {
                    return step.value_and_grad(tg::bind(q, qv, {tq, 3}), tg::bind(k, kv, {tk, 3}), tg::bind(v, vv, {tk, 5}),
                                               tg::bind(w, wv, {tq, 5}), tg::grad_into(q, g[path][0]),
                                               tg::grad_into(k, g[path][1]), tg::grad_into(v, g[path][2]));
                };
                l[path] = causal ? (path ? run(math_c) : run(fused_c)) : (path ? run(math) : run(fused));
            }
            INFO("tq " << tq << ", tk " << tk << ", causal " << causal);
            CHECK(std::abs(l[0] - l[1]) <= 1e-12 * (1 + std::abs(l[1])));
            for (int i = 0; i < 3; ++i) require_close(g[0][i], g[1][i], 1e-12);
        }
    }
    // finite differences across blocks (a causal 70 x 70 and 70 queries over 66 keys)
    for (auto [tq, tk] : {std::pair<std::size_t, std::size_t>{70, 70}, {70, 66}}) {
        auto qv = uniform(tq * 3, -1.0, 1.0, 25), kv = uniform(tk * 3, -1.0, 1.0, 26), vv = uniform(tk * 5, -1.0, 1.0, 27);
        const auto wv = uniform(tq * 5, -1.0, 1.0, 28);  // (a binding keeps a pointer: not a temporary)
        auto fw = fixed(tg::bind(w, wv, {tq, 5}));
        check_gradient(tg::sum(tg::scaled_dot_product_attention(q, k, v, tg::causal) * w), fw, at(q, qv, {tq, 3}),
                       at(k, kv, {tk, 3}), at(v, vv, {tk, 5}));
    }
}

TEST_CASE("fused attention of strided heads, bf16, and on any number of threads", "[ops][attention][gradient]") {
    // [B, T, H, hd] projections viewed as [B, H, T, hd] (rows of unit stride, read in place)
    constexpr std::size_t b = 2, h = 3, hd = 8, t = 77;
    constexpr auto x = tg::param<"x", float, tg::shape<b, tg::dyn, h * hd>>;
    constexpr auto w = tg::input<"w", float, tg::shape<b, h, tg::dyn, hd>>;
    auto heads = [](auto e) { return tg::transpose<1, 2>(tg::reshape<tg::shape<b, tg::dyn, h, hd>>(e)); };
    auto loss = [&](auto... mode) {
        return tg::sum(tg::scaled_dot_product_attention(heads(x), heads(x * tg::lit<0.5>), heads(tg::tanh(x)), mode...) * w);
    };
    auto xv = uniform(b * t * h * hd, -2.0, 2.0, 31), wv = uniform(b * h * t * hd, -1.0, 1.0, 32);
    std::vector<float> xf(xv.begin(), xv.end()), wf(wv.begin(), wv.end());
    auto grad_of = [&](const auto& step) {
        std::vector<float> g(xf.size());
        const float l = step.value_and_grad(tg::bind(x, xf, {b, t, h * hd}), tg::bind(w, wf, {b, h, t, hd}), tg::grad_into(x, g));
        g.push_back(l);
        return std::vector<double>(g.begin(), g.end());
    };
    const auto fused = grad_of(tg::compile(loss(tg::causal), tg::wrt(x)));
    const auto math = grad_of(tg::compile(loss(tg::causal, tg::attention_math), tg::wrt(x)));
    double num = 0, den = 0;
    for (std::size_t e = 0; e < fused.size(); ++e) num += (fused[e] - math[e]) * (fused[e] - math[e]), den += math[e] * math[e];
    CHECK(std::sqrt(num / den) < 1e-6);

    // the result does not depend on the thread count (batch matrices are computed alone)
    tg::set_num_threads(1);
    const auto one = grad_of(tg::compile(loss(), tg::wrt(x)));
    tg::set_num_threads(2);
    const auto two = grad_of(tg::compile(loss(), tg::wrt(x)));
    tg::set_num_threads(0);
    CHECK(one == two);

    // bf16 operands compute in f32 and round the result once: the f32 op's result, rounded
    constexpr auto qb = tg::param<"qb", tg::bf16, tg::shape<4, tg::dyn, 16>>;
    constexpr auto qf = tg::param<"qf", float, tg::shape<4, tg::dyn, 16>>;
    std::vector<tg::bf16> vb(4 * t * 16);
    std::vector<float> vf(vb.size());
    auto src = uniform(vb.size(), -2.0, 2.0, 33);
    for (std::size_t e = 0; e < vb.size(); ++e) vf[e] = float(vb[e] = tg::bf16(float(src[e])));
    const auto ob = tg::compile(tg::scaled_dot_product_attention(qb, qb, qb, tg::causal), tg::wrt(qb))
                        .forward(tg::bind(qb, vb, {4, t, 16}));
    const auto of = tg::compile(tg::scaled_dot_product_attention(qf, qf, qf, tg::causal), tg::wrt(qf))
                        .forward(tg::bind(qf, vf, {4, t, 16}));
    std::size_t differ = 0;
    for (std::size_t e = 0; e < vb.size(); ++e) differ += float(ob.values()[e]) != float(tg::bf16(of.values()[e]));
    CHECK(differ == 0);
}

TEST_CASE("fused attention: NaN and infinite logits as the composite", "[ops][attention]") {
    constexpr auto q = tg::input<"q", double, tg::shape<4, 2>>;
    constexpr auto k = tg::input<"k", double, tg::shape<3, 2>>;
    constexpr auto v = tg::input<"v", double, tg::shape<3, 2>>;
    // row 0: an infinite logit (NaN, as torch.softmax of +inf); row 1: a -inf logit (probability
    // exactly 0); row 2: NaN; row 3: finite
    const std::vector<double> qv{inf, 0.0, 0.0, 1.0, std::numeric_limits<double>::quiet_NaN(), 0.0, 0.5, -0.5};
    const std::vector<double> kv{1.0, 0.0, 0.0, -inf, -1.0, 2.0}, vv{1.0, 2.0, 3.0, 4.0, 5.0, 6.0};
    for (int causal = 0; causal < 2; ++causal) {
        auto fused = causal ? values_of(tg::compile(tg::scaled_dot_product_attention(q, k, v, tg::causal), tg::wrt()),
                                        tg::bind(q, qv), tg::bind(k, kv), tg::bind(v, vv))
                            : values_of(tg::compile(tg::scaled_dot_product_attention(q, k, v), tg::wrt()), tg::bind(q, qv),
                                        tg::bind(k, kv), tg::bind(v, vv));
        auto math = causal ? values_of(tg::compile(tg::scaled_dot_product_attention(q, k, v, tg::causal, tg::attention_math),
                                                   tg::wrt()),
                                       tg::bind(q, qv), tg::bind(k, kv), tg::bind(v, vv))
                           : values_of(tg::compile(tg::scaled_dot_product_attention(q, k, v, tg::attention_math), tg::wrt()),
                                       tg::bind(q, qv), tg::bind(k, kv), tg::bind(v, vv));
        for (std::size_t e = 0; e < fused.size(); ++e) {
            INFO("causal " << causal << ", element " << e);
            CHECK(std::isnan(fused[e]) == std::isnan(math[e]));
            if (!std::isnan(math[e])) CHECK(std::abs(fused[e] - math[e]) <= 1e-14);
        }
        CHECK(std::isnan(fused[0]));
        CHECK(std::isnan(fused[4]));
        CHECK(!std::isnan(fused[2]));
    }
}

TEST_CASE("attention_math: the composite's backward is differentiable again", "[ops][attention][gradient]") {
    constexpr auto q = tg::param<"q", double, tg::shape<3, 2>>;
    constexpr auto k = tg::param<"k", double, tg::shape<4, 2>>;
    constexpr auto v = tg::param<"v", double, tg::shape<4, 2>>;
    auto inner = tg::sum(tg::square(tg::scaled_dot_product_attention(q, k, v, tg::causal, tg::attention_math)));
    check_gradient(tg::sum(tg::square(tg::grad(inner, q))), at(q, uniform(6, -1.0, 1.0, 41)), at(k, uniform(8, -1.0, 1.0, 42)),
                   at(v, uniform(8, -1.0, 1.0, 43)));
}

TEST_CASE("fused attention: an infinity or NaN at a masked key reaches the rows as in the composite",
          "[ops][attention][gradient]") {
    // The composite multiplies a masked key's zero probability (or zero score gradient) by its
    // value: 0 * NaN and 0 * inf are NaN in every row, not only in the rows that see the key. The
    // fused op keeps that (it skips no key of such a matrix), across blocks of queries.
    constexpr auto q = tg::param<"q", double, tg::shape<2, tg::dyn, 3>>;
    constexpr auto k = tg::param<"k", double, tg::shape<2, tg::dyn, 3>>;
    constexpr auto v = tg::param<"v", double, tg::shape<2, tg::dyn, 2>>;
    constexpr auto w = tg::input<"w", double, tg::shape<2, tg::dyn, 2>>;
    const std::size_t t = 70;
    auto fused = tg::compile(tg::sum(tg::scaled_dot_product_attention(q, k, v, tg::causal) * w), tg::wrt(q, k, v));
    auto math = tg::compile(tg::sum(tg::scaled_dot_product_attention(q, k, v, tg::causal, tg::attention_math) * w),
                            tg::wrt(q, k, v));
    auto fo = tg::compile(tg::scaled_dot_product_attention(q, k, v, tg::causal), tg::wrt());
    auto mo = tg::compile(tg::scaled_dot_product_attention(q, k, v, tg::causal, tg::attention_math), tg::wrt());
    for (int which = 0; which < 4; ++which) {
        auto qv = uniform(2 * t * 3, -1.0, 1.0, 51), kv = uniform(2 * t * 3, -1.0, 1.0, 52), vv = uniform(2 * t * 2, -1.0, 1.0, 53);
        auto wv = uniform(2 * t * 2, -1.0, 1.0, 54);
        // in matrix 1 only (matrix 0 stays finite): key 69 is masked for every row but the last
        if (which == 0) vv[(t + 69) * 2 + 1] = std::numeric_limits<double>::quiet_NaN();
        if (which == 1) kv[(t + 69) * 3] = inf;
        if (which == 2) qv[(t + 3) * 3 + 2] = -inf;  // row 3's scores; dK's masked terms 0 * inf
        if (which == 3) wv[(t + 10) * 2] = inf;       // the incoming gradient of row 10
        std::vector<double> g[2][3];
        for (int path = 0; path < 2; ++path) {
            g[path][0].assign(qv.size(), 0.0);
            g[path][1].assign(kv.size(), 0.0);
            g[path][2].assign(vv.size(), 0.0);
            auto args = [&](const auto& step) {
                return step.value_and_grad(tg::bind(q, qv, {2, t, 3}), tg::bind(k, kv, {2, t, 3}), tg::bind(v, vv, {2, t, 2}),
                                           tg::bind(w, wv, {2, t, 2}), tg::grad_into(q, g[path][0]),
                                           tg::grad_into(k, g[path][1]), tg::grad_into(v, g[path][2]));
            };
            path ? args(math) : args(fused);
        }
        const auto vf = values_of(fo, tg::bind(q, qv, {2, t, 3}), tg::bind(k, kv, {2, t, 3}), tg::bind(v, vv, {2, t, 2}));
        const auto vm = values_of(mo, tg::bind(q, qv, {2, t, 3}), tg::bind(k, kv, {2, t, 3}), tg::bind(v, vv, {2, t, 2}));
        auto same = [&](const std::vector<double>& a, const std::vector<double>& b, const char* what) {
            std::size_t nan_differs = 0, value_differs = 0, nans = 0, first = a.size();
            for (std::size_t e = 0; e < a.size(); ++e) {
                nans += std::isnan(b[e]);
                const bool differs = std::isnan(a[e]) != std::isnan(b[e]) ||
                                     (!std::isnan(b[e]) && !(a[e] == b[e] || std::abs(a[e] - b[e]) <= 1e-12 * (1 + std::abs(b[e]))));
                if (differs && first == a.size()) first = e;
                if (std::isnan(a[e]) != std::isnan(b[e])) ++nan_differs;
                else if (differs) ++value_differs;
            }
            INFO("case " << which << ", " << what << ": " << nans << " NaN in the composite's; first difference at "
                         << first << (first < a.size() ? ": fused " + std::to_string(a[first]) + ", composite " + std::to_string(b[first]) : ""));
            CHECK(nan_differs == 0);
            CHECK(value_differs == 0);
            return nans;
        };
        const std::size_t nan_values = same(vf, vm, "values");
        std::size_t nan_grads = 0;
        for (int i = 0; i < 3; ++i) nan_grads += same(g[0][i], g[1][i], "gradient");
        CHECK(nan_values + nan_grads > 0);  // the case reaches something
        CHECK(nan_values + nan_grads < 2 * (vf.size() + qv.size() + kv.size() + vv.size()) / 2);  // matrix 0 stays finite
    }
}
