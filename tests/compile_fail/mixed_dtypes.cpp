// EXPECT: typegrad: an elementwise op mixes double with float, bf16 or f16 operands
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
int main() {
    constexpr auto x = tg::param<"x", float, tg::shape<3>>;
    constexpr auto y = tg::param<"y", double, tg::shape<3>>;
    auto e = x * y;
    (void)e;
}
