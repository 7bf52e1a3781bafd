// EXPECT: typegrad: scaled_dot_product_attention[(]q, k, v[)] takes its default scale 1/sqrt[(]d[)] from q's static last extent
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
int main() {
    constexpr auto q = tg::param<"q", float, tg::shape<4, tg::dyn>>;
    auto step = tg::compile(tg::sum(tg::scaled_dot_product_attention(q, q, q)), tg::wrt(q));
    (void)step;
}
