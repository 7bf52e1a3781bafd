// LibTorch eager side of the end-to-end benchmark: the same models as e2e_typegrad.cpp, written as
// one would in PyTorch (functional ops on leaf tensors, loss.backward(), torch::optim), with the
// params laid out as typegrad's (the L blocks' weights stacked along a leading axis).
#include "e2e.hpp"

#include <torch/torch.h>

#include <dlfcn.h>

#include <cmath>
#include <random>
#include <vector>

namespace e2e {
namespace {

using torch::Tensor;
namespace F = torch::nn::functional;

Tensor leaf(Tensor t) { return t.set_requires_grad(true); }

class torch_gpt_trainer final : public trainer {
public:
    explicit torch_gpt_trainer(const gpt_config& c) : c_(c) {
        torch::manual_seed(1);
        const std::int64_t L = gpt_config::L, V = gpt_config::V, D = c.D, T = c.T, F4 = 4 * D;
        const double resid = 0.02 / std::sqrt(2.0 * double(L));
        wte_ = leaf(torch::randn({V, D}) * 0.02);
        wpe_ = leaf(torch::randn({T, D}) * 0.02);
        ln1_g_ = leaf(torch::ones({L, D}));
        ln1_b_ = leaf(torch::zeros({L, D}));
        wq_ = leaf(torch::randn({L, D, D}) * 0.02);
        wk_ = leaf(torch::randn({L, D, D}) * 0.02);
        wv_ = leaf(torch::randn({L, D, D}) * 0.02);
        wo_ = leaf(torch::randn({L, D, D}) * resid);
        ln2_g_ = leaf(torch::ones({L, D}));
        ln2_b_ = leaf(torch::zeros({L, D}));
        w1_ = leaf(torch::randn({L, D, F4}) * 0.02);
        b1_ = leaf(torch::zeros({L, F4}));
        w2_ = leaf(torch::randn({L, F4, D}) * resid);
        b2_ = leaf(torch::zeros({L, D}));
        lnf_g_ = leaf(torch::ones({D}));
        lnf_b_ = leaf(torch::zeros({D}));
        opt_ = std::make_unique<torch::optim::AdamW>(
            std::vector<Tensor>{wte_, wpe_, lnf_g_, lnf_b_, ln1_g_, ln1_b_, wq_, wk_, wv_, wo_, ln2_g_, ln2_b_, w1_, b1_,
                                w2_, b2_},
            torch::optim::AdamWOptions(3e-4).weight_decay(0.01));
        const std::int64_t n = std::int64_t(c.tokens());
        std::vector<int> ids(n), targets(n);
        fill_tokens(n, V, 7, ids.data());
        fill_tokens(n, V, 8, targets.data());
        ids_ = torch::tensor(std::vector<std::int64_t>(ids.begin(), ids.end()));
        targets_ = torch::tensor(std::vector<std::int64_t>(targets.begin(), targets.end()));
        pos_ = torch::arange(T).repeat({std::int64_t(c.B)});
        mask_ = torch::ones({T, T}, torch::kBool).triu(1);
    }

    float step() override {
        const std::int64_t B = c_.B, T = c_.T, D = c_.D, H = c_.heads(), Dh = D / H;
        opt_->zero_grad();
        Tensor x = wte_.index_select(0, ids_) + wpe_.index_select(0, pos_);  // [B T, D]
        const auto heads = [&](const Tensor& t) { return t.view({B, T, H, Dh}).permute({0, 2, 1, 3}); };
        for (std::int64_t l = 0; l < std::int64_t(gpt_config::L); ++l) {
            Tensor a = torch::layer_norm(x, {D}, ln1_g_[l], ln1_b_[l], 1e-5);
            Tensor q = heads(a.matmul(wq_[l])), k = heads(a.matmul(wk_[l])), v = heads(a.matmul(wv_[l]));
            Tensor s = q.matmul(k.transpose(-2, -1)) * (1.0 / std::sqrt(double(Dh)));
            Tensor att = torch::softmax(s.masked_fill(mask_, -INFINITY), -1).matmul(v);
            x = x + att.permute({0, 2, 1, 3}).reshape({B * T, D}).matmul(wo_[l]);
            Tensor m = torch::gelu(torch::layer_norm(x, {D}, ln2_g_[l], ln2_b_[l], 1e-5).matmul(w1_[l]) + b1_[l]);
            x = x + m.matmul(w2_[l]) + b2_[l];
        }
        Tensor logits = torch::layer_norm(x, {D}, lnf_g_, lnf_b_, 1e-5).matmul(wte_.t());
        Tensor loss = F::cross_entropy(logits, targets_);
        loss.backward();
        opt_->step();
        return loss.item<float>();
    }

private:
    gpt_config c_;
    Tensor wte_, wpe_, ln1_g_, ln1_b_, wq_, wk_, wv_, wo_, ln2_g_, ln2_b_, w1_, b1_, w2_, b2_, lnf_g_, lnf_b_;
    Tensor ids_, targets_, pos_, mask_;
    std::unique_ptr<torch::optim::AdamW> opt_;
};

class torch_cnn_trainer final : public trainer {
public:
    explicit torch_cnn_trainer(const cnn_config& c) : c_(c) {
        torch::manual_seed(5);
        const std::int64_t C1 = c.C1, C2 = c.C2, S4 = c.S / 4, K = cnn_config::classes;
        w1_ = leaf(torch::randn({C1, 1, 3, 3}) * std::sqrt(2.0 / 9));
        g1_ = leaf(torch::ones({C1}));
        b1_ = leaf(torch::zeros({C1}));
        w2_ = leaf(torch::randn({C2, C1, 3, 3}) * std::sqrt(2.0 / double(C1 * 9)));
        c2_ = leaf(torch::zeros({C2}));
        W_ = leaf(torch::randn({K, C2 * S4 * S4}) * std::sqrt(1.0 / double(C2 * S4 * S4)));
        b_ = leaf(torch::zeros({K}));
        rm_ = torch::zeros({C1});
        rv_ = torch::ones({C1});
        opt_ = std::make_unique<torch::optim::Adam>(std::vector<Tensor>{w1_, g1_, b1_, w2_, c2_, W_, b_},
                                                    torch::optim::AdamOptions(3e-3));
        std::mt19937 rng(1);
        std::normal_distribution<float> noise(0.f, 1.f);
        std::vector<float> xs(c.N * c.S * c.S);
        for (float& v : xs) v = noise(rng);
        x_ = torch::tensor(xs).view({std::int64_t(c.N), 1, std::int64_t(c.S), std::int64_t(c.S)});
        std::vector<int> labels(c.N);
        fill_tokens(c.N, K, 9, labels.data());
        y_ = torch::tensor(std::vector<std::int64_t>(labels.begin(), labels.end()));
    }

    float step() override {
        opt_->zero_grad();
        Tensor h = torch::conv2d(x_, w1_, {}, 1, 1);
        h = torch::relu(torch::batch_norm(h, g1_, b1_, rm_, rv_, true, 0.1, 1e-5, false));
        Tensor p = torch::max_pool2d(h, 2);
        Tensor q = torch::avg_pool2d(torch::relu(torch::conv2d(p, w2_, c2_, 1, 1)), 2);
        Tensor logits = torch::linear(q.reshape({q.size(0), -1}), W_, b_);
        Tensor loss = F::cross_entropy(logits, y_);
        loss.backward();
        opt_->step();
        return loss.item<float>();
    }

private:
    cnn_config c_;
    Tensor w1_, g1_, b1_, w2_, c2_, W_, b_, rm_, rv_, x_, y_;
    std::unique_ptr<torch::optim::Adam> opt_;
};

}  // namespace

void torch_threads(std::size_t n) {
    at::set_num_threads(int(n));
    // at::set_num_threads does not reach a pthreads OpenBLAS (Debian's BLAS provider of choice);
    // looked up so that no link against it is needed.
    using setter = void (*)(int);
    if (void* sym = dlsym(RTLD_DEFAULT, "openblas_set_num_threads")) reinterpret_cast<setter>(sym)(int(n));
}

std::unique_ptr<trainer> torch_gpt(const gpt_config& c) { return std::make_unique<torch_gpt_trainer>(c); }
std::unique_ptr<trainer> torch_cnn(const cnn_config& c) { return std::make_unique<torch_cnn_trainer>(c); }

}  // namespace e2e
