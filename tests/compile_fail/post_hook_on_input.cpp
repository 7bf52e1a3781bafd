// EXPECT: typegrad: post_accumulate_grad_hook[(]p, f[)] takes a tg::param, and p is a tg::input
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
int main() {
    constexpr auto x = tg::input<"x", float, tg::shape<3>>;
    auto e = tg::post_accumulate_grad_hook(x, [](tg::grad_view<float>, tg::grad_view<float>) {});
    (void)e;
}
