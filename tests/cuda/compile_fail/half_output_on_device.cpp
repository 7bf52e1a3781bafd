// EXPECT: typegrad: cuda: this step's output is bf16/f16
#include <typegrad/cuda.hpp>

namespace tg = typegrad;

constexpr auto x = tg::param<"x", tg::bf16, tg::shape<4>>;

int main() {
    auto step = tg::compile(tg::exp(x), tg::wrt(x));
    tg::cuda::tensor<tg::bf16, tg::shape<4>> dx;
    (void)step.forward(tg::bind(x, dx));
}
