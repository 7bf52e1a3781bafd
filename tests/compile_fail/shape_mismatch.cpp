// EXPECT: typegrad: operator[+][(]a, b[)] needs broadcastable shapes
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
int main() {
    constexpr auto a = tg::param<"a", float, tg::shape<4, 3>>;
    constexpr auto b = tg::param<"b", float, tg::shape<4>>;
    auto bad = a + b;
    (void)bad;
}
