// sacado: Sacado::Rad::ADvar<T>, Trilinos' operator-overloading reverse mode with a global tape.
// Each iteration records the independents and the expression, then Gradcomp() sweeps back; the
// tape memory is reused after each sweep. Written the way a user writes scalar Sacado code.
#include "check.hpp"
#include "workloads.hpp"

#include <Sacado_trad.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <vector>

namespace {

using std::size_t;
template <class T>
using var = Sacado::Rad::ADvar<T>;

// Dense products record one tape node per multiply-add; beyond these sizes a single evaluation
// takes hundreds of MB of tape and seconds, which says nothing new, so they are not registered.
constexpr std::int64_t max_matrix_k = 64;
constexpr std::int64_t max_mlp_d = 64;
constexpr std::int64_t all_sizes = std::numeric_limits<std::int64_t>::max();

template <class T>
std::vector<var<T>> independents(const std::vector<T>& v) {
    return {v.begin(), v.end()};
}

// Gradcomp() seeds the most recently recorded node, so f must be the last operation recorded.
template <class T, class F>
void run(benchmark::State& state, const tgb::reference_result& ref, F&& eval) {
    std::vector<T> grad;
    const T value = eval(&grad);
    if (!tgb::check_result<T>(state, ref, value, {grad})) return;
    for (auto _ : state) {
        T v = eval(nullptr);
        benchmark::DoNotOptimize(v);
    }
}

// Appends the adjoints of vs to grad when it is not null.
template <class T>
void collect(std::vector<T>* grad, const std::vector<var<T>>& vs) {
    if (grad)
        for (const auto& v : vs) grad->push_back(v.adj());
}

template <class W, class T>
const auto& fixture_of(benchmark::State& state) {
    return tgb::fixture<W, T>(static_cast<size_t>(state.range(0)));
}

template <class T>
void bm_sum(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::sum, T>(state);
    run<T>(state, fx.ref, [&](std::vector<T>* grad) {
        auto x = independents(fx.in.x);
        var<T> f = x[0];
        for (size_t i = 1; i < x.size(); ++i) f = f + x[i];
        var<T>::Gradcomp();
        collect(grad, x);
        return f.val();
    });
}

template <class T>
void bm_prod(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::prod, T>(state);
    run<T>(state, fx.ref, [&](std::vector<T>* grad) {
        auto x = independents(fx.in.x);
        var<T> f = x[0];
        for (size_t i = 1; i < x.size(); ++i) f = f * x[i];
        var<T>::Gradcomp();
        collect(grad, x);
        return f.val();
    });
}

// The max shift is a constant: the gradient of log-sum-exp does not depend on it.
template <class T>
void bm_log_sum_exp(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::log_sum_exp, T>(state);
    run<T>(state, fx.ref, [&](std::vector<T>* grad) {
        auto x = independents(fx.in.x);
        T m = x[0].val();
        for (const auto& v : x) m = std::max(m, v.val());
        var<T> s = exp(x[0] - m);
        for (size_t i = 1; i < x.size(); ++i) s = s + exp(x[i] - m);
        var<T> f = log(s) + m;
        var<T>::Gradcomp();
        collect(grad, x);
        return f.val();
    });
}

template <class T>
void bm_normal_log_pdf(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::normal_log_pdf, T>(state);
    const T mu = T(tgb::normal_log_pdf::mu), inv_sigma = T(1 / tgb::normal_log_pdf::sigma);
    const T log_norm = T(double(fx.in.x.size())
                         * (std::log(tgb::normal_log_pdf::sigma) + tgb::log_sqrt_2pi));
    run<T>(state, fx.ref, [&](std::vector<T>* grad) {
        auto x = independents(fx.in.x);
        var<T> acc = 0.0;
        for (const auto& v : x) {
            var<T> z = (v - mu) * inv_sigma;
            acc = acc + z * z;
        }
        var<T> f = T(-0.5) * acc - log_norm;
        var<T>::Gradcomp();
        collect(grad, x);
        return f.val();
    });
}

template <class T>
void bm_matrix_product(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::matrix_product, T>(state);
    const size_t k = fx.in.k;
    run<T>(state, fx.ref, [&](std::vector<T>* grad) {
        auto x1 = independents(fx.in.x1), x2 = independents(fx.in.x2);
        var<T> f = 0.0;
        for (size_t i = 0; i < k; ++i)
            for (size_t j = 0; j < k; ++j) {
                var<T> c = x1[i * k] * x2[j];
                for (size_t p = 1; p < k; ++p) c = c + x1[i * k + p] * x2[p * k + j];
                f = f + c;
            }
        var<T>::Gradcomp();
        collect(grad, x1);
        collect(grad, x2);
        return f.val();
    });
}

template <class T>
void bm_regression(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::regression, T>(state);
    const size_t p = fx.in.p, n = tgb::regression::n_obs;
    const T c = T(tgb::log_sqrt_2pi);
    const T consts = -T(p) * c - c - T(std::log(10.0 - 0.1));
    run<T>(state, fx.ref, [&](std::vector<T>* grad) {
        auto w = independents(fx.in.w);
        var<T> b = fx.in.b, sigma = fx.in.sigma;
        var<T> inv_sigma = T(1) / sigma;
        var<T> ll = 0.0;
        for (size_t i = 0; i < n; ++i) {
            var<T> mu = b;
            for (size_t j = 0; j < p; ++j) mu = mu + fx.in.x[i * p + j] * w[j];
            var<T> z = (fx.in.y[i] - mu) * inv_sigma;
            ll = ll + z * z;
        }
        var<T> w2 = 0.0;
        for (const auto& v : w) w2 = w2 + v * v;
        var<T> f = T(-0.5) * ll - T(n) * (log(sigma) + c) - T(0.5) * w2 - T(0.5) * b * b + consts;
        var<T>::Gradcomp();
        collect(grad, w);
        if (grad) grad->insert(grad->end(), {b.adj(), sigma.adj()});
        return f.val();
    });
}

template <class T>
void bm_stochastic_volatility(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::stochastic_volatility, T>(state);
    const size_t n = fx.in.y.size();
    const T c = T(-2.0 * double(n) * tgb::log_sqrt_2pi - std::log(2.0)
                  - std::log(std::numbers::pi * 5) - std::log(std::numbers::pi * 10));
    run<T>(state, fx.ref, [&](std::vector<T>* grad) {
        var<T> mu = fx.in.mu, phi = fx.in.phi, sigma = fx.in.sigma;
        auto z = independents(fx.in.h_std);
        var<T> lp = 0.0;
        var<T> h = mu + sigma * z[0] / sqrt(T(1) - phi * phi);
        for (size_t t = 0; t < n; ++t) {
            if (t > 0) h = mu + sigma * z[t] + phi * (h - mu);
            const T y2 = fx.in.y[t] * fx.in.y[t];
            lp = lp - T(0.5) * (z[t] * z[t] + h + y2 * exp(-h));
        }
        // Sacado has no log1p.
        var<T> f = lp - log(T(1) + sigma * sigma / T(25)) - log(T(1) + mu * mu / T(100)) + c;
        var<T>::Gradcomp();
        if (grad) grad->insert(grad->end(), {mu.adj(), phi.adj(), sigma.adj()});
        collect(grad, z);
        return f.val();
    });
}

template <class T>
void bm_expmul(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::expmul, T>(state);
    run<T>(state, fx.ref, [&](std::vector<T>* grad) {
        auto x = independents(fx.in.x), y = independents(fx.in.y);
        var<T> f = 0.0;
        for (size_t i = 0; i < x.size(); ++i) f = f + exp(x[i]) * y[i];
        var<T>::Gradcomp();
        collect(grad, x);
        collect(grad, y);
        return f.val();
    });
}

// relu(z)^2 is recorded as z * z on the active branch (z > 0), which has the same derivative.
template <class T>
void bm_mlp_layer(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::mlp_layer, T>(state);
    const size_t d = fx.in.d;
    run<T>(state, fx.ref, [&](std::vector<T>* grad) {
        auto w = independents(fx.in.w), b = independents(fx.in.b);
        var<T> f = 0.0;
        for (size_t i = 0; i < tgb::mlp_layer::batch; ++i)
            for (size_t o = 0; o < d; ++o) {
                var<T> z = b[o];
                for (size_t k = 0; k < d; ++k) z = z + fx.in.x[i * d + k] * w[o * d + k];
                if (z.val() > 0) f = f + z * z;
            }
        f = f + T(0);  // keeps f the last recorded node even if the last unit was inactive
        var<T>::Gradcomp();
        collect(grad, w);
        collect(grad, b);
        return f.val();
    });
}

#define TGB_REGISTER(W, max_size)                                                       \
    tgb::register_bench(tgb::W::name, "sacado", bm_##W<float>, bm_##W<double>, tgb::W::sizes, \
                        max_size)

[[maybe_unused]] const bool registered = [] {
    TGB_REGISTER(sum, all_sizes);
    TGB_REGISTER(prod, all_sizes);
    TGB_REGISTER(log_sum_exp, all_sizes);
    TGB_REGISTER(normal_log_pdf, all_sizes);
    TGB_REGISTER(matrix_product, max_matrix_k);
    TGB_REGISTER(regression, all_sizes);
    TGB_REGISTER(stochastic_volatility, all_sizes);
    TGB_REGISTER(expmul, all_sizes);
    TGB_REGISTER(mlp_layer, max_mlp_d);
    return true;
}();

}  // namespace
