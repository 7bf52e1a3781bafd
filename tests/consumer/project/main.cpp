// A consumer of the installed package: value and gradient of sum(exp(x) * y).
#include <typegrad/typegrad.hpp>

#include <typegrad/version.hpp>

#include <cmath>
#include <cstring>
#include <cstdio>
#include <vector>

namespace tg = typegrad;
constexpr auto x = tg::param<"x", double, tg::shape<tg::dyn>>;
constexpr auto y = tg::input<"y", double, tg::shape<tg::dyn>>;

int main() {
#ifdef TYPEGRAD_EXPECTED_VERSION
    if (std::strcmp(TYPEGRAD_VERSION_STRING, TYPEGRAD_EXPECTED_VERSION) != 0) {
        std::printf("version.hpp says %s, the package %s\n", TYPEGRAD_VERSION_STRING, TYPEGRAD_EXPECTED_VERSION);
        return 1;
    }
#endif
    std::vector<double> xd{0.0, 1.0}, yd{2.0, 3.0}, gx(2);
    auto step = tg::compile(tg::sum(tg::exp(x) * y), tg::wrt(x));
    const double l = step.value_and_grad(tg::bind(x, xd), tg::bind(y, yd), tg::grad_into(x, gx));
    std::printf("loss %.6f grad %.6f %.6f\n", l, gx[0], gx[1]);
    const double e = std::exp(1.0);
    // log_sum_exp (exp, log and a horizontal max and sum) over float: 17 elements, a SIMD body
    // and a tail; all equal, so lse = log(17) and every gradient is 1/17
    constexpr auto z = tg::param<"z", float, tg::shape<tg::dyn>>;
    std::vector<float> zd(17, 0.f), gz(17);
    const float lz = tg::compile(tg::log_sum_exp(z), tg::wrt(z)).value_and_grad(tg::bind(z, zd), tg::grad_into(z, gz));
    std::printf("log_sum_exp %.6f grad %.6f\n", lz, gz[16]);
    return std::abs(l - (2 + 3 * e)) < 1e-12 && std::abs(gx[1] - 3 * e) < 1e-12 &&
                   std::abs(lz - std::log(17.f)) < 1e-6f && std::abs(gz[16] - 1 / 17.f) < 1e-6f
               ? 0
               : 1;
}
