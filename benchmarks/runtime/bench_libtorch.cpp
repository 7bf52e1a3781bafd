// libtorch: LibTorch eager autograd on one CPU thread. Inputs are tensors built once outside the
// timed loop; each iteration clears the leaf gradients (set to none, as zero_grad does by
// default), runs the forward expression and backward().
// Only ATen is included: <torch/torch.h> roughly doubles this TU's compile time.
#include "check.hpp"
#include "workloads.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/version.h>

#include <dlfcn.h>

#include <cmath>
#include <numbers>
#include <vector>

namespace {

using std::size_t;

template <class T>
at::TensorOptions options() {
    return at::TensorOptions().dtype(std::is_same_v<T, float> ? at::kFloat : at::kDouble);
}

template <class T>
at::Tensor tensor(const std::vector<T>& v, at::IntArrayRef shape) {
    return at::from_blob(const_cast<T*>(v.data()), shape, options<T>()).clone();
}
template <class T>
at::Tensor tensor(const std::vector<T>& v) {
    return tensor(v, {static_cast<std::int64_t>(v.size())});
}
template <class T>
at::Tensor scalar(T v) {
    return at::full({}, v, options<T>());
}
template <class T>
at::Tensor leaf(at::Tensor t) {
    return t.requires_grad_(true);
}

// at::set_num_threads does not reach a pthreads OpenBLAS (Debian's default BLAS provider), whose
// spinning workers otherwise compete with the benchmark thread; look it up so no link is needed.
void single_threaded() {
    at::set_num_threads(1);
    using set_fn = void (*)(int);
    if (void* sym = dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))
        reinterpret_cast<set_fn>(sym)(1);
}

// Checks once against the reference, then times forward + backward. grad order = leaves order.
template <class T, class F>
void run(benchmark::State& state, const tgb::reference_result& ref, std::vector<at::Tensor> leaves,
         F&& forward) {
    single_threaded();
    auto step = [&] {
        for (auto& l : leaves) l.mutable_grad().reset();
        at::Tensor f = forward();
        f.backward();
        return f;
    };
    const double value = step().template item<T>();
    std::vector<T> grad;
    {
        at::NoGradGuard no_grad;
        for (auto& l : leaves) {
            const at::Tensor g = l.grad().contiguous();
            grad.insert(grad.end(), g.data_ptr<T>(), g.data_ptr<T>() + g.numel());
        }
    }
    if (!tgb::check_result<T>(state, ref, value, {grad})) return;
    for (auto _ : state) {
        at::Tensor f = step();
        benchmark::DoNotOptimize(f.data_ptr());
    }
}

template <class W, class T>
const auto& fixture_of(benchmark::State& state) {
    return tgb::fixture<W, T>(static_cast<size_t>(state.range(0)));
}

template <class T>
void bm_sum(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::sum, T>(state);
    at::Tensor x = leaf<T>(tensor(fx.in.x));
    run<T>(state, fx.ref, {x}, [&] { return x.sum(); });
}

template <class T>
void bm_prod(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::prod, T>(state);
    at::Tensor x = leaf<T>(tensor(fx.in.x));
    run<T>(state, fx.ref, {x}, [&] { return x.prod(); });
}

template <class T>
void bm_log_sum_exp(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::log_sum_exp, T>(state);
    at::Tensor x = leaf<T>(tensor(fx.in.x));
    run<T>(state, fx.ref, {x}, [&] { return at::logsumexp(x, {0}); });
}

template <class T>
void bm_normal_log_pdf(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::normal_log_pdf, T>(state);
    at::Tensor x = leaf<T>(tensor(fx.in.x));
    const double mu = tgb::normal_log_pdf::mu, sigma = tgb::normal_log_pdf::sigma;
    const double log_norm = double(fx.in.x.size()) * (std::log(sigma) + tgb::log_sqrt_2pi);
    run<T>(state, fx.ref, {x}, [&] {
        const at::Tensor z = (x - mu) / sigma;
        return (z * z).sum() * -0.5 - log_norm;
    });
}

template <class T>
void bm_matrix_product(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::matrix_product, T>(state);
    const auto k = static_cast<std::int64_t>(fx.in.k);
    at::Tensor x1 = leaf<T>(tensor(fx.in.x1, {k, k}));
    at::Tensor x2 = leaf<T>(tensor(fx.in.x2, {k, k}));
    run<T>(state, fx.ref, {x1, x2}, [&] { return at::mm(x1, x2).sum(); });
}

template <class T>
void bm_regression(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::regression, T>(state);
    const auto p = static_cast<std::int64_t>(fx.in.p), n = std::int64_t(tgb::regression::n_obs);
    const at::Tensor x = tensor(fx.in.x, {n, p}), y = tensor(fx.in.y);
    at::Tensor w = leaf<T>(tensor(fx.in.w)), b = leaf<T>(scalar(fx.in.b)),
               sigma = leaf<T>(scalar(fx.in.sigma));
    const double c = tgb::log_sqrt_2pi;
    const double consts = -double(p) * c - c - std::log(10.0 - 0.1);  // priors' constants
    run<T>(state, fx.ref, {w, b, sigma}, [&] {
        const at::Tensor z = (y - (at::mv(x, w) + b)) / sigma;
        return (z * z).sum() * -0.5 - (at::log(sigma) + c) * double(n) - (w * w).sum() * 0.5
               - b * b * 0.5 + consts;
    });
}

// Eager LibTorch has no scan primitive, so the state recurrence is a loop over time steps as a
// user would write it (unbind keeps it at two autograd nodes per step).
template <class T>
void bm_stochastic_volatility(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::stochastic_volatility, T>(state);
    const size_t n = fx.in.y.size();
    const at::Tensor y2 = tensor(fx.in.y).square();
    at::Tensor mu = leaf<T>(scalar(fx.in.mu)), phi = leaf<T>(scalar(fx.in.phi)),
               sigma = leaf<T>(scalar(fx.in.sigma)), h_std = leaf<T>(tensor(fx.in.h_std));
    const double c = -2.0 * double(n) * tgb::log_sqrt_2pi - std::log(2.0)
                     - std::log(std::numbers::pi * 5) - std::log(std::numbers::pi * 10);
    std::vector<at::Tensor> centred(n);
    run<T>(state, fx.ref, {mu, phi, sigma, h_std}, [&] {
        const std::vector<at::Tensor> u = (h_std * sigma).unbind(0);
        centred[0] = u[0] / at::sqrt(1 - phi * phi);
        for (size_t t = 1; t < n; ++t) centred[t] = u[t] + phi * centred[t - 1];
        const at::Tensor h = at::stack(centred) + mu;
        return (h_std * h_std).sum() * -0.5 - h.sum() * 0.5 - (y2 * at::exp(-h)).sum() * 0.5
               - at::log1p(sigma * sigma / 25) - at::log1p(mu * mu / 100) + c;
    });
}

template <class T>
void bm_expmul(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::expmul, T>(state);
    at::Tensor x = leaf<T>(tensor(fx.in.x)), y = leaf<T>(tensor(fx.in.y));
    run<T>(state, fx.ref, {x, y}, [&] { return (x.exp() * y).sum(); });
}

template <class T>
void bm_mlp_layer(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::mlp_layer, T>(state);
    const auto d = static_cast<std::int64_t>(fx.in.d), rows = std::int64_t(tgb::mlp_layer::batch);
    const at::Tensor x = tensor(fx.in.x, {rows, d});
    at::Tensor w = leaf<T>(tensor(fx.in.w, {d, d})), b = leaf<T>(tensor(fx.in.b));
    run<T>(state, fx.ref, {w, b}, [&] { return at::relu(at::linear(x, w, b)).square().sum(); });
}

#define TGB_REGISTER(W) \
    tgb::register_bench(tgb::W::name, "libtorch", bm_##W<float>, bm_##W<double>, tgb::W::sizes)

[[maybe_unused]] const bool registered = [] {
    benchmark::AddCustomContext("libtorch_version", TORCH_VERSION);
    TGB_REGISTER(sum);
    TGB_REGISTER(prod);
    TGB_REGISTER(log_sum_exp);
    TGB_REGISTER(normal_log_pdf);
    TGB_REGISTER(matrix_product);
    TGB_REGISTER(regression);
    TGB_REGISTER(stochastic_volatility);
    TGB_REGISTER(expmul);
    TGB_REGISTER(mlp_layer);
    return true;
}();

}  // namespace
