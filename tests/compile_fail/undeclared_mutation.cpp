// EXPECT: (assignment of read-only|cannot assign to return value|read-only variable is not assignable|read-only location)
#include <typegrad/typegrad.hpp>
#include <vector>
namespace tg = typegrad;
struct sneaky {
    template <class Ctx> static void forward(Ctx& ctx) {
        auto [x] = ctx.inputs();
        auto y = ctx.output();
        for (std::size_t i = 0; i < y.size(); ++i) y[i] = x[i];
    }
    template <class Ctx> static void backward(Ctx& ctx) {
        auto [x] = ctx.inputs();
        x[0] = 1;  // not declared in backward_mutates: a read-only view
    }
};
int main() {
    constexpr auto x = tg::param<"x", float, tg::shape<3>>;
    std::vector<float> d(3), g(3);
    tg::compile(tg::sum(tg::custom<sneaky>(x)), tg::wrt(x)).value_and_grad(tg::bind(x, d), tg::grad_into(x, g));
}
