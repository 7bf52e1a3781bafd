// EXPECT: typegrad: cuda: a cast from f64 to bf16/f16 has no device kernel yet
#include <typegrad/cuda.hpp>

namespace tg = typegrad;

// The CPU rounds f64 to bf16 once, directly; the device would round twice (through float).
int main() {
    constexpr auto x = tg::param<"x", double, tg::shape<4>>;
    auto step = tg::compile(tg::sum(tg::cast<float>(tg::cast<tg::bf16>(x))), tg::wrt(x));
    (void)tg::cuda::generated_source(step);
}
