// EXPECT: typegrad: linear_recurrence<axis>[(]a, b[)] names an axis b does not have
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
int main() {
    // b is [4, 8]: axis 2 does not exist
    constexpr auto a = tg::param<"a", float>;
    constexpr auto b = tg::param<"b", float, tg::shape<4, 8>>;
    auto step = tg::compile(tg::sum(tg::linear_recurrence<2>(a, b)), tg::wrt(a, b));
    (void)step;
}
