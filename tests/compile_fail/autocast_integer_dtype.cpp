// EXPECT: typegrad: autocast_spec<Device, DType> needs a floating autocast dtype
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
constexpr auto x = tg::param<"x", float, tg::shape<2, 2>>;
auto y = tg::autocast<tg::autocast_spec<tg::cpu, int>>(tg::matmul(x, x));
int main() {}
