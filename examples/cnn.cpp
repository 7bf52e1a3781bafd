// A small CNN (conv2d - batch_norm - relu - max_pool2d - conv2d - relu - avg_pool2d - linear,
// cross_entropy) trained with Adam on a synthetic dataset the example makes: 12 x 12 images of a
// horizontal bar, a vertical bar, a diagonal or an anti-diagonal at random positions, with noise.
// batch_norm updates its running statistics in place during training; the accuracy is measured on
// fresh images with batch_norm in evaluation mode (the running statistics).
#include <typegrad/typegrad.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

namespace tg = typegrad;

constexpr std::size_t S = 12;       // image side
constexpr std::size_t classes = 4;  // -, |, \, /
constexpr std::size_t C1 = 8, C2 = 8;

constexpr auto X = tg::input<"X", float, tg::shape<tg::dyn, 1, S, S>>;
constexpr auto y = tg::input<"y", std::int32_t, tg::shape<tg::dyn>>;
constexpr auto running_mean = tg::input<"running_mean", float, tg::shape<C1>>;
constexpr auto running_var = tg::input<"running_var", float, tg::shape<C1>>;
constexpr auto w1 = tg::param<"conv1.w", float, tg::shape<C1, 1, 3, 3>>;
constexpr auto g1 = tg::param<"bn1.w", float, tg::shape<C1>>;
constexpr auto b1 = tg::param<"bn1.b", float, tg::shape<C1>>;
constexpr auto w2 = tg::param<"conv2.w", float, tg::shape<C2, C1, 3, 3>>;
constexpr auto c2 = tg::param<"conv2.b", float, tg::shape<C2>>;
constexpr auto W = tg::param<"fc.W", float, tg::shape<classes, C2 * 3 * 3>>;
constexpr auto b = tg::param<"fc.b", float, tg::shape<classes>>;

template <bool Training>
constexpr auto logits() {
    auto h = tg::relu(tg::batch_norm<Training>(tg::conv2d<1, 1>(X, w1), running_mean, running_var, g1, b1));
    auto p = tg::max_pool2d<2>(h);                                  // [N, C1, 6, 6]
    auto q = tg::avg_pool2d<2>(tg::relu(tg::conv2d<1, 1>(p, w2, c2)));  // [N, C2, 3, 3]
    return tg::linear(tg::reshape<tg::shape<tg::dyn, C2 * 3 * 3>>(q), W, b);
}

using buf = std::vector<float>;
struct conv_t {
    BOOST_HANA_DEFINE_STRUCT(conv_t, (buf, w));
};
struct conv_b_t {
    BOOST_HANA_DEFINE_STRUCT(conv_b_t, (buf, w), (buf, b));
};
struct fc_t {
    BOOST_HANA_DEFINE_STRUCT(fc_t, (buf, W), (buf, b));
};
struct cnn {
    BOOST_HANA_DEFINE_STRUCT(cnn, (conv_t, conv1), (conv_b_t, bn1), (conv_b_t, conv2), (fc_t, fc));
};

// n images with labels: a bar of length 5-8 of one of the 4 orientations, Gaussian noise
void make_images(std::size_t n, std::mt19937& rng, std::vector<float>& xs, std::vector<std::int32_t>& ys) {
    xs.assign(n * S * S, 0.f);
    ys.resize(n);
    std::uniform_int_distribution<int> cls(0, int(classes) - 1), len(5, 8), at(0, int(S) - 1);
    std::normal_distribution<float> noise(0.f, 0.3f);
    for (std::size_t i = 0; i < n; ++i) {
        const int c = cls(rng), l = len(rng);
        ys[i] = c;
        const int dr[] = {0, 1, 1, 1}, dc[] = {1, 0, 1, -1};
        int r = at(rng), col = at(rng);
        // start so that the bar fits
        r = std::min(r, int(S) - 1 - dr[c] * (l - 1));
        col = dc[c] >= 0 ? std::min(col, int(S) - 1 - dc[c] * (l - 1)) : std::max(col, l - 1);
        float* img = xs.data() + i * S * S;
        for (int k = 0; k < l; ++k) img[(r + dr[c] * k) * int(S) + col + dc[c] * k] = 1.f;
        for (std::size_t e = 0; e < S * S; ++e) img[e] += noise(rng);
    }
}

int main() {
    cnn model{{buf(C1 * 9)}, {buf(C1, 1.f), buf(C1)}, {buf(C2 * C1 * 9), buf(C2)}, {buf(classes * C2 * 9), buf(classes)}};
    tg::generator gen{.seed = 5};
    tg::kaiming_normal(model.conv1.w, w1, gen, {.nonlin = tg::nonlinearity::relu});
    tg::kaiming_normal(model.conv2.w, w2, gen, {.nonlin = tg::nonlinearity::relu});
    tg::kaiming_normal(model.fc.W, W, gen, {.nonlin = tg::nonlinearity::linear});
    cnn grads = tg::zeros_like(model);
    tg::adam opt(model, {.lr = 3e-3});
    std::vector<float> rm(C1, 0.f), rv(C1, 1.f);

    const auto train = tg::compile(tg::cross_entropy(logits<true>(), y), tg::wrt(w1, g1, b1, w2, c2, W, b));
    const auto predict = tg::compile(logits<false>(), tg::wrt(W));

    std::mt19937 rng(1);
    std::vector<float> test_x;
    std::vector<std::int32_t> test_y;
    const std::size_t n_test = 500;
    make_images(n_test, rng, test_x, test_y);
    auto accuracy = [&] {
        auto out = tg::forward(predict, tg::bind(X, test_x, {n_test, 1, S, S}), tg::bind(running_mean, rm),
                               tg::bind(running_var, rv), tg::params(model));
        const auto v = out.values();
        std::size_t right = 0;
        for (std::size_t i = 0; i < n_test; ++i) {
            std::size_t best = 0;
            for (std::size_t k = 1; k < classes; ++k)
                if (v[i * classes + k] > v[i * classes + best]) best = k;
            right += std::int32_t(best) == test_y[i];
        }
        return double(right) / double(n_test);
    };

    const std::size_t batch = 64;
    std::vector<float> xb;
    std::vector<std::int32_t> yb;
    double acc = 0;
    for (int step = 1; step <= 600; ++step) {
        make_images(batch, rng, xb, yb);
        const float loss = tg::value_and_grad(train, tg::bind(X, xb, {batch, 1, S, S}), tg::bind(y, yb),
                                              tg::bind(running_mean, rm), tg::bind(running_var, rv),
                                              tg::params(model), tg::grads_into(grads));
        opt.step(model, grads);
        if (step == 1 || step % 100 == 0) {
            acc = accuracy();
            std::printf("step %3d  loss %.4f  test accuracy %.1f%%\n", step, double(loss), 100 * acc);
        }
    }
    std::printf("running mean of channel 0: %.3f, running var: %.3f\n", double(rm[0]), double(rv[0]));
    return acc > 0.95 ? 0 : 1;
}
