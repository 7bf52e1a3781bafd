// EXPECT: typegrad: cross_entropy/nll_loss take integer class labels
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
int main() {
    constexpr auto l = tg::param<"l", float, tg::shape<2, 3>>;
    constexpr auto y = tg::input<"y", float, tg::shape<2>>;
    auto e = tg::cross_entropy(l, y);
    (void)e;
}
