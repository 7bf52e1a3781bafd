// typegrad_attention_blocked: the fused (flash-style) causal attention against the composite and
// a hand-written blocked kernel (issue 15, item 4: "fused so that the T x T scores are not
// written for the backward ... when that is faster"). Times forward + backward of
// loss = sum(attention(q, k, v) * r), float:
//   - typegrad's scaled_dot_product_attention(q, k, v, tg::causal): the fused kernel op
//     (ops/attention.hpp, attention_op);
//   - the same with tg::attention_math: the composite of two GEMMs and a softmax; the T x T
//     probabilities are written in the forward and read by the backward;
//   - a hand-written blocked kernel on the same packed GEMM (detail::gemm): per block of 64
//     queries, the scores of the block's rows (64 x its causal key count) are computed, softmaxed
//     and multiplied by v; the backward recomputes them from q, k and each row's log-sum-exp
//     (saved, t floats), as flash-attention does; nothing T x T is kept. Batches (b * heads) go
//     over the thread pool (detail::parallel_ranges; the GEMMs inside run serially).
// Both on one thread and at all threads, steps alternating, medians; the gradients are compared
// once (relative L2). Prints a Markdown table. Not built by default: --target typegrad_attention_blocked.
#include <typegrad/typegrad.hpp>

#include "../step_timing.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <thread>
#include <vector>

namespace tg = typegrad;
namespace td = typegrad::detail;
using tg::dyn;

namespace {

constexpr std::size_t d = 64;
constexpr auto q = tg::param<"q", float, tg::shape<dyn, dyn, d>>;
constexpr auto k = tg::param<"k", float, tg::shape<dyn, dyn, d>>;
constexpr auto v = tg::param<"v", float, tg::shape<dyn, dyn, d>>;
constexpr auto r = tg::input<"r", float, tg::shape<dyn, dyn, d>>;

// The blocked kernel: q, k, v, r [n, t, d] row-major; gradients into gq, gk, gv.
struct blocked {
    static constexpr std::size_t block = 64;
    std::size_t n, t;
    std::vector<float> o, lse, s, dp;  // o [n t d], lse [n t], s and dp one block's [block, t] per batch

    blocked(std::size_t n_, std::size_t t_)
        : n(n_), t(t_), o(n_ * t_ * d), lse(n_ * t_), s(n_ * block * t_), dp(n_ * block * t_) {}

    float step(const float* qp, const float* kp, const float* vp, const float* rp, float* gq, float* gk, float* gv) {
        using td::transpose;
        const float scale = 1.f / std::sqrt(float(d));
        double loss = 0;
        // forward: o and each row's log-sum-exp
        td::parallel_ranges(n, t * t * d, [&](std::size_t b0, std::size_t b1) { for (std::size_t b = b0; b < b1; ++b) {
            const float *Q = qp + b * t * d, *K = kp + b * t * d, *V = vp + b * t * d;
            float* O = o.data() + b * t * d;
            float* const s = this->s.data() + b * block * t;
            for (std::size_t i0 = 0; i0 < t; i0 += block) {
                const std::size_t rows = std::min(block, t - i0), keys = i0 + rows;  // causal: keys < i0 + rows
                td::gemm(transpose::no, transpose::yes, rows, keys, d, Q + i0 * d, d, K, d, s, keys, false);
                for (std::size_t i = 0; i < rows; ++i) {
                    float* row = s + i * keys;
                    const std::size_t seen = i0 + i + 1;
                    float m = -std::numeric_limits<float>::infinity();
                    for (std::size_t j = 0; j < seen; ++j) m = std::max(m, row[j] * scale);
                    float sum = 0;
                    for (std::size_t j = 0; j < seen; ++j) sum += (row[j] = std::exp(row[j] * scale - m));
                    const float inv = 1.f / sum;
                    for (std::size_t j = 0; j < seen; ++j) row[j] *= inv;
                    std::fill(row + seen, row + keys, 0.f);
                    lse[b * t + i0 + i] = m + std::log(sum);
                }
                td::gemm(transpose::no, transpose::no, rows, d, keys, s, keys, V, d, O + i0 * d, d, false);
            }
        } });
        for (std::size_t e = 0; e < n * t * d; ++e) loss += double(o[e]) * double(rp[e]);
        // backward (g = r): recompute each block's probabilities from its rows' log-sum-exp
        std::fill(gk, gk + n * t * d, 0.f);
        std::fill(gv, gv + n * t * d, 0.f);
        td::parallel_ranges(n, t * t * d, [&](std::size_t b0, std::size_t b1) { for (std::size_t b = b0; b < b1; ++b) {
            const float *Q = qp + b * t * d, *K = kp + b * t * d, *V = vp + b * t * d, *G = rp + b * t * d;
            const float* O = o.data() + b * t * d;
            float *GQ = gq + b * t * d, *GK = gk + b * t * d, *GV = gv + b * t * d;
            float *const s = this->s.data() + b * block * t, *const dp = this->dp.data() + b * block * t;
            for (std::size_t i0 = 0; i0 < t; i0 += block) {
                const std::size_t rows = std::min(block, t - i0), keys = i0 + rows;
                td::gemm(transpose::no, transpose::yes, rows, keys, d, Q + i0 * d, d, K, d, s, keys, false);
                td::gemm(transpose::no, transpose::yes, rows, keys, d, G + i0 * d, d, V, d, dp, keys, false);
                for (std::size_t i = 0; i < rows; ++i) {
                    float *p = s + i * keys, *dpr = dp + i * keys;
                    const std::size_t seen = i0 + i + 1;
                    const float l = lse[b * t + i0 + i];
                    float D = 0;  // rowsum(g o) = rowsum(p dp)
                    for (std::size_t c = 0; c < d; ++c) D += G[(i0 + i) * d + c] * O[(i0 + i) * d + c];
                    for (std::size_t j = 0; j < seen; ++j) {
                        p[j] = std::exp(p[j] * scale - l);
                        dpr[j] = p[j] * (dpr[j] - D) * scale;  // dS, scaled for dq and dk
                    }
                    std::fill(p + seen, p + keys, 0.f);
                    std::fill(dpr + seen, dpr + keys, 0.f);
                }
                td::gemm(transpose::yes, transpose::no, keys, d, rows, s, keys, G + i0 * d, d, GV, d, true);
                td::gemm(transpose::no, transpose::no, rows, d, keys, dp, keys, K, d, GQ + i0 * d, d, false);
                td::gemm(transpose::yes, transpose::no, keys, d, rows, dp, keys, Q + i0 * d, d, GK, d, true);
            }
        } });
        return float(loss);
    }
};

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
    double num = 0, den = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        num += (double(a[i]) - double(b[i])) * (double(a[i]) - double(b[i]));
        den += double(b[i]) * double(b[i]);
    }
    return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace

int main(int argc, char** argv) {
    const int steps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 15;
    auto step = tg::compile(tg::sum(tg::scaled_dot_product_attention(q, k, v, tg::causal, tg::attention_math) * r),
                            tg::wrt(q, k, v));
    auto fused_step = tg::compile(tg::sum(tg::scaled_dot_product_attention(q, k, v, tg::causal) * r), tg::wrt(q, k, v));
    std::printf("| B*H, T (d = 64, causal) | threads | composite (attention_math) ms | fused ms | hand blocked ms | "
                "composite / fused | fused / hand | rel. L2 of gradients |\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
    int failures = 0;
    for (auto [bh, t] : {std::pair{64, 128}, {32, 256}, {16, 512}, {8, 1024}}) {
        const std::size_t n = std::size_t(bh), size = n * std::size_t(t) * d;
        std::mt19937 rng(7);
        std::normal_distribution<float> nd(0.f, 1.f);
        std::vector<float> in[4];
        for (auto& x : in) {
            x.resize(size);
            for (float& e : x) e = nd(rng);
        }
        std::vector<float> ga[3], gb[3], gc[3];
        for (int i = 0; i < 3; ++i) ga[i].resize(size), gb[i].resize(size), gc[i].resize(size);
        blocked hand(n, std::size_t(t));
        const std::size_t tt = std::size_t(t);
        auto composite = [&] {
            return step.value_and_grad(tg::bind(q, in[0], {n, tt, d}), tg::bind(k, in[1], {n, tt, d}), tg::bind(v, in[2], {n, tt, d}),
                                       tg::bind(r, in[3], {n, tt, d}), tg::grad_into(q, ga[0]), tg::grad_into(k, ga[1]),
                                       tg::grad_into(v, ga[2]));
        };
        auto fused_op = [&] {
            return fused_step.value_and_grad(tg::bind(q, in[0], {n, tt, d}), tg::bind(k, in[1], {n, tt, d}),
                                             tg::bind(v, in[2], {n, tt, d}), tg::bind(r, in[3], {n, tt, d}),
                                             tg::grad_into(q, gc[0]), tg::grad_into(k, gc[1]), tg::grad_into(v, gc[2]));
        };
        auto fused = [&] {
            return hand.step(in[0].data(), in[1].data(), in[2].data(), in[3].data(), gb[0].data(), gb[1].data(), gb[2].data());
        };
        const float la = composite(), lb = fused(), lc = fused_op();
        double err = std::max(std::abs(double(la) - double(lb)), std::abs(double(la) - double(lc))) /
                     std::max(1.0, std::abs(double(la)));
        for (int i = 0; i < 3; ++i) err = std::max({err, rel_l2(gb[i], ga[i]), rel_l2(gc[i], ga[i])});
        if (!(err < 1e-4)) ++failures;
        for (std::size_t threads : {std::size_t(1), std::size_t(std::max(1u, std::thread::hardware_concurrency()))}) {
            tg::set_num_threads(threads);
            std::vector<double> wa, wb, wc;
            float sink = 0;
            for (int s = 0; s < steps + 2; ++s) {  // alternating, two warm-up steps
                const auto a = bench_timing::time_call(composite, sink);
                const auto c = bench_timing::time_call(fused_op, sink);
                const auto b = bench_timing::time_call(fused, sink);
                if (s >= 2) wa.push_back(a.wall), wb.push_back(b.wall), wc.push_back(c.wall);
            }
            const double ma = bench_timing::median(wa), mb = bench_timing::median(wb), mc = bench_timing::median(wc);
            std::printf("| %d, %d | %zu | %.2f | %.2f | %.2f | **%.2f** | %.2f | %.1e |\n", bh, t, threads, 1e3 * ma, 1e3 * mc,
                        1e3 * mb, ma / mc, mc / mb, err);
            std::fflush(stdout);
        }
    }
    return failures == 0 ? 0 : 1;
}
