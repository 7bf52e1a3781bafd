// tg::mpi::data_parallel under mpirun: each case runs on every rank and compares against an
// independent single-process reference computed on every rank (the union of all ranks' batches,
// with the plain step and the toolkit's optimizer). Exit status 0 on every rank when every rank
// passed. Usage: mpirun -np P typegrad_mpi_tests <case>.
#include <typegrad/distributed/mpi.hpp>
#include <typegrad/typegrad.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace tg = typegrad;

namespace {

int world_rank = 0, world_size = 1, failures = 0;

#define EXPECT(cond, ...)                                                                   \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            ++failures;                                                                     \
            std::fprintf(stderr, "rank %d: %s:%d: failed: %s: ", world_rank, __FILE__, __LINE__, #cond); \
            std::fprintf(stderr, __VA_ARGS__);                                              \
            std::fprintf(stderr, "\n");                                                     \
        }                                                                                   \
    } while (0)

// The MLP of examples/mlp.cpp (linear - relu - linear, cross_entropy), smaller hidden layer.
constexpr std::size_t hidden = 32;
struct linear_layer {
    BOOST_HANA_DEFINE_STRUCT(linear_layer, (std::vector<float>, W), (std::vector<float>, b));
};
struct mlp {
    BOOST_HANA_DEFINE_STRUCT(mlp, (linear_layer, fc1), (linear_layer, fc2));
};
constexpr auto X = tg::input<"X", float, tg::shape<tg::dyn, 2>>;
constexpr auto y = tg::input<"y", std::int32_t, tg::shape<tg::dyn>>;
constexpr auto W1 = tg::param<"fc1.W", float, tg::shape<hidden, 2>>;
constexpr auto b1 = tg::param<"fc1.b", float, tg::shape<hidden>>;
constexpr auto W2 = tg::param<"fc2.W", float, tg::shape<2, hidden>>;
constexpr auto b2 = tg::param<"fc2.b", float, tg::shape<2>>;

template <class A, class B, class C, class D>
constexpr auto mlp_loss(A w1, B bb1, C w2, D bb2) {
    return tg::cross_entropy(tg::linear(tg::relu(tg::linear(X, w1, bb1)), w2, bb2), y);
}
// Plain (the reference, and data_parallel without hooks), hooked (all-reduce started from the
// post-accumulate hooks), and hooked + optimizer_step (optimizer in the backward).
const auto plain = tg::compile(mlp_loss(W1, b1, W2, b2), tg::wrt(W1, b1, W2, b2));
template <class P, class F>
constexpr auto h(P p, F f) { return tg::post_accumulate_grad_hook(p, f); }
constexpr tg::mpi::allreduce_grad ar{};
const auto hooked = tg::compile(mlp_loss(h(W1, ar), h(b1, ar), h(W2, ar), h(b2, ar)), tg::wrt(W1, b1, W2, b2));
// Early: each param's all-reduce starts inside the backward (tensor hook).
const auto early = tg::compile(mlp_loss(tg::mpi::allreduce_in_backward(W1), tg::mpi::allreduce_in_backward(b1),
                                        tg::mpi::allreduce_in_backward(W2), tg::mpi::allreduce_in_backward(b2)),
                               tg::wrt(W1, b1, W2, b2));
constexpr tg::optimizer_step os{};
const auto in_backward = tg::compile(mlp_loss(h(h(W1, ar), os), h(h(b1, ar), os), h(h(W2, ar), os), h(h(b2, ar), os)),
                                     tg::wrt(W1, b1, W2, b2));

mlp init_model(std::uint64_t seed) {
    mlp m{{std::vector<float>(hidden * 2), std::vector<float>(hidden)}, {std::vector<float>(2 * hidden), std::vector<float>(2)}};
    tg::generator gen{.seed = seed};
    tg::kaiming_normal(m.fc1.W, W1, gen, {.nonlin = tg::nonlinearity::relu});
    tg::kaiming_normal(m.fc2.W, W2, gen, {.nonlin = tg::nonlinearity::relu});
    for (auto& v : m.fc1.b) v = 0.01f;
    return m;
}

// `slices` batches of n points (two noisy blobs), the same on every rank.
struct data {
    std::vector<float> x;
    std::vector<std::int32_t> labels;
    std::size_t n;
    std::span<const float> xs(std::size_t s, std::size_t count = 1) const { return {x.data() + 2 * n * s, 2 * n * count}; }
    std::span<const std::int32_t> ys(std::size_t s, std::size_t count = 1) const { return {labels.data() + n * s, n * count}; }
};
data make_data(std::size_t slices, std::size_t n) {
    data d{std::vector<float>(slices * n * 2), std::vector<std::int32_t>(slices * n), n};
    std::mt19937 rng(11);
    std::normal_distribution<float> noise(0.f, 0.6f);
    for (std::size_t i = 0; i < slices * n; ++i) {
        const std::int32_t c = std::int32_t(rng() % 2);
        d.labels[i] = c;
        d.x[2 * i] = (c ? 1.f : -1.f) + noise(rng);
        d.x[2 * i + 1] = (c ? -0.5f : 0.5f) + noise(rng);
    }
    return d;
}

std::vector<float> flat(const mlp& m) {
    std::vector<float> f;
    tg::for_each_param(m, [&](std::string_view, const auto& buf) { f.insert(f.end(), buf.begin(), buf.end()); });
    return f;
}

// Largest |a - b| / (atol + rtol |b|); <= 1 passes.
double closeness(const std::vector<float>& a, const std::vector<float>& b, double atol = 1e-5, double rtol = 1e-4) {
    if (a.size() != b.size()) return 1e30;
    double worst = 0;
    for (std::size_t i = 0; i < a.size(); ++i)
        worst = std::max(worst, std::abs(double(a[i]) - double(b[i])) / (atol + rtol * std::abs(double(b[i]))));
    return worst;
}

// Rank 0 receives every rank's params and compares the bytes; the verdict goes to all ranks.
bool bitwise_equal_across_ranks(const mlp& m) {
    const std::vector<float> mine = flat(m);
    std::vector<float> all(mine.size() * std::size_t(world_size));
    MPI_Gather(mine.data(), int(mine.size()), MPI_FLOAT, all.data(), int(mine.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
    int same = 1;
    if (world_rank == 0)
        for (int r = 1; r < world_size; ++r)
            same &= std::memcmp(all.data(), all.data() + std::size_t(r) * mine.size(), mine.size() * sizeof(float)) == 0;
    MPI_Bcast(&same, 1, MPI_INT, 0, MPI_COMM_WORLD);
    return same == 1;
}

constexpr int steps = 50;
constexpr std::size_t per_rank = 24;

// Single-process SGD on the union of every rank's batch: the reference for the data-parallel runs.
mlp reference_training(const data& d, std::vector<float>* losses) {
    mlp m = init_model(7);
    mlp g = tg::zeros_like(m);
    tg::sgd opt(m, {.lr = 0.1, .momentum = 0.9});
    const std::size_t all = d.n * std::size_t(world_size);
    for (int t = 0; t < steps; ++t) {
        const float l = tg::value_and_grad(plain, tg::bind(X, d.xs(0, std::size_t(world_size)), {all, 2}),
                                           tg::bind(y, d.ys(0, std::size_t(world_size))), tg::params(m), tg::grads_into(g));
        if (losses) losses->push_back(l);
        opt.step(m, g);
    }
    return m;
}

// 2-rank (or P-rank) training equals single-process training on the union, params bitwise equal
// across ranks; with and without hooks, with one bucket and with many.
void case_union() {
    const data d = make_data(std::size_t(world_size), per_rank);
    std::vector<float> ref_losses;
    const std::vector<float> ref = flat(reference_training(d, &ref_losses));
    auto run = [&](const auto& step, std::size_t bucket_bytes, const char* what) {
        mlp m = init_model(7 + std::uint64_t(world_rank));  // differs per rank: the broadcast must fix it
        mlp g = tg::zeros_like(m);
        tg::mpi::data_parallel dp(step, m, MPI_COMM_WORLD, {.bucket_bytes = bucket_bytes});
        EXPECT(flat(m) == flat(init_model(7)), "%s: params after set-up are not rank 0's", what);
        tg::sgd opt(m, {.lr = 0.1, .momentum = 0.9});
        const auto r = std::size_t(world_rank);
        double worst_loss = 0;
        for (int t = 0; t < steps; ++t) {
            const float l = dp.value_and_grad(g, tg::bind(X, d.xs(r), {d.n, 2}), tg::bind(y, d.ys(r)));
            worst_loss = std::max(worst_loss, std::abs(double(l) - ref_losses[std::size_t(t)]) / (1e-6 + 1e-5 * ref_losses[std::size_t(t)]));
            opt.step(m, g);
        }
        const double c = closeness(flat(m), ref);
        EXPECT(c <= 1, "%s: params differ from single-process training on the union (closeness %g)", what, c);
        EXPECT(worst_loss <= 1, "%s: mean loss differs from the union's (closeness %g)", what, worst_loss);
        EXPECT(bitwise_equal_across_ranks(m), "%s: params are not bitwise equal across ranks", what);
        EXPECT(dp.params_identical(), "%s: params_identical() says the ranks differ", what);
        const auto order = dp.packed_order_last_step();
        EXPECT(order.size() == 4, "%s: %zu gradients packed", what, order.size());
        // hooks run inside the backward (post-accumulate hooks too, once each gradient is final):
        // the last layer's gradients are complete first
        if (!std::string_view(what).starts_with("no hooks"))
            EXPECT(order.size() == 4 && order[0].starts_with("fc2.") && order[3].starts_with("fc1."),
                   "%s: packed %s first and %s last", what, order.empty() ? "" : order[0].c_str(),
                   order.empty() ? "" : order.back().c_str());
        return std::pair{dp.buckets_last_step(), dp.hooked_last_step()};
    };
    const auto [b1, h1] = run(hooked, std::size_t(25) << 20, "hooked, 25 MB buckets");
    EXPECT(h1 == 4 && b1 == 1, "hooked: %zu gradients from hooks in %zu buckets (expected 4 in 1)", h1, b1);
    const auto [b2, h2] = run(hooked, 128, "hooked, 128-byte buckets");
    EXPECT(h2 == 4 && b2 >= 3, "hooked small: %zu gradients from hooks in %zu buckets", h2, b2);
    const auto [b4, h4] = run(early, std::size_t(25) << 20, "in the backward, 25 MB buckets");
    EXPECT(h4 == 4 && b4 == 1, "early: %zu gradients from hooks in %zu buckets (expected 4 in 1)", h4, b4);
    const auto [b5, h5] = run(early, 128, "in the backward, 128-byte buckets");
    EXPECT(h5 == 4 && b5 >= 3, "early small: %zu gradients from hooks in %zu buckets", h5, b5);
    const auto [b3, h3] = run(plain, std::size_t(25) << 20, "no hooks");
    EXPECT(h3 == 0 && b3 == 1, "plain: %zu gradients from hooks in %zu buckets", h3, b3);
    // Sensitivity: the reference is not trivially matched (a rank training on its batch alone differs).
    mlp alone = init_model(7), ga = tg::zeros_like(alone);
    tg::sgd opt(alone, {.lr = 0.1, .momentum = 0.9});
    for (int t = 0; t < steps; ++t) {
        tg::value_and_grad(plain, tg::bind(X, d.xs(0), {d.n, 2}), tg::bind(y, d.ys(0)), tg::params(alone), tg::grads_into(ga));
        opt.step(alone, ga);
    }
    EXPECT(closeness(flat(alone), ref) > 1, "one rank's batch alone already matches the union");
}

// no_sync: micro-batch 0 accumulated locally, micro-batch 1 then averaged over the ranks equals
// the sum of both micro-batches' mean gradients averaged, i.e. 2 x the gradient of the union.
template <class Step>
void no_sync_with(const Step& step, std::size_t bucket_bytes) {
    const std::size_t p = std::size_t(world_size), r = std::size_t(world_rank);
    const data d = make_data(2 * p, per_rank);
    mlp m = init_model(7), g = tg::zeros_like(m);
    tg::mpi::data_parallel dp(step, m, MPI_COMM_WORLD, {.bucket_bytes = bucket_bytes});
    {
        auto scope = dp.no_sync();
        const float l0 = dp.value_and_grad(g, tg::bind(X, d.xs(2 * r), {d.n, 2}), tg::bind(y, d.ys(2 * r)));
        EXPECT(dp.buckets_last_step() == 0, "no_sync issued %zu collectives", dp.buckets_last_step());
        mlp local = tg::zeros_like(m);
        const float l_local = tg::value_and_grad(plain, tg::bind(X, d.xs(2 * r), {d.n, 2}), tg::bind(y, d.ys(2 * r)),
                                                 tg::params(m), tg::grads_into(local));
        EXPECT(flat(g) == flat(local) && l0 == l_local, "inside no_sync the gradient is not this rank's own");
    }
    dp.value_and_grad(g, tg::bind(X, d.xs(2 * r + 1), {d.n, 2}), tg::bind(y, d.ys(2 * r + 1)));
    EXPECT(dp.buckets_last_step() >= 1, "the call after no_sync issued no collective");
    mlp gu = tg::zeros_like(m);
    tg::value_and_grad(plain, tg::bind(X, d.xs(0, 2 * p), {2 * p * d.n, 2}), tg::bind(y, d.ys(0, 2 * p)), tg::params(m),
                       tg::grads_into(gu));
    std::vector<float> twice = flat(gu);
    for (float& v : twice) v *= 2;
    const double c = closeness(flat(g), twice, 1e-6, 1e-4);
    EXPECT(c <= 1, "no_sync accumulation differs from the big batch (closeness %g)", c);
    // the next step starts afresh (overwrites)
    dp.value_and_grad(g, tg::bind(X, d.xs(2 * r + 1), {d.n, 2}), tg::bind(y, d.ys(2 * r + 1)));
    mlp half = tg::zeros_like(m);
    for (std::size_t q = 0; q < p; ++q) {
        mlp one = tg::zeros_like(m);
        tg::value_and_grad(plain, tg::bind(X, d.xs(2 * q + 1), {d.n, 2}), tg::bind(y, d.ys(2 * q + 1)), tg::params(m),
                           tg::grads_into(one));
        tg::for_each_param(half, [&](std::string_view name, auto& buf) {
            tg::for_each_param(one, [&](std::string_view n2, const auto& b2) {
                if (name == n2)
                    for (std::size_t i = 0; i < buf.size(); ++i) buf[i] += b2[i] / float(p);
            });
        });
    }
    EXPECT(closeness(flat(g), flat(half), 1e-6, 1e-4) <= 1, "the step after a no_sync step still accumulated");
}
void case_no_sync() {
    no_sync_with(hooked, std::size_t(25) << 20);
    no_sync_with(early, std::size_t(25) << 20);
    no_sync_with(early, 128);
}

// Mismatched graphs or layouts: mismatch_error on every rank, no hang.
struct other_model {
    BOOST_HANA_DEFINE_STRUCT(other_model, (std::vector<float>, V));
};
constexpr auto V = tg::param<"V", float, tg::shape<3>>;
void case_mismatch() {
    auto expect_mismatch = [](auto make, const char* words, const char* what) {
        bool thrown = false;
        try {
            make();
        } catch (const tg::mpi::mismatch_error& e) {
            thrown = true;
            EXPECT(std::string_view(e.what()).find(words) != std::string_view::npos, "%s: message '%s'", what, e.what());
            EXPECT(std::string_view(e.what()).starts_with("typegrad: "), "%s: message '%s'", what, e.what());
        }
        EXPECT(thrown, "%s: no mismatch_error", what);
    };
    // same step, one rank's W1 has the wrong size
    expect_mismatch([] {
        mlp m = init_model(7);
        if (world_rank == 1) m.fc1.W.resize(hidden * 3);
        tg::mpi::data_parallel dp(plain, m, MPI_COMM_WORLD);
    }, "parameter layout", "layout");
    // another graph on rank 1
    const auto other = tg::compile(tg::sum(tg::square(V)), tg::wrt(V));
    expect_mismatch([&] {
        if (world_rank == 1) {
            other_model o{std::vector<float>(3, 1.f)};
            tg::mpi::data_parallel dp(other, o, MPI_COMM_WORLD);
        } else {
            mlp m = init_model(7);
            tg::mpi::data_parallel dp(plain, m, MPI_COMM_WORLD);
        }
    }, "compiled step", "graph");
    // different bucket sizes would pair different collectives: refused as well
    expect_mismatch([] {
        mlp m = init_model(7);
        tg::mpi::data_parallel dp(plain, m, MPI_COMM_WORLD, {.bucket_bytes = world_rank == 1 ? 4096u : 8192u});
    }, "bucket_bytes", "options");
    // after the refusals the communicator still works
    mlp m = init_model(7);
    tg::mpi::data_parallel dp(plain, m, MPI_COMM_WORLD);
    EXPECT(dp.params_identical(), "params differ after a clean set-up");
    // and the hook outside data_parallel says so
    mlp g = tg::zeros_like(m);
    const data d = make_data(1, 4);
    bool thrown = false;
    try {
        tg::value_and_grad(hooked, tg::bind(X, d.xs(0), {4, 2}), tg::bind(y, d.ys(0)), tg::params(m), tg::grads_into(g));
    } catch (const tg::binding_error&) {
        thrown = true;
    }
    EXPECT(thrown, "allreduce_grad outside data_parallel did not throw");
}

// bf16 / f16 averaged in f32, f64 in f64: exactly T(sum over ranks in the wide type / P).
void case_reduced_precision() {
    mlp m = init_model(7);
    tg::mpi::data_parallel dp(plain, m, MPI_COMM_WORLD);
    const std::size_t n = 1000;
    // multiples of 1/16 below 64 in magnitude: every sum of up to 16 of them (after rounding to
    // bf16 / f16) is exact in f32, so the reference does not depend on MPI's summation order
    auto value = [](int rank, std::size_t i) { return std::floor(std::sin(double(i) * 0.37 + rank * 1.3) * 1000.0) / 16.0; };
    auto check = [&]<class T, class R>(T*, R*, const char* what) {
        std::vector<T> mine(n);
        for (std::size_t i = 0; i < n; ++i) mine[i] = T(value(world_rank, i));
        dp.allreduce_average(std::span<T>(mine));
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < n; ++i) {
            R sum = 0;
            for (int q = 0; q < world_size; ++q) sum += R(T(value(q, i)));
            const T expect = T(sum / R(world_size));
            wrong += std::memcmp(&expect, &mine[i], sizeof(T)) != 0;
        }
        EXPECT(wrong == 0, "%s: %zu of %zu elements differ from T(sum in the wide type / P)", what, wrong, n);
    };
    check(static_cast<tg::bf16*>(nullptr), static_cast<float*>(nullptr), "bf16");
    check(static_cast<tg::f16*>(nullptr), static_cast<float*>(nullptr), "f16");
    check(static_cast<double*>(nullptr), static_cast<double*>(nullptr), "double");
}

// An optimizer inside the backward (allreduce_grad then optimizer_step on every param) trains as
// the union's SGD, with bitwise equal params across ranks.
void case_optimizer_in_backward() {
    const data d = make_data(std::size_t(world_size), per_rank);
    const std::vector<float> ref = flat(reference_training(d, nullptr));
    mlp m = init_model(7 + std::uint64_t(world_rank)), g = tg::zeros_like(m);
    tg::mpi::data_parallel dp(in_backward, m, MPI_COMM_WORLD);
    tg::sgd opt(m, {.lr = 0.1, .momentum = 0.9});
    const auto r = std::size_t(world_rank);
    for (int t = 0; t < steps; ++t) {
        tg::optimizer_in_backward scope(opt, m);
        dp.value_and_grad(g, tg::bind(X, d.xs(r), {d.n, 2}), tg::bind(y, d.ys(r)));
    }
    EXPECT(dp.hooked_last_step() == 4, "%zu gradients came from hooks", dp.hooked_last_step());
    const double c = closeness(flat(m), ref);
    EXPECT(c <= 1, "optimizer in the backward differs from the union's SGD (closeness %g)", c);
    EXPECT(bitwise_equal_across_ranks(m), "params are not bitwise equal across ranks");
}

// A rank that stops calling: with options.timeout_seconds the others get timeout_error instead of
// waiting forever. Rank 1 (no timeout) joins the collective late, so that every rank finishes.
void case_timeout() {
    const data d = make_data(std::size_t(world_size), 8);
    mlp m = init_model(7), g = tg::zeros_like(m);
    const auto r = std::size_t(world_rank);
    bool thrown = false;
    {
        tg::mpi::data_parallel dp(plain, m, MPI_COMM_WORLD, {.timeout_seconds = world_rank == 0 ? 0.3 : 0.0});
        if (world_rank == 0) {
            const auto t0 = std::chrono::steady_clock::now();
            try {
                dp.value_and_grad(g, tg::bind(X, d.xs(r), {d.n, 2}), tg::bind(y, d.ys(r)));
            } catch (const tg::mpi::timeout_error& e) {
                thrown = std::string_view(e.what()).starts_with("typegrad: ");
            }
            const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            EXPECT(thrown, "rank 0 got no timeout_error");
            EXPECT(waited >= 0.3 && waited < 1.5, "rank 0 waited %.2f s for a 0.3 s timeout", waited);
            MPI_Barrier(MPI_COMM_WORLD);  // progresses the abandoned collective once rank 1 joins
        } else {
            std::this_thread::sleep_for(std::chrono::milliseconds(1500));
            dp.value_and_grad(g, tg::bind(X, d.xs(r), {d.n, 2}), tg::bind(y, d.ys(r)));
            MPI_Barrier(MPI_COMM_WORLD);
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    const std::string_view which = argc > 1 ? argv[1] : "";
    try {
        if (which == "union") case_union();
        else if (which == "no_sync") case_no_sync();
        else if (which == "mismatch") case_mismatch();
        else if (which == "reduced_precision") case_reduced_precision();
        else if (which == "optimizer_in_backward") case_optimizer_in_backward();
        else if (which == "timeout") case_timeout();
        else {
            std::fprintf(stderr, "usage: mpirun -np P %s union|no_sync|mismatch|reduced_precision|optimizer_in_backward|timeout\n", argv[0]);
            ++failures;
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: unexpected exception: %s\n", world_rank, e.what());
        ++failures;
    }
    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (world_rank == 0) std::printf("%s on %d ranks: %s (%d failed checks)\n", std::string(which).c_str(), world_size,
                                     total == 0 ? "passed" : "FAILED", total);
    MPI_Finalize();
    return total == 0 ? 0 : 1;
}
