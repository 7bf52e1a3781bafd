// EXPECT: typegrad: grad[(]loss, leaf[)] needs a scalar loss
#include <typegrad/typegrad.hpp>
namespace tg = typegrad;
constexpr auto v = tg::param<"v", float, tg::shape<3>>;
using G = tg::grad_t<decltype(tg::exp(v)), decltype(v)>;
int main() { G g; (void)g; }
