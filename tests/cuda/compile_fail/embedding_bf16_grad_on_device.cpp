// EXPECT: typegrad: cuda: the backward of embedding into a bf16/f16 gradient has no device kernel yet
#include <typegrad/cuda.hpp>

#include <cstdint>

namespace tg = typegrad;

int main() {
    constexpr auto ids = tg::input<"ids", std::int64_t, tg::shape<3>>;
    constexpr auto table = tg::param<"table", tg::bf16, tg::shape<5, 4>>;
    auto step = tg::compile(tg::sum(tg::cast<float>(tg::embedding(ids, table))), tg::wrt(table));
    (void)tg::cuda::generated_source(step);
}
