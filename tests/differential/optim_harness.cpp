// typegrad's optimizers against LibTorch's torch::optim on the same gradient sequences: SGD
// (momentum, dampening, weight decay, nesterov), Adam and AdamW (weight decay, amsgrad), and
// clip_grad_norm against torch::nn::utils::clip_grad_norm_. Double params within 1e-13 and float
// params within 4e-6, relative to the largest param, after every one of 25 steps (measured:
// 6.4e-16 and 4.2e-7 with LibTorch 1.13: the same operations in the same order, up to ATen's fused
// multiply-adds).
#include <torch/torch.h>

#include <typegrad/typegrad.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "optim_harness.hpp"

namespace tg = typegrad;

namespace {

struct pset {
    BOOST_HANA_DEFINE_STRUCT(pset, (std::vector<double>, w), (std::vector<float>, f));
};

pset start() {
    pset p{std::vector<double>(19), std::vector<float>(37)};
    for (std::size_t i = 0; i < p.w.size(); ++i) p.w[i] = 0.5 - 0.07 * double(i);
    for (std::size_t i = 0; i < p.f.size(); ++i) p.f[i] = float(0.3 - 0.02 * double(i));
    return p;
}
pset grads_at(int t) {
    pset g{std::vector<double>(19), std::vector<float>(37)};
    for (std::size_t i = 0; i < g.w.size(); ++i) g.w[i] = std::sin(1.0 + double(i) * 0.7 + t * 1.3) * (1 + t % 3);
    for (std::size_t i = 0; i < g.f.size(); ++i) g.f[i] = float(std::cos(0.5 + double(i) * 0.3 - t * 0.9));
    return g;
}
template <class T>
torch::Tensor to_tensor(const std::vector<T>& v) {
    const auto dtype = std::is_same_v<T, double> ? torch::kFloat64 : torch::kFloat32;
    return torch::from_blob(const_cast<T*>(v.data()), {long(v.size())}, dtype).clone();
}
template <class T>
double max_rel_error(const std::vector<T>& ours, const torch::Tensor& ref) {
    const auto r = ref.contiguous();
    const T* p = r.data_ptr<T>();
    double scale = 0, err = 0;
    for (std::size_t i = 0; i < ours.size(); ++i) {
        scale = std::max(scale, std::abs(double(p[i])));
        err = std::max(err, std::abs(double(ours[i]) - double(p[i])));
    }
    return err / std::max(scale, 1e-30);
}

struct result {
    long cases = 0, failures = 0;
    double worst_f64 = 0, worst_f32 = 0;
};

template <class Ours>
void compare(const std::string& name, Ours& ours, const std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>& make,
             result& r) {
    pset p = start();
    auto tw = to_tensor(p.w).requires_grad_(true), tf = to_tensor(p.f).requires_grad_(true);
    auto theirs = make({tw, tf});
    double worst64 = 0, worst32 = 0;
    for (int t = 1; t <= 25; ++t) {
        const pset g = grads_at(t);
        ours.step(p, g);
        tw.mutable_grad() = to_tensor(g.w);
        tf.mutable_grad() = to_tensor(g.f);
        theirs->step();
        worst64 = std::max(worst64, max_rel_error(p.w, tw.detach()));
        worst32 = std::max(worst32, max_rel_error(p.f, tf.detach()));
    }
    const bool ok = worst64 <= 1e-13 && worst32 <= 4e-6;
    ++r.cases;
    r.failures += !ok;
    r.worst_f64 = std::max(r.worst_f64, worst64);
    r.worst_f32 = std::max(r.worst_f32, worst32);
    if (!ok) std::printf("optim differential FAILED: %s: double %.3g, float %.3g\n", name.c_str(), worst64, worst32);
}

}  // namespace

long typegrad_differential::run_optim_differential() {
    namespace optim = torch::optim;
    result r;
    for (const double momentum : {0.0, 0.9})
        for (const double dampening : {0.0, 0.3})
            for (const double wd : {0.0, 0.01})
                for (const bool nesterov : {false, true}) {
                    if (nesterov && (momentum == 0 || dampening != 0)) continue;
                    const tg::sgd_options o{.lr = 0.05, .momentum = momentum, .dampening = dampening, .weight_decay = wd,
                                            .nesterov = nesterov};
                    tg::sgd ours(start(), o);
                    compare("sgd", ours, [&](std::vector<torch::Tensor> ps) -> std::unique_ptr<optim::Optimizer> {
                        return std::make_unique<optim::SGD>(ps, optim::SGDOptions(o.lr).momentum(momentum).dampening(dampening)
                                                                     .weight_decay(wd).nesterov(nesterov));
                    }, r);
                }
    for (const bool amsgrad : {false, true})
        for (const double wd : {0.0, 0.05}) {
            const tg::adam_options o{.lr = 0.02, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = wd, .amsgrad = amsgrad};
            tg::adam a(start(), o);
            compare("adam", a, [&](std::vector<torch::Tensor> ps) -> std::unique_ptr<optim::Optimizer> {
                return std::make_unique<optim::Adam>(ps, optim::AdamOptions(o.lr).betas({o.beta1, o.beta2}).eps(o.eps)
                                                              .weight_decay(wd).amsgrad(amsgrad));
            }, r);
            tg::adamw w(start(), o);
            compare("adamw", w, [&](std::vector<torch::Tensor> ps) -> std::unique_ptr<optim::Optimizer> {
                return std::make_unique<optim::AdamW>(ps, optim::AdamWOptions(o.lr).betas({o.beta1, o.beta2}).eps(o.eps)
                                                               .weight_decay(wd).amsgrad(amsgrad));
            }, r);
        }
    // clip_grad_norm
    for (const double max_norm : {0.5, 100.0}) {
        pset g = grads_at(3);
        auto tw = to_tensor(g.w).requires_grad_(true), tf = to_tensor(g.f).requires_grad_(true);
        tw.mutable_grad() = to_tensor(g.w);
        tf.mutable_grad() = to_tensor(g.f);
        const double theirs = torch::nn::utils::clip_grad_norm_(std::vector<torch::Tensor>{tw, tf}, max_norm);
        const double ours = tg::clip_grad_norm(g, max_norm);
        const double e64 = max_rel_error(g.w, tw.grad()), e32 = max_rel_error(g.f, tf.grad());
        const bool ok = std::abs(ours - theirs) <= 1e-5 * theirs && e64 <= 1e-5 && e32 <= 1e-5;
        ++r.cases;
        r.failures += !ok;
        if (!ok) std::printf("optim differential FAILED: clip_grad_norm(%g): norm %g vs %g, errors %.3g %.3g\n", max_norm, ours, theirs, e64, e32);
    }
    std::printf("optim differential: %ld configurations against torch::optim, %ld failures; worst error double %.3g "
                "(bound 1e-13), float %.3g (bound 4e-06)\n",
                r.cases, r.failures, r.worst_f64, r.worst_f32);
    return r.failures;
}
