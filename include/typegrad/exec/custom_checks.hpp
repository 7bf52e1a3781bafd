#pragma once
// The plan-level checks of custom ops (ops/custom.hpp): before a step runs, every input a custom
// kernel declares mutated must be a writable leaf or a buffer the plan owns; and, for a
// create_graph backward, which custom backward kernels mutate an input that requires grad.
// They read a planned program, so they live with the planner, not with the op.
#include <array>
#include <cstddef>
#include <type_traits>
#include <utility>

#include <typegrad/core/error.hpp>
#include <typegrad/exec/node_filter.hpp>
#include <typegrad/exec/program.hpp>
#include <typegrad/ops/custom.hpp>

namespace typegrad {
namespace detail {

// Declared mutations write into their inputs' buffers: a leaf must have been bound writable,
// and anything else must be a buffer the plan owns. Checked before anything runs.
template <class Op, bool Backward, std::size_t K>
constexpr bool declares_mutation() {
    constexpr std::size_t input = Backward ? K - 2 : K;
    if constexpr (Backward && K < 2) return false;
    else if constexpr (Backward) return backward_mutations_t<Op>::template data_of<input>;
    else return forward_mutations_t<Op>::template data_of<input>;
}
template <class N>
struct custom_kernel_info {
    static constexpr bool is_custom = false;
    static constexpr bool backward = false;
};
template <class Op, class... Cs>
struct custom_kernel_info<node<custom_forward_op<Op>, Cs...>> {
    static constexpr bool is_custom = true;
    static constexpr bool backward = false;
    using op = Op;
};
template <class Op, class... Cs>
struct custom_kernel_info<node<custom_backward_op<Op>, Cs...>> {
    static constexpr bool is_custom = true;
    static constexpr bool backward = true;
    using op = Op;
};

// A custom kernel's inputs that it declares mutated must be writable leaves: checked by a routine
// keyed by the op and its arity (a function per node of the plan would be named with the plan).
template <class Op, bool Backward, std::size_t Arity>
void check_custom_node(const node_info* info, std::size_t n, void* const* mut) {
    [&]<std::size_t... Ks>(std::index_sequence<Ks...>) {
        auto child = [&]<std::size_t K>(std::integral_constant<std::size_t, K>) {
            if constexpr (declares_mutation<Op, Backward, K>()) {
                const std::size_t c = info[n].child[K];
                if (info[c].kind == op_kind::leaf) {
                    if (mut[c] == nullptr)
                        fail<binding_error>({"typegrad: custom op input ", K - (Backward ? 2 : 0), " ('",
                                             info[c].name,
                                             "') is mutated but was bound read-only; bind a writable buffer"});
                } else if (info[c].kind == op_kind::view) {
                    fail<binding_error>({"typegrad: custom op input ", K - (Backward ? 2 : 0),
                                         " is mutated but is a view; pass tg::contiguous(x)"});
                }
            }
        };
        (child(std::integral_constant<std::size_t, Ks>{}), ...);
    }(std::make_index_sequence<Arity>{});
}
using custom_check_fn = void (*)(const node_info*, std::size_t, void* const*);
template <class Key>
struct custom_check {
    static constexpr custom_check_fn fn = nullptr;
};
template <class Op, std::size_t Arity, class Shape, class Value, class Buffer>
struct custom_check<op_row_key<custom_forward_op<Op>, Arity, Shape, Value, Buffer>> {
    static constexpr custom_check_fn fn = &check_custom_node<Op, false, Arity>;
};
template <class Op, std::size_t Arity, class Shape, class Value, class Buffer>
struct custom_check<op_row_key<custom_backward_op<Op>, Arity, Shape, Value, Buffer>> {
    static constexpr custom_check_fn fn = &check_custom_node<Op, true, Arity>;
};
// The routine of each kernel node of a program (null for other kernels), by position in
// node_ids_of_kind<Prog, kernel>.
template <class Prog, class Seq = std::make_index_sequence<node_ids_of_kind<Prog, op_kind::kernel>.size()>>
struct custom_checks;
template <class Prog, std::size_t... Is>
struct custom_checks<Prog, std::index_sequence<Is...>> {
    static constexpr std::array<custom_check_fn, sizeof...(Is) + 1> fns{
        custom_check<typename row_key<typename Prog::template node_at<
            node_ids_of_kind<Prog, op_kind::kernel>[Is]>>::type>::fn...,
        nullptr};
};

template <class Plan, class State>
void check_custom_mutations(const State& state) {
    // Custom ops are kernel nodes (see exec/node_filter.hpp).
    constexpr auto& ids = node_ids_of_kind<typename Plan::program, op_kind::kernel>;
    constexpr auto& fns = custom_checks<typename Plan::program>::fns;
    for (std::size_t i = 0; i < ids.size(); ++i) {
        const std::size_t n = ids[i];
        if (fns[i] != nullptr && Plan::plan.needed[n] && Plan::plan.computed[n])
            fns[i](Plan::program::info.data(), n, state.mut.data());
    }
}

// (node, input) pairs of custom backward kernels that mutate an input requiring grad: only
// these can make a create_graph backward fail.
template <class Plan>
constexpr std::size_t create_graph_hazard_count() {
    std::size_t n = 0;
    // Custom ops are kernel nodes: only those are instantiated (see exec/node_filter.hpp).
    for_each_node_of_kind<typename Plan::program, op_kind::kernel>([&]<std::size_t N>(std::integral_constant<std::size_t, N>) {
        using node = typename Plan::program::template node_at<N>;
        using ci = custom_kernel_info<node>;
        if constexpr (ci::backward) {
            [&]<std::size_t... Ks>(std::index_sequence<Ks...>) {
                ((n += (declares_mutation<typename ci::op, true, Ks + 2>() &&
                        type_at_t<Ks + 2, typename node::children>::requires_grad)), ...);
            }(std::make_index_sequence<node::children::size - 2>{});
        }
    });
    return n;
}
struct hazard {
    std::size_t node, input;
};
template <class Plan>
constexpr auto create_graph_hazards() {
    std::array<hazard, create_graph_hazard_count<Plan>()> r{};
    std::size_t k = 0;
    // Custom ops are kernel nodes: only those are instantiated (see exec/node_filter.hpp).
    for_each_node_of_kind<typename Plan::program, op_kind::kernel>([&]<std::size_t N>(std::integral_constant<std::size_t, N>) {
        using node = typename Plan::program::template node_at<N>;
        using ci = custom_kernel_info<node>;
        if constexpr (ci::backward) {
            [&]<std::size_t... Ks>(std::index_sequence<Ks...>) {
                ((declares_mutation<typename ci::op, true, Ks + 2>() &&
                          type_at_t<Ks + 2, typename node::children>::requires_grad
                      ? void(r[k++] = hazard{N, Ks})
                      : void()),
                 ...);
            }(std::make_index_sequence<node::children::size - 2>{});
        }
    });
    return r;
}

}  // namespace detail
}  // namespace typegrad
