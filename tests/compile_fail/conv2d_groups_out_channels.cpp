// EXPECT: typegrad: conv2d[(]x, w[)] needs w's out-channel extent [(]axis 0[)] to be a multiple of groups
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
int main() {
    // 5 output channels cannot be split into 2 groups
    constexpr auto x = tg::input<"x", float, tg::shape<tg::dyn, 4, 8, 8>>;
    constexpr auto w = tg::param<"w", float, tg::shape<5, 2, 3, 3>>;
    auto step = tg::compile(tg::sum(tg::conv2d<1, 0, 1, 2>(x, w)), tg::wrt(w));
    (void)step;
}
