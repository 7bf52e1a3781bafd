// EXPECT: typegrad: the fused scaled_dot_product_attention's backward is not differentiable [(]grad of grad[)]; pass tg::attention_math
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
int main() {
    constexpr auto q = tg::param<"q", double, tg::shape<3, 2>>;
    constexpr auto k = tg::param<"k", double, tg::shape<4, 2>>;
    constexpr auto v = tg::param<"v", double, tg::shape<4, 2>>;
    auto inner = tg::sum(tg::square(tg::scaled_dot_product_attention(q, k, v, tg::causal)));
    auto second = tg::grad(tg::sum(tg::square(tg::grad(inner, q))), k);  // grad of grad through the fused backward
    (void)second;
}
