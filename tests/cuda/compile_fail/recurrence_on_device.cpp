// EXPECT: typegrad: cuda: linear_recurrence/cumsum have no device kernel yet
#include <typegrad/cuda.hpp>

namespace tg = typegrad;

int main() {
    constexpr auto x = tg::param<"x", float, tg::shape<4, 16>>;
    auto step = tg::compile(tg::sum(tg::square(tg::cumsum<1>(x))), tg::wrt(x));
    (void)tg::cuda::generated_source(step);
}
