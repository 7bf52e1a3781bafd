// EXPECT: typegrad: a kernel op struct lacks its CPU routine
// A kernel op struct with its rule and extents but no run(in, out, ext): the members that take the
// node are checked where the CPU executor first calls them, with a sentence naming the member.
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
struct runless_op : tg::detail::kernel_op_base {
    static constexpr const char* name = "runless";
    template <class X>
    struct rule {
        using value_type = typename X::value_type;
        using shape_type = typename X::shape_type;
    };
    template <class N, class Ref>
    static void extents(const Ref* in, std::size_t* ext) {
        for (std::size_t a = 0; a < in[0].rank; ++a) ext[a] = in[0].ext[a];
    }
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X) { return g; }
};
int main() {
    constexpr auto x = tg::param<"x", float, tg::shape<3>>;
    auto step = tg::compile(tg::sum(tg::detail::make_node<runless_op>(x)), tg::wrt(x));
    float xv[3] = {1, 2, 3}, gx[3] = {};
    (void)step.value_and_grad(tg::bind(x, xv), tg::grad_into(x, gx));
}
