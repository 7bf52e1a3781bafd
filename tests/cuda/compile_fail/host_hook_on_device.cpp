// EXPECT: typegrad: cuda: an elementwise op of this graph has no device expression
#include <typegrad/cuda.hpp>

namespace tg = typegrad;

int main() {
    constexpr auto x = tg::param<"x", float, tg::shape<4>>;
    auto step = tg::compile(tg::sum(tg::square(tg::hook(x, [](auto g) { return g + 10; }))), tg::wrt(x));
    (void)tg::cuda::generated_source(step);
}
