// Step time of tg::mpi::data_parallel on 1 and more ranks, and how much of the all-reduce the
// backward hides. The GPT example does not exist yet: the model is a 4-layer MLP (width 512,
// 0.79 M params, 3.2 MB of f32 gradients) trained with SGD, batch per rank fixed (weak scaling,
// as DDP). Launch: mpirun -np P typegrad_data_parallel_bench [steps] [bucket_MB] [early|post|comm]
// (early, the default: every param through tg::mpi::allreduce_in_backward; post: through the
// post-accumulate hook tg::mpi::allreduce_grad; comm: only the all-reduce of the gradient bytes,
// back to back).
//
// Per step, medians over the measured steps (rank 0's clock):
//   step       dp.value_and_grad + sgd step
//   compute    tg::value_and_grad of the same graph without hooks, same batch, no data_parallel,
//              + sgd step (on a copy of the model, so the trained params stay in sync)
//   overhead   step - compute: what data parallelism costs per step (collectives, packing
//              gradients into buckets and back, the hooks)
//   waited     the part of it spent in the final wait for collectives
//   allreduce  a blocking MPI_Allreduce of the same number of gradient bytes, alone
//   hidden     1 - overhead / allreduce (0 when negative): the share of the all-reduce's own cost
//              that the step does not pay
#include <typegrad/distributed/mpi.hpp>
#include <typegrad/typegrad.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string_view>
#include <vector>

namespace tg = typegrad;

constexpr std::size_t din = 64, width = 512, classes = 16, batch = 128;

struct linear_layer {
    BOOST_HANA_DEFINE_STRUCT(linear_layer, (std::vector<float>, W), (std::vector<float>, b));
};
struct model {
    BOOST_HANA_DEFINE_STRUCT(model, (linear_layer, fc1), (linear_layer, fc2), (linear_layer, fc3), (linear_layer, fc4));
};
constexpr auto X = tg::input<"X", float, tg::shape<tg::dyn, din>>;
constexpr auto y = tg::input<"y", std::int32_t, tg::shape<tg::dyn>>;
constexpr auto W1 = tg::param<"fc1.W", float, tg::shape<width, din>>;
constexpr auto b1 = tg::param<"fc1.b", float, tg::shape<width>>;
constexpr auto W2 = tg::param<"fc2.W", float, tg::shape<width, width>>;
constexpr auto b2 = tg::param<"fc2.b", float, tg::shape<width>>;
constexpr auto W3 = tg::param<"fc3.W", float, tg::shape<width, width>>;
constexpr auto b3 = tg::param<"fc3.b", float, tg::shape<width>>;
constexpr auto W4 = tg::param<"fc4.W", float, tg::shape<classes, width>>;
constexpr auto b4 = tg::param<"fc4.b", float, tg::shape<classes>>;

template <class P>
constexpr auto h(P p) { return tg::post_accumulate_grad_hook(p, tg::mpi::allreduce_grad{}); }
template <class P>
constexpr auto e(P p) { return tg::mpi::allreduce_in_backward(p); }

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    int rank = 0, ranks = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    const int steps = argc > 1 ? std::atoi(argv[1]) : 30;
    const double bucket_mb = argc > 2 ? std::atof(argv[2]) : 25;
    // One kernel thread per rank (as DDP runs one rank per core or GPU); TYPEGRAD_NUM_THREADS overrides.
    if (std::getenv("TYPEGRAD_NUM_THREADS") == nullptr) tg::set_num_threads(1);

    auto net = [](auto w1, auto bb1, auto w2, auto bb2, auto w3, auto bb3, auto w4, auto bb4) {
        auto a1 = tg::relu(tg::linear(X, w1, bb1));
        auto a2 = tg::relu(tg::linear(a1, w2, bb2));
        auto a3 = tg::relu(tg::linear(a2, w3, bb3));
        return tg::cross_entropy(tg::linear(a3, w4, bb4), y);
    };
    auto step = tg::compile(net(h(W1), h(b1), h(W2), h(b2), h(W3), h(b3), h(W4), h(b4)),
                            tg::wrt(W1, b1, W2, b2, W3, b3, W4, b4));
    auto early = tg::compile(net(e(W1), e(b1), e(W2), e(b2), e(W3), e(b3), e(W4), e(b4)),
                             tg::wrt(W1, b1, W2, b2, W3, b3, W4, b4));
    auto plain = tg::compile(net(W1, b1, W2, b2, W3, b3, W4, b4), tg::wrt(W1, b1, W2, b2, W3, b3, W4, b4));

    auto layer = [](std::size_t out, std::size_t in) { return linear_layer{std::vector<float>(out * in), std::vector<float>(out)}; };
    model m{layer(width, din), layer(width, width), layer(width, width), layer(classes, width)};
    tg::generator gen{.seed = 1};
    tg::kaiming_normal(m.fc1.W, W1, gen, {.nonlin = tg::nonlinearity::relu});
    tg::kaiming_normal(m.fc2.W, W2, gen, {.nonlin = tg::nonlinearity::relu});
    tg::kaiming_normal(m.fc3.W, W3, gen, {.nonlin = tg::nonlinearity::relu});
    tg::kaiming_normal(m.fc4.W, W4, gen, {.nonlin = tg::nonlinearity::relu});
    model g = tg::zeros_like(m), m2 = m, g2 = tg::zeros_like(m);
    std::size_t nparams = 0;
    tg::for_each_param(m, [&](std::string_view, const auto& b) { nparams += b.size(); });

    std::mt19937 rng(unsigned(100 + rank));
    std::normal_distribution<float> nd;
    std::vector<float> xs(batch * din);
    std::vector<std::int32_t> ys(batch);
    for (auto& v : xs) v = nd(rng);
    for (auto& v : ys) v = std::int32_t(rng() % classes);

    std::vector<float> scratch(nparams);
    const std::string_view mode = argc > 3 ? argv[3] : "early";
    if (mode == "comm") {
        // The all-reduce of the gradient bytes alone, with no computation between the calls.
        std::vector<double> t;
        for (int i = 0; i < 3 + steps; ++i) {
            MPI_Barrier(MPI_COMM_WORLD);
            const double t0 = now();
            MPI_Allreduce(MPI_IN_PLACE, scratch.data(), int(nparams), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            if (i >= 3) t.push_back(now() - t0);
        }
        if (rank == 0) std::printf("ranks %d  all-reduce of %.1f MB alone, back to back: %.3f ms\n", ranks,
                                   double(nparams) * 4 / 1e6, 1e3 * median(t));
        MPI_Finalize();
        return 0;
    }
    auto measure = [&](const auto& stepped) {
    tg::mpi::data_parallel dp(stepped, m, MPI_COMM_WORLD, {.bucket_bytes = std::size_t(bucket_mb * (1 << 20))});
    tg::sgd opt(m, {.lr = 1e-3}), opt2(m2, {.lr = 1e-3});
    std::vector<double> t_step, t_compute, t_exposed, t_allreduce, t_first, t_done;
    const int warmup = 3;
    for (int i = 0; i < warmup + steps; ++i) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now();
        dp.value_and_grad(g, tg::bind(X, xs, {batch, din}), tg::bind(y, ys));
        opt.step(m, g);
        const double ts = now() - t0, exposed = dp.wait_seconds_last_step();
        if (i >= warmup) {
            t_first.push_back(dp.first_collective_seconds_last_step());
            t_done.push_back(dp.backward_done_seconds_last_step());
        }

        MPI_Barrier(MPI_COMM_WORLD);
        t0 = now();
        tg::value_and_grad(plain, tg::bind(X, xs, {batch, din}), tg::bind(y, ys), tg::params(m2), tg::grads_into(g2));
        opt2.step(m2, g2);
        const double tc = now() - t0;

        MPI_Barrier(MPI_COMM_WORLD);
        t0 = now();
        MPI_Allreduce(MPI_IN_PLACE, scratch.data(), int(nparams), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        const double ta = now() - t0;
        if (i >= warmup) {
            t_step.push_back(ts);
            t_compute.push_back(tc);
            t_exposed.push_back(exposed);
            t_allreduce.push_back(ta);
        }
    }
    const bool same = dp.params_identical();
    if (rank == 0) {
        const double s = median(t_step), c = median(t_compute), e = median(t_exposed), a = median(t_allreduce);
        std::printf("ranks %d  threads/rank %zu  params %zu (%.1f MB f32)  batch/rank %zu  bucket %.3g MB  buckets/step %zu  steps %d  hooks %s\n",
                    ranks, tg::num_threads(), nparams, double(nparams) * 4 / 1e6, batch, bucket_mb, dp.buckets_last_step(), steps,
                    mode == "post" ? "post-accumulate (allreduce_grad)" : "in the backward (allreduce_in_backward)");
        std::printf("step %.2f ms  compute %.2f ms  overhead %.2f ms (waited %.2f ms)  all-reduce alone %.2f ms  "
                    "hidden %.0f%%  params identical %s\n",
                    1e3 * s, 1e3 * c, 1e3 * (s - c), 1e3 * e, 1e3 * a, a > 0 ? 100 * std::max(0.0, 1 - (s - c) / a) : 0.0,
                    same ? "yes" : "NO");
        std::printf("first collective started %.2f ms into the call; forward + backward returned at %.2f ms\n",
                    1e3 * median(t_first), 1e3 * median(t_done));
    }
    return same;
    };
    const bool same = mode == "post" ? measure(step) : measure(early);
    MPI_Finalize();
    return same ? 0 : 1;
}
