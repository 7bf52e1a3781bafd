// A compiled step is immutable and reentrant: many threads calling one step on different data,
// with different dynamic sizes, get bit-for-bit the results a serial run gets. Scratch is
// thread-local, so a data race would show up as a mismatch here and as a report under TSan
// (.ci/sanitize builds this file with -fsanitize=thread).
//
// TYPEGRAD_THREAD_ITERS=<n> sets the calls per thread (default 10000).
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <latch>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <typegrad/typegrad.hpp>

namespace tg = typegrad;

namespace {

constexpr auto a = tg::param<"a", float, tg::shape<tg::dyn, 4>>;  // rows vary per problem
constexpr auto b = tg::param<"b", float, tg::shape<4>>;           // broadcast over rows
constexpr auto c = tg::param<"c", float, tg::shape<tg::dyn, 1>>;  // broadcast over columns
constexpr auto t = tg::input<"t", float>;                         // run-time scalar

// Several stages (log_sum_exp: max, then sum, then gradient), broadcasting both ways, a shared
// subexpression (a * b + c) and reductions that feed further math.
constexpr auto z = a * b + c;
constexpr auto loss = tg::log_sum_exp(tg::tanh(z) * t) + tg::mean(tg::square(a - c)) * tg::sum(tg::sigmoid(z)) +
                      tg::max(c) - tg::min(b * b);

struct problem {
    std::size_t rows = 0;
    std::vector<float> a, b, c, t;
};

// Everything a call produces, compared with memcmp.
struct result {
    float loss = 0;
    std::vector<float> ga, gb, gc;
    bool operator==(const result& o) const {
        auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
            return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
        };
        return std::memcmp(&loss, &o.loss, sizeof loss) == 0 && same(ga, o.ga) && same(gb, o.gb) && same(gc, o.gc);
    }
};

problem make_problem(std::size_t thread, std::size_t k) {
    std::mt19937 rng(static_cast<unsigned>(1000 * thread + k));
    std::uniform_real_distribution<float> d(-2.f, 2.f);
    problem p;
    // 1..53 rows: below, at and above every SIMD width, different in every thread.
    p.rows = 1 + (thread * 7 + k * 11) % 53;
    p.a.resize(p.rows * 4);
    p.b.resize(4);
    p.c.resize(p.rows);
    for (auto* v : {&p.a, &p.b, &p.c})
        for (float& x : *v) x = d(rng);
    p.t = {0.5f + float(thread)};
    return p;
}

template <class Step>
void run(const Step& step, const problem& p, bool split, result& r) {
    r.ga.assign(p.a.size(), -1.f);
    r.gb.assign(4, -1.f);
    r.gc.assign(p.c.size(), -1.f);
    const auto ba = tg::bind(a, p.a, {p.rows, 4});
    const auto bc = tg::bind(c, p.c, {p.rows, 1});
    if (split) {
        auto ctx = step.forward(ba, tg::bind(b, p.b), bc, tg::bind(t, p.t));
        r.loss = ctx.value();
        step.backward(ctx, tg::grad_into(a, r.ga), tg::grad_into(b, r.gb), tg::grad_into(c, r.gc));
    } else {
        r.loss = step.value_and_grad(ba, tg::bind(b, p.b), bc, tg::bind(t, p.t), tg::grad_into(a, r.ga),
                                     tg::grad_into(b, r.gb), tg::grad_into(c, r.gc));
    }
}

std::size_t iterations() {
    if (const char* s = std::getenv("TYPEGRAD_THREAD_ITERS")) return std::strtoull(s, nullptr, 10);
    return 10000;
}

}  // namespace

TEST_CASE("one step called from 8 threads gives the serial results bit for bit", "[reliability][threads]") {
    const auto step = tg::compile(loss, tg::wrt(a, b, c));
    constexpr std::size_t threads = 8, problems = 6;
    const std::size_t iters = iterations();

    // Serial references, computed before any thread starts.
    std::vector<std::vector<problem>> data(threads);
    std::vector<std::vector<result>> expect_joint(threads), expect_split(threads);
    for (std::size_t th = 0; th < threads; ++th)
        for (std::size_t k = 0; k < problems; ++k) {
            data[th].push_back(make_problem(th, k));
            run(step, data[th][k], false, expect_joint[th].emplace_back());
            run(step, data[th][k], true, expect_split[th].emplace_back());
            REQUIRE(std::isfinite(expect_joint[th][k].loss));
        }

    // Catch2 assertions are not thread-safe: threads only count and remember the first failure.
    std::atomic<std::size_t> mismatches{0};
    std::atomic<bool> failed_once{false};
    std::string first_failure;
    std::latch start(threads);
    auto worker = [&](std::size_t th) {
        result r;
        start.arrive_and_wait();  // all threads enter the step together
        for (std::size_t i = 0; i < iters; ++i) {
            const std::size_t k = i % problems;
            const bool split = (i / problems) % 2 == 1;
            run(step, data[th][k], split, r);
            if (!(r == (split ? expect_split : expect_joint)[th][k])) {
                mismatches.fetch_add(1);
                if (!failed_once.exchange(true))
                    first_failure = "thread " + std::to_string(th) + " iteration " + std::to_string(i) +
                                    (split ? " (forward/backward)" : " (value_and_grad)");
            }
        }
    };
    std::vector<std::thread> pool;
    for (std::size_t th = 0; th < threads; ++th) pool.emplace_back(worker, th);
    for (auto& th : pool) th.join();

    INFO("first mismatch: " << first_failure);
    CHECK(mismatches.load() == 0);
}

TEST_CASE("a forward context can be finished on another thread", "[reliability][threads]") {
    const auto step = tg::compile(loss, tg::wrt(a, b, c));
    const problem p = make_problem(3, 2);
    result expect, got;
    run(step, p, true, expect);
    got.ga.assign(p.a.size(), 0.f);
    got.gb.assign(4, 0.f);
    got.gc.assign(p.c.size(), 0.f);
    auto ctx = step.forward(tg::bind(a, p.a, {p.rows, 4}), tg::bind(b, p.b), tg::bind(c, p.c, {p.rows, 1}),
                            tg::bind(t, p.t));
    got.loss = ctx.value();
    // The context owns what backward reads; the other thread has its own (cold) scratch.
    std::thread([&] { step.backward(ctx, tg::grad_into(a, got.ga), tg::grad_into(b, got.gb), tg::grad_into(c, got.gc)); })
        .join();
    CHECK(got == expect);
}
