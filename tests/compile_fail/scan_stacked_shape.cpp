// EXPECT: typegrad: scan: a stacked param's shape is not \[L, the per-layer leaf's shape
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
int main() {
    constexpr auto h = tg::param<"h", float, tg::shape<tg::dyn, 4>>;
    constexpr auto W = tg::param<"W", float, tg::shape<4, 4>>;
    constexpr auto Ws = tg::param<"Ws", float, tg::shape<3, 4, 5>>;  // should be [3, 4, 4]
    constexpr auto x = tg::input<"x", float, tg::shape<tg::dyn, 4>>;
    auto out = tg::scan(tg::tanh(tg::matmul(h, W)), tg::carry(h, x), tg::stacked(W, Ws));
    (void)tg::compile(tg::sum(out), tg::wrt(Ws));
}
