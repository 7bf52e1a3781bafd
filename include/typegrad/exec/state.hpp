#pragma once
// Where a plan's operands live at run time: the one state object that binding fills (exec/call.hpp,
// exec/execute.hpp) and that the backends' loops read (exec/cpu/kernel.hpp, exec/cuda/).
#include <array>
#include <cstddef>

namespace typegrad::detail {

// Where a loop's operands live at run time.
template <std::size_t M, std::size_t NStores, std::size_t TotalRank>
struct exec_state {
    std::array<const void*, M> ptr{};                // materialised node buffers
    std::array<void*, NStores> out{};                // store destinations
    std::array<std::size_t, TotalRank + 1> ext{};    // run-time extents, node by node
    std::array<std::ptrdiff_t, TotalRank + 1> stride{};  // element strides of materialised nodes
    std::array<std::ptrdiff_t, M> view_offset{};     // element offset of a view into its input
    std::array<void*, M> mut{};                      // writable leaf buffers (post hooks)
};

}  // namespace typegrad::detail
