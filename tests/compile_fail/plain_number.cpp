// EXPECT: typegrad: operator[*][(]expression, number[)] got a plain number
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
int main() {
    constexpr auto x = tg::param<"x", float, tg::shape<3>>;
    auto e = x * 2.0;
    (void)e;
}
