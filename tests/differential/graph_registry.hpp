#pragma once
// What a generated graph (generated/graphs_*.cpp, from generate.py) tells the differential
// harness: its leaves, its C++ text (for reproducers), the same graph as a line program for the
// LibTorch interpreter, and typegrad's evaluation of it for double and float.
#include <array>
#include <cstddef>
#include <vector>

#include <typegrad/typegrad.hpp>

#include "ids.hpp"

namespace typegrad_differential {

template <class T>
using tensors = std::vector<std::vector<T>>;
// Extents of each leaf, in leaf order (unused axes 0).
using extents = std::vector<std::array<std::size_t, 3>>;

struct leaf_spec {
    const char* name;
    bool param;
    int rank;
    std::array<long, 3> ext;  // a static extent, or -1 - k for dynamic size variable k
    double lo, hi;            // values are drawn from [lo, hi]
    bool ids = false;         // std::int64_t ids (an input): integers drawn from [lo, hi], no special values
};

// Loss value; gradients of the params (leaf order) into `grad`, sized by the caller.
// `split`: forward then backward instead of value_and_grad (where the graph supports it).
template <class T>
using graph_fn = T (*)(const tensors<T>& in, const extents& ext, tensors<T>& grad, bool split);

struct graph_def {
    int id;
    int vars;    // dynamic size variables
    bool split;  // also evaluated with forward + backward
    const char* cpp;
    const char* program;
    std::vector<leaf_spec> leaves;
    graph_fn<double> f64;  // null where the graph is not compiled for double (generate.py: one dtype a graph)
    graph_fn<float> f32;   // likewise for float
};

inline std::vector<graph_def>& registry() {
    static std::vector<graph_def> graphs;
    return graphs;
}

}  // namespace typegrad_differential
