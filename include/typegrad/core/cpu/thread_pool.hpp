#pragma once
// A small fork-join pool for the CPU kernels (GEMM). Workers are started lazily, on the first
// parallel call that needs them, and then sleep on a condition variable between calls, so a
// program that never runs a large kernel never starts a thread. The caller takes part in the
// work, and a call made while the pool is busy (nested, or from a second user thread) runs
// inline instead of waiting: the pool can never deadlock on itself.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace typegrad::detail {

// Waits until ready() for up to `window`, without sleeping: a pool thread that has just finished
// is usually asked again within microseconds (a kernel's next fused loop, the next call), and
// waking a sleeping thread through the condition variable took 10-15 us on a 2-vCPU VM (a
// 16K-float prod step on two threads: 17 us, against 2.6 us on one). Returns ready().
template <class Ready>
bool spin_until(Ready&& ready, std::chrono::microseconds window) {
    const auto until = std::chrono::steady_clock::now() + window;
    for (std::size_t i = 1;; ++i) {
        if (ready()) return true;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        __asm__ __volatile__("yield");
#endif
        if (i % 64 == 0 && std::chrono::steady_clock::now() >= until) return ready();
    }
}
inline constexpr std::chrono::microseconds pool_spin{50};

// Upper bounds on the thread count: the automatic choice (hardware threads) and any request.
inline constexpr std::size_t default_max_threads = 64;
inline constexpr std::size_t max_threads = 256;

// Set by set_num_threads; 0 means "not set" (environment, then hardware).
inline std::atomic<std::size_t>& num_threads_override() {
    static std::atomic<std::size_t> n{0};
    return n;
}

// Internal knob, mainly for tests: n threads for the following kernels (1 = serial, 0 = back to
// TYPEGRAD_NUM_THREADS / the hardware).
inline void set_num_threads(std::size_t n) { num_threads_override().store(std::min(n, max_threads)); }

// set_num_threads, else TYPEGRAD_NUM_THREADS (read per call so that it can be changed at run
// time), else std::thread::hardware_concurrency() capped at default_max_threads.
inline std::size_t num_threads() {
    if (std::size_t n = num_threads_override().load(std::memory_order_relaxed); n != 0) return n;
    if (const char* env = std::getenv("TYPEGRAD_NUM_THREADS"); env != nullptr && *env != '\0') {
        char* end = nullptr;
        const unsigned long long v = std::strtoull(env, &end, 10);
        if (end != env && *end == '\0' && v > 0)
            return static_cast<std::size_t>(std::min<unsigned long long>(v, max_threads));
    }
    // once: glibc reads /sys/devices/system/cpu/online on every call (an open, a read and a
    // close: 7 us a call on a 2-vCPU VM, against 2.7 us for a 16K-float prod step)
    static const std::size_t hw = std::clamp<std::size_t>(std::thread::hardware_concurrency(), 1, default_max_threads);
    return hw;
}

class thread_pool {
public:
    thread_pool() = default;
    thread_pool(const thread_pool&) = delete;
    thread_pool& operator=(const thread_pool&) = delete;
    ~thread_pool() {
        {
            std::lock_guard lk(mutex_);
            stop_ = true;
            stopping_.store(true, std::memory_order_release);
        }
        wake_.notify_all();
        for (std::thread& t : workers_) t.join();
    }

    // Calls fn(i) for every i in [0, n_tasks) on up to n_threads threads, the caller included,
    // and returns when all calls have returned. Tasks are handed out dynamically. The first
    // exception thrown by a task is rethrown here after the others have finished; the tasks not
    // yet started are then skipped.
    template <class F>
    void parallel_for(std::size_t n_tasks, std::size_t n_threads, F&& fn) {
        using Fn = std::remove_reference_t<F>;
        run(n_tasks, n_threads, [](const void* f, std::size_t i) { (*static_cast<Fn*>(const_cast<void*>(f)))(i); },
            static_cast<const void*>(std::addressof(fn)));
    }
    // parallel_for's work, for call(fn, i): one function, not one per task type (every
    // parallel_for instantiated the locking, waking and waiting below again, in every
    // translation unit).
    [[gnu::noinline]] void run(std::size_t n_tasks, std::size_t n_threads, void (*call)(const void*, std::size_t),
                               const void* fn) {
        n_threads = std::min({n_threads, n_tasks, max_threads});
        std::unique_lock busy(busy_, std::try_to_lock);
        if (n_threads <= 1 || !busy.owns_lock()) {
            for (std::size_t i = 0; i < n_tasks; ++i) call(fn, i);
            return;
        }
        job j;
        j.fn = fn;
        j.call = call;
        j.n_tasks = n_tasks;
        std::size_t helpers = 0;
        {
            std::lock_guard lk(mutex_);
            spawn(n_threads - 1);
            helpers = std::min(n_threads - 1, workers_.size());
            job_ = &j;
            participants_ = helpers;
            remaining_ = helpers;
            pending_.store(helpers, std::memory_order_relaxed);
            ++generation_;
            posted_.store(generation_, std::memory_order_release);
        }
        if (helpers > 0) wake_.notify_all();  // no system call when every helper is still spinning
        j.run();
        spin_until([&] { return pending_.load(std::memory_order_acquire) == 0; }, pool_spin);
        {
            std::unique_lock lk(mutex_);
            done_.wait(lk, [&] { return remaining_ == 0; });
            job_ = nullptr;
        }
        if (j.error) std::rethrow_exception(j.error);
    }

    std::size_t size() const {
        std::lock_guard lk(mutex_);
        return workers_.size();
    }

private:
    struct job {
        const void* fn = nullptr;
        void (*call)(const void*, std::size_t) = nullptr;
        std::size_t n_tasks = 0;
        std::atomic<std::size_t> next{0};
        std::atomic<bool> failed{false};
        std::mutex error_mutex;
        std::exception_ptr error;

        void run() noexcept {
            for (;;) {
                const std::size_t i = next.fetch_add(1, std::memory_order_relaxed);
                if (i >= n_tasks || failed.load(std::memory_order_relaxed)) return;
                try {
                    call(fn, i);
                } catch (...) {
                    std::lock_guard lk(error_mutex);
                    if (!error) error = std::current_exception();
                    failed.store(true, std::memory_order_relaxed);
                }
            }
        }
    };

    // Grows the pool towards `want` workers (mutex_ held). A thread that cannot be started only
    // means less parallelism, never an error.
    void spawn(std::size_t want) {
        while (workers_.size() < want) {
            try {
                // The generation is read here, under the lock: a worker that read it on start-up
                // could already see the job it was started for and then wait past it.
                const std::size_t id = workers_.size();
                workers_.emplace_back([this, id, gen = generation_] { worker_loop(id, gen); });
            } catch (const std::system_error&) {
                return;
            } catch (const std::bad_alloc&) {
                return;
            }
        }
    }

    void worker_loop(std::size_t id, std::uint64_t seen) {
        std::unique_lock lk(mutex_);
        for (;;) {
            if (!stop_ && generation_ == seen) {  // spin before sleeping (spin_until); then under the lock again
                lk.unlock();
                spin_until([&] { return posted_.load(std::memory_order_acquire) != seen || stopping_.load(std::memory_order_acquire); },
                           pool_spin);
                lk.lock();
            }
            wake_.wait(lk, [&] { return stop_ || generation_ != seen; });
            if (stop_) return;
            seen = generation_;
            // The caller waits for every participant, so a participant never misses its job.
            if (id >= participants_) continue;
            job* j = job_;
            lk.unlock();
            j->run();
            lk.lock();
            pending_.store(--remaining_, std::memory_order_release);
            if (remaining_ == 0) done_.notify_one();
        }
    }

    std::mutex busy_;  // held for the whole of a parallel call
    mutable std::mutex mutex_;
    std::condition_variable wake_, done_;
    std::vector<std::thread> workers_;
    job* job_ = nullptr;
    std::size_t participants_ = 0, remaining_ = 0;
    std::uint64_t generation_ = 0;
    bool stop_ = false;
    // generation_, remaining_ and stop_ as spinning threads read them without the lock (written
    // under it, beside them)
    std::atomic<std::uint64_t> posted_{0};
    std::atomic<std::size_t> pending_{0};
    std::atomic<bool> stopping_{false};
};

// The process-wide pool the kernels share.
inline thread_pool& default_thread_pool() {
    static thread_pool pool;
    return pool;
}

// When kernels split their work over the pool (fused loops, pooling): from parallel_min_work
// operations on, in up to 4 tasks per thread of at least parallel_task_work operations each.
inline constexpr std::size_t parallel_min_work = std::size_t(1) << 16;
inline constexpr std::size_t parallel_task_work = std::size_t(1) << 14;
// Tasks for `work` operations over n items on `threads` threads (at least 1).
inline std::size_t parallel_tasks(std::size_t n, std::size_t work, std::size_t threads) {
    return std::max<std::size_t>(1, std::min({n, 4 * threads, work / parallel_task_work}));
}

// Calls fn(begin, end) over [0, n) in contiguous ranges, on the shared pool when n * cost (the
// operations per item, estimated) reaches parallel_min_work and more than one thread is set, else
// once on the calling thread. Every item belongs to exactly one range, so work that writes only
// its own items (a pooling plane) gives the same results on any number of threads. fn must not
// allocate per-thread state (it would make a worker's first range allocate in a later call).
template <class F>
void parallel_ranges(std::size_t n, std::size_t cost, F&& fn) {
    const std::size_t work = n * cost;
    const std::size_t threads = n > 1 && work >= parallel_min_work ? num_threads() : 1;
    if (threads <= 1) return fn(std::size_t(0), n);
    const std::size_t tasks = parallel_tasks(n, work, threads), per = (n + tasks - 1) / tasks;
    default_thread_pool().parallel_for((n + per - 1) / per, threads,
                                       [&](std::size_t t) { fn(t * per, std::min(n, (t + 1) * per)); });
}

}  // namespace typegrad::detail
