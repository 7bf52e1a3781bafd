// Differential test of autocast: every generated autocast graph (generated/autocast_*.cpp) under
// tg::autocast<tg::cpu_bf16> against the same program run by LibTorch with CPU autocast (bf16),
// at random points and sizes, with f32 and bf16 leaves. Compared per case:
//   - the dtype of every node (typegrad's, read from the region's types, against the tensor
//     LibTorch's autocast produced): exact;
//   - the loss and every gradient, element by element: within rtol_autocast of LibTorch's autocast,
//     or within rtol_semantic of the semantic reference: the same program in f64 (LibTorch
//     autograd), rounded to bf16 wherever typegrad's documented semantics round (every op of dtype
//     bf16 rounds its result once, computed in float; every bf16 node's adjoint is cast to bf16;
//     the VJPs of bf16 ops round like the ops they are made of). It is what typegrad should compute
//     if it does what it documents, independently of where LibTorch's CPU kernels round.
// The backward policies: same_as_forward (typegrad's default) is LibTorch's backward() called
// inside the autocast region (the engine runs on the calling thread, autocast applies to the
// backward's matmuls); backward_autocast::off is backward() called after the region is left.
//
// Where typegrad's documented dtype rules differ from PyTorch's, the LibTorch program follows
// typegrad's rule explicitly (casting the operands to the dtype typegrad gives the op), and the
// harness counts each such node (docs/reliability.md):
//   zero-dim: PyTorch lets a dimensioned tensor's dtype win over a 0-dim tensor's of the same
//     category (bf16 matrix * f32 scalar tensor is bf16); typegrad promotes by dtype only (f32).
//   where-condition: typegrad's masks are 0/1 tensors of their operands' dtype, and where
//     promotes over condition and values; PyTorch's bool condition takes no part.
//   mixed-dtype norm: typegrad's layer_norm promotes over input, weight and bias (ops/norm.hpp);
//     LibTorch 1.13's CPU layer_norm rejects mixed dtypes, and PyTorch 2's mixed-type CPU kernel
//     returns the input's dtype (a bf16 input with f32 weights gives bf16, typegrad f32).
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "autocast_registry.hpp"
#include "conv_reference.hpp"
#include "dropout_mask.hpp"
#include "prod_reference.hpp"

namespace diff = typegrad_differential;

namespace {

// Against LibTorch's autocast: bf16 keeps 8 significant bits, one rounding is a relative error up
// to 2^-9 = 2e-3, and LibTorch 1.13's CPU kernels round at other places than typegrad (its bf16
// mm and dot accumulate in bf16, rounding every product and partial sum; its softmax and
// tanh_backward are fused and round once), so values near a rounding boundary round differently
// and the differences are carried and amplified through further bf16 ops. 3e-2 (about 8 bf16 ulps
// of the tensor's largest element) passes well-conditioned graphs; the loss also gets an absolute
// floor of 8 bf16 ulps of the largest intermediate value. An ill-conditioned graph (a cancelling
// sum of bf16 terms, sigmoid of a large argument) can differ by far more, and for those only the
// semantic reference below can say whether typegrad is right.
constexpr double rtol_autocast = 3e-2;
// Against the semantic reference (run_torch, torch_mode::semantic): the same bf16 roundings, at
// the same places, of the same values; only the arithmetic between two roundings differs (typegrad
// f32, the reference f64). A rounded value is therefore identical in both unless the exact value
// lies within the f32 error (a few 2^-24 relative per op, up to 289 * 2^-24 for the longest sum
// here, 17 x 17 elements) of a bf16 rounding boundary; then it differs by one bf16 ulp, at most
// 2^-7 of its magnitude. The bound allows that for the tensor's largest element: one flip at the
// final rounding (2^-7), the f32 terms (at most 289 * 2^-24 = 1.7e-5 of a sum's terms) being far
// below it. Upstream flips carried through a cancellation could exceed it: the case then has to
// pass against LibTorch or it is reported. In 20114 cases the largest difference seen was 1.8e-4
// (docs/reliability.md): no flip at a tensor's scale at all.
constexpr double rtol_semantic = 0x1p-7;
// Element by element the bound has to allow a flip, and so it cannot see a rounding that typegrad
// skips or adds (that moves a value by at most half an ulp). Over many cases it can: without
// flips the two sides differ by f32 arithmetic only, 289 * 2^-24 = 2^-15.8 of a sum's terms at
// most, below semantic_noise = 2^-12 (1/16 ulp) unless a cancellation amplifies it 8-fold. A flip
// needs a value within about 2^-24 relative of a bf16 rounding boundary (boundaries are one ulp,
// 2^-8 or more relative, apart): about 2^-15 per rounded element, and a case rounds at most a few
// hundred elements (up to 17 x 17 per op, a few ops), so at most about 1% of cases can hold one.
// More than max_beyond_noise of a policy's cases beyond semantic_noise fails the run.
constexpr double semantic_noise = 0x1p-12;
constexpr double max_beyond_noise = 0.01;
constexpr double kink_tol = 3e-2;
constexpr std::size_t sizes[] = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17};

struct ac_case {
    std::vector<std::size_t> vars;
    diff::extents ext;
    std::vector<std::vector<double>> in;  // values of each leaf's dtype
    int policy = diff::policy_same_as_forward;
    bool special = false;  // special values (issue 17): see make_case
};

std::string leaf_dtype(const diff::autocast_graph_def& g, std::size_t i) {
    std::istringstream lines(g.program);
    std::string line;
    for (std::size_t k = 0; std::getline(lines, line); ++k)
        if (k == i) return line.substr(line.rfind(' ') + 1);
    throw std::runtime_error("autocast differential: no leaf line");
}

// Special values (issue 17), as the plain differential draws them (differential_main.cpp) in the
// range that f32 and bf16 share: +-0, +-inf, NaN, +-1, subnormals, +-1e20 (whose squares
// overflow), 88.5 and -90 (exp near the largest value, and subnormal), or a copy of an earlier
// element (ties), in place of about a third of the elements, ignoring the generator's domain
// bounds. (Values near the largest float, as the plain test draws them, would make nearly every
// case "near overflow" here: matmuls sum their products.)
// Subnormals only with TYPEGRAD_DIFF_AUTOCAST_SUBNORMALS=1: typegrad's bf16 GEMM (vdpbf16ps)
// reads subnormal bf16 operands as 0 (docs/reliability.md, finding 17, open).
constexpr double special_pool[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 1.0, -1.0,
                                   1e20, -1e20, 88.5, -90.0, 1e-40, -1e-40};
constexpr std::size_t special_pool_normal = 11;  // the entries before the subnormals

ac_case make_case(const diff::autocast_graph_def& g, const std::vector<std::size_t>& vars, std::uint64_t seed, int policy,
                  bool special = false) {
    ac_case c;
    c.vars = vars;
    c.policy = policy;
    c.special = special;
    std::mt19937_64 rng(seed);
    for (std::size_t i = 0; i < g.leaves.size(); ++i) {
        const auto& l = g.leaves[i];
        std::array<std::size_t, 3> e{};
        std::size_t n = 1;
        for (int a = 0; a < l.rank; ++a) {
            e[a] = l.ext[a] >= 0 ? std::size_t(l.ext[a]) : vars[std::size_t(-1 - l.ext[a])];
            n *= e[a];
        }
        const bool bf = leaf_dtype(g, i) == "bf16";
        std::uniform_real_distribution<double> d(l.lo, l.hi);
        std::vector<double> v(n);
        if (l.ids) {  // integers in [lo, hi]; never special
            std::uniform_int_distribution<long> di(long(l.lo), long(l.hi));
            for (double& x : v) x = double(di(rng));
        } else {
            for (double& x : v) x = bf ? double(float(typegrad::bf16(float(d(rng))))) : double(float(d(rng)));
        }
        if (special && !l.ids)
            for (std::size_t j = 0; j < n; ++j) {
                const auto r = rng() % 6;
                if (r == 0 || r == 1) {
                    static const bool subnormals = [] {
                        const char* e = std::getenv("TYPEGRAD_DIFF_AUTOCAST_SUBNORMALS");
                        return e && std::atol(e) != 0;
                    }();
                    const double s = special_pool[rng() % (subnormals ? std::size(special_pool) : special_pool_normal)];
                    v[j] = bf ? double(float(typegrad::bf16(float(s)))) : double(float(s));
                } else if (r == 2 && j > 0) {
                    v[j] = v[rng() % j];
                }
            }
        c.ext.push_back(e);
        c.in.push_back(std::move(v));
    }
    return c;
}

const char* dtype_name(at::ScalarType t) {
    return t == at::kFloat ? "f32" : t == at::kBFloat16 ? "bf16" : t == at::kDouble ? "f64" : t == at::kLong ? "i64" : "?";
}

// typegrad's promotion in the float family: f32 if any operand is f32 (ranks play no part).
at::ScalarType tg_promote(std::initializer_list<at::ScalarType> ts) {
    for (auto t : ts)
        if (t == at::kFloat) return at::kFloat;
    return at::kBFloat16;
}

struct ac_reference {
    double loss = 0;
    std::vector<std::vector<double>> grads;
    std::vector<std::string> dtypes;
    bool near_kink = false;
    double magnitude = 0;
    double product_magnitude = 0;  // special values: the largest |a| |b| of a matmul's operands
    bool ill_conditioned = false;  // special values: a log_sum_exp/softmax of values beyond 1.6e4
    long zero_dim = 0, where_cond = 0, mixed_norm = 0;  // nodes where the program follows typegrad's rule
};

// The largest finite |element| (special values: NaN and inf are compared by class, not by scale).
double finite_abs_max(const torch::Tensor& t) {
    const auto m = t.detach().to(at::kDouble).abs();
    return m.masked_fill(~torch::isfinite(m), 0).max().item<double>();
}

void note_margin(ac_reference& ref, const torch::Tensor& margin, const torch::Tensor& scale) {
    const auto m = margin.detach().to(at::kDouble).abs();
    const auto near = (m > 0) & (m < kink_tol * (scale.detach().to(at::kDouble).abs() + 1));
    if (near.any().item<bool>()) ref.near_kink = true;
}

// Operand of a line: a node, or a constant (a Scalar: weak, like tg::lit).
struct operand {
    torch::Tensor t;
    double c = 0;
    bool is_const = false;
};

// A double tensor's values rounded to bf16 (via float, as typegrad computes in float and rounds).
torch::Tensor to_bf16(const torch::Tensor& t) { return t.to(at::kFloat).to(at::kBFloat16).to(at::kDouble); }

// The semantic reference rounds with these (double tensors holding bf16 values where rounded).
// round_bf16: the value rounded to bf16 (via float, as typegrad computes in float and rounds), and
// its incoming gradient rounded too: a node of typegrad dtype bf16 (its adjoint is cast to the
// node's dtype, reverse.hpp), or a cast to bf16 in front of a lower-precision op.
struct round_bf16 : torch::autograd::Function<round_bf16> {
    static torch::Tensor forward(torch::autograd::AutogradContext*, const torch::Tensor& x) {
        return to_bf16(x);
    }
    static torch::autograd::variable_list backward(torch::autograd::AutogradContext*, torch::autograd::variable_list g) {
        return {to_bf16(g[0])};
    }
};
// round_bf16_grad: the value unchanged, the incoming gradient rounded (an f32 adjoint that a bf16
// backward matmul casts to bf16).
struct round_bf16_grad : torch::autograd::Function<round_bf16_grad> {
    static torch::Tensor forward(torch::autograd::AutogradContext*, const torch::Tensor& x) { return x.clone(); }
    static torch::autograd::variable_list backward(torch::autograd::AutogradContext*, torch::autograd::variable_list g) {
        return {to_bf16(g[0])};
    }
};

// The value of one tensor with the gradient of another: value_of_grad_of(v, t) is v, and passes
// its incoming gradient to t. (t + (v - t).detach() is NaN wherever t is infinite: graph 2096's
// disabled matmul, whose +inf row then tied with its NaN row in max and took half the gradient.)
struct value_of_grad_of : torch::autograd::Function<value_of_grad_of> {
    static torch::Tensor forward(torch::autograd::AutogradContext*, const torch::Tensor& value, const torch::Tensor&) {
        return value.clone();
    }
    static torch::autograd::variable_list backward(torch::autograd::AutogradContext*, torch::autograd::variable_list g) {
        return {torch::Tensor(), g[0]};
    }
};

// A unary op of typegrad dtype bf16 in the semantic reference: the result rounded, and the VJP
// typegrad's formula (ops/exp_log.hpp, trig.hpp, piecewise.hpp) on the rounded result, each of
// its bf16 ops rounding (tanh: g (1 - out out) is three roundings; LibTorch's fused tanh_backward
// rounds once). The derivative itself is written here independently of typegrad.
struct bf16_unary : torch::autograd::Function<bf16_unary> {
    static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, std::string op, double c) {
        torch::Tensor out;
        if (op == "exp") out = torch::exp(x);
        else if (op == "log") out = torch::log(x);
        else if (op == "sqrt") out = torch::sqrt(x);
        else if (op == "square") out = x * x;
        else if (op == "sin") out = torch::sin(x);
        else if (op == "cos") out = torch::cos(x);
        else if (op == "tanh") out = torch::tanh(x);
        else if (op == "sigmoid") out = torch::sigmoid(x);
        else if (op == "powc") out = torch::pow(x, c);
        else throw std::runtime_error("autocast differential: bf16_unary " + op);
        out = to_bf16(out);
        ctx->save_for_backward({x, out});
        ctx->saved_data["op"] = op;
        ctx->saved_data["c"] = c;
        return out;
    }
    static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list gs) {
        const auto saved = ctx->get_saved_variables();
        const torch::Tensor &x = saved[0], &out = saved[1], &g = gs[0];
        const std::string op = ctx->saved_data["op"].toStringRef();
        const double c = ctx->saved_data["c"].toDouble();
        auto R = to_bf16;
        torch::Tensor d;
        if (op == "exp") d = g * out;
        else if (op == "log") d = g / x;
        else if (op == "sqrt") d = g * R(0.5 / out);
        else if (op == "square") d = g * R(x * 2);
        else if (op == "sin") d = g * R(torch::cos(x));
        else if (op == "cos") d = -R(g * R(torch::sin(x)));
        else if (op == "tanh") d = g * R(1 - R(out * out));
        else if (op == "sigmoid") d = g * R(out * R(1 - out));
        else d = g * R(c * R(torch::pow(x, c - 1)));  // powc (c - 1 exact: the constants are bf16 values)
        return {R(d), torch::Tensor(), torch::Tensor()};
    }
};

// An activation of typegrad dtype bf16 in the semantic reference (ops/activation.hpp,
// special.hpp): the result rounded, and the VJP typegrad's composite on the rounded input, every
// bf16 op of it rounding its result, its constants applied in f32 (as typegrad's fused loops
// and PyTorch's opmath do: a bf16 x times lit<0.3989...> is x * 0.39894228f rounded once; the
// model rounded them to bf16 until graph 2081's drift showed gelu's 0.3989 differ). c0, c1:
// the op's constants (softplus's beta, leaky_relu's slope, elu's alpha, clamp's bounds). The
// derivatives are written here from the formulas, independently of typegrad's code.
struct bf16_activation : torch::autograd::Function<bf16_activation> {
    static double Rc(double c) { return double(float(c)); }
    static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, std::string op, double c0,
                                 double c1) {
        torch::Tensor out;
        if (op == "erf") out = torch::erf(x);
        else if (op == "log1p") out = torch::log1p(x);
        else if (op == "expm1") out = torch::expm1(x);
        else if (op == "gelu") out = x * 0.5 * (1 + torch::erf(x * 0.70710678118654752440));
        else if (op == "gelu_tanh") out = 0.5 * x * (1 + torch::tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x)));
        else if (op == "silu") out = x / (1 + torch::exp(-x));
        else if (op == "softplus") out = torch::where(x * c0 > 20, x, torch::log1p(torch::exp(x * c0)) / c0);
        else if (op == "leaky_relu") out = torch::where(x > 0, x, x * Rc(c0));
        else if (op == "elu") out = torch::where(x > 0, x, c0 * torch::expm1(x));
        else if (op == "clamp") out = torch::clamp(x, c0, c1);
        else throw std::runtime_error("autocast differential: bf16_activation " + op);
        out = to_bf16(out);
        ctx->save_for_backward({x, out});
        ctx->saved_data["op"] = op;
        ctx->saved_data["c0"] = c0;
        ctx->saved_data["c1"] = c1;
        return out;
    }
    static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list gs) {
        const auto saved = ctx->get_saved_variables();
        const torch::Tensor &x = saved[0], &out = saved[1], &g = gs[0];
        const std::string op = ctx->saved_data["op"].toStringRef();
        const double c0 = ctx->saved_data["c0"].toDouble(), c1 = ctx->saved_data["c1"].toDouble();
        auto R = to_bf16;
        torch::Tensor d;
        if (op == "erf") d = g * R(R(torch::exp(-R(x * x))) * Rc(1.12837916709551257390));
        else if (op == "log1p") d = g / R(x + 1);
        else if (op == "expm1") d = g * R(out + 1);
        else if (op == "gelu") {
            const auto left = R(Rc(0.5) * R(1 + R(torch::erf(R(x * Rc(0.70710678118654752440))))));
            const auto right = R(R(x * R(torch::exp(R(R(x * x) * Rc(-0.5))))) * Rc(0.39894228040143267794));
            d = g * R(left + right);
        } else if (op == "gelu_tanh") {
            const double beta = Rc(0.79788456080286535588), kappa = Rc(0.044715), kappa3 = Rc(3 * 0.044715);
            const auto x2 = R(x * x);
            const auto t = R(torch::tanh(R(R(x + R(R(x * x2) * kappa)) * beta)));
            const auto left = R(Rc(0.5) * R(1 + t));
            const auto right = R(R(R(R(Rc(0.5) * x) * R(1 - R(t * t))) * R(1 + R(x2 * kappa3))) * beta);
            d = g * R(left + right);
        } else if (op == "silu") {
            const auto sg = R(torch::sigmoid(x));
            d = g * R(sg * R(1 + R(x * R(1 - sg))));
        } else if (op == "softplus") {
            const auto z = R(torch::exp(R(x * c0)));
            d = torch::where(R(x * c0) > 20, g, R(g * R(z / R(z + 1))));
        } else if (op == "leaky_relu") d = torch::where(x > 0, g, R(g * Rc(c0)));
        else if (op == "elu") d = torch::where(x <= 0, R(g * R(R(torch::exp(x)) * Rc(c0))), g);
        else d = torch::where((x >= c0) & (x <= c1), g, torch::zeros_like(g));  // clamp
        return {R(d), torch::Tensor(), torch::Tensor(), torch::Tensor()};
    }
};

// a / b of typegrad dtype bf16: d/da = g / b, d/db = -((g out) / b) with out the rounded
// quotient (arithmetic.hpp), each bf16 op rounding; summed down to the operand's shape where
// the op broadcast it (a bf16 reduction: one rounding).
struct bf16_div : torch::autograd::Function<bf16_div> {
    static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& a, const torch::Tensor& b) {
        const auto out = to_bf16(a / b);
        ctx->save_for_backward({a, b, out});
        return out;
    }
    static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list gs) {
        const auto saved = ctx->get_saved_variables();
        const torch::Tensor &a = saved[0], &b = saved[1], &out = saved[2], &g = gs[0];
        auto down = [](const torch::Tensor& t, const torch::Tensor& like) {
            return t.sizes() == like.sizes() ? to_bf16(t) : to_bf16(at::sum_to(to_bf16(t), like.sizes()));
        };
        return {down(g / b, a), down(-to_bf16(to_bf16(g * out) / b), b)};
    }
};

enum class torch_mode {
    autocast,  // LibTorch's CPU autocast (bf16): the reference whose dtypes are compared
    exact,     // the same program in f64 without autocast (reproducers: how far each side is from the truth)
    semantic,  // f64 with typegrad's roundings (see compare): the value typegrad's documented semantics define
};

// semantic needs typegrad's dtype of every node (tg_dtypes).
ac_reference run_torch(const diff::autocast_graph_def& g, const ac_case& c, torch_mode mode = torch_mode::autocast,
                       const std::vector<std::string_view>* tg_dtypes = nullptr) {
    const bool exact = mode != torch_mode::autocast;  // f64, LibTorch's autocast off
    const bool semantic = mode == torch_mode::semantic;
    auto rnd = [](const torch::Tensor& t) { return round_bf16::apply(t); };
    auto rg = [](const torch::Tensor& t) { return round_bf16_grad::apply(t); };
    std::vector<torch::Tensor> nodes, leaves;
    ac_reference ref;
    // semantic: whether the current line's op has typegrad dtype bf16. Its VJP is then a bf16
    // expression too, so the contribution it sends each operand is rounded before the operand
    // sums its contributions (and rounds the sum, when the operand is bf16 itself).
    bool bf_op = false;
    auto is_bf16_node = [&](std::size_t k) { return semantic && tg_dtypes->at(k) == "bf16"; };
    auto node = [&](const std::string& tok) {
        const torch::Tensor& t = nodes.at(std::stoul(tok));
        return bf_op ? rg(t) : t;
    };
    auto get = [&](const std::string& tok) {
        operand o;
        if (tok[0] == 'c') {
            o.is_const = true;
            o.c = std::stod(tok.substr(1));
        } else {
            o.t = node(tok);
        }
        return o;
    };
    // semantic: an operand of a lower-precision op: typegrad's cast<bf16> node of an f32 node (one
    // per node: casts are CSE'd, so the cast's adjoint sums every use and rounds once), the node
    // itself if bf16; and the op's VJP rounds what it sends to it (a bf16 matmul's result).
    std::vector<torch::Tensor> cast_nodes, widen_nodes;  // widen_nodes: see widened
    auto bf16_version = [&](std::size_t k) {  // the node if bf16, else its cast node
        if (is_bf16_node(k)) return nodes.at(k);
        if (cast_nodes.size() <= k) cast_nodes.resize(k + 1);
        if (!cast_nodes[k].defined()) cast_nodes[k] = rnd(nodes.at(k));
        return cast_nodes[k];
    };
    auto lowered = [&](const std::string& tok) { return rg(bf16_version(std::stoul(tok))); };
    // semantic: views of a node's bf16 version (the conv band: unsqueeze, squeeze). In a region
    // casts sit below views (docs/autocast.md): conv2d's operand is unsqueeze<0>(unsqueeze<0>(
    // cast(x))), its cast the matmuls' cast of x. A view of a bf16 node is a bf16 node of its own,
    // one per type, shared by every op that reads it (CSE), so its adjoint sums their
    // contributions and rounds once: `path` names the chain of views ("u0": unsqueeze<0>, then
    // "u00": unsqueeze<0> again, or "u02": unsqueeze<2>), each link a cached round_bf16_grad.
    std::map<std::pair<std::size_t, std::string>, torch::Tensor> bf16_views;
    auto bf16_view = [&](std::size_t k, std::initializer_list<const char*> path) {
        torch::Tensor t = bf16_version(k);
        std::string key;
        for (const char* link : path) {
            key += link;
            torch::Tensor& slot = bf16_views[{k, key}];
            if (!slot.defined()) slot = rg(t);
            t = slot;
        }
        return t;
    };
    // semantic: a bf16 operand of a norm that promotes it to f32: typegrad's widen node, whose VJP
    // casts its adjoint to bf16: one node per operand node (a type: layer_norm(g, g, h) and two
    // norms of one node share it), so its contributions are summed in f32 and rounded once.
    auto widened = [&](const std::string& tok) {
        const std::size_t k = std::stoul(tok);
        if (!is_bf16_node(k)) return nodes.at(k);
        if (widen_nodes.size() <= k) widen_nodes.resize(k + 1);
        if (!widen_nodes[k].defined()) widen_nodes[k] = rg(nodes.at(k));
        return widen_nodes[k];
    };
    // semantic: an operand of an fp32 op (the losses): a bf16 node is cast to f32 by a node whose
    // VJP casts the gradient back to bf16, contribution by contribution.
    std::vector<torch::Tensor> below_view;  // semantic: see matmul
    auto fp32_operand = [&](const std::string& tok) {
        const std::size_t k = std::stoul(tok);
        if (!is_bf16_node(k)) return nodes.at(k);
        return rg(k < below_view.size() && below_view[k].defined() ? below_view[k] : nodes.at(k));
    };
    // semantic, bf16: log_sum_exp over the last axis (keepdim) or all elements, typegrad's
    // composite (log_sum_exp.hpp): a detached shift by the maximum, then x - shift, exp, sum, log,
    // + shift, each a bf16 op that rounds its result and the contributions its VJP sends.
    auto lse_bf16 = [&](const torch::Tensor& x, bool last_axis) {
        const torch::Tensor shift = (last_axis ? std::get<0>(x.max(-1, true)) : x.max()).detach();
        const auto d = rnd(rg(x) - shift);
        const auto e = rnd(bf16_unary::apply(rg(d), "exp", 0.0));
        const auto s = rnd(last_axis ? rg(e).sum(-1, true) : rg(e).sum());
        const auto l = rnd(bf16_unary::apply(rg(s), "log", 0.0));
        return rg(l) + shift;
    };
    // Ties of a max/min: every element against the extreme, not only the runner-up (as the plain
    // harness): LibTorch's vectorised loop and its scalar tail may round copies of one value
    // differently, so that two elements tie where typegrad's three do.
    auto top_gap = [&](const torch::Tensor& t, bool largest) {
        if (t.numel() < 2) return;
        const auto flat = t.detach().to(at::kDouble).reshape({-1});
        const auto extreme = largest ? flat.max() : flat.min();
        note_margin(ref, flat - extreme, extreme);
    };
    // special values: a sum (sum, mean, and the sums inside matmul/linear, forward and backward)
    // over terms that hold both +1e20 and -1e20 cancels them in an order-dependent way: f32
    // accumulation absorbs the O(1) terms next to 1e20 (graph 2019: grad d[2] 0 in typegrad's
    // order, -0.036 in LibTorch's and in the f64 semantic reference; 2016, 2029 alike). Whether
    // they survive depends on the order of the sum, which no reference fixes: ill-conditioned.
    auto note_cancellation = [&](const torch::Tensor& t) {
        if (!c.special) return;
        const auto v = t.detach().to(at::kDouble);
        const auto fin = torch::isfinite(v);
        if ((fin & (v >= 1e15)).any().item<bool>() && (fin & (v <= -1e15)).any().item<bool>()) ref.ill_conditioned = true;
    };
    // special values: the largest product inside a matmul's or convolution's sums (forward and
    // backward), which no node shows (overflow), and cancellations in its operands
    auto note_products = [&](const torch::Tensor& p, const torch::Tensor& q) {
        if (!c.special) return;
        ref.product_magnitude = std::max(ref.product_magnitude, finite_abs_max(p) * finite_abs_max(q));
        note_cancellation(p);
        note_cancellation(q);
    };
    // A norm's input, weight and bias of mixed dtypes: LibTorch 1.13's CPU layer_norm and
    // batch_norm reject them; the program follows typegrad's promotion and counts the node.
    auto follow_norm_promotion = [&](torch::Tensor& v, torch::Tensor& w, torch::Tensor& s) {
        if (exact || (v.scalar_type() == w.scalar_type() && v.scalar_type() == s.scalar_type())) return;
        ++ref.mixed_norm;
        const auto want = tg_promote({v.scalar_type(), w.scalar_type(), s.scalar_type()});
        v = v.to(want);
        w = w.to(want);
        s = s.to(want);
    };
    // special values: the squares of a norm's centred values overflow f32 where the f64
    // reference's do not
    auto note_square_overflow = [&](const torch::Tensor& v) {
        if (!c.special) return;
        const double big = 2 * finite_abs_max(v);
        if (big * big > double(std::numeric_limits<float>::max()) / 16) ref.ill_conditioned = true;
    };
    // The tensor operands of an elementwise op, cast to the dtype typegrad gives the op where
    // PyTorch's own promotion (`natural`) gives another; counted by the reason.
    auto align = [&](torch::Tensor& p, torch::Tensor& q, at::ScalarType natural, at::ScalarType want, long& reason) {
        if (natural == want || exact) return;
        ++reason;
        p = p.to(want);
        q = q.to(want);
    };
    at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
    at::autocast::set_cpu_enabled(!exact);
    std::istringstream lines(g.program);
    std::string line;
    while (std::getline(lines, line)) {
        std::istringstream ts(line);
        std::string op, a, b, x, y;
        ts >> op;
        const bool off = op == "off";
        if (off) {
            ts >> op;
            at::autocast::set_cpu_enabled(false);  // a nested autocast_disabled region
        }
        ts >> a;
        torch::Tensor r;
        bf_op = is_bf16_node(nodes.size()) && op != "leaf";
        // An operand whose f32 rounding error exceeds 1e-3 (|x| above 2^24 * 1e-3 = 1.7e4), as the
        // plain test: special values through lse, softmax, log_softmax (weights exp(x - lse) are
        // meaningless: LibTorch's exp(x - lse) gives two tied 1e20s a weight of 1 each, typegrad's
        // exp(x - max) / sum 1/2), and sin and cos of such an argument, which are noise (graph
        // 2088: layer_norm's weight -1e20, then sin).
        if ((c.special && (op == "lse" || op == "softmax" || op == "log_softmax")) || op == "sin" || op == "cos") {
            if (finite_abs_max(nodes.at(std::stoul(a))) * 0x1p-24 > 1e-3) ref.ill_conditioned = true;
        }
        if (op == "leaf") {
            const std::size_t i = std::stoul(a);
            ts >> b;
            const auto& l = g.leaves[i];
            std::vector<std::int64_t> shape;
            for (int k = 0; k < l.rank; ++k) shape.push_back(std::int64_t(c.ext[i][k]));
            r = torch::tensor(c.in[i], torch::kFloat64);
            if (l.ids) r = r.round().to(at::kLong).reshape(shape);
            else r = r.to(exact ? at::kDouble : b == "bf16" ? at::kBFloat16 : at::kFloat).reshape(shape).detach().requires_grad_(l.param);
            leaves.push_back(r);
        } else if (bf_op && (op == "exp" || op == "log" || op == "sqrt" || op == "square" || op == "sin" || op == "cos" ||
                             op == "tanh" || op == "sigmoid" || op == "powc")) {
            double cst = 0;
            if (op == "powc") {
                ts >> b;
                cst = std::stod(b);
            }
            r = bf16_unary::apply(node(a), op, cst);
        } else if (op == "erf" || op == "log1p" || op == "expm1" || op == "gelu" || op == "gelu_tanh" || op == "silu" ||
                   op == "softplus" || op == "leaky_relu" || op == "elu" || op == "clamp") {
            // the activations (generate_autocast.py, graphs FIRST_ACTIVATION..): their input's dtype
            // under CPU autocast, in typegrad and in LibTorch
            double c0 = 0, c1 = 0;
            if (op == "softplus" || op == "leaky_relu" || op == "elu") ts >> c0;
            if (op == "clamp") ts >> c0 >> c1;
            const torch::Tensor xa = node(a);
            if (op == "leaky_relu" || op == "elu") note_margin(ref, xa, torch::zeros({}));
            if (op == "clamp") {
                note_margin(ref, xa - c0, torch::full({}, c0));
                note_margin(ref, xa - c1, torch::full({}, c1));
            }
            if (bf_op) r = bf16_activation::apply(xa, op, c0, c1);
            else if (op == "erf") r = torch::erf(xa);
            else if (op == "log1p") r = torch::log1p(xa);
            else if (op == "expm1") r = torch::expm1(xa);
            else if (op == "gelu") r = torch::gelu(xa);
            else if (op == "gelu_tanh") r = torch::gelu(xa, "tanh");
            else if (op == "silu") r = torch::silu(xa);
            else if (op == "softplus") r = torch::softplus(xa, c0, 20.0);
            else if (op == "leaky_relu") r = torch::leaky_relu(xa, c0);
            else if (op == "elu") {
                // as the plain test: at a NaN x LibTorch 1.13's vectorised elu_backward takes the
                // negative branch (its test is x > 0) and gives NaN even for a zero gradient, where
                // its scalar loop, its CUDA kernel and typegrad pass the gradient: a NaN x takes the
                // identity here (graph 2088: NaN through a zero gradient into a matmul's operand)
                const auto nan = torch::isnan(xa.detach());
                r = torch::where(nan, xa, torch::elu(torch::where(nan, torch::zeros({}, xa.options()), xa), c0));
            }
            else r = torch::clamp(xa, c0, c1);
        } else if (op == "neg") r = -node(a);
        else if (op == "exp") r = torch::exp(node(a));
        else if (op == "log") r = torch::log(node(a));
        else if (op == "sqrt") r = torch::sqrt(node(a));
        else if (op == "square") r = torch::square(node(a));
        else if (op == "sin") r = torch::sin(node(a));
        else if (op == "cos") r = torch::cos(node(a));
        else if (op == "tanh") r = torch::tanh(node(a));
        else if (op == "sigmoid") r = torch::sigmoid(node(a));
        else if (op == "relu" || op == "abs") {
            note_margin(ref, node(a), torch::zeros({}));
            r = op == "relu" ? torch::relu(node(a)) : torch::abs(node(a));
        } else if (op == "powc") { ts >> b; r = torch::pow(node(a), std::stod(b)); }
        else if (op == "sum") { note_cancellation(node(a)); r = node(a).sum(); }
        else if (op == "mean") {
            note_cancellation(node(a));
            // typegrad's mean is a sum times a count node of the input's dtype (1/n rounded to bf16)
            if (bf_op) r = rg(rnd(node(a).sum())) * double(float(typegrad::bf16(float(1.0 / double(node(a).numel())))));
            else r = node(a).mean();
        }
        else if (op == "max") { top_gap(node(a), true); r = node(a).max(); }
        else if (op == "min") { top_gap(node(a), false); r = node(a).min(); }
        else if (op == "prod") {  // a float op under autocast: LibTorch casts a bf16 input
            if (diff::prod_zero_beside_nonfinite(node(a))) ref.near_kink = true;  // prod_reference.hpp
            if (c.special && diff::prod_order_sensitive(node(a), torch::kFloat32)) ref.ill_conditioned = true;
            r = node(a).prod();
        }
        else if (op == "lse") r = bf_op ? lse_bf16(node(a), false) : torch::logsumexp(node(a).reshape({-1}), 0);
        else if (op == "softmax" || op == "log_softmax") {
            // typegrad: log_softmax = (x - shift) - log(sum(exp(x - shift))) (keepdim, the shift a
            // detached maximum; issue 17), softmax = exp(log_softmax(x)); each a bf16 op
            if (!bf_op) r = op == "softmax" ? torch::softmax(node(a), -1) : torch::log_softmax(node(a), -1);
            else {
                const torch::Tensor x = node(a);
                const torch::Tensor shift = std::get<0>(x.max(-1, true)).detach();
                const auto d = rnd(rg(x) - shift);
                const auto e = rnd(bf16_unary::apply(rg(d), "exp", 0.0));
                const auto l = rnd(bf16_unary::apply(rg(rnd(rg(e).sum(-1, true))), "log", 0.0));
                const auto ls = rg(d) - rg(l);
                r = op == "softmax" ? bf16_unary::apply(rg(rnd(ls)), "exp", 0.0) : ls;
            }
        }
        else if (op == "layer_norm" || op == "rms_norm") {
            // generate.py's norms over the last axis (generate_autocast.py, graphs FIRST_MODEL..):
            // typegrad computes statistics and affine in f32 and rounds the result once to the
            // promoted dtype of input and weights (ops/norm.hpp; the rounding below). A bf16
            // operand is read through a widen node whose VJP casts its adjoint to bf16: one node
            // per operand node (a type: layer_norm(g, g, h) and two norms of one node share it),
            // so its contributions are summed in f32 and rounded once.
            const bool ln = op == "layer_norm";
            ts >> b;
            if (ln) ts >> x;
            torch::Tensor v = widened(a), w = widened(b), s = ln ? widened(x) : torch::Tensor();
            note_square_overflow(v);
            if (ln) {
                follow_norm_promotion(v, w, s);
                r = torch::layer_norm(v, {v.size(-1)}, w, s, 1e-5);
            } else {
                // LibTorch 1.13 has no rms_norm: PyTorch's composite (at::native::rms_norm, 2.4):
                // in f32 for bf16 input, x * rsqrt(mean(x^2) + eps) cast back to x's dtype, times
                // the weight (promoting); eps 1e-6 (generate.py's rms_norm<1, 1e-06>)
                const auto up = exact ? v : v.to(at::kFloat);
                r = (up * torch::rsqrt(up.pow(2).mean(-1, true) + 1e-6)).to(v.scalar_type()) * w;
            }
        } else if (op == "conv1d" || op == "conv1d_b" || op == "conv2d") {
            // the conv band (generate_autocast.py, graphs FIRST_CONV..): conv1d of a [kk, m] node as
            // [1, kk, m] by u [kk, kk, k1] (padding p, bias s [kk] for conv1d_b), squeezed back;
            // conv2d of a 2-D node as [1, 1, H, W] by w [3, 3] as [1, 1, 3, 3] (padding 1; stride 1
            // squeezed back, stride 2 as it is). Lower precision: bf16 under CPU autocast, in
            // typegrad computed in f32 and rounded once (below), like a matmul.
            // Graphs FIRST_CONV2..: conv1d's line ends in its dilation and groups (u [kk, kk / G, k1]).
            const bool one = op != "conv2d";
            std::string bias;
            std::int64_t pad = 1, stride = 1, dil = 1, groups = 1;
            ts >> b;
            if (op == "conv1d_b") ts >> bias;
            ts >> (one ? pad : stride);
            if (one && ts >> dil) ts >> groups;
            const std::size_t xi = std::stoul(a), wi = std::stoul(b);
            torch::Tensor xv, wv, bv;  // x as [N, C, H, W], w as [O, C, KH, KW], bias [O]
            if (semantic) {
                // operands: the bf16 version's views (typegrad: conv1d's unsqueeze<2> of each
                // operand, conv2d's unsqueeze<0> twice); the conv's VJP rounds what it sends them
                xv = rg(one ? bf16_view(xi, {"u0", "u02"}) : bf16_view(xi, {"u0", "u00"}));
                wv = rg(one ? bf16_view(wi, {"u2"}) : bf16_view(wi, {"u0", "u00"}));
                if (!bias.empty()) bv = rg(bf16_view(std::stoul(bias), {"r"}));  // reshape(cast(s))
            } else {
                xv = nodes.at(xi);
                wv = nodes.at(wi);
                if (!bias.empty()) bv = nodes.at(std::stoul(bias));
            }
            xv = one ? xv.unsqueeze(0).unsqueeze(2) : xv.unsqueeze(0).unsqueeze(0);
            wv = one ? wv.unsqueeze(2) : wv.unsqueeze(0).unsqueeze(0);
            note_products(nodes.at(xi), nodes.at(wi));
            const std::int64_t ph = one ? 0 : pad, sh = one ? 1 : stride;
            if (!exact) {  // LibTorch's autocast casts all three to bf16
                r = torch::conv2d(xv, wv, bv, {sh, stride}, {ph, pad}, {1, dil}, groups);
            } else {  // f64: no products with the padding (conv_reference.hpp), as typegrad and oneDNN
                r = diff::conv2d_without_padding_products(xv, wv, sh, stride, ph, pad, 1, dil, groups);
                // typegrad: conv1d(x, u) + reshape(cast(s)), two bf16 ops (the conv rounded, then the sum)
                if (bv.defined()) r = (semantic ? rg(rnd(r)) : r) + bv.reshape({1, -1, 1, 1});
            }
            if (one) r = r.squeeze(2).squeeze(0);
            else if (stride == 1) r = r.squeeze(0).squeeze(0);
        } else if (op == "max_pool2d" || op == "avg_pool2d") {
            // <3, 1, 1> of a 2-D node as [1, 1, H, W], squeezed back: the input's dtype. A bf16
            // input is read through the views conv2d reads it through (bf16_view); an f32 one's
            // views round nothing.
            const std::size_t xi = std::stoul(a);
            torch::Tensor xv = bf_op ? rg(bf16_view(xi, {"u0", "u00"})) : nodes.at(xi);
            if (op == "avg_pool2d") note_cancellation(xv);
            xv = xv.unsqueeze(0).unsqueeze(0);
            r = op == "max_pool2d" ? torch::max_pool2d(xv, 3, 1, 1) : torch::avg_pool2d(xv, 3, 1, 1);
            r = r.squeeze(0).squeeze(0);
        } else if (op == "adaptive_avg_pool2d") {
            // <oh, ow> of a 2-D node as [1, 1, H, W] (graphs FIRST_CONV2..), not squeezed: the
            // input's dtype, read as the pools above read it
            std::int64_t oh, ow;
            ts >> oh >> ow;
            const std::size_t xi = std::stoul(a);
            torch::Tensor xv = bf_op ? rg(bf16_view(xi, {"u0", "u00"})) : nodes.at(xi);
            note_cancellation(xv);
            r = torch::adaptive_avg_pool2d(xv.unsqueeze(0).unsqueeze(0), {oh, ow});
        } else if (op == "sdpa") {
            // q k v causal (graphs FIRST_ATTENTION..): typegrad's fused attention of three 2-D
            // nodes of one dtype, lower precision. LibTorch 1.13 has no such op: written out
            // (matmul, scale, masked softmax, matmul), its matmuls lowered by autocast (scores and
            // probabilities rounded to bf16). The semantic reference is typegrad's documented
            // op: the exact attention of the bf16 operands (each f32 node's cast, the matmuls'
            // too), its output rounded once (below) and each operand's gradient rounded once (the
            // backward computes in f32 and rounds dq, dk and dv, lowered's VJP).
            ts >> b >> x >> y;
            const bool causal = y == "1";
            const torch::Tensor q = semantic ? lowered(a) : node(a), k = semantic ? lowered(b) : node(b),
                                v = semantic ? lowered(x) : node(x);
            note_products(nodes.at(std::stoul(a)), nodes.at(std::stoul(b)));
            note_products(nodes.at(std::stoul(x)), torch::ones({}));  // the probabilities are at most 1
            auto s = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(q.size(-1)));
            const auto above = torch::ones({s.size(-2), s.size(-1)}, torch::TensorOptions().dtype(at::kBool)).triu(1);
            if (causal) s = s.masked_fill(above, -std::numeric_limits<double>::infinity());
            if (c.special) {
                // as the plain harness: a score whose f32 rounding error (u sum|q_c k_c| / sqrt(d))
                // exceeds 1e-3 while it competes (within 40) with the row's largest: which one
                // dominates is the rounding's choice (1e20 times 1e20 overflowing f32 is
                // note_products' matter)
                const auto qa = nodes.at(std::stoul(a)).detach().to(at::kDouble).abs(),
                           ka = nodes.at(std::stoul(b)).detach().to(at::kDouble).abs();
                const auto err = 0x1p-24 / std::sqrt(double(q.size(-1))) *
                                 torch::matmul(qa.masked_fill(~torch::isfinite(qa), 0), ka.masked_fill(~torch::isfinite(ka), 0).t());
                const auto sd = s.detach().to(at::kDouble);
                const auto ok = torch::isfinite(sd);
                const auto top = std::get<0>(sd.masked_fill(~ok, -std::numeric_limits<double>::infinity()).max(-1, true));
                const auto near = ok & (sd + err >= top - 40);
                if (((near.sum(-1) >= 2) & (err.masked_fill(~near, 0).amax(-1) > 1e-3)).any().item<bool>())
                    ref.ill_conditioned = true;
            }
            r = torch::matmul(torch::softmax(s, -1), v);
        } else if (op == "narrow") {  // x axis start length (one-element ids): x's dtype
            std::int64_t axis;
            ts >> axis >> b >> x;
            r = node(a).narrow(axis, nodes.at(std::stoul(b)).item<std::int64_t>(), nodes.at(std::stoul(x)).item<std::int64_t>());
        } else if (op == "argmax" || op == "argmin") {  // y axis, keepdim: i64 ids (a gather's)
            std::int64_t axis;
            ts >> axis;
            const auto v = nodes.at(std::stoul(a)).detach().to(at::kDouble);
            if (v.size(axis) >= 2) {  // the extreme against the runner-up along the axis, as top_gap
                const auto top = std::get<0>(v.topk(2, axis, op == "argmax"));
                note_margin(ref, top.select(axis, 0) - top.select(axis, 1), top.select(axis, 0));
            }
            r = op == "argmax" ? v.argmax(axis, true) : v.argmin(axis, true);
        } else if (op == "batch_norm") {
            // of a [kk, m] node as [1, kk, m] (channels kk, statistics over m), weight p and bias
            // q [kk]; promotes over the three (docs/autocast.md), statistics and affine in f32,
            // rounded once: as layer_norm, a bf16 input read through a widen node, here of its
            // unsqueeze<0> view (shared with conv1d's)
            ts >> b >> x;
            const std::size_t xi = std::stoul(a);
            torch::Tensor v = semantic && is_bf16_node(xi) ? bf16_view(xi, {"u0", "w"}) : nodes.at(xi);
            torch::Tensor w = widened(b), s = widened(x);
            note_square_overflow(v);
            follow_norm_promotion(v, w, s);
            r = torch::batch_norm(v.unsqueeze(0), w, s, {}, {}, true, 0.1, 1e-5, false).squeeze(0);
        } else if (op == "embedding") {  // ids table padding_idx (-1: none): the table's dtype
            std::int64_t pad;
            ts >> b >> pad;
            r = torch::embedding(node(b), nodes.at(std::stoul(a)), pad);
        } else if (op == "index_select" || op == "gather") {  // x axis ids: x's dtype
            std::int64_t axis;
            ts >> axis >> b;
            const auto ids = nodes.at(std::stoul(b));
            r = op == "index_select" ? torch::index_select(node(a), axis, ids) : torch::gather(node(a), axis, ids);
        } else if (op == "dropout") {  // x rng p: x's dtype; typegrad's mask (dropout_mask.hpp)
            double p;
            ts >> b >> p;
            const auto rng = nodes.at(std::stoul(b));
            const auto x = node(a);
            const auto keep = diff::dropout_keep(std::uint64_t(rng[0].item<std::int64_t>()),
                                                 std::uint64_t(rng[1].item<std::int64_t>()), x.numel(), p);
            // PyTorch's dropout: x * (mask / (1 - p)), the factor of x's dtype; the semantic
            // reference's f64 product is rounded once below where typegrad's dtype is bf16
            const auto factor = torch::tensor(keep, torch::kFloat64).reshape(x.sizes()) * (1.0 / (1.0 - p));
            r = x * factor.to(x.scalar_type());
        } else if (op == "cat0" || op == "stack1") {  // cat and stack promote (PyTorch's CPU autocast list)
            // semantic, f32 result, bf16 operand: concat's VJP sends the operand its f32 slice of
            // the adjoint, which the operand sums in f32 with its other contributions and rounds
            // once (its own rounding, below; describe(): add(cast(sin's), concat_part), then
            // cast). stack<1> concatenates unsqueeze<1> views of its operands: a bf16 operand's
            // view is a bf16 node (one per operand node, CSE), so its slices round there first
            // (graph 2094, stack<1>(t, b) with bf16 t and f32 b; graph 2108, cat0 of a bf16
            // matmul that a norm reads too, drifted while cat0's slice was rounded as stack's).
            auto opnd = [&](const std::string& tok) {
                const std::size_t k = std::stoul(tok);
                if (!semantic || bf_op || !is_bf16_node(k)) return node(tok);
                return op == "cat0" ? nodes.at(k) : bf16_view(k, {"u1"});
            };
            ts >> b;
            if (op == "cat0") ts >> x;
            r = op == "cat0" ? torch::cat({opnd(a), opnd(b), opnd(x)}, 0) : torch::stack({opnd(a), opnd(b)}, 1);
        }
        else if (op == "matmul" || op == "matmul_t" || op == "linear") {
            ts >> b;
            const bool bias = op == "linear" && bool(ts >> x);
            auto product = [&](const torch::Tensor& p, const torch::Tensor& q) {
                return op == "linear" ? at::linear(p, q) : torch::matmul(p, op == "matmul_t" ? q.t() : q);
            };
            const bool vectors = op == "matmul" && nodes.at(std::stoul(a)).dim() == 1 && nodes.at(std::stoul(b)).dim() == 1;
            note_products(nodes.at(std::stoul(a)), nodes.at(std::stoul(b)));
            if (!semantic) {
                r = bias ? at::linear(node(a), node(b), node(x)) : product(node(a), node(b));
            } else if (vectors) {
                // typegrad's matmul of two vectors is sum(a * b) of the (cast) operands (matmul.hpp):
                // elementwise products that round to bf16 in a bf16 op, no GEMM, so no lowered backward
                auto prod = off ? node(a) * node(b) : lowered(a) * lowered(b);
                if (bf_op) prod = rg(rnd(prod));
                r = prod.sum();
            } else if (!off) {
                // lower precision: typegrad casts the operands (bias too) to bf16, cast nodes whose
                // adjoints are bf16; the product's own rounding follows below (its dtype is bf16)
                r = product(lowered(a), lowered(b));
                if (bias) r = rg(rnd(r)) + lowered(x);  // typegrad: linear(x, W) + cast(b), two bf16 ops
            } else if (c.policy == diff::policy_off) {
                r = product(node(a), node(b));  // the disabled region: the inputs' dtype, forward and backward
                if (bias) r = (bf_op ? rg(rnd(r)) : r) + node(x);  // two ops, as above
            } else {
                // The disabled region's product under same_as_forward: the forward in the inputs'
                // dtype, the backward's matmuls under the ambient spec (bf16 operands, the adjoint
                // cast to bf16, bf16 results; the bias's gradient is a sum, a promote op, unrounded).
                // The value is the exact product, the gradient that of the rounded one.
                const auto lowered = round_bf16_grad::apply(product(rnd(node(a)), rnd(node(b))));
                torch::Tensor plain;
                {
                    torch::NoGradGuard no_grad;
                    plain = product(node(a), node(b));
                }
                r = value_of_grad_of::apply(plain, lowered);
                if (bias) r = (bf_op ? rg(rnd(r)) : r) + node(x);  // two ops, as above
            }
            if (semantic && !vectors && !bias && (nodes.at(std::stoul(a)).dim() == 1 || nodes.at(std::stoul(b)).dim() == 1)) {
                // typegrad: a 1-D operand is unsqueezed and the GEMM's result squeezed again; the
                // squeeze is a bf16 node of its own (its adjoint rounded), and a cast to f32 (an fp32
                // op's entry) sits below the view, reading the GEMM node: contributions through such
                // a cast reach the GEMM node beside the view's already rounded adjoint.
                if (bf_op) r = rnd(r);  // the GEMM node; the view's rounding follows below
                if (below_view.size() <= nodes.size()) below_view.resize(nodes.size() + 1);
                below_view[nodes.size()] = r;
            }
        } else if (op == "mse") { ts >> b; r = torch::mse_loss(fp32_operand(a), fp32_operand(b)); }
        else if (op == "bce") { ts >> b; r = torch::binary_cross_entropy_with_logits(fp32_operand(a), fp32_operand(b)); }
        else if (op.rfind("where_", 0) == 0 || op.rfind("mask_", 0) == 0) {
            const bool is_where = op[0] == 'w';
            ts >> b >> x;
            const std::string m = op.substr(is_where ? 6 : 5);
            const operand p = get(a), q = get(b);
            const auto pv = p.is_const ? torch::scalar_tensor(p.c) : p.t;
            const auto qv = q.is_const ? torch::scalar_tensor(q.c) : q.t;
            note_margin(ref, pv.to(at::kDouble) - qv.to(at::kDouble), pv);
            // typegrad's mask: 0/1 in its operands' dtype (a constant takes the other's)
            const at::ScalarType mask_dt = exact ? at::kDouble :
                p.is_const ? q.t.scalar_type() : q.is_const ? p.t.scalar_type() : tg_promote({p.t.scalar_type(), q.t.scalar_type()});
            const auto cond = m == "gt" ? pv > qv : m == "ge" ? pv >= qv : m == "lt" ? pv < qv : pv <= qv;
            if (is_where) {
                ts >> y;
                torch::Tensor v = node(x), w = node(y);
                const auto natural = at::result_type(v, w);  // the bool condition takes no part
                const auto by_values = tg_promote({v.scalar_type(), w.scalar_type()});
                align(v, w, natural, tg_promote({mask_dt, by_values}),
                      by_values != natural ? ref.zero_dim : ref.where_cond);
                r = torch::where(cond, v, w);
            } else {
                torch::Tensor mask = cond.to(mask_dt), other = node(x);
                align(mask, other, at::result_type(mask, other), tg_promote({mask_dt, other.scalar_type()}), ref.zero_dim);
                r = mask * other;
            }
        } else {
            ts >> b;
            operand p = get(a), q = get(b);
            if (!p.is_const && !q.is_const)
                align(p.t, q.t, at::result_type(p.t, q.t), tg_promote({p.t.scalar_type(), q.t.scalar_type()}), ref.zero_dim);
            if (op == "maximum" || op == "minimum") {
                const auto pv = p.is_const ? torch::scalar_tensor(p.c) : p.t.to(at::kDouble);
                const auto qv = q.is_const ? torch::scalar_tensor(q.c) : q.t.to(at::kDouble);
                note_margin(ref, pv - qv, pv);
            }
            if (p.is_const && q.is_const) throw std::runtime_error("autocast differential: two constants: " + line);
            if (op == "add") r = p.is_const ? q.t + p.c : q.is_const ? p.t + q.c : p.t + q.t;
            else if (op == "sub") r = p.is_const ? torch::rsub(q.t, p.c) : q.is_const ? p.t - q.c : p.t - q.t;
            else if (op == "mul") r = p.is_const ? q.t * p.c : q.is_const ? p.t * q.c : p.t * q.t;
            else if (op == "div" && bf_op) {
                const auto cst = [](double v) { return torch::scalar_tensor(v, torch::kFloat64); };
                r = bf16_div::apply(p.is_const ? cst(p.c) : p.t, q.is_const ? cst(q.c) : q.t);
            } else if (op == "div") r = p.is_const ? q.t.reciprocal() * p.c : q.is_const ? p.t / q.c : p.t / q.t;  // Python's c / t
            // tg::max(x, lit<c>) is torch.maximum of x and c (a 0-dim tensor of x's dtype: the
            // constants are bf16 values), not clamp_min: at a NaN x maximum passes the whole
            // gradient to x, clamp_min none; at x == c maximum passes half (the reference was
            // clamp until issue 17's autocast special values showed the difference: graphs 2007, 2030)
            else if (op == "maximum" || op == "minimum") {
                const auto cst = [](double v, const torch::Tensor& like) { return torch::scalar_tensor(v, like.options()); };
                const auto pv = p.is_const ? cst(p.c, q.t) : p.t, qv = q.is_const ? cst(q.c, p.t) : q.t;
                r = op == "maximum" ? torch::maximum(pv, qv) : torch::minimum(pv, qv);
            }
            else throw std::runtime_error("autocast differential: unknown op in program: " + line);
        }
        if (off) at::autocast::set_cpu_enabled(!exact);
        // typegrad's rule: every op whose dtype is bf16 rounds its result once (computed in float),
        // and the node's adjoint is cast to its dtype (leaves included: a bf16 leaf's gradient)
        if (semantic && tg_dtypes->at(nodes.size()) == "bf16") r = rnd(r);
        if (r.scalar_type() != at::kLong) {  // (not ids) special values: NaN and inf are compared by class, not by scale
            ref.magnitude = std::max(ref.magnitude, c.special ? finite_abs_max(r) : r.detach().to(at::kDouble).abs().max().item<double>());
        }
        ref.dtypes.push_back(dtype_name(r.scalar_type()));
        nodes.push_back(r);
    }
    torch::Tensor loss = nodes.back();
    ref.loss = loss.detach().to(at::kDouble).item<double>();
    // same_as_forward: backward() inside the region; off: after leaving it
    if (c.policy == diff::policy_off) at::autocast::set_cpu_enabled(false);
    if (loss.requires_grad()) loss.backward();
    at::autocast::set_cpu_enabled(false);
    at::autocast::clear_cache();
    for (std::size_t i = 0; i < g.leaves.size(); ++i) {
        if (!g.leaves[i].param) continue;
        const torch::Tensor gr = leaves[i].grad();
        std::vector<double> v(c.in[i].size(), 0.0);
        if (gr.defined()) {
            const torch::Tensor flat = gr.to(at::kDouble).contiguous().reshape({-1});
            std::copy(flat.data_ptr<double>(), flat.data_ptr<double>() + flat.numel(), v.begin());
        }
        ref.grads.push_back(std::move(v));
    }
    return ref;
}

struct verdict {
    bool ok = true, reference_finite = true, near_kink = false;
    bool near_overflow = false;  // special values: a finite value within 16x of the largest float
    bool by_semantic = false;  // beyond rtol_autocast of LibTorch, within rtol_semantic of the semantic reference
    double worst = 0;           // against LibTorch's autocast, relative to its tensor's largest element
    double worst_semantic = 0;  // against the semantic reference, relative to its tensor's largest element
    long zero_dim = 0, where_cond = 0, mixed_norm = 0;
    std::string detail;
};

verdict compare(const diff::autocast_graph_def& g, const ac_case& c) {
    verdict v;
    const ac_reference ref = run_torch(g, c);
    v.near_kink = ref.near_kink;
    v.zero_dim = ref.zero_dim;
    v.where_cond = ref.where_cond;
    v.mixed_norm = ref.mixed_norm;
    auto finite = [](const std::vector<double>& xs) {
        return std::all_of(xs.begin(), xs.end(), [](double x) { return std::isfinite(x); });
    };
    v.reference_finite = std::isfinite(ref.loss) && std::all_of(ref.grads.begin(), ref.grads.end(), finite);
    // dtypes first: they depend on the graph only, never on a kink
    std::vector<std::string_view> tg_dtypes;
    diff::tensors<double> none;
    g.fn({}, {}, none, c.policy, &tg_dtypes);
    for (std::size_t k = 0; k < ref.dtypes.size(); ++k) {
        if (k < tg_dtypes.size() && tg_dtypes[k] == ref.dtypes[k]) continue;
        std::ostringstream os;
        os << "dtype of node " << k << ": typegrad " << (k < tg_dtypes.size() ? tg_dtypes[k] : "-") << ", LibTorch "
           << ref.dtypes[k];
        v.detail = os.str();
        v.ok = false;
        return v;
    }
    // special values: whether a sum overflows there depends on the order of its terms
    // (of a matmul's products too: f32 accumulation overflows where the f64 reference does not)
    v.near_overflow = c.special && (ref.ill_conditioned ||
                                    std::max(ref.magnitude, ref.product_magnitude) > double(std::numeric_limits<float>::max()) / 16);
    if ((!v.reference_finite && !c.special) || v.near_kink || v.near_overflow) return v;

    diff::tensors<double> grads;
    for (std::size_t i = 0; i < g.leaves.size(); ++i)
        if (g.leaves[i].param) grads.emplace_back();
    const double loss = g.fn(c.in, c.ext, grads, c.policy, nullptr);
    const ac_reference sem = run_torch(g, c, torch_mode::semantic, &tg_dtypes);
    // An element passes if it is within rtol_autocast of LibTorch's autocast (relative to the
    // LibTorch tensor's largest element) or within rtol_semantic of the semantic reference
    // (relative to its largest element; see rtol_semantic).
    // Special values: NaN and infinities (with their sign) must agree with LibTorch's autocast or
    // with the semantic reference; finite values are compared as below, relative to the largest
    // finite element.
    auto kind = [](double x) { return std::isnan(x) ? 0 : x == INFINITY ? 1 : x == -INFINITY ? 2 : 3; };
    auto check = [&](const std::string& what, const std::vector<double>& want, const std::vector<double>& got,
                     const std::vector<double>& sem_want, double floor, double sem_floor) {
        double scale = floor / rtol_autocast, sem_scale = sem_floor / rtol_semantic;
        for (double w : want)
            if (std::isfinite(w)) scale = std::max(scale, std::abs(w));
        for (double w : sem_want)
            if (std::isfinite(w)) sem_scale = std::max(sem_scale, std::abs(w));
        for (std::size_t i = 0; i < want.size(); ++i) {
            if (c.special && (kind(got[i]) != 3 || kind(want[i]) != 3 || kind(sem_want[i]) != 3)) {
                const bool close = kind(got[i]) == 3 &&
                                   ((kind(want[i]) == 3 && std::abs(got[i] - want[i]) <= rtol_autocast * scale) ||
                                    (kind(sem_want[i]) == 3 && std::abs(got[i] - sem_want[i]) <= rtol_semantic * sem_scale));
                if (close || (kind(got[i]) != 3 && (kind(got[i]) == kind(want[i]) || kind(got[i]) == kind(sem_want[i]))))
                    continue;
                if (v.ok) {
                    std::ostringstream os;
                    os.precision(9);
                    os << what << "[" << i << "]: typegrad " << got[i] << ", LibTorch " << want[i]
                       << ", semantic reference " << sem_want[i] << " (special values: NaN and inf must agree)";
                    v.detail = os.str();
                }
                v.ok = false;
                continue;
            }
            const double err = std::isfinite(got[i]) ? std::abs(got[i] - want[i]) / (scale + 1e-300) : INFINITY;
            const double sem_err =
                std::isfinite(got[i]) ? std::abs(got[i] - sem_want[i]) / (sem_scale + 1e-300) : INFINITY;
            const bool zero = scale == 0 && got[i] == 0;
            const bool sem_zero = sem_scale == 0 && got[i] == 0;
            v.worst = std::max(v.worst, zero ? 0.0 : err);
            v.worst_semantic = std::max(v.worst_semantic, sem_zero ? 0.0 : sem_err);
            const bool by_libtorch = err <= rtol_autocast || zero;
            const bool by_semantic = sem_err <= rtol_semantic || sem_zero;
            if (by_libtorch) continue;
            if (by_semantic) {
                v.by_semantic = true;
                continue;
            }
            if (v.ok) {
                std::ostringstream os;
                os.precision(9);
                os << what << "[" << i << "]: typegrad " << got[i] << ", LibTorch " << want[i] << ", semantic reference "
                   << sem_want[i] << " (" << sem_err / 0x1p-8 << " bf16 ulps of its largest element)";
                v.detail = os.str();
            }
            v.ok = false;
        }
    };
    check("loss", {ref.loss}, {loss}, {sem.loss}, 8 * 0x1p-8 * ref.magnitude, 0);
    std::size_t k = 0;
    for (std::size_t i = 0; i < g.leaves.size(); ++i) {
        if (!g.leaves[i].param) continue;
        if (grads[k].size() != ref.grads[k].size()) grads[k].assign(ref.grads[k].size(), NAN);
        check(std::string("grad ") + g.leaves[i].name, ref.grads[k], grads[k], sem.grads[k], 0, 0);
        ++k;
    }
    return v;
}

void print_reproducer(const diff::autocast_graph_def& g, const ac_case& c, const verdict& v) {
    {  // both sides against the f64 value of the same program: which one strays
        std::vector<std::string_view> tg_dtypes;
        diff::tensors<double> none;
        g.fn({}, {}, none, c.policy, &tg_dtypes);
        const ac_reference ac = run_torch(g, c), ex = run_torch(g, c, torch_mode::exact),
                           sem = run_torch(g, c, torch_mode::semantic, &tg_dtypes);
        diff::tensors<double> grads(ac.grads.size());
        const double loss = g.fn(c.in, c.ext, grads, c.policy, nullptr);
        auto dist = [](const std::vector<double>& x, const std::vector<double>& y) {
            double d = 0, s = 0;
            for (std::size_t i = 0; i < y.size(); ++i) {
                d = std::max(d, std::abs(x[i] - y[i]));
                s = std::max(s, std::abs(y[i]));
            }
            return d / (s + 1e-300);
        };
        std::printf("\n(relative to f64, typegrad / LibTorch autocast: loss %.3g / %.3g", dist({loss}, {ex.loss}),
                    dist({ac.loss}, {ex.loss}));
        for (std::size_t k = 0; k < ex.grads.size(); ++k)
            std::printf(", grad %zu %.3g / %.3g", k, dist(grads[k], ex.grads[k]), dist(ac.grads[k], ex.grads[k]));
        std::printf(")\n(relative to the semantic reference, typegrad / LibTorch autocast: loss %.3g / %.3g",
                    dist({loss}, {sem.loss}), dist({ac.loss}, {sem.loss}));
        for (std::size_t k = 0; k < sem.grads.size(); ++k)
            std::printf(", grad %zu %.3g / %.3g", k, dist(grads[k], sem.grads[k]), dist(ac.grads[k], sem.grads[k]));
        std::printf(")");
    }
    std::printf("\n=== MISMATCH: autocast graph %d, cpu/bf16, backward policy %s ===\n%s\n", g.id,
                c.policy == diff::policy_off ? "off (LibTorch: backward() after the region)"
                                             : "same_as_forward (LibTorch: backward() inside the region)",
                v.detail.c_str());
    std::printf("// typegrad:\n%s\n", g.cpp);
    std::printf("// LibTorch program (node per line; \"off\": autocast disabled for that op):\n%s\n", g.program);
    std::vector<std::string_view> tg_dtypes;
    diff::tensors<double> none;
    g.fn({}, {}, none, c.policy, &tg_dtypes);
    std::printf("// typegrad dtypes per node:");
    for (auto d : tg_dtypes) std::printf(" %.*s", int(d.size()), d.data());
    std::printf("\n");
    for (std::size_t i = 0; i < g.leaves.size(); ++i) {
        std::printf("// %s (%s), extents {", g.leaves[i].name, leaf_dtype(g, i).c_str());
        for (int a = 0; a < g.leaves[i].rank; ++a) std::printf("%s%zu", a ? ", " : "", c.ext[i][a]);
        std::printf("}:\nstd::vector<float> %s_data{", g.leaves[i].name);
        for (std::size_t j = 0; j < c.in[i].size(); ++j) std::printf("%s%.9g", j ? ", " : "", c.in[i][j]);
        std::printf("};\n");
    }
}

ac_case shrink(const diff::autocast_graph_def& g, const ac_case& failing, std::uint64_t seed) {
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
        ac_case c = make_case(g, vars, seed, failing.policy, failing.special);
        const verdict v = compare(g, c);
        if ((v.reference_finite || c.special) && !v.near_kink && !v.near_overflow && !v.ok) return c;
    }
    return failing;
}

}  // namespace

long diff::run_autocast_differential(long cases, long only) {
    auto graphs = autocast_registry();
    std::sort(graphs.begin(), graphs.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
    if (only >= 0)
        graphs.erase(std::remove_if(graphs.begin(), graphs.end(), [&](const auto& g) { return g.id != only; }), graphs.end());
    if (graphs.empty() || cases <= 0) return 0;
    const long per_graph = std::max(1L, (cases + long(graphs.size()) - 1) / long(graphs.size()));
    long compared = 0, skipped = 0, kinks = 0, failures = 0, zero_dim = 0, where_cond = 0, mixed_norm = 0, by_semantic = 0;
    // compared cases by their largest distance to the semantic reference, in bf16 ulps (2^-8) of
    // the tensor's largest element: 0, up to 1/16, 1/2, 1, 2, 4, 8, beyond
    long ulp_histogram[8] = {};
    long beyond_noise[2] = {0, 0};  // cases beyond semantic_noise (see below)
    double worst_semantic[2] = {0, 0};
    long per_policy[2] = {0, 0};
    double worst[2] = {0, 0};
    long drifting_graphs = 0;
    for (const auto& g : graphs) {
        bool reported = false;
        long graph_compared = 0, graph_beyond = 0;  // the drift rule per graph (below)
        for (long k = 0; k < per_graph; ++k) {
            const std::uint64_t seed = std::uint64_t(g.id) * 1000003u + std::uint64_t(k) * 7919u + 17u;
            std::mt19937_64 pick(seed);
            std::vector<std::size_t> vars;
            for (int v = 0; v < g.vars; ++v) vars.push_back(sizes[pick() % std::size(sizes)]);
            const int policy = policy_of(g.id);
            const ac_case c = make_case(g, vars, seed, policy);
            const verdict v = compare(g, c);
            zero_dim += v.zero_dim;
            where_cond += v.where_cond;
            mixed_norm += v.mixed_norm;
            if (v.ok && (!v.reference_finite || v.near_kink)) {
                ++(v.near_kink ? kinks : skipped);
                continue;
            }
            ++compared;
            ++per_policy[policy];
            by_semantic += v.ok && v.by_semantic;
            worst[policy] = std::max(worst[policy], v.worst);
            worst_semantic[policy] = std::max(worst_semantic[policy], v.worst_semantic);
            beyond_noise[policy] += v.worst_semantic > semantic_noise;
            ++graph_compared;
            graph_beyond += v.worst_semantic > semantic_noise;
            if (v.worst_semantic > semantic_noise && std::getenv("TYPEGRAD_DIFF_AUTOCAST_DRIFT")) {
                // every case beyond the noise, as a reproducer (the drift rule below counts them)
                std::printf("\nbeyond the f32 noise: autocast graph %d, case %ld, %.3g of the largest element\n", g.id, k,
                            v.worst_semantic);
                print_reproducer(g, c, v);
            }
            {
                const double u = v.worst_semantic / 0x1p-8;
                const double edges[] = {0, 1.0 / 16, 0.5, 1, 2, 4, 8};
                int b = 0;
                while (b < 7 && u > edges[b]) ++b;
                ++ulp_histogram[b];
            }
            if (v.ok) continue;
            ++failures;
            if (!reported) {
                reported = true;
                const ac_case small = shrink(g, c, seed);
                verdict sv = compare(g, small);
                print_reproducer(g, sv.ok ? c : small, sv.ok ? v : sv);
            }
        }
        // Drift per graph: a rounding skipped or added in one op shows in the graphs that hold
        // it, and the rate over all graphs dilutes it (an embedding backward accumulating in
        // bf16 drifted 12 to 37 of 240 cases in three graphs, 0.67% of all cases). Judged where
        // a graph has enough compared cases for a rate to mean something (large runs).
        if (graph_compared >= 100 && double(graph_beyond) > max_beyond_noise * double(graph_compared)) {
            std::printf("\n=== DRIFT: autocast graph %d: %ld of %ld cases differ from the semantic reference by more "
                        "than %.3g of the tensor's largest element (at most %.0f%% may, by rounding flips) ===\n",
                        g.id, graph_beyond, graph_compared, semantic_noise, 100 * max_beyond_noise);
            ++drifting_graphs;
        }
    }
    failures += drifting_graphs;
    std::printf("\nautocast differential (cpu/bf16 against LibTorch CPU autocast): %zu graphs, %ld cases compared "
                "(%ld same_as_forward, %ld off; skipped: %ld with a non-finite reference, %ld within rounding of a "
                "kink), %ld failures; worst difference to LibTorch same_as_forward %.3g, off %.3g (bound %.0e; %ld "
                "cases beyond it passed by the semantic reference); worst difference "
                "to the semantic reference same_as_forward %.3g, off %.3g (bound %.3g); nodes following typegrad's "
                "documented promotion: %ld zero-dim, %ld where-condition, %ld mixed-dtype layer_norm\n",
                graphs.size(), compared, per_policy[0], per_policy[1], skipped, kinks, failures, worst[0], worst[1],
                rtol_autocast, by_semantic, worst_semantic[0], worst_semantic[1], rtol_semantic, zero_dim,
                where_cond, mixed_norm);
    std::printf("autocast differential: compared cases by their largest difference to the semantic reference, in bf16 "
                "ulps (2^-8) of the tensor's largest element: 0: %ld, <=1/16: %ld, <=1/2: %ld, <=1: %ld, <=2: %ld, "
                "<=4: %ld, <=8: %ld, more: %ld\n",
                ulp_histogram[0], ulp_histogram[1], ulp_histogram[2], ulp_histogram[3], ulp_histogram[4],
                ulp_histogram[5], ulp_histogram[6], ulp_histogram[7]);
    // Special values (issue 17): TYPEGRAD_DIFF_AUTOCAST_SPECIAL_CASES cases (default 390, 3 per graph), each
    // graph's policy; see make_case and compare. Not part of the drift statistics below.
    const char* special_env = std::getenv("TYPEGRAD_DIFF_AUTOCAST_SPECIAL_CASES");
    const long special_cases = special_env ? std::atol(special_env) : 390;
    long s_compared = 0, s_nonfinite = 0, s_kinks = 0, s_overflow = 0, s_failures = 0;
    if (special_cases > 0) {
        const long per = std::max(1L, (special_cases + long(graphs.size()) - 1) / long(graphs.size()));
        for (const auto& g : graphs) {
            bool reported = false;
            for (long k = 0; k < per; ++k) {
                const std::uint64_t seed = std::uint64_t(g.id) * 1000003u + std::uint64_t(k) * 7919u + 0x5bd1e995u;
                std::mt19937_64 pick(seed);
                std::vector<std::size_t> vars;
                for (int v = 0; v < g.vars; ++v) vars.push_back(sizes[pick() % std::size(sizes)]);
                const ac_case c = make_case(g, vars, seed, policy_of(g.id), true);
                const verdict v = compare(g, c);
                if (v.ok && (v.near_kink || v.near_overflow)) {
                    ++(v.near_kink ? s_kinks : s_overflow);
                    continue;
                }
                ++s_compared;
                s_nonfinite += !v.reference_finite;
                if (v.ok) continue;
                ++s_failures;
                if (!reported) {
                    reported = true;
                    const ac_case small = shrink(g, c, seed);
                    verdict sv = compare(g, small);
                    print_reproducer(g, sv.ok ? c : small, sv.ok ? v : sv);
                }
            }
        }
        std::printf("autocast special values: %ld cases compared (%ld with NaN or inf in LibTorch's result; skipped: "
                    "%ld within rounding of a kink, %ld near overflow or ill-conditioned), %ld failures\n",
                    s_compared, s_nonfinite, s_kinks, s_overflow, s_failures);
        failures += s_failures;
    }
    // Drift: a rounding that typegrad skips or adds against its documented semantics moves most
    // values by up to half an ulp, below rtol_semantic (one flip) element by element, but it moves
    // many cases beyond the f32 noise; flips, the only legitimate cause, are rare (see
    // semantic_noise). Judged per policy, over enough cases for a rate to mean something.
    for (int p = 0; p < 2; ++p) {
        if (per_policy[p] < 100 || double(beyond_noise[p]) <= max_beyond_noise * double(per_policy[p])) continue;
        std::printf("\n=== DRIFT: %ld of %ld %s cases differ from the semantic reference by more than %.3g of the "
                    "tensor's largest element (f32 noise; at most %.0f%% may, by rounding flips) ===\n",
                    beyond_noise[p], per_policy[p], p == diff::policy_off ? "off" : "same_as_forward", semantic_noise,
                    100 * max_beyond_noise);
        ++failures;
    }
    return failures;
}
