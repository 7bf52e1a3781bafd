// A 2-layer MLP (linear - relu - linear, cross_entropy) trained on two interleaved spirals that
// the example generates: the parameters live in one struct (a parameter set), initialised with
// kaiming_normal, trained by SGD with momentum, and saved to / restored from a safetensors file.
#include <typegrad/typegrad.hpp>
#if __has_include(<nlohmann/json.hpp>)
#include <typegrad/train/checkpoint.hpp>
#endif

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <numbers>
#include <string>
#include <random>
#include <vector>

namespace tg = typegrad;

constexpr std::size_t hidden = 64;

// The parameters: graph params are named after the members ("fc1.W" is fc1's W).
struct linear_layer {
    BOOST_HANA_DEFINE_STRUCT(linear_layer, (std::vector<float>, W), (std::vector<float>, b));
};
struct mlp {
    BOOST_HANA_DEFINE_STRUCT(mlp, (linear_layer, fc1), (linear_layer, fc2));
};

constexpr auto X = tg::input<"X", float, tg::shape<tg::dyn, 2>>;
constexpr auto y = tg::input<"y", std::int32_t, tg::shape<tg::dyn>>;
constexpr auto W1 = tg::param<"fc1.W", float, tg::shape<hidden, 2>>;  // row-major {out, in}
constexpr auto b1 = tg::param<"fc1.b", float, tg::shape<hidden>>;
constexpr auto W2 = tg::param<"fc2.W", float, tg::shape<2, hidden>>;
constexpr auto b2 = tg::param<"fc2.b", float, tg::shape<2>>;

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

    // He initialisation, seeded and counter-based; biases zero.
    mlp model{{std::vector<float>(hidden * 2), std::vector<float>(hidden)},
              {std::vector<float>(2 * hidden), std::vector<float>(2)}};
    tg::generator gen{.seed = 7};
    tg::kaiming_normal(model.fc1.W, W1, gen, {.nonlin = tg::nonlinearity::relu});
    tg::kaiming_normal(model.fc2.W, W2, gen, {.nonlin = tg::nonlinearity::relu});
    mlp grads = tg::zeros_like(model);
    tg::sgd opt(model, {.lr = 0.2, .momentum = 0.9});

    auto accuracy = [&](const mlp& m) {
        auto out = tg::forward(predict, tg::bind(X, xd, {n, 2}), tg::params(m));
        const auto v = out.values();
        std::size_t right = 0;
        for (std::size_t i = 0; i < n; ++i) right += (v[2 * i + 1] > v[2 * i]) == (yd[i] == 1);
        return double(right) / double(n);
    };

    const int epochs = 4000;
    double acc = 0;
    const auto start = std::chrono::steady_clock::now();
    for (int epoch = 1; epoch <= epochs; ++epoch) {
        const float loss = tg::value_and_grad(train, tg::bind(X, xd, {n, 2}), tg::bind(y, yd), tg::params(model),
                                              tg::grads_into(grads));
        opt.step(model, grads);
        if (epoch % 500 == 0 || epoch == 1) {
            acc = accuracy(model);
            std::printf("epoch %4d  loss %.4f  accuracy %.1f%%\n", epoch, loss, 100 * acc);
        }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%.1f us per epoch (%zu points, forward + backward + update)\n", 1e6 * seconds / epochs, n);

#if __has_include(<nlohmann/json.hpp>)
    // Save the trained model with its graph shapes, restore it into a fresh struct, check it predicts the same.
    const auto path = std::filesystem::temp_directory_path() /
                      ("typegrad_mlp_example_" + std::to_string(std::random_device{}()) + ".safetensors");
    tg::safetensors_writer writer;
    writer.add(model, "", tg::shapes_of(train));
    writer.save(path);
    mlp restored = tg::zeros_like(model);
    tg::safetensors_reader(path).load(restored, "", tg::shapes_of(train));
    std::filesystem::remove(path);
    const double restored_acc = accuracy(restored);
    std::printf("restored from %s: accuracy %.1f%%\n", path.filename().c_str(), 100 * restored_acc);
    if (restored_acc != acc) return 1;
#endif
    return acc > 0.95 ? 0 : 1;
}
