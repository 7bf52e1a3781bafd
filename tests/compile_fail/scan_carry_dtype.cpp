// EXPECT: typegrad: scan: the initial carry's dtype differs from the carried leaf's
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
int main() {
    constexpr auto h = tg::param<"h", double, tg::shape<tg::dyn, 4>>;
    constexpr auto W = tg::param<"W", double, tg::shape<4, 4>>;
    constexpr auto Ws = tg::param<"Ws", double, tg::shape<3, 4, 4>>;
    constexpr auto x = tg::input<"x", float, tg::shape<tg::dyn, 4>>;  // float, the carry is double
    auto out = tg::scan(tg::tanh(tg::matmul(h, W)), tg::carry(h, x), tg::stacked(W, Ws));
    (void)tg::compile(tg::sum(out), tg::wrt(Ws));
}
