// EXPECT: typegrad: narrow<axis>[(]x, start, length[)] takes its length from an input [(]a tg::input or tg::param[)]
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
int main() {
    constexpr auto x = tg::param<"x", float, tg::shape<4, tg::dyn>>;
    constexpr auto start = tg::input<"start", std::int64_t, tg::shape<1>>;
    constexpr auto r = tg::input<"r", float, tg::shape<5>>;
    // a computed length would size a buffer from a value not known before the step runs
    auto y = tg::narrow<1>(x, start, tg::argmax(r, tg::axes<0>, tg::keepdim));
    (void)y;
}
