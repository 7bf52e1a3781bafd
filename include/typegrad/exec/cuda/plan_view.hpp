#pragma once
// What the CUDA generator reads of a plan, as plain data (plan_view): the planner's tables
// (exec/program.hpp), each elementwise node's device expression, constants, and the kernel ops'
// device kernels as text, so that the generator and the launcher are ordinary functions
// compiled once, not once per plan type.
#include <array>
#include <cstddef>
#include <string>
#include <type_traits>

#include <typegrad/exec/execute.hpp>
#include <typegrad/ops/hook.hpp>

namespace typegrad::cuda::detail {

namespace td = typegrad::detail;
using td::node_info;
using typegrad::op_kind;

// ---- the device expression of an elementwise node -----------------------------------------
template <class Op>
struct op_device_expr {
    static constexpr const char* value = nullptr;
};
template <class Op>
    requires requires { Op::device; }
struct op_device_expr<Op> {
    static constexpr const char* value = Op::device;
};
// An elementwise hook runs on the device when its function object names a device expression
// (`static constexpr const char* device = "{0} + (T)10";`).
template <class F>
struct op_device_expr<td::hook_apply_op<F>> {
    static constexpr const char* value = [] {
        if constexpr (requires { F::device; }) return static_cast<const char*>(F::device);
        else return static_cast<const char*>(nullptr);
    }();
};

// Leaves and constants have no op.
template <class N>
struct node_op {
    using type = void;
};
template <class Op, class... Cs>
struct node_op<node<Op, Cs...>> {
    using type = Op;
};
template <>
struct op_device_expr<void> {
    static constexpr const char* value = nullptr;
};

// The value of every constant node (0 elsewhere).
template <class N>
constexpr double constant_value() {
    if constexpr (is_constant_v<N>) return N::value;
    else return 0.0;
}
template <class Plan>
inline constexpr auto constant_values = [] {
    std::array<double, Plan::M> r{};
    [&]<std::size_t... Ns>(std::index_sequence<Ns...>) {
        ((r[Ns] = constant_value<typename Plan::program::template node_at<Ns>>()), ...);
    }(std::make_index_sequence<Plan::M>{});
    return r;
}();

template <class Plan>
inline constexpr auto device_exprs = [] {
    std::array<const char*, Plan::M> r{};
    [&]<std::size_t... Ns>(std::index_sequence<Ns...>) {
        ((r[Ns] = op_device_expr<typename node_op<typename Plan::program::template node_at<Ns>>::type>::value), ...);
    }(std::make_index_sequence<Plan::M>{});
    return r;
}();
// A kernel op carries its device path beside its CPU `run` (core/device_kernel.hpp): a node
// kernel (device_source: CUDA text defining its templates, emitted once per module, and
// device_call<N>(), the node's instantiation on the parameter words `p`; or the node's own
// function from device_definition<N>(fn)), launched once on device_words<N>, or driven by
// device_run<N>, host code on the backend's primitives.
template <class N>
concept has_device_kernel = requires { N::op::device_source; };
struct device_probe {};
template <class N>
concept has_device_run = requires(const td::tensor_ref* in, device_probe& dev) {
    N::op::template device_run<N>(in, nullptr, nullptr, dev);
};
template <class N>
concept has_device_definition = requires { N::op::template device_definition<N>(std::string()); };

// A node's device kernel as text: the op's shared templates, the node's own function, and the
// call of the node's entry point on its parameter words `p`.
struct node_kernel_text {
    const char* shared = nullptr;  // the op's device_source, emitted once per module
    std::string definition;        // device_definition's function
    std::string call;              // empty: the node has no kernel
};
template <class N>
node_kernel_text node_kernel_text_of(const std::string& fn) {
    if constexpr (has_device_kernel<N>) return {N::op::device_source, {}, N::op::template device_call<N>()};
    else if constexpr (has_device_definition<N>) return {nullptr, N::op::template device_definition<N>(fn), fn};
    else return {};
}
inline std::string node_kernel_name(std::size_t n) { return std::string("tg_node_") + std::to_string(n); }
// Every node's kernel text (empty where it has none), once per plan type.
template <class Plan>
const node_kernel_text* kernel_texts() {
    static const auto r = [] {
        std::array<node_kernel_text, Plan::M> t;
        [&]<std::size_t... Ns>(std::index_sequence<Ns...>) {
            ((t[Ns] = node_kernel_text_of<typename Plan::program::template node_at<Ns>>(node_kernel_name(Ns) + "_body")), ...);
        }(std::make_index_sequence<Plan::M>{});
        return t;
    }();
    return r.data();
}

// A plan as plain data, so that the generator (and the launcher) are ordinary functions compiled
// once, not once per plan type.
struct plan_view : td::plan_tables {
    const char* const* device = nullptr;
    const double* constants = nullptr;
    const node_kernel_text* kernel = nullptr;  // [node]: a kernel op's device kernel (empty: none)
};
template <class Plan>
plan_view view_of() {
    return {td::plan_tables_of<Plan>(), device_exprs<Plan>.data(), constant_values<Plan>.data(), kernel_texts<Plan>()};
}

}  // namespace typegrad::cuda::detail
