// EXPECT: typegrad: a tg::bind\(...\) names a leaf that the compiled graph does not use
#include <typegrad/typegrad.hpp>
#include <vector>
namespace tg = typegrad;
int main() {
    constexpr auto x = tg::param<"x", double, tg::shape<3>>;
    constexpr auto u = tg::input<"u", double, tg::shape<4, 1>>;
    std::vector<double> xd{1, 2, 3}, ud{1, 2, 3, 4}, g(3);
    tg::compile(tg::sum(tg::square(x)), tg::wrt(x)).value_and_grad(tg::bind(x, xd), tg::bind(u, ud), tg::grad_into(x, g));
}
