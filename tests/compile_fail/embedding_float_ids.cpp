// EXPECT: typegrad: embedding[(]ids, table[)] takes integer ids
#include <typegrad/typegrad.hpp>

namespace tg = typegrad;

int main() {
    constexpr auto ids = tg::input<"ids", float, tg::shape<3>>;
    constexpr auto table = tg::param<"table", float, tg::shape<5, 4>>;
    auto step = tg::compile(tg::sum(tg::embedding(ids, table)), tg::wrt(table));
    (void)step;
}
