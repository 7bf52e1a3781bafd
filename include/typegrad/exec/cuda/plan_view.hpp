#pragma once
// What the CUDA generator reads of a plan, as plain data (plan_view): the planner's tables
// (exec/program.hpp), each elementwise node's device expression, constants, and the kernel ops'
// device sources and calls, so that the generator and the launcher are ordinary functions
// compiled once, not once per plan type.
#include <array>
#include <cstddef>
#include <string>
#include <type_traits>

#include <typegrad/exec/execute.hpp>
#include <typegrad/ops/custom.hpp>
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

// A custom op runs on the device when it gives CUDA statements for its forward and backward
// (`static constexpr const char* device_forward = "...";`, `device_backward`): the body of a
// kernel, see docs/cuda.md "Custom ops on the device".
template <class Op>
struct op_device_expr<td::custom_forward_op<Op>> {
    static constexpr const char* value = [] {
        if constexpr (requires { Op::device_forward; }) return static_cast<const char*>(Op::device_forward);
        else return static_cast<const char*>(nullptr);
    }();
};
template <class Op>
struct op_device_expr<td::custom_backward_op<Op>> {
    static constexpr const char* value = [] {
        if constexpr (requires { Op::device_backward; }) return static_cast<const char*>(Op::device_backward);
        else return static_cast<const char*>(nullptr);
    }();
};
inline bool is_custom_node(const node_info& n) {
    return n.kind == op_kind::kernel && (n.name == "custom" || n.name == "custom_backward");
}
inline std::string custom_kernel_name(std::size_t n) { return std::string("tg_custom_") + std::to_string(n); }

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
// A kernel op with a device implementation carries it beside its CPU `run` (ops/index.hpp is
// one): `device_source`, CUDA text defining its kernel templates (emitted once per module), and
// `device_call<N>()`, the call of the node's instantiation on the parameter words `p`.
template <class N>
struct node_kernel_source {
    static constexpr const char* value = nullptr;
    static std::string call() { return {}; }
};
template <class N>
    requires requires { N::op::device_source; }
struct node_kernel_source<N> {
    static constexpr const char* value = N::op::device_source;
    static std::string call() { return N::op::template device_call<N>(); }
};
template <class Plan>
inline constexpr auto kernel_sources = [] {
    std::array<const char*, Plan::M> r{};
    [&]<std::size_t... Ns>(std::index_sequence<Ns...>) {
        ((r[Ns] = node_kernel_source<typename Plan::program::template node_at<Ns>>::value), ...);
    }(std::make_index_sequence<Plan::M>{});
    return r;
}();
template <class Plan>
const std::string* kernel_calls() {
    static const auto r = [] {
        std::array<std::string, Plan::M> c;
        [&]<std::size_t... Ns>(std::index_sequence<Ns...>) {
            ((c[Ns] = node_kernel_source<typename Plan::program::template node_at<Ns>>::call()), ...);
        }(std::make_index_sequence<Plan::M>{});
        return c;
    }();
    return r.data();
}
inline std::string node_kernel_name(std::size_t n) { return std::string("tg_node_") + std::to_string(n); }

// A plan as plain data, so that the generator (and the launcher) are ordinary functions compiled
// once, not once per plan type.
struct plan_view : td::plan_tables {
    const char* const* device = nullptr;
    const double* constants = nullptr;
    const char* const* kernel_source = nullptr;  // a kernel op's device_source, or null
    const std::string* kernel_call = nullptr;
};
template <class Plan>
plan_view view_of() {
    return {td::plan_tables_of<Plan>(), device_exprs<Plan>.data(), constant_values<Plan>.data(), kernel_sources<Plan>.data(),
            kernel_calls<Plan>()};
}

}  // namespace typegrad::cuda::detail
