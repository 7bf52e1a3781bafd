// EXPECT: typegrad: matmul[(]a, b[)] needs a's last extent to equal b's second-to-last extent
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
int main() {
    constexpr auto a = tg::param<"a", float, tg::shape<2, 3>>;
    constexpr auto b = tg::param<"b", float, tg::shape<4, 5>>;
    auto e = tg::matmul(a, b);
    (void)e;
}
