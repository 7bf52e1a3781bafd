#pragma once
// PyTorch's special values in tests: infinities and NaN in float, and a comparison that tells NaN,
// signed zeros and infinities apart (forward values in float: values_of<float>, check_gradient.hpp).
#include <cmath>
#include <limits>

namespace typegrad::testing {

inline constexpr float inf = std::numeric_limits<float>::infinity();
inline constexpr float qnan = std::numeric_limits<float>::quiet_NaN();

// Same value, with NaN equal to NaN and the sign of zeros and infinities compared.
inline bool same_special(float got, double want) {
    if (std::isnan(want)) return std::isnan(got);
    if (std::isinf(want) || want == 0) return double(got) == want && std::signbit(got) == std::signbit(want);
    // exp(y log|x|) in float: |y log x| ulps of error at most, and subnormals are coarse
    return std::abs(got - want) <= 1e-5 * std::abs(want) + 2 * std::numeric_limits<float>::denorm_min();
}

}  // namespace typegrad::testing
