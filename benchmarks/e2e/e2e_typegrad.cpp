// typegrad side of the end-to-end benchmark: examples/gpt.cpp and examples/cnn.cpp with their
// sizes as template parameters. Each configuration is one instantiation of the whole model
// (compile time grows with their number, not with L: the blocks are one tg::scan).
#include "e2e.hpp"

#include <typegrad/typegrad.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace tg = typegrad;

namespace e2e {
namespace {

using buf = std::vector<float>;

struct blocks_t {
    BOOST_HANA_DEFINE_STRUCT(blocks_t, (buf, ln1_g), (buf, ln1_b), (buf, wq), (buf, wk), (buf, wv), (buf, wo),
                             (buf, ln2_g), (buf, ln2_b), (buf, w1), (buf, b1), (buf, w2), (buf, b2));
};
struct gpt_params {
    BOOST_HANA_DEFINE_STRUCT(gpt_params, (buf, wte), (buf, wpe), (blocks_t, blocks), (buf, lnf_g), (buf, lnf_b));
};

template <std::size_t T, std::size_t D>
struct gpt_model {
    static constexpr std::size_t L = gpt_config::L, V = gpt_config::V, H = D / 64, Dh = D / H, F = 4 * D;

    static constexpr auto h = tg::param<"h", float, tg::shape<tg::dyn, D>>;
    static constexpr auto ln1_g = tg::param<"ln1_g", float, tg::shape<D>>;
    static constexpr auto ln1_b = tg::param<"ln1_b", float, tg::shape<D>>;
    static constexpr auto wq = tg::param<"wq", float, tg::shape<D, D>>;
    static constexpr auto wk = tg::param<"wk", float, tg::shape<D, D>>;
    static constexpr auto wv = tg::param<"wv", float, tg::shape<D, D>>;
    static constexpr auto wo = tg::param<"wo", float, tg::shape<D, D>>;
    static constexpr auto ln2_g = tg::param<"ln2_g", float, tg::shape<D>>;
    static constexpr auto ln2_b = tg::param<"ln2_b", float, tg::shape<D>>;
    static constexpr auto w1 = tg::param<"w1", float, tg::shape<D, F>>;
    static constexpr auto b1 = tg::param<"b1", float, tg::shape<F>>;
    static constexpr auto w2 = tg::param<"w2", float, tg::shape<F, D>>;
    static constexpr auto b2 = tg::param<"b2", float, tg::shape<D>>;

    template <class X>
    static constexpr auto split_heads(X x) {
        return tg::permute<0, 2, 1, 3>(tg::reshape<tg::shape<tg::dyn, T, H, Dh>>(x));
    }
    template <class X>
    static constexpr auto merge_heads(X x) {
        return tg::reshape<tg::shape<tg::dyn, D>>(tg::permute<0, 2, 1, 3>(x));
    }
    static constexpr auto block() {
        auto a = tg::layer_norm(h, ln1_g, ln1_b);
        auto att = tg::scaled_dot_product_attention(split_heads(tg::matmul(a, wq)), split_heads(tg::matmul(a, wk)),
                                                    split_heads(tg::matmul(a, wv)), tg::causal);
        auto x = h + tg::matmul(merge_heads(att), wo);
        auto m = tg::gelu(tg::matmul(tg::layer_norm(x, ln2_g, ln2_b), w1) + b1);
        return x + tg::matmul(m, w2) + b2;
    }

    template <tg::fixed_string Name, std::size_t... E>
    static constexpr auto stack = tg::param<Name, float, tg::shape<L, E...>>;

    static constexpr auto ids = tg::input<"ids", std::int32_t, tg::shape<tg::dyn>>;
    static constexpr auto pos = tg::input<"pos", std::int32_t, tg::shape<tg::dyn>>;
    static constexpr auto targets = tg::input<"targets", std::int32_t, tg::shape<tg::dyn>>;
    static constexpr auto wte = tg::param<"wte", float, tg::shape<V, D>>;
    static constexpr auto wpe = tg::param<"wpe", float, tg::shape<T, D>>;
    static constexpr auto lnf_g = tg::param<"lnf_g", float, tg::shape<D>>;
    static constexpr auto lnf_b = tg::param<"lnf_b", float, tg::shape<D>>;

    static constexpr auto logits() {
        auto x0 = tg::embedding(ids, wte) + tg::embedding(pos, wpe);
        auto hl = tg::scan(block(), tg::carry(h, x0), tg::stacked(ln1_g, stack<"blocks.ln1_g", D>),
                           tg::stacked(ln1_b, stack<"blocks.ln1_b", D>), tg::stacked(wq, stack<"blocks.wq", D, D>),
                           tg::stacked(wk, stack<"blocks.wk", D, D>), tg::stacked(wv, stack<"blocks.wv", D, D>),
                           tg::stacked(wo, stack<"blocks.wo", D, D>), tg::stacked(ln2_g, stack<"blocks.ln2_g", D>),
                           tg::stacked(ln2_b, stack<"blocks.ln2_b", D>), tg::stacked(w1, stack<"blocks.w1", D, F>),
                           tg::stacked(b1, stack<"blocks.b1", F>), tg::stacked(w2, stack<"blocks.w2", F, D>),
                           tg::stacked(b2, stack<"blocks.b2", D>));
        return tg::matmul(tg::layer_norm(hl, lnf_g, lnf_b), tg::transpose(wte));
    }

    static auto compile() {
        return tg::compile(tg::cross_entropy(logits(), targets),
                           tg::wrt(wte, wpe, lnf_g, lnf_b, stack<"blocks.ln1_g", D>, stack<"blocks.ln1_b", D>,
                                   stack<"blocks.wq", D, D>, stack<"blocks.wk", D, D>, stack<"blocks.wv", D, D>,
                                   stack<"blocks.wo", D, D>, stack<"blocks.ln2_g", D>, stack<"blocks.ln2_b", D>,
                                   stack<"blocks.w1", D, F>, stack<"blocks.b1", F>, stack<"blocks.w2", F, D>,
                                   stack<"blocks.b2", D>));
    }
};

template <std::size_t T, std::size_t D>
class gpt_trainer final : public trainer {
    using M = gpt_model<T, D>;
    static constexpr std::size_t L = M::L, V = M::V, F = M::F;

public:
    explicit gpt_trainer(std::size_t batch)
        : model_{buf(V * D), buf(T * D),
                 {buf(L * D, 1.f), buf(L * D), buf(L * D * D), buf(L * D * D), buf(L * D * D), buf(L * D * D),
                  buf(L * D, 1.f), buf(L * D), buf(L * D * F), buf(L * F), buf(L * F * D), buf(L * D)},
                 buf(D, 1.f), buf(D)},
          grads_(tg::zeros_like(model_)),
          opt_(model_, {.lr = 3e-4, .weight_decay = 0.01}),
          ids_(batch * T),
          pos_(batch * T),
          targets_(batch * T) {
        tg::generator gen{.seed = 1};
        for (buf* w : {&model_.wte, &model_.wpe, &model_.blocks.wq, &model_.blocks.wk, &model_.blocks.wv,
                       &model_.blocks.w1})
            tg::normal(*w, 0.0, 0.02, gen);
        for (buf* w : {&model_.blocks.wo, &model_.blocks.w2}) tg::normal(*w, 0.0, 0.02 / std::sqrt(2.0 * L), gen);
        fill_tokens(batch * T, V, 7, ids_.data());
        fill_tokens(batch * T, V, 8, targets_.data());
        for (std::size_t r = 0; r < batch * T; ++r) pos_[r] = std::int32_t(r % T);
    }
    float step() override {
        const float loss = tg::value_and_grad(step_, tg::bind(M::ids, ids_), tg::bind(M::pos, pos_),
                                              tg::bind(M::targets, targets_), tg::params(model_),
                                              tg::grads_into(grads_));
        opt_.step(model_, grads_);
        return loss;
    }

private:
    gpt_params model_, grads_;
    tg::adamw<gpt_params> opt_;
    std::vector<std::int32_t> ids_, pos_, targets_;
    decltype(M::compile()) step_ = M::compile();
};

// ---- CNN --------------------------------------------------------------------------------------
struct conv_t {
    BOOST_HANA_DEFINE_STRUCT(conv_t, (buf, w));
};
struct conv_b_t {
    BOOST_HANA_DEFINE_STRUCT(conv_b_t, (buf, w), (buf, b));
};
struct fc_t {
    BOOST_HANA_DEFINE_STRUCT(fc_t, (buf, W), (buf, b));
};
struct cnn_params {
    BOOST_HANA_DEFINE_STRUCT(cnn_params, (conv_t, conv1), (conv_b_t, bn1), (conv_b_t, conv2), (fc_t, fc));
};

template <std::size_t S, std::size_t C1, std::size_t C2>
struct cnn_model {
    static constexpr std::size_t classes = cnn_config::classes, S4 = S / 4;
    static constexpr auto X = tg::input<"X", float, tg::shape<tg::dyn, 1, S, S>>;
    static constexpr auto y = tg::input<"y", std::int32_t, tg::shape<tg::dyn>>;
    static constexpr auto running_mean = tg::input<"running_mean", float, tg::shape<C1>>;
    static constexpr auto running_var = tg::input<"running_var", float, tg::shape<C1>>;
    static constexpr auto w1 = tg::param<"conv1.w", float, tg::shape<C1, 1, 3, 3>>;
    static constexpr auto g1 = tg::param<"bn1.w", float, tg::shape<C1>>;
    static constexpr auto b1 = tg::param<"bn1.b", float, tg::shape<C1>>;
    static constexpr auto w2 = tg::param<"conv2.w", float, tg::shape<C2, C1, 3, 3>>;
    static constexpr auto c2 = tg::param<"conv2.b", float, tg::shape<C2>>;
    static constexpr auto W = tg::param<"fc.W", float, tg::shape<classes, C2 * S4 * S4>>;
    static constexpr auto b = tg::param<"fc.b", float, tg::shape<classes>>;

    static constexpr auto logits() {
        auto h = tg::relu(tg::batch_norm<true>(tg::conv2d<1, 1>(X, w1), running_mean, running_var, g1, b1));
        auto p = tg::max_pool2d<2>(h);
        auto q = tg::avg_pool2d<2>(tg::relu(tg::conv2d<1, 1>(p, w2, c2)));
        return tg::linear(tg::reshape<tg::shape<tg::dyn, C2 * S4 * S4>>(q), W, b);
    }
    static auto compile() { return tg::compile(tg::cross_entropy(logits(), y), tg::wrt(w1, g1, b1, w2, c2, W, b)); }
};

template <std::size_t S, std::size_t C1, std::size_t C2>
class cnn_trainer final : public trainer {
    using M = cnn_model<S, C1, C2>;
    static constexpr std::size_t classes = M::classes, S4 = M::S4;

public:
    explicit cnn_trainer(std::size_t n)
        : n_(n),
          model_{{buf(C1 * 9)}, {buf(C1, 1.f), buf(C1)}, {buf(C2 * C1 * 9), buf(C2)}, {buf(classes * C2 * S4 * S4), buf(classes)}},
          grads_(tg::zeros_like(model_)),
          opt_(model_, {.lr = 3e-3}),
          rm_(C1, 0.f),
          rv_(C1, 1.f),
          x_(n * S * S),
          y_(n) {
        tg::generator gen{.seed = 5};
        tg::kaiming_normal(model_.conv1.w, M::w1, gen, {.nonlin = tg::nonlinearity::relu});
        tg::kaiming_normal(model_.conv2.w, M::w2, gen, {.nonlin = tg::nonlinearity::relu});
        tg::kaiming_normal(model_.fc.W, M::W, gen, {.nonlin = tg::nonlinearity::linear});
        std::mt19937 rng(1);
        std::normal_distribution<float> noise(0.f, 1.f);
        for (float& v : x_) v = noise(rng);
        std::vector<int> labels(n);
        fill_tokens(n, classes, 9, labels.data());
        for (std::size_t i = 0; i < n; ++i) y_[i] = labels[i];
    }
    float step() override {
        const float loss = tg::value_and_grad(step_, tg::bind(M::X, x_, {n_, 1, S, S}), tg::bind(M::y, y_),
                                              tg::bind(M::running_mean, rm_), tg::bind(M::running_var, rv_),
                                              tg::params(model_), tg::grads_into(grads_));
        opt_.step(model_, grads_);
        return loss;
    }

private:
    std::size_t n_;
    cnn_params model_, grads_;
    tg::adam<cnn_params> opt_;
    std::vector<float> rm_, rv_, x_;
    std::vector<std::int32_t> y_;
    decltype(M::compile()) step_ = M::compile();
};

}  // namespace

void typegrad_threads(std::size_t n) { tg::set_num_threads(n); }

std::unique_ptr<trainer> typegrad_gpt(const gpt_config& c) {
#define E2E_GPT(T_, D_) \
    if (c.T == T_ && c.D == D_) return std::make_unique<gpt_trainer<T_, D_>>(c.B);
    E2E_GPT(128, 128)
    E2E_GPT(256, 256)
    E2E_GPT(512, 512)
#undef E2E_GPT
    return nullptr;
}

std::unique_ptr<trainer> typegrad_cnn(const cnn_config& c) {
    if (c.S == 12 && c.C1 == 8 && c.C2 == 8) return std::make_unique<cnn_trainer<12, 8, 8>>(c.N);
    if (c.S == 28 && c.C1 == 16 && c.C2 == 32) return std::make_unique<cnn_trainer<28, 16, 32>>(c.N);
    return nullptr;
}

}  // namespace e2e
