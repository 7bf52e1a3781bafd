// Op-level benchmarks: the interface between the typegrad and the LibTorch translation units
// (kept apart so that only one sees the Torch headers) and main.cpp, which times them side by side.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ops {

// One workload: forward + backward of loss = sum(op(inputs) * r), r a fixed random tensor of the
// output's shape, gradients into every float input. All of them are one struct so that main can
// list them in one table; `kind` says which fields are used.
enum class op { conv2d, layer_norm, attention, embedding, pointwise, log_softmax };

struct config {
    op kind;
    // conv2d: x [n, c, s, s], w [c, c, 3, 3], b [c] (stride 1, padding 1)
    // layer_norm: x [n, d] normalised over d, w [d], b [d]
    // attention: q, k, v [n, t, 64] (n = batch * heads), causal
    // embedding: n ids into a table [v, d]
    // pointwise: tanh(x) * exp(-x^2) over x [n] (one fused loop in typegrad, a kernel per op in
    //   LibTorch eager)
    // log_softmax: x [n, d] over d
    std::size_t n = 0, c = 0, s = 0, d = 0, t = 0, v = 0;
    static constexpr std::size_t head_dim = 64;
    std::string name() const;
};

// The inputs, generated once by main so that both sides compute on the same numbers.
struct data {
    std::vector<std::vector<float>> floats;  // the float inputs in the order listed above, then r
    std::vector<std::int32_t> ids;           // embedding only
};
data make_data(const config& c);

class workload {
public:
    virtual ~workload() = default;
    virtual float step() = 0;                        // loss; gradients land in the workload's buffers
    virtual std::vector<std::vector<float>> grads() = 0;  // the last step's gradients, inputs' order
};

// nullptr when this build has no instantiation for the configuration.
std::unique_ptr<workload> typegrad_workload(const config& c, const data& in);
std::unique_ptr<workload> torch_workload(const config& c, const data& in);

void typegrad_threads(std::size_t n);  // tg::set_num_threads
void torch_threads(std::size_t n);     // at::set_num_threads and OpenBLAS's own pool

}  // namespace ops
