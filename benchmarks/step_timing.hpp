#pragma once
// Timing of one training or op step for the plain-main benchmarks (e2e/, ops/): wall and process
// CPU time of a call (CPU time shows whether a second thread worked), and medians.
#include <algorithm>
#include <chrono>
#include <ctime>
#include <vector>

namespace bench_timing {

inline double process_cpu_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

struct sample {
    double wall = 0, cpu = 0;
};

// Times step(); its result goes to `result`.
template <class Step, class R>
sample time_call(Step&& step, R& result) {
    const double c0 = process_cpu_seconds();
    const auto w0 = std::chrono::steady_clock::now();
    result = step();
    const auto w1 = std::chrono::steady_clock::now();
    return {std::chrono::duration<double>(w1 - w0).count(), process_cpu_seconds() - c0};
}

inline double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace bench_timing
