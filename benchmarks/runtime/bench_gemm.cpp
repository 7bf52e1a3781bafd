// GEMM throughput: typegrad's packed GEMM (detail::gemm) on square row-major products, on one
// thread and on the pool, against a register-resident FMA loop (the core's peak) and, when
// built with TYPEGRAD_BENCH_HAVE_OPENBLAS and <cblas.h> is found, OpenBLAS.
//
//   gemm/typegrad/<type>/<n>          one thread (detail::set_num_threads(1))
//   gemm/typegrad_mt/<type>/<n>       TYPEGRAD_NUM_THREADS, else all hardware threads
//   gemm/openblas/<type>/<n>          OpenBLAS on one thread
//   gemm/openblas_mt/<type>/<n>       OpenBLAS on as many threads as typegrad_mt
//   peak_fma/xsimd/<type>/<acc>       <acc> independent FMA chains, no memory traffic
//
// Counters: GFLOPS (2 m n k per iteration, per second) and threads (the threads typegrad runs
// that size on; OpenBLAS: the threads it was allowed). The _mt variants time the wall clock
// (GFLOPS per wall-clock second) and report the whole process's CPU time; the others time the
// CPU time of the benchmark thread, which on a shared machine excludes the time other tenants
// hold the core.
//
// Standalone (one line; see docs/gemm.md):
//   g++ -std=c++20 -O3 -march=native -I include benchmarks/runtime/bench_gemm.cpp
//       -DTYPEGRAD_BENCH_HAVE_OPENBLAS -lopenblas -lbenchmark -lbenchmark_main -pthread
#include <benchmark/benchmark.h>

#include <typegrad/core/cpu/gemm.hpp>
#include <typegrad/core/cpu/simd.hpp>

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(TYPEGRAD_BENCH_HAVE_OPENBLAS) && __has_include(<cblas.h>)
#include <cblas.h>
#define TYPEGRAD_BENCH_OPENBLAS 1
#else
#define TYPEGRAD_BENCH_OPENBLAS 0
#endif

namespace {

using std::size_t;
namespace tgd = typegrad::detail;

constexpr std::int64_t gemm_sizes[] = {64, 128, 256, 512, 1024};

template <class T>
constexpr const char* type_name() {
    return std::is_same_v<T, float> ? "float" : "double";
}

template <class T>
struct operands {
    std::vector<T> a, b, c;
};

// Inputs are built once per size: Google Benchmark re-enters a benchmark per repetition.
template <class T>
const operands<T>& inputs(size_t n) {
    static std::map<size_t, std::unique_ptr<operands<T>>> cache;
    auto& slot = cache[n];
    if (!slot) {
        slot = std::make_unique<operands<T>>();
        std::mt19937_64 rng(n);
        std::uniform_real_distribution<double> u(-1.0, 1.0);
        slot->a.resize(n * n);
        slot->b.resize(n * n);
        slot->c.assign(n * n, T(0));
        for (T& x : slot->a) x = T(u(rng));
        for (T& x : slot->b) x = T(u(rng));
    }
    return *slot;
}

// A few entries of C against a double dot product: a broken kernel must not post a number.
template <class T>
bool spot_check(benchmark::State& state, size_t n, const T* a, const T* b, const T* c) {
    const double tol = (std::is_same_v<T, float> ? 1e-5 : 1e-13) * double(n);
    for (size_t s = 0; s < 16; ++s) {
        const size_t i = (s * 7919) % n, j = (s * 104729 + 3) % n;
        double ref = 0;
        for (size_t p = 0; p < n; ++p) ref += double(a[i * n + p]) * double(b[p * n + j]);
        if (!(std::abs(double(c[i * n + j]) - ref) <= tol)) {
            state.SkipWithError("gemm result does not match the reference");
            return false;
        }
    }
    return true;
}

void set_counters(benchmark::State& state, size_t n, size_t threads) {
    state.counters["GFLOPS"] = benchmark::Counter(2.0 * double(n) * double(n) * double(n) * 1e-9,
                                                  benchmark::Counter::kIsIterationInvariantRate);
    state.counters["threads"] = double(threads);
}

// Restores the thread setting when the benchmark ends.
struct thread_override {
    explicit thread_override(size_t n) { tgd::set_num_threads(n); }
    ~thread_override() { tgd::set_num_threads(0); }
    thread_override(const thread_override&) = delete;
    thread_override& operator=(const thread_override&) = delete;
};

template <class T, bool Threaded>
void bm_typegrad(benchmark::State& state) {
    const size_t n = size_t(state.range(0));
    thread_override threads(Threaded ? 0 : 1);
    const operands<T>& in = inputs<T>(n);
    std::vector<T> c(n * n);
    const auto run = [&] {
        tgd::gemm<T>(tgd::transpose::no, tgd::transpose::no, n, n, n, in.a.data(), n, in.b.data(), n, c.data(), n,
                     false);
    };
    run();
    if (!spot_check(state, n, in.a.data(), in.b.data(), c.data())) return;
    for (auto _ : state) {
        run();
        benchmark::DoNotOptimize(c.data());
        benchmark::ClobberMemory();
    }
    set_counters(state, n, tgd::gemm_impl::plan_threads(1, n, n, n, 0));  // what this size runs on
}

#if TYPEGRAD_BENCH_OPENBLAS
template <class T, bool Threaded>
void bm_openblas(benchmark::State& state) {
    const size_t n = size_t(state.range(0));
    const size_t threads = Threaded ? tgd::num_threads() : 1;
    openblas_set_num_threads(int(threads));
    const operands<T>& in = inputs<T>(n);
    std::vector<T> c(n * n);
    const int ni = int(n);
    const auto run = [&] {
        if constexpr (std::is_same_v<T, float>)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ni, ni, ni, 1.0f, in.a.data(), ni, in.b.data(),
                        ni, 0.0f, c.data(), ni);
        else
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ni, ni, ni, 1.0, in.a.data(), ni, in.b.data(),
                        ni, 0.0, c.data(), ni);
    };
    run();
    if (!spot_check(state, n, in.a.data(), in.b.data(), c.data())) return;
    for (auto _ : state) {
        run();
        benchmark::DoNotOptimize(c.data());
        benchmark::ClobberMemory();
    }
    set_counters(state, n, threads);
    openblas_set_num_threads(1);
}
#endif

// The single-core peak: Acc independent FMA chains on full batches, registers only. Acc must
// cover FMA latency x FMA issue rate (4 cycles x 2 per cycle on current x86), or the loop
// measures latency instead. Fold expressions, not lambdas, keep the chains in registers.
template <class T, size_t... I>
void fma_chains(benchmark::State& state, std::index_sequence<I...>) {
    using V = typegrad::simd::batch<T>;
    constexpr size_t inner = 1024;
    V acc[sizeof...(I)] = {V(T(1) + T(I) * T(1e-3))...};
    const V x(T(1) - T(1e-6)), y(T(1e-6));
    for (auto _ : state) {
        for (size_t r = 0; r < inner; ++r) ((acc[I] = tgd::gemm_impl::fmadd(acc[I], x, y)), ...);
        benchmark::DoNotOptimize(acc[0]);  // keeps the chains live; one store per 1024 steps
    }
    V sum = (acc[I] + ...);
    benchmark::DoNotOptimize(sum);
    state.counters["GFLOPS"] = benchmark::Counter(
        2.0 * double(typegrad::simd::width<T>) * double(sizeof...(I)) * double(inner) * 1e-9,
        benchmark::Counter::kIsIterationInvariantRate);
    state.counters["threads"] = 1;
}
template <class T, size_t Acc>
void bm_peak_fma(benchmark::State& state) {
    fma_chains<T>(state, std::make_index_sequence<Acc>{});
}

template <class T>
void register_type() {
    const std::string type = type_name<T>();
    auto single = [&](const std::string& impl, void (*fn)(benchmark::State&)) {
        auto* b = benchmark::RegisterBenchmark(("gemm/" + impl + "/" + type).c_str(), fn);
        for (std::int64_t n : gemm_sizes) b->Arg(n);
        b->Unit(benchmark::kMicrosecond);
    };
    auto threaded = [&](const std::string& impl, void (*fn)(benchmark::State&)) {
        auto* b = benchmark::RegisterBenchmark(("gemm/" + impl + "/" + type).c_str(), fn);
        for (std::int64_t n : gemm_sizes) b->Arg(n);
        b->Unit(benchmark::kMicrosecond)->UseRealTime()->MeasureProcessCPUTime();
    };
    single("typegrad", bm_typegrad<T, false>);
    threaded("typegrad_mt", bm_typegrad<T, true>);
#if TYPEGRAD_BENCH_OPENBLAS
    single("openblas", bm_openblas<T, false>);
    threaded("openblas_mt", bm_openblas<T, true>);
#endif
    benchmark::RegisterBenchmark(("peak_fma/xsimd/" + type).c_str(), bm_peak_fma<T, 12>)->Arg(12);
}

[[maybe_unused]] const bool registered = [] {
    register_type<float>();
    register_type<double>();
    return true;
}();

}  // namespace
