// EXPECT: typegrad: conv2d[(]x, w[)]: the [(]dilated[)] kernel is larger than the padded input
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
int main() {
    // a 3 x 3 kernel with dilation 4 spans 9 x 9 pixels; the input is 8 x 8
    constexpr auto x = tg::input<"x", float, tg::shape<tg::dyn, 2, 8, 8>>;
    constexpr auto w = tg::param<"w", float, tg::shape<4, 2, 3, 3>>;
    auto step = tg::compile(tg::sum(tg::conv2d<1, 0, 4>(x, w)), tg::wrt(w));
    (void)step;
}
