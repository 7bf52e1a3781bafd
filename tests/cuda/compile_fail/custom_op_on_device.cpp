// EXPECT: typegrad: cuda: a custom op \(tg::custom\) of this graph has no device implementation
#include <typegrad/cuda.hpp>

namespace tg = typegrad;

struct twice {
    template <class Ctx>
    static void forward(Ctx& ctx) {
        auto out = ctx.output();
        auto [x] = ctx.inputs();
        for (std::size_t i = 0; i < out.size(); ++i) out[i] = 2 * x[i];
    }
    template <class Ctx>
    static void backward(Ctx& ctx) {
        auto g = ctx.grad_output();
        auto [gx] = ctx.grad_inputs();
        for (std::size_t i = 0; i < g.size(); ++i) gx[i] = 2 * g[i];
    }
};

int main() {
    constexpr auto x = tg::param<"x", float, tg::shape<4>>;
    auto step = tg::compile(tg::sum(tg::custom<twice>(x)), tg::wrt(x));
    (void)tg::cuda::generated_source(step);
}
