// typegrad: every workload written as a typegrad graph, compiled once per element type with
// tg::compile and evaluated with value_and_grad (forward + backward in one call), plus
// copy/memcpy, the copy bandwidth that the memory-bound cases are compared with.
//
// All runs are single-threaded (detail::set_num_threads(1) in every benchmark: bench_gemm.cpp's
// _mt variants reset the pool to "all threads" when they finish), so CPU time compares with the
// baselines'.
#include "check.hpp"
#include "workloads.hpp"

#include <typegrad/typegrad.hpp>

#include <cmath>
#include <cstring>
#include <span>
#include <vector>

namespace {

namespace tg = typegrad;
using std::size_t;

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
    tg::detail::set_num_threads(1);  // per benchmark: see the top of the file
    return tgb::fixture<W, T>(static_cast<size_t>(state.range(0)));
}

template <class T>
std::span<const T> one(const T& v) {
    return {&v, 1};
}
template <class T>
std::span<T> one(T& v) {
    return {&v, 1};
}

// Every check uses check.hpp's default tolerance, the same as the baselines'.

template <class T>
void bm_sum(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::sum, T>(state);
    constexpr auto x = tg::param<"x", T, tg::shape<tg::dyn>>;
    const auto step = tg::compile(tg::sum(x), tg::wrt(x));
    std::vector<T> gx(fx.in.x.size());
    auto f = [&] { return step.value_and_grad(tg::bind(x, fx.in.x), tg::grad_into(x, gx)); };
    if (!tgb::check_result<T>(state, fx.ref, f(), {gx})) return;
    time_loop(state, f);
}

// tg::prod, a product reduction: its backward reads x again for torch.prod's gradient at zeros
// only where the product is 0 or NaN (none here), then divides the product by x.
template <class T>
void bm_prod(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::prod, T>(state);
    constexpr auto x = tg::param<"x", T, tg::shape<tg::dyn>>;
    const auto step = tg::compile(tg::prod(x), tg::wrt(x));
    std::vector<T> gx(fx.in.x.size());
    auto f = [&] { return step.value_and_grad(tg::bind(x, fx.in.x), tg::grad_into(x, gx)); };
    if (!tgb::check_result<T>(state, fx.ref, f(), {gx})) return;
    time_loop(state, f);
}

template <class T>
void bm_log_sum_exp(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::log_sum_exp, T>(state);
    constexpr auto x = tg::param<"x", T, tg::shape<tg::dyn>>;
    const auto step = tg::compile(tg::log_sum_exp(x), tg::wrt(x));
    std::vector<T> gx(fx.in.x.size());
    auto f = [&] { return step.value_and_grad(tg::bind(x, fx.in.x), tg::grad_into(x, gx)); };
    if (!tgb::check_result<T>(state, fx.ref, f(), {gx})) return;
    time_loop(state, f);
}

template <class T>
void bm_normal_log_pdf(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::normal_log_pdf, T>(state);
    constexpr auto x = tg::param<"x", T, tg::shape<tg::dyn>>;
    // log(sigma) + log(sqrt(2 pi)) for sigma = 1.37 (std::log is not constexpr on clang).
    constexpr double log_norm = 1.2337492730447064;
    const auto z = (x - tg::lit<tgb::normal_log_pdf::mu>) * tg::lit<1.0 / tgb::normal_log_pdf::sigma>;
    const auto step = tg::compile(tg::sum(tg::lit<-0.5> * tg::square(z) - tg::lit<log_norm>), tg::wrt(x));
    std::vector<T> gx(fx.in.x.size());
    auto f = [&] { return step.value_and_grad(tg::bind(x, fx.in.x), tg::grad_into(x, gx)); };
    if (!tgb::check_result<T>(state, fx.ref, f(), {gx})) return;
    time_loop(state, f);
}

template <class T>
void bm_expmul(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::expmul, T>(state);
    constexpr auto x = tg::param<"x", T, tg::shape<tg::dyn>>;
    constexpr auto y = tg::param<"y", T, tg::shape<tg::dyn>>;
    const auto step = tg::compile(tg::sum(tg::exp(x) * y), tg::wrt(x, y));
    std::vector<T> gx(fx.in.x.size()), gy(fx.in.x.size());
    auto f = [&] {
        return step.value_and_grad(tg::bind(x, fx.in.x), tg::bind(y, fx.in.y), tg::grad_into(x, gx),
                                   tg::grad_into(y, gy));
    };
    if (!tgb::check_result<T>(state, fx.ref, f(), {gx, gy})) return;
    time_loop(state, f);
}

// Forward GEMM, then dX1 = G X2^T and dX2 = X1^T G (G = ones): the same work as the baselines.
template <class T>
void bm_matrix_product(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::matrix_product, T>(state);
    constexpr auto x1 = tg::param<"x1", T, tg::shape<tg::dyn, tg::dyn>>;
    constexpr auto x2 = tg::param<"x2", T, tg::shape<tg::dyn, tg::dyn>>;
    const auto step = tg::compile(tg::sum(tg::matmul(x1, x2)), tg::wrt(x1, x2));
    const size_t k = fx.in.k;
    std::vector<T> g1(k * k), g2(k * k);
    auto f = [&] {
        return step.value_and_grad(tg::bind(x1, fx.in.x1, {k, k}), tg::bind(x2, fx.in.x2, {k, k}),
                                   tg::grad_into(x1, g1), tg::grad_into(x2, g2));
    };
    if (!tgb::check_result<T>(state, fx.ref, f(), {g1, g2})) return;
    time_loop(state, f);
}

// X w is matmul(X, w) (what a user writes; typegrad runs it, and X^T r in the backward, on its
// GEMM with n = 1), or with RowSum the same product as a fused broadcast multiply and row sum,
// sum(X * w, axes<1>): registered as typegrad_rowsum to show what the GEMM path costs here.
template <class T, bool RowSum>
void bm_regression(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::regression, T>(state);
    constexpr size_t n = tgb::regression::n_obs;
    constexpr double c = tgb::log_sqrt_2pi;
    constexpr auto X = tg::input<"X", T, tg::shape<n, tg::dyn>>;
    constexpr auto y = tg::input<"y", T, tg::shape<n>>;
    constexpr auto w = tg::param<"w", T, tg::shape<tg::dyn>>;
    constexpr auto b = tg::param<"b", T>;
    constexpr auto sigma = tg::param<"sigma", T>;
    // The priors' normalising constants depend on p, a run-time size: bound as a scalar input.
    constexpr auto consts = tg::input<"consts", T>;
    const auto xw = [&] {
        if constexpr (RowSum) return tg::sum(X * w, tg::axes<1>);
        else return tg::matmul(X, w);
    }();
    const auto r = y - (xw + b);
    const auto lp = tg::lit<-0.5> * tg::sum(tg::square(r)) / tg::square(sigma)
                    - tg::lit<double(n)> * (tg::log(sigma) + tg::lit<c>)
                    - tg::lit<0.5> * tg::sum(tg::square(w)) - tg::lit<0.5> * tg::square(b) + consts;
    const auto step = tg::compile(lp, tg::wrt(w, b, sigma));
    const size_t p = fx.in.p;
    const T k = T(-double(p + 1) * c - std::log(10.0 - 0.1));
    std::vector<T> gw(p);
    T gb{}, gs{};
    auto f = [&] {
        return step.value_and_grad(tg::bind(X, fx.in.x), tg::bind(y, fx.in.y), tg::bind(w, fx.in.w),
                                   tg::bind(b, one(fx.in.b)), tg::bind(sigma, one(fx.in.sigma)),
                                   tg::bind(consts, one(k)), tg::grad_into(w, gw), tg::grad_into(b, one(gb)),
                                   tg::grad_into(sigma, one(gs)));
    };
    if (!tgb::check_result<T>(state, fx.ref, f(), {std::span<const T>(gw), one(gb), one(gs)})) return;
    time_loop(state, f);
}

// Stochastic volatility without a scan op. The recurrence is linear:
//   c_t = h_t - mu,  c_0 = sigma s0 z_0,  c_t = sigma z_t + phi c_{t-1},
// so c = sigma * Toeplitz(phi^(t-s), t >= s) * (z with z_0 scaled by s0). Writing that as one
// T x T matrix would cost O(T^2); instead the series is cut into nb blocks of B (T = nb * B):
//   local[j, i] = sum_{k <= i} phi^(i-k) u[j, k]          (u @ U, U is B x B upper triangular)
//   end[j]      = sum_k phi^(B-1-k) u[j, k]                (the last element of block j)
//   carry[j]    = sum_{m < j} phi^(B (j-1-m)) end[m]       (c at the end of block j-1)
//   c[j, i]     = local[j, i] + phi^(i+1) carry[j]
// O(T (B + 1) + nb^2) work with B ~ nb ~ sqrt(T): one GEMM by a B x B matrix and two GEMVs in the
// forward pass, all typegrad ops, so the gradient w.r.t. mu, phi, sigma and z is typegrad's own reverse mode. The exponent
// and mask matrices are data (inputs); the phi powers are pow(phi, exponents), differentiable
// in phi. pow of a negative base is NaN, so this needs phi > 0 (the model allows phi in (-1, 1);
// this workload has phi = 0.95). Masked entries get exponent 0, so no pow overflows.
template <class T>
struct sv_layout {
    size_t nb = 0, b = 0;
    std::vector<T> d_local, m_local, d_end, d_carry, m_carry, d_pos, e0;
    explicit sv_layout(size_t t_len) {
        b = 1;
        while (b * b < t_len) b *= 2;  // B = 2^ceil(log2(T) / 2); the workload's T are powers of 2
        nb = t_len / b;
        d_local.assign(b * b, T(0));
        m_local.assign(b * b, T(0));
        for (size_t i = 0; i < b; ++i)  // stored transposed: [k, i] = phi^(i-k) for k <= i
            for (size_t k = 0; k <= i; ++k) {
                d_local[k * b + i] = T(i - k);
                m_local[k * b + i] = T(1);
            }
        d_end.resize(b);
        for (size_t k = 0; k < b; ++k) d_end[k] = T(b - 1 - k);
        d_carry.assign(nb * nb, T(0));
        m_carry.assign(nb * nb, T(0));
        for (size_t j = 0; j < nb; ++j)
            for (size_t m = 0; m < j; ++m) {
                d_carry[j * nb + m] = T(b * (j - 1 - m));
                m_carry[j * nb + m] = T(1);
            }
        d_pos.resize(b);
        for (size_t i = 0; i < b; ++i) d_pos[i] = T(i + 1);
        e0.assign(nb * b, T(0));
        e0[0] = T(1);
    }
};

// Stochastic volatility's priors' constants: -log 2 (phi ~ U(-1, 1)) - log(5 pi) (sigma's Cauchy)
// - log(10 pi) (mu's Cauchy).
constexpr double sv_prior_const = -6.894629957686892;

// The recurrence as one op: h - mu = linear_recurrence(phi, u), u_t = sigma z_t (u_0 scaled by
// 1 / sqrt(1 - phi^2)); its backward is the reverse recurrence, as in the hand-written loop.
template <class T>
void bm_stochastic_volatility(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::stochastic_volatility, T>(state);
    using vec = tg::shape<tg::dyn>;
    constexpr auto mu = tg::param<"mu", T>;
    constexpr auto phi = tg::param<"phi", T>;
    constexpr auto sigma = tg::param<"sigma", T>;
    constexpr auto z = tg::param<"h_std", T, vec>;
    constexpr auto y = tg::input<"y", T, vec>;
    constexpr auto e0 = tg::input<"e0", T, vec>;  // 1 at t = 0, else 0
    constexpr auto one_ = tg::lit<1>;
    constexpr double c = tgb::log_sqrt_2pi;

    const auto s0 = one_ / tg::sqrt(one_ - tg::square(phi));
    const auto u = sigma * z * (one_ + e0 * (s0 - one_));
    const auto h = tg::linear_recurrence<0>(phi, u) + mu;
    const auto lp = tg::sum(tg::lit<-0.5> * (tg::square(z) + h + tg::square(y) * tg::exp(-h)) - tg::lit<2 * c>)
                    - tg::log(one_ + tg::square(sigma) * tg::lit<1.0 / 25>)
                    - tg::log(one_ + tg::square(mu) * tg::lit<1.0 / 100>) + tg::lit<sv_prior_const>;
    const auto step = tg::compile(lp, tg::wrt(mu, phi, sigma, z));

    const size_t t_len = fx.in.y.size();
    std::vector<T> e0v(t_len, T(0)), grad(t_len + 3);
    e0v[0] = T(1);
    auto f = [&] {
        return step.value_and_grad(tg::bind(mu, one(fx.in.mu)), tg::bind(phi, one(fx.in.phi)),
                                   tg::bind(sigma, one(fx.in.sigma)), tg::bind(z, fx.in.h_std), tg::bind(y, fx.in.y),
                                   tg::bind(e0, e0v), tg::grad_into(mu, one(grad[0])), tg::grad_into(phi, one(grad[1])),
                                   tg::grad_into(sigma, one(grad[2])), tg::grad_into(z, std::span<T>(grad).subspan(3)));
    };
    if (!tgb::check_result<T>(state, fx.ref, f(), {std::span<const T>(grad)})) return;
    time_loop(state, f);
}

// Before linear_recurrence: the recurrence as blocked matrix products (O(T sqrt T) work).
template <class T>
void bm_stochastic_volatility_blocked(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::stochastic_volatility, T>(state);
    using mat = tg::shape<tg::dyn, tg::dyn>;
    using vec = tg::shape<tg::dyn>;
    constexpr auto mu = tg::param<"mu", T>;
    constexpr auto phi = tg::param<"phi", T>;
    constexpr auto sigma = tg::param<"sigma", T>;
    constexpr auto z = tg::param<"h_std", T, mat>;  // T as nb x B, row-major = time order
    constexpr auto y = tg::input<"y", T, mat>;
    constexpr auto d_local = tg::input<"d_local", T, mat>;
    constexpr auto m_local = tg::input<"m_local", T, mat>;
    constexpr auto d_end = tg::input<"d_end", T, vec>;
    constexpr auto d_carry = tg::input<"d_carry", T, mat>;
    constexpr auto m_carry = tg::input<"m_carry", T, mat>;
    constexpr auto d_pos = tg::input<"d_pos", T, vec>;
    constexpr auto e0 = tg::input<"e0", T, mat>;
    constexpr auto one_ = tg::lit<1>;
    constexpr double c = tgb::log_sqrt_2pi;

    const auto s0 = one_ / tg::sqrt(one_ - tg::square(phi));
    const auto u = sigma * z * (one_ + e0 * (s0 - one_));
    const auto local = tg::matmul(u, tg::pow(phi, d_local) * m_local);  // d_local, m_local hold L^T
    const auto end = tg::matmul(u, tg::pow(phi, d_end));
    const auto carry = tg::matmul(tg::pow(phi, d_carry) * m_carry, end);
    const auto h = local + tg::unsqueeze<1>(carry) * tg::pow(phi, d_pos) + mu;
    // Per time step: log N(z | 0, 1) + log N(y | 0, exp(h / 2)).
    const auto lp = tg::sum(tg::lit<-0.5> * (tg::square(z) + h + tg::square(y) * tg::exp(-h)) - tg::lit<2 * c>)
                    - tg::log(one_ + tg::square(sigma) * tg::lit<1.0 / 25>)
                    - tg::log(one_ + tg::square(mu) * tg::lit<1.0 / 100>) + tg::lit<sv_prior_const>;
    const auto step = tg::compile(lp, tg::wrt(mu, phi, sigma, z));

    const size_t t_len = fx.in.y.size();
    const sv_layout<T> lay(t_len);
    const size_t nb = lay.nb, b = lay.b;
    std::vector<T> grad(t_len + 3);
    auto f = [&] {
        return step.value_and_grad(
            tg::bind(mu, one(fx.in.mu)), tg::bind(phi, one(fx.in.phi)), tg::bind(sigma, one(fx.in.sigma)),
            tg::bind(z, fx.in.h_std, {nb, b}), tg::bind(y, fx.in.y, {nb, b}), tg::bind(d_local, lay.d_local, {b, b}),
            tg::bind(m_local, lay.m_local, {b, b}), tg::bind(d_end, lay.d_end),
            tg::bind(d_carry, lay.d_carry, {nb, nb}), tg::bind(m_carry, lay.m_carry, {nb, nb}),
            tg::bind(d_pos, lay.d_pos), tg::bind(e0, lay.e0, {nb, b}), tg::grad_into(mu, one(grad[0])),
            tg::grad_into(phi, one(grad[1])), tg::grad_into(sigma, one(grad[2])),
            tg::grad_into(z, std::span<T>(grad).subspan(3)));
    };
    if (!tgb::check_result<T>(state, fx.ref, f(), {std::span<const T>(grad)})) return;
    time_loop(state, f);
}

template <class T>
void bm_mlp_layer(benchmark::State& state) {
    const auto& fx = fixture_of<tgb::mlp_layer, T>(state);
    constexpr size_t rows = tgb::mlp_layer::batch;
    constexpr auto X = tg::input<"X", T, tg::shape<rows, tg::dyn>>;
    constexpr auto W = tg::param<"W", T, tg::shape<tg::dyn, tg::dyn>>;
    constexpr auto bias = tg::param<"b", T, tg::shape<tg::dyn>>;
    const auto step = tg::compile(tg::sum(tg::square(tg::relu(tg::linear(X, W, bias)))), tg::wrt(W, bias));
    const size_t d = fx.in.d;
    std::vector<T> gw(d * d), gb(d);
    auto f = [&] {
        return step.value_and_grad(tg::bind(X, fx.in.x), tg::bind(W, fx.in.w, {d, d}), tg::bind(bias, fx.in.b),
                                   tg::grad_into(W, gw), tg::grad_into(bias, gb));
    };
    if (!tgb::check_result<T>(state, fx.ref, f(), {gw, gb})) return;
    time_loop(state, f);
}

// The copy bandwidth of this machine at each size: memcpy of N elements, 2 N sizeof(T) bytes
// moved (read + write). bytes_per_second in the JSON is that traffic.
template <class T>
void bm_copy(benchmark::State& state) {
    const size_t n = static_cast<size_t>(state.range(0));
    std::vector<T> src(n, T(1)), dst(n);
    for (auto _ : state) {
        std::memcpy(dst.data(), src.data(), n * sizeof(T));
        benchmark::DoNotOptimize(dst.data());
        benchmark::ClobberMemory();
    }
    state.SetBytesProcessed(std::int64_t(state.iterations()) * std::int64_t(2 * n * sizeof(T)));
}

#define TGB_REGISTER(W) \
    tgb::register_bench(tgb::W::name, "typegrad", bm_##W<float>, bm_##W<double>, tgb::W::sizes)

[[maybe_unused]] const bool registered = [] {
    TGB_REGISTER(sum);
    TGB_REGISTER(prod);
    TGB_REGISTER(log_sum_exp);
    TGB_REGISTER(normal_log_pdf);
    TGB_REGISTER(matrix_product);
    tgb::register_bench(tgb::regression::name, "typegrad", bm_regression<float, false>,
                        bm_regression<double, false>, tgb::regression::sizes);
    tgb::register_bench(tgb::regression::name, "typegrad_rowsum", bm_regression<float, true>,
                        bm_regression<double, true>, tgb::regression::sizes);
    TGB_REGISTER(stochastic_volatility);
    tgb::register_bench(tgb::stochastic_volatility::name, "typegrad_blocked", bm_stochastic_volatility_blocked<float>,
                        bm_stochastic_volatility_blocked<double>, tgb::stochastic_volatility::sizes);
    TGB_REGISTER(expmul);
    TGB_REGISTER(mlp_layer);
    tgb::register_bench("copy", "memcpy", bm_copy<float>, bm_copy<double>, tgb::vector_sizes);
    return true;
}();

}  // namespace
