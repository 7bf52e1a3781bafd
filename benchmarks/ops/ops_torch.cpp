// LibTorch eager side of the op benchmarks: the same losses as ops_typegrad.cpp on leaf tensors,
// written as one would in PyTorch (functional op, (y * r).sum(), loss.backward()).
#include "ops.hpp"

#include <torch/torch.h>

#include <dlfcn.h>

#include <tuple>

namespace ops {
namespace {

using torch::Tensor;

Tensor from(const std::vector<float>& v, std::vector<std::int64_t> shape, bool leaf) {
    Tensor t = torch::from_blob(const_cast<float*>(v.data()), shape, torch::kFloat32).clone();
    return leaf ? t.set_requires_grad(true) : t;
}

std::vector<std::int64_t> i64(std::initializer_list<std::size_t> e) {
    std::vector<std::int64_t> out;
    for (std::size_t v : e) out.push_back(std::int64_t(v));
    return out;
}

class torch_workload_impl final : public workload {
public:
    torch_workload_impl(const config& c, const data& in) : c_(c) {
        const std::size_t d = config::head_dim;
        switch (c.kind) {
            case op::conv2d:
                leaves_ = {from(in.floats[0], i64({c.n, c.c, c.s, c.s}), true),
                           from(in.floats[1], i64({c.c, c.c, 3, 3}), true), from(in.floats[2], i64({c.c}), true)};
                r_ = from(in.floats[3], i64({c.n, c.c, c.s, c.s}), false);
                break;
            case op::layer_norm:
                leaves_ = {from(in.floats[0], i64({c.n, c.d}), true), from(in.floats[1], i64({c.d}), true),
                           from(in.floats[2], i64({c.d}), true)};
                r_ = from(in.floats[3], i64({c.n, c.d}), false);
                break;
            case op::attention:
                for (int i = 0; i < 3; ++i) leaves_.push_back(from(in.floats[i], i64({c.n, c.t, d}), true));
                r_ = from(in.floats[3], i64({c.n, c.t, d}), false);
                break;
            case op::embedding:
                leaves_ = {from(in.floats[0], i64({c.v, c.d}), true)};
                r_ = from(in.floats[1], i64({c.n, c.d}), false);
                ids_ = torch::tensor(std::vector<std::int64_t>(in.ids.begin(), in.ids.end()));
                break;
            case op::pointwise:
                leaves_ = {from(in.floats[0], i64({c.n}), true)};
                r_ = from(in.floats[1], i64({c.n}), false);
                break;
            case op::log_softmax:
                leaves_ = {from(in.floats[0], i64({c.n, c.d}), true)};
                r_ = from(in.floats[1], i64({c.n, c.d}), false);
                break;
        }
    }

    float step() override {
        for (Tensor& t : leaves_) t.mutable_grad().reset();  // set to none, as zero_grad does
        Tensor y;
        switch (c_.kind) {
            case op::conv2d: y = torch::conv2d(leaves_[0], leaves_[1], leaves_[2], 1, 1); break;
            case op::layer_norm: y = torch::layer_norm(leaves_[0], {std::int64_t(c_.d)}, leaves_[1], leaves_[2], 1e-5); break;
            case op::attention:
                // LibTorch 1.13's name for F.scaled_dot_product_attention (public from 2.0); on the
                // CPU it is the composite: matmul, causal mask, softmax, matmul.
                y = std::get<0>(at::_scaled_dot_product_attention(leaves_[0], leaves_[1], leaves_[2], {}, 0.0,
                                                                   false, true));
                break;
            case op::embedding: y = torch::embedding(leaves_[0], ids_); break;
            case op::pointwise: y = torch::tanh(leaves_[0]) * torch::exp(-leaves_[0].square()); break;
            case op::log_softmax: y = torch::log_softmax(leaves_[0], 1); break;
        }
        Tensor loss = (y * r_).sum();
        loss.backward();
        return loss.item<float>();
    }

    std::vector<std::vector<float>> grads() override {
        std::vector<std::vector<float>> out;
        for (const Tensor& t : leaves_) {
            const Tensor g = t.grad().contiguous();
            out.emplace_back(g.data_ptr<float>(), g.data_ptr<float>() + g.numel());
        }
        return out;
    }

private:
    config c_;
    std::vector<Tensor> leaves_;
    Tensor r_, ids_;
};

}  // namespace

void torch_threads(std::size_t n) {
    at::set_num_threads(int(n));
    // at::set_num_threads does not reach a pthreads OpenBLAS (Debian's BLAS provider of choice);
    // looked up so that no link against it is needed.
    using setter = void (*)(int);
    if (void* sym = dlsym(RTLD_DEFAULT, "openblas_set_num_threads")) reinterpret_cast<setter>(sym)(int(n));
}

std::unique_ptr<workload> torch_workload(const config& c, const data& in) {
    return std::make_unique<torch_workload_impl>(c, in);
}

}  // namespace ops
