// EXPECT: typegrad: differentiating through a custom op's backward [(]grad of grad, create_graph[)] that mutates an input which requires grad
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
struct doubles_input {
    static constexpr auto backward_mutates = tg::mutates(tg::data<0>);
    template <class Ctx> static void forward(Ctx&) {}
    template <class Ctx> static void backward(Ctx&) {}
};
int main() {
    constexpr auto x = tg::param<"x", float, tg::shape<3>>;
    auto f = tg::sum(tg::custom<doubles_input>(x) * x);
    auto second = tg::grad(tg::sum(tg::grad(f, x)), x);  // grad of grad through the mutating backward
    (void)second;
}
