// EXPECT: typegrad: a custom op may not transpose_ a tensor
#include <typegrad/typegrad.hpp>
#include <vector>
namespace tg = typegrad;
struct bad_op {
    static constexpr auto backward_mutates = tg::mutates(tg::grad_output_data);
    template <class Ctx> static void forward(Ctx& ctx) {
        auto [x] = ctx.inputs();
        auto y = ctx.output();
        for (std::size_t i = 0; i < y.size(); ++i) y[i] = x[i];
    }
    template <class Ctx> static void backward(Ctx& ctx) {
        ctx.grad_output().transpose_(0, 1);  // metadata change of the (writable) grad-output view
    }
};
int main() {
    constexpr auto x = tg::param<"x", float, tg::shape<3>>;
    std::vector<float> d(3), g(3);
    tg::compile(tg::sum(tg::custom<bad_op>(x)), tg::wrt(x)).value_and_grad(tg::bind(x, d), tg::grad_into(x, g));
}
