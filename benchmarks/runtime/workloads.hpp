// Benchmark workloads: deterministic inputs and plain scalar double references.
//
// Every workload is a struct W with
//   W::name                      registered name prefix, e.g. "expmul"
//   W::sizes                     the size arguments benchmarked (meaning documented per workload)
//   W::input<T>                  the inputs in element type T (float or double)
//   W::make<T>(n)                inputs for size n from a fixed seed (same values for float and double,
//                                up to rounding)
//   W::reference(in)             value and closed-form gradient in double from the T inputs; the
//                                gradient blocks are concatenated in the order documented per workload
// and tgb::fixture<W, T>(n) returns {in, ref}, cached because Google Benchmark re-enters a benchmark
// function for every repetition.
//
// The set is the ADBenchmark set of the FastAD paper (sum, prod, log_sum_exp, normal_log_pdf,
// matrix_product, regression, stochastic_volatility) plus expmul and mlp_layer.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <numbers>
#include <random>
#include <vector>

namespace tgb {

struct reference_result {
    double value = 0;
    std::vector<double> grad;  // all gradient blocks, concatenated
};

// mt19937_64 is fully specified and the transforms below are ours, so inputs are identical across
// standard libraries (std::normal_distribution is not).
class rng {
public:
    explicit rng(std::uint64_t seed) : eng_(seed) {}
    double uniform(double lo, double hi) {
        return lo + (hi - lo) * (static_cast<double>(eng_() >> 11) * 0x1.0p-53);
    }
    double normal(double mu, double sd) {  // Box-Muller; u1 in (0, 1] keeps log finite
        const double u1 = 1.0 - uniform(0.0, 1.0);
        const double u2 = uniform(0.0, 1.0);
        return mu + sd * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
    }

private:
    std::mt19937_64 eng_;
};

inline constexpr double log_sqrt_2pi = 0.91893853320467274178;  // log(sqrt(2 pi))

// N = 2^4, 2^6, ..., 2^14 and 1e6 elements.
inline constexpr std::array<std::int64_t, 7> vector_sizes{16, 64, 256, 1024, 4096, 16384, 1000000};

template <class T>
std::vector<T> to(const std::vector<double>& v) {
    return {v.begin(), v.end()};
}

// f = sum_i x_i; grad: x.
struct sum {
    static constexpr const char* name = "sum";
    static constexpr auto sizes = vector_sizes;
    template <class T>
    struct input {
        std::vector<T> x;
    };
    template <class T>
    static input<T> make(std::size_t n) {
        rng r(101);
        std::vector<T> x(n);
        for (auto& v : x) v = static_cast<T>(r.uniform(0.0, 1.0));
        return {x};
    }
    template <class T>
    static reference_result reference(const input<T>& in) {
        reference_result ref{0.0, std::vector<double>(in.x.size(), 1.0)};
        for (T v : in.x) ref.value += v;
        return ref;
    }
};

// f = prod_i x_i with x_i in [0.99, 1.01] (and never 0) so f stays finite even for N = 1e6;
// grad_i = f / x_i.
struct prod {
    static constexpr const char* name = "prod";
    static constexpr auto sizes = vector_sizes;
    template <class T>
    struct input {
        std::vector<T> x;
    };
    template <class T>
    static input<T> make(std::size_t n) {
        rng r(102);
        std::vector<T> x(n);
        for (auto& v : x) v = static_cast<T>(r.uniform(0.99, 1.01));
        return {x};
    }
    template <class T>
    static reference_result reference(const input<T>& in) {
        reference_result ref{1.0, {}};
        for (T v : in.x) ref.value *= v;
        ref.grad.reserve(in.x.size());
        for (T v : in.x) ref.grad.push_back(ref.value / v);
        return ref;
    }
};

// f = log(sum_i exp(x_i)); grad: softmax(x).
struct log_sum_exp {
    static constexpr const char* name = "log_sum_exp";
    static constexpr auto sizes = vector_sizes;
    template <class T>
    struct input {
        std::vector<T> x;
    };
    template <class T>
    static input<T> make(std::size_t n) {
        rng r(103);
        std::vector<T> x(n);
        for (auto& v : x) v = static_cast<T>(r.normal(0.0, 1.0));
        return {x};
    }
    template <class T>
    static reference_result reference(const input<T>& in) {
        double m = -INFINITY;
        for (T v : in.x) m = std::max(m, double(v));
        double s = 0;
        for (T v : in.x) s += std::exp(v - m);
        reference_result ref{m + std::log(s), {}};
        ref.grad.reserve(in.x.size());
        for (T v : in.x) ref.grad.push_back(std::exp(v - ref.value));
        return ref;
    }
};

// f = sum_i log N(x_i | mu, sigma) with mu = -0.56, sigma = 1.37; grad: x.
struct normal_log_pdf {
    static constexpr const char* name = "normal_log_pdf";
    static constexpr auto sizes = vector_sizes;
    static constexpr double mu = -0.56;
    static constexpr double sigma = 1.37;
    template <class T>
    struct input {
        std::vector<T> x;
    };
    template <class T>
    static input<T> make(std::size_t n) {
        rng r(104);
        std::vector<T> x(n);
        for (auto& v : x) v = static_cast<T>(r.normal(0.0, 1.0));
        return {x};
    }
    template <class T>
    static reference_result reference(const input<T>& in) {
        reference_result ref{0.0, {}};
        ref.grad.reserve(in.x.size());
        for (T v : in.x) {
            const double z = (v - mu) / sigma;
            ref.value += -0.5 * z * z - std::log(sigma) - log_sqrt_2pi;
            ref.grad.push_back(-z / sigma);
        }
        return ref;
    }
};

// f = sum_ij (X1 X2)_ij with X1, X2 K x K row-major; size argument is K (K^2 = 16 .. 32761).
// grad: X1 (dX1_ik = sum_j X2_kj), then X2 (dX2_kj = sum_i X1_ik). The reference uses this O(K^2)
// closed form; the baselines do the general reverse-mode work (forward GEMM + two backward GEMMs).
struct matrix_product {
    static constexpr const char* name = "matrix_product";
    static constexpr std::array<std::int64_t, 7> sizes{4, 8, 16, 32, 64, 128, 181};
    template <class T>
    struct input {
        std::size_t k = 0;
        std::vector<T> x1, x2;
    };
    template <class T>
    static input<T> make(std::size_t k) {
        rng r(105);
        input<T> in{k, std::vector<T>(k * k), std::vector<T>(k * k)};
        for (auto& v : in.x1) v = static_cast<T>(r.uniform(-1.0, 1.0));
        for (auto& v : in.x2) v = static_cast<T>(r.uniform(-1.0, 1.0));
        return in;
    }
    template <class T>
    static reference_result reference(const input<T>& in) {
        const std::size_t k = in.k;
        std::vector<double> col_x1(k, 0.0), row_x2(k, 0.0);
        for (std::size_t i = 0; i < k; ++i)
            for (std::size_t j = 0; j < k; ++j) {
                col_x1[j] += in.x1[i * k + j];
                row_x2[i] += in.x2[i * k + j];
            }
        reference_result ref{0.0, std::vector<double>(2 * k * k)};
        for (std::size_t p = 0; p < k; ++p) ref.value += col_x1[p] * row_x2[p];
        for (std::size_t i = 0; i < k; ++i)
            for (std::size_t j = 0; j < k; ++j) {
                ref.grad[i * k + j] = row_x2[j];
                ref.grad[k * k + i * k + j] = col_x1[i];
            }
        return ref;
    }
};

// Bayesian linear regression, X is n_obs x p row-major (size argument p), y = X w0 + b0 + noise.
// f = sum_i log N(y_i | X_i w + b, sigma) + sum_j log N(w_j | 0, 1) + log N(b | 0, 1)
//     + log U(sigma | 0.1, 10), evaluated at a perturbed truth; grad: w (p), b, sigma.
struct regression {
    static constexpr const char* name = "regression";
    static constexpr std::array<std::int64_t, 5> sizes{10, 25, 50, 100, 150};
    static constexpr std::size_t n_obs = 1000;
    template <class T>
    struct input {
        std::size_t p = 0;
        std::vector<T> x, y, w;
        T b{}, sigma{};
    };
    template <class T>
    static input<T> make(std::size_t p) {
        rng r(106);
        std::vector<double> x(n_obs * p), w0(p), y(n_obs), w(p);
        for (auto& v : x) v = r.normal(0.0, 1.0);
        for (auto& v : w0) v = r.normal(0.0, 1.0);
        const double b0 = 0.5, sigma0 = 1.3;
        for (std::size_t i = 0; i < n_obs; ++i) {
            double mu = b0;
            for (std::size_t j = 0; j < p; ++j) mu += x[i * p + j] * w0[j];
            y[i] = mu + r.normal(0.0, sigma0);
        }
        for (std::size_t j = 0; j < p; ++j) w[j] = w0[j] + r.normal(0.0, 0.1);
        return {p, to<T>(x), to<T>(y), to<T>(w), static_cast<T>(b0 + 0.1), static_cast<T>(1.2)};
    }
    template <class T>
    static reference_result reference(const input<T>& in) {
        const std::size_t p = in.p;
        const double b = in.b, sigma = in.sigma;
        reference_result ref{0.0, std::vector<double>(p + 2, 0.0)};
        double sum_r = 0, sum_r2 = 0;
        for (std::size_t i = 0; i < n_obs; ++i) {
            double mu = b;
            for (std::size_t j = 0; j < p; ++j) mu += double(in.x[i * p + j]) * in.w[j];
            const double r = in.y[i] - mu;
            sum_r += r;
            sum_r2 += r * r;
            for (std::size_t j = 0; j < p; ++j) ref.grad[j] += r * in.x[i * p + j];
        }
        const double s2 = sigma * sigma;
        double sum_w2 = 0;
        for (std::size_t j = 0; j < p; ++j) {
            sum_w2 += double(in.w[j]) * in.w[j];
            ref.grad[j] = ref.grad[j] / s2 - in.w[j];
        }
        ref.value = -0.5 * sum_r2 / s2 - double(n_obs) * (std::log(sigma) + log_sqrt_2pi)
                    - 0.5 * sum_w2 - double(p) * log_sqrt_2pi
                    - 0.5 * b * b - log_sqrt_2pi
                    - std::log(10.0 - 0.1);
        ref.grad[p] = sum_r / s2 - b;
        ref.grad[p + 1] = -double(n_obs) / sigma + sum_r2 / (s2 * sigma);
        return ref;
    }
};

// Stan's stochastic volatility model (non-centred, user guide), size argument T:
//   h = h_std * sigma; h[1] /= sqrt(1 - phi^2); h += mu; h[t] += phi * (h[t-1] - mu) for t >= 2
//   phi ~ U(-1, 1); sigma ~ Cauchy(0, 5); mu ~ Cauchy(0, 10); h_std ~ N(0, 1); y ~ N(0, exp(h / 2))
// f is the full log density (normalising constants included) on the constrained parameters;
// grad: mu, phi, sigma, then h_std (T).
struct stochastic_volatility {
    static constexpr const char* name = "stochastic_volatility";
    static constexpr std::array<std::int64_t, 6> sizes{16, 64, 256, 1024, 4096, 8192};
    template <class T>
    struct input {
        std::vector<T> y, h_std;
        T mu{}, phi{}, sigma{};
    };
    template <class T>
    static input<T> make(std::size_t t_len) {
        rng r(107);
        const double mu = -1.02, phi = 0.95, sigma = 0.25;
        std::vector<double> h_std(t_len), y(t_len);
        for (auto& v : h_std) v = r.normal(0.0, 1.0);
        double h_prev = 0;
        for (std::size_t t = 0; t < t_len; ++t) {
            const double h = t == 0 ? mu + sigma * h_std[0] / std::sqrt(1 - phi * phi)
                                    : mu + sigma * h_std[t] + phi * (h_prev - mu);
            y[t] = std::exp(h / 2) * r.normal(0.0, 1.0);
            h_prev = h;
        }
        return {to<T>(y), to<T>(h_std), static_cast<T>(mu), static_cast<T>(phi),
                static_cast<T>(sigma)};
    }
    template <class T>
    static reference_result reference(const input<T>& in) {
        const std::size_t n = in.y.size();
        const double mu = in.mu, phi = in.phi, sigma = in.sigma;
        const double s0 = 1 / std::sqrt(1 - phi * phi);  // scale of the first state
        std::vector<double> h(n), adj(n);
        double lp = -std::log(2.0)                                                   // phi
                    - std::log(std::numbers::pi * 5) - std::log1p(sigma * sigma / 25)  // sigma
                    - std::log(std::numbers::pi * 10) - std::log1p(mu * mu / 100);     // mu
        for (std::size_t t = 0; t < n; ++t) {
            const double z = in.h_std[t], y = in.y[t];
            h[t] = t == 0 ? mu + sigma * z * s0 : mu + sigma * z + phi * (h[t - 1] - mu);
            const double y2e = y * y * std::exp(-h[t]);
            lp += -log_sqrt_2pi - 0.5 * z * z - log_sqrt_2pi - 0.5 * h[t] - 0.5 * y2e;
            adj[t] = -0.5 + 0.5 * y2e;  // direct d lp / d h_t
        }
        // Reverse sweep of the recurrence: adj_t = d lp / d h_t including later states.
        for (std::size_t t = n - 1; t-- > 0;) adj[t] += phi * adj[t + 1];
        reference_result ref{lp, std::vector<double>(n + 3)};
        double g_mu = adj[0], g_phi = adj[0] * sigma * in.h_std[0] * phi * s0 * s0 * s0;
        double g_sigma = adj[0] * in.h_std[0] * s0;
        for (std::size_t t = 1; t < n; ++t) {
            g_mu += adj[t] * (1 - phi);
            g_phi += adj[t] * (h[t - 1] - mu);
            g_sigma += adj[t] * in.h_std[t];
        }
        ref.grad[0] = g_mu - 2 * mu / (100 + mu * mu);
        ref.grad[1] = g_phi;
        ref.grad[2] = g_sigma - 2 * sigma / (25 + sigma * sigma);
        for (std::size_t t = 0; t < n; ++t)
            ref.grad[3 + t] = -double(in.h_std[t]) + sigma * adj[t] * (t == 0 ? s0 : 1.0);
        return ref;
    }
};

// f = sum_i exp(x_i) * y_i; grad: x (exp(x_i) y_i), then y (exp(x_i)).
struct expmul {
    static constexpr const char* name = "expmul";
    static constexpr auto sizes = vector_sizes;
    template <class T>
    struct input {
        std::vector<T> x, y;
    };
    template <class T>
    static input<T> make(std::size_t n) {
        rng r(108);
        std::vector<T> x(n), y(n);
        for (auto& v : x) v = static_cast<T>(r.uniform(-1.0, 1.0));
        for (auto& v : y) v = static_cast<T>(r.uniform(-1.0, 1.0));
        return {x, y};
    }
    template <class T>
    static reference_result reference(const input<T>& in) {
        const std::size_t n = in.x.size();
        reference_result ref{0.0, std::vector<double>(2 * n)};
        for (std::size_t i = 0; i < n; ++i) {
            const double e = std::exp(double(in.x[i]));
            ref.value += e * in.y[i];
            ref.grad[i] = e * in.y[i];
            ref.grad[n + i] = e;
        }
        return ref;
    }
};

// One dense layer, forward and backward: X is batch x d, W is d_out x d_in = d x d (row-major),
// b is d; size argument d. f = sum relu(X W^T + b)^2; grad: W (d*d), then b (d).
struct mlp_layer {
    static constexpr const char* name = "mlp_layer";
    static constexpr std::array<std::int64_t, 4> sizes{64, 128, 256, 512};
    static constexpr std::size_t batch = 256;
    template <class T>
    struct input {
        std::size_t d = 0;
        std::vector<T> x, w, b;
    };
    template <class T>
    static input<T> make(std::size_t d) {
        rng r(109);
        input<T> in{d, std::vector<T>(batch * d), std::vector<T>(d * d), std::vector<T>(d)};
        for (auto& v : in.x) v = static_cast<T>(r.normal(0.0, 1.0));
        const double w_sd = 1 / std::sqrt(double(d));  // keeps pre-activations O(1)
        for (auto& v : in.w) v = static_cast<T>(r.normal(0.0, w_sd));
        for (auto& v : in.b) v = static_cast<T>(r.normal(0.0, 0.1));
        return in;
    }
    template <class T>
    static reference_result reference(const input<T>& in) {
        const std::size_t d = in.d;
        reference_result ref{0.0, std::vector<double>(d * d + d, 0.0)};
        std::vector<double> dz(d);
        for (std::size_t i = 0; i < batch; ++i) {
            for (std::size_t o = 0; o < d; ++o) {
                double z = in.b[o];
                for (std::size_t k = 0; k < d; ++k) z += double(in.x[i * d + k]) * in.w[o * d + k];
                const double a = std::max(z, 0.0);
                ref.value += a * a;
                dz[o] = 2 * a;
            }
            for (std::size_t o = 0; o < d; ++o) {
                for (std::size_t k = 0; k < d; ++k) ref.grad[o * d + k] += dz[o] * in.x[i * d + k];
                ref.grad[d * d + o] += dz[o];
            }
        }
        return ref;
    }
};

template <class W, class T>
struct fixture_data {
    typename W::template input<T> in;
    reference_result ref;
};

// Inputs and reference for (W, T, n), built once per process.
template <class W, class T>
const fixture_data<W, T>& fixture(std::size_t n) {
    static std::map<std::size_t, fixture_data<W, T>> cache;
    auto it = cache.find(n);
    if (it == cache.end()) {
        auto in = W::template make<T>(n);
        auto ref = W::reference(in);
        it = cache.emplace(n, fixture_data<W, T>{std::move(in), std::move(ref)}).first;
    }
    return it->second;
}

}  // namespace tgb
