// EXPECT: typegrad: conv2d[(]x, w[)] needs x's channel extent [(]axis 1[)] to equal w's in-channel extent
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
int main() {
    constexpr auto x = tg::input<"x", float, tg::shape<tg::dyn, 3, 8, 8>>;
    constexpr auto w = tg::param<"w", float, tg::shape<4, 2, 3, 3>>;
    auto step = tg::compile(tg::sum(tg::conv2d(x, w)), tg::wrt(w));
    (void)step;
}
