// EXPECT: typegrad: reshape<shape>[(]x[)] needs the same number of elements as x
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
int main() {
    constexpr auto a = tg::param<"a", float, tg::shape<2, 3>>;
    auto e = tg::reshape<tg::shape<4, 2>>(a);
    (void)e;
}
