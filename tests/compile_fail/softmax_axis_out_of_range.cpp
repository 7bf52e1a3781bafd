// EXPECT: typegrad: softmax[(]x, tg::axes<a>[)] names an axis x does not have
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
int main() {
    constexpr auto x = tg::param<"x", float, tg::shape<2, 3>>;
    auto e = tg::softmax(x, tg::axes<2>);
    (void)e;
}
