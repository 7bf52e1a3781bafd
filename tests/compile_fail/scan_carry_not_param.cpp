// EXPECT: typegrad: scan: the carried leaf of tg::carry\(leaf, initial\) must be a leaf declared with tg::param
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
int main() {
    constexpr auto h = tg::input<"h", float, tg::shape<tg::dyn, 4>>;  // tg::input: no gradient
    constexpr auto W = tg::param<"W", float, tg::shape<4, 4>>;
    constexpr auto Ws = tg::param<"Ws", float, tg::shape<3, 4, 4>>;
    constexpr auto x = tg::input<"x", float, tg::shape<tg::dyn, 4>>;
    auto out = tg::scan(tg::tanh(tg::matmul(h, W)), tg::carry(h, x), tg::stacked(W, Ws));
    (void)tg::compile(tg::sum(out), tg::wrt(Ws));
}
