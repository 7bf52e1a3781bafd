// EXPECT: typegrad: autocast_spec<Device, ...> names an unknown device
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
struct tpu {};
constexpr auto x = tg::param<"x", float, tg::shape<2, 2>>;
auto step = tg::compile<tg::backward_autocast::custom<tg::autocast_spec<tpu, tg::bf16>>>(tg::sum(tg::matmul(x, x)), tg::wrt(x));
int main() {}
