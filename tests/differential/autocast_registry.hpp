#pragma once
// What a generated autocast graph (generated/autocast_*.cpp, from generate_autocast.py) tells the
// harness (autocast_harness.cpp): its leaves, its C++ text and line program (as graph_registry.hpp),
// and typegrad's evaluation of it under tg::autocast<tg::cpu_bf16> with its backward policy (policy_of).
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "graph_registry.hpp"

namespace typegrad_differential {

inline constexpr int policy_same_as_forward = 0;  // tg::compile(loss, ...): the default
inline constexpr int policy_off = 1;              // tg::compile<tg::backward_autocast::off>(loss, ...)

// The one backward policy a generated graph is compiled with (generate_autocast.py): even ids the
// default, odd ids off, so that every band of graphs holds both.
constexpr int policy_of(int id) { return id % 2 == 0 ? policy_same_as_forward : policy_off; }

// A generated graph asked to run under the policy it was not compiled with: a harness bug.
inline void check_policy(int id, int policy) {
    if (policy != policy_of(id))
        throw std::logic_error("autocast graph " + std::to_string(id) + " is compiled for the other backward policy");
}

// Loss value, gradients of the params (leaf order, widened to double) into `grad`. Inputs arrive
// as doubles that the leaf's dtype (float or bf16) holds exactly. With `dtypes` non-null, fills
// it instead with the dtype of every program node (leaves first) in the region and returns 0.
using autocast_fn = double (*)(const tensors<double>& in, const extents& ext, tensors<double>& grad, int policy,
                               std::vector<std::string_view>* dtypes);

struct autocast_graph_def {
    int id;
    int vars;
    const char* cpp;
    const char* program;
    std::vector<leaf_spec> leaves;
    autocast_fn fn;
};

inline std::vector<autocast_graph_def>& autocast_registry() {
    static std::vector<autocast_graph_def> graphs;
    return graphs;
}

template <class T>
std::vector<T> narrow(const std::vector<double>& v) {
    std::vector<T> r;
    r.reserve(v.size());
    for (double x : v) r.push_back(T(float(x)));  // exact: x is a value of T
    return r;
}
template <class T>
std::vector<double> widen(const std::vector<T>& v) {
    std::vector<double> r;
    r.reserve(v.size());
    for (const T& x : v) r.push_back(double(float(x)));
    return r;
}

// The dtype of expression E inside a cpu/bf16 region: the rewrite is bottom-up, so a node of a
// larger region has the type of the region over that node alone.
template <class E>
constexpr std::string_view region_dtype(E) {
    if constexpr (typegrad::detail::topo_t<typename E::node_type>::size == 1 || typegrad::is_index_type_v<typename E::value_type>)
        return typegrad::dtype_name<typename E::value_type>();  // a leaf, or ids (argmax: autocast leaves it alone)
    else return typegrad::dtype_name<typename decltype(typegrad::autocast<typegrad::cpu_bf16>(E{}))::value_type>();
}

// The autocast half of the differential test; returns the number of failures.
long run_autocast_differential(long cases, long only_graph);

}  // namespace typegrad_differential
