// EXPECT: typegrad: conv2d[(]x, w[)] needs x's channel extent [(]axis 1[)] to be a multiple of groups
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
int main() {
    // 6 channels cannot be split into 4 groups
    constexpr auto x = tg::input<"x", float, tg::shape<tg::dyn, 6, 8, 8>>;
    constexpr auto w = tg::param<"w", float, tg::shape<8, 2, 3, 3>>;
    auto step = tg::compile(tg::sum(tg::conv2d<1, 0, 1, 4>(x, w)), tg::wrt(w));
    (void)step;
}
