#pragma once
// The second half of issue 15's differential graphs (ids from 2100, model_ops_graphs.cpp): ops
// whose LibTorch counterparts the line-program interpreters of differential_main.cpp and
// autocast_harness.cpp do not know (conv dilation and groups, adaptive_avg_pool2d, embedding,
// index_select, gather, argmax/argmin, dynamic_slice, dropout, layer_norm over two axes,
// batch_norm in evaluation, attention with a float mask and an explicit scale). Each graph's
// LibTorch reference is C++ in model_ops_harness.cpp (keyed by id), which has its own main: the
// executable typegrad_differential_model_ops. This header does not include LibTorch, so the
// graphs compile without its headers.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include <typegrad/typegrad.hpp>

#include "ids.hpp"  // ids_of

namespace typegrad_differential::model_ops {

template <class T>
using tensors = std::vector<std::vector<T>>;
using extents = std::vector<std::array<std::size_t, 4>>;  // per leaf, unused axes 0

enum class leaf_kind { input, param, ids };

struct leaf {
    const char* name;
    leaf_kind kind;
    int rank;
    std::array<long, 4> ext;  // a static extent, or -1 - k for dynamic size variable k
    double lo, hi;            // values from [lo, hi]; ids: integers in [lo, hi + size variable hi_var]
    int hi_var = -1;
    long hole_lo = 1, hole_hi = 0;  // ids: integers in [hole_lo, hole_hi] are not drawn
};

// Loss; gradients of the params (leaf order) into grad. Ids arrive as doubles holding integers.
template <class T>
using graph_fn = T (*)(const tensors<T>& in, const extents& ext, tensors<T>& grad);
// Values the reference needs from typegrad (dropout's masks), computed in double.
using aux_fn = void (*)(const tensors<double>& in, const extents& ext, tensors<double>& aux);
// Under tg::autocast<tg::cpu_bf16>: loss and gradients (widened to double); with dtypes non-null,
// the dtype of each compared node instead (in the order the reference lists them).
using autocast_fn = double (*)(const tensors<double>& in, const extents& ext, tensors<double>& grad,
                               std::vector<std::string_view>* dtypes);

struct graph_def {
    int id;
    int vars;            // dynamic size variables
    std::size_t min_size;  // smallest size drawn for them
    const char* cpp;
    std::vector<leaf> leaves;
    graph_fn<double> f64;
    graph_fn<float> f32;
    aux_fn aux = nullptr;
    autocast_fn autocast = nullptr;  // an autocast graph: f64/f32 unused
};

inline std::vector<graph_def>& registry() {
    static std::vector<graph_def> graphs;
    return graphs;
}

}  // namespace typegrad_differential::model_ops
