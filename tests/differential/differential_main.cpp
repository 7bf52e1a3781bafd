// Differential test: every generated graph (generated/graphs_*.cpp) evaluated by typegrad at
// many random points and sizes, against the same graph built with LibTorch autograd in double.
// A generated graph is compiled in one dtype (even generator indices double, odd float: each
// instantiation is a whole step, and CI's time is mostly these), the hand-written ones in both.
// Value and every gradient are compared: typegrad double within 1e-10, typegrad float within
// 1e-3, relative to the reference tensor's largest element (so a tiny element next to large ones
// is not held to a relative bound its rounding cannot meet).
//
// A mismatch prints a reproducer: the graph's C++ text, the smallest sizes that still fail, the
// inputs. Environment:
//   TYPEGRAD_DIFF_CASES=<n>   cases to draw (default 1600, shared over the (graph, dtype) pairs; a few are skipped)
//   TYPEGRAD_DIFF_GRAPH=<id>  only this graph (ids from 2000: autocast graphs)
//   TYPEGRAD_DIFF_AUTOCAST_CASES=<n>  autocast cases to draw (default 650, shared over the graphs built; autocast_harness.cpp)
//   TYPEGRAD_DIFF_SPECIAL_CASES=<n>  cases with special values (default 800, shared likewise)
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
#include <optional>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "autocast_registry.hpp"
#include "conv_reference.hpp"
#include "dropout_mask.hpp"
#include "graph_registry.hpp"
#include "prod_reference.hpp"
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
        if (l.ids) {  // integers (exact in float below 2^24); never special
            std::uniform_int_distribution<long> di(long(l.lo), long(l.hi));
            for (double& x : v) x = double(di(rng));
        } else {
            for (double& x : v) x = double(T(d(rng)));
        }
        if (special && !l.ids)  // about a third of the elements: a special value or a tie with an earlier one
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
    // the sum NaN (graph 2003). NaN and +-inf are then interchangeable, and so are +-inf and a
    // finite value: overflowing products whose sum is finite under one evaluation overflow under
    // another (graph 2000, float: grad q 3.25e36 in LibTorch, inf in typegrad, from products
    // of a score gradient and k = 1e36; 40000 cases). Finite values are still compared.
    bool overflow_ambiguous = false;
    // special values: an absolute allowance per leaf (attention's rounding noise, see run_torch)
    std::vector<double> grad_noise;
    // every case: an absolute allowance per leaf (an attention mask's gradient, see run_torch), in
    // units of the unit roundoff of the dtype under test (the reference may run in double)
    std::vector<double> grad_floor;
};

// Where a graph is not differentiable (relu/abs at 0, ties of max/min, the branch of a
// comparison), a value within rounding of the kink may fall on either side in typegrad's dtype:
// such a case compares nothing useful. Exact ties (margin 0) are structural and kept.
void note_margin(reference& ref, const torch::Tensor& margin, const torch::Tensor& scale, double tol) {
    const auto m = margin.detach().abs();
    const auto near = (m > 0) & (m < tol * (scale.detach().abs() + 1));
    if (near.any().item<bool>()) ref.near_kink = true;
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
    std::vector<std::function<void()>> after_backward;  // checks that read gradients
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
        double keys, scale;
        torch::Tensor mask;  // undefined: none
    };
    std::vector<attention_check> attention_checks;
    // Special values: the gradient of a softmax's input is P (g - sum(P g)) (log_softmax's
    // g - exp(out) sum(g)), rounding noise of the size u n |g| where it cancels: with g constant
    // along a row it is 0 exactly, and both sides return noise (graph 1001, float: 7.5e-9 against
    // 9.6e-9, the other row being NaN, so that the noise is the tensor's largest finite element).
    // 16 times that is an absolute allowance for the gradient of a leaf fed to it, as attention's.
    struct softmax_check {
        torch::Tensor in, out;
    };
    std::vector<softmax_check> softmax_checks;
    // Special values: the gradient of a norm's weight (and bias) sums, over the rows, g x_hat (g);
    // where those terms cancel (x_hat of 2.236 in a row holding 709.5 and -2.236 in one holding
    // -720, each times a gradient of 1e306: graph 2008, 1.3325282877e300 against 1.3325282884e300)
    // its value is a few ulps of the terms, not of the sum. Ill-conditioned where that rounding,
    // 4 u sum|terms| (a few roundings per term), could move the weight's gradient by more than
    // half the comparison's bound (relative to its largest finite element).
    struct weight_check {
        torch::Tensor weight, out, x_hat;  // x_hat undefined: a bias
        bool channels = false;  // along axis 1 (batch_norm), not the last axis (the norms)
    };
    std::vector<weight_check> weight_checks;
    // Ties of a max/min reduction: every element against the extreme, not only the runner-up. An
    // exact tie of three elements is structural, but LibTorch's vectorised kernels and their scalar
    // tails may round one copy of a value differently (gelu, sigmoid, pow: graph 5, 2205), so that
    // two elements tie where typegrad's three do; such a case is within rounding of the kink.
    auto top_gap = [&](const torch::Tensor& t, bool largest) {
        if (t.numel() < 2) return;
        const auto flat = t.detach().reshape({-1});
        const auto extreme = largest ? flat.max() : flat.min();
        note_margin(ref, flat - extreme, extreme, kink_tol);
    };
    const double unit_roundoff = dtype == torch::kFloat32 ? 0x1p-24 : 0x1p-53;
    // Special values: a sum whose terms cancel (1e306 - 1e306 + 0.77 ...) is exact in no order: its
    // rounding error, u sum|x|, is of the order of its largest term, and typegrad's order,
    // LibTorch's and the exact sum may all differ (graph 2200: mean(concat(g, g, g)) with g =
    // [0.77, 1e306, -1e306, 0.77] is 0.064 in typegrad's order, 0.19 in LibTorch's, 0.38 exactly,
    // and the gradient of its square root follows). Ill-conditioned when that error exceeds 1e-3 of
    // the sum (1e-3 absolute below 1), as log_sum_exp's rule; and when the sum lies within a few
    // rounding errors of 0 and holds a term small enough to be absorbed by the others: its sign,
    // and whether it is 0 at all, are then the order's (graph 2200: g = [-1.5e-323, 1, -0, -1] three
    // times has the mean -0 in typegrad's order, +0 in LibTorch's, and sqrt's gradient -inf, +inf).
    // The first test, for sums given elementwise as `total` (sum|x| over the finite terms x, in
    // double) and `sum`: whether any finite sum's rounding error u total exceeds 1e-3 of it (1e-3
    // absolute below 1).
    const auto error_dominates = [unit_roundoff](const torch::Tensor& total, const torch::Tensor& sum) {
        return (torch::isfinite(sum) & (unit_roundoff * total > 1e-3 * sum.abs().clamp_min(1))).any().item<bool>();
    };
    const auto finite_magnitudes = [](const torch::Tensor& v) { return v.abs().masked_fill(~torch::isfinite(v), 0); };
    auto note_cancellation = [&](const torch::Tensor& t) {
        const auto v = t.detach().to(torch::kFloat64);
        const auto magnitudes = finite_magnitudes(v);
        const auto total_t = magnitudes.sum(), sum_t = v.sum();
        const double total = total_t.item<double>();
        const double sum = std::abs(sum_t.item<double>());
        if (!std::isfinite(sum)) return;
        if (error_dominates(total_t, sum_t)) ref.ill_conditioned = true;
        const double smallest = magnitudes.masked_fill(magnitudes == 0, INFINITY).min().item<double>();
        if (total > 0 && sum <= 4 * unit_roundoff * total && smallest < 4 * unit_roundoff * total) ref.ill_conditioned = true;
    };
    // Special values: whether a sum of products (a GEMM's dot product, a convolution) is NaN can
    // depend on how it is evaluated. With an infinite product and a finite product beyond the
    // maximum of the other sign (or two such finite products of opposite signs), multiplying first
    // gives inf + -inf = NaN, but an FMA keeps the finite product exact: typegrad's GEMM computes
    // fma(1e306, 709.5, -inf) = -inf (and the order decides which product comes first). A softmax
    // or tanh after it turns NaN against -inf into NaN against finite values (graph 2000: attention
    // scores, grad q 0 against NaN; 2001, float: grad v finite against NaN; 2004: a convolution
    // under tanh). `products` holds every product of each sum along its last axis, in the dtype
    // (those that overflow are +-inf: the NaN-ness of a sum that multiplies first, which no order
    // changes), `exact` the same products of the operands with their finite nonzero magnitudes
    // clamped to [1e-150, 1e150] (signs, zeros, infinities and NaN kept: the NaN-ness of the exact
    // sum). Where they disagree on an element that counts (`keep`), the case is ill-conditioned.
    auto clamp_magnitudes = [](const torch::Tensor& t) {
        const auto d = t.detach().to(torch::kFloat64);
        return torch::where(torch::isfinite(d) & (d != 0), d.sign() * d.abs().clamp(1e-150, 1e150), d);
    };
    auto note_product_sums = [&](const torch::Tensor& products, const torch::Tensor& exact, const torch::Tensor& keep) {
        const auto ambiguous = torch::isnan(products.sum(-1)) & ~torch::isnan(exact.sum(-1)) & keep;
        if (ambiguous.any().item<bool>()) ref.ill_conditioned = true;
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
            if (l.ids)
                r = torch::tensor(c.in[i], torch::TensorOptions().dtype(torch::kFloat64)).round().to(torch::kLong).reshape(shape);
            else
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
            // At a NaN x, LibTorch 1.13's vectorised elu_backward takes the negative branch (its
            // test is x > 0) and gives NaN even for a zero gradient, where its scalar loop and
            // its CUDA kernel (x <= 0 ? ... : grad) pass the gradient, as typegrad does (graph
            // 78: pow(1, elu(NaN)) has exponent gradient 0, and elu's was NaN in the SIMD body,
            // 0 in the tail): a NaN x takes the identity here, and elu sees 0 in its place
            const double alpha = std::stod(b);
            const auto v = node(a).detach();
            const auto nan = torch::isnan(v);
            const auto e = torch::elu(torch::where(nan, torch::zeros({}, opts), node(a)), alpha);
            r = torch::where(nan, node(a), e + torch::where(v <= 0, alpha * torch::expm1(v) - e.detach(), torch::zeros({}, opts)));
        } else if (op == "clamp") {
            ts >> b >> x;
            const double lo = std::stod(b), hi = std::stod(x);
            note_margin(ref, node(a) - lo, torch::scalar_tensor(lo, opts), kink_tol);
            note_margin(ref, node(a) - hi, torch::scalar_tensor(hi, opts), kink_tol);
            r = torch::clamp(node(a), lo, hi);
        }
        else if (op == "powc") { ts >> b; r = torch::pow(node(a), torch::scalar_tensor(std::stod(b), opts)); }
        else if (op == "sum" || op == "mean") {
            note_cancellation(node(a));
            r = op == "sum" ? node(a).sum() : node(a).mean();
        }
        else if (op == "max") { top_gap(node(a), true); r = node(a).max(); }
        else if (op == "min") { top_gap(node(a), false); r = node(a).min(); }
        else if (op == "prod") {  // prod_reference.hpp: the reference's blind spots
            if (diff::prod_zero_beside_nonfinite(node(a))) ref.near_kink = true;
            if (diff::prod_order_sensitive(node(a), dtype)) ref.ill_conditioned = true;
            r = node(a).prod();
        }
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
            r = cond.to(dtype) * node(x);  // in the dtype under test (a double mask promoted float special cases)
        }
        // the model ops of issue 15 (hand-written graphs 2000.., model_ops.cpp)
        else if (op == "sdpa") {
            // q k v causal [scale [mask]]: softmax(q k^T scale + mask, causally masked) v, written
            // out; scale 0 (or none) is 1 / sqrt(d)
            ts >> b >> x >> y;
            double scale_arg = 0;
            std::string mask;
            if (ts >> scale_arg) ts >> mask;
            const auto q = node(a), k = node(b), v = node(x);
            const double scale = scale_arg != 0 ? scale_arg : 1 / std::sqrt(double(q.size(-1)));
            auto s = scale_arg != 0 ? torch::matmul(q, k.transpose(-2, -1)) * scale
                                    : torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(q.size(-1)));
            if (!mask.empty()) s = s + node(mask);
            auto keep = torch::ones({s.size(-2), s.size(-1)}, torch::TensorOptions().dtype(torch::kBool));
            if (std::stoi(y) != 0) {
                keep = keep.tril();
                s = s.masked_fill(keep.logical_not(), -std::numeric_limits<double>::infinity());
            }
            note_product_sums(q.detach().unsqueeze(-2) * k.detach().unsqueeze(-3),
                              clamp_magnitudes(q).unsqueeze(-2) * clamp_magnitudes(k).unsqueeze(-3), keep);
            {
                // Special values: a score whose rounding error u sum|q_c k_c| / sqrt(d) exceeds 1e-3
                // while its weight in the softmax is not negligible (within 40, plus both errors, of
                // the row's largest score) in a row with another such score: which of them
                // dominates is the rounding's choice (graph 2000, float: q k = 1.56e35 + 0.068 -
                // 1.56e35 is 0.068, 3.5e-43 in LibTorch, -1.5e27 in typegrad, whose FMA keeps the
                // rounding error of the first product). Ill-conditioned, as log_sum_exp's rule.
                auto finite_abs = [](const torch::Tensor& t) {
                    const auto d = t.detach().to(torch::kFloat64).abs();
                    return d.masked_fill(~torch::isfinite(d), 0);
                };
                auto err = unit_roundoff * scale * torch::matmul(finite_abs(q), finite_abs(k).transpose(-2, -1));
                if (!mask.empty()) err = err + unit_roundoff * finite_abs(node(mask));  // the mask's addition
                const auto sd = s.detach().to(torch::kFloat64);
                const auto ok = torch::isfinite(sd) & keep;
                const auto [top, at] = sd.masked_fill(~ok, -std::numeric_limits<double>::infinity()).max(-1, true);
                const auto near = ok & (sd + err >= top - err.gather(-1, at) - 40);
                const auto rows = (near.sum(-1) >= 2) & (err.masked_fill(~near, 0).amax(-1) > 1e-3);
                if (rows.any().item<bool>()) ref.ill_conditioned = true;
            }
            r = torch::matmul(torch::softmax(s, -1), v);
            note_products(finite_abs_max(q), finite_abs_max(k));
            note_products(finite_abs_max(torch::softmax(s, -1)), finite_abs_max(v));
            if (s.requires_grad()) s.retain_grad();
            if (r.requires_grad()) r.retain_grad();
            product_outputs.emplace_back(s, std::max(finite_abs_max(q), finite_abs_max(k)));
            product_outputs.emplace_back(r, finite_abs_max(v));
            if (r.requires_grad() && q.requires_grad() && k.requires_grad())
                attention_checks.push_back({q, k, v, r, double(k.size(-2)), scale, torch::Tensor()});
            if (!mask.empty() && r.requires_grad() && node(mask).requires_grad())
                attention_checks.push_back({q, k, v, r, double(k.size(-2)), scale, node(mask)});
        } else if (op == "layer_norm") {
            ts >> b >> x;
            note_squares(2 * finite_abs_max(node(a)));  // (x - mean)^2
            r = torch::layer_norm(node(a), {node(a).size(-1)}, node(b), node(x), 1e-5);
            {
                const auto xd = node(a).detach().to(torch::kFloat64);
                const auto centred = xd - xd.mean(-1, true);
                const auto rstd = 1 / torch::sqrt((centred * centred).mean(-1, true) + 1e-5);
                weight_checks.push_back({node(b), r, centred * rstd});
                weight_checks.push_back({node(x), r, torch::Tensor()});
                // Special values, double: LibTorch computes fma(x, rstd, -rstd mean) (finding 22),
                // whose error u |x| rstd is not small against the normalised value when the row is
                // (nearly) constant: [-720] x 4 with gain -720 gives 1.8e-8 where the result is the
                // bias exactly (graph 2212, grad g 1.8e-8 apart). Float cases compare against the
                // double run instead; a double case whose LibTorch error, times the gain, exceeds
                // 1e-13 of the output's largest finite element is ill-conditioned.
                // Special values: a row whose centred values are a few subnormal ulps (-4.2e-45
                // and three zeros, float: its mean rounds by a third) carries that rounding,
                // amplified by rstd = 316, into every output and gradient (graph 2212, grad g
                // -2.1e-43 against -3.5e-43): ill-conditioned where the subnormal ulp exceeds the
                // bound's share of the row's largest centred value.
                const double denorm = dtype == torch::kFloat32 ? double(std::numeric_limits<float>::denorm_min())
                                                               : std::numeric_limits<double>::denorm_min();
                const double rtol = dtype == torch::kFloat32 ? rtol_f32 : rtol_f64;
                const auto width = centred.abs().masked_fill(~torch::isfinite(centred), 0).amax(-1);
                if (((width > 0) & (width < denorm / rtol)).any().item<bool>()) ref.ill_conditioned = true;
                // Special values: its backward forms dY x gamma and db mean (db = sum(dY gamma));
                // beyond a sixteenth of the maximum, whether they overflow depends on FMA (LibTorch
                // computes fma(db, mean, -ds): -1e306 x -240 - inf = -inf, typegrad's rounded
                // product inf - inf = NaN; graph 2002, grad x -inf against NaN), as for convolutions
                if (r.requires_grad())
                    product_outputs.emplace_back(r, finite_abs_max(node(a)) * std::max(1.0, finite_abs_max(node(b))) *
                                                        double(node(a).size(-1)));
                if (dtype == torch::kFloat64) {
                    const auto spread = xd.abs().amax(-1, true) * rstd;
                    const double noise = unit_roundoff * spread.masked_fill(~torch::isfinite(spread), 0).max().item<double>() *
                                         std::max(1.0, finite_abs_max(node(b)));
                    if (noise > 1e-13 * finite_abs_max(r)) ref.ill_conditioned = true;
                }
            }
            if (r.requires_grad()) {
                r.retain_grad();
                cancelling_outputs.push_back(r);  // its backward sums g and g x
            }
        } else if (op == "batch_norm") {
            ts >> b >> x;
            note_squares(2 * finite_abs_max(node(a)));
            r = torch::batch_norm(node(a), node(b), node(x), {}, {}, true, 0.1, 1e-5, false);
            {  // its weight's and bias's gradients sum g x_hat and g over the batch (the norms' rule)
                const auto xd = node(a).detach().to(torch::kFloat64);
                std::vector<std::int64_t> over{0};
                for (std::int64_t k = 2; k < xd.dim(); ++k) over.push_back(k);
                const auto centred = xd - xd.mean(over, true);
                const auto rstd = 1 / torch::sqrt((centred * centred).mean(over, true) + 1e-5);
                weight_checks.push_back({node(b), r, centred * rstd, true});
                weight_checks.push_back({node(x), r, torch::Tensor(), true});
            }
            if (r.requires_grad()) {
                r.retain_grad();
                cancelling_outputs.push_back(r);  // its backward sums g and (x - mean) g
            }
        } else if (op == "reshape4") {
            std::int64_t d0, d1, d2, d3;
            ts >> d0 >> d1 >> d2 >> d3;
            r = node(a).reshape({d0, d1, d2, d3});
        } else if (op == "conv1d" || op == "conv2d") {  // x w [bias] stride pad [dilation groups]
            std::string bias;
            ts >> b;
            if (op == "conv1d") ts >> bias;
            std::int64_t stride, pad, dil = 1, groups = 1;
            ts >> stride >> pad;
            if (ts >> dil) ts >> groups;
            const torch::Tensor bt = op == "conv1d" ? node(bias) : torch::Tensor();
            // see conv2d_without_padding_products (conv_reference.hpp); float too: LibTorch 1.13's float path is not
            // always oneDNN's (graph 2230, stride 2: NaN from -inf times a padding zero, where
            // typegrad and oneDNN take no product there)
            if (pad > 0) {
                if (op == "conv1d")
                    r = diff::conv2d_without_padding_products(node(a).unsqueeze(2), node(b).unsqueeze(2), 1, stride, 0, pad, 1,
                                                              dil, groups)
                            .squeeze(2) + bt.reshape({1, -1, 1});
                else
                    r = diff::conv2d_without_padding_products(node(a), node(b), stride, stride, pad, pad, dil, dil, groups);
            } else {
                r = op == "conv1d" ? torch::conv1d(node(a), node(b), bt, stride, pad, dil, groups)
                                   : torch::conv2d(node(a), node(b), bt, stride, pad, dil, groups);
            }
            note_products(finite_abs_max(node(a)), finite_abs_max(node(b)));
            {  // the NaN-ness of each output's sum of products (note_product_sums), padding excluded
                namespace F = torch::nn::functional;
                const bool one = op == "conv1d";
                const auto x4 = one ? node(a).detach().unsqueeze(2) : node(a).detach();
                const auto w4 = one ? node(b).detach().unsqueeze(2) : node(b).detach();
                const auto unfold = F::UnfoldFuncOptions({w4.size(2), w4.size(3)})
                                        .padding({one ? 0 : pad, pad})
                                        .stride({one ? 1 : stride, stride})
                                        .dilation({one ? 1 : dil, dil});
                const auto valid = F::unfold(torch::ones_like(x4), unfold) > 0.5;  // [N, C KH KW, L]
                // [N, C KH KW, L] (channel-major) as each output's columns: [N, O, C/G KH KW, L]
                const std::int64_t outs = w4.size(0);
                auto grouped = [groups, outs](const torch::Tensor& cols) {
                    const auto t = cols.reshape({cols.size(0), groups, 1, -1, cols.size(-1)});
                    return t.expand({t.size(0), groups, outs / groups, t.size(3), t.size(4)}).reshape({t.size(0), outs, t.size(3), t.size(4)});
                };
                auto products = [&](const torch::Tensor& xs, const torch::Tensor& ws, const torch::Tensor& bias) {
                    auto p = grouped(F::unfold(xs, unfold)) * ws.reshape({ws.size(0), -1}).unsqueeze(0).unsqueeze(-1);
                    p = p.masked_fill(~grouped(valid), 0).transpose(-1, -2);  // [N, O, L, C/G KH KW]
                    if (!bias.defined()) return p;
                    return torch::cat({p, bias.to(p.scalar_type()).reshape({1, -1, 1, 1}).expand({p.size(0), p.size(1), p.size(2), 1})}, -1);
                };
                const auto terms = products(x4, w4, bt.defined() ? bt.detach() : bt);
                note_product_sums(terms,
                                  products(clamp_magnitudes(x4), clamp_magnitudes(w4), bt.defined() ? clamp_magnitudes(bt) : bt),
                                  torch::ones({}, torch::TensorOptions().dtype(torch::kBool)));
                // An output whose products cancel (3e305 - 3e305 + ... = -2.26) is exact in no order,
                // as a sum's (note_cancellation): its rounding error u sum|p| is then far above the
                // value, and a gradient that multiplies it by 1e306 follows the order (graph 2003,
                // double: grad w -5.989e306 in typegrad's order and exactly, -4.013e306 in
                // LibTorch's). Ill-conditioned by the same rule, per output element.
                const auto d = terms.to(torch::kFloat64);
                if (error_dominates(finite_magnitudes(d).sum(-1), d.sum(-1))) ref.ill_conditioned = true;
                // The same for the backward's sums, once the output's gradient g is known: the bias's
                // (sum of g), the weight's (sum of g x) and the input's (sum of g w, folded back onto
                // the input's positions) (graph 2003, double: grad b -62.65 in typegrad's order,
                // -60.64 in LibTorch's, from g of 1e306 that cancel).
                if (r.requires_grad())
                    after_backward.push_back([&ref, error_dominates, finite_magnitudes, grouped, groups, r, x4, w4, unfold, valid] {
                        if (!r.grad().defined()) return;
                        const auto g = r.grad().detach().to(torch::kFloat64).reshape({r.size(0), r.size(1), 1, -1});
                        const auto cols = grouped(F::unfold(x4.to(torch::kFloat64), unfold).masked_fill(~valid, 0));
                        const auto ws = w4.to(torch::kFloat64).reshape({1, w4.size(0), -1, 1});
                        const auto fold = F::FoldFuncOptions({x4.size(2), x4.size(3)}, {w4.size(2), w4.size(3)})
                                              .padding(unfold.padding())
                                              .stride(unfold.stride())
                                              .dilation(unfold.dilation());
                        const std::vector<std::int64_t> over_outputs{0, 3};  // batch and positions
                        const auto gx = g * cols;
                        const auto gw = (g * ws).masked_fill(~grouped(valid), 0);  // [N, O, C/G KH KW, L]
                        // summed over each group's outputs: [N, C KH KW, L], the input's columns
                        auto per_input = [&](const torch::Tensor& t) {
                            return t.reshape({t.size(0), groups, -1, t.size(2), t.size(3)}).sum(2).reshape({t.size(0), -1, t.size(3)});
                        };
                        if (error_dominates(finite_magnitudes(g).sum(over_outputs), g.sum(over_outputs)) ||    // bias
                            error_dominates(finite_magnitudes(gx).sum(over_outputs), gx.sum(over_outputs)) ||  // weight
                            error_dominates(F::fold(per_input(finite_magnitudes(gw)), fold), F::fold(per_input(gw), fold)))  // input
                            ref.ill_conditioned = true;
                    });
            }
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
            const auto x_hat = v * torch::rsqrt(v.pow(2).mean(-1, true) + 1e-6);
            r = x_hat * node(b);
            if (r.requires_grad()) r.retain_grad();
            weight_checks.push_back({node(b), r, x_hat.detach()});
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
                softmax_checks.push_back({node(a), r});
            }
        } else if (op == "max_pool2d" || op == "avg_pool2d") {
            std::int64_t k, stride, pad;
            ts >> k >> stride >> pad;
            r = op == "max_pool2d" ? torch::max_pool2d(node(a), k, stride, pad) : torch::avg_pool2d(node(a), k, stride, pad);
            if (op == "max_pool2d") {  // each window's largest element against its runner-up, as top_gap
                namespace F = torch::nn::functional;
                const auto x = node(a).detach();
                const auto padded = torch::constant_pad_nd(x, {pad, pad, pad, pad}, -std::numeric_limits<double>::infinity());
                const auto windows = F::unfold(padded, F::UnfoldFuncOptions({k, k}).stride(stride))
                                         .reshape({x.size(0), x.size(1), k * k, -1});
                const auto top = std::get<0>(windows.topk(2, 2));
                note_margin(ref, top.select(2, 0) - top.select(2, 1), top.select(2, 0), kink_tol);
            }
        } else if (op == "adaptive_avg_pool2d") {  // x oh ow
            std::int64_t oh, ow;
            ts >> oh >> ow;
            r = torch::adaptive_avg_pool2d(node(a), {oh, ow});
        } else if (op == "argmax" || op == "argmin") {  // x axis, keepdim: std::int64_t ids (a gather's)
            std::int64_t axis;
            ts >> axis;
            const auto v = node(a).detach();
            if (v.size(axis) >= 2) {  // the extreme against the runner-up along the axis, as top_gap
                const auto top = std::get<0>(v.topk(2, axis, op == "argmax"));
                note_margin(ref, top.select(axis, 0) - top.select(axis, 1), top.select(axis, 0), kink_tol);
            }
            r = op == "argmax" ? v.argmax(axis, true) : v.argmin(axis, true);
        } else if (op == "narrow") {  // x axis start length (start and length: one-element ids)
            std::int64_t axis;
            ts >> axis >> b >> x;
            r = node(a).narrow(axis, node(b).item<std::int64_t>(), node(x).item<std::int64_t>());
        } else if (op == "reshape3") {
            std::int64_t d0, d1, d2;
            ts >> d0 >> d1 >> d2;
            r = node(a).reshape({d0, d1, d2});
        } else if (op == "embedding") {  // ids table padding_idx (-1: none)
            std::int64_t pad;
            ts >> b >> pad;
            r = torch::embedding(node(b), node(a), pad);
        } else if (op == "index_select" || op == "gather") {  // x axis ids
            std::int64_t axis;
            ts >> axis >> b;
            r = op == "index_select" ? torch::index_select(node(a), axis, node(b)) : torch::gather(node(a), axis, node(b));
        } else if (op == "dropout") {  // x rng p: typegrad's mask (ops/dropout.hpp's stream), scaled
            double p;
            ts >> b >> p;
            const auto rng = node(b);
            const auto keep = diff::dropout_keep(std::uint64_t(rng[0].item<std::int64_t>()),
                                                 std::uint64_t(rng[1].item<std::int64_t>()), node(a).numel(), p);
            const auto mask = torch::tensor(keep, torch::TensorOptions().dtype(torch::kFloat64)).to(dtype).reshape(node(a).sizes());
            r = node(a) * (mask * (1.0 / (1.0 - p)));
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
        if (r.is_floating_point()) {  // the largest finite |value|: NaN and inf are compared exactly, not by scale
            const auto a = r.detach().abs();
            const auto fin = a.masked_fill(~torch::isfinite(a), 0);
            ref.magnitude = std::max(ref.magnitude, fin.max().item<double>());
        }
        nodes.push_back(r);
    }
    torch::Tensor loss = nodes.back();
    ref.loss = loss.item<double>();
    if (loss.requires_grad()) loss.backward();
    for (const auto& check : after_backward) check();
    for (const auto& [out, operand] : product_outputs)  // the backward's products: gradient times operand
        if (out.requires_grad() && out.grad().defined()) note_products(finite_abs_max(out.grad()), operand);
    for (const auto& at : attention_checks) {
        if (!at.out.grad().defined()) continue;
        const double eps = dtype == torch::kFloat32 ? 0x1p-24 : 0x1p-53;
        const double dp = finite_abs_max(torch::matmul(at.out.grad(), at.v.detach().transpose(-2, -1)));
        if (at.mask.defined()) {
            // Every case: a float mask's gradient is the score gradient dS = P (dP - sum(P dP)) summed
            // over the batch. Where a row's softmax is (nearly) one-hot, dS is a cancellation whose
            // rounding error, up to 2 u |dP| an element, is not small against its value, in any
            // evaluation order (graph 2260, double: -1.88002252155e-7 in typegrad, -1.88002252117e-7
            // in LibTorch, from scores 30 apart). Each element sums batch elements of it: 16 times
            // that, in the dtype under test (compare), is an absolute allowance for the mask's gradient.
            const std::size_t i = std::find_if(leaves.begin(), leaves.end(), [&](const torch::Tensor& l) {
                                      return l.unsafeGetTensorImpl() == at.mask.unsafeGetTensorImpl();
                                  }) - leaves.begin();
            if (i == leaves.size()) continue;
            const double batch = double(at.q.numel() / (at.q.size(-2) * at.q.size(-1)));
            ref.grad_floor.resize(leaves.size(), 0.0);
            ref.grad_floor[i] = std::max(ref.grad_floor[i], 16 * 2 * dp * batch);
            continue;
        }
        const double noise_q = 2 * eps * dp * finite_abs_max(at.k) * at.keys * at.scale;
        const double noise_k = 2 * eps * dp * finite_abs_max(at.q) * at.keys * at.scale;
        ref.grad_noise.resize(leaves.size(), 0.0);
        for (std::size_t i = 0; i < leaves.size(); ++i) {
            if (leaves[i].unsafeGetTensorImpl() == at.q.unsafeGetTensorImpl()) ref.grad_noise[i] = std::max(ref.grad_noise[i], 16 * noise_q);
            if (leaves[i].unsafeGetTensorImpl() == at.k.unsafeGetTensorImpl()) ref.grad_noise[i] = std::max(ref.grad_noise[i], 16 * noise_k);
        }
    }
    auto leaf_index = [&](const torch::Tensor& t) {
        for (std::size_t i = 0; i < leaves.size(); ++i)
            if (leaves[i].unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return i;
        return leaves.size();
    };
    for (const auto& sc : softmax_checks) {
        const std::size_t i = leaf_index(sc.in);
        if (i == leaves.size() || !sc.out.grad().defined()) continue;
        ref.grad_noise.resize(leaves.size(), 0.0);
        const double noise = unit_roundoff * double(sc.out.size(-1)) * finite_abs_max(sc.out.grad());
        ref.grad_noise[i] = std::max(ref.grad_noise[i], 16 * noise);
    }
    for (const auto& wc : weight_checks) {
        if (!wc.out.requires_grad() || !wc.out.grad().defined() || !wc.weight.is_leaf() || !wc.weight.requires_grad() ||
            !wc.weight.grad().defined())
            continue;
        auto terms = wc.out.grad().detach().to(torch::kFloat64);
        if (wc.x_hat.defined()) terms = terms * wc.x_hat.to(torch::kFloat64);
        if (wc.channels) terms = terms.movedim(1, -1);
        terms = terms.abs().masked_fill(~torch::isfinite(terms), 0).reshape({-1, terms.size(-1)}).sum(0);
        const double rtol = dtype == torch::kFloat32 ? rtol_f32 : rtol_f64;
        const auto finite = torch::isfinite(wc.weight.grad().detach()).reshape({-1});  // NaN and inf are compared exactly
        if ((finite & (2 * 4 * unit_roundoff * terms > rtol * finite_abs_max(wc.weight.grad()))).any().item<bool>())
            ref.ill_conditioned = true;
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
    // Float: a finite element that misses the bound also passes when it is within the bound of
    // the program run by LibTorch in double (the exact value, up to double rounding; for special
    // values the reference is LibTorch's float run), relative to the same scale, or no farther from
    // the exact value than twice LibTorch's float result. LibTorch's float kernels round too, and
    // not always as closely as typegrad's: its sin is 1 ulp off where typegrad's is correctly
    // rounded, and 1 - sin(b) at b = 1.5677 (4.682e-6) is 4.709e-6 in typegrad, the best
    // 1 - fl(sin(b)) can do, and 4.649e-6 in LibTorch (graph 21); its layer_norm computes
    // fma(x, rstd, -rstd mean), 6e-4 for a constant row of 88.5 whose result is 0 (graph 2212); both
    // sides are 3 subnormal ulps from the exact value, on opposite sides, in graph 2206. NaN and
    // infinities must still agree with the reference exactly.
    std::optional<reference> exact, single;
    auto exact_value = [&](int tensor, std::size_t i) {
        if (!special) return tensor < 0 ? ref.loss : ref.grads[std::size_t(tensor)][i];
        if (!exact) exact = run_torch(g, c, 1e-3, torch::kFloat64);
        return tensor < 0 ? exact->loss : exact->grads[std::size_t(tensor)][i];
    };
    auto float_value = [&](int tensor, std::size_t i) {
        if (special) return tensor < 0 ? ref.loss : ref.grads[std::size_t(tensor)][i];
        if (!single) single = run_torch(g, c, 1e-3, torch::kFloat32);
        return tensor < 0 ? single->loss : single->grads[std::size_t(tensor)][i];
    };
    // ... or within twice the spread of the exact values of inputs 4 float ulps away (each element
    // times 1 +- 4 u, four draws): the float result of a backward-stable computation is the exact
    // result of nearby inputs, and where that spread is large the case is ill-conditioned. A
    // layer_norm of the nearly constant row [0.8443, 0.8443, 1] with gain -90 is 64.4249 exactly,
    // 64.42500 in typegrad's float (the mean's rounding, amplified by rstd 13.6 and the gain), and
    // its cosine (-0.022, near a zero) carries that into the gradient: 37.069 against 37.027 exactly
    // (graph 2214; LibTorch's 37.022). An rms_norm backward that cancels exactly for the row
    // [-90, -90, -0] returns 2.3e-10, half an ulp of its terms (graph 2206). gelu_tanh's derivative
    // near its zero (x = -0.7524: -4.0300706e-5, a sum of terms of 0.2) is -4.0248e-5 in float
    // (graph 83, without special values: 1 case in 96325).
    std::vector<reference> nearby;
    auto spread = [&](int tensor, std::size_t i) {
        if (nearby.empty()) {
            std::mt19937_64 rng(0x9e3779b97f4a7c15ull);
            for (int k = 0; k < 4; ++k) {
                case_data moved = c;
                for (std::size_t l = 0; l < moved.in.size(); ++l)
                    for (double& x : moved.in[l])
                        if (!g.leaves[l].ids) x *= 1 + ((rng() & 1) ? 4 : -4) * 0x1p-24;
                nearby.push_back(run_torch(g, moved, 1e-3, torch::kFloat64));
            }
        }
        const double e = exact_value(tensor, i);
        double d = 0;
        for (const reference& r : nearby) {
            const double v = tensor < 0 ? r.loss : r.grads[std::size_t(tensor)][i];
            if (!std::isfinite(v)) return 0.0;  // no allowance at an overflow's edge
            d = std::max(d, std::abs(v - e));
        }
        return d;
    };
    auto check = [&](const char* what, int tensor, const std::vector<double>& want, auto&& got_at, double floor = 0,
                     double noise = 0) {
        double scale = floor / rtol;
        for (double w : want)
            if (std::isfinite(w)) scale = std::max(scale, std::abs(w));
        for (std::size_t i = 0; i < want.size(); ++i) {
            const double got = double(got_at(i));
            // NaN-ness and infinities exactly; finite values relative to the largest finite one
            const bool interchangeable = ref.overflow_ambiguous && ((std::isnan(want[i]) && std::isinf(got)) ||
                                                                    (std::isinf(want[i]) && std::isnan(got)) ||
                                                                    (std::isinf(want[i]) && std::isfinite(got)) ||
                                                                    (std::isfinite(want[i]) && std::isinf(got)));
            double err = interchangeable       ? 0.0
                         : std::isnan(want[i]) ? (std::isnan(got) ? 0.0 : INFINITY)
                         : std::isinf(want[i]) ? (got == want[i] ? 0.0 : INFINITY)
                         : std::isfinite(got)  ? std::max(0.0, std::abs(got - want[i]) - subnormal_floor - noise) / (scale + 1e-300)
                                               : INFINITY;
            if (!(err <= rtol) && std::is_same_v<T, float> && std::isfinite(want[i]) && std::isfinite(got)) {
                const double e = exact_value(tensor, i);
                if (std::isfinite(e)) {
                    err = std::min(err, std::max(0.0, std::abs(got - e) - subnormal_floor - noise) / (scale + 1e-300));
                    const double f = float_value(tensor, i);
                    if (std::isfinite(f) && std::abs(got - e) <= 2 * std::abs(f - e)) err = 0;  // as close as LibTorch's float run
                    if (!(err <= rtol) && std::abs(got - e) <= 2 * spread(tensor, i)) err = 0;
                }
            }
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
    check("loss", -1, {ref.loss}, [&](std::size_t) { return loss; }, floor);
    std::size_t k = 0;
    for (std::size_t i = 0; i < g.leaves.size(); ++i) {
        if (!g.leaves[i].param) continue;
        const std::string what = std::string("grad ") + g.leaves[i].name;
        check(what.c_str(), int(k), ref.grads[k], [&](std::size_t j) { return grads[k][j]; }, 0,
              (special && i < ref.grad_noise.size() ? ref.grad_noise[i] : 0.0) + (i < ref.grad_floor.size() ? ref.grad_floor[i] * (std::is_same_v<T, float> ? 0x1p-24 : 0x1p-53) : 0.0));
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
    const long autocast_cases = env_long("TYPEGRAD_DIFF_AUTOCAST_CASES", 650);
    if (graphs.empty() && only < 2000) {
        std::printf("no graphs\n");
        return 1;
    }
    // A generated graph is compiled in one dtype (generate.py: even generator indices double, odd
    // float), a hand-written one in both: the cases are shared out over (graph, dtype) pairs.
    long pairs = 0;
    for (const auto& g : graphs) pairs += (g.f64 != nullptr) + (g.f32 != nullptr);
    const long total = env_long("TYPEGRAD_DIFF_CASES", 1600);
    const long per_graph = pairs == 0 ? 0 : std::max(1L, (total + pairs - 1) / pairs);
    const long special_total = env_long("TYPEGRAD_DIFF_SPECIAL_CASES", 800);
    const long per_graph_special = pairs == 0 || special_total <= 0 ? 0 : std::max(1L, (special_total + pairs - 1) / pairs);
    tally t;
    for (const auto& g : graphs) {
        if (g.f64 != nullptr) {
            run_graph<double>(g, per_graph, false, t);
            run_graph<double>(g, per_graph_special, true, t);
        }
        if (g.f32 != nullptr) {
            run_graph<float>(g, per_graph, false, t);
            run_graph<float>(g, per_graph_special, true, t);
        }
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
