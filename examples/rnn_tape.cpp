// A recurrent cell applied T times, T known only at run time: each step is a compiled segment on a
// tg::tape, and one backward runs through all of them in reverse (the C++ form of a graph break).
#include <typegrad/typegrad.hpp>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace tg = typegrad;

constexpr std::size_t H = 8;
constexpr auto h = tg::param<"h", float, tg::shape<H>>;
constexpr auto x = tg::input<"x", float, tg::shape<H>>;
constexpr auto W = tg::param<"W", float, tg::shape<H, H>>;

struct rnn {
    BOOST_HANA_DEFINE_STRUCT(rnn, (std::vector<float>, W));
};

int main(int argc, char**) {
    const std::size_t T = 20 + std::size_t(argc);  // a trip count the compiler cannot know
    std::mt19937 rng(3);
    std::normal_distribution<float> n01(0.f, 0.3f);
    rnn model{std::vector<float>(H * H)}, grads{std::vector<float>(H * H)};
    for (auto& v : model.W) v = n01(rng);
    std::vector<float> h0(H, 0.f);
    tg::sgd opt(model, {.lr = 0.5});
    std::vector<std::vector<float>> xs(T, std::vector<float>(H));
    for (auto& xt : xs)
        for (auto& v : xt) v = n01(rng);
    std::vector<float> target(H, 0.5f);
    constexpr auto y = tg::input<"y", float, tg::shape<H>>;

    auto cell = tg::compile(tg::tanh(tg::matmul(W, h) + x), tg::wrt(h, W));
    auto head = tg::compile(tg::mse_loss(h, y), tg::wrt(h));
    float first = 0, last = 0;
    for (int epoch = 0; epoch < 60; ++epoch) {
        tg::zero_grad(grads);
        tg::tape<float> tape;
        std::span<const float> state = h0;
        for (const auto& xt : xs)
            state = tape.record(cell, h, tg::bind(h, state), tg::bind(x, xt), tg::bind(W, model.W),
                                tg::grad_into(W, grads.W, tg::accumulate));
        const float loss = tape.record(head, h, tg::bind(h, state), tg::bind(y, target))[0];
        const std::vector<float> seed{1.f};
        tape.backward(seed);  // T + 1 segments, last first; grads.W accumulates over all of them
        opt.step(model, grads);
        if (epoch == 0) first = loss;
        last = loss;
        if (epoch % 10 == 0) std::printf("epoch %2d  T = %zu  loss %.5f\n", epoch, T, loss);
    }
    std::printf("loss %.5f -> %.5f\n", first, last);
    return last < 0.5f * first ? 0 : 1;
}
