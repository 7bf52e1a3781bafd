// hand_scalar: strict scalar hand-written value + gradient loops (CMake builds this TU with
// auto-vectorisation off). Value and gradient share one pass where the math allows.
#include "check.hpp"
#include "workloads.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

using std::size_t;

template <class T>
T sum_fn(const std::vector<T>& x, std::vector<T>& gx) {
    T acc = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        acc += x[i];
        gx[i] = T(1);
    }
    return acc;
}

// Gradient as p / x_i: inputs are never zero by construction.
template <class T>
T prod_fn(const std::vector<T>& x, std::vector<T>& gx) {
    T p = 1;
    for (T v : x) p *= v;
    for (size_t i = 0; i < x.size(); ++i) gx[i] = p / x[i];
    return p;
}

// Max-shifted for stability; exp values are kept in gx and rescaled to softmax.
template <class T>
T log_sum_exp_fn(const std::vector<T>& x, std::vector<T>& gx) {
    T m = x[0];
    for (T v : x) m = std::max(m, v);
    T s = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        gx[i] = std::exp(x[i] - m);
        s += gx[i];
    }
    const T inv_s = T(1) / s;
    for (auto& g : gx) g *= inv_s;
    return m + std::log(s);
}

template <class T>
T normal_log_pdf_fn(const std::vector<T>& x, std::vector<T>& gx) {
    constexpr T mu = T(tgb::normal_log_pdf::mu);
    constexpr T inv_sigma = T(1 / tgb::normal_log_pdf::sigma);
    T acc = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        const T z = (x[i] - mu) * inv_sigma;
        acc += z * z;
        gx[i] = -z * inv_sigma;
    }
    const T log_norm = T(std::log(tgb::normal_log_pdf::sigma) + tgb::log_sqrt_2pi);
    return T(-0.5) * acc - T(x.size()) * log_norm;
}

template <class T>
T expmul_fn(const std::vector<T>& x, const std::vector<T>& y, std::vector<T>& gx,
            std::vector<T>& gy) {
    T acc = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        const T e = std::exp(x[i]);
        acc += e * y[i];
        gx[i] = e * y[i];
        gy[i] = e;
    }
    return acc;
}

// Reverse mode as an AD tool does it: C = X1 X2, f = sum(C), seed G = df/dC (all ones),
// dX1 = G X2^T, dX2 = X1^T G. The O(K^2) closed form would not measure GEMM.
template <class T>
struct matrix_product_work {
    size_t k;
    std::vector<T> c, g, gx1, gx2;
    explicit matrix_product_work(size_t k_)
        : k(k_), c(k * k), g(k * k, T(1)), gx1(k * k), gx2(k * k) {}

    T operator()(const std::vector<T>& x1, const std::vector<T>& x2) {
        std::fill(c.begin(), c.end(), T(0));
        for (size_t i = 0; i < k; ++i)
            for (size_t p = 0; p < k; ++p)
                for (size_t j = 0; j < k; ++j) c[i * k + j] += x1[i * k + p] * x2[p * k + j];
        T f = 0;
        for (T v : c) f += v;
        for (size_t i = 0; i < k; ++i)
            for (size_t p = 0; p < k; ++p) {
                T acc = 0;
                for (size_t j = 0; j < k; ++j) acc += g[i * k + j] * x2[p * k + j];
                gx1[i * k + p] = acc;
            }
        std::fill(gx2.begin(), gx2.end(), T(0));
        for (size_t i = 0; i < k; ++i)
            for (size_t p = 0; p < k; ++p)
                for (size_t j = 0; j < k; ++j) gx2[p * k + j] += x1[i * k + p] * g[i * k + j];
        return f;
    }
};

// One pass over the rows of X: residual, log-likelihood terms and X^T r accumulate together.
template <class T>
T regression_fn(const tgb::regression::input<T>& in, std::vector<T>& gw, T& gb, T& gsigma) {
    const size_t p = in.p, n = tgb::regression::n_obs;
    std::fill(gw.begin(), gw.end(), T(0));
    T sum_r = 0, sum_r2 = 0;
    for (size_t i = 0; i < n; ++i) {
        const T* xi = &in.x[i * p];
        T mu = in.b;
        for (size_t j = 0; j < p; ++j) mu += xi[j] * in.w[j];
        const T r = in.y[i] - mu;
        sum_r += r;
        sum_r2 += r * r;
        for (size_t j = 0; j < p; ++j) gw[j] += r * xi[j];
    }
    const T inv_s2 = T(1) / (in.sigma * in.sigma);
    T sum_w2 = 0;
    for (size_t j = 0; j < p; ++j) {
        sum_w2 += in.w[j] * in.w[j];
        gw[j] = gw[j] * inv_s2 - in.w[j];
    }
    gb = sum_r * inv_s2 - in.b;
    gsigma = -T(n) / in.sigma + sum_r2 * inv_s2 / in.sigma;
    const T c = T(tgb::log_sqrt_2pi);
    return T(-0.5) * sum_r2 * inv_s2 - T(n) * (std::log(in.sigma) + c) - T(0.5) * sum_w2
           - T(p) * c - T(0.5) * in.b * in.b - c - T(std::log(10.0 - 0.1));
}

// Forward sweep builds h and the direct adjoints; reverse sweep carries them through the
// recurrence and accumulates the parameter gradients. grad = [mu, phi, sigma, h_std...].
template <class T>
T stochastic_volatility_fn(const tgb::stochastic_volatility::input<T>& in, std::vector<T>& h,
                           std::vector<T>& grad) {
    const size_t n = in.y.size();
    const T mu = in.mu, phi = in.phi, sigma = in.sigma;
    const T s0 = T(1) / std::sqrt(T(1) - phi * phi);
    const T c = T(tgb::log_sqrt_2pi);
    T* adj = &grad[3];  // direct adjoints, then overwritten by the h_std gradient
    T lp = 0;
    T h_prev = 0;
    for (size_t t = 0; t < n; ++t) {
        const T z = in.h_std[t];
        const T ht = t == 0 ? mu + sigma * z * s0 : mu + sigma * z + phi * (h_prev - mu);
        const T y2e = in.y[t] * in.y[t] * std::exp(-ht);
        lp += T(-0.5) * (z * z + ht + y2e);
        adj[t] = T(-0.5) + T(0.5) * y2e;
        h[t] = h_prev = ht;
    }
    T g_mu = 0, g_phi = 0, g_sigma = 0, a = 0;
    for (size_t t = n; t-- > 1;) {
        a = adj[t] + phi * a;
        g_mu += a;
        g_phi += a * (h[t - 1] - mu);
        g_sigma += a * in.h_std[t];
        adj[t] = -in.h_std[t] + sigma * a;
    }
    a = adj[0] + phi * a;
    g_mu = g_mu * (T(1) - phi) + a - T(2) * mu / (T(100) + mu * mu);
    g_phi += a * sigma * in.h_std[0] * phi * s0 * s0 * s0;
    g_sigma += a * in.h_std[0] * s0 - T(2) * sigma / (T(25) + sigma * sigma);
    adj[0] = -in.h_std[0] + sigma * a * s0;
    grad[0] = g_mu;
    grad[1] = g_phi;
    grad[2] = g_sigma;
    const T prior = T(-std::log(2.0) - std::log(std::numbers::pi * 5) - std::log(std::numbers::pi * 10))
                    - std::log1p(sigma * sigma / T(25)) - std::log1p(mu * mu / T(100));
    return lp - T(2 * n) * c + prior;
}

// Z = X W^T + b, A = relu(Z), f = sum A^2; dZ = 2A, dW = dZ^T X, db = column sums of dZ.
template <class T>
struct mlp_layer_work {
    static constexpr size_t batch = tgb::mlp_layer::batch;
    size_t d;
    std::vector<T> dz, gw, gb;
    explicit mlp_layer_work(size_t d_) : d(d_), dz(batch * d), gw(d * d), gb(d) {}

    T operator()(const tgb::mlp_layer::input<T>& in) {
        T f = 0;
        std::fill(gb.begin(), gb.end(), T(0));
        for (size_t i = 0; i < batch; ++i)
            for (size_t o = 0; o < d; ++o) {
                T z = in.b[o];
                for (size_t k = 0; k < d; ++k) z += in.x[i * d + k] * in.w[o * d + k];
                const T a = std::max(z, T(0));
                f += a * a;
                dz[i * d + o] = T(2) * a;
                gb[o] += T(2) * a;
            }
        std::fill(gw.begin(), gw.end(), T(0));
        for (size_t i = 0; i < batch; ++i)
            for (size_t o = 0; o < d; ++o) {
                const T g = dz[i * d + o];
                for (size_t k = 0; k < d; ++k) gw[o * d + k] += g * in.x[i * d + k];
            }
        return f;
    }
};

// The timed loop shared by all workloads below; f() returns the value and writes the gradients.
template <class F>
void time_loop(benchmark::State& state, F&& f) {
    for (auto _ : state) {
        auto v = f();
        benchmark::DoNotOptimize(v);
        benchmark::ClobberMemory();
    }
}

template <class W, class T>
const auto& fixture_of(benchmark::State& state) {
    return tgb::fixture<W, T>(static_cast<size_t>(state.range(0)));
}

template <class T>
void bm_sum(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::sum, T>(state);
    std::vector<T> gx(fx.in.x.size());
    auto f = [&] { return sum_fn(fx.in.x, gx); };
    if (!tgb::check_result<T>(state, fx.ref, f(), {gx})) return;
    time_loop(state, f);
}

template <class T>
void bm_prod(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::prod, T>(state);
    std::vector<T> gx(fx.in.x.size());
    auto f = [&] { return prod_fn(fx.in.x, gx); };
    if (!tgb::check_result<T>(state, fx.ref, f(), {gx})) return;
    time_loop(state, f);
}

template <class T>
void bm_log_sum_exp(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::log_sum_exp, T>(state);
    std::vector<T> gx(fx.in.x.size());
    auto f = [&] { return log_sum_exp_fn(fx.in.x, gx); };
    if (!tgb::check_result<T>(state, fx.ref, f(), {gx})) return;
    time_loop(state, f);
}

template <class T>
void bm_normal_log_pdf(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::normal_log_pdf, T>(state);
    std::vector<T> gx(fx.in.x.size());
    auto f = [&] { return normal_log_pdf_fn(fx.in.x, gx); };
    if (!tgb::check_result<T>(state, fx.ref, f(), {gx})) return;
    time_loop(state, f);
}

template <class T>
void bm_matrix_product(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::matrix_product, T>(state);
    matrix_product_work<T> work(fx.in.k);
    auto f = [&] { return work(fx.in.x1, fx.in.x2); };
    if (!tgb::check_result<T>(state, fx.ref, f(), {work.gx1, work.gx2})) return;
    time_loop(state, f);
}

template <class T>
void bm_regression(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::regression, T>(state);
    std::vector<T> gw(fx.in.p);
    T gb{}, gsigma{};
    auto f = [&] { return regression_fn(fx.in, gw, gb, gsigma); };
    const T value = f();
    if (!tgb::check_result<T>(state, fx.ref, value, {gw, std::span(&gb, 1), std::span(&gsigma, 1)}))
        return;
    time_loop(state, f);
}

template <class T>
void bm_stochastic_volatility(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::stochastic_volatility, T>(state);
    std::vector<T> h(fx.in.y.size()), grad(fx.in.y.size() + 3);
    auto f = [&] { return stochastic_volatility_fn(fx.in, h, grad); };
    if (!tgb::check_result<T>(state, fx.ref, f(), {grad})) return;
    time_loop(state, f);
}

template <class T>
void bm_expmul(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::expmul, T>(state);
    std::vector<T> gx(fx.in.x.size()), gy(fx.in.x.size());
    auto f = [&] { return expmul_fn(fx.in.x, fx.in.y, gx, gy); };
    if (!tgb::check_result<T>(state, fx.ref, f(), {gx, gy})) return;
    time_loop(state, f);
}

template <class T>
void bm_mlp_layer(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::mlp_layer, T>(state);
    mlp_layer_work<T> work(fx.in.d);
    auto f = [&] { return work(fx.in); };
    if (!tgb::check_result<T>(state, fx.ref, f(), {work.gw, work.gb})) return;
    time_loop(state, f);
}

#define TGB_REGISTER(W) \
    tgb::register_bench(tgb::W::name, "hand_scalar", bm_##W<float>, bm_##W<double>, tgb::W::sizes)

[[maybe_unused]] const bool registered = [] {
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
