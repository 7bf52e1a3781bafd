// Least squares by gradient descent: fit y = a*x + b to noisy samples of y = 3x - 2.
#include <typegrad/typegrad.hpp>

#include <array>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace tg = typegrad;

// Leaves are named, typed and shaped; x and y have a run-time length.
constexpr auto a = tg::param<"a", double>;
constexpr auto b = tg::param<"b", double>;
constexpr auto x = tg::input<"x", double, tg::shape<tg::dyn>>;
constexpr auto y = tg::input<"y", double, tg::shape<tg::dyn>>;

// The parameters as one struct: members bind the params of the same name.
struct line {
    BOOST_HANA_DEFINE_STRUCT(line, (std::array<double, 1>, a), (std::array<double, 1>, b));
};

int main() {
    const std::size_t n = 1000;
    std::mt19937 rng(42);
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    std::normal_distribution<double> noise(0.0, 0.1);
    std::vector<double> xd(n), yd(n);
    for (std::size_t i = 0; i < n; ++i) {
        xd[i] = u(rng);
        yd[i] = 3.0 * xd[i] - 2.0 + noise(rng);
    }

    // The loss is a type; compile() derives its gradient at compile time.
    auto loss = tg::mean(tg::square(a * x + b - y));
    auto step = tg::compile(loss, tg::wrt(a, b));

    line params{}, grads{};
    tg::sgd opt(params, {.lr = 0.5});
    double first = 0.0, last = 0.0;
    for (int it = 0; it <= 100; ++it) {
        last = tg::value_and_grad(step, tg::bind(x, xd), tg::bind(y, yd), tg::params(params), tg::grads_into(grads));
        if (it == 0) first = last;
        if (it % 10 == 0) std::printf("step %3d  loss %.6f  a %.4f  b %.4f\n", it, last, params.a[0], params.b[0]);
        opt.step(params, grads);
    }
    const double av = params.a[0], bv = params.b[0];
    std::printf("fitted y = %.3f x %+.3f (true: 3x - 2)\n", av, bv);
    // The example is a test: it must have converged.
    const bool ok = last < 0.02 && last < first && std::abs(av - 3.0) < 0.05 && std::abs(bv + 2.0) < 0.05;
    return ok ? 0 : 1;
}
