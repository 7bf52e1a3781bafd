#pragma once
// The test graphs (graphs.hpp) against the CPU, on the device or in host emulation, one part of
// the graphs at a time (for_each_graph_in<Part>): device_test.cpp runs part 0,
// device_graphs_test.cpp part 1, so that the two halves compile at once (one unit took 330 s with
// g++, the build's last 220 s on one core).
#include "compare.hpp"
#include "emulator.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace cuda_graph_tests {
namespace tg = typegrad;
using namespace cuda_compare;

// TYPEGRAD_CUDA_GRAPHS=name,name,... runs only those graphs (a short session on a lent GPU).
inline bool graph_selected(const char* name) {
    const char* only = std::getenv("TYPEGRAD_CUDA_GRAPHS");
    if (only == nullptr) return true;
    const std::string list = std::string(",") + only + ",";
    return list.find(std::string(",") + name + ",") != std::string::npos;
}

// Every graph of the part on the device (skipped, saying so, without one).
template <int Part>
void compare_on_device() {
    if (skip_without_device()) return;
    std::printf("cuda device: %s\n", tg::cuda::device_name().c_str());
    for (std::size_t n : {std::size_t(1), std::size_t(7), std::size_t(1000), std::size_t(70000)})
        cuda_tests::for_each_graph_in<Part>([&](const char* name, const auto& step) {
            if (graph_selected(name)) compare_with_cpu(name, step, n);
        });
}

// Without a GPU: the same comparisons with the generated kernels compiled by the host compiler and
// run block by block (exec/cuda/runtime.hpp: emulator). A subset of the graphs by default (each module
// is a host compile); TYPEGRAD_CUDA_EMULATE_ALL=1 runs them all. Each part's graphs in two halves
// (slice 0 or 1: every other graph), four tests in all, so that ctest runs them in parallel: the
// host compiles of about 190 modules, one after another, took 450 s in one test.
template <int Part>
void emulate(std::size_t slice) {
    if (tg::cuda::available()) {
        WARN("a CUDA device is present: the device tests cover it; emulation skipped");
        return;
    }
    cuda_emulation::scoped_emulator emulator;
    const bool all = std::getenv("TYPEGRAD_CUDA_EMULATE_ALL") != nullptr;
    const std::vector<std::string> subset = {"exp", "where_masks", "broadcast_row", "broadcast_to", "mean",
                                             "max_min_all", "sum_columns", "max_min_axes", "prod_axes", "prod_all", "softmax_axis0",
                                             "matmul", "linear", "matmul_batched", "matmul_dense_copy", "transpose", "slice",
                                             "cross_entropy", "cast", "cast_bf16_to_f64", "hook_device", "mlp", "non_scalar",
                                             "bf16_elementwise", "f16_elementwise", "bf16_reduction", "bf16_slice_transpose",
                                             "bf16_matmul", "autocast_cuda_f16_mlp", "custom_device", "custom_device_f64",
                                             "activations", "special", "layer_norm", "bf16_activations",
                                             "embedding", "embedding_padding_f64", "embedding_of_argmax", "index_select",
                                             "gather", "dynamic_slice", "narrow", "concat_stack", "dropout", "attention_causal",
                                             "recurrence", "bf16_recurrence", "pool", "pool_f64", "pool_grad_grad",
                                             "conv", "conv_f64", "conv_grad_grad", "conv_chunks", "bf16_conv",
                                             "batch_norm", "attention", "attention_heads", "attention_f64",
                                             "bf16_attention"};
    std::size_t compared = 0;
    for (std::size_t n : {std::size_t(1), std::size_t(7), std::size_t(1000), std::size_t(70000)}) {
        std::size_t i = 0;  // the graph's place among the part's emulated graphs
        cuda_tests::for_each_graph_in<Part>([&](const char* name, const auto& step) {
            if (!all && std::find(subset.begin(), subset.end(), name) == subset.end()) return;
            if (i++ % 2 != slice) return;
            compare_with_cpu(name, step, n);
            ++compared;
        });
    }
    CHECK(compared > 0);
    std::printf("cuda emulation, graphs part %d, slice %zu: %zu comparisons, %zu modules compiled and run on the host\n",
                Part, slice, compared, emulator.modules());
}

}  // namespace cuda_graph_tests
