// The 16-bit GEMM (gemm_half.hpp): bf16 operands on vdpbf16ps where the CPU has it (blocked and
// threaded), the float path otherwise and for f16; f32 accumulation against a long double
// reference, strided and transposed operands, sizes around the tiles and cache blocks, threaded
// results bitwise equal to serial ones, and subnormal operands (docs/reliability.md, finding 17).
#include <catch2/catch.hpp>

#include <typegrad/core/cpu/gemm_half.hpp>
#include <typegrad/typegrad.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace {

namespace tgd = typegrad::detail;
using typegrad::bf16;
using typegrad::f16;
using std::size_t;

// A k-deep operand stored with the given layout: dense rows (col stride 1), transposed (row
// stride 1) or with both strides above 1 (every other element of a wider matrix).
enum class layout { rows, transposed, strided };

template <class S>
struct operand {
    std::vector<S> data;
    tgd::strided_matrix<S> view;
};

template <class S>
operand<S> make_operand(size_t rows, size_t cols, layout l, std::mt19937_64& rng, double scale = 1.0) {
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    operand<S> o;
    const size_t pad = 3;
    std::ptrdiff_t rs = 0, cs = 0;
    size_t size = 0;
    switch (l) {
        case layout::rows: rs = std::ptrdiff_t(cols + pad), cs = 1, size = rows * (cols + pad); break;
        case layout::transposed: rs = 1, cs = std::ptrdiff_t(rows + pad), size = cols * (rows + pad); break;
        case layout::strided: rs = std::ptrdiff_t(2 * cols + 1), cs = 2, size = rows * (2 * cols + 1); break;
    }
    o.data.resize(std::max<size_t>(size, 1));
    for (S& x : o.data) x = S(float(scale * u(rng)));
    o.view = {o.data.data(), rs, cs};
    return o;
}

template <class S>
long double at(const tgd::strided_matrix<S>& v, size_t i, size_t j) {
    return static_cast<long double>(v.at(i, j));
}

// c = a b through gemm_reduced<float>, checked against long double within the float-summation
// bound (k + 2) eps sum |a b| (every product of two 16-bit values is exact in float).
template <class SA, class SB>
void check_reduced(size_t m, size_t n, size_t k, layout la, layout lb, std::uint64_t seed) {
    INFO("m=" << m << " n=" << n << " k=" << k << " la=" << int(la) << " lb=" << int(lb));
    std::mt19937_64 rng(seed);
    const operand<SA> a = make_operand<SA>(m, k, la, rng);
    const operand<SB> b = make_operand<SB>(k, n, lb, rng);
    std::vector<float> c(m * n + 1, std::numeric_limits<float>::quiet_NaN());
    tgd::gemm_reduced<float>(m, n, k, a.view, b.view, c.data());
    const long double eps = std::numeric_limits<float>::epsilon();
    size_t bad = 0;
    for (size_t i = 0; i < m; ++i)
        for (size_t j = 0; j < n; ++j) {
            long double ref = 0, mag = 0;
            for (size_t p = 0; p < k; ++p) {
                const long double t = at(a.view, i, p) * at(b.view, p, j);
                ref += t;
                mag += std::abs(t);
            }
            const float got = c[i * n + j];
            if (!(std::abs(got - ref) <= (k + 2) * eps * mag)) {
                if (bad < 5) UNSCOPED_INFO("C(" << i << "," << j << ") = " << got << ", expected " << double(ref));
                ++bad;
            }
        }
    CHECK(bad == 0);
    CHECK(std::isnan(c[m * n]));  // nothing written past C
}

class thread_settings {
public:
    thread_settings() {
        if (const char* v = std::getenv("TYPEGRAD_NUM_THREADS")) saved_ = v;
    }
    ~thread_settings() {
        tgd::set_num_threads(0);
        if (saved_) setenv("TYPEGRAD_NUM_THREADS", saved_->c_str(), 1);
        else unsetenv("TYPEGRAD_NUM_THREADS");
    }
    thread_settings(const thread_settings&) = delete;
    thread_settings& operator=(const thread_settings&) = delete;

private:
    std::optional<std::string> saved_;
};

float bf16_sub(int e) { return std::ldexp(1.f, e); }  // 2^e, e in [-133, -127): a bf16 subnormal

}  // namespace

TEST_CASE("gemm_half: bf16 x bf16 against long double, tiles and cache blocks, all layouts", "[exec][gemm]") {
    struct shape {
        size_t m, n, k;
    };
    // around the 8 x 32 tile, odd k (a half pair), past KCP = 192 pairs, MC = 192 rows
    const shape shapes[] = {{0, 3, 4},  {3, 0, 4},   {1, 1, 1},   {1, 1, 2},     {2, 3, 0},   {7, 31, 5},
                            {8, 32, 6}, {9, 33, 17}, {17, 65, 3}, {5, 40, 385},  {200, 9, 7}, {33, 70, 400},
                            {1, 50, 9}, {50, 1, 9}};
    std::uint64_t seed = 1;
    for (const shape& s : shapes)
        for (layout la : {layout::rows, layout::transposed, layout::strided})
            for (layout lb : {layout::rows, layout::transposed, layout::strided})
                check_reduced<bf16, bf16>(s.m, s.n, s.k, la, lb, seed++);
    // wider than NC = 2048 columns
    check_reduced<bf16, bf16>(3, 2100, 5, layout::rows, layout::rows, seed++);
    check_reduced<bf16, bf16>(3, 2100, 5, layout::transposed, layout::transposed, seed++);
}

TEST_CASE("gemm_half: f16 and mixed operands take the float path", "[exec][gemm]") {
    check_reduced<f16, f16>(9, 33, 17, layout::rows, layout::transposed, 77);
    check_reduced<bf16, float>(9, 33, 17, layout::transposed, layout::rows, 78);
    check_reduced<float, bf16>(5, 3, 40, layout::strided, layout::rows, 79);
}

TEST_CASE("gemm_half: threaded bf16 products are bitwise equal to serial ones", "[exec][gemm][threads]") {
    thread_settings restore;
    struct shape {
        size_t m, n, k;
        layout la, lb;
    };
    const shape shapes[] = {{301, 67, 433, layout::rows, layout::rows},
                            {130, 260, 401, layout::transposed, layout::rows},
                            {20, 700, 700, layout::rows, layout::transposed},
                            {260, 200, 300, layout::strided, layout::strided}};
    std::uint64_t seed = 500;
    for (const shape& s : shapes) {
        INFO("m=" << s.m << " n=" << s.n << " k=" << s.k);
        REQUIRE(tgd::gemm_impl::plan_threads(1, s.m, s.n, (s.k + 1) / 2, 8) > 1);
        std::mt19937_64 rng(seed++);
        const operand<bf16> a = make_operand<bf16>(s.m, s.k, s.la, rng);
        const operand<bf16> b = make_operand<bf16>(s.k, s.n, s.lb, rng);
        std::vector<float> serial(s.m * s.n), par(s.m * s.n);
        tgd::set_num_threads(1);
        tgd::gemm_reduced<float>(s.m, s.n, s.k, a.view, b.view, serial.data());
        for (size_t t : {2, 3, 8}) {
            tgd::set_num_threads(t);
            std::fill(par.begin(), par.end(), -1.f);
            tgd::gemm_reduced<float>(s.m, s.n, s.k, a.view, b.view, par.data());
            CHECK(std::memcmp(par.data(), serial.data(), par.size() * sizeof(float)) == 0);
        }
        // and through bf16 output (rounded once from the same f32 sums)
        std::vector<bf16> s16(s.m * s.n), p16(s.m * s.n);
        tgd::set_num_threads(1);
        tgd::gemm_reduced<bf16>(s.m, s.n, s.k, a.view, b.view, s16.data());
        tgd::set_num_threads(2);
        tgd::gemm_reduced<bf16>(s.m, s.n, s.k, a.view, b.view, p16.data());
        CHECK(std::memcmp(s16.data(), p16.data(), s16.size() * sizeof(bf16)) == 0);
    }
}

TEST_CASE("gemm_half: subnormal bf16 operands and subnormal sums are kept (finding 17)", "[exec][gemm]") {
    const float sub = bf16_sub(-133);  // the smallest bf16 subnormal
    SECTION("the exactness rule") {
        const bf16 one(1.f), tiny(bf16_sub(-130)), small(std::ldexp(1.f, -70)), normal(std::ldexp(1.f, -56));
        const tgd::strided_matrix<bf16> v1{&one, 1, 1}, vt{&tiny, 1, 1}, vs{&small, 1, 1}, vn{&normal, 1, 1};
        CHECK(tgd::bf16_dot_is_exact(1, 1, 1, v1, v1));
        CHECK_FALSE(tgd::bf16_dot_is_exact(1, 1, 1, v1, vt));      // a subnormal operand
        CHECK_FALSE(tgd::bf16_dot_is_exact(1, 1, 1, vs, vs));      // 2^-140: a subnormal product
        CHECK(tgd::bf16_dot_is_exact(1, 1, 1, vn, vn));            // 2^-112, quantum 2^-126
        const bf16 zero(0.f), inf(INFINITY);
        const tgd::strided_matrix<bf16> vz{&zero, 1, 1}, vi{&inf, 1, 1};
        CHECK(tgd::bf16_dot_is_exact(1, 1, 1, vz, vi));
    }
    SECTION("docs/reliability.md's reproducer, through gemm_reduced") {
        // a = [[-inf, 0], [1, 0]], b = [[-sub, 0], [2 sub, 0]]: a b = [[inf, NaN], [-sub, 0]]
        const std::vector<bf16> a{bf16(-INFINITY), bf16(0.f), bf16(1.f), bf16(0.f)};
        const std::vector<bf16> b{bf16(-sub), bf16(0.f), bf16(2 * sub), bf16(0.f)};
        std::vector<float> c(4);
        tgd::gemm_reduced<float>(2, 2, 2, tgd::strided_matrix<bf16>{a.data(), 2, 1},
                                 tgd::strided_matrix<bf16>{b.data(), 2, 1}, c.data());
        CHECK(c[0] == INFINITY);
        CHECK(std::isnan(c[1]));
        CHECK(c[2] == -sub);
        CHECK(c[3] == 0.f);
    }
    SECTION("products below the normal range, and a cancellation into it") {
        // 16 x 16 x 8: every product 2^-70 * 2^-70 = 2^-140 (a float subnormal); the sum is 8 of them
        const size_t m = 16, n = 16, k = 8;
        std::vector<bf16> a(m * k, bf16(std::ldexp(1.f, -70))), b(k * n, bf16(std::ldexp(1.f, -70)));
        std::vector<float> c(m * n);
        tgd::gemm_reduced<float>(m, n, k, tgd::strided_matrix<bf16>{a.data(), std::ptrdiff_t(k), 1},
                                 tgd::strided_matrix<bf16>{b.data(), std::ptrdiff_t(n), 1}, c.data());
        for (float x : c) CHECK(x == std::ldexp(1.f, -137));
        // (1 + 2^-7) 2^-63 * 2^-63 - 2^-63 * 2^-63 = 2^-133: normal inputs, a subnormal result
        const std::vector<bf16> x{bf16(std::ldexp(1.f + 1.f / 128, -63)), bf16(-std::ldexp(1.f, -63))};
        const std::vector<bf16> y{bf16(std::ldexp(1.f, -63)), bf16(std::ldexp(1.f, -63))};
        float r = -1;
        tgd::gemm_reduced<float>(1, 1, 2, tgd::strided_matrix<bf16>{x.data(), 2, 1},
                                 tgd::strided_matrix<bf16>{y.data(), 1, 1}, &r);
        CHECK(r == std::ldexp(1.f, -133));
    }
    SECTION("through a compiled bf16 matmul (docs/reliability.md, finding 17)") {
        namespace tg = typegrad;
        constexpr auto a = tg::param<"a", tg::bf16, tg::shape<2, 2>>;
        constexpr auto b = tg::param<"b", tg::bf16, tg::shape<2, 2>>;
        std::vector<tg::bf16> ad{tg::bf16(-INFINITY), tg::bf16(0.f), tg::bf16(1.f), tg::bf16(0.f)};
        std::vector<tg::bf16> bd{tg::bf16(-sub), tg::bf16(0.f), tg::bf16(2 * sub), tg::bf16(0.f)};
        auto ctx = tg::compile(tg::matmul(a, b), tg::wrt(a)).forward(tg::bind(a, ad), tg::bind(b, bd));
        const auto v = ctx.values();
        REQUIRE(v.size() == 4);
        CHECK(float(v[0]) == INFINITY);
        CHECK(std::isnan(float(v[1])));
        CHECK(float(v[2]) == -sub);
        CHECK(float(v[3]) == 0.f);
    }
}
