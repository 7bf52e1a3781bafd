// EXPECT: typegrad: a leaf is bound twice in one call
#include <typegrad/typegrad.hpp>
#include <vector>
namespace tg = typegrad;
int main() {
    constexpr auto x = tg::param<"x", float, tg::shape<3>>;
    std::vector<float> a(3), b(3);
    auto step = tg::compile(tg::sum(x), tg::wrt(x));
    step.value_and_grad(tg::bind(x, a), tg::bind(x, b));
}
