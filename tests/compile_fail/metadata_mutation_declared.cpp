// EXPECT: typegrad: custom<Op>: backward_mutates declares a metadata mutation
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
struct resizes_input {
    static constexpr auto backward_mutates = tg::mutates(tg::metadata<0>);
    template <class Ctx> static void forward(Ctx&) {}
    template <class Ctx> static void backward(Ctx&) {}
};
int main() {
    constexpr auto x = tg::param<"x", float, tg::shape<3>>;
    auto e = tg::custom<resizes_input>(x);
    (void)e;
}
