#pragma once
// Philox4x32 counter-based random numbers (Salmon et al., "Parallel random numbers: as easy as
// 1, 2, 3", SC'11; the Random123 reference). Counter-based: the n-th number of a stream is a pure
// function of (key, counter), so any element can be produced independently, in any order, on any
// thread or device, with the same bits on every platform. The generator behind typegrad's
// initialisers (train/init.hpp) and dropout.
//
// Stable API (other modules depend on it):
//   philox4x32_10(counter, key)   -> 4 words   the Random123 function, known-answer tested
//   philox4x32<Rounds>(counter, key)            the same with another round count (7 is the other
//                                               published variant)
//   philox_key_from_seed(seed), philox_counter_at(offset, stream)
//   uniform_float(bits)           [0, 1), PyTorch's CPU rule: low 24 bits * 2^-24
//   uniform_float_jax(bits)       [0, 1), JAX's rule: high 23 bits as a mantissa of [1, 2), minus 1
//   uniform_double(lo, hi)        [0, 1), 53 bits * 2^-53 (PyTorch's rule for double)
//   philox_uniform4(counter, key) the four words of one block through uniform_float
#include <array>
#include <bit>
#include <cstdint>

namespace typegrad {

// Philox4x32's 128-bit counter as four 32-bit words (philox_counter_at: {lo(offset), hi(offset),
// lo(stream), hi(stream)}).
using philox_counter = std::array<std::uint32_t, 4>;
// Philox4x32's 64-bit key as two 32-bit words (philox_key_from_seed: {lo(seed), hi(seed)}).
using philox_key = std::array<std::uint32_t, 2>;

namespace detail {
// Multipliers and Weyl key increments of Philox4x32 (Random123's PHILOX_M4x32_*, PHILOX_W32_*).
inline constexpr std::uint32_t philox_m0 = 0xD2511F53u;
inline constexpr std::uint32_t philox_m1 = 0xCD9E8D57u;
inline constexpr std::uint32_t philox_w0 = 0x9E3779B9u;  // golden ratio
inline constexpr std::uint32_t philox_w1 = 0xBB67AE85u;  // sqrt(3) - 1

constexpr philox_counter philox_round(philox_counter c, philox_key k) noexcept {
    const std::uint64_t p0 = std::uint64_t{philox_m0} * c[0];
    const std::uint64_t p1 = std::uint64_t{philox_m1} * c[2];
    const auto hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    const auto hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    return {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
}
}  // namespace detail

// Philox4x32 with `Rounds` rounds: the key is bumped by the Weyl constants between rounds.
template <int Rounds>
constexpr philox_counter philox4x32(philox_counter counter, philox_key key) noexcept {
    static_assert(Rounds >= 1 && Rounds <= 16,
                  "typegrad: philox4x32<Rounds> needs between 1 and 16 rounds (10 is the standard).");
    for (int r = 0; r < Rounds; ++r) {
        if (r != 0) {
            key[0] += detail::philox_w0;
            key[1] += detail::philox_w1;
        }
        counter = detail::philox_round(counter, key);
    }
    return counter;
}

// Philox4x32-10, the variant PyTorch (curand), JAX (threefry's alternative) and TensorFlow use.
constexpr philox_counter philox4x32_10(philox_counter counter, philox_key key) noexcept {
    return philox4x32<10>(counter, key);
}

// A 64-bit seed as a key: low word first, as curand_init and PyTorch's philox engine do.
constexpr philox_key philox_key_from_seed(std::uint64_t seed) noexcept {
    return {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)};
}

// The counter of block `offset` (each block yields 4 words) in stream `stream`:
// {lo(offset), hi(offset), lo(stream), hi(stream)}, the layout of curand's philox state.
constexpr philox_counter philox_counter_at(std::uint64_t offset, std::uint64_t stream = 0) noexcept {
    return {static_cast<std::uint32_t>(offset), static_cast<std::uint32_t>(offset >> 32),
            static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32)};
}

// A float in [0, 1) from 32 random bits, PyTorch's CPU rule (uniform_real in
// ATen/core/TransformationHelper.h): the low 24 bits (float's digits) times 2^-24. Every value is
// exact; the largest is 1 - 2^-24.
constexpr float uniform_float(std::uint32_t bits) noexcept {
    return static_cast<float>(bits & 0x00FF'FFFFu) * 0x1p-24f;
}

// A float in [0, 1) from 32 random bits, JAX's rule (jax.random.uniform): the high 23 bits become
// the mantissa of a float in [1, 2), then 1 is subtracted.
constexpr float uniform_float_jax(std::uint32_t bits) noexcept {
    return std::bit_cast<float>((bits >> 9) | 0x3F80'0000u) - 1.0f;
}

// A double in [0, 1) from 64 random bits given as two words: the low 53 bits times 2^-53
// (PyTorch's uniform_real for double).
constexpr double uniform_double(std::uint32_t lo, std::uint32_t hi) noexcept {
    const std::uint64_t bits = (std::uint64_t{hi} << 32) | lo;
    return static_cast<double>(bits & ((std::uint64_t{1} << 53) - 1)) * 0x1p-53;
}

// Four uniform floats in [0, 1) from one Philox4x32-10 block.
constexpr std::array<float, 4> philox_uniform4(philox_counter counter, philox_key key) noexcept {
    const philox_counter r = philox4x32_10(counter, key);
    return {uniform_float(r[0]), uniform_float(r[1]), uniform_float(r[2]), uniform_float(r[3])};
}

}  // namespace typegrad
