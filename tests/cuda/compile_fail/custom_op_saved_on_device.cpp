// EXPECT: typegrad: cuda: a custom op with saved values or declared mutations runs on the host only
#include <typegrad/cuda.hpp>

namespace tg = typegrad;

// Device bodies are given, but the op keeps saved values (a host struct): host only.
struct scale_saved {
    struct saved_type { float factor; };
    template <class Ctx>
    static void forward(Ctx& ctx) {
        auto out = ctx.output();
        auto [x] = ctx.inputs();
        ctx.saved().factor = 2;
        for (std::size_t i = 0; i < out.size(); ++i) out[i] = 2 * x[i];
    }
    template <class Ctx>
    static void backward(Ctx& ctx) {
        auto g = ctx.grad_output();
        auto [gx] = ctx.grad_inputs();
        for (std::size_t i = 0; i < g.size(); ++i) gx[i] = ctx.saved().factor * g[i];
    }
    static constexpr const char* device_forward = "for (tg_i64 i = tg_thread; i < n; i += tg_threads) out[i] = 2 * in0[i];";
    static constexpr const char* device_backward = "for (tg_i64 i = tg_thread; i < n; i += tg_threads) grad_in0[i] = 2 * grad_out[i];";
};

int main() {
    constexpr auto x = tg::param<"x", float, tg::shape<4>>;
    auto step = tg::compile(tg::sum(tg::custom<scale_saved>(x)), tg::wrt(x));
    (void)tg::cuda::generated_source(step);
}
