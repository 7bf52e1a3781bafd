// EXPECT: typegrad: causal_mask[(]x[)] masks the last two axes of x; x has fewer than two
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
int main() {
    constexpr auto x = tg::param<"x", float, tg::shape<5>>;
    auto step = tg::compile(tg::sum(tg::exp(tg::causal_mask(x))), tg::wrt(x));
    (void)step;
}
