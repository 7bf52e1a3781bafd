// EXPECT: typegrad: cuda: conv1d/conv2d have no device kernel yet
#include <typegrad/cuda.hpp>

namespace tg = typegrad;

int main() {
    constexpr auto x = tg::input<"x", float, tg::shape<2, 3, 8, 8>>;
    constexpr auto w = tg::param<"w", float, tg::shape<4, 3, 3, 3>>;
    auto step = tg::compile(tg::sum(tg::conv2d<1, 1>(x, w)), tg::wrt(w));
    (void)tg::cuda::generated_source(step);
}
