// EXPECT: typegrad: the call has no tg::bind[(][.][.][.][)] for a leaf that the graph reads
#include <typegrad/typegrad.hpp>
#include <vector>
namespace tg = typegrad;
int main() {
    constexpr auto x = tg::param<"x", float, tg::shape<3>>;
    constexpr auto y = tg::input<"y", float, tg::shape<3>>;
    std::vector<float> a(3), g(3);
    auto step = tg::compile(tg::sum(x * y), tg::wrt(x));
    step.value_and_grad(tg::bind(x, a), tg::grad_into(x, g));
}
