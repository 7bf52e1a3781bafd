// EXPECT: typegrad: sum[(]x, tg::axes<...>[)] names an axis x does not have
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
int main() {
    constexpr auto a = tg::param<"a", float, tg::shape<2, 3>>;
    auto e = tg::sum(a, tg::axes<2>);
    (void)e;
}
