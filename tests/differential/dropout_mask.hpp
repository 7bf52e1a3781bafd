#pragma once
// typegrad's dropout mask (ops/dropout.hpp's Philox stream) for the harnesses' references:
// PyTorch's CPU dropout draws from mt19937, so the references take typegrad's mask and check
// the rest of the op (x * mask / (1 - p), its gradient, NaN and inf through dropped elements).
#include <cstdint>
#include <vector>

#include <typegrad/core/philox.hpp>

namespace typegrad_differential {

// Element e of n is kept (1) or dropped (0), as the kernel decides (`double(u) < 1 - p`).
inline std::vector<double> dropout_keep(std::uint64_t seed, std::uint64_t offset, std::int64_t n, double p) {
    const auto key = typegrad::philox_key_from_seed(seed);
    std::vector<double> keep(std::size_t(n), 0.0);
    for (std::int64_t e = 0; e < n; ++e) {
        const auto words = typegrad::philox4x32_10(typegrad::philox_counter_at(offset + std::uint64_t(e) / 4), key);
        keep[std::size_t(e)] = double(typegrad::uniform_float(words[std::size_t(e % 4)])) < 1.0 - p ? 1.0 : 0.0;
    }
    return keep;
}

}  // namespace typegrad_differential
