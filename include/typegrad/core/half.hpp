#ifndef TYPEGRAD_CORE_HALF_HPP
#define TYPEGRAD_CORE_HALF_HPP
// Reduced-precision storage types: bf16 (bfloat16) and f16 (IEEE 754 binary16).
// They hold bits only. Arithmetic widens to float, computes there and rounds back once, as
// PyTorch's CPU scalar ops do. All narrowing conversions round to nearest, ties to even, without
// consulting the FPU (integer bit manipulation), so results are constexpr and independent of the
// rounding mode and of FTZ/DAZ.
#include <bit>
#include <compare>
#include <concepts>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace typegrad {

struct bf16;
struct f16;

namespace detail {

// Layout of a 16-bit binary format with an implicit leading significand bit.
template <int ExpBits, int MantBits>
struct half_format {
    static constexpr int exp_bits = ExpBits;
    static constexpr int mant_bits = MantBits;
    static constexpr int bias = (1 << (ExpBits - 1)) - 1;
    static constexpr std::uint16_t sign_mask = 0x8000u;
    static constexpr std::uint16_t exp_mask = ((1u << ExpBits) - 1u) << MantBits;
    static constexpr std::uint16_t mant_mask = (1u << MantBits) - 1u;
    static constexpr std::uint16_t quiet_bit = 1u << (MantBits - 1);
};
using bf16_format = half_format<8, 7>;
using f16_format = half_format<5, 10>;

// Rounds the magnitude sig * 2^exp2 (sig != 0) to Format, ties to even, overflowing to infinity.
// Exact for any 64-bit significand, so double and 64-bit integers round once, never twice.
template <class Format>
constexpr std::uint16_t round_magnitude(std::uint64_t sig, int exp2) noexcept {
    constexpr int m = Format::mant_bits;
    constexpr int q_min = 1 - Format::bias - m;  // exponent of the subnormal quantum
    constexpr int field_inf = (1 << Format::exp_bits) - 1;
    const int msb = static_cast<int>(std::bit_width(sig)) - 1;
    // Exponent of the result's quantum (ulp): m bits below the leading bit, but never below
    // the subnormal quantum.
    const int q = exp2 + msb - m > q_min ? exp2 + msb - m : q_min;
    const int shift = q - exp2;  // significand bits to drop
    std::uint64_t kept = 0;
    if (shift <= 0) {
        kept = sig << -shift;  // -shift <= m: exact
    } else if (shift >= 64) {
        // Only the subnormal quantum can sit this far above: at most half of it is in sig.
        kept = (shift == 64 && sig > (std::uint64_t{1} << 63)) ? 1u : 0u;
    } else {
        kept = sig >> shift;
        const std::uint64_t rem = sig & ((std::uint64_t{1} << shift) - 1u);
        const std::uint64_t half = std::uint64_t{1} << (shift - 1);
        if (rem > half || (rem == half && (kept & 1u) != 0)) ++kept;
    }
    const int field = q - q_min + 1;  // biased exponent; 1 (not 0) for subnormals, see below
    if (field >= field_inf) return Format::exp_mask;
    // kept carries its leading bit, so (field - 1) plus it gives the biased exponent; a rounding
    // carry into bit m + 1 bumps the exponent, and a subnormal rounding up becomes the smallest
    // normal, both for free.
    const std::uint64_t bits = (static_cast<std::uint64_t>(field - 1) << m) + kept;
    return bits >= Format::exp_mask ? Format::exp_mask : static_cast<std::uint16_t>(bits);
}

// NaN narrowing keeps the sign and the leading payload bits and sets the quiet bit: the same
// bits the x86 conversion instructions produce, so the SIMD paths match bit for bit.
constexpr std::uint16_t float_to_bf16_bits(float value) noexcept {
    const auto u = std::bit_cast<std::uint32_t>(value);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
    // Adding 0x7fff plus the lsb to keep rounds half to even; the carry may run into the
    // exponent, which is exactly right (including overflow to infinity). bf16 subnormals are
    // float subnormals with the low 16 bits dropped, so they need no special case.
    return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

constexpr float bf16_bits_to_float(std::uint16_t bits) noexcept {
    return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

constexpr std::uint16_t float_to_f16_bits(float value) noexcept {
    const auto u = std::bit_cast<std::uint32_t>(value);
    const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
    const std::uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) {
        if (a == 0x7f800000u) return sign | 0x7c00u;
        return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x03ffu));
    }
    if (a >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 = 65504 + ulp/2: rounds to inf
    if (a >= 0x38800000u) {                       // >= 2^-14: normal f16
        // Rebias the exponent (127 -> 15), then round off 13 bits half to even; a carry into the
        // exponent is the correct result and cannot reach infinity below 65520.
        const std::uint32_t r = a - 0x38000000u;
        return static_cast<std::uint16_t>(sign | ((r + 0x0fffu + ((r >> 13) & 1u)) >> 13));
    }
    // Subnormal f16: result = round(|value| / 2^-24). With a = 2^(e-127) * (m / 2^23) that is
    // m >> (126 - e) rounded; shifts above 24 leave less than half a quantum (2^-25 itself is
    // a tie with 0 and goes to the even 0).
    const int e = static_cast<int>(a >> 23);
    const int shift = 126 - e;
    if (shift > 24) return sign;
    const std::uint32_t m = (a & 0x007fffffu) | 0x00800000u;
    std::uint32_t kept = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (kept & 1u) != 0)) ++kept;  // 0x400 is the smallest normal
    return static_cast<std::uint16_t>(sign | kept);
}

// f16 NaNs come back quiet, as vcvtph2ps makes them; everything else widens exactly.
constexpr float f16_bits_to_float(std::uint16_t bits) noexcept {
    const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
    const std::uint32_t e = (bits >> 10) & 0x1fu;
    const std::uint32_t m = bits & 0x03ffu;
    std::uint32_t u = 0;
    if (e == 0x1f) {
        u = sign | 0x7f800000u | (m << 13) | (m != 0 ? 0x00400000u : 0u);
    } else if (e != 0) {
        u = sign | ((e + 112u) << 23) | (m << 13);
    } else if (m != 0) {
        // m * 2^-24 with the leading bit at position p: exponent p - 24, the bits below it shift
        // up into the 23-bit fraction.
        const int p = static_cast<int>(std::bit_width(m)) - 1;
        u = sign | (static_cast<std::uint32_t>(p + 103) << 23) | ((m << (23 - p)) & 0x007fffffu);
    } else {
        u = sign;
    }
    return std::bit_cast<float>(u);
}

// Direct rounding from double. Going through float would round twice: 1 + 2^-8 + 2^-30 would
// become the tie 1 + 2^-8 in float and then 1 in bf16 instead of 1 + 2^-7.
template <class Format>
constexpr std::uint16_t double_to_half_bits(double value) noexcept {
    const auto u = std::bit_cast<std::uint64_t>(value);
    const auto sign = static_cast<std::uint16_t>((u >> 48) & 0x8000u);
    const std::uint64_t a = u & 0x7fffffffffffffffu;
    if (a >= 0x7ff0000000000000u) {
        if (a == 0x7ff0000000000000u) return sign | Format::exp_mask;
        const auto payload =
            static_cast<std::uint16_t>((a >> (52 - Format::mant_bits)) & Format::mant_mask);
        return sign | Format::exp_mask | Format::quiet_bit | payload;
    }
    if (a == 0) return sign;
    const auto e = static_cast<int>(a >> 52);
    const std::uint64_t frac = a & 0x000fffffffffffffu;
    if (e == 0) return sign | round_magnitude<Format>(frac, -1074);
    return sign | round_magnitude<Format>(frac | 0x0010000000000000u, e - 1075);
}

// Integers round once from their exact value (int64 -> double -> bf16 could round twice).
template <class Format, std::integral Int>
constexpr std::uint16_t integer_to_half_bits(Int value) noexcept {
    if (value == 0) return 0;
    std::uint64_t mag = static_cast<std::uint64_t>(value);
    std::uint16_t sign = 0;
    if constexpr (std::is_signed_v<Int>) {
        if (value < 0) {
            mag = std::uint64_t{0} - mag;  // well defined for the most negative value too
            sign = Format::sign_mask;
        }
    }
    return sign | round_magnitude<Format>(mag, 0);
}

// Operators shared by bf16 and f16, as hidden friends so that only exact Half operands select
// them; mixed operands (bf16 + float) fall back to the built-in float operators via the
// implicit conversion and yield float, as in PyTorch.
template <class Half, class Format>
struct half_operators {
    friend constexpr Half operator+(Half a, Half b) noexcept { return Half(float(a) + float(b)); }
    friend constexpr Half operator-(Half a, Half b) noexcept { return Half(float(a) - float(b)); }
    friend constexpr Half operator*(Half a, Half b) noexcept { return Half(float(a) * float(b)); }
    friend constexpr Half operator/(Half a, Half b) noexcept { return Half(float(a) / float(b)); }
    friend constexpr Half operator+(Half a) noexcept { return a; }
    // Negation is exact: flip the sign bit (NaNs included) without a float round trip.
    friend constexpr Half operator-(Half a) noexcept {
        return Half::from_bits(static_cast<std::uint16_t>(a.bits ^ Format::sign_mask));
    }
    friend constexpr Half& operator+=(Half& a, Half b) noexcept { return a = a + b; }
    friend constexpr Half& operator-=(Half& a, Half b) noexcept { return a = a - b; }
    friend constexpr Half& operator*=(Half& a, Half b) noexcept { return a = a * b; }
    friend constexpr Half& operator/=(Half& a, Half b) noexcept { return a = a / b; }

    // IEEE comparison semantics (NaN unordered, -0 == +0) come from comparing as float.
    friend constexpr bool operator==(Half a, Half b) noexcept { return float(a) == float(b); }
    friend constexpr std::partial_ordering operator<=>(Half a, Half b) noexcept {
        return float(a) <=> float(b);
    }

    // Bit-level classification; found by ADL, preferred over std::isnan(float) for Half.
    friend constexpr bool isnan(Half a) noexcept { return (a.bits & 0x7fffu) > Format::exp_mask; }
    friend constexpr bool isinf(Half a) noexcept { return (a.bits & 0x7fffu) == Format::exp_mask; }
    friend constexpr bool isfinite(Half a) noexcept {
        return (a.bits & Format::exp_mask) != Format::exp_mask;
    }
    friend constexpr bool signbit(Half a) noexcept { return (a.bits & Format::sign_mask) != 0; }
};

}  // namespace detail

// bfloat16: float's sign and 8-bit exponent with a 7-bit fraction (the top half of a float).
struct bf16 : detail::half_operators<bf16, detail::bf16_format> {
    // The raw bit pattern (IEEE float's top 16 bits).
    std::uint16_t bits;

    bf16() = default;  // uninitialised, like float
    // Round to nearest even from float (a NaN stays a quiet NaN).
    constexpr explicit bf16(float value) noexcept : bits(detail::float_to_bf16_bits(value)) {}
    // Round to nearest even from double, directly (no double rounding through float).
    constexpr explicit bf16(double value) noexcept
        : bits(detail::double_to_half_bits<detail::bf16_format>(value)) {}
    // Round to nearest even from an integer.
    template <std::integral Int>
    constexpr explicit bf16(Int value) noexcept
        : bits(detail::integer_to_half_bits<detail::bf16_format>(value)) {}
    // x87 long double has no constexpr bit access; convert to double or float explicitly.
    explicit bf16(long double) = delete;

    // The bf16 whose bit pattern is `b` (torch: tensor.view(torch.bfloat16)).
    static constexpr bf16 from_bits(std::uint16_t b) noexcept {
        bf16 r{};
        r.bits = b;
        return r;
    }

    // Exact widening to float.
    constexpr operator float() const noexcept { return detail::bf16_bits_to_float(bits); }
};

// IEEE 754 binary16: 5-bit exponent (bias 15), 10-bit fraction, subnormals down to 2^-24.
struct f16 : detail::half_operators<f16, detail::f16_format> {
    // The raw IEEE binary16 bit pattern.
    std::uint16_t bits;

    f16() = default;  // uninitialised, like float
    // Round to nearest even from float; overflow gives inf, tiny values subnormals or zero.
    constexpr explicit f16(float value) noexcept : bits(detail::float_to_f16_bits(value)) {}
    // Round to nearest even from double, directly (no double rounding through float).
    constexpr explicit f16(double value) noexcept
        : bits(detail::double_to_half_bits<detail::f16_format>(value)) {}
    // Round to nearest even from an integer.
    template <std::integral Int>
    constexpr explicit f16(Int value) noexcept
        : bits(detail::integer_to_half_bits<detail::f16_format>(value)) {}
    // x87 long double has no constexpr bit access; convert to double or float explicitly.
    explicit f16(long double) = delete;

    // The f16 whose bit pattern is `b`.
    static constexpr f16 from_bits(std::uint16_t b) noexcept {
        f16 r{};
        r.bits = b;
        return r;
    }

    // Exact widening to float.
    constexpr operator float() const noexcept { return detail::f16_bits_to_float(bits); }
};

static_assert(sizeof(bf16) == 2 && alignof(bf16) == 2 && std::is_trivially_copyable_v<bf16> &&
              std::is_standard_layout_v<bf16>);
static_assert(sizeof(f16) == 2 && alignof(f16) == 2 && std::is_trivially_copyable_v<f16> &&
              std::is_standard_layout_v<f16>);

// True for the 16-bit storage types (cv-qualifiers ignored).
template <class T>
inline constexpr bool is_reduced_precision_v =
    std::is_same_v<std::remove_cv_t<T>, bf16> || std::is_same_v<std::remove_cv_t<T>, f16>;

template <class T>
struct is_reduced_precision : std::bool_constant<is_reduced_precision_v<T>> {};

// The type arithmetic on T is carried out in: float for the storage types, T itself otherwise.
template <class T>
struct compute_type {
    // float for bf16 and f16, T otherwise.
    using type = std::conditional_t<is_reduced_precision_v<T>, float, T>;
};

// compute_type<T>::type.
template <class T>
using compute_type_t = typename compute_type<T>::type;

}  // namespace typegrad

namespace std {

template <>
struct numeric_limits<typegrad::bf16> {
    static constexpr bool is_specialized = true;
    static constexpr bool is_signed = true;
    static constexpr bool is_integer = false;
    static constexpr bool is_exact = false;
    static constexpr bool has_infinity = true;
    static constexpr bool has_quiet_NaN = true;
    static constexpr bool has_signaling_NaN = true;
    static constexpr float_denorm_style has_denorm = denorm_present;
    static constexpr bool has_denorm_loss = false;
    static constexpr float_round_style round_style = round_to_nearest;
    static constexpr bool is_iec559 = false;  // not an IEEE 754 interchange format
    static constexpr bool is_bounded = true;
    static constexpr bool is_modulo = false;
    static constexpr int digits = 8;
    static constexpr int digits10 = 2;
    static constexpr int max_digits10 = 4;
    static constexpr int radix = 2;
    static constexpr int min_exponent = -125;
    static constexpr int min_exponent10 = -37;
    static constexpr int max_exponent = 128;
    static constexpr int max_exponent10 = 38;
    static constexpr bool traps = false;
    static constexpr bool tinyness_before = false;

    static constexpr typegrad::bf16 min() noexcept { return typegrad::bf16::from_bits(0x0080); }
    static constexpr typegrad::bf16 lowest() noexcept { return typegrad::bf16::from_bits(0xff7f); }
    static constexpr typegrad::bf16 max() noexcept { return typegrad::bf16::from_bits(0x7f7f); }
    static constexpr typegrad::bf16 epsilon() noexcept { return typegrad::bf16::from_bits(0x3c00); }
    static constexpr typegrad::bf16 round_error() noexcept {
        return typegrad::bf16::from_bits(0x3f00);
    }
    static constexpr typegrad::bf16 infinity() noexcept {
        return typegrad::bf16::from_bits(0x7f80);
    }
    static constexpr typegrad::bf16 quiet_NaN() noexcept {
        return typegrad::bf16::from_bits(0x7fc0);
    }
    static constexpr typegrad::bf16 signaling_NaN() noexcept {
        return typegrad::bf16::from_bits(0x7fa0);
    }
    static constexpr typegrad::bf16 denorm_min() noexcept {
        return typegrad::bf16::from_bits(0x0001);
    }
};

template <>
struct numeric_limits<typegrad::f16> {
    static constexpr bool is_specialized = true;
    static constexpr bool is_signed = true;
    static constexpr bool is_integer = false;
    static constexpr bool is_exact = false;
    static constexpr bool has_infinity = true;
    static constexpr bool has_quiet_NaN = true;
    static constexpr bool has_signaling_NaN = true;
    static constexpr float_denorm_style has_denorm = denorm_present;
    static constexpr bool has_denorm_loss = false;
    static constexpr float_round_style round_style = round_to_nearest;
    static constexpr bool is_iec559 = true;
    static constexpr bool is_bounded = true;
    static constexpr bool is_modulo = false;
    static constexpr int digits = 11;
    static constexpr int digits10 = 3;
    static constexpr int max_digits10 = 5;
    static constexpr int radix = 2;
    static constexpr int min_exponent = -13;
    static constexpr int min_exponent10 = -4;
    static constexpr int max_exponent = 16;
    static constexpr int max_exponent10 = 4;
    static constexpr bool traps = false;
    static constexpr bool tinyness_before = false;

    static constexpr typegrad::f16 min() noexcept { return typegrad::f16::from_bits(0x0400); }
    static constexpr typegrad::f16 lowest() noexcept { return typegrad::f16::from_bits(0xfbff); }
    static constexpr typegrad::f16 max() noexcept { return typegrad::f16::from_bits(0x7bff); }
    static constexpr typegrad::f16 epsilon() noexcept { return typegrad::f16::from_bits(0x1400); }
    static constexpr typegrad::f16 round_error() noexcept {
        return typegrad::f16::from_bits(0x3800);
    }
    static constexpr typegrad::f16 infinity() noexcept { return typegrad::f16::from_bits(0x7c00); }
    static constexpr typegrad::f16 quiet_NaN() noexcept { return typegrad::f16::from_bits(0x7e00); }
    static constexpr typegrad::f16 signaling_NaN() noexcept {
        return typegrad::f16::from_bits(0x7d00);
    }
    static constexpr typegrad::f16 denorm_min() noexcept {
        return typegrad::f16::from_bits(0x0001);
    }
};

}  // namespace std

#endif  // TYPEGRAD_CORE_HALF_HPP
