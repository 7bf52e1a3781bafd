// EXPECT: typegrad: scan: the layer reads a per-layer leaf with no stacked counterpart
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
int main() {
    constexpr auto h = tg::param<"h", float, tg::shape<tg::dyn, 4>>;
    constexpr auto W = tg::param<"W", float, tg::shape<4, 4>>;
    constexpr auto b = tg::param<"b", float, tg::shape<4>>;  // read by the layer, never stacked
    constexpr auto Ws = tg::param<"Ws", float, tg::shape<3, 4, 4>>;
    constexpr auto x = tg::input<"x", float, tg::shape<tg::dyn, 4>>;
    auto out = tg::scan(tg::tanh(tg::matmul(h, W) + b), tg::carry(h, x), tg::stacked(W, Ws));
    (void)tg::compile(tg::sum(out), tg::wrt(Ws));
}
