// Shared benchmark harness: correctness check against the reference, and registration.
//
//   double tgb::default_rel_tol<T>(std::size_t n);
//       1e-10 for double; for float max(1e-4, 4 sqrt(n) eps_float), since a float reduction over n
//       terms drifts like sqrt(n) rounding errors (n = 1e6 gives ~4.8e-4).
//
//   template <class T>
//   bool tgb::check_result(benchmark::State& state, const tgb::reference_result& ref, double value,
//                          std::initializer_list<std::span<const T>> grad_blocks,
//                          double rel_tol = 0);
//       Compares value (relative error) and the concatenated grad_blocks (relative L2 error) with
//       the reference; rel_tol <= 0 means default_rel_tol<T>(ref.grad.size()). On mismatch
//       calls state.SkipWithError with both errors and returns false; call it once BEFORE the timing loop and return if it fails:
//           if (!tgb::check_result<T>(state, fx.ref, f(), {gx, gy})) return;
//
//   void tgb::register_bench(std::string_view workload, std::string_view impl,
//                            void (*fn_float)(benchmark::State&), void (*fn_double)(benchmark::State&),
//                            std::span<const std::int64_t> sizes,
//                            std::int64_t max_size = INT64_MAX);
//       Registers "<workload>/<impl>/float" and ".../double", one benchmark per size <= max_size
//       (Google Benchmark appends "/<size>"). Call from a namespace-scope initialiser in your TU.
//       Benchmarks must stay on the calling thread: make_table.py reports that thread's CPU time.
#pragma once

#include "workloads.hpp"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace tgb {

template <class T>
double default_rel_tol(std::size_t n = 0) {
    if constexpr (std::is_same_v<T, float>)
        return std::max(1e-4, 4 * std::sqrt(double(n)) * std::numeric_limits<float>::epsilon());
    else
        return 1e-10;
}

template <class T>
bool check_result(benchmark::State& state, const reference_result& ref, double value,
                  std::initializer_list<std::span<const T>> grad_blocks,
                  double rel_tol = 0) {
    if (rel_tol <= 0) rel_tol = default_rel_tol<T>(ref.grad.size());
    const double tiny = std::numeric_limits<double>::min();
    const double value_err = std::abs(value - ref.value) / std::max(std::abs(ref.value), tiny);

    std::size_t n = 0;
    double diff2 = 0, ref2 = 0;
    for (auto block : grad_blocks)
        for (T g : block) {
            const double r = n < ref.grad.size() ? ref.grad[n] : 0.0;
            diff2 += (double(g) - r) * (double(g) - r);
            ref2 += r * r;
            ++n;
        }
    const double grad_err = std::sqrt(diff2) / std::max(std::sqrt(ref2), tiny);

    // Negated comparisons so that NaN counts as a failure.
    if (n == ref.grad.size() && !(value_err > rel_tol) && !(grad_err > rel_tol)) return true;
    char msg[256];
    std::snprintf(msg, sizeof msg,
                  "mismatch vs reference: value rel err %.3g, grad rel L2 err %.3g (tol %.3g), "
                  "grad size %zu vs %zu",
                  value_err, grad_err, rel_tol, n, ref.grad.size());
    state.SkipWithError(msg);  // copies msg
    return false;
}

inline void register_bench(std::string_view workload, std::string_view impl,
                           void (*fn_float)(benchmark::State&), void (*fn_double)(benchmark::State&),
                           std::span<const std::int64_t> sizes,
                           std::int64_t max_size = std::numeric_limits<std::int64_t>::max()) {
    for (auto [fn, type] : {std::pair{fn_float, "float"}, std::pair{fn_double, "double"}}) {
        const std::string name = std::string(workload) + "/" + std::string(impl) + "/" + type;
        auto* b = benchmark::RegisterBenchmark(name.c_str(), fn);
        for (std::int64_t n : sizes)
            if (n <= max_size) b->Arg(n);
    }
}

}  // namespace tgb
