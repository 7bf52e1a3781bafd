// The reverse pass (autodiff/reverse.hpp): shared subexpressions accumulate their adjoints, and
// tg::grad is differentiable again (Hessian-vector products).
#include <check_gradient.hpp>

#include <type_traits>
#include <vector>

namespace tg = typegrad;
using tg::testing::at;
using tg::testing::check_gradient;
using tg::testing::uniform;

namespace {
constexpr auto x = tg::param<"x", double, tg::shape<tg::dyn>>;
constexpr auto y = tg::param<"y", double, tg::shape<tg::dyn>>;
}  // namespace

TEST_CASE("composite expressions with sharing", "[ops][gradient]") {
    const std::size_t n = 11;
    auto a = uniform(n, -1.0, 1.0, 5);
    auto b = uniform(n, 0.5, 1.5, 6);
    auto e = tg::exp(x);
    check_gradient(tg::sum(e * e * y + tg::tanh(e - y) / y), at(x, a, {n}), at(y, b, {n}));
    check_gradient(tg::sum(tg::sigmoid(x * y) * tg::log(y) + tg::sqrt(tg::square(x) + y)),
                   at(x, a, {n}), at(y, b, {n}));
    check_gradient(tg::sum(tg::sin(tg::cos(tg::sin(x)))) * tg::sum(y), at(x, a, {n}), at(y, b, {n}));
}

TEST_CASE("grad of grad: Hessian-vector products against differences of gradients", "[autodiff][higher-order]") {
    constexpr auto x = tg::param<"x", double, tg::shape<3>>;
    constexpr auto vv = tg::input<"vv", double, tg::shape<3>>;
    constexpr auto M = tg::input<"M", double, tg::shape<3, 3>>;
    auto f = tg::log_sum_exp(tg::matmul(M, tg::tanh(x))) + tg::sum(tg::exp(x) * tg::sin(x));
    auto hvp = tg::sum(tg::grad(f, x) * vv);   // x -> H(x) v, through grad(f, x)
    std::vector<double> xv{0.3, -0.2, 0.5}, dir{1.0, -2.0, 0.5}, Mv{1, 2, 0, -1, 0.5, 1, 0.3, -0.7, 2};
    std::vector<double> hv(3);
    tg::compile(hvp, tg::wrt(x)).value_and_grad(tg::bind(x, xv), tg::bind(vv, dir), tg::bind(M, Mv), tg::grad_into(x, hv));
    auto gstep = tg::compile(f, tg::wrt(x));
    auto grad_at = [&](std::vector<double> p) {
        std::vector<double> g(3);
        gstep.value_and_grad(tg::bind(x, p), tg::bind(M, Mv), tg::grad_into(x, g));
        return g;
    };
    const double h = 1e-5;
    std::vector<double> up = xv, down = xv;
    for (int i = 0; i < 3; ++i) {
        up[i] += h * dir[i];
        down[i] -= h * dir[i];
    }
    auto gu = grad_at(up), gd = grad_at(down);
    for (int i = 0; i < 3; ++i) CHECK_THAT(hv[i], Catch::Matchers::WithinAbs((gu[i] - gd[i]) / (2 * h), 1e-7));
}

// A backward node names its operands by node_refs (graph/node.hpp), which carry their target's
// buffer type: a bf16 reduction accumulates in a float buffer, and a view of it (the adjoint of
// a column broadcast: sum over the row, then reshape_like or squeeze back to the leaf) reads that
// buffer. Before the fix the view read the float buffer as bf16 (grad s[2i] the low half of row
// i's sum, grad s[2i + 1] its high half): every bf16 bias broadcast along a column (conv1d's and
// conv2d's bias) had wrong gradients, outside autocast regions and under backward_autocast::off.
TEST_CASE("a view of a bf16 reduction in the backward reads its float buffer", "[autodiff][bf16]") {
    constexpr auto xb = tg::param<"xb", tg::bf16, tg::shape<4, 3>>;
    constexpr auto sb = tg::param<"sb", tg::bf16, tg::shape<4>>;
    using sum_node = typename decltype(tg::sum(xb, tg::axes<1>, tg::keepdim))::node_type;
    STATIC_REQUIRE(std::is_same_v<tg::detail::buffer_t<tg::detail::node_ref_to<true, 0, sum_node>>, float>);
    std::vector<tg::bf16> xv(12), sv(4);
    for (std::size_t i = 0; i < 12; ++i) xv[i] = tg::bf16(0.25f * float(i) - 1.0f);
    for (std::size_t i = 0; i < 4; ++i) sv[i] = tg::bf16(0.5f + 0.25f * float(i));
    // d/ds_i sum(x * s[:, None]) = sum_j x_ij (exact in bf16 here: quarters below 8)
    auto check = [&](const auto& step, const char* what) {
        INFO(what);
        std::vector<tg::bf16> gs(4);
        step.value_and_grad(tg::bind(xb, xv), tg::bind(sb, sv), tg::grad_into(sb, gs));
        for (std::size_t i = 0; i < 4; ++i) {
            const float want = float(xv[3 * i]) + float(xv[3 * i + 1]) + float(xv[3 * i + 2]);
            CHECK(float(gs[i]) == want);
        }
    };
    const auto by_reshape = tg::sum(xb * tg::reshape<tg::shape<4, 1>>(sb));  // backward: reshape_like
    const auto by_unsqueeze = tg::sum(xb * tg::unsqueeze<1>(sb));          // backward: squeeze
    check(tg::compile(by_reshape, tg::wrt(sb)), "reshape");
    check(tg::compile(by_unsqueeze, tg::wrt(sb)), "unsqueeze");
    const auto region = tg::autocast<tg::cpu_bf16>(by_reshape);
    check(tg::compile<tg::backward_autocast::off>(region, tg::wrt(sb)), "autocast, backward off");
    check(tg::compile(region, tg::wrt(sb)), "autocast, same_as_forward");
}
