// matmul, dot and linear (ops/matmul.hpp): every rank combination against finite differences in
// double, and dynamic batch extents that never broadcast.
#include <check_gradient.hpp>

#include <type_traits>
#include <vector>

namespace tg = typegrad;
using tg::testing::at;
using tg::testing::check_gradient;
using tg::testing::fixed;
using tg::testing::uniform;

TEST_CASE("matmul for every rank combination, dot and linear", "[ops][matmul][gradient]") {
    constexpr auto a = tg::param<"a", double, tg::shape<tg::dyn, 4>>;
    constexpr auto b = tg::param<"b", double, tg::shape<4, 3>>;
    constexpr auto c = tg::param<"c", double, tg::shape<2, 3, 4>>;
    constexpr auto d = tg::param<"d", double, tg::shape<2, 4, 5>>;
    constexpr auto w = tg::param<"w", double, tg::shape<4>>;
    constexpr auto bias = tg::param<"bias", double, tg::shape<3>>;
    for (std::size_t rows : {1u, 3u, 7u}) {
        auto av = uniform(rows * 4, -1.0, 1.0, rows);
        auto bv = uniform(12, -1.0, 1.0, 40);
        check_gradient(tg::sum(tg::square(tg::matmul(a, b))), at(a, av, {rows, 4}), at(b, bv));
        check_gradient(tg::sum(tg::tanh(tg::linear(a, tg::transpose(b), bias))), at(a, av, {rows, 4}), at(b, bv),
                       at(bias, uniform(3, -1.0, 1.0, 41)));
        check_gradient(tg::sum(tg::matmul(tg::transpose(a), tg::exp(a))), at(a, av, {rows, 4}));
    }
    auto cv = uniform(24, -1.0, 1.0, 50), dv = uniform(40, -1.0, 1.0, 51), wv = uniform(4, -1.0, 1.0, 52);
    check_gradient(tg::sum(tg::sin(tg::matmul(c, d))), at(c, cv), at(d, dv));                  // batched
    check_gradient(tg::sum(tg::square(tg::matmul(c, b))), at(c, cv), at(b, uniform(12, -1.0, 1.0, 53)));  // batch x 2-D
    check_gradient(tg::sum(tg::matmul(c, w)), at(c, cv), at(w, wv));                            // 3-D x 1-D
    check_gradient(tg::sum(tg::square(tg::matmul(w, b))), at(w, wv), at(b, uniform(12, -1.0, 1.0, 54)));  // 1-D x 2-D
    check_gradient(tg::square(tg::dot(w, w)), at(w, wv));                                        // 1-D x 1-D
    // closed form: [[1, 1]] x [[1, 2], [3, 4]] = [[4, 6]]
    constexpr auto p = tg::param<"p", float, tg::shape<1, 2>>;
    constexpr auto q = tg::param<"q", float, tg::shape<2, 2>>;
    std::vector<float> pv{1, 1}, qv{1, 2, 3, 4}, gp(2), gq(4);
    const float l = tg::compile(tg::sum(tg::matmul(p, q)), tg::wrt(p, q))
                        .value_and_grad(tg::bind(p, pv), tg::bind(q, qv), tg::grad_into(p, gp), tg::grad_into(q, gq));
    CHECK(l == 10.f);
    CHECK(gp == std::vector<float>{3, 7});
    CHECK(gq == std::vector<float>{1, 1, 1, 1});
}

TEST_CASE("a dynamic matmul batch extent bound as 1 does not broadcast, in forward() as in value_and_grad()",
          "[ops][matmul][dynamic][edge]") {
    constexpr auto a = tg::param<"a", float, tg::shape<tg::dyn, 2, 3>>;
    constexpr auto w = tg::param<"w", float, tg::shape<2, 3, 4>>;
    auto step = tg::compile(tg::sum(tg::matmul(a, w)), tg::wrt(a, w));
    std::vector<float> ad(6, 1.f), wd(24, 1.f), ga(6, 7.f), gw(24, 7.f);
    CHECK_THROWS_AS(step.forward(tg::bind(a, ad, {1, 2, 3}), tg::bind(w, wd)), tg::shape_error);
    CHECK_THROWS_AS(step.value_and_grad(tg::bind(a, ad, {1, 2, 3}), tg::bind(w, wd), tg::grad_into(a, ga),
                                        tg::grad_into(w, gw)),
                    tg::shape_error);
    CHECK(ga == std::vector<float>(6, 7.f));
    // a static 1 broadcasts, in both
    constexpr auto a1 = tg::param<"a1", float, tg::shape<1, 2, 3>>;
    auto bcast = tg::compile(tg::sum(tg::matmul(a1, w)), tg::wrt(a1, w));
    CHECK(bcast.forward(tg::bind(a1, ad), tg::bind(w, wd)).value() == 48.f);
    CHECK(bcast.value_and_grad(tg::bind(a1, ad), tg::bind(w, wd), tg::grad_into(a1, ga), tg::grad_into(w, gw)) == 48.f);
    CHECK(ga == std::vector<float>(6, 8.f));
}

TEST_CASE("a matmul operand with neither inner axis unit-stride is read through a dense copy", "[ops][matmul][gradient]") {
    constexpr auto c = tg::param<"c", double, tg::shape<2, 3, 4>>;
    constexpr auto e = tg::param<"e", double, tg::shape<3, 5>>;
    constexpr auto k = tg::input<"k", double, tg::shape<4, 2, 5>>;
    // permute<2, 0, 1>(c) is [4, 2, 3] with strides (1, 12, 4): neither rows nor columns
    const auto loss = tg::sum(tg::matmul(tg::permute<2, 0, 1>(c), e) * k);
    const auto cv = uniform(24, -1.0, 1.0, 60), ev = uniform(15, -1.0, 1.0, 61), kv = uniform(40, -1.0, 1.0, 62);
    double expected = 0;
    for (std::size_t i = 0; i < 4; ++i)
        for (std::size_t j = 0; j < 2; ++j)
            for (std::size_t m = 0; m < 5; ++m) {
                double dot = 0;
                for (std::size_t l = 0; l < 3; ++l) dot += cv[(j * 3 + l) * 4 + i] * ev[l * 5 + m];
                expected += dot * kv[(i * 2 + j) * 5 + m];
            }
    auto step = tg::compile(loss, tg::wrt(c, e));
    CHECK(step.forward(tg::bind(c, cv), tg::bind(e, ev), tg::bind(k, kv)).value() == Approx(expected).epsilon(1e-12));
    check_gradient(loss, fixed(tg::bind(k, kv)), at(c, cv), at(e, ev));
}

namespace {
// True where a node of the tree is a permute of a matmul: a product written in one layout and
// then viewed in the other, which the step copies through strided reads.
template <class N>
struct permuted_product : std::false_type {};
template <class Op, class... Cs>
struct permuted_product<tg::node<Op, Cs...>> : std::bool_constant<(permuted_product<Cs>::value || ...)> {};
template <std::size_t... Ps, class... Cs>
struct permuted_product<tg::node<tg::detail::permute_op<Ps...>, tg::node<tg::detail::matmul_op, Cs...>>>
    : std::true_type {};
}  // namespace

TEST_CASE("a transposed matmul operand gets its gradient from one product in its own layout",
          "[ops][matmul][gradient][view]") {
    constexpr auto x = tg::param<"x", double, tg::shape<3, 4>>;
    constexpr auto w = tg::param<"w", double, tg::shape<5, 4>>;
    constexpr auto c = tg::param<"c", double, tg::shape<3, 4>>;
    // transpose(transpose(w)) is w; permutes compose into one view
    STATIC_REQUIRE(std::is_same_v<decltype(tg::transpose(tg::transpose(w)))::node_type, decltype(w)::node_type>);
    constexpr auto e = tg::param<"e", double, tg::shape<2, 3, 4>>;
    STATIC_REQUIRE(std::is_same_v<decltype(tg::permute<1, 2, 0>(tg::permute<2, 0, 1>(e)))::node_type,
                                  decltype(e)::node_type>);
    STATIC_REQUIRE(std::is_same_v<decltype(tg::permute<1, 0, 2>(tg::permute<2, 0, 1>(e)))::node_type,
                                  decltype(tg::permute<0, 2, 1>(e))::node_type>);
    // linear's weight gradient is g^T x, not (x^T g)^T; the same for a transposed left operand
    const auto lin = tg::sum(tg::square(tg::linear(x, w)));
    const auto left = tg::sum(tg::square(tg::matmul(tg::transpose(c), x)));
    STATIC_REQUIRE_FALSE(permuted_product<decltype(tg::grad(lin, w))::node_type>::value);
    STATIC_REQUIRE_FALSE(permuted_product<decltype(tg::grad(left, c))::node_type>::value);
    // and the gradients are right: 2-D, batched, and a 2-D operand broadcast over the batch
    const auto xv = uniform(12, -1.0, 1.0, 70);
    check_gradient(lin, at(x, xv), at(w, uniform(20, -1.0, 1.0, 71)));
    check_gradient(left, at(x, xv), at(c, uniform(12, -1.0, 1.0, 72)));
    constexpr auto d = tg::param<"d", double, tg::shape<2, 5, 4>>;
    constexpr auto f = tg::param<"f", double, tg::shape<5, 4>>;
    constexpr auto h = tg::param<"h", double, tg::shape<2, 3, 5>>;
    const auto ev = uniform(24, -1.0, 1.0, 73);
    check_gradient(tg::sum(tg::sin(tg::matmul(e, tg::transpose(d)))), at(e, ev), at(d, uniform(40, -1.0, 1.0, 74)));
    check_gradient(tg::sum(tg::sin(tg::matmul(e, tg::transpose(f)))), at(e, ev), at(f, uniform(20, -1.0, 1.0, 75)));
    check_gradient(tg::sum(tg::sin(tg::matmul(tg::transpose(h), e))), at(h, uniform(30, -1.0, 1.0, 76)), at(e, ev));
    // closed form, float: d/dW sum(x W^T) = column sums of x, in every row of W's gradient
    constexpr auto xf = tg::input<"xf", float, tg::shape<2, 3>>;
    constexpr auto wf = tg::param<"wf", float, tg::shape<2, 3>>;
    std::vector<float> xd{1, 2, 3, 4, 5, 6}, wd{1, 0, 0, 0, 1, 0}, gw(6);
    const float l = tg::compile(tg::sum(tg::linear(xf, wf)), tg::wrt(wf))
                        .value_and_grad(tg::bind(xf, xd), tg::bind(wf, wd), tg::grad_into(wf, gw));
    CHECK(l == 12.f);  // (1 + 2) + (4 + 5)
    CHECK(gw == std::vector<float>{5, 7, 9, 5, 7, 9});
}
