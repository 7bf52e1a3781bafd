// EXPECT: typegrad: params\(model\) / grads_into\(grads\): the buffer member named below \(Member\) is not a param
// The struct has fc1.b; the graph never reads a param named "fc1.b".
#include <typegrad/typegrad.hpp>
#include <typegrad/train/params.hpp>

#include <vector>

namespace tg = typegrad;
struct layer {
    BOOST_HANA_DEFINE_STRUCT(layer, (std::vector<float>, W), (std::vector<float>, b));
};
struct model {
    BOOST_HANA_DEFINE_STRUCT(model, (layer, fc1));
};
constexpr auto W1 = tg::param<"fc1.W", float, tg::shape<3>>;

int main() {
    model m{{std::vector<float>(3), std::vector<float>(3)}};
    auto step = tg::compile(tg::sum(W1 * W1), tg::wrt(W1));
    return int(tg::value_and_grad(step, tg::params(m)));
}
