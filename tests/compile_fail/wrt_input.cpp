// EXPECT: typegrad: wrt[(][.][.][.][)] got a tg::input
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
int main() {
    constexpr auto x = tg::input<"x", float, tg::shape<3>>;
    auto step = tg::compile(tg::sum(x), tg::wrt(x));
    (void)step;
}
