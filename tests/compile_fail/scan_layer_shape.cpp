// EXPECT: typegrad: scan: the layer's result shape differs from the carried leaf's
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
int main() {
    constexpr auto h = tg::param<"h", float, tg::shape<tg::dyn, 4>>;
    constexpr auto W = tg::param<"W", float, tg::shape<4, 8>>;  // maps a [n, 4] carry to [n, 8]
    constexpr auto Ws = tg::param<"Ws", float, tg::shape<3, 4, 8>>;
    constexpr auto x = tg::input<"x", float, tg::shape<tg::dyn, 4>>;
    auto out = tg::scan(tg::tanh(tg::matmul(h, W)), tg::carry(h, x), tg::stacked(W, Ws));
    (void)tg::compile(tg::sum(out), tg::wrt(Ws));
}
