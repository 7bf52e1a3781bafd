// EXPECT: typegrad: batch_norm[(]x, ...[)] needs the weight of shape [[]C[]], C being x's extent on axis 1
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
int main() {
    constexpr auto x = tg::param<"x", float, tg::shape<tg::dyn, 3, 4, 4>>;
    constexpr auto w = tg::param<"w", float, tg::shape<4>>;
    constexpr auto b = tg::param<"b", float, tg::shape<3>>;
    auto step = tg::compile(tg::sum(tg::batch_norm(x, w, b)), tg::wrt(x, w, b));
    (void)step;
}
