// EXPECT: typegrad: a custom op may not as_strided_ a tensor
#include <typegrad/typegrad.hpp>
#include <array>
#include <vector>
namespace tg = typegrad;
struct bad_op {
    static constexpr auto backward_mutates = tg::mutates(tg::data<0>);
    template <class Ctx> static void forward(Ctx& ctx) {
        auto [x] = ctx.inputs();
        auto y = ctx.output();
        for (std::size_t i = 0; i < y.size(); ++i) y[i] = x[i];
    }
    template <class Ctx> static void backward(Ctx& ctx) {
        auto [x] = ctx.inputs();
        x.as_strided_(std::array<std::size_t, 2>{1, 3}, std::array<std::size_t, 2>{3, 1});  // size, stride
    }
};
int main() {
    constexpr auto x = tg::param<"x", float, tg::shape<3>>;
    std::vector<float> d(3), g(3);
    tg::compile(tg::sum(tg::custom<bad_op>(x)), tg::wrt(x)).value_and_grad(tg::bind(x, d), tg::grad_into(x, g));
}
