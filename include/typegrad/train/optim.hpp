#pragma once
// Optimizers over parameter sets (train/params.hpp), with PyTorch's update rules, as LibTorch's
// torch::optim implements them (the differential test compares the two):
//
//   tg::sgd opt(model, {.lr = 0.1, .momentum = 0.9, .nesterov = true});
//   tg::adam opt(model, {.lr = 1e-3});           tg::adamw opt(model, {.lr = 1e-3, .weight_decay = 0.01});
//   tg::value_and_grad(step, ..., tg::params(model), tg::grads_into(grads));
//   tg::clip_grad_norm(grads, 1.0);               // optional, returns the norm before clipping
//   opt.step(model, grads);
//
// State lives in public members of the parameter struct's type (opt.exp_avg.fc1.W, ...), so it can
// be inspected, checkpointed (train/checkpoint.hpp) and restored. Each buffer is updated by one
// fused SIMD loop (xsimd) reading param, gradient and state once. Float and double params; the
// scalars (lr, betas, bias corrections) are computed in double and applied in the param's dtype,
// as ATen does.
//
// Optimizer in the backward (no gradient buffer kept): make each param's post-accumulate hook
// tg::optimizer_step{} and run the step inside a tg::optimizer_in_backward scope:
//   auto Wh = tg::post_accumulate_grad_hook(W, tg::optimizer_step{});   // in the graph
//   { tg::optimizer_in_backward scope(opt, model); tg::value_and_grad(step, ..., tg::params(model)); }
// Each param is updated as soon as its gradient is complete (found by its buffer's address). The
// caller keeps no gradient struct: tg::value_and_grad gives a hooked param without grad_into a
// reused thread-local scratch buffer (the gradient must be materialised for the hook to see it).
// Each hook call looks its buffer up in the set: O(params) per param, negligible beside the kernels
// for models of up to a few hundred buffers.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <typegrad/core/cpu/simd.hpp>
#include <typegrad/core/error.hpp>
#include <typegrad/ops/hook.hpp>
#include <typegrad/train/params.hpp>

namespace typegrad {

namespace detail {

// One buffer of a parameter set, type-erased for the optimizers' loops.
struct buffer_ref {
    std::string name;
    void* data;
    std::size_t size;
    bool is_double;
};

template <class S>
std::vector<buffer_ref> buffer_table(S& set) {
    std::vector<buffer_ref> t;
    for_each_param(set, [&](std::string_view name, auto& buf) {
        using T = std::remove_cv_t<std::ranges::range_value_t<std::remove_reference_t<decltype(buf)>>>;
        static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                      "typegrad: optimizers update float and double params; a bf16/f16 param needs an "
                      "f32 master copy in the parameter set.");
        t.push_back({std::string(name), const_cast<T*>(std::ranges::data(buf)), std::size_t(std::ranges::size(buf)),
                     std::is_same_v<T, double>});
    });
    return t;
}

// Sizes of every table equal the params' (same struct type, but vectors can be resized).
inline void check_same_layout(const std::vector<buffer_ref>& params, const std::vector<buffer_ref>& other,
                              std::string_view what) {
    if (other.size() != params.size())
        fail<shape_error>({"typegrad: optimizer: ", what, " has ", other.size(), " buffers, the params ",
                           params.size()});
    for (std::size_t i = 0; i < params.size(); ++i)
        if (other[i].size != params[i].size)
            fail<shape_error>({"typegrad: optimizer: ", what, " '", other[i].name, "' has ", other[i].size,
                               " elements, the param ", params[i].size});
}

template <class S>
S zeros_like(const S& s) {
    S z = s;
    for_each_param(z, [](std::string_view, auto& buf) {
        for (auto& v : buf) v = {};
    });
    return z;
}

// Runs body(V) over [0, n) with SIMD batches, then scalars for the tail; body(i, tag) gets the
// element offset and a value of the lane type to choose load/store.
template <class T, class F>
inline void simd_loop(std::size_t n, F&& body) {
    constexpr std::size_t w = simd::width<T>;
    std::size_t i = 0;
    for (; i + w <= n; i += w) body(i, simd::batch<T>{});
    for (; i < n; ++i) body(i, T{});
}
template <class V, class T>
inline V load_v(const T* p) {
    if constexpr (std::is_same_v<V, T>) return *p;
    else return simd::load(p);
}
template <class V, class T>
inline void store_v(T* p, const V& v) {
    if constexpr (std::is_same_v<V, T>) *p = v;
    else simd::store(p, v);
}

// The thread's optimizer inside an optimizer_in_backward scope.
struct backward_update_target {
    virtual void update(void* param, std::size_t size, const void* grad, bool is_double) = 0;
    virtual ~backward_update_target() = default;
};
inline backward_update_target*& current_backward_target() {
    thread_local backward_update_target* target = nullptr;
    return target;
}

}  // namespace detail

// A copy of a parameter set with every element zero (gradient buffers, optimizer state).
template <class S>
S zeros_like(const S& set) {
    static_assert(detail::hana_struct<S>, "typegrad: zeros_like(set) takes a parameter struct (a Hana struct).");
    return detail::zeros_like(set);
}

// Sets every element of a parameter set to zero (PyTorch's zero_grad with set_to_none=False).
template <class S>
void zero_grad(S& grads) {
    static_assert(detail::hana_struct<S>, "typegrad: zero_grad(grads) takes a parameter struct (a Hana struct).");
    for_each_param(grads, [](std::string_view, auto& buf) {
        for (auto& v : buf) v = {};
    });
}

// The optimizers share the driver: tables of params, grads and state, a layout check before any
// write, then one kernel call per buffer.
template <class Derived, class Params>
class optimizer_base {
public:
    // Per-buffer step counts (PyTorch's state["step"]), depth-first order of the parameter set.
    std::vector<std::int64_t> steps;

    // One update of every param from its gradient.
    void step(Params& params, const Params& grads) {
        auto p = detail::buffer_table(params);
        auto g = detail::buffer_table(grads);
        auto state = self().state_tables();
        detail::check_same_layout(p, g, "grads");
        for (auto& [what, table] : state) detail::check_same_layout(p, table, what);
        if (steps.size() != p.size()) steps.assign(p.size(), 0);
        for (std::size_t i = 0; i < p.size(); ++i) run(i, p, g[i].data, state);
    }

    // What an optimizer's state_tables() returns: per state name ("exp_avg", ...), one buffer per
    // param in the parameter set's depth-first order (checkpoints save them under these names).
    using tables = std::vector<std::pair<std::string, std::vector<detail::buffer_ref>>>;

private:
    Derived& self() { return static_cast<Derived&>(*this); }

    void run(std::size_t i, const std::vector<detail::buffer_ref>& p, const void* grad, const tables& state) {
        ++steps[i];
        std::array<void*, 3> s{};
        auto slot = s.begin();
        for (const auto& entry : state)  // (iterators: g++ 12 -O3 warns falsely on state[k] here)
            if (slot != s.end()) *slot++ = entry.second[i].data;
        if (p[i].is_double)
            self().template kernel<double>(static_cast<double*>(p[i].data), static_cast<const double*>(grad),
                                           p[i].size, steps[i], s);
        else
            self().template kernel<float>(static_cast<float*>(p[i].data), static_cast<const float*>(grad),
                                          p[i].size, steps[i], s);
    }

public:
    // Used by optimizer_in_backward: the update of the one buffer at `param`.
    void update_one(Params& params, void* param, std::size_t size, const void* grad, bool is_double) {
        auto p = detail::buffer_table(params);
        auto state = self().state_tables();
        if (steps.size() != p.size()) steps.assign(p.size(), 0);
        for (std::size_t i = 0; i < p.size(); ++i)
            if (p[i].data == param) {
                if (p[i].size != size || p[i].is_double != is_double)
                    detail::fail<shape_error>({"typegrad: optimizer_step: the hooked param '", p[i].name,
                                               "' differs from the parameter set's buffer"});
                for (auto& [what, table] : state) detail::check_same_layout(p, table, what);
                run(i, p, grad, state);
                return;
            }
        throw binding_error("typegrad: optimizer_step: a hooked param is not bound from the parameter set "
                            "given to optimizer_in_backward");
    }
};

// ---- SGD --------------------------------------------------------------------------------------
struct sgd_options {
    // The learning rate (set it from a schedule before a step: opt.options.lr = sched(t)).
    double lr = 1e-3;
    // Momentum factor; 0 is plain SGD.
    double momentum = 0;
    // Dampening of the momentum's gradient term: buf = momentum * buf + (1 - dampening) * g.
    double dampening = 0;
    // L2 penalty added to the gradient: g += weight_decay * p.
    double weight_decay = 0;
    // Nesterov momentum (needs momentum > 0 and dampening 0).
    bool nesterov = false;
};

// torch.optim.SGD: g += wd * p; buf = g (first step) or momentum * buf + (1 - dampening) * g;
// g = nesterov ? g + momentum * buf : buf; p -= lr * g.
template <class Params>
class sgd : public optimizer_base<sgd<Params>, Params> {
public:
    // The hyperparameters; may be changed between steps.
    sgd_options options;
    Params momentum_buffer;  // valid once a step has run

    // State buffers shaped like `params` (zero); throws typegrad::error for invalid options (negative
    // lr, momentum or weight_decay; nesterov without momentum or with dampening).
    explicit sgd(const Params& params, sgd_options o = {}) : options(o), momentum_buffer(zeros_like(params)) {
        if (o.nesterov && (o.momentum <= 0 || o.dampening != 0))
            throw error("typegrad: sgd: nesterov momentum needs momentum > 0 and dampening 0 (as in PyTorch)");
        if (o.lr < 0 || o.momentum < 0 || o.weight_decay < 0)
            throw error("typegrad: sgd: lr, momentum and weight_decay must be non-negative");
    }

    // The state buffers by name ("momentum_buffer"), for checkpoints and the update.
    typename optimizer_base<sgd, Params>::tables state_tables() {
        return {{"momentum_buffer", detail::buffer_table(momentum_buffer)}};
    }

    // The update of one buffer of n elements at step `step` (1 on the first); s holds the state
    // buffers in state_tables() order. Called by optimizer_base::step.
    template <class T>
    void kernel(T* p, const T* g, std::size_t n, std::int64_t step, std::array<void*, 3> s) const {
        T* buf = static_cast<T*>(s[0]);
        const T wd = T(options.weight_decay), mom = T(options.momentum), damp = T(1 - options.dampening),
                neg_lr = T(-options.lr);
        const bool first = step == 1, use_wd = options.weight_decay != 0, use_mom = options.momentum != 0,
                   nesterov = options.nesterov;
        detail::simd_loop<T>(n, [&](std::size_t i, auto tag) {
            using V = decltype(tag);
            const V pv = detail::load_v<V>(p + i);
            V d = detail::load_v<V>(g + i);
            if (use_wd) d = d + V(wd) * pv;
            if (use_mom) {
                V b = first ? d : V(mom) * detail::load_v<V>(buf + i) + V(damp) * d;
                detail::store_v(buf + i, b);
                d = nesterov ? d + V(mom) * b : b;
            }
            detail::store_v(p + i, pv + V(neg_lr) * d);
        });
    }
};

// ---- Adam / AdamW ------------------------------------------------------------------------------
struct adam_options {
    // The learning rate.
    double lr = 1e-3;
    // Decay of the first moment (PyTorch's betas[0]).
    double beta1 = 0.9;
    // Decay of the second moment (PyTorch's betas[1]).
    double beta2 = 0.999;
    // Added to the denominator.
    double eps = 1e-8;
    // Adam: L2 penalty added to the gradient; AdamW: decoupled decay p *= 1 - lr * weight_decay.
    double weight_decay = 0;
    // Use the running maximum of the second moment (AMSGrad).
    bool amsgrad = false;
};

namespace detail {
// Adam's moment update and step, shared by adam (L2 weight decay in the gradient) and adamw
// (decoupled: p *= 1 - lr * wd first).
template <class T, bool Decoupled>
void adam_kernel(const adam_options& o, T* p, const T* g, std::size_t n, std::int64_t step, T* m, T* v, T* vmax) {
    const double bc1 = 1 - std::pow(o.beta1, double(step));
    const double bc2 = 1 - std::pow(o.beta2, double(step));
    const T b1 = T(o.beta1), one_b1 = T(1 - o.beta1), b2 = T(o.beta2), one_b2 = T(1 - o.beta2);
    const T bc2_sqrt = T(std::sqrt(bc2)), eps = T(o.eps), neg_step = T(-(o.lr / bc1));
    const T wd = T(o.weight_decay), decay = T(1 - o.lr * o.weight_decay);
    const bool use_wd = o.weight_decay != 0, amsgrad = o.amsgrad;
    simd_loop<T>(n, [&](std::size_t i, auto tag) {
        using V = decltype(tag);
        V pv = load_v<V>(p + i);
        V gv = load_v<V>(g + i);
        if (use_wd) {
            if constexpr (Decoupled) pv = pv * V(decay);
            else gv = gv + V(wd) * pv;
        }
        const V mv = V(b1) * load_v<V>(m + i) + V(one_b1) * gv;
        V vv = V(b2) * load_v<V>(v + i) + V(one_b2) * (gv * gv);
        store_v(m + i, mv);
        store_v(v + i, vv);
        if (amsgrad) {
            vv = simd::max(load_v<V>(vmax + i), vv);
            store_v(vmax + i, vv);
        }
        const V denom = simd::sqrt(vv) / V(bc2_sqrt) + V(eps);
        store_v(p + i, pv + V(neg_step) * (mv / denom));
    });
}
}  // namespace detail

// torch.optim.Adam: g += wd * p; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// vmax = max(vmax, v) (amsgrad); p -= lr / (1 - b1^t) * m / (sqrt(v or vmax) / sqrt(1 - b2^t) + eps).
template <class Params>
class adam : public optimizer_base<adam<Params>, Params> {
public:
    // The hyperparameters; may be changed between steps.
    adam_options options;
    // The first moment m, one buffer per param (PyTorch's state["exp_avg"]).
    Params exp_avg;
    // The second moment v (state["exp_avg_sq"]).
    Params exp_avg_sq;
    // The running maximum of v, used with amsgrad only (state["max_exp_avg_sq"]).
    Params max_exp_avg_sq;

    // State buffers shaped like `params` (zero); throws typegrad::error for invalid options.
    explicit adam(const Params& params, adam_options o = {})
        : options(o), exp_avg(zeros_like(params)), exp_avg_sq(zeros_like(params)), max_exp_avg_sq(zeros_like(params)) {
        if (o.lr < 0 || o.eps < 0 || o.beta1 < 0 || o.beta1 >= 1 || o.beta2 < 0 || o.beta2 >= 1 || o.weight_decay < 0)
            throw error("typegrad: adam: needs lr >= 0, eps >= 0, 0 <= beta1, beta2 < 1, weight_decay >= 0");
    }
    // The state buffers by name ("exp_avg", "exp_avg_sq", "max_exp_avg_sq").
    typename optimizer_base<adam, Params>::tables state_tables() {
        return {{"exp_avg", detail::buffer_table(exp_avg)},
                {"exp_avg_sq", detail::buffer_table(exp_avg_sq)},
                {"max_exp_avg_sq", detail::buffer_table(max_exp_avg_sq)}};
    }
    // The update of one buffer (see sgd::kernel).
    template <class T>
    void kernel(T* p, const T* g, std::size_t n, std::int64_t step, std::array<void*, 3> s) const {
        detail::adam_kernel<T, false>(options, p, g, n, step, static_cast<T*>(s[0]), static_cast<T*>(s[1]),
                                      static_cast<T*>(s[2]));
    }
};

// torch.optim.AdamW: p *= 1 - lr * wd, then Adam without weight decay in the gradient.
// PyTorch's default weight_decay for AdamW is 0.01.
template <class Params>
class adamw : public optimizer_base<adamw<Params>, Params> {
public:
    // The hyperparameters; may be changed between steps.
    adam_options options;
    // The first moment m, one buffer per param (PyTorch's state["exp_avg"]).
    Params exp_avg;
    // The second moment v (state["exp_avg_sq"]).
    Params exp_avg_sq;
    // The running maximum of v, used with amsgrad only (state["max_exp_avg_sq"]).
    Params max_exp_avg_sq;

    // State buffers shaped like `params` (zero); weight_decay defaults to 0.01 as in PyTorch; throws
    // typegrad::error for invalid options.
    explicit adamw(const Params& params, adam_options o = {.weight_decay = 1e-2})
        : options(o), exp_avg(zeros_like(params)), exp_avg_sq(zeros_like(params)), max_exp_avg_sq(zeros_like(params)) {
        if (o.lr < 0 || o.eps < 0 || o.beta1 < 0 || o.beta1 >= 1 || o.beta2 < 0 || o.beta2 >= 1 || o.weight_decay < 0)
            throw error("typegrad: adamw: needs lr >= 0, eps >= 0, 0 <= beta1, beta2 < 1, weight_decay >= 0");
    }
    // The state buffers by name ("exp_avg", "exp_avg_sq", "max_exp_avg_sq").
    typename optimizer_base<adamw, Params>::tables state_tables() {
        return {{"exp_avg", detail::buffer_table(exp_avg)},
                {"exp_avg_sq", detail::buffer_table(exp_avg_sq)},
                {"max_exp_avg_sq", detail::buffer_table(max_exp_avg_sq)}};
    }
    // The update of one buffer (see sgd::kernel).
    template <class T>
    void kernel(T* p, const T* g, std::size_t n, std::int64_t step, std::array<void*, 3> s) const {
        detail::adam_kernel<T, true>(options, p, g, n, step, static_cast<T*>(s[0]), static_cast<T*>(s[1]),
                                     static_cast<T*>(s[2]));
    }
};

// ---- gradient clipping ---------------------------------------------------------------------------
// torch.nn.utils.clip_grad_norm_: scales every gradient by max_norm / (norm + 1e-6) when that is
// below 1, where norm is the L2 norm of all gradients together (accumulated in double). Returns
// the norm before clipping. A non-finite norm throws anomaly_error (error_if_nonfinite=True)
// before anything is scaled.
template <class Grads>
double clip_grad_norm(Grads& grads, double max_norm) {
    static_assert(detail::hana_struct<Grads>, "typegrad: clip_grad_norm(grads, max_norm) takes a parameter struct.");
    double sum_sq = 0;
    for_each_param(grads, [&](std::string_view, const auto& buf) {
        for (const auto& v : buf) sum_sq += double(v) * double(v);
    });
    const double norm = std::sqrt(sum_sq);
    if (!std::isfinite(norm))
        throw anomaly_error("typegrad: clip_grad_norm: the total gradient norm is not finite");
    const double coef = max_norm / (norm + 1e-6);
    if (coef < 1)
        for_each_param(grads, [&](std::string_view, auto& buf) {
            using T = std::remove_cvref_t<decltype(*std::ranges::data(buf))>;
            for (auto& v : buf) v = T(v * T(coef));
        });
    return norm;
}

// ---- optimizer in the backward ---------------------------------------------------------------
// The post-accumulate hook that updates a param with the scope's optimizer as soon as its
// gradient is complete.
struct optimizer_step {
    // Updates `param` from its complete gradient `grad` with the innermost tg::optimizer_in_backward
    // scope of this thread; throws binding_error outside one.
    template <class T>
    void operator()(grad_view<T> param, grad_view<T> grad) const {
        static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                      "typegrad: optimizer_step updates float and double params.");
        detail::backward_update_target* t = detail::current_backward_target();
        if (t == nullptr)
            throw binding_error("typegrad: optimizer_step ran outside a tg::optimizer_in_backward scope");
        t->update(param.data, param.size(), grad.data, std::is_same_v<T, double>);
    }
};

// While alive, optimizer_step hooks on this thread update `params` with `opt`.
template <class Optimizer, class Params>
class optimizer_in_backward : detail::backward_update_target {
public:
    // Installs the scope for this thread (scopes nest; the destructor restores the previous one).
    optimizer_in_backward(Optimizer& opt, Params& params)
        : opt_(opt), params_(params), previous_(detail::current_backward_target()) {
        detail::current_backward_target() = this;
    }
    optimizer_in_backward(const optimizer_in_backward&) = delete;
    optimizer_in_backward& operator=(const optimizer_in_backward&) = delete;
    ~optimizer_in_backward() override { detail::current_backward_target() = previous_; }

private:
    void update(void* param, std::size_t size, const void* grad, bool is_double) override {
        opt_.update_one(params_, param, size, grad, is_double);
    }
    Optimizer& opt_;
    Params& params_;
    detail::backward_update_target* previous_;
};

}  // namespace typegrad
