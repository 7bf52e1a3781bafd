// EXPECT: typegrad: post_accumulate_grad_hook[(]p, f[)]: f must return void
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
int main() {
    constexpr auto p = tg::param<"p", float, tg::shape<3>>;
    auto e = tg::post_accumulate_grad_hook(p, [](tg::grad_view<float>, tg::grad_view<float>) { return 1; });
    (void)e;
}
