// EXPECT: typegrad: params\(model\): the graph param Leaf named below has no member
// The graph reads "fc2.W"; the struct has no fc2.
#include <typegrad/typegrad.hpp>
#include <typegrad/train/params.hpp>

#include <vector>

namespace tg = typegrad;
struct layer {
    BOOST_HANA_DEFINE_STRUCT(layer, (std::vector<float>, W));
};
struct model {
    BOOST_HANA_DEFINE_STRUCT(model, (layer, fc1));
};
constexpr auto W1 = tg::param<"fc1.W", float, tg::shape<3>>;
constexpr auto W2 = tg::param<"fc2.W", float, tg::shape<3>>;

int main() {
    model m{{std::vector<float>(3)}};
    auto step = tg::compile(tg::sum(W1 * W2), tg::wrt(W1, W2));
    return int(tg::value_and_grad(step, tg::params(m)));
}
