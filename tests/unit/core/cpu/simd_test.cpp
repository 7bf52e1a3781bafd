// core/cpu/simd.hpp: the NaN-aware max/min and the reductions of a register's lanes against
// scalar references, over lanes drawn from +-0, +-inf, NaNs of both signs and small integers; exp
// against xsimd's and the C library's.
#include <catch2/catch.hpp>

#include <typegrad/core/cpu/simd.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <iterator>
#include <random>
#include <type_traits>
#include <vector>

namespace simd = typegrad::simd;

namespace {
template <class T>
bool same_bits(T a, T b) {
    return std::memcmp(&a, &b, sizeof(T)) == 0;
}
template <class T>
T draw(std::mt19937& rng) {
    constexpr T nan = std::numeric_limits<T>::quiet_NaN(), inf = std::numeric_limits<T>::infinity();
    switch (rng() % 7) {
        case 0: return T(0);
        case 1: return -T(0);
        case 2: return rng() % 2 ? nan : -nan;
        case 3: return rng() % 2 ? inf : -inf;
        default: return T(int(rng() % 9) - 4) * (rng() % 2 ? T(1) : T(0.375));
    }
}

template <class T>
void check_max_min() {
    using B = xsimd::batch<T>;
    constexpr std::size_t W = B::size;
    std::mt19937 rng(11);
    std::size_t bad = 0;
    for (int t = 0; t < 20000; ++t) {
        alignas(64) T a[W], b[W], hi[W], lo[W];
        for (std::size_t i = 0; i < W; ++i) a[i] = draw<T>(rng), b[i] = draw<T>(rng);
        simd::max(B::load_aligned(a), B::load_aligned(b)).store_aligned(hi);
        simd::min(B::load_aligned(a), B::load_aligned(b)).store_aligned(lo);
        for (std::size_t i = 0; i < W; ++i) {
            // a NaN wins (a's before b's); otherwise the larger (smaller), b when they compare equal
            const T want_hi = a[i] != a[i] ? a[i] : b[i] != b[i] ? b[i] : (a[i] > b[i] ? a[i] : b[i]);
            const T want_lo = a[i] != a[i] ? a[i] : b[i] != b[i] ? b[i] : (a[i] < b[i] ? a[i] : b[i]);
            bad += !same_bits(hi[i], want_hi) + !same_bits(lo[i], want_lo);
        }
    }
    CHECK(bad == 0);
}

template <class T>
void check_lane_reductions() {
    using B = xsimd::batch<T>;
    constexpr std::size_t W = B::size;
    std::mt19937 rng(12);
    std::size_t bad_max = 0, bad_prod = 0;
    for (int t = 0; t < 20000; ++t) {
        alignas(64) T lanes[W], pairs[W];
        for (std::size_t i = 0; i < W; ++i) lanes[i] = pairs[i] = draw<T>(rng);
        T m = lanes[0];
        for (std::size_t i = 1; i < W; ++i) m = (lanes[i] > m || lanes[i] != lanes[i]) ? lanes[i] : m;
        for (std::size_t n = W / 2; n > 0; n /= 2)  // the pairing reduce_prod keeps: lane i with i + n
            for (std::size_t i = 0; i < n; ++i) pairs[i] *= pairs[i + n];
        const T got_max = simd::reduce_max(B::load_aligned(lanes));
        const T got_prod = simd::reduce_prod(B::load_aligned(lanes));
        // max: the same value, NaN exactly when a lane is NaN (which zero or NaN comes out may differ)
        bad_max += m != m ? got_max == got_max : !(got_max == m);
        // prod: the same bits, but for which NaN
        bad_prod += pairs[0] != pairs[0] ? got_prod == got_prod : !same_bits(got_prod, pairs[0]);
    }
    CHECK(bad_max == 0);
    CHECK(bad_prod == 0);
}
}  // namespace

TEST_CASE("simd::max and min propagate either operand's NaN and otherwise keep maxps' choice", "[core][simd]") {
    check_max_min<float>();
    check_max_min<double>();
}

TEST_CASE("a register's lanes reduce to the left fold's maximum and the pairwise product", "[core][simd]") {
    check_lane_reductions<float>();
    check_lane_reductions<double>();
}

namespace {
// load_first(p, m): lanes [0, m) from p, the others p[m - 1]; store_first: writes p[0, m) only.
// Native (masked AVX-512 / AVX2) and buffered versions alike, every m.
template <class T>
void check_first_lanes() {
    using B = xsimd::batch<T>;
    constexpr std::size_t W = B::size;
    const T sentinel = T(-7.5);
    for (std::size_t m = 1; m < W; ++m) {
        for (const bool native : {true, false}) {
            INFO("width " << W << ", m " << m << (native ? ", native" : ", buffered"));
            std::vector<T> src(m);
            for (std::size_t l = 0; l < m; ++l) src[l] = T(l) + T(0.25);
            alignas(64) T got[W];
            (native ? simd::load_first(src.data(), m) : simd::load_first_buffered(src.data(), m)).store_aligned(got);
            for (std::size_t l = 0; l < W; ++l) CHECK(got[l] == src[l < m ? l : m - 1]);
            alignas(64) T lanes[W];
            for (std::size_t l = 0; l < W; ++l) lanes[l] = T(100 + l);
            std::vector<T> dst(W, sentinel);
            if (native) simd::store_first(dst.data(), B::load_aligned(lanes), m);
            else simd::store_first_buffered(dst.data(), B::load_aligned(lanes), m);
            for (std::size_t l = 0; l < W; ++l) CHECK(dst[l] == (l < m ? T(100 + l) : sentinel));
        }
    }
}
}  // namespace

TEST_CASE("a partial batch loads the first lanes, repeats the last, and stores only the first", "[core][simd]") {
    check_first_lanes<float>();
    check_first_lanes<double>();
}

namespace {
template <class T, class Bits>
long ulps_apart(T a, T b) {  // a and b finite and of one sign
    Bits x, y;
    std::memcpy(&x, &a, sizeof(T));
    std::memcpy(&y, &b, sizeof(T));
    return x > y ? long(x - y) : long(y - x);
}
// simd::exp over inputs spread evenly through [lo, hi) (every step-th representable value), in
// full registers: for |x| up to 87 (708 for double), where xsimd's exp neither flushes nor
// overflows, float within 2 ulps of the C library's (its own polynomial in FMAs) and double
// xsimd's bits; beyond, within an ulp of the C library's.
template <class T, class Bits>
void check_exp(T lo, T hi, long samples) {
    using B = xsimd::batch<T>;
    constexpr std::size_t W = B::size;
    const T edge = std::is_same_v<T, float> ? T(87) : T(708);
    std::size_t near_off = 0, far = 0, far_off = 0, far_ulps = 0;
    std::vector<T> in;
    for (T v = lo; v < hi;) {
        in.push_back(v);
        const T step = (hi - lo) / T(samples);
        v = std::max(std::nextafter(v, hi), v + step);
    }
    while (in.size() % W) in.push_back(T(0));
    for (std::size_t i = 0; i < in.size(); i += W) {
        alignas(64) T got[W], ref[W];
        const B x = B::load_unaligned(in.data() + i);
        simd::exp(x).store_aligned(got);
        xsimd::exp(x).store_aligned(ref);
        for (std::size_t l = 0; l < W; ++l) {
            const T v = in[i + l];
            const T want = std::exp(v);
            if (std::abs(v) <= edge) {
                if constexpr (std::is_same_v<T, float>) near_off += ulps_apart<T, Bits>(got[l], want) > 2;
                else near_off += !same_bits(got[l], ref[l]);
            } else {
                ++far;
                if (std::isinf(want) || std::isinf(got[l])) {
                    far_off += !(got[l] == want);
                } else {
                    const long d = ulps_apart<T, Bits>(got[l], want);
                    far_off += d > 1;
                    far_ulps += d;
                }
            }
        }
    }
    INFO(far << " inputs beyond +-" << edge << ", " << far_ulps << " ulps apart from the C library in all");
    CHECK(far > 1000);
    CHECK(near_off == 0);
    CHECK(far_off == 0);
}
}  // namespace

// xsimd 8.1 flushes exp's subnormal results to 0 and overflows below the largest float; simd::exp
// reaches both (PyTorch does).
TEST_CASE("simd::exp is within 2 ulps of the C library's and reaches subnormals and the largest values", "[core][simd][exp]") {
    check_exp<float, std::uint32_t>(-110.f, 100.f, 3'000'000);
    check_exp<float, std::uint32_t>(-104.f, -86.f, 1'000'000);  // the subnormal results, densely
    check_exp<float, std::uint32_t>(86.f, 89.f, 300'000);       // the largest, up to overflow
    check_exp<double, std::uint64_t>(-760.0, 720.0, 2'000'000);
    check_exp<double, std::uint64_t>(-746.0, -706.0, 1'000'000);
    check_exp<double, std::uint64_t>(706.0, 710.0, 300'000);
    // special values, in registers of their own and among finite lanes
    for (const bool mixed : {false, true}) {
        using B = xsimd::batch<float>;
        constexpr float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
        alignas(64) float x[B::size], r[B::size];
        const float specials[] = {-inf, inf, nan, -nan, -1e30f, 1e30f, -104.f, 89.f, 0.f, -0.f};
        for (std::size_t l = 0; l < B::size; ++l) x[l] = mixed && l % 2 ? -90.f : specials[l % std::size(specials)];
        simd::exp(B::load_aligned(x)).store_aligned(r);
        for (std::size_t l = 0; l < B::size; ++l) {
            INFO("x = " << x[l]);
            if (x[l] != x[l]) CHECK(r[l] != r[l]);
            else if (x[l] == -90.f) CHECK(std::abs(r[l] - std::exp(-90.f)) <= std::numeric_limits<float>::denorm_min());
            else CHECK(r[l] == (x[l] < -100.f ? 0.f : x[l] > 88.f ? inf : 1.f));
        }
    }
}
