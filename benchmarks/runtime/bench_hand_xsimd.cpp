// hand_xsimd: the physical limit. Hand-written fused xsimd loops computing value AND gradient,
// the same math as hand_scalar. The GEMMs are register-blocked but unpacked (reasonable, not peak).
#include "check.hpp"
#include "workloads.hpp"

#include <xsimd/xsimd.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <type_traits>
#include <vector>

namespace {

using std::size_t;
template <class T>
using batch = xsimd::batch<T>;

template <class T, class Op>
T horizontal(batch<T> v, Op op) {
    alignas(64) std::array<T, batch<T>::size> lanes;
    v.store_aligned(lanes.data());
    T r = lanes[0];
    for (size_t l = 1; l < lanes.size(); ++l) r = op(r, lanes[l]);
    return r;
}

// Reduces fb(i) (one full batch at i) and fs(i) (one tail element) with op. Four independent
// accumulators hide the latency of op so the loop runs at throughput.
template <class T, class Op, class FB, class FS>
T reduce(size_t n, T init, Op op, FB&& fb, FS&& fs) {
    constexpr size_t w = batch<T>::size;
    batch<T> a0(init), a1(init), a2(init), a3(init);
    size_t i = 0;
    for (; i + 4 * w <= n; i += 4 * w) {
        a0 = op(a0, fb(i));
        a1 = op(a1, fb(i + w));
        a2 = op(a2, fb(i + 2 * w));
        a3 = op(a3, fb(i + 3 * w));
    }
    for (; i + w <= n; i += w) a0 = op(a0, fb(i));
    T r = horizontal(op(op(a0, a1), op(a2, a3)), op);
    for (; i < n; ++i) r = op(r, fs(i));
    return r;
}

constexpr auto plus = [](auto a, auto b) { return a + b; };
constexpr auto times = [](auto a, auto b) { return a * b; };
constexpr auto maximum = [](auto a, auto b) {
    if constexpr (std::is_arithmetic_v<decltype(a)>)
        return std::max(a, b);
    else
        return xsimd::max(a, b);
};

template <class T>
T sum_fn(const std::vector<T>& x, std::vector<T>& gx) {
    using B = batch<T>;
    const T* px = x.data();
    T* pg = gx.data();
    return reduce<T>(
        x.size(), T(0), plus,
        [&](size_t i) {
            B(T(1)).store_unaligned(pg + i);
            return B::load_unaligned(px + i);
        },
        [&](size_t i) {
            pg[i] = T(1);
            return px[i];
        });
}

template <class T>
T prod_fn(const std::vector<T>& x, std::vector<T>& gx) {
    using B = batch<T>;
    constexpr size_t w = B::size;
    const size_t n = x.size();
    const T* px = x.data();
    T* pg = gx.data();
    const T p = reduce<T>(
        n, T(1), times, [&](size_t i) { return B::load_unaligned(px + i); },
        [&](size_t i) { return px[i]; });
    const B pb(p);
    size_t i = 0;
    for (; i + w <= n; i += w) (pb / B::load_unaligned(px + i)).store_unaligned(pg + i);
    for (; i < n; ++i) pg[i] = p / px[i];
    return p;
}

template <class T>
T log_sum_exp_fn(const std::vector<T>& x, std::vector<T>& gx) {
    using B = batch<T>;
    constexpr size_t w = B::size;
    const size_t n = x.size();
    const T* px = x.data();
    T* pg = gx.data();
    const T m = reduce<T>(
        n, px[0], maximum, [&](size_t i) { return B::load_unaligned(px + i); },
        [&](size_t i) { return px[i]; });
    const B mb(m);
    const T s = reduce<T>(
        n, T(0), plus,
        [&](size_t i) {
            const B e = xsimd::exp(B::load_unaligned(px + i) - mb);
            e.store_unaligned(pg + i);
            return e;
        },
        [&](size_t i) { return pg[i] = std::exp(px[i] - m); });
    const T inv_s = T(1) / s;
    const B inv_sb(inv_s);
    size_t i = 0;
    for (; i + w <= n; i += w) (B::load_unaligned(pg + i) * inv_sb).store_unaligned(pg + i);
    for (; i < n; ++i) pg[i] *= inv_s;
    return m + std::log(s);
}

template <class T>
T normal_log_pdf_fn(const std::vector<T>& x, std::vector<T>& gx) {
    using B = batch<T>;
    constexpr T mu = T(tgb::normal_log_pdf::mu);
    constexpr T inv_sigma = T(1 / tgb::normal_log_pdf::sigma);
    const T* px = x.data();
    T* pg = gx.data();
    const B mub(mu), isb(inv_sigma), nisb(-inv_sigma);
    const T acc = reduce<T>(
        x.size(), T(0), plus,
        [&](size_t i) {
            const B z = (B::load_unaligned(px + i) - mub) * isb;
            (z * nisb).store_unaligned(pg + i);
            return z * z;
        },
        [&](size_t i) {
            const T z = (px[i] - mu) * inv_sigma;
            pg[i] = -z * inv_sigma;
            return z * z;
        });
    const T log_norm = T(std::log(tgb::normal_log_pdf::sigma) + tgb::log_sqrt_2pi);
    return T(-0.5) * acc - T(x.size()) * log_norm;
}

template <class T>
T expmul_fn(const std::vector<T>& x, const std::vector<T>& y, std::vector<T>& gx,
            std::vector<T>& gy) {
    using B = batch<T>;
    const T* px = x.data();
    const T* py = y.data();
    T* pgx = gx.data();
    T* pgy = gy.data();
    return reduce<T>(
        x.size(), T(0), plus,
        [&](size_t i) {
            const B e = xsimd::exp(B::load_unaligned(px + i));
            const B ey = e * B::load_unaligned(py + i);
            ey.store_unaligned(pgx + i);
            e.store_unaligned(pgy + i);
            return ey;
        },
        [&](size_t i) {
            const T e = std::exp(px[i]);
            pgx[i] = e * py[i];
            pgy[i] = e;
            return e * py[i];
        });
}

// ---- GEMM: C (m x n) = A (m x k) * B (k x n), all row-major and dense. ----

// An r x nb-batch block of C stays in registers while p runs: each B load feeds r FMAs and each
// broadcast of A feeds nb. The caller guarantees r rows and nb full batches are in range.
template <size_t R, size_t NB, class T>
void gemm_block(size_t n, size_t k, const T* a, const T* b, T* c) {
    using B = batch<T>;
    constexpr size_t w = B::size;
    std::array<B, R * NB> acc;
    acc.fill(B(T(0)));
    for (size_t p = 0; p < k; ++p) {
        std::array<B, NB> bv;
        for (size_t q = 0; q < NB; ++q) bv[q] = B::load_unaligned(b + p * n + q * w);
        for (size_t r = 0; r < R; ++r) {
            const B av(a[r * k + p]);
            for (size_t q = 0; q < NB; ++q) acc[r * NB + q] = xsimd::fma(av, bv[q], acc[r * NB + q]);
        }
    }
    for (size_t r = 0; r < R; ++r)
        for (size_t q = 0; q < NB; ++q) acc[r * NB + q].store_unaligned(c + r * n + q * w);
}

template <size_t NB, class T>
void gemm_column_panel(size_t m, size_t n, size_t k, const T* a, const T* b, T* c) {
    size_t i = 0;
    for (; i + 4 <= m; i += 4) gemm_block<4, NB>(n, k, a + i * k, b, c + i * n);
    for (; i < m; ++i) gemm_block<1, NB>(n, k, a + i * k, b, c + i * n);
}

template <class T>
void gemm_nn(size_t m, size_t n, size_t k, const T* a, const T* b, T* c) {
    constexpr size_t w = batch<T>::size;
    size_t j = 0;
    for (; j + 2 * w <= n; j += 2 * w) gemm_column_panel<2>(m, n, k, a, b + j, c + j);
    for (; j + w <= n; j += w) gemm_column_panel<1>(m, n, k, a, b + j, c + j);
    for (; j < n; ++j)  // fewer than one batch of columns left
        for (size_t i = 0; i < m; ++i) {
            T acc = 0;
            for (size_t p = 0; p < k; ++p) acc += a[i * k + p] * b[p * n + j];
            c[i * n + j] = acc;
        }
}

template <class T>
void transpose(size_t rows, size_t cols, const T* src, T* dst) {
    for (size_t i = 0; i < rows; ++i)
        for (size_t j = 0; j < cols; ++j) dst[j * rows + i] = src[i * cols + j];
}

template <class T>
T sum_of(const std::vector<T>& v) {
    const T* pv = v.data();
    return reduce<T>(
        v.size(), T(0), plus, [&](size_t i) { return batch<T>::load_unaligned(pv + i); },
        [&](size_t i) { return pv[i]; });
}

// Same reverse-mode work as hand_scalar: C = X1 X2, f = sum(C), seed G = ones,
// dX1 = G X2^T, dX2 = X1^T G (transposes go to scratch so one GEMM kernel serves all three).
template <class T>
struct matrix_product_work {
    size_t k;
    std::vector<T> c, g, t, gx1, gx2;
    explicit matrix_product_work(size_t k_)
        : k(k_), c(k * k), g(k * k, T(1)), t(k * k), gx1(k * k), gx2(k * k) {}

    T operator()(const std::vector<T>& x1, const std::vector<T>& x2) {
        gemm_nn(k, k, k, x1.data(), x2.data(), c.data());
        const T f = sum_of(c);
        transpose(k, k, x2.data(), t.data());
        gemm_nn(k, k, k, g.data(), t.data(), gx1.data());
        transpose(k, k, x1.data(), t.data());
        gemm_nn(k, k, k, t.data(), g.data(), gx2.data());
        return f;
    }
};

// One pass over the rows of X (row-major, so short rows like p = 10 run mostly in the scalar
// tail): mu_i = X_i w + b, then X^T r accumulates into gw while the row is in L1.
template <class T>
T regression_fn(const tgb::regression::input<T>& in, std::vector<T>& gw, T& gb, T& gsigma) {
    using B = batch<T>;
    constexpr size_t w = B::size;
    const size_t p = in.p, n = tgb::regression::n_obs, pv = p - p % w;
    const T* pw = in.w.data();
    T* pg = gw.data();
    std::fill(gw.begin(), gw.end(), T(0));
    T sum_r = 0, sum_r2 = 0;
    for (size_t i = 0; i < n; ++i) {
        const T* xi = &in.x[i * p];
        B acc(T(0));
        for (size_t j = 0; j < pv; j += w)
            acc = xsimd::fma(B::load_unaligned(xi + j), B::load_unaligned(pw + j), acc);
        T mu = in.b + xsimd::hadd(acc);
        for (size_t j = pv; j < p; ++j) mu += xi[j] * pw[j];
        const T r = in.y[i] - mu;
        sum_r += r;
        sum_r2 += r * r;
        const B rb(r);
        for (size_t j = 0; j < pv; j += w)
            xsimd::fma(rb, B::load_unaligned(xi + j), B::load_unaligned(pg + j)).store_unaligned(pg + j);
        for (size_t j = pv; j < p; ++j) pg[j] += r * xi[j];
    }
    const T inv_s2 = T(1) / (in.sigma * in.sigma);
    T sum_w2 = 0;
    for (size_t j = 0; j < p; ++j) {
        sum_w2 += pw[j] * pw[j];
        pg[j] = pg[j] * inv_s2 - pw[j];
    }
    gb = sum_r * inv_s2 - in.b;
    gsigma = -T(n) / in.sigma + sum_r2 * inv_s2 / in.sigma;
    const T c = T(tgb::log_sqrt_2pi);
    return T(-0.5) * sum_r2 * inv_s2 - T(n) * (std::log(in.sigma) + c) - T(0.5) * sum_w2
           - T(p) * c - T(0.5) * in.b * in.b - c - T(std::log(10.0 - 0.1));
}

// The two recurrences (h forward, adjoint backward) are inherently sequential and stay scalar;
// everything elementwise around them (exp, log-density terms, gradient reductions) is xsimd.
// grad = [mu, phi, sigma, h_std...].
template <class T>
T stochastic_volatility_fn(const tgb::stochastic_volatility::input<T>& in, std::vector<T>& h,
                           std::vector<T>& grad) {
    using B = batch<T>;
    constexpr size_t w = B::size;
    const size_t n = in.y.size();
    const T mu = in.mu, phi = in.phi, sigma = in.sigma;
    const T s0 = T(1) / std::sqrt(T(1) - phi * phi);
    const T* z = in.h_std.data();
    const T* y = in.y.data();
    T* ph = h.data();
    T* adj = &grad[3];  // direct adjoints, then full adjoints, then the h_std gradient

    ph[0] = mu + sigma * z[0] * s0;
    for (size_t t = 1; t < n; ++t) ph[t] = mu + sigma * z[t] + phi * (ph[t - 1] - mu);

    const B half(T(0.5));
    const T lp = reduce<T>(
        n, T(0), plus,
        [&](size_t t) {
            const B ht = B::load_unaligned(ph + t), yt = B::load_unaligned(y + t),
                    zt = B::load_unaligned(z + t);
            const B y2e = yt * yt * xsimd::exp(-ht);
            xsimd::fms(half, y2e, half).store_unaligned(adj + t);
            return xsimd::fma(zt, zt, ht + y2e);
        },
        [&](size_t t) {
            const T y2e = y[t] * y[t] * std::exp(-ph[t]);
            adj[t] = T(0.5) * y2e - T(0.5);
            return z[t] * z[t] + ph[t] + y2e;
        });

    for (size_t t = n - 1; t-- > 0;) adj[t] += phi * adj[t + 1];

    // Parameter gradients over t >= 1, then the first state with its own scale s0.
    const B mub(mu), sigmab(sigma);
    B g_mu(T(0)), g_phi(T(0)), g_sigma(T(0));
    size_t t = 1;
    for (; t + w <= n; t += w) {
        const B a = B::load_unaligned(adj + t), zt = B::load_unaligned(z + t);
        g_mu += a;
        g_phi = xsimd::fma(a, B::load_unaligned(ph + t - 1) - mub, g_phi);
        g_sigma = xsimd::fma(a, zt, g_sigma);
        xsimd::fms(sigmab, a, zt).store_unaligned(adj + t);
    }
    T gm = xsimd::hadd(g_mu), gp = xsimd::hadd(g_phi), gs = xsimd::hadd(g_sigma);
    for (; t < n; ++t) {
        gm += adj[t];
        gp += adj[t] * (ph[t - 1] - mu);
        gs += adj[t] * z[t];
        adj[t] = sigma * adj[t] - z[t];
    }
    const T a0 = adj[0];
    grad[0] = gm * (T(1) - phi) + a0 - T(2) * mu / (T(100) + mu * mu);
    grad[1] = gp + a0 * sigma * z[0] * phi * s0 * s0 * s0;
    grad[2] = gs + a0 * z[0] * s0 - T(2) * sigma / (T(25) + sigma * sigma);
    adj[0] = sigma * a0 * s0 - z[0];
    const T prior = T(-std::log(2.0) - std::log(std::numbers::pi * 5) - std::log(std::numbers::pi * 10))
                    - std::log1p(sigma * sigma / T(25)) - std::log1p(mu * mu / T(100));
    return T(-0.5) * lp - T(2 * n) * T(tgb::log_sqrt_2pi) + prior;
}

// Z = X W^T + b, A = relu(Z), f = sum A^2; dZ = 2A, dW = dZ^T X, db = column sums of dZ.
// W and dZ are transposed into scratch so that both products use gemm_nn.
template <class T>
struct mlp_layer_work {
    static constexpr size_t batch_rows = tgb::mlp_layer::batch;
    size_t d;
    std::vector<T> wt, z, zt, gw, gb;
    explicit mlp_layer_work(size_t d_)
        : d(d_), wt(d * d), z(batch_rows * d), zt(batch_rows * d), gw(d * d), gb(d) {}

    T operator()(const tgb::mlp_layer::input<T>& in) {
        using B = batch<T>;
        constexpr size_t w = B::size;
        transpose(d, d, in.w.data(), wt.data());
        gemm_nn(batch_rows, d, d, in.x.data(), wt.data(), z.data());
        std::fill(gb.begin(), gb.end(), T(0));
        const size_t dv = d - d % w;
        const B zero(T(0)), two(T(2));
        B acc(T(0));
        T f = 0;
        for (size_t i = 0; i < batch_rows; ++i) {
            T* zi = &z[i * d];
            for (size_t o = 0; o < dv; o += w) {
                const B a = xsimd::max(B::load_unaligned(zi + o) + B::load_unaligned(&in.b[o]), zero);
                acc = xsimd::fma(a, a, acc);
                const B g = two * a;
                g.store_unaligned(zi + o);
                (B::load_unaligned(&gb[o]) + g).store_unaligned(&gb[o]);
            }
            for (size_t o = dv; o < d; ++o) {
                const T a = std::max(zi[o] + in.b[o], T(0));
                f += a * a;
                zi[o] = T(2) * a;
                gb[o] += T(2) * a;
            }
        }
        transpose(batch_rows, d, z.data(), zt.data());
        gemm_nn(d, d, batch_rows, zt.data(), in.x.data(), gw.data());
        return f + xsimd::hadd(acc);
    }
};

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
    tgb::register_bench(tgb::W::name, "hand_xsimd", bm_##W<float>, bm_##W<double>, tgb::W::sizes)

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
