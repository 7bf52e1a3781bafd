// EXPECT: typegrad: scaled_dot_product_attention[(]q, k, v[)] needs q's and k's last extents [(]d[)] to be equal
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
int main() {
    constexpr auto q = tg::param<"q", float, tg::shape<tg::dyn, 8>>;
    constexpr auto k = tg::param<"k", float, tg::shape<tg::dyn, 4>>;
    constexpr auto v = tg::param<"v", float, tg::shape<tg::dyn, 4>>;
    auto step = tg::compile(tg::sum(tg::scaled_dot_product_attention(q, k, v, tg::causal)), tg::wrt(q, k, v));
    (void)step;
}
