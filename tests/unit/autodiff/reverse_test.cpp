// The reverse pass (autodiff/reverse.hpp): shared subexpressions accumulate their adjoints, and
// tg::grad is differentiable again (Hessian-vector products).
#include <check_gradient.hpp>

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
