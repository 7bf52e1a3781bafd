// EXPECT: typegrad: cuda: detect_anomaly checks values on the host
#include <typegrad/cuda.hpp>

namespace tg = typegrad;

constexpr auto x = tg::param<"x", float, tg::shape<4>>;

int main() {
    auto step = tg::compile<tg::detect_anomaly>(tg::sum(tg::exp(x)), tg::wrt(x));
    tg::cuda::tensor<float, tg::shape<4>> dx, dg;
    (void)step.value_and_grad(tg::bind(x, dx), tg::grad_into(x, dg));
}
