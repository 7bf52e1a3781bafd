// The packed GEMM against a long-double triple loop: every transpose combination, sizes around
// the micro-tile and cache blocks, padded leading dimensions, accumulation, batches with
// broadcast operands, and threaded results bitwise equal to serial ones.
#include <catch2/catch.hpp>

#include <typegrad/core/cpu/gemm.hpp>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using typegrad::detail::transpose;
using std::size_t;

template <class T>
using config = typegrad::detail::gemm_impl::default_config<T>;

// Stored matrices with padded rows (ld > row length), filled from a fixed seed.
template <class T>
struct matrix {
    size_t rows = 0, cols = 0, ld = 0;
    std::vector<T> data;
    matrix(size_t r, size_t c, size_t pad, std::mt19937_64& rng) : rows(r), cols(c), ld(c + pad) {
        std::uniform_real_distribution<double> u(-1.0, 1.0);
        data.resize(std::max<size_t>(r * ld, 1));
        for (T& x : data) x = T(u(rng));
    }
};

struct case_spec {
    transpose ta, tb;
    size_t m, n, k;
    bool accumulate;
    size_t pad_a = 3, pad_b = 5, pad_c = 7;
};

std::string describe(const case_spec& s) {
    return "ta=" + std::to_string(int(s.ta)) + " tb=" + std::to_string(int(s.tb)) + " m=" + std::to_string(s.m) +
           " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k) + " acc=" + std::to_string(s.accumulate);
}

// Runs one product with gemm and checks every element of C (padding included) against a long
// double reference, within the classic bound (k + 2) eps sum_p |a_ip b_pj| (+ the C term).
template <class T>
void check_gemm(const case_spec& s, std::uint64_t seed) {
    INFO(describe(s));
    std::mt19937_64 rng(seed);
    const matrix<T> a = s.ta == transpose::no ? matrix<T>(s.m, s.k, s.pad_a, rng) : matrix<T>(s.k, s.m, s.pad_a, rng);
    const matrix<T> b = s.tb == transpose::no ? matrix<T>(s.k, s.n, s.pad_b, rng) : matrix<T>(s.n, s.k, s.pad_b, rng);
    matrix<T> c(s.m, s.n, s.pad_c, rng);
    const std::vector<T> c0 = c.data;
    if (!s.accumulate)  // an overwrite must never read C
        for (size_t i = 0; i < s.m; ++i)
            for (size_t j = 0; j < s.n; ++j) c.data[i * c.ld + j] = std::numeric_limits<T>::quiet_NaN();
    const auto op_a = [&](size_t i, size_t p) {
        return s.ta == transpose::no ? a.data[i * a.ld + p] : a.data[p * a.ld + i];
    };
    const auto op_b = [&](size_t p, size_t j) {
        return s.tb == transpose::no ? b.data[p * b.ld + j] : b.data[j * b.ld + p];
    };

    typegrad::detail::gemm<T>(s.ta, s.tb, s.m, s.n, s.k, a.data.data(), a.ld, b.data.data(), b.ld, c.data.data(), c.ld,
                              s.accumulate);

    const long double eps = std::numeric_limits<T>::epsilon();
    size_t bad = 0;
    for (size_t i = 0; i < s.m; ++i) {
        for (size_t j = 0; j < c.ld; ++j) {
            const T got = c.data[i * c.ld + j];
            if (j >= s.n) {  // row padding is never touched
                if (std::memcmp(&got, &c0[i * c.ld + j], sizeof(T)) != 0) ++bad;
                continue;
            }
            long double ref = s.accumulate ? c0[i * c.ld + j] : 0.0L, mag = std::abs(ref);
            for (size_t p = 0; p < s.k; ++p) {
                const long double t = static_cast<long double>(op_a(i, p)) * op_b(p, j);
                ref += t;
                mag += std::abs(t);
            }
            const long double tol = (s.k + 2) * eps * mag + std::numeric_limits<T>::min();
            if (!(std::abs(got - ref) <= tol)) {
                if (bad < 5) UNSCOPED_INFO("C(" << i << "," << j << ") = " << got << ", expected " << double(ref));
                ++bad;
            }
        }
    }
    CHECK(bad == 0);
}

constexpr transpose both[] = {transpose::no, transpose::yes};

template <class T>
void edge_sizes() {
    constexpr size_t MR = config<T>::MR, NR = config<T>::NR;
    const std::vector<size_t> dims{0, 1, 2, 3, MR - 1, MR + 1, NR - 1, NR + 1, 17};
    std::uint64_t seed = 1;
    for (transpose ta : both)
        for (transpose tb : both)
            for (size_t m : dims)
                for (size_t n : dims)
                    for (size_t k : {size_t(0), size_t(1), size_t(3), size_t(17)})
                        check_gemm<T>({ta, tb, m, n, k, (m + n + k) % 2 == 1}, seed++);
}

template <class T>
void block_sizes() {
    constexpr size_t MR = config<T>::MR, NR = config<T>::NR, KC_MAX = config<T>::KC_MAX, MC = config<T>::MC;
    // depth blocks: as few as KC_MAX allows, of equal depth
    STATIC_REQUIRE(typegrad::detail::gemm_impl::depth_step<config<T>>(KC_MAX) == KC_MAX);
    STATIC_REQUIRE(typegrad::detail::gemm_impl::depth_step<config<T>>(KC_MAX + 1) == KC_MAX / 2 + 1);
    STATIC_REQUIRE(typegrad::detail::gemm_impl::depth_step<config<T>>(1568) == 392);  // not 4 x 384 + 32
    std::uint64_t seed = 1000;
    for (transpose ta : both) {
        for (transpose tb : both) {
            const bool acc = ta != tb;
            check_gemm<T>({ta, tb, 100, 37, 513, acc}, seed++);
            // crosses a depth block (two rank-kc updates, the second accumulating) and MC blocks
            check_gemm<T>({ta, tb, MC + MR + 1, 2 * NR + 3, KC_MAX + 1, !acc}, seed++);
            check_gemm<T>({ta, tb, 3, NR * 3, 2 * KC_MAX + 5, acc}, seed++);  // three blocks, the last shorter
        }
    }
    // random shapes, random paddings
    std::mt19937_64 rng(7);
    std::uniform_int_distribution<size_t> dim(1, 90), pad(0, 9), bit(0, 1);
    for (int t = 0; t < 24; ++t) {
        case_spec s{bit(rng) ? transpose::yes : transpose::no, bit(rng) ? transpose::yes : transpose::no,
                    dim(rng), dim(rng), dim(rng), bit(rng) == 1, pad(rng), pad(rng), pad(rng)};
        check_gemm<T>(s, seed++);
    }
}

// Restores the thread settings a test changes, even when it fails.
class thread_settings {
public:
    thread_settings() {
        if (const char* v = std::getenv("TYPEGRAD_NUM_THREADS")) saved_ = v;
    }
    ~thread_settings() {
        typegrad::detail::set_num_threads(0);
        if (saved_) setenv("TYPEGRAD_NUM_THREADS", saved_->c_str(), 1);
        else unsetenv("TYPEGRAD_NUM_THREADS");
    }
    thread_settings(const thread_settings&) = delete;
    thread_settings& operator=(const thread_settings&) = delete;

private:
    std::optional<std::string> saved_;
};

template <class T>
std::vector<T> run_batched(size_t batch, transpose ta, transpose tb, size_t m, size_t n, size_t k, size_t stride_a,
                           size_t stride_b, bool accumulate) {
    std::mt19937_64 rng(42);
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    const size_t lda = (ta == transpose::no ? k : m) + 1, ldb = (tb == transpose::no ? n : k) + 2, ldc = n + 3;
    std::vector<T> a(std::max<size_t>(stride_a * (batch - 1) + (ta == transpose::no ? m : k) * lda, 1));
    std::vector<T> b(std::max<size_t>(stride_b * (batch - 1) + (tb == transpose::no ? k : n) * ldb, 1));
    std::vector<T> c(batch * m * ldc);
    for (T& x : a) x = T(u(rng));
    for (T& x : b) x = T(u(rng));
    for (T& x : c) x = T(u(rng));
    typegrad::detail::gemm_batched<T>(batch, ta, tb, m, n, k, a.data(), lda, stride_a, b.data(), ldb, stride_b,
                                      c.data(), ldc, m * ldc, accumulate);
    return c;
}

template <class T>
void threads_match_serial() {
    thread_settings restore;
    struct shape {
        size_t batch, m, n, k;
    };
    // Above the parallel threshold (2 or 3 threads by work), odd sizes so that the blocks end mid
    // micro-tile; the first shape in every transpose combination, the others in one each.
    const shape shapes[] = {{1, 301, 67, 333}, {1, 1000, 19, 257}, {1, 9, 700, 700}, {3, 70, 71, 290},
                            {12, 40, 37, 300}};
    for (size_t si = 0; si < std::size(shapes); ++si) {
        const shape sh = shapes[si];
        for (size_t combo = 0; combo < 4; ++combo) {
            if (si > 0 && combo != si % 4) continue;
            const transpose ta = both[combo / 2], tb = both[combo % 2];
            INFO("batch=" << sh.batch << " m=" << sh.m << " n=" << sh.n << " k=" << sh.k << " ta=" << int(ta)
                          << " tb=" << int(tb));
            REQUIRE(typegrad::detail::gemm_impl::plan_threads(sh.batch, sh.m, sh.n, sh.k, 8) > 1);
            const size_t sa = ((ta == transpose::no ? sh.k : sh.m) + 1) * (ta == transpose::no ? sh.m : sh.k);
            setenv("TYPEGRAD_NUM_THREADS", "1", 1);
            const auto serial = run_batched<T>(sh.batch, ta, tb, sh.m, sh.n, sh.k, sa, 0, true);
            for (const char* threads : {"3", "8"}) {
                setenv("TYPEGRAD_NUM_THREADS", threads, 1);
                const auto par = run_batched<T>(sh.batch, ta, tb, sh.m, sh.n, sh.k, sa, 0, true);
                REQUIRE(par.size() == serial.size());
                CHECK(std::memcmp(par.data(), serial.data(), par.size() * sizeof(T)) == 0);
            }
            // the internal override wins over the environment
            typegrad::detail::set_num_threads(2);
            const auto over = run_batched<T>(sh.batch, ta, tb, sh.m, sh.n, sh.k, sa, 0, true);
            typegrad::detail::set_num_threads(0);
            CHECK(std::memcmp(over.data(), serial.data(), over.size() * sizeof(T)) == 0);
        }
    }
    CHECK(typegrad::detail::default_thread_pool().size() >= 1);  // the pool did take part
}

template <class T>
void batched_matches_single() {
    constexpr size_t m = 13, n = 21, k = 9;
    for (transpose ta : both) {
        for (transpose tb : both) {
            for (bool acc : {false, true}) {
                INFO("ta=" << int(ta) << " tb=" << int(tb) << " acc=" << acc);
                const size_t rows_a = ta == transpose::no ? m : k, lda = (ta == transpose::no ? k : m) + 1;
                const size_t rows_b = tb == transpose::no ? k : n, ldb = (tb == transpose::no ? n : k) + 2;
                const size_t ldc = n + 3;
                for (auto [sa, sb] : {std::pair{rows_a * lda, rows_b * ldb}, std::pair{size_t(0), rows_b * ldb},
                                      std::pair{rows_a * lda, size_t(0)}}) {
                    constexpr size_t batch = 4;
                    const auto all = run_batched<T>(batch, ta, tb, m, n, k, sa, sb, acc);
                    // Each product again, alone, through gemm.
                    std::mt19937_64 rng(42);
                    std::uniform_real_distribution<double> u(-1.0, 1.0);
                    std::vector<T> a(std::max<size_t>(sa * (batch - 1) + rows_a * lda, 1));
                    std::vector<T> b(std::max<size_t>(sb * (batch - 1) + rows_b * ldb, 1));
                    std::vector<T> c(batch * m * ldc);
                    for (T& x : a) x = T(u(rng));
                    for (T& x : b) x = T(u(rng));
                    for (T& x : c) x = T(u(rng));
                    for (size_t g = 0; g < batch; ++g)
                        typegrad::detail::gemm<T>(ta, tb, m, n, k, a.data() + g * sa, lda, b.data() + g * sb, ldb,
                                                  c.data() + g * m * ldc, ldc, acc);
                    CHECK(std::memcmp(all.data(), c.data(), c.size() * sizeof(T)) == 0);
                }
            }
        }
    }
}

// Matrix-vector products (n == 1 or m == 1) take gemv_batched: dot and axpy forms, k and m around
// the vector width and the kernels' unroll (2 W chunks, 4 rows, 4 W columns), strided x and y.
template <class T>
void gemv_shapes() {
    constexpr size_t W = typegrad::simd::width<T>;
    const std::vector<size_t> rows{1, 2, 3, 4, 5, W - 1, W, W + 1, 4 * W - 1, 4 * W + 3, 150};
    const std::vector<size_t> depths{1, 2, 3, W - 1, W, W + 1, 2 * W - 1, 2 * W, 2 * W + 1, 3 * W + 5, 150, 1000};
    std::uint64_t seed = 5000;
    for (transpose ta : both)
        for (transpose tb : both)
            for (size_t r : rows)
                for (size_t k : depths) {
                    const bool acc = (r + k) % 2 == 0;
                    check_gemm<T>({ta, tb, r, 1, k, acc}, seed++);  // column vector
                    check_gemm<T>({ta, tb, 1, r, k, !acc}, seed++);  // row vector
                }
}

// Small products (use_small_path) against the packed path (gemm_block): the same FMA chain per
// element, so the same bits; and against the reference.
template <class T>
void small_shapes() {
    constexpr size_t W = typegrad::simd::width<T>;
    namespace gi = typegrad::detail::gemm_impl;
    struct shape {
        size_t m, n, k;
    };
    const shape shapes[] = {{2, 2, 2}, {3, 5, 7}, {8, 8, 8}, {2, W - 1, 3}, {5, W + 1, 9}, {7, 4 * W + 3, 11},
                            {20, 20, 20}, {31, 5, 33}, {16, 16, 32}, {9, 3 * W, 12}, {2, 2, 200}, {64, 2, 100},
                            {100, W, 40}};
    std::uint64_t seed = 9000;
    for (const shape& sh : shapes) {
        INFO("m=" << sh.m << " n=" << sh.n << " k=" << sh.k);
        REQUIRE(gi::use_small_path<T>(sh.m, sh.n, sh.k));
        for (transpose ta : both)
            for (transpose tb : both)
                for (bool acc : {false, true}) {
                    check_gemm<T>({ta, tb, sh.m, sh.n, sh.k, acc}, seed++);
                    std::mt19937_64 rng(seed++);
                    const matrix<T> a = ta == transpose::no ? matrix<T>(sh.m, sh.k, 2, rng) : matrix<T>(sh.k, sh.m, 2, rng);
                    const matrix<T> b = tb == transpose::no ? matrix<T>(sh.k, sh.n, 1, rng) : matrix<T>(sh.n, sh.k, 1, rng);
                    matrix<T> c1(sh.m, sh.n, 3, rng);
                    matrix<T> c2 = c1;
                    typegrad::detail::gemm<T>(ta, tb, sh.m, sh.n, sh.k, a.data.data(), a.ld, b.data.data(), b.ld,
                                              c1.data.data(), c1.ld, acc);
                    const gi::operands<T> op{ta, tb, sh.k, a.data.data(), a.ld, b.data.data(), b.ld, c2.data.data(),
                                             c2.ld, acc};
                    gi::gemm_block<T, config<T>>(op, 0, sh.m, 0, sh.n, sh.m, sh.n);
                    CHECK(std::memcmp(c1.data.data(), c2.data.data(), c1.data.size() * sizeof(T)) == 0);
                }
    }
    // just past the limits: the packed path
    CHECK_FALSE(gi::use_small_path<T>(41, 41, 41));
    CHECK_FALSE(gi::use_small_path<T>(24, 24, 24));
    CHECK_FALSE(gi::use_small_path<T>(2, 64, 100));
    CHECK_FALSE(gi::use_small_path<T>(2000, W, 40));
}

// Matrix-vector products large enough for the pool, batched, every form: bitwise equal to serial.
template <class T>
void gemv_threads_match_serial() {
    thread_settings restore;
    struct shape {
        size_t batch, m, n, k;
    };
    const shape shapes[] = {{1, 1000, 1, 1100}, {1, 1, 1003, 1100}, {3, 501, 1, 900}, {2, 1, 777, 1000}};
    for (const shape& sh : shapes)
        for (transpose ta : both)
            for (transpose tb : both) {
                INFO("batch=" << sh.batch << " m=" << sh.m << " n=" << sh.n << " k=" << sh.k << " ta=" << int(ta)
                              << " tb=" << int(tb));
                REQUIRE(double(sh.batch) * double(sh.m * sh.n) * double(sh.k) >=
                        double(typegrad::detail::gemm_impl::gemv_parallel_threshold));
                const size_t sa = ((ta == transpose::no ? sh.k : sh.m) + 1) * (ta == transpose::no ? sh.m : sh.k);
                const size_t sb = ((tb == transpose::no ? sh.n : sh.k) + 2) * (tb == transpose::no ? sh.k : sh.n);
                setenv("TYPEGRAD_NUM_THREADS", "1", 1);
                const auto serial = run_batched<T>(sh.batch, ta, tb, sh.m, sh.n, sh.k, sa, sb, true);
                for (const char* threads : {"2", "3", "8"}) {
                    setenv("TYPEGRAD_NUM_THREADS", threads, 1);
                    const auto par = run_batched<T>(sh.batch, ta, tb, sh.m, sh.n, sh.k, sa, sb, true);
                    REQUIRE(par.size() == serial.size());
                    CHECK(std::memcmp(par.data(), serial.data(), par.size() * sizeof(T)) == 0);
                }
            }
}

// A batch of small products large enough for the pool: split by product, bitwise equal to serial.
template <class T>
void small_threads_match_serial() {
    thread_settings restore;
    constexpr size_t batch = 1200, m = 16, n = 12, k = 20;
    for (transpose ta : both)
        for (transpose tb : both) {
            INFO("ta=" << int(ta) << " tb=" << int(tb));
            const size_t sa = ((ta == transpose::no ? k : m) + 1) * (ta == transpose::no ? m : k);
            setenv("TYPEGRAD_NUM_THREADS", "1", 1);
            const auto serial = run_batched<T>(batch, ta, tb, m, n, k, sa, 0, false);
            setenv("TYPEGRAD_NUM_THREADS", "2", 1);
            const auto par = run_batched<T>(batch, ta, tb, m, n, k, sa, 0, false);
            CHECK(std::memcmp(par.data(), serial.data(), par.size() * sizeof(T)) == 0);
        }
}

}  // namespace

TEST_CASE("gemm: matrix-vector products (n = 1, m = 1), all transposes, strided vectors", "[exec][gemm]") {
    gemv_shapes<float>();
    gemv_shapes<double>();
}

TEST_CASE("gemm: small products skip packing, same bits as the packed path", "[exec][gemm]") {
    small_shapes<float>();
    small_shapes<double>();
}

TEST_CASE("gemm: threaded matrix-vector and small batched products equal serial ones", "[exec][gemm][threads]") {
    gemv_threads_match_serial<float>();
    gemv_threads_match_serial<double>();
    small_threads_match_serial<float>();
    small_threads_match_serial<double>();
}

TEST_CASE("gemm: edge tiles and tiny sizes, all transposes", "[exec][gemm]") {
    edge_sizes<float>();
    edge_sizes<double>();
}

TEST_CASE("gemm: sizes across cache blocks, padded strides, random shapes", "[exec][gemm]") {
    block_sizes<float>();
    block_sizes<double>();
}

TEST_CASE("gemm: k = 0 zeroes C or leaves it when accumulating", "[exec][gemm]") {
    std::vector<float> c(4 * 6, std::numeric_limits<float>::quiet_NaN());
    const float dummy = 0;
    typegrad::detail::gemm<float>(transpose::no, transpose::yes, 4, 5, 0, &dummy, 1, &dummy, 1, c.data(), 6, false);
    for (size_t i = 0; i < 4; ++i) {
        for (size_t j = 0; j < 5; ++j) CHECK(c[i * 6 + j] == 0.f);
        CHECK(std::isnan(c[i * 6 + 5]));
    }
    std::vector<double> d(6, 2.5);
    const double dd = 0;
    typegrad::detail::gemm<double>(transpose::yes, transpose::no, 2, 3, 0, &dd, 1, &dd, 1, d.data(), 3, true);
    for (double x : d) CHECK(x == 2.5);
}

TEST_CASE("gemm_batched: equals one gemm per product, stride 0 broadcasts", "[exec][gemm]") {
    batched_matches_single<float>();
    batched_matches_single<double>();
}

TEST_CASE("gemm: threaded results are bitwise equal to serial ones", "[exec][gemm][threads]") {
    threads_match_serial<float>();
    threads_match_serial<double>();
}

TEST_CASE("gemm: TYPEGRAD_NUM_THREADS and set_num_threads", "[exec][gemm][threads]") {
    thread_settings restore;
    setenv("TYPEGRAD_NUM_THREADS", "3", 1);
    CHECK(typegrad::detail::num_threads() == 3);
    setenv("TYPEGRAD_NUM_THREADS", "1", 1);
    CHECK(typegrad::detail::num_threads() == 1);
    setenv("TYPEGRAD_NUM_THREADS", "lots", 1);  // ignored: falls back to the hardware
    CHECK(typegrad::detail::num_threads() >= 1);
    typegrad::detail::set_num_threads(6);
    CHECK(typegrad::detail::num_threads() == 6);
}

TEST_CASE("thread_pool: runs every task once, rethrows, runs nested calls inline", "[exec][threads]") {
    typegrad::detail::thread_pool pool;
    std::vector<std::atomic<int>> hits(1000);
    pool.parallel_for(hits.size(), 4, [&](size_t i) { hits[i].fetch_add(1); });
    for (auto& h : hits) CHECK(h.load() == 1);

    std::atomic<int> inner{0};
    pool.parallel_for(8, 4, [&](size_t) { pool.parallel_for(10, 4, [&](size_t) { inner.fetch_add(1); }); });
    CHECK(inner.load() == 80);

    CHECK_THROWS_AS(pool.parallel_for(100, 3,
                                      [](size_t i) {
                                          if (i == 17) throw std::runtime_error("task 17");
                                      }),
                    std::runtime_error);
    // still usable afterwards
    std::atomic<int> n{0};
    pool.parallel_for(50, 3, [&](size_t) { n.fetch_add(1); });
    CHECK(n.load() == 50);
}
