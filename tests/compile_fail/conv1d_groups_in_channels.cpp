// EXPECT: typegrad: conv1d[(]x, w[)] needs x's channel extent [(]axis 1[)] to equal w's in-channel extent [(]axis 1[)] times groups
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
int main() {
    // 6 channels in 2 groups are 3 per group, but w takes 6 (the groups=1 shape)
    constexpr auto x = tg::input<"x", float, tg::shape<tg::dyn, 6, 16>>;
    constexpr auto w = tg::param<"w", float, tg::shape<4, 6, 3>>;
    auto step = tg::compile(tg::sum(tg::conv1d<1, 1, 1, 2>(x, w)), tg::wrt(w));
    (void)step;
}
