// The shared thread pool (core/cpu/thread_pool.hpp): every task of a call runs exactly once,
// whether the pool's threads are still spinning from the previous call (calls back to back) or
// have gone to sleep on the condition variable (a pause longer than the spin window), and the
// helpers take part; a task's exception reaches the caller; num_threads() without an override or
// TYPEGRAD_NUM_THREADS is the hardware's count (read once).
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include <typegrad/core/cpu/thread_pool.hpp>

namespace tgd = typegrad::detail;

namespace {
// One parallel_for of n tasks on `threads` threads: how often each task ran, and on how many
// distinct threads (each task waits `task_time`, so that helpers get some).
struct call_record {
    std::vector<int> runs;
    std::size_t thread_count = 0;
};
call_record one_call(std::size_t n, std::size_t threads, std::chrono::microseconds task_time) {
    std::vector<std::atomic<int>> hits(n);
    std::mutex m;
    std::set<std::thread::id> ids;
    tgd::default_thread_pool().parallel_for(n, threads, [&](std::size_t i) {
        hits[i].fetch_add(1);
        if (task_time.count() > 0) std::this_thread::sleep_for(task_time);
        std::lock_guard lk(m);
        ids.insert(std::this_thread::get_id());
    });
    call_record r;
    for (auto& h : hits) r.runs.push_back(h.load());
    r.thread_count = ids.size();
    return r;
}
}  // namespace

TEST_CASE("the pool runs every task once, back to back and after its threads have slept", "[core][threads]") {
    using namespace std::chrono_literals;
    std::size_t most_threads = 0;
    for (int round = 0; round < 4; ++round) {
        // back to back: the helpers are still spinning when the next call comes
        for (int call = 0; call < 200; ++call) {
            const call_record r = one_call(37, 3, 0us);
            REQUIRE(std::all_of(r.runs.begin(), r.runs.end(), [](int k) { return k == 1; }));
        }
        // after a pause past the spin window (tgd::pool_spin): the helpers sleep, and must be woken
        std::this_thread::sleep_for(tgd::pool_spin * 20);
        const call_record r = one_call(12, 3, 200us);
        REQUIRE(std::all_of(r.runs.begin(), r.runs.end(), [](int k) { return k == 1; }));
        most_threads = std::max(most_threads, r.thread_count);
    }
    CHECK(most_threads >= 2);  // twelve tasks of 200 us each: the helpers took some
}

TEST_CASE("a task's exception reaches the pool's caller after the other tasks", "[core][threads]") {
    std::atomic<int> ran{0};
    CHECK_THROWS_AS(tgd::default_thread_pool().parallel_for(16, 3,
                                                            [&](std::size_t i) {
                                                                ran.fetch_add(1);
                                                                if (i == 5) throw std::runtime_error("task 5");
                                                            }),
                    std::runtime_error);
    CHECK(ran.load() >= 1);
    // and the pool serves the next call in full
    const call_record r = one_call(20, 3, std::chrono::microseconds(0));
    CHECK(std::all_of(r.runs.begin(), r.runs.end(), [](int k) { return k == 1; }));
}

TEST_CASE("num_threads: the override, else TYPEGRAD_NUM_THREADS, else the hardware's count", "[core][threads]") {
    tgd::set_num_threads(3);
    CHECK(tgd::num_threads() == 3);
    tgd::set_num_threads(0);
    if (std::getenv("TYPEGRAD_NUM_THREADS") == nullptr) {
        const std::size_t hw = std::clamp<std::size_t>(std::thread::hardware_concurrency(), 1, tgd::default_max_threads);
        CHECK(tgd::num_threads() == hw);
        CHECK(tgd::num_threads() == hw);  // the cached value, a second time
    }
}
