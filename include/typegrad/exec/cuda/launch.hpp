#pragma once
// How a loop of a plan is launched: its groups of reductions (one kernel each), the operands a
// group reads and writes, and the layout of the parameter words the host fills per launch.
#include <cstddef>
#include <string>
#include <vector>

#include <typegrad/exec/cuda/plan_view.hpp>

namespace typegrad::cuda::detail {

// Threads per block of every generated kernel (the prelude's TG_BLOCK).
inline constexpr unsigned block_size = 256;

// ---- loop groups and the layout of their parameter words -----------------------------------
struct group_desc {
    std::size_t loop = 0;
    std::uint32_t mask = 0;            // bit a: iteration axis a is reduced
    std::vector<std::size_t> reds;     // reduction node ids
    bool outputs = false;              // writes the loop's materialisations and stores
};

inline bool output_broadcast_axis(const plan_view& pv, std::size_t node, std::size_t iter, std::size_t axis) {
    const node_info& p = pv.info[node];
    const node_info& f = pv.info[iter];
    const std::size_t lead = f.rank - p.rank;
    if (axis < lead) return true;
    return p.ext[axis - lead] == 1 && f.ext[axis] != 1;
}

inline std::vector<group_desc> loop_groups(const plan_view& pv, std::size_t L) {
    const td::loop_plan& lp = pv.loops[L];
    const std::size_t rank = pv.info[lp.iter].rank;
    std::vector<group_desc> groups;
    for (std::size_t m = lp.red_begin; m < lp.red_end; ++m) {
        const std::size_t r = pv.members[m];
        std::uint32_t mask = 0;
        for (std::size_t a = 0; a < rank; ++a)
            if (output_broadcast_axis(pv, r, lp.iter, a)) mask |= 1u << a;
        bool placed = false;
        for (auto& g : groups)
            if (g.mask == mask) {
                g.reds.push_back(r);
                placed = true;
            }
        if (!placed) groups.push_back({L, mask, {r}, false});
    }
    if (groups.empty()) groups.push_back({L, 0, {}, false});
    groups.front().outputs = true;
    return groups;
}

// Operands of a group kernel, in parameter order: the loop's inputs, the group's reductions,
// then (first group) the materialisations and stores. For stores, `store_index` is set.
enum class operand_role { input, reduction, materialisation, store };
struct operand_desc {
    std::size_t node;
    operand_role role;
    std::size_t store_index = 0;
};

inline std::vector<operand_desc> group_operands(const plan_view& pv, const group_desc& g) {
    const td::loop_plan& lp = pv.loops[g.loop];
    std::vector<operand_desc> ops;
    for (std::size_t m = lp.in_begin; m < lp.in_end; ++m) ops.push_back({pv.members[m], operand_role::input});
    for (std::size_t r : g.reds) ops.push_back({r, operand_role::reduction});
    if (g.outputs) {
        for (std::size_t m = lp.mat_begin; m < lp.mat_end; ++m) ops.push_back({pv.members[m], operand_role::materialisation});
        for (std::size_t m = lp.store_begin; m < lp.store_end; ++m)
            ops.push_back({pv.stores[pv.members[m]], operand_role::store, pv.members[m]});
    }
    return ops;
}

// Word indices: 0 O, 1 K, 2 G (chunks), 3 CH (chunk length), 4 mode; 5.. iteration extents;
// then per operand its address (or, for a meta, its value as double bits) and one stride per
// iteration axis; then one accumulate flag per store; then one partials address per reduction.
struct word_layout {
    std::size_t rank = 0;
    std::size_t n_ops = 0;
    std::size_t n_stores = 0;
    std::size_t n_reds = 0;
    static constexpr std::size_t ext_begin = 5;
    std::size_t operand(std::size_t o) const { return ext_begin + rank + o * (1 + rank); }
    std::size_t stride(std::size_t o, std::size_t a) const { return operand(o) + 1 + a; }
    std::size_t flag(std::size_t s) const { return operand(n_ops) + s; }
    std::size_t partial(std::size_t r) const { return flag(n_stores) + r; }
    std::size_t words() const { return partial(n_reds); }
};

inline word_layout layout_of(const plan_view& pv, const group_desc& g, const std::vector<operand_desc>& ops) {
    word_layout w;
    w.rank = pv.info[pv.loops[g.loop].iter].rank;
    w.n_ops = ops.size();
    for (const auto& o : ops) w.n_stores += o.role == operand_role::store;
    w.n_reds = g.reds.size();
    return w;
}

inline std::string kernel_name(std::size_t loop, std::size_t group) {
    return std::string("tg_loop_") + std::to_string(loop) + std::string("_") + std::to_string(group);
}

}  // namespace typegrad::cuda::detail
