// EXPECT: typegrad: scan with more than three tg::stacked\(...\) params needs static stack shapes
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
int main() {
    constexpr auto h = tg::param<"h", float, tg::shape<tg::dyn, 4>>;
    constexpr auto A = tg::param<"A", float, tg::shape<4, 4>>;
    constexpr auto B = tg::param<"B", float, tg::shape<4, 4>>;
    constexpr auto C = tg::param<"C", float, tg::shape<4, 4>>;
    constexpr auto E = tg::param<"E", float, tg::shape<4>>;
    constexpr auto As = tg::param<"As", float, tg::shape<tg::dyn, 4, 4>>;  // four stacks, run-time L
    constexpr auto Bs = tg::param<"Bs", float, tg::shape<tg::dyn, 4, 4>>;
    constexpr auto Cs = tg::param<"Cs", float, tg::shape<tg::dyn, 4, 4>>;
    constexpr auto Es = tg::param<"Es", float, tg::shape<tg::dyn, 4>>;
    constexpr auto x = tg::input<"x", float, tg::shape<tg::dyn, 4>>;
    auto layer = tg::tanh(tg::matmul(tg::matmul(tg::matmul(h, A), B), C) + E);
    auto out = tg::scan(layer, tg::carry(h, x), tg::stacked(A, As), tg::stacked(B, Bs), tg::stacked(C, Cs),
                        tg::stacked(E, Es));
    (void)tg::compile(tg::sum(out), tg::wrt(As));
}
