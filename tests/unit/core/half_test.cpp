// bf16 / f16: exact rounding cases, exhaustive round trips, a slow independent reference over a
// large float/double sample, and bulk (SIMD) conversions against the scalar ones.
#include <typegrad/core/half.hpp>
#include <typegrad/core/cpu/half_simd.hpp>

#include <catch2/catch.hpp>

#if defined(__SSE2__)
#include <xmmintrin.h>  // _mm_getcsr / _mm_setcsr
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <compare>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace tg = typegrad;
using tg::bf16;
using tg::f16;

namespace {

constexpr std::uint32_t bits_of(float x) { return std::bit_cast<std::uint32_t>(x); }
constexpr float float_of(std::uint32_t u) { return std::bit_cast<float>(u); }
constexpr std::uint64_t bits_of(double x) { return std::bit_cast<std::uint64_t>(x); }
constexpr double double_of(std::uint64_t u) { return std::bit_cast<double>(u); }

// ---- Independent reference ----------------------------------------------------------------------
// Decodes bit patterns with ldexp and rounds by searching the sorted table of finite magnitudes
// for the neighbours of |x| and comparing |x| with their midpoint. It shares no code or tricks with
// the library. long double is exact for every float, double and (x87/binary128) int64 input; the
// midpoint of two neighbours is exact too (few significant bits, a common exponent).

template <class T>
struct format;
template <>
struct format<bf16> {
    static constexpr int exp_bits = 8;
    static constexpr int mant_bits = 7;
};
template <>
struct format<f16> {
    static constexpr int exp_bits = 5;
    static constexpr int mant_bits = 10;
};

template <class T>
constexpr int bias = (1 << (format<T>::exp_bits - 1)) - 1;
template <class T>
constexpr std::uint16_t exp_mask = ((1u << format<T>::exp_bits) - 1u) << format<T>::mant_bits;
template <class T>
constexpr std::uint16_t mant_mask = (1u << format<T>::mant_bits) - 1u;
template <class T>
constexpr std::uint16_t quiet_bit = 1u << (format<T>::mant_bits - 1);
template <class T>
constexpr std::uint16_t max_finite = exp_mask<T> - 1u;  // positive patterns sort by value

template <class T>
bool is_nan_bits(std::uint16_t b) {
    return (b & exp_mask<T>) == exp_mask<T> && (b & mant_mask<T>) != 0;
}

template <class T>
long double ref_value(std::uint16_t b) {  // finite patterns only
    const int m = format<T>::mant_bits;
    const int e = (b & exp_mask<T>) >> m;
    const int f = b & mant_mask<T>;
    const long double mag =
        e == 0 ? std::ldexp(static_cast<long double>(f), 1 - bias<T> - m)
               : std::ldexp(static_cast<long double>(f + (1 << m)), e - bias<T> - m);
    return (b & 0x8000u) ? -mag : mag;
}

template <class T>
const std::vector<long double>& magnitudes() {
    static const std::vector<long double> table = [] {
        std::vector<long double> t;
        for (unsigned b = 0; b <= max_finite<T>; ++b)
            t.push_back(ref_value<T>(static_cast<std::uint16_t>(b)));
        return t;
    }();
    return table;
}

// Round-to-nearest-even of a non-NaN x.
template <class T>
std::uint16_t ref_round(long double x) {
    const std::uint16_t sign = std::signbit(x) ? 0x8000u : 0u;
    const long double a = std::fabs(x);
    const auto& mags = magnitudes<T>();
    // Past the largest finite value the grid would continue at 2^(emax + 1), whose pattern is the
    // (even) infinity: a tie with it rounds to infinity.
    const long double beyond = std::ldexp(1.0L, bias<T> + 1);
    if (a >= (mags.back() + beyond) / 2) return sign | exp_mask<T>;
    const auto lo = static_cast<std::uint16_t>(std::upper_bound(mags.begin(), mags.end(), a) -
                                               mags.begin() - 1);
    const long double lower = mags[lo];
    if (lower == a) return sign | lo;
    const long double upper = lo == max_finite<T> ? beyond : mags[lo + 1u];
    const long double mid = (lower + upper) / 2;
    std::uint16_t r = lo;
    if (a > mid || (a == mid && (lo & 1u) != 0)) r = static_cast<std::uint16_t>(lo + 1u);
    return sign | r;
}

// NaNs narrow to: sign, all-ones exponent, quiet bit, leading payload bits.
template <class T>
std::uint16_t expected_nan(float x) {
    const std::uint32_t u = bits_of(x);
    const auto payload =
        static_cast<std::uint16_t>((u >> (23 - format<T>::mant_bits)) & mant_mask<T>);
    return static_cast<std::uint16_t>(((u >> 16) & 0x8000u) | exp_mask<T> | quiet_bit<T> | payload);
}
template <class T>
std::uint16_t expected_nan(double x) {
    const std::uint64_t u = bits_of(x);
    const auto payload =
        static_cast<std::uint16_t>((u >> (52 - format<T>::mant_bits)) & mant_mask<T>);
    return static_cast<std::uint16_t>(((u >> 48) & 0x8000u) | exp_mask<T> | quiet_bit<T> | payload);
}

template <class T, class Src>
std::uint16_t expected_bits(Src x) {
    if (std::isnan(x)) return expected_nan<T>(x);
    return ref_round<T>(static_cast<long double>(x));
}

std::string hex(std::uint64_t v) {
    std::ostringstream s;
    s << "0x" << std::hex << v;
    return s.str();
}

// ---- Samples ------------------------------------------------------------------------------------

// Every float exponent (subnormals, infinities and NaNs included), both signs, with mantissas that
// put a tie, a near tie or a carry at every bit position, plus uniformly random bit patterns and
// random floats concentrated in the f16 range.
std::vector<float> float_sample() {
    std::vector<float> out;
    std::mt19937 rng(20240611u);
    std::uniform_int_distribution<std::uint32_t> any;
    for (std::uint32_t sign = 0; sign < 2; ++sign) {
        for (std::uint32_t e = 0; e < 256; ++e) {
            std::vector<std::uint32_t> mants = {0u, 1u, 0x7fffffu, 0x400000u, 0x3fffffu};
            for (std::uint32_t k = 0; k < 23; ++k) {
                const std::uint32_t bit = 1u << k;
                for (std::uint32_t m : {bit, bit - 1u, bit + 1u, bit | (bit << 1), (bit << 1) - 1u,
                                        bit | 0x400000u, bit | (any(rng) & ~((bit << 1) - 1u))})
                    mants.push_back(m & 0x7fffffu);
            }
            for (int r = 0; r < 8; ++r) mants.push_back(any(rng) & 0x7fffffu);
            for (std::uint32_t m : mants) out.push_back(float_of((sign << 31) | (e << 23) | m));
        }
    }
    for (int i = 0; i < 1'000'000; ++i) out.push_back(float_of(any(rng)));
    // 2^-27 .. 2^17
    std::uniform_int_distribution<std::uint32_t> near_f16(0x32000000u, 0x47ffffffu);
    for (int i = 0; i < 200'000; ++i)
        out.push_back(float_of(near_f16(rng) | (any(rng) & 0x80000000u)));
    return out;
}

// Doubles: every float from the float sample, then for each positive finite T value the midpoint
// to its successor and its two double neighbours (where rounding via float would round twice),
// then random bit patterns and random doubles around the T range.
template <class T>
std::vector<double> double_sample(const std::vector<float>& floats) {
    std::vector<double> out(floats.begin(), floats.end());
    const auto& mags = magnitudes<T>();
    const long double beyond = std::ldexp(1.0L, bias<T> + 1);
    for (std::size_t b = 0; b < mags.size(); ++b) {
        const double lower = static_cast<double>(mags[b]);
        const double upper = static_cast<double>(b + 1 < mags.size() ? mags[b + 1] : beyond);
        const double mid = (lower + upper) / 2;
        for (double v : {mid, std::nextafter(mid, 0.0), std::nextafter(mid, 1e300),
                         mid + (upper - lower) * 0x1p-30, mid - (upper - lower) * 0x1p-30}) {
            out.push_back(v);
            out.push_back(-v);
        }
    }
    std::mt19937_64 rng(7u);
    std::uniform_int_distribution<std::uint64_t> any;
    for (int i = 0; i < 300'000; ++i) out.push_back(double_of(any(rng)));
    std::uniform_int_distribution<std::uint64_t> near(0x3600000000000000u, 0x4810000000000000u);
    for (int i = 0; i < 300'000; ++i)
        out.push_back(double_of(near(rng) | (any(rng) & (1ull << 63))));
    return out;
}

const std::vector<float>& floats() {
    static const std::vector<float> sample = float_sample();
    return sample;
}

// Checks every x against the reference; reports the count and the first mismatch.
template <class T, class Src>
void check_against_reference(const std::vector<Src>& xs) {
    std::size_t mismatches = 0;
    std::string first;
    for (Src x : xs) {
        const std::uint16_t want = expected_bits<T>(x);
        const std::uint16_t got = T(x).bits;
        if (got != want && mismatches++ == 0)
            first = "x bits " + hex(bits_of(x)) + ": got " + hex(got) + ", want " + hex(want);
    }
    INFO(xs.size() << " inputs; first mismatch: " << first);
    REQUIRE(mismatches == 0);
}

// Values that exercise every special case of the bulk paths.
std::vector<float> float_edge_values() {
    using lim = std::numeric_limits<float>;
    // clang-format off
    return {0.0f, -0.0f, 1.0f, -1.0f, 0x1.01p0f, 0x1.03p0f, 257.0f, 65504.0f, 65519.0f, 65520.0f,
            -65520.0f, 65536.0f, lim::max(), -lim::max(), lim::infinity(), -lim::infinity(),
            lim::min(), 0x1p-24f, 0x1p-25f, 0x3p-26f, 0x1.ffcp-15f,
            float_of(0x7fc00000u), float_of(0xffc00001u), float_of(0x7f800001u),
            float_of(0xff812345u), float_of(0x7fa02000u), float_of(0x7f7f8000u),
            float_of(0x7f7f7fffu)};
    // clang-format on
}
std::vector<float> float_subnormals() {
    return {float_of(0x00000001u), float_of(0x80008000u), float_of(0x00008001u),
            float_of(0x00018000u), float_of(0x807fffffu), float_of(0x00400000u)};
}

}  // namespace

// ---- Type properties ----------------------------------------------------------------------------

TEST_CASE("bf16/f16 are 16-bit trivially copyable storage types", "[half]") {
    STATIC_REQUIRE(sizeof(bf16) == 2);
    STATIC_REQUIRE(sizeof(f16) == 2);
    STATIC_REQUIRE(std::is_trivially_copyable_v<bf16>);
    STATIC_REQUIRE(std::is_trivially_copyable_v<f16>);
    STATIC_REQUIRE(std::is_trivially_default_constructible_v<bf16>);
    STATIC_REQUIRE(std::is_standard_layout_v<f16>);
    STATIC_REQUIRE(std::is_same_v<decltype(bf16::bits), std::uint16_t>);
    // Narrowing is explicit, widening implicit.
    STATIC_REQUIRE(!std::is_convertible_v<float, bf16>);
    STATIC_REQUIRE(!std::is_convertible_v<double, f16>);
    STATIC_REQUIRE(!std::is_convertible_v<int, f16>);
    STATIC_REQUIRE(std::is_convertible_v<bf16, float>);
    STATIC_REQUIRE(std::is_convertible_v<f16, float>);
    STATIC_REQUIRE(std::is_constructible_v<bf16, f16>);  // via float, exact then rounded once
    STATIC_REQUIRE(!std::is_constructible_v<bf16, long double>);
}

TEST_CASE("bf16/f16 conversions are constexpr", "[half]") {
    STATIC_REQUIRE(bf16(1.0f).bits == 0x3f80);
    STATIC_REQUIRE(bf16(0x1.01p0f).bits == 0x3f80);
    STATIC_REQUIRE(f16(65520.0f).bits == 0x7c00);
    STATIC_REQUIRE(f16(0x1p-25f).bits == 0x0000);
    STATIC_REQUIRE(float(f16::from_bits(0x0001)) == 0x1p-24f);
    STATIC_REQUIRE(float(bf16::from_bits(0xc000)) == -2.0f);
    STATIC_REQUIRE(bf16(1.0 + 0x1p-8 + 0x1p-30).bits == 0x3f81);
    STATIC_REQUIRE(f16(2049).bits == 0x6800);
    STATIC_REQUIRE((bf16(1.0f) + bf16(2.0f)).bits == bf16(3.0f).bits);
    STATIC_REQUIRE(bf16(1.0f) < bf16(2.0f));
    STATIC_REQUIRE(isnan(std::numeric_limits<f16>::quiet_NaN()));
}

TEST_CASE("is_reduced_precision and compute_type", "[half]") {
    STATIC_REQUIRE(tg::is_reduced_precision_v<bf16>);
    STATIC_REQUIRE(tg::is_reduced_precision_v<f16>);
    STATIC_REQUIRE(tg::is_reduced_precision_v<const f16>);
    STATIC_REQUIRE(tg::is_reduced_precision<bf16>::value);
    STATIC_REQUIRE(!tg::is_reduced_precision_v<float>);
    STATIC_REQUIRE(!tg::is_reduced_precision_v<double>);
    STATIC_REQUIRE(!tg::is_reduced_precision_v<std::uint16_t>);
    STATIC_REQUIRE(std::is_same_v<tg::compute_type_t<bf16>, float>);
    STATIC_REQUIRE(std::is_same_v<tg::compute_type_t<f16>, float>);
    STATIC_REQUIRE(std::is_same_v<tg::compute_type_t<float>, float>);
    STATIC_REQUIRE(std::is_same_v<tg::compute_type_t<double>, double>);
    STATIC_REQUIRE(std::is_same_v<tg::compute_type_t<int>, int>);
}

TEST_CASE("numeric_limits of bf16 and f16", "[half]") {
    using LB = std::numeric_limits<bf16>;
    using LH = std::numeric_limits<f16>;
    STATIC_REQUIRE(LB::is_specialized);
    STATIC_REQUIRE(LH::is_iec559);
    STATIC_REQUIRE(LB::digits == 8);
    STATIC_REQUIRE(LH::digits == 11);
    STATIC_REQUIRE(std::numeric_limits<const f16>::digits == 11);

    REQUIRE(float(LB::max()) == float_of(0x7f7f0000u));
    REQUIRE(float(LB::lowest()) == -float(LB::max()));
    REQUIRE(float(LB::min()) == 0x1p-126f);
    REQUIRE(float(LB::denorm_min()) == 0x1p-133f);
    REQUIRE(float(LB::epsilon()) == 0x1p-7f);
    REQUIRE(float(LB::round_error()) == 0.5f);
    REQUIRE(float(LH::max()) == 65504.0f);
    REQUIRE(float(LH::lowest()) == -65504.0f);
    REQUIRE(float(LH::min()) == 0x1p-14f);
    REQUIRE(float(LH::denorm_min()) == 0x1p-24f);
    REQUIRE(float(LH::epsilon()) == 0x1p-10f);
    REQUIRE(float(LH::round_error()) == 0.5f);
    REQUIRE(std::isinf(float(LB::infinity())));
    REQUIRE(std::isinf(float(LH::infinity())));
    REQUIRE(float(LB::infinity()) > 0.0f);
    REQUIRE(std::isnan(float(LB::quiet_NaN())));
    REQUIRE(std::isnan(float(LH::quiet_NaN())));
    REQUIRE(isnan(LB::signaling_NaN()));
    REQUIRE(isnan(LH::signaling_NaN()));
    REQUIRE((LB::signaling_NaN().bits & 0x0040) == 0);
    REQUIRE((LH::signaling_NaN().bits & 0x0200) == 0);

    // epsilon and digits agree with the rounding: 1 + eps is the successor of 1, 1 + eps/2 a tie
    // that goes back to 1.
    REQUIRE(bf16(1.0f + float(LB::epsilon())).bits == bf16(1.0f).bits + 1);
    REQUIRE(bf16(1.0f + float(LB::epsilon()) / 2).bits == bf16(1.0f).bits);
    REQUIRE(f16(1.0f + float(LH::epsilon())).bits == f16(1.0f).bits + 1);
    REQUIRE(f16(1.0f + float(LH::epsilon()) / 2).bits == f16(1.0f).bits);
    // max is the last finite pattern; max + half an ulp is the overflow tie.
    REQUIRE(f16(65504.0f + 15.0f).bits == LH::max().bits);
    REQUIRE(f16(65504.0f + 16.0f).bits == LH::infinity().bits);
}

// ---- Exact rounding cases -----------------------------------------------------------------------

TEST_CASE("bf16 rounding: exact cases", "[half]") {
    REQUIRE(bf16(1.0f).bits == 0x3f80);
    REQUIRE(bf16(0x1.01p0f).bits == 0x3f80);      // 1 + 2^-8: tie, 1 has the even mantissa
    REQUIRE(bf16(0x1.03p0f).bits == 0x3f82);      // 1 + 3*2^-8: tie, goes up to 1 + 2^-6
    REQUIRE(bf16(0x1.010002p0f).bits == 0x3f81);  // just above the tie
    REQUIRE(bf16(0x1.00fffep0f).bits == 0x3f80);  // just below the tie
    REQUIRE(float(bf16(257.0f)) == 256.0f);       // tie between 256 (even) and 258
    REQUIRE(float(bf16(259.0f)) == 260.0f);       // tie between 258 (odd) and 260
    REQUIRE(float(bf16(65536.0f)) == 65536.0f);   // f16 overflows here, bf16 does not
    REQUIRE_THAT(float(bf16(3.0e38f)), Catch::Matchers::WithinRel(3.0e38f, 0x1p-8f));
    REQUIRE(bf16(float_of(0x7f7f7fffu)).bits == 0x7f7f);  // below the overflow tie
    REQUIRE(bf16(float_of(0x7f7f8000u)).bits == 0x7f80);  // overflow tie: to infinity
    REQUIRE(bf16(std::numeric_limits<float>::max()).bits == 0x7f80);
    REQUIRE(bf16(-std::numeric_limits<float>::max()).bits == 0xff80);
    REQUIRE(bf16(std::numeric_limits<float>::infinity()).bits == 0x7f80);
    REQUIRE(bf16(-std::numeric_limits<float>::infinity()).bits == 0xff80);
    REQUIRE(bf16(-0.0f).bits == 0x8000);
    REQUIRE(std::signbit(float(bf16(-0.0f))));
    // Subnormals follow float's: the low 16 bits are rounded off.
    REQUIRE(bf16(float_of(0x00000001u)).bits == 0x0000);
    REQUIRE(bf16(float_of(0x00008000u)).bits == 0x0000);  // tie to even 0
    REQUIRE(bf16(float_of(0x00008001u)).bits == 0x0001);
    REQUIRE(bf16(float_of(0x00018000u)).bits == 0x0002);  // tie to even 2
    REQUIRE(bf16(float_of(0x807fffffu)).bits == 0x8080);  // rounds up to -min normal
    REQUIRE(float(bf16::from_bits(0x0001)) == 0x1p-133f);
}

TEST_CASE("f16 rounding: exact cases", "[half]") {
    REQUIRE(f16(1.0f).bits == 0x3c00);
    REQUIRE(f16(0x1.002p0f).bits == 0x3c00);  // 1 + 2^-11: tie to even 1
    REQUIRE(f16(0x1.006p0f).bits == 0x3c02);  // 1 + 3*2^-11: tie to even 1 + 2^-9
    REQUIRE(f16(65504.0f).bits == 0x7bff);
    REQUIRE(f16(65519.0f).bits == 0x7bff);
    REQUIRE(f16(std::nextafter(65520.0f, 0.0f)).bits == 0x7bff);
    REQUIRE(f16(65520.0f).bits == 0x7c00);  // = max + ulp/2: tie with 2^16, whose pattern is even
    REQUIRE(f16(-65520.0f).bits == 0xfc00);
    REQUIRE(f16(256.0f * 256.0f).bits == 0x7c00);
    REQUIRE(bf16(256.0f * 256.0f).bits == 0x4780);
    REQUIRE(f16(std::numeric_limits<float>::infinity()).bits == 0x7c00);
    REQUIRE(f16(-std::numeric_limits<float>::infinity()).bits == 0xfc00);
    REQUIRE(f16(-0.0f).bits == 0x8000);
    REQUIRE(std::signbit(float(f16(-0.0f))));
    // Subnormals: the quantum is 2^-24.
    REQUIRE(f16(0x1p-24f).bits == 0x0001);
    REQUIRE(f16(0x1p-25f).bits == 0x0000);  // half the quantum: tie to even 0
    REQUIRE(f16(-0x1p-25f).bits == 0x8000);
    REQUIRE(f16(0x1.000002p-25f).bits == 0x0001);
    REQUIRE(f16(0x3p-26f).bits == 0x0001);      // 0.75 quanta
    REQUIRE(f16(0x3p-25f).bits == 0x0002);      // 1.5 quanta: tie to even 2
    REQUIRE(f16(0x5p-25f).bits == 0x0002);      // 2.5 quanta: tie to even 2
    REQUIRE(f16(0x1p-14f).bits == 0x0400);      // smallest normal
    REQUIRE(f16(0x1.ffcp-15f).bits == 0x0400);  // 1023.5 quanta: tie, rounds up into the normals
    REQUIRE(f16(0x1.ff8p-15f).bits == 0x03ff);
    REQUIRE(f16(std::numeric_limits<float>::denorm_min()).bits == 0x0000);
    REQUIRE(float(f16::from_bits(0x0001)) == 0x1p-24f);
    REQUIRE(float(f16::from_bits(0x03ff)) == 0x3ffp-24f);
    REQUIRE(float(f16::from_bits(0x8200)) == -0x1p-15f);
}

TEST_CASE("bf16/f16 NaN narrowing keeps sign and leading payload and sets the quiet bit",
          "[half]") {
    REQUIRE(bf16(float_of(0x7fc00000u)).bits == 0x7fc0);
    REQUIRE(bf16(float_of(0xffc00001u)).bits == 0xffc0);
    REQUIRE(bf16(float_of(0x7f800001u)).bits == 0x7fc0);  // signalling, payload only in low bits
    REQUIRE(bf16(float_of(0x7fa12345u)).bits == 0x7fe1);
    REQUIRE(bf16(float_of(0xff812345u)).bits == 0xffc1);
    REQUIRE(f16(float_of(0x7fc00000u)).bits == 0x7e00);
    REQUIRE(f16(float_of(0xff800001u)).bits == 0xfe00);
    REQUIRE(f16(float_of(0x7fa02000u)).bits == 0x7f01);
    REQUIRE(bf16(double_of(0x7ff8000000000001u)).bits == 0x7fc0);
    REQUIRE(bf16(double_of(0xfff4000000000000u)).bits == 0xffe0);
    REQUIRE(f16(double_of(0xfff0000000000001u)).bits == 0xfe00);
    // Widening: bf16 moves the bits (signalling stays signalling); f16 returns quiet NaNs, as the
    // F16C instructions do.
    REQUIRE(bits_of(float(bf16::from_bits(0x7f81))) == 0x7f810000u);
    REQUIRE(bits_of(float(bf16::from_bits(0xffc0))) == 0xffc00000u);
    REQUIRE(bits_of(float(f16::from_bits(0x7c01))) == 0x7fc02000u);
    REQUIRE(bits_of(float(f16::from_bits(0xfe00))) == 0xffc00000u);
    REQUIRE(isnan(-bf16::from_bits(0x7fc0)));
    REQUIRE((-bf16::from_bits(0x7fc0)).bits == 0xffc0);
}

TEST_CASE("bf16/f16 from double and integers rounds once", "[half]") {
    // Via float these would round twice: the first rounding creates a tie for the second.
    const double above_tie = 1.0 + 0x1p-8 + 0x1p-30;
    REQUIRE(bf16(static_cast<float>(above_tie)).bits == 0x3f80);
    REQUIRE(bf16(above_tie).bits == 0x3f81);
    REQUIRE(f16(static_cast<float>(65520.0 - 0x1p-30)).bits == 0x7c00);
    REQUIRE(f16(65520.0 - 0x1p-30).bits == 0x7bff);
    REQUIRE(f16(0x1p-25 + 0x1p-60).bits == 0x0001);
    REQUIRE(f16(0x1p-25).bits == 0x0000);
    REQUIRE(bf16(1e300).bits == 0x7f80);
    REQUIRE(bf16(-1e300).bits == 0xff80);
    REQUIRE(f16(1e-300).bits == 0x0000);
    REQUIRE(f16(-1e-300).bits == 0x8000);
    REQUIRE(bf16(std::numeric_limits<double>::denorm_min()).bits == 0x0000);
    REQUIRE(bf16(-std::numeric_limits<double>::infinity()).bits == 0xff80);
    REQUIRE(bf16(0x1p-133).bits == 0x0001);
    REQUIRE(bf16(0x1p-134).bits == 0x0000);  // tie to even 0
    REQUIRE(bf16(0x1.0000000001p-134).bits == 0x0001);

    REQUIRE(float(bf16(0)) == 0.0f);
    REQUIRE(float(bf16(257)) == 256.0f);
    REQUIRE(float(bf16(259)) == 260.0f);
    REQUIRE(float(bf16(-259)) == -260.0f);
    REQUIRE(float(f16(2049)) == 2048.0f);
    REQUIRE(float(f16(2051)) == 2052.0f);
    REQUIRE(float(f16(65519)) == 65504.0f);
    REQUIRE(f16(65520).bits == 0x7c00);
    REQUIRE(f16(-70000).bits == 0xfc00);
    REQUIRE(float(f16(std::uint8_t{255})) == 255.0f);
    // 2^60 + 2^52 + 1 is just above a bf16 tie, but a tie once converted to double.
    const std::int64_t big = (std::int64_t{1} << 60) + (std::int64_t{1} << 52) + 1;
    REQUIRE(bf16(static_cast<double>(big)).bits == 0x5d80);
    REQUIRE(bf16(big).bits == 0x5d81);
    REQUIRE(bf16(std::numeric_limits<std::uint64_t>::max()).bits == 0x5f80);  // rounds up to 2^64
    REQUIRE(bf16(std::numeric_limits<std::int64_t>::min()).bits == 0xdf00);   // -2^63
    REQUIRE(f16(std::numeric_limits<std::int64_t>::min()).bits == 0xfc00);
}

// ---- Exhaustive and sampled checks --------------------------------------------------------------

TEMPLATE_TEST_CASE("bf16/f16: every bit pattern widens exactly and narrows back to itself",
                   "[half]", bf16, f16) {
    std::size_t bad = 0;
    std::string first;
    for (std::uint32_t b = 0; b <= 0xffff; ++b) {
        const auto bits = static_cast<std::uint16_t>(b);
        const TestType h = TestType::from_bits(bits);
        const float f = h;
        bool ok = true;
        if (is_nan_bits<TestType>(bits)) {
            // NaN stays NaN, with its sign; narrowing returns it quiet with the same leading
            // payload.
            const auto quiet = static_cast<std::uint16_t>(bits | quiet_bit<TestType>);
            ok = std::isnan(f) && std::signbit(f) == ((bits & 0x8000u) != 0) && isnan(h) &&
                 TestType(f).bits == quiet && TestType(static_cast<double>(f)).bits == quiet;
        } else {
            const long double want = (bits & 0x7fffu) == exp_mask<TestType>
                                         ? std::copysign(HUGE_VALL, (bits & 0x8000u) ? -1.0L : 1.0L)
                                         : ref_value<TestType>(bits);
            ok = static_cast<long double>(f) == want &&
                 std::signbit(f) == ((bits & 0x8000u) != 0) && TestType(f).bits == bits &&
                 TestType(static_cast<double>(f)).bits == bits && !isnan(h) &&
                 isinf(h) == std::isinf(f) && isfinite(h) == std::isfinite(f) &&
                 signbit(h) == std::signbit(f);
        }
        if (!ok && bad++ == 0) first = hex(b);
    }
    INFO("first failing pattern: " << first);
    REQUIRE(bad == 0);
}

TEST_CASE("float -> bf16 matches the reference over >= 10^6 floats", "[half]") {
    REQUIRE(floats().size() >= 1'000'000);
    check_against_reference<bf16>(floats());
}

TEST_CASE("float -> f16 matches the reference over >= 10^6 floats", "[half]") {
    check_against_reference<f16>(floats());
}

TEST_CASE("double -> bf16 matches the reference", "[half]") {
    check_against_reference<bf16>(double_sample<bf16>(floats()));
}

TEST_CASE("double -> f16 matches the reference", "[half]") {
    check_against_reference<f16>(double_sample<f16>(floats()));
}

TEST_CASE("int64 -> bf16/f16 match the reference", "[half]") {
    if constexpr (std::numeric_limits<long double>::digits >= 64) {  // the reference must be exact
        std::mt19937_64 rng(99u);
        std::uniform_int_distribution<std::uint64_t> any;
        std::size_t bad = 0;
        for (int i = 0; i < 200'000; ++i) {
            // Random magnitudes at every scale, with long runs of low zero or one bits (ties).
            const std::uint64_t raw = any(rng) >> (any(rng) % 64);
            const auto v = static_cast<std::int64_t>(
                i % 3 == 0 ? raw : (i % 3 == 1 ? raw | 1u : raw & ~std::uint64_t{0xffff}));
            for (std::int64_t x : {v, -v}) {
                if (bf16(x).bits != ref_round<bf16>(static_cast<long double>(x))) ++bad;
                if (f16(x).bits != ref_round<f16>(static_cast<long double>(x))) ++bad;
            }
            if (bf16(raw).bits != ref_round<bf16>(static_cast<long double>(raw))) ++bad;
        }
        REQUIRE(bad == 0);
    }
}

#if defined(__FLT16_MAX__)
// Where the compiler offers _Float16 its conversions are an independent implementation of f16.
TEST_CASE("f16 agrees with the compiler's _Float16", "[half]") {
    std::size_t bad = 0;
    for (float x : floats()) {
        if (std::isnan(x)) continue;  // payload handling is the compiler's business
        const _Float16 h = static_cast<_Float16>(x);
        if (f16(x).bits != std::bit_cast<std::uint16_t>(h)) ++bad;
    }
    for (std::uint32_t b = 0; b <= 0xffff; ++b) {
        const auto bits = static_cast<std::uint16_t>(b);
        if (is_nan_bits<f16>(bits)) continue;
        const float want = static_cast<float>(std::bit_cast<_Float16>(bits));
        if (bits_of(float(f16::from_bits(bits))) != bits_of(want)) ++bad;
    }
    REQUIRE(bad == 0);
}
#endif

// ---- Arithmetic and comparisons -----------------------------------------------------------------

TEST_CASE("bf16/f16 arithmetic computes in float and rounds once", "[half]") {
    STATIC_REQUIRE(std::is_same_v<decltype(bf16() + bf16()), bf16>);
    STATIC_REQUIRE(std::is_same_v<decltype(f16() * f16()), f16>);
    STATIC_REQUIRE(std::is_same_v<decltype(-f16()), f16>);
    STATIC_REQUIRE(std::is_same_v<decltype(bf16() + 1.0f), float>);  // mixed: float, as PyTorch
    STATIC_REQUIRE(std::is_same_v<decltype(f16() + 1.0), double>);

    REQUIRE((bf16(1.0f) + bf16(0x1p-8f)).bits == 0x3f80);  // exact sum is a tie
    REQUIRE((bf16(1.0f) + bf16(0x3p-8f)).bits == 0x3f82);
    REQUIRE((f16(60000.0f) + f16(10000.0f)).bits == 0x7c00);
    REQUIRE(float(f16(1.0f) / f16(3.0f)) == float(f16(1.0f / 3.0f)));
    REQUIRE_THAT(float(f16(1.0f) / f16(3.0f)), Catch::Matchers::WithinRel(1.0f / 3.0f, 0x1p-11f));
    REQUIRE_THAT(float(bf16(3.14159265f) * bf16(2.0f)),
                 Catch::Matchers::WithinRel(6.2831853f, 0x1p-8f));
    REQUIRE(float(bf16(5.0f) - bf16(7.0f)) == -2.0f);

    bf16 acc(0.0f);
    for (int i = 0; i < 1000; ++i) acc += bf16(1.0f);
    REQUIRE(float(acc) == 256.0f);  // 256 + 1 is a tie back to 256: bf16 accumulation stalls
    f16 g(10.0f);
    g -= f16(4.0f);
    g *= f16(0.5f);
    g /= f16(4.0f);
    REQUIRE(float(g) == 0.75f);

    // Random operands: the result is the float result rounded once (and, by the double rounding
    // theorem for p' >= 2p + 2, the correctly rounded result).
    std::mt19937 rng(5u);
    std::uniform_int_distribution<std::uint32_t> any(0, 0xffff);
    std::size_t bad = 0;
    for (int i = 0; i < 100'000; ++i) {
        const auto a = f16::from_bits(static_cast<std::uint16_t>(any(rng)));
        const auto b = f16::from_bits(static_cast<std::uint16_t>(any(rng)));
        if (isnan(a) || isnan(b)) continue;
        const long double exact_sum =
            static_cast<long double>(float(a)) + static_cast<long double>(float(b));
        const long double exact_prod =
            static_cast<long double>(float(a)) * static_cast<long double>(float(b));
        if ((a + b).bits != f16(float(a) + float(b)).bits) ++bad;
        if (!std::isnan(exact_sum) && (a + b).bits != ref_round<f16>(exact_sum) &&
            !(exact_sum == 0 && float(a + b) == 0.0f))  // sign of an exact zero sum: float's rules
            ++bad;
        if (!std::isnan(exact_prod) && (a * b).bits != ref_round<f16>(exact_prod)) ++bad;
    }
    REQUIRE(bad == 0);
}

TEST_CASE("bf16/f16 comparisons follow IEEE through float", "[half]") {
    const bf16 nan = std::numeric_limits<bf16>::quiet_NaN();
    REQUIRE(bf16(-0.0f) == bf16(0.0f));
    REQUIRE(f16(-0.0f) == f16(0.0f));
    REQUIRE(bf16(1.0f) != bf16(2.0f));
    REQUIRE(bf16(1.0f) < bf16(2.0f));
    REQUIRE(f16(-3.0f) <= f16(-3.0f));
    REQUIRE(f16(4.0f) > f16(-4.0f));
    REQUIRE_FALSE(nan == nan);
    REQUIRE(nan != nan);
    REQUIRE_FALSE(nan < bf16(1.0f));
    REQUIRE((nan <=> bf16(1.0f)) == std::partial_ordering::unordered);
    REQUIRE(bf16(1.0f) < 1.5f);  // mixed comparisons use the built-in float ones
    REQUIRE(f16(2.0f) == 2);
    REQUIRE(std::isnan(nan));  // std:: classification works through the float conversion
    REQUIRE(isnan(nan));
}

// ---- Bulk conversions ---------------------------------------------------------------------------

namespace {

template <class T, class Src>
void check_bulk(const std::vector<Src>& src, std::size_t offset, std::size_t n) {
    REQUIRE(offset + n <= src.size());
    constexpr std::uint16_t canary = 0x5a5a;
    std::vector<T> got(n + 2, T::from_bits(canary));
    tg::detail::convert_n(src.data() + offset, got.data() + 1, n);  // misaligned both sides
    std::size_t bad = 0;
    std::string first;
    for (std::size_t i = 0; i < n; ++i) {
        const std::uint16_t want = T(src[offset + i]).bits;
        if (got[i + 1].bits != want && bad++ == 0)
            first = "index " + std::to_string(i) + " src " + hex(bits_of(src[offset + i])) +
                    ": got " + hex(got[i + 1].bits) + ", want " + hex(want);
    }
    INFO("n = " << n << ", offset " << offset << "; " << first);
    REQUIRE(bad == 0);
    REQUIRE(got.front().bits == canary);
    REQUIRE(got.back().bits == canary);
}

template <class Dst, class T>
void check_widen(const std::vector<T>& src, std::size_t offset, std::size_t n) {
    std::vector<Dst> got(n + 2, Dst(-7));
    tg::detail::convert_n(src.data() + offset, got.data() + 1, n);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i)
        if (bits_of(got[i + 1]) != bits_of(static_cast<Dst>(float(src[offset + i])))) ++bad;
    INFO("n = " << n);
    REQUIRE(bad == 0);
    REQUIRE(got.front() == Dst(-7));
    REQUIRE(got.back() == Dst(-7));
}

// The edge values first, then random floats; the "normal" variant keeps subnormals out so whole
// blocks take vcvtne2ps2bf16, the "mixed" one puts them in.
std::vector<float> bulk_floats(bool with_subnormals) {
    std::vector<float> v = float_edge_values();
    if (with_subnormals) {
        for (float s : float_subnormals()) v.push_back(s);
    }
    std::mt19937 rng(11u);
    std::uniform_int_distribution<std::uint32_t> any;
    while (v.size() < 2048) {
        const float x = float_of(any(rng));
        if (!with_subnormals && std::fpclassify(x) == FP_SUBNORMAL) continue;
        v.push_back(x);
        v.push_back(float_of(bits_of(x) & 0xffff8000u));  // bf16 ties
        v.push_back(
            float_of((bits_of(x) & 0x8fffe000u) | 0x30000000u | 0x1000u));  // f16-range ties
    }
    std::shuffle(v.begin() + 40, v.end(), rng);
    return v;
}

}  // namespace

TEMPLATE_TEST_CASE("convert_n narrows bit-identically to the scalar conversion", "[half][simd]",
                   bf16, f16) {
    for (bool with_subnormals : {false, true}) {
        const std::vector<float> src = bulk_floats(with_subnormals);
        std::vector<double> dsrc(src.begin(), src.end());
        std::mt19937_64 rng(3u);
        for (double& d : dsrc) {  // perturb below float precision so double inputs round once
            if (std::isfinite(d) && d != 0 && rng() % 2 == 0)
                d = std::nextafter(d, rng() % 2 ? 1e308 : -1e308);
        }
        for (std::size_t n : {0, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 1000}) {
            for (std::size_t offset : {0, 1, 3}) {
                check_bulk<TestType>(src, offset, n);
                check_bulk<TestType>(dsrc, offset, n);
            }
        }
        check_bulk<TestType>(src, 0, src.size());
        check_bulk<TestType>(dsrc, 0, dsrc.size());
    }
    // The whole float sample and the double sample, in one call each.
    check_bulk<TestType>(floats(), 0, floats().size());
    const std::vector<double> doubles = double_sample<TestType>(floats());
    check_bulk<TestType>(doubles, 0, doubles.size());
}

TEMPLATE_TEST_CASE("convert_n widens every bit pattern like the scalar conversion", "[half][simd]",
                   bf16, f16) {
    std::vector<TestType> all;
    for (std::uint32_t b = 0; b <= 0xffff; ++b)
        all.push_back(TestType::from_bits(static_cast<std::uint16_t>(b)));
    for (std::size_t n : {0, 1, 7, 8, 9, 15, 16, 17, 1000}) {
        check_widen<float>(all, 5, n);
        check_widen<double>(all, 5, n);
    }
    check_widen<float>(all, 0, all.size());
    check_widen<double>(all, 0, all.size());
}

#if defined(__SSE2__)
// The scalar conversions are integer code and the vector paths either ignore MXCSR (immediate
// rounding, vcvtne*) or are written not to depend on it; check that with FTZ/DAZ and every
// rounding mode, where the float subnormals and the round-to-odd steps would notice.
TEMPLATE_TEST_CASE("convert_n does not depend on MXCSR", "[half][simd]", bf16, f16) {
    std::vector<float> src = bulk_floats(true);
    for (std::uint32_t u = 1; u < 0x00800000u; u += 4099)
        src.push_back(float_of(u));  // float subnormals
    std::vector<double> dsrc(src.begin(), src.end());
    for (std::uint32_t u = 0; u < 4000; ++u)  // doubles at and below float's subnormals
        dsrc.push_back(std::ldexp(1.0 + u * 0x1p-12, -150 + static_cast<int>(u % 30)) *
                       (u % 2 ? -1 : 1));
    std::vector<TestType> want(src.size()), want_d(dsrc.size());
    for (std::size_t i = 0; i < src.size(); ++i) want[i] = TestType(src[i]);
    for (std::size_t i = 0; i < dsrc.size(); ++i) want_d[i] = TestType(dsrc[i]);

    const unsigned saved = _mm_getcsr();
    for (unsigned mode : {0x0000u, 0x8040u, 0x2000u, 0x4000u, 0x6000u, 0xe040u}) {  // FTZ|DAZ, RC
        std::vector<TestType> got(src.size()), got_d(dsrc.size());
        std::vector<float> wide(src.size());
        _mm_setcsr((saved & ~0xe040u) | mode);
        tg::detail::convert_n(src.data(), got.data(), src.size());
        tg::detail::convert_n(dsrc.data(), got_d.data(), dsrc.size());
        tg::detail::convert_n(want.data(), wide.data(), want.size());
        _mm_setcsr(saved);
        std::size_t bad = 0;
        for (std::size_t i = 0; i < src.size(); ++i) {
            bad += got[i].bits != want[i].bits;
            bad += bits_of(wide[i]) != bits_of(float(want[i]));
        }
        for (std::size_t i = 0; i < dsrc.size(); ++i) bad += got_d[i].bits != want_d[i].bits;
        INFO("MXCSR mode bits " << hex(mode));
        REQUIRE(bad == 0);
    }
}
#endif
