// EXPECT: typegrad: grad_into[(]leaf, buffer[)] needs a buffer whose element type is the leaf's dtype
#include <typegrad/typegrad.hpp>
#include <vector>
namespace tg = typegrad;
int main() {
    constexpr auto x = tg::param<"x", float, tg::shape<3>>;
    std::vector<float> d(3);
    std::vector<double> g(3);
    tg::compile(tg::sum(x), tg::wrt(x)).value_and_grad(tg::bind(x, d), tg::grad_into(x, g));
}
