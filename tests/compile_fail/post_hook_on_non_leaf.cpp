// EXPECT: typegrad: post_accumulate_grad_hook[(]p, f[)] takes a tg::param, and p is not a leaf
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
int main() {
    constexpr auto p = tg::param<"p", float, tg::shape<3>>;
    // PyTorch: "post accumulate grad hooks cannot be registered on non-leaf tensors"
    auto e = tg::post_accumulate_grad_hook(tg::exp(p), [](tg::grad_view<float>, tg::grad_view<float>) {});
    (void)e;
}
