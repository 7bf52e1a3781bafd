// EXPECT: typegrad: params\(model\) / grads_into\(grads\): the member bound to the param Leaf named below holds MemberValue elements
// W is a float param; the member holds doubles.
#include <typegrad/typegrad.hpp>
#include <typegrad/train/params.hpp>

#include <vector>

namespace tg = typegrad;
struct model {
    BOOST_HANA_DEFINE_STRUCT(model, (std::vector<double>, W));
};
constexpr auto W = tg::param<"W", float, tg::shape<3>>;

int main() {
    model m{std::vector<double>(3)};
    auto step = tg::compile(tg::sum(W * W), tg::wrt(W));
    return int(tg::value_and_grad(step, tg::params(m)));
}
