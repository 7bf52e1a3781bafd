// A 2-layer MLP (linear - relu - linear, cross_entropy) trained by SGD with momentum on two
// interleaved spirals that the example generates. Prints the loss and accuracy as they improve.
#include <typegrad/typegrad.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numbers>
#include <random>
#include <vector>

namespace tg = typegrad;

constexpr std::size_t hidden = 64;
constexpr auto X = tg::input<"X", float, tg::shape<tg::dyn, 2>>;
constexpr auto y = tg::input<"y", std::int32_t, tg::shape<tg::dyn>>;
constexpr auto W1 = tg::param<"W1", float, tg::shape<hidden, 2>>;
constexpr auto b1 = tg::param<"b1", float, tg::shape<hidden>>;
constexpr auto W2 = tg::param<"W2", float, tg::shape<2, hidden>>;
constexpr auto b2 = tg::param<"b2", float, tg::shape<2>>;

int main() {
    // Two spirals, 1.5 turns each, with a little noise.
    const std::size_t per_class = 300, n = 2 * per_class;
    std::mt19937 rng(7);
    std::normal_distribution<float> noise(0.f, 0.02f);
    std::vector<float> xd(n * 2);
    std::vector<std::int32_t> yd(n);
    for (std::size_t c = 0; c < 2; ++c)
        for (std::size_t i = 0; i < per_class; ++i) {
            const float r = 0.1f + 0.9f * float(i) / float(per_class);
            const float theta = 3.f * std::numbers::pi_v<float> * float(i) / float(per_class) + float(c) * std::numbers::pi_v<float>;
            const std::size_t k = c * per_class + i;
            xd[2 * k] = r * std::cos(theta) + noise(rng);
            xd[2 * k + 1] = r * std::sin(theta) + noise(rng);
            yd[k] = std::int32_t(c);
        }

    auto logits = tg::linear(tg::relu(tg::linear(X, W1, b1)), W2, b2);
    auto train = tg::compile(tg::cross_entropy(logits, y), tg::wrt(W1, b1, W2, b2));
    auto predict = tg::compile(logits, tg::wrt(W1));

    // He initialisation.
    std::vector<float> w1(hidden * 2), c1(hidden, 0.f), w2(2 * hidden), c2(2, 0.f);
    std::normal_distribution<float> init(0.f, 1.f);
    for (auto& v : w1) v = init(rng) * std::sqrt(2.f / 2.f) * 2.f;
    for (auto& v : w2) v = init(rng) * std::sqrt(2.f / float(hidden));
    std::vector<float> g1(w1.size()), gc1(c1.size()), g2(w2.size()), gc2(c2.size());
    std::vector<float> m1(w1.size()), mc1(c1.size()), m2(w2.size()), mc2(c2.size());

    auto accuracy = [&] {
        auto out = predict.forward(tg::bind(X, xd, {n, 2}), tg::bind(W1, w1), tg::bind(b1, c1), tg::bind(W2, w2),
                                   tg::bind(b2, c2));
        const auto v = out.values();
        std::size_t right = 0;
        for (std::size_t i = 0; i < n; ++i) right += (v[2 * i + 1] > v[2 * i]) == (yd[i] == 1);
        return double(right) / double(n);
    };
    auto sgd = [](std::vector<float>& p, std::vector<float>& mom, const std::vector<float>& g) {
        for (std::size_t i = 0; i < p.size(); ++i) {
            mom[i] = 0.9f * mom[i] + g[i];
            p[i] -= 0.2f * mom[i];
        }
    };

    const int epochs = 4000;
    double acc = 0;
    const auto start = std::chrono::steady_clock::now();
    for (int epoch = 1; epoch <= epochs; ++epoch) {
        const float loss = train.value_and_grad(tg::bind(X, xd, {n, 2}), tg::bind(y, yd), tg::bind(W1, w1), tg::bind(b1, c1),
                                                tg::bind(W2, w2), tg::bind(b2, c2), tg::grad_into(W1, g1),
                                                tg::grad_into(b1, gc1), tg::grad_into(W2, g2), tg::grad_into(b2, gc2));
        sgd(w1, m1, g1);
        sgd(c1, mc1, gc1);
        sgd(w2, m2, g2);
        sgd(c2, mc2, gc2);
        if (epoch % 500 == 0 || epoch == 1) {
            acc = accuracy();
            std::printf("epoch %4d  loss %.4f  accuracy %.1f%%\n", epoch, loss, 100 * acc);
        }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%.1f us per epoch (%zu points, forward + backward + update)\n", 1e6 * seconds / epochs, n);
    return acc > 0.95 ? 0 : 1;
}
