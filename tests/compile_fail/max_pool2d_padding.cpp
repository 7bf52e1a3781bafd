// EXPECT: typegrad: max_pool2d<kernel, stride, padding>[(]x[)] needs padding <= kernel / 2
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
int main() {
    constexpr auto x = tg::param<"x", float, tg::shape<1, 1, 8, 8>>;
    auto step = tg::compile(tg::sum(tg::max_pool2d<2, 2, 2>(x)), tg::wrt(x));
    (void)step;
}
