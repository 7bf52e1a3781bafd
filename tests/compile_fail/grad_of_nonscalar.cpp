// EXPECT: typegrad: value_and_grad[(][.][.][.][)] needs a scalar loss
#include <typegrad/typegrad.hpp>
#include <vector>
namespace tg = typegrad;
int main() {
    constexpr auto v = tg::param<"v", float, tg::shape<3>>;
    std::vector<float> d(3), g(3);
    auto step = tg::compile(tg::exp(v), tg::wrt(v));
    step.value_and_grad(tg::bind(v, d), tg::grad_into(v, g));
}
