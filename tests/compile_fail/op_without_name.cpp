// EXPECT: typegrad: an op struct [(]Op, in the note below[)] lacks `static constexpr const char[*] name`
// An op struct (what a new op family defines, ops/op_base.hpp) that forgets its name: make_node
// names the missing member of the op protocol before the node type is formed.
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
struct unnamed_op : tg::detail::elementwise_op {
    template <class V>
    static V apply(const V& x) { return x; }
};
int main() {
    constexpr auto x = tg::param<"x", float, tg::shape<3>>;
    auto y = tg::detail::make_node<unnamed_op>(x);
    (void)y;
}
