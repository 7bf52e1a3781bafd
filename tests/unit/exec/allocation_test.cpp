// Steady-state calls allocate nothing: global operator new is counted while a probe is armed.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdlib>
#include <new>
#include <tuple>
#include <utility>
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
// The aligned forms (the buffers of forward contexts, core/cpu/buffer_pool.hpp).
void* operator new(std::size_t n, std::align_val_t a) {
    if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
    const std::size_t al = static_cast<std::size_t>(a);
    if (void* p = std::aligned_alloc(al, (n + al - 1) / al * al)) return p;
    throw std::bad_alloc();
}
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

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
// After a first call of `call` (which sizes the caches), three more allocate nothing, and one
// more returns the first call's value and leaves the same gradients: reused (uninitialised)
// buffers change no result.
template <class Call, class... Grads>
void check_steady_state(Call&& call, Grads&... grads) {
    const auto v = call();
    const std::tuple<Grads...> first{grads...};
    CHECK(allocations_during([&] { for (int i = 0; i < 3; ++i) call(); }) == 0);
    CHECK(call() == v);
    const auto same = [](const auto& now, const auto& before) { CHECK(now == before); };
    [&]<std::size_t... I>(std::index_sequence<I...>) {
        (same(grads, std::get<I>(first)), ...);
    }(std::index_sequence_for<Grads...>{});
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

TEST_CASE("forward and backward allocate nothing in steady state", "[exec][allocation]") {
    constexpr auto x = tg::param<"x", float, tg::shape<tg::dyn, 64>>;
    constexpr auto w = tg::param<"w", float, tg::shape<64, 64>>;
    // a matmul (kernel), a reduction the backward reads, elementwise values recomputed
    auto step = tg::compile(tg::log_sum_exp(tg::tanh(tg::matmul(x, w))), tg::wrt(x, w));
    const std::size_t rows = 300;  // the context's buffer is larger than glibc's mmap threshold
    std::vector<float> xd(rows * 64, 0.01f), wd(64 * 64, 0.02f), gx(rows * 64), gw(64 * 64);
    const float* first = nullptr;
    auto call = [&] {
        auto ctx = step.forward(tg::bind(x, xd, {rows, 64}), tg::bind(w, wd));
        if (!first) first = ctx.values().data();
        CHECK(ctx.values().data() == first);  // the freed context's buffer, reused
        step.backward(ctx, tg::grad_into(x, gx), tg::grad_into(w, gw));
    };
    call();
    CHECK(tg::detail::buffer_pool::cached_count() >= 1);
    CHECK(allocations_during([&] { for (int i = 0; i < 5; ++i) call(); }) == 0);
    // the same values as value_and_grad
    std::vector<float> gx2(gx.size()), gw2(gw.size());
    auto ctx = step.forward(tg::bind(x, xd, {rows, 64}), tg::bind(w, wd));
    const float v = step.value_and_grad(tg::bind(x, xd, {rows, 64}), tg::bind(w, wd), tg::grad_into(x, gx2),
                                        tg::grad_into(w, gw2));
    CHECK(ctx.value() == v);
    CHECK(gx == gx2);
    CHECK(gw == gw2);
}

TEST_CASE("a scan's training step allocates nothing in steady state", "[exec][allocation][scan]") {
    constexpr std::size_t D = 32, L = 4;
    constexpr auto h = tg::param<"h", float, tg::shape<tg::dyn, D>>;
    constexpr auto W = tg::param<"W", float, tg::shape<D, D>>;
    constexpr auto Ws = tg::param<"Ws", float, tg::shape<L, D, D>>;
    constexpr auto x = tg::input<"x", float, tg::shape<tg::dyn, D>>;
    const auto layer = tg::tanh(tg::matmul(h, W)) * tg::lit<0.5> + h;
    const std::size_t rows = 600;
    std::vector<float> xd(rows * D), wd(L * D * D), gw(wd.size());
    for (std::size_t i = 0; i < xd.size(); ++i) xd[i] = float(i % 13) * 0.05f - 0.3f;
    for (std::size_t i = 0; i < wd.size(); ++i) wd[i] = float(i % 7) * 0.01f - 0.03f;
    auto check_policy = [&](auto out) {
        const auto step = tg::compile(tg::mean(tg::square(out)), tg::wrt(Ws));
        auto call = [&] { step.value_and_grad(tg::bind(x, xd, {rows, D}), tg::bind(Ws, wd), tg::grad_into(Ws, gw)); };
        call();
        CHECK(allocations_during([&] { for (int i = 0; i < 3; ++i) call(); }) == 0);
    };
    SECTION("carries (default)") { check_policy(tg::scan(layer, tg::carry(h, x), tg::stacked(W, Ws))); }
    SECTION("layers") { check_policy(tg::scan<tg::scan_memory::layers>(layer, tg::carry(h, x), tg::stacked(W, Ws))); }
}

TEST_CASE("a convolution and pooling step allocates nothing in steady state", "[exec][allocation][conv]") {
    // conv2d (im2col + GEMM, with padding: the dense copies and the finiteness test), its input and
    // weight gradients, max and average pooling and their gradients: kernel temporaries come from the
    // per-thread buffer pool
    constexpr auto x = tg::param<"x", float, tg::shape<tg::dyn, 3, 12, 12>>;
    constexpr auto w = tg::param<"w", float, tg::shape<8, 3, 3, 3>>;
    const auto y = tg::relu(tg::conv2d<1, 1>(x, w));
    auto step = tg::compile(tg::mean(tg::square(tg::max_pool2d<2>(y))) + tg::mean(tg::avg_pool2d<2>(y)), tg::wrt(x, w));
    const std::size_t n = 16;  // the input and im2col temporaries pass glibc's mmap threshold
    std::vector<float> xd(n * 3 * 12 * 12), wd(8 * 3 * 3 * 3), gx(xd.size()), gw(wd.size());
    for (std::size_t i = 0; i < xd.size(); ++i) xd[i] = float(i % 17) * 0.1f - 0.8f;
    for (std::size_t i = 0; i < wd.size(); ++i) wd[i] = float(i % 5) * 0.05f - 0.1f;
    auto call = [&] {
        return step.value_and_grad(tg::bind(x, xd, {n, 3, 12, 12}), tg::bind(w, wd), tg::grad_into(x, gx), tg::grad_into(w, gw));
    };
    check_steady_state(call, gx, gw);
}

TEST_CASE("embedding, index_select and gather steps allocate nothing in steady state", "[exec][allocation][index]") {
    // their backward scatter-adds accumulate in kernel temporaries from the buffer pool (a bf16
    // table's embedding gradient accumulates in f32)
    constexpr auto ids = tg::input<"ids", std::int32_t, tg::shape<tg::dyn>>;
    constexpr auto index = tg::input<"index", std::int64_t, tg::shape<40, 4>>;
    constexpr auto table = tg::param<"table", float, tg::shape<50, 16>>;
    constexpr auto table16 = tg::param<"table16", tg::bf16, tg::shape<50, 16>>;
    constexpr auto xs = tg::param<"xs", float, tg::shape<40, 16>>;
    const auto e = tg::embedding(ids, table);
    auto step = tg::compile(tg::sum(tg::square(e)) + tg::sum(tg::index_select<0>(xs, ids) * e) +
                                tg::sum(tg::exp(tg::gather<1>(xs, index))) +
                                tg::sum(tg::cast<float>(tg::embedding(ids, table16))),
                            tg::wrt(table, table16, xs));
    const std::size_t n = 3000;
    std::vector<std::int32_t> idv(n);
    std::vector<std::int64_t> iv(40 * 4);
    for (std::size_t i = 0; i < n; ++i) idv[i] = std::int32_t((i * 7) % 40);
    for (std::size_t i = 0; i < iv.size(); ++i) iv[i] = std::int64_t((i * 5) % 16);
    std::vector<float> tv(50 * 16), xv(40 * 16), gt(tv.size()), gx(xv.size());
    std::vector<tg::bf16> t16(50 * 16, tg::bf16(0.25f)), g16(t16.size());
    for (std::size_t i = 0; i < tv.size(); ++i) tv[i] = float(i % 9) * 0.01f;
    for (std::size_t i = 0; i < xv.size(); ++i) xv[i] = float(i % 11) * 0.02f;
    auto call = [&] {
        return step.value_and_grad(tg::bind(ids, idv, {n}), tg::bind(index, iv), tg::bind(table, tv), tg::bind(table16, t16),
                                   tg::bind(xs, xv), tg::grad_into(table, gt), tg::grad_into(table16, g16),
                                   tg::grad_into(xs, gx));
    };
    check_steady_state(call, gt, gx);
}

TEST_CASE("a fused attention step allocates nothing in steady state", "[exec][allocation][attention]") {
    // the blocks' scores and the operands' f32 copies (float heads are read in place, bf16 is
    // copied) come from the buffer pool, one slot per task on two threads
    constexpr auto x = tg::param<"x", float, tg::shape<4, tg::dyn, 32>>;
    constexpr auto xb = tg::param<"xb", tg::bf16, tg::shape<4, tg::dyn, 16>>;
    const auto heads = tg::transpose<1, 2>(tg::reshape<tg::shape<4, tg::dyn, 2, 16>>(x));
    auto step = tg::compile(tg::sum(tg::square(tg::scaled_dot_product_attention(heads, heads, heads, tg::causal))), tg::wrt(x));
    auto step_b = tg::compile(tg::sum(tg::cast<float>(tg::scaled_dot_product_attention(xb, xb, xb))), tg::wrt(xb));
    const std::size_t t = 150;  // three blocks of queries
    std::vector<float> xd(4 * t * 32), gx(xd.size());
    for (std::size_t i = 0; i < xd.size(); ++i) xd[i] = float(i % 13) * 0.1f - 0.6f;
    std::vector<tg::bf16> xbd(4 * t * 16), gb(xbd.size());
    for (std::size_t i = 0; i < xbd.size(); ++i) xbd[i] = tg::bf16(float(i % 7) * 0.2f - 0.6f);
    for (std::size_t threads : {1u, 2u}) {
        tg::set_num_threads(threads);
        INFO("threads " << threads);
        check_steady_state([&] { return step.value_and_grad(tg::bind(x, xd, {4, t, 32}), tg::grad_into(x, gx)); }, gx);
        check_steady_state([&] { return step_b.value_and_grad(tg::bind(xb, xbd, {4, t, 16}), tg::grad_into(xb, gb)); }, gb);
    }
    tg::set_num_threads(0);
}

TEST_CASE("an embedding backward split over the pool allocates nothing in steady state", "[exec][allocation][index]") {
    // large enough to be split over the pool by ranges of rows (ops/index.hpp), and the pass over the
    // 20000 ids too; the ids' rows and g's offsets, and a bf16 table's f32 accumulator, come from
    // the buffer pool
    constexpr auto ids = tg::input<"ids", std::int32_t, tg::shape<tg::dyn>>;
    constexpr auto table = tg::param<"table", float, tg::shape<300, 72>>;
    constexpr auto table16 = tg::param<"table16", tg::bf16, tg::shape<2000, 8>>;
    auto step = tg::compile(tg::sum(tg::square(tg::embedding<3>(ids, table))), tg::wrt(table));
    auto step_b = tg::compile(tg::sum(tg::cast<float>(tg::embedding(ids, table16))), tg::wrt(table16));
    const std::size_t n = 20000;
    std::vector<std::int32_t> idv(n), idb(n);
    for (std::size_t i = 0; i < n; ++i) idv[i] = std::int32_t((i * 7) % 300), idb[i] = std::int32_t((i * 13) % 2000);
    std::vector<float> tv(300 * 72), gt(tv.size());
    for (std::size_t i = 0; i < tv.size(); ++i) tv[i] = float(i % 9) * 0.01f;
    std::vector<tg::bf16> t16(2000 * 8, tg::bf16(0.25f)), g16(t16.size());
    for (std::size_t threads : {1u, 2u}) {
        tg::set_num_threads(threads);
        INFO("threads " << threads);
        check_steady_state([&] { return step.value_and_grad(tg::bind(ids, idv, {n}), tg::bind(table, tv), tg::grad_into(table, gt)); },
                           gt);
        check_steady_state(
            [&] { return step_b.value_and_grad(tg::bind(ids, idb, {n}), tg::bind(table16, t16), tg::grad_into(table16, g16)); },
            g16);
    }
    tg::set_num_threads(0);
}
