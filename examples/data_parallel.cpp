// Data-parallel training over MPI: the MLP of examples/mlp.cpp trained on two spirals, each rank
// holding every P-th point. tg::mpi::data_parallel broadcasts rank 0's initial params, and each
// step averages the gradients over the ranks: the all-reduce of a param starts from its
// post-accumulate hook (tg::mpi::allreduce_grad) in buckets, and the step returns once every
// bucket is reduced, so each rank's SGD update sees the gradient of the whole batch.
//
//   mpirun -np 2 ./data_parallel                       # one machine
//   mpirun -np 8 --host a:4,b:4 ./data_parallel        # two hosts, four ranks each
#include <typegrad/distributed/mpi.hpp>
#include <typegrad/typegrad.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numbers>
#include <random>
#include <vector>

namespace tg = typegrad;

constexpr std::size_t hidden = 64;

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

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    int status = 1;
    try {
        int rank = 0, ranks = 1;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm_size(MPI_COMM_WORLD, &ranks);

        // The whole data set (the same on every rank), then this rank's share: points rank, rank + P, ...
        const std::size_t per_class = 300, n = 2 * per_class;
        std::mt19937 rng(7);
        std::normal_distribution<float> noise(0.f, 0.02f);
        std::vector<float> xd(n * 2), my_x;
        std::vector<std::int32_t> yd(n), my_y;
        for (std::size_t c = 0; c < 2; ++c)
            for (std::size_t i = 0; i < per_class; ++i) {
                const float r = 0.1f + 0.9f * float(i) / float(per_class);
                const float theta = 3.f * std::numbers::pi_v<float> * float(i) / float(per_class) + float(c) * std::numbers::pi_v<float>;
                const std::size_t k = c * per_class + i;
                xd[2 * k] = r * std::cos(theta) + noise(rng);
                xd[2 * k + 1] = r * std::sin(theta) + noise(rng);
                yd[k] = std::int32_t(c);
            }
        for (std::size_t k = std::size_t(rank); k < n; k += std::size_t(ranks)) {
            my_x.insert(my_x.end(), {xd[2 * k], xd[2 * k + 1]});
            my_y.push_back(yd[k]);
        }

        // Each param's gradient is handed to the all-reduce as soon as it is complete.
        constexpr tg::mpi::allreduce_grad reduce{};
        auto logits = tg::linear(tg::relu(tg::linear(X, tg::post_accumulate_grad_hook(W1, reduce),
                                                     tg::post_accumulate_grad_hook(b1, reduce))),
                                 tg::post_accumulate_grad_hook(W2, reduce), tg::post_accumulate_grad_hook(b2, reduce));
        auto train = tg::compile(tg::cross_entropy(logits, y), tg::wrt(W1, b1, W2, b2));
        auto predict = tg::compile(tg::linear(tg::relu(tg::linear(X, W1, b1)), W2, b2), tg::wrt(W1));

        mlp model{{std::vector<float>(hidden * 2), std::vector<float>(hidden)},
                  {std::vector<float>(2 * hidden), std::vector<float>(2)}};
        tg::generator gen{.seed = 7};
        tg::kaiming_normal(model.fc1.W, W1, gen, {.nonlin = tg::nonlinearity::relu});
        tg::kaiming_normal(model.fc2.W, W2, gen, {.nonlin = tg::nonlinearity::relu});
        mlp grads = tg::zeros_like(model);

        tg::mpi::data_parallel dp(train, model, MPI_COMM_WORLD);  // checks every rank agrees, broadcasts rank 0's params
        tg::sgd opt(model, {.lr = 0.2, .momentum = 0.9});

        const std::size_t mine = my_y.size();
        double accuracy = 0;
        for (int epoch = 1; epoch <= 4000; ++epoch) {
            const float loss = dp.value_and_grad(grads, tg::bind(X, my_x, {mine, 2}), tg::bind(y, my_y));  // mean over ranks
            opt.step(model, grads);
            if (epoch % 1000 == 0 || epoch == 1) {
                auto out = tg::forward(predict, tg::bind(X, xd, {n, 2}), tg::params(model));
                const auto v = out.values();
                std::size_t right = 0;
                for (std::size_t i = 0; i < n; ++i) right += (v[2 * i + 1] > v[2 * i]) == (yd[i] == 1);
                accuracy = double(right) / double(n);
                if (rank == 0)
                    std::printf("epoch %4d  loss %.4f  accuracy %.1f%%  (%d ranks, %zu points each)\n", epoch, loss,
                                100 * accuracy, ranks, mine);
            }
        }
        const bool identical = dp.params_identical();
        if (rank == 0) std::printf("params bitwise identical on all ranks: %s\n", identical ? "yes" : "NO");
        status = accuracy > 0.95 && identical ? 0 : 1;
    } catch (const tg::error& e) {
        std::fprintf(stderr, "%s\n", e.what());
    }
    MPI_Finalize();
    return status;
}
