// EXPECT: typegrad: an op struct [(]Op, in the note below[)] lacks its shape and dtype rule
// A kernel op struct without its rule<Inputs...> (the result's dtype and shape): make_node says
// so before the node type, which reads the rule, is formed.
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
struct ruleless_op : tg::detail::kernel_op_base {
    static constexpr const char* name = "ruleless";
};
int main() {
    constexpr auto x = tg::param<"x", float, tg::shape<3>>;
    auto y = tg::detail::make_node<ruleless_op>(x);
    (void)y;
}
