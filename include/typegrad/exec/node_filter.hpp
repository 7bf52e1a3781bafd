#pragma once
// Per-node code only where a node's type matters.
//
// A function template instantiated once per node of a plan carries the whole plan type in its
// symbol name, so M such instantiations cost O(M^2) characters of mangled names (g++ builds
// every name, even of functions it inlines away). For a 40-op chain this was 4.8 MB of symbol
// text, 0.5 MB without it; the reverse-mode transform has the same problem and remains the
// dominant compile-time cost (benchmarks/README.md, "Compile time"). Work that is the same for
// every node of a kind runs as a run-time loop
// over the constexpr node table; type-specific work goes through these filtered id lists, so
// it is instantiated only for the nodes that need it (leaves, views, kernels, metas: few).
#include <array>
#include <cstddef>
#include <type_traits>
#include <utility>

#include <typegrad/exec/program.hpp>

namespace typegrad::detail {

template <class Prog, op_kind... Kinds>
constexpr std::size_t count_nodes_of_kind() {
    std::size_t c = 0;
    for (std::size_t i = 0; i < Prog::size; ++i)
        if (((Prog::info[i].kind == Kinds) || ...)) ++c;
    return c;
}

// Ids of the program's nodes of the given kinds, ascending (children before parents).
template <class Prog, op_kind... Kinds>
inline constexpr auto node_ids_of_kind = [] {
    std::array<std::size_t, count_nodes_of_kind<Prog, Kinds...>()> r{};
    std::size_t k = 0;
    for (std::size_t i = 0; i < Prog::size; ++i)
        if (((Prog::info[i].kind == Kinds) || ...)) r[k++] = i;
    return r;
}();

// f(std::integral_constant<std::size_t, Id>{}) for each node of the given kinds, in id order.
template <class Prog, op_kind... Kinds, class F>
constexpr void for_each_node_of_kind(F&& f) {
    constexpr auto& ids = node_ids_of_kind<Prog, Kinds...>;
    [&]<std::size_t... Is>(std::index_sequence<Is...>) {
        [[maybe_unused]] const int in_order[] = {0, (f(std::integral_constant<std::size_t, ids[Is]>{}), 0)...};
    }(std::make_index_sequence<ids.size()>{});
}

}  // namespace typegrad::detail
