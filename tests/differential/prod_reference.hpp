#pragma once
// The cases of a prod whose reference says nothing about typegrad's result (both harnesses).
#include <torch/torch.h>

#include <cmath>
#include <limits>

namespace typegrad_differential {

// A zero beside an inf or NaN factor: PyTorch's backward (exclusive cumulative products) gives
// the other factors 0 * inf = NaN where typegrad gives g * 0 (ops/reduce.hpp, docs/reliability.md).
inline bool prod_zero_beside_nonfinite(const torch::Tensor& x) {
    const auto v = x.detach();
    return (v == 0).any().item<bool>() && (~torch::isfinite(v)).any().item<bool>();
}

// Partial products that overflow or underflow in one order of the factors and not in another
// (1e306 * 709.5 overflows, 709.5 * -0.3 * 1e306 does not: graph 2220): the result is the
// order's. Bounded by the products of the large and of the small finite factors, in `dtype`.
// Small factors whose product reaches the subnormal range make the case ill-conditioned whatever
// the large ones: the product then keeps a few bits, and a gradient out / x or an exclusive
// product inherits that rounding (graph 2221, double: erf(h) = [-0.84, 0.51, -1.5e-323], grad h[2]
// -0.487 exactly, -0.511 in typegrad, -0.134 in LibTorch), or an infinite factor meets a partial
// product that underflowed to 0 in one order only (graph 2225, float: -inf beside three 1.4e-42,
// NaN against -inf).
inline bool prod_order_sensitive(const torch::Tensor& x, torch::ScalarType dtype) {
    const auto a = x.detach().abs().to(torch::kFloat64);
    const auto finite = torch::isfinite(a) & (a > 0);
    const auto one = torch::ones_like(a);
    const double big = torch::where(finite & (a > 1), a, one).log().sum().item<double>();
    const double small = torch::where(finite & (a < 1), a, one).log().sum().item<double>();
    const bool f32 = dtype == torch::kFloat32;
    const double top = std::log(f32 ? double(std::numeric_limits<float>::max()) : std::numeric_limits<double>::max());
    const double bottom = std::log(f32 ? double(std::numeric_limits<float>::min()) : std::numeric_limits<double>::min());
    return big > top - std::log(16.0) || small < bottom + std::log(16.0);
}

}  // namespace typegrad_differential
