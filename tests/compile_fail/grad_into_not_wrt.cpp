// EXPECT: typegrad: grad_into[(]leaf, buffer[)] names a leaf that is not in the step's tg::wrt
#include <typegrad/typegrad.hpp>
#include <vector>
namespace tg = typegrad;
int main() {
    constexpr auto x = tg::param<"x", float, tg::shape<3>>;
    constexpr auto y = tg::param<"y", float, tg::shape<3>>;
    std::vector<float> a(3), b(3), g(3);
    auto step = tg::compile(tg::sum(x * y), tg::wrt(x));
    step.value_and_grad(tg::bind(x, a), tg::bind(y, b), tg::grad_into(y, g));
}
