// EXPECT: typegrad: cuda: embedding has no device kernel yet
#include <typegrad/cuda.hpp>

#include <cstdint>

namespace tg = typegrad;

int main() {
    constexpr auto ids = tg::input<"ids", std::int64_t, tg::shape<3>>;
    constexpr auto table = tg::param<"table", float, tg::shape<5, 4>>;
    auto step = tg::compile(tg::sum(tg::embedding(ids, table)), tg::wrt(table));
    (void)tg::cuda::generated_source(step);
}
