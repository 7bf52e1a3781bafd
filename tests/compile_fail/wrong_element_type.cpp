// EXPECT: typegrad: bind[(]leaf, buffer[)] needs a buffer whose element type is the leaf's dtype
#include <typegrad/typegrad.hpp>
#include <vector>
namespace tg = typegrad;
int main() {
    constexpr auto x = tg::param<"x", float, tg::shape<3>>;
    std::vector<double> a(3);
    auto step = tg::compile(tg::sum(x), tg::wrt(x));
    step.value_and_grad(tg::bind(x, a));
}
