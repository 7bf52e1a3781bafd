#pragma once
// What an op family declares about autocast (docs/autocast.md). A primitive op declares its class
// per device with `static constexpr autocast_class autocast_on(device_kind)` (ops that declare
// nothing promote). Composite ops (losses, softmax, ...) are built from primitive nodes; they mark
// their inputs with an autocast_entry node that carries the composite's class, so a region
// (autocast/rewrite.hpp) casts at the composite's entry as PyTorch does at the op's. Outside any
// region entries are removed too.
#include <cstddef>

#include <typegrad/core/dtype.hpp>
#include <typegrad/graph/node.hpp>
#include <typegrad/ops/op_base.hpp>

namespace typegrad {
namespace detail {

// An op declares its class with `static constexpr autocast_class autocast_on(device_kind)`;
// ops that declare nothing promote. A custom op declares `static constexpr autocast_class
// autocast` (see custom.hpp), forwarded by its node op.
template <class Op>
constexpr autocast_class autocast_class_of(device_kind d) {
    if constexpr (requires { Op::autocast_on(device_kind::cpu); }) return Op::autocast_on(d);
    else return autocast_class::promote;
}

// An identity op that carries a composite's autocast class (per device) for the rewrite. It is an
// alias op (graph/node.hpp): everything but the rewrite sees through it, so compile() lowers a
// graph with entries as the graph without them, and never builds an entry-free copy as types.
template <autocast_class OnCpu, autocast_class OnCuda>
struct autocast_entry_op : elementwise_op {
    static constexpr unsigned cost = 0;  // an identity: no instruction to recompute
    static constexpr const char* name = "autocast_entry";
    static constexpr bool is_alias = true;
    static constexpr autocast_class class_on(device_kind d) { return d == device_kind::cpu ? OnCpu : OnCuda; }
    template <class V>
    static V apply(const V& x) { return x; }
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X) { return g; }
};

// The identity ops the autocast rewrite reads (the region marker adds itself in autocast/rewrite.hpp).
template <class Op>
inline constexpr bool is_autocast_marker_v = false;
template <autocast_class A, autocast_class B>
inline constexpr bool is_autocast_marker_v<autocast_entry_op<A, B>> = true;

// A composite op's input under its class (no node at all for labels and constants).
template <autocast_class OnCpu, autocast_class OnCuda, expression X>
constexpr auto autocast_entry(X x) {
    if constexpr (is_dtype_v<typename X::value_type>) return make_node<autocast_entry_op<OnCpu, OnCuda>>(x);
    else return x;
}

// The entries of composites in PyTorch's fp32 lists: everywhere (losses) or on CUDA only
// (log_sum_exp, softmax, log_softmax).
template <expression X>
constexpr auto fp32_entry(X x) { return autocast_entry<autocast_class::fp32, autocast_class::fp32>(x); }
template <expression X>
constexpr auto fp32_on_cuda_entry(X x) { return autocast_entry<autocast_class::promote, autocast_class::fp32>(x); }
// The entries of ops on PyTorch's lower-precision lists that are not one matmul node: matmul of
// two vectors (a fused sum of products) and linear's bias (PyTorch casts all of linear's inputs).
template <expression X>
constexpr auto lower_precision_entry(X x) {
    return autocast_entry<autocast_class::lower_precision, autocast_class::lower_precision>(x);
}
}  // namespace detail
}  // namespace typegrad
