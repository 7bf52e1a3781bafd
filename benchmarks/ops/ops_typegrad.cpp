// typegrad side of the op benchmarks. Every extent is dynamic, so each op is one compiled step
// (one graph type) that serves all of its sizes; the shapes are bound per call.
#include "ops.hpp"

#include <typegrad/typegrad.hpp>


namespace tg = typegrad;

namespace ops {
namespace {

using buf = std::vector<float>;
constexpr auto dyn = tg::dyn;

// Owns copies of the inputs and one gradient buffer per float input.
class base : public workload {
public:
    base(const data& in, std::size_t n_grads) : in_(in.floats), ids_(in.ids) {
        for (std::size_t i = 0; i < n_grads; ++i) grads_.emplace_back(in_[i].size());
    }
    std::vector<buf> grads() override { return grads_; }

protected:
    std::vector<buf> in_, grads_;
    std::vector<std::int32_t> ids_;
};

namespace conv {
constexpr auto x = tg::param<"x", float, tg::shape<dyn, dyn, dyn, dyn>>;
constexpr auto w = tg::param<"w", float, tg::shape<dyn, dyn, 3, 3>>;
constexpr auto b = tg::param<"b", float, tg::shape<dyn>>;
constexpr auto r = tg::input<"r", float, tg::shape<dyn, dyn, dyn, dyn>>;
inline auto compile() { return tg::compile(tg::sum(tg::conv2d<1, 1>(x, w, b) * r), tg::wrt(x, w, b)); }
}  // namespace conv

class conv_workload final : public base {
public:
    conv_workload(const config& c, const data& in) : base(in, 3), c_(c) {}
    float step() override {
        const std::size_t n = c_.n, ch = c_.c, s = c_.s;
        return step_.value_and_grad(tg::bind(conv::x, in_[0], {n, ch, s, s}), tg::bind(conv::w, in_[1], {ch, ch, 3, 3}),
                                    tg::bind(conv::b, in_[2], {ch}), tg::bind(conv::r, in_[3], {n, ch, s, s}),
                                    tg::grad_into(conv::x, grads_[0]), tg::grad_into(conv::w, grads_[1]),
                                    tg::grad_into(conv::b, grads_[2]));
    }

private:
    config c_;
    decltype(conv::compile()) step_ = conv::compile();
};

namespace ln {
constexpr auto x = tg::param<"x", float, tg::shape<dyn, dyn>>;
constexpr auto w = tg::param<"w", float, tg::shape<dyn>>;
constexpr auto b = tg::param<"b", float, tg::shape<dyn>>;
constexpr auto r = tg::input<"r", float, tg::shape<dyn, dyn>>;
inline auto compile() { return tg::compile(tg::sum(tg::layer_norm(x, w, b) * r), tg::wrt(x, w, b)); }
}  // namespace ln

class ln_workload final : public base {
public:
    ln_workload(const config& c, const data& in) : base(in, 3), c_(c) {}
    float step() override {
        const std::size_t n = c_.n, d = c_.d;
        return step_.value_and_grad(tg::bind(ln::x, in_[0], {n, d}), tg::bind(ln::w, in_[1], {d}),
                                    tg::bind(ln::b, in_[2], {d}), tg::bind(ln::r, in_[3], {n, d}),
                                    tg::grad_into(ln::x, grads_[0]), tg::grad_into(ln::w, grads_[1]),
                                    tg::grad_into(ln::b, grads_[2]));
    }

private:
    config c_;
    decltype(ln::compile()) step_ = ln::compile();
};

namespace att {
// [batch * heads, T, 64]: d static so that the scale is 1 / sqrt(64), as in LibTorch.
constexpr auto q = tg::param<"q", float, tg::shape<dyn, dyn, config::head_dim>>;
constexpr auto k = tg::param<"k", float, tg::shape<dyn, dyn, config::head_dim>>;
constexpr auto v = tg::param<"v", float, tg::shape<dyn, dyn, config::head_dim>>;
constexpr auto r = tg::input<"r", float, tg::shape<dyn, dyn, config::head_dim>>;
inline auto compile() {
    return tg::compile(tg::sum(tg::scaled_dot_product_attention(q, k, v, tg::causal) * r), tg::wrt(q, k, v));
}
}  // namespace att

class att_workload final : public base {
public:
    att_workload(const config& c, const data& in) : base(in, 3), c_(c) {}
    float step() override {
        const std::size_t n = c_.n, t = c_.t, d = config::head_dim;
        return step_.value_and_grad(tg::bind(att::q, in_[0], {n, t, d}), tg::bind(att::k, in_[1], {n, t, d}),
                                    tg::bind(att::v, in_[2], {n, t, d}), tg::bind(att::r, in_[3], {n, t, d}),
                                    tg::grad_into(att::q, grads_[0]), tg::grad_into(att::k, grads_[1]),
                                    tg::grad_into(att::v, grads_[2]));
    }

private:
    config c_;
    decltype(att::compile()) step_ = att::compile();
};

namespace emb {
constexpr auto ids = tg::input<"ids", std::int32_t, tg::shape<dyn>>;
constexpr auto table = tg::param<"table", float, tg::shape<dyn, dyn>>;
constexpr auto r = tg::input<"r", float, tg::shape<dyn, dyn>>;
inline auto compile() { return tg::compile(tg::sum(tg::embedding(ids, table) * r), tg::wrt(table)); }
}  // namespace emb

class emb_workload final : public base {
public:
    emb_workload(const config& c, const data& in) : base(in, 1), c_(c) {}
    float step() override {
        return step_.value_and_grad(tg::bind(emb::ids, ids_), tg::bind(emb::table, in_[0], {c_.v, c_.d}),
                                    tg::bind(emb::r, in_[1], {c_.n, c_.d}), tg::grad_into(emb::table, grads_[0]));
    }

private:
    config c_;
    decltype(emb::compile()) step_ = emb::compile();
};

namespace pw {
constexpr auto x = tg::param<"x", float, tg::shape<dyn>>;
constexpr auto r = tg::input<"r", float, tg::shape<dyn>>;
inline auto compile() { return tg::compile(tg::sum(tg::tanh(x) * tg::exp(-tg::square(x)) * r), tg::wrt(x)); }
}  // namespace pw

class pointwise_workload final : public base {
public:
    pointwise_workload(const config& c, const data& in) : base(in, 1), c_(c) {}
    float step() override {
        return step_.value_and_grad(tg::bind(pw::x, in_[0], {c_.n}), tg::bind(pw::r, in_[1], {c_.n}),
                                    tg::grad_into(pw::x, grads_[0]));
    }

private:
    config c_;
    decltype(pw::compile()) step_ = pw::compile();
};

namespace lsm {
constexpr auto x = tg::param<"x", float, tg::shape<dyn, dyn>>;
constexpr auto r = tg::input<"r", float, tg::shape<dyn, dyn>>;
inline auto compile() { return tg::compile(tg::sum(tg::log_softmax(x, tg::axes<1>) * r), tg::wrt(x)); }
}  // namespace lsm

class log_softmax_workload final : public base {
public:
    log_softmax_workload(const config& c, const data& in) : base(in, 1), c_(c) {}
    float step() override {
        return step_.value_and_grad(tg::bind(lsm::x, in_[0], {c_.n, c_.d}), tg::bind(lsm::r, in_[1], {c_.n, c_.d}),
                                    tg::grad_into(lsm::x, grads_[0]));
    }

private:
    config c_;
    decltype(lsm::compile()) step_ = lsm::compile();
};

}  // namespace

void typegrad_threads(std::size_t n) { tg::set_num_threads(n); }

std::unique_ptr<workload> typegrad_workload(const config& c, const data& in) {
    switch (c.kind) {
        case op::conv2d: return std::make_unique<conv_workload>(c, in);
        case op::layer_norm: return std::make_unique<ln_workload>(c, in);
        case op::attention: return std::make_unique<att_workload>(c, in);
        case op::embedding: return std::make_unique<emb_workload>(c, in);
        case op::pointwise: return std::make_unique<pointwise_workload>(c, in);
        case op::log_softmax: return std::make_unique<log_softmax_workload>(c, in);
    }
    return nullptr;
}

}  // namespace ops
