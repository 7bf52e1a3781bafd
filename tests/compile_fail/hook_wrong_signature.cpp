// EXPECT: typegrad: hook[(]e, f[)]: f must map a gradient value to a value
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
int main() {
    constexpr auto x = tg::param<"x", float, tg::shape<3>>;
    auto e = tg::hook(x, [](int, int) { return 0; });
    (void)e;
}
