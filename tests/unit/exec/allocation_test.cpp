// Steady-state calls allocate nothing: global operator new is counted while a probe is armed.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

#include <typegrad/typegrad.hpp>

// g++ pairs the malloc inside this operator new with std::free below and warns (a false
// positive: both replace the global pair together).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace {
std::atomic<bool> counting{false};
std::atomic<long> allocations{0};
}  // namespace

void* operator new(std::size_t n) {
    if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
    if (void* p = std::malloc(n ? n : 1)) return p;
    throw std::bad_alloc();
}
// The nothrow form too (Catch2 allocates its test invokers with it): otherwise its memory comes
// from the runtime's allocator and is freed by the replaced delete below (ASan:
// alloc-dealloc-mismatch).
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
    if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
    return std::malloc(n ? n : 1);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace tg = typegrad;

namespace {
template <class F>
long allocations_during(F&& f) {
    allocations = 0;
    counting = true;
    f();
    counting = false;
    return allocations.load();
}
}  // namespace

TEST_CASE("value_and_grad allocates nothing in steady state", "[exec][allocation]") {
    SECTION("static shapes") {
        constexpr auto x = tg::param<"x", float, tg::shape<1000>>;
        constexpr auto y = tg::param<"y", float, tg::shape<1000>>;
        auto step = tg::compile(tg::log_sum_exp(tg::exp(x) * y) + tg::mean(x), tg::wrt(x, y));
        std::vector<float> a(1000, 0.5f), b(1000, 1.5f), ga(1000), gb(1000);
        auto call = [&] { step.value_and_grad(tg::bind(x, a), tg::bind(y, b), tg::grad_into(x, ga), tg::grad_into(y, gb)); };
        call();  // first call sizes the thread-local scratch
        CHECK(allocations_during([&] { for (int i = 0; i < 10; ++i) call(); }) == 0);
    }
    SECTION("dynamic shapes: nothing after the first call at a size") {
        constexpr auto x = tg::param<"x", double, tg::shape<tg::dyn, 4>>;
        constexpr auto b = tg::param<"b", double, tg::shape<4>>;
        auto step = tg::compile(tg::mean(tg::square(x + b)) + tg::max(x), tg::wrt(x, b));
        for (std::size_t rows : {10u, 100u}) {
            std::vector<double> xd(rows * 4, 0.25), bd(4, 1.0), gx(rows * 4), gb(4);
            auto call = [&] {
                step.value_and_grad(tg::bind(x, xd, {rows, 4}), tg::bind(b, bd), tg::grad_into(x, gx), tg::grad_into(b, gb));
            };
            call();
            CHECK(allocations_during([&] { for (int i = 0; i < 5; ++i) call(); }) == 0);
        }
    }
}
