// Philox, initialisers, optimizers, schedules and clipping: the numerics of training, each checked
// against published vectors or a closed-form computation written out here in double.
#include <catch2/catch.hpp>

#include <typegrad/core/philox.hpp>
#include <typegrad/core/threads.hpp>
#include <typegrad/version.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <string>

namespace tg = typegrad;

// Random123's kat_vectors file (counter[4], key[2] -> output[4]).
TEST_CASE("philox4x32 reproduces the Random123 known-answer vectors", "[philox]") {
    struct kat {
        tg::philox_counter ctr;
        tg::philox_key key;
        tg::philox_counter out7, out10;
    };
    constexpr std::array<kat, 3> kats{{
        {{0, 0, 0, 0}, {0, 0},
         {0x5f6fb709, 0x0d893f64, 0x4f121f81, 0x4f730a48},
         {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
         {0x5207ddc2, 0x45165e59, 0x4d8ee751, 0x8c52f662},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
         {0x4dfccaba, 0x190a87f0, 0xc47362ba, 0xb6b5242a},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    }};
    for (const auto& k : kats) {
        CHECK(tg::philox4x32_10(k.ctr, k.key) == k.out10);
        CHECK(tg::philox4x32<10>(k.ctr, k.key) == k.out10);
        CHECK(tg::philox4x32<7>(k.ctr, k.key) == k.out7);
    }
    // Usable in constant expressions (so tables and tests can be built at compile time).
    STATIC_REQUIRE(tg::philox4x32_10({0, 0, 0, 0}, {0, 0})[0] == 0x6627e8d5u);
}

TEST_CASE("philox seeds and counters split 64-bit values low word first", "[philox]") {
    CHECK(tg::philox_key_from_seed(0x0123456789abcdefull) == tg::philox_key{0x89abcdef, 0x01234567});
    CHECK(tg::philox_counter_at(0x1'0000'0002ull, 0x3'0000'0004ull) ==
          tg::philox_counter{2, 1, 4, 3});
}

TEST_CASE("uniform mappings cover [0, 1) with the documented rules", "[philox]") {
    // PyTorch's rule: low 24 bits.
    CHECK(tg::uniform_float(0u) == 0.0f);
    CHECK(tg::uniform_float(0xFF00'0000u) == 0.0f);
    CHECK(tg::uniform_float(0x0080'0000u) == 0.5f);
    CHECK(tg::uniform_float(0xFFFF'FFFFu) == 1.0f - 0x1p-24f);
    CHECK(tg::uniform_float(1u) == 0x1p-24f);
    // JAX's rule: high 23 bits.
    CHECK(tg::uniform_float_jax(0u) == 0.0f);
    CHECK(tg::uniform_float_jax(0x0000'01FFu) == 0.0f);
    CHECK(tg::uniform_float_jax(0x8000'0000u) == 0.5f);
    CHECK(tg::uniform_float_jax(0xFFFF'FFFFu) == 1.0f - 0x1p-23f);
    // Double: 53 low bits.
    CHECK(tg::uniform_double(0u, 0u) == 0.0);
    CHECK(tg::uniform_double(0xFFFF'FFFFu, 0xFFFF'FFFFu) == 1.0 - 0x1p-53);
    CHECK(tg::uniform_double(0u, 0x0010'0000u) == 0.5);
    CHECK(tg::uniform_double(0u, 0x0020'0000u) == 0.0);  // bit 53 is dropped
    const auto block = tg::philox4x32_10({0, 0, 0, 0}, {0, 0});
    const auto u = tg::philox_uniform4({0, 0, 0, 0}, {0, 0});
    for (int i = 0; i < 4; ++i) CHECK(u[i] == static_cast<float>(block[i] & 0xFFFFFFu) / 16777216.0f);
}

TEST_CASE("philox uniforms are uniform: mean and variance of 2^16 draws", "[philox]") {
    double sum = 0, sum_sq = 0;
    constexpr int blocks = 1 << 14;
    for (int i = 0; i < blocks; ++i)
        for (float v : tg::philox_uniform4(tg::philox_counter_at(i), tg::philox_key_from_seed(42))) {
            sum += v;
            sum_sq += double(v) * v;
        }
    const double n = 4.0 * blocks, mean = sum / n, var = sum_sq / n - mean * mean;
    // Standard error of the mean is sqrt(1/12/n) = 0.0011; 5 sigma.
    CHECK(std::abs(mean - 0.5) < 0.0057);
    CHECK(std::abs(var - 1.0 / 12.0) < 0.002);
}

TEST_CASE("version macros agree with each other and with typegrad::version", "[package]") {
    STATIC_REQUIRE(TYPEGRAD_VERSION ==
                   TYPEGRAD_VERSION_MAJOR * 10000 + TYPEGRAD_VERSION_MINOR * 100 + TYPEGRAD_VERSION_PATCH);
    STATIC_REQUIRE(tg::version.major == TYPEGRAD_VERSION_MAJOR && tg::version.minor == TYPEGRAD_VERSION_MINOR &&
                   tg::version.patch == TYPEGRAD_VERSION_PATCH);
    const std::string expected = std::to_string(TYPEGRAD_VERSION_MAJOR) + "." + std::to_string(TYPEGRAD_VERSION_MINOR) +
                                 "." + std::to_string(TYPEGRAD_VERSION_PATCH);
    CHECK(expected == TYPEGRAD_VERSION_STRING);
}

TEST_CASE("set_num_threads sets the count in effect; 0 restores the default", "[package]") {
    const std::size_t before = tg::num_threads();
    tg::set_num_threads(3);
    CHECK(tg::num_threads() == 3);
    tg::set_num_threads(1);
    CHECK(tg::num_threads() == 1);
    tg::set_num_threads(0);
    CHECK(tg::num_threads() == before);
}
