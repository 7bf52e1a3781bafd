// Differential test of issue 15's ops that the line-program interpreters do not know
// (model_ops_graphs.cpp, ids from 2100): each graph against its LibTorch reference below, in
// double, at random points and sizes. Value and every gradient are compared as in
// differential_main.cpp: typegrad double within 1e-10, float within 1e-3, relative to the
// reference tensor's largest element (the float loss with an absolute floor of 1e-4: it is a
// sum of O(1) terms that may cancel). Graphs from 2150 run under tg::autocast<tg::cpu_bf16>
// against LibTorch's CPU autocast (bf16): the dtype of every listed node exactly, the loss and
// the gradients within 3e-2 relative to the largest element (as autocast_harness.cpp's LibTorch
// criterion) of LibTorch's autocast result or of the exact (double, no autocast) value, backward
// inside the autocast region (backward_autocast::same_as_forward).
//
// What the dropout graph (2108) compares: typegrad's dropout against x * m, where m is
// typegrad's own dropout of ones with the same {seed, offset}: that the forward applies one mask
// with PyTorch's scaling 1 / (1 - p), that the backward regenerates the same mask, and that two
// dropouts of one rng draw from one stream. It cannot compare masks with PyTorch's (LibTorch's
// CPU dropout draws from mt19937, typegrad from Philox); the mask's law is checked separately
// below (kept fraction within 5 standard deviations of 1 - p, kept values exactly LibTorch's
// 1 / (1 - p)), and Philox itself by the known-answer test in tests/unit/train.
//
// Environment: TYPEGRAD_DIFF_MODEL_CASES=<n> cases per graph and dtype (default 12),
// TYPEGRAD_DIFF_GRAPH=<id> one graph. Any mismatch fails (exit status 1) with a reproducer.
#include <torch/torch.h>
#include <ATen/autocast_mode.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "model_ops_registry.hpp"

namespace mo = typegrad_differential::model_ops;

namespace {

constexpr double rtol_f64 = 1e-10, rtol_f32 = 1e-3, rtol_autocast = 3e-2;
constexpr std::size_t sizes[] = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17};
using T = torch::Tensor;
using reference = std::function<T(const std::vector<T>& leaves, const std::vector<T>& aux, bool& near_kink)>;

long env_long(const char* name, long fallback) {
    const char* s = std::getenv(name);
    return s != nullptr && *s != '\0' ? std::strtol(s, nullptr, 10) : fallback;
}

// A near-tie of the largest (smallest) two values along dim: float may pick the other one.
void note_tie(bool& kink, const T& x, std::int64_t dim, bool largest) {
    if (x.size(dim) < 2) return;
    const auto top = std::get<0>(x.detach().topk(2, dim, largest));
    const auto gap = (top.select(dim, 0) - top.select(dim, 1)).abs();
    if ((gap < 1e-5 * (top.select(dim, 0).abs() + 1)).any().item<bool>()) kink = true;
}

// F.conv1d / F.conv2d with int parameters (LibTorch's overloads also take a padding string)
T conv1d(const T& x, const T& w, const c10::optional<T>& b, std::int64_t s, std::int64_t p, std::int64_t d, std::int64_t g) {
    const std::vector<std::int64_t> vs{s}, vp{p}, vd{d};
    return torch::conv1d(x, w, b, vs, vp, vd, g);
}
T conv2d(const T& x, const T& w, const c10::optional<T>& b, std::int64_t s, std::int64_t p, std::int64_t d, std::int64_t g) {
    const std::vector<std::int64_t> vs{s, s}, vp{p, p}, vd{d, d};
    return torch::conv2d(x, w, b, vs, vp, vd, g);
}

// h_0 = b_0, h_t = a h_{t-1} + b_t along dim, a broadcast against one step of b: the loop a user
// of LibTorch writes (it has no linear-recurrence op)
T recurrence(const T& a, const T& b, std::int64_t dim) {
    std::vector<T> hs{b.select(dim, 0)};
    for (std::int64_t t = 1; t < b.size(dim); ++t) hs.push_back(a * hs.back() + b.select(dim, t));
    return torch::stack(hs, dim);
}

const std::map<int, reference>& references() {
    static const std::map<int, reference> refs = {
        {2100, [](const std::vector<T>& L, const std::vector<T>&, bool&) {
             return (conv2d(L[0], L[1], L[2], 2, 1, 2, 2).tanh() * L[3]).sum();
         }},
        {2101, [](const std::vector<T>& L, const std::vector<T>&, bool&) {
             return conv1d(L[0], L[1], c10::nullopt, 1, 2, 3, 3).square().sum() + conv1d(L[0], L[2], c10::nullopt, 2, 0, 1, 3).exp().sum();
         }},
        {2102, [](const std::vector<T>& L, const std::vector<T>&, bool&) {
             return torch::adaptive_avg_pool2d(conv2d(L[0], L[1], c10::nullopt, 1, 1, 1, 4), {3, 2}).square().sum() +
                    torch::adaptive_avg_pool2d(L[0], {1, 1}).sin().sum();
         }},
        {2103, [](const std::vector<T>& L, const std::vector<T>&, bool&) {
             return (torch::adaptive_avg_pool2d(L[0], {4, 3}) * L[1]).sum() + torch::adaptive_avg_pool2d(L[0], {2, 5}).square().sum();
         }},
        {2104, [](const std::vector<T>& L, const std::vector<T>&, bool&) {
             return (torch::embedding(L[1], L[0], 2).tanh() * L[2]).sum() + torch::embedding(L[1], L[0]).square().sum();
         }},
        {2105, [](const std::vector<T>& L, const std::vector<T>&, bool&) {
             return L[0].index_select(0, L[1]).square().sum() + L[0].index_select(-1, L[2]).cos().sum() +
                    L[0].gather(1, L[3]).exp().sum();
         }},
        {2106, [](const std::vector<T>& L, const std::vector<T>&, bool& kink) {
             const T& x = L[0];
             note_tie(kink, x, 1, true);
             note_tie(kink, x, 0, false);
             note_tie(kink, x.reshape({-1}), 0, true);
             return (x * x).gather(1, x.argmax(1, true)).sum() + x.sin().gather(0, x.argmin(0, true)).sum() +
                    x.reshape({-1}).narrow(0, x.argmax().item<std::int64_t>(), 1).exp().sum();
         }},
        {2107, [](const std::vector<T>& L, const std::vector<T>&, bool&) {
             std::int64_t s = L[3].item<std::int64_t>();
             if (s < 0) s += L[1].size(1);
             return torch::cat({L[0], L[1].narrow(1, s, 4)}, 1).square().sum() + torch::stack({L[0], L[1]}, 2).sin().sum() +
                    torch::cat({L[2], L[0], L[2]}, 0).exp().sum();
         }},
        {2108, [](const std::vector<T>& L, const std::vector<T>& aux, bool&) {
             const auto m3 = aux[0].reshape_as(L[0]), m5 = aux[1].reshape_as(L[0]);
             return ((L[0] * m3).square() * L[1]).sum() + (L[0].sin() * m5).sum();
         }},
        {2109, [](const std::vector<T>& L, const std::vector<T>&, bool&) {
             const T& x = L[0];
             const auto rms = x / torch::sqrt((x * x).mean({-2, -1}, true) + 1e-6);
             return (torch::layer_norm(x, {3, 4}, {}, {}, 1e-5) * L[1]).sum() + rms.square().sum() +
                    (torch::batch_norm(x, L[4], L[5], L[2], L[3], false, 0.1, 1e-5, false).tanh() * L[1]).sum();
         }},
        {2110, [](const std::vector<T>& L, const std::vector<T>&, bool&) {
             const auto s = torch::matmul(L[0], L[1].transpose(-2, -1)) * 0.3 + L[3];
             return (torch::matmul(torch::softmax(s, -1), L[2]) * L[4]).sum();
         }},
        {2111, [](const std::vector<T>& L, const std::vector<T>&, bool&) {
             return ((L[0] + 1).relu().prod(1) * L[1]).sum() + L[0].prod(0, true).square().sum();
         }},
        // autocast: the reference's result is {loss, listed nodes...} stacked in a vector by run_autocast
        {2150, [](const std::vector<T>& L, const std::vector<T>&, bool&) {
             const auto y0 = conv2d(L[0], L[1], c10::nullopt, 1, 2, 2, 2);
             const auto y = conv2d(L[0], L[1], L[2], 1, 2, 2, 2);
             const auto loss = y.square().sum();
             return torch::stack({loss.to(torch::kFloat), torch::scalar_tensor(double(int(y0.scalar_type()))),
                                  torch::scalar_tensor(double(int(y.scalar_type()))),
                                  torch::scalar_tensor(double(int(loss.scalar_type())))});
         }},
        {2151, [](const std::vector<T>& L, const std::vector<T>&, bool&) {
             const auto e = torch::embedding(L[1], L[0]);
             const auto h = torch::matmul(e, L[2]);
             const auto c = torch::cat({h, e}, 1);
             const auto s = conv1d(e.t().unsqueeze(0), L[3], c10::nullopt, 1, 1, 2, 2);
             const auto loss = c.square().sum() + s.tanh().mean();
             return torch::stack({loss.to(torch::kFloat), torch::scalar_tensor(double(int(e.scalar_type()))),
                                  torch::scalar_tensor(double(int(h.scalar_type()))),
                                  torch::scalar_tensor(double(int(c.scalar_type()))),
                                  torch::scalar_tensor(double(int(s.scalar_type()))),
                                  torch::scalar_tensor(double(int(loss.scalar_type())))});
         }},
        {2112, [](const std::vector<T>& L, const std::vector<T>&, bool&) {
             return recurrence(L[0], L[1], 1).tanh().sum() + torch::cumsum(L[1], 0).square().sum() +
                    torch::cumsum(L[1], -1).sin().sum();
         }},
        {2113, [](const std::vector<T>& L, const std::vector<T>&, bool&) {
             std::int64_t s = L[1].item<std::int64_t>();
             if (s < 0) s += L[0].size(1);
             const auto w = L[0].narrow(1, s, L[2].item<std::int64_t>());
             return (w.square() * w.sin()).sum() + L[0].narrow(0, L[3].item<std::int64_t>(), L[4].item<std::int64_t>()).exp().sum();
         }},
        {2153, [](const std::vector<T>& L, const std::vector<T>&, bool&) {
             const auto h = torch::matmul(L[0], L[1]);
             const auto c = torch::cumsum(h, 0);
             const auto r = recurrence(L[2], h, 0);
             const auto loss = c.square().sum() + r.tanh().sum();
             std::vector<T> out{loss.to(torch::kFloat)};
             for (const T* t : {&h, &c, &r, &loss}) out.push_back(torch::scalar_tensor(double(int(t->scalar_type()))));
             return torch::stack(out);
         }},
        {2155, [](const std::vector<T>& L, const std::vector<T>&, bool&) {
             const auto h = torch::matmul(L[0], L[1]);
             const auto rows = h.narrow(0, L[2].item<std::int64_t>(), L[3].item<std::int64_t>());
             const auto cols = h.narrow(1, L[2].item<std::int64_t>(), L[4].item<std::int64_t>());
             const auto loss = rows.square().sum() + cols.tanh().sum();
             std::vector<T> out{loss.to(torch::kFloat)};
             for (const T* t : {&h, &rows, &cols, &loss}) out.push_back(torch::scalar_tensor(double(int(t->scalar_type()))));
             return torch::stack(out);
         }},
        {2154, [](const std::vector<T>& L, const std::vector<T>&, bool&) {
             const auto s = torch::matmul(L[0], L[1].transpose(-2, -1)) / std::sqrt(8.0);
             const auto keep = torch::ones({s.size(-2), s.size(-1)}, torch::TensorOptions().dtype(torch::kBool)).tril();
             const auto o = torch::matmul(torch::softmax(s.masked_fill(keep.logical_not(), -std::numeric_limits<double>::infinity()), -1), L[2]);
             const auto loss = o.square().sum();
             return torch::stack({loss.to(torch::kFloat), torch::scalar_tensor(double(int(o.scalar_type()))),
                                  torch::scalar_tensor(double(int(loss.scalar_type())))});
         }},
        {2152, [](const std::vector<T>& L, const std::vector<T>&, bool&) {
             const auto h = torch::matmul(L[0], L[1]);
             const auto a = torch::gelu(h);
             const auto ln = torch::layer_norm(h, {6}, {}, {}, 1e-5);
             const auto l = ln * L[2] + L[3];
             const auto s = torch::softplus(h);
             const auto e = torch::erf(h);
             const auto loss = a.sum() + l.square().sum() + s.mean() + (e * l).sum();
             std::vector<T> out{loss.to(torch::kFloat)};
             for (const T* t : {&h, &a, &ln, &l, &s, &e, &loss}) out.push_back(torch::scalar_tensor(double(int(t->scalar_type()))));
             return torch::stack(out);
         }},
    };
    return refs;
}

std::string dtype_of(int scalar_type) {
    switch (torch::ScalarType(scalar_type)) {
        case torch::kFloat: return "f32";
        case torch::kBFloat16: return "bf16";
        case torch::kDouble: return "f64";
        case torch::kHalf: return "f16";
        default: return "other";
    }
}

struct case_data {
    mo::extents ext;
    std::vector<std::vector<double>> in;
};

std::vector<std::int64_t> torch_shape(const mo::leaf& l, const std::array<std::size_t, 4>& e) {
    std::vector<std::int64_t> s;
    for (int a = 0; a < l.rank; ++a) s.push_back(std::int64_t(e[std::size_t(a)]));
    return s;
}

// Inputs rounded to float when float (or bf16-exact when autocast: f32 leaves of bf16 values
// would also do, but f32 values exercise the casts).
case_data make_case(const mo::graph_def& g, std::uint64_t seed, bool as_float) {
    std::mt19937_64 rng(seed);
    std::vector<std::size_t> vars;
    std::vector<std::size_t> allowed;
    for (std::size_t s : sizes)
        if (s >= g.min_size) allowed.push_back(s);
    for (int v = 0; v < g.vars; ++v) vars.push_back(allowed[rng() % allowed.size()]);
    case_data c;
    for (const auto& l : g.leaves) {
        std::array<std::size_t, 4> e{};
        std::size_t n = 1;
        for (int a = 0; a < l.rank; ++a) {
            const long x = l.ext[std::size_t(a)];
            e[std::size_t(a)] = x >= 0 ? std::size_t(x) : vars[std::size_t(-1 - x)];
            n *= e[std::size_t(a)];
        }
        std::vector<double> v(n);
        if (l.kind == mo::leaf_kind::ids) {
            const long hi = long(l.hi) + (l.hi_var >= 0 ? long(vars[std::size_t(l.hi_var)]) : 0);
            std::uniform_int_distribution<long> d(long(l.lo), hi);
            for (double& x : v) {
                long id = d(rng);
                while (id >= l.hole_lo && id <= l.hole_hi) id = d(rng);
                x = double(id);
            }
        } else {
            std::uniform_real_distribution<double> d(l.lo, l.hi);
            for (double& x : v) x = as_float ? double(float(d(rng))) : d(rng);
        }
        c.ext.push_back(e);
        c.in.push_back(std::move(v));
    }
    return c;
}

std::vector<T> torch_leaves(const mo::graph_def& g, const case_data& c, torch::ScalarType dtype) {
    std::vector<T> leaves;
    for (std::size_t i = 0; i < g.leaves.size(); ++i) {
        const auto& l = g.leaves[i];
        auto t = torch::tensor(c.in[i], torch::TensorOptions().dtype(torch::kFloat64)).reshape(torch_shape(l, c.ext[i]));
        if (l.kind == mo::leaf_kind::ids) t = t.to(torch::kLong);
        else t = t.to(dtype).detach().requires_grad_(l.kind == mo::leaf_kind::param);
        leaves.push_back(t);
    }
    return leaves;
}

std::vector<double> flat(const T& t) {
    const T f = t.detach().to(torch::kFloat64).contiguous().reshape({-1});
    return std::vector<double>(f.data_ptr<double>(), f.data_ptr<double>() + f.numel());
}

struct verdict {
    bool ok = true, skipped = false;
    double worst = 0;
    std::string detail;
};

// |got - want| <= rtol * max(largest |want|, floor / rtol), element by element
void check(verdict& v, const std::string& what, const std::vector<double>& want, const std::vector<double>& got, double rtol,
           double floor = 0) {
    double scale = floor / rtol;
    for (double w : want) scale = std::max(scale, std::abs(w));
    for (std::size_t i = 0; i < want.size(); ++i) {
        const double err = std::abs(got[i] - want[i]) / (scale + 1e-300);
        if (!std::isfinite(got[i]) || !(err <= rtol)) {
            if (v.ok) {
                std::ostringstream os;
                os.precision(17);
                os << what << "[" << i << "]: typegrad " << got[i] << ", LibTorch " << want[i];
                v.detail = os.str();
            }
            v.ok = false;
        }
        if (scale > 0) v.worst = std::max(v.worst, std::isfinite(err) ? err : 1e300);
    }
}

template <class F>
verdict compare_plain(const mo::graph_def& g, const case_data& c) {
    verdict v;
    std::vector<T> aux;
    mo::tensors<double> aux_values;
    if (g.aux != nullptr) {
        g.aux(c.in, c.ext, aux_values);
        for (const auto& a : aux_values) aux.push_back(torch::tensor(a, torch::TensorOptions().dtype(torch::kFloat64)));
    }
    auto leaves = torch_leaves(g, c, torch::kFloat64);
    bool kink = false;
    const T loss = references().at(g.id)(leaves, aux, kink);
    if (kink) {
        v.skipped = true;
        return v;
    }
    loss.backward();
    mo::tensors<F> in, grads;
    for (const auto& x : c.in) in.emplace_back(x.begin(), x.end());
    for (std::size_t i = 0; i < g.leaves.size(); ++i)
        if (g.leaves[i].kind == mo::leaf_kind::param) grads.emplace_back(c.in[i].size(), F(-12345));
    F l;
    if constexpr (std::is_same_v<F, double>) l = g.f64(in, c.ext, grads);
    else l = g.f32(in, c.ext, grads);
    const double rtol = std::is_same_v<F, double> ? rtol_f64 : rtol_f32;
    check(v, "loss", {loss.item<double>()}, {double(l)}, rtol, std::is_same_v<F, double> ? 0.0 : 1e-4);
    std::size_t k = 0;
    for (std::size_t i = 0; i < g.leaves.size(); ++i) {
        if (g.leaves[i].kind != mo::leaf_kind::param) continue;
        const T gr = leaves[i].grad();
        const std::vector<double> want = gr.defined() ? flat(gr) : std::vector<double>(c.in[i].size(), 0.0);
        check(v, std::string("grad ") + g.leaves[i].name, want, std::vector<double>(grads[k].begin(), grads[k].end()), rtol);
        ++k;
    }
    return v;
}

verdict compare_autocast(const mo::graph_def& g, const case_data& c) {
    verdict v;
    std::vector<std::string_view> dtypes;
    mo::tensors<double> grads;
    g.autocast(c.in, c.ext, grads, &dtypes);
    auto leaves = torch_leaves(g, c, torch::kFloat32);
    at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
    at::autocast::set_cpu_enabled(true);
    bool kink = false;
    const T out = references().at(g.id)(leaves, {}, kink);
    out[0].backward();  // inside the region: same_as_forward
    at::autocast::set_cpu_enabled(false);
    at::autocast::clear_cache();
    for (std::size_t n = 0; n < dtypes.size(); ++n) {
        const std::string want = dtype_of(int(out[std::int64_t(n) + 1].item<double>()));
        if (want != dtypes[n]) {
            if (v.ok) v.detail = "dtype of node " + std::to_string(n) + ": typegrad " + std::string(dtypes[n]) + ", LibTorch " + want;
            v.ok = false;
        }
    }
    // the same graph without autocast, in double: the value bf16 approximates
    auto exact_leaves = torch_leaves(g, c, torch::kFloat64);
    const T exact = references().at(g.id)(exact_leaves, {}, kink);
    exact[0].backward();
    const double l = g.autocast(c.in, c.ext, grads, nullptr);
    // an element passes within rtol_autocast of LibTorch's autocast or of the exact value: bf16
    // chains (LibTorch rounds after every op, typegrad at its kernel boundaries) drift apart by
    // more than either drifts from the exact value (graph 2152: 4% of the largest gradient)
    auto both = [&](const std::string& what, const std::vector<double>& autocast_ref, const std::vector<double>& exact_ref,
                    const std::vector<double>& got) {
        verdict a, e;
        check(a, what, autocast_ref, got, rtol_autocast);
        check(e, what, exact_ref, got, rtol_autocast);
        v.worst = std::max(v.worst, std::min(a.worst, e.worst));
        if (!a.ok && !e.ok) {
            if (v.ok) v.detail = a.detail + "; exact " + e.detail;
            v.ok = false;
        }
    };
    both("loss", {out[0].item<double>()}, {exact[0].item<double>()}, {l});
    std::size_t k = 0;
    for (std::size_t i = 0; i < g.leaves.size(); ++i) {
        if (g.leaves[i].kind != mo::leaf_kind::param) continue;
        both(std::string("grad ") + g.leaves[i].name, flat(leaves[i].grad()), flat(exact_leaves[i].grad()), grads[k]);
        ++k;
    }
    return v;
}

void print_reproducer(const mo::graph_def& g, const case_data& c, const char* dtype, const verdict& v) {
    std::printf("\n=== MISMATCH: graph %d, %s ===\n%s\n// typegrad:\n%s\n", g.id, dtype, v.detail.c_str(), g.cpp);
    for (std::size_t i = 0; i < g.leaves.size(); ++i) {
        std::printf("// %s, extents {", g.leaves[i].name);
        for (int a = 0; a < g.leaves[i].rank; ++a) std::printf("%s%zu", a ? ", " : "", c.ext[i][std::size_t(a)]);
        std::printf("}:\n{");
        for (std::size_t j = 0; j < c.in[i].size(); ++j) std::printf("%s%.17g", j ? ", " : "", c.in[i][j]);
        std::printf("}\n");
    }
}

// The law of dropout's mask: typegrad's kept fraction against 1 - p, the kept value against
// LibTorch's (torch::dropout of ones keeps 1 / (1 - p)).
long dropout_statistics() {
    long failures = 0;
    const std::size_t n = 1 << 16;
    for (double p : {0.1, 0.3, 0.5}) {
        // rows of 5 through graph 2108's mask function: p 0.3 and 0.5 from it, 0.1 from LibTorch only
        const T ones = torch::ones({std::int64_t(n)}, torch::TensorOptions().dtype(torch::kFloat64));
        const T t = torch::dropout(ones, p, true);
        const double torch_kept = (t != 0).sum().item<double>() / double(n);
        const double torch_value = t.max().item<double>();
        const double sd = std::sqrt(p * (1 - p) / double(n));
        if (std::abs(torch_kept - (1 - p)) > 5 * sd) ++failures;
        if (p == 0.1) continue;
        const mo::graph_def* g = nullptr;
        for (const auto& d : mo::registry())
            if (d.id == 2108) g = &d;
        mo::tensors<double> aux;
        for (int seed = 0; seed < 3; ++seed) {
            const mo::tensors<double> in{std::vector<double>(n, 0.5), std::vector<double>(n, 0.0),
                                         std::vector<double>{double(12345 + seed), double(seed * 7)}};
            g->aux(in, mo::extents{{n / 5, 5, 0, 0}, {n / 5, 5, 0, 0}, {2, 0, 0, 0}}, aux);
            const auto& m = aux[p == 0.3 ? 0 : 1];
            std::size_t kept = 0;
            bool values_ok = true;
            for (double x : m) {
                kept += x != 0;
                values_ok = values_ok && (x == 0 || x == torch_value);
            }
            const double frac = double(kept) / double(m.size());
            const double sdm = std::sqrt(p * (1 - p) / double(m.size()));
            const bool ok = std::abs(frac - (1 - p)) <= 5 * sdm && values_ok;
            if (!ok) {
                std::printf("dropout p=%g seed %d: typegrad keeps %.5f (1 - p = %.5f, 5 sd %.5f), kept values %s LibTorch's %.17g\n",
                            p, seed, frac, 1 - p, 5 * sdm, values_ok ? "equal" : "differ from", torch_value);
                ++failures;
            }
        }
    }
    return failures;
}

}  // namespace

int main() {
    torch::set_num_threads(1);
    auto graphs = mo::registry();
    std::sort(graphs.begin(), graphs.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
    const long only = env_long("TYPEGRAD_DIFF_GRAPH", -1);
    const long per_graph = env_long("TYPEGRAD_DIFF_MODEL_CASES", 12);
    long cases = 0, skipped = 0, failures = 0, autocast_cases = 0, autocast_failures = 0;
    double worst_f64 = 0, worst_f32 = 0, worst_autocast = 0;
    std::size_t ran = 0;
    for (const auto& g : graphs) {
        if (only >= 0 && g.id != only) continue;
        ++ran;
        for (int dt = 0; dt < (g.autocast ? 1 : 2); ++dt) {
            bool reported = false;
            for (long k = 0; k < per_graph; ++k) {
                const std::uint64_t seed = std::uint64_t(g.id) * 1000003u + std::uint64_t(k) * 7919u + std::uint64_t(dt);
                const case_data c = make_case(g, seed, dt == 1 || g.autocast != nullptr);
                const verdict v = g.autocast ? compare_autocast(g, c) : dt == 0 ? compare_plain<double>(g, c) : compare_plain<float>(g, c);
                if (v.skipped) {
                    ++skipped;
                    continue;
                }
                ++(g.autocast ? autocast_cases : cases);
                double& worst = g.autocast ? worst_autocast : dt == 0 ? worst_f64 : worst_f32;
                worst = std::max(worst, v.worst);
                if (v.ok) continue;
                ++(g.autocast ? autocast_failures : failures);
                if (!reported) {
                    reported = true;
                    print_reproducer(g, c, g.autocast ? "autocast cpu/bf16" : dt == 0 ? "double" : "float", v);
                }
            }
        }
    }
    const long dropout_failures = only >= 0 && only != 2108 ? 0 : dropout_statistics();
    std::printf("\nmodel ops: %zu graphs, %ld cases compared (%ld skipped near a tie), %ld failures; worst error double %.3g "
                "(bound %.0e), float %.3g (bound %.0e)\n",
                ran, cases, skipped, failures, worst_f64, rtol_f64, worst_f32, rtol_f32);
    std::printf("model ops under autocast cpu/bf16: %ld cases compared, %ld failures; worst error %.3g (bound %.0e)\n",
                autocast_cases, autocast_failures, worst_autocast, rtol_autocast);
    std::printf("dropout mask statistics (p 0.1 LibTorch; 0.3, 0.5 both, 3 seeds, 65536 elements): %ld failures\n",
                dropout_failures);
    return failures == 0 && autocast_failures == 0 && dropout_failures == 0 ? 0 : 1;
}
