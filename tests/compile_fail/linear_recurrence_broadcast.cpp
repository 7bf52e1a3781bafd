// EXPECT: typegrad: linear_recurrence<axis>[(]a, b[)] needs a's shape to broadcast to b's
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
int main() {
    // a decay per row [4] does not broadcast against [4, 8] (right-aligned: 4 against 8)
    constexpr auto a = tg::param<"a", float, tg::shape<4>>;
    constexpr auto b = tg::param<"b", float, tg::shape<4, 8>>;
    auto step = tg::compile(tg::sum(tg::linear_recurrence<1>(a, b)), tg::wrt(a, b));
    (void)step;
}
