#pragma once
// Runs a plan: run-time shapes (with the checks that throw before anything is written), scratch
// sizing, shape-derived scalars, reduction initialisation, then the fused loops stage by stage.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include <typegrad/core/error.hpp>
#include <typegrad/exec/cpu/kernel.hpp>
#include <typegrad/exec/node_filter.hpp>
#include <typegrad/exec/program.hpp>

namespace typegrad::detail {

template <class List, class T>
struct list_ids;
template <class... Ss, class Prog>
struct list_ids<type_list<Ss...>, Prog> {
    static constexpr std::array<std::size_t, sizeof...(Ss)> value{Prog::template id_of<Ss>...};
};

// Everything the planner and kernels need about one (program, outputs) pair.
// Stores: elementwise nodes written to caller (or scratch) buffers; Required: other nodes whose
// value must exist afterwards; Given: nodes whose buffers come from a previous forward pass.
template <class Nodes, class Stores, class Required, class Given, class T>
struct plan_provider {
    using program = detail::program<Nodes>;
    using value_type = T;
    static constexpr std::size_t M = program::size;
    static constexpr auto stores = list_ids<Stores, program>::value;
    static constexpr auto required = list_ids<Required, program>::value;
    static constexpr auto given = list_ids<Given, program>::value;
    static constexpr std::size_t NS = stores.size();
    using request_t = plan_request<M, NS, required.size(), given.size()>;
    static constexpr request_t request{stores, required, given};
    static constexpr plan_sizes sizes = measure_plan<M>(program::info, request);
    static constexpr auto plan = make_plan<M, (sizes.loops ? sizes.loops : 1),
                                           (sizes.members ? sizes.members : 1)>(program::info, request);
    static constexpr std::array<std::size_t, M + 1> rank_offset = [] {
        std::array<std::size_t, M + 1> r{};
        for (std::size_t i = 0; i < M; ++i) r[i + 1] = r[i] + program::info[i].rank;
        return r;
    }();
    static constexpr std::size_t total_rank = rank_offset[M];
    using state_type = exec_state<M, NS, total_rank>;
};

inline std::string extents_text(const std::size_t* e, std::size_t rank) {
    std::string s = "[";
    for (std::size_t i = 0; i < rank; ++i) {
        if (i) s.append(", ");
        s.append(std::to_string(e[i]));
    }
    s.append("]");
    return s;
}

template <class PP>
std::size_t node_numel(const typename PP::state_type& st, std::size_t node) {
    std::size_t n = 1;
    for (std::size_t a = 0; a < PP::program::info[node].rank; ++a) n *= st.ext[PP::rank_offset[node] + a];
    return n;
}

// Row-major strides. They are computed before any size check, so their products are checked
// here: extents whose product overflows are a shape_error, unless one of them is 0 (no element:
// the strides address nothing, and those past the overflow are set to 0).
template <class PP>
void dense_strides(typename PP::state_type& st, std::size_t n) {
    const std::size_t rank = PP::program::info[n].rank;
    const std::size_t* ext = st.ext.data() + PP::rank_offset[n];
    const bool empty = std::find(ext, ext + rank, std::size_t(0)) != ext + rank;
    std::ptrdiff_t stride = 1;
    for (std::size_t a = rank; a-- > 0;) {
        st.stride[PP::rank_offset[n] + a] = stride;
        if (ext[a] > std::size_t(PTRDIFF_MAX) ||
            __builtin_mul_overflow(stride, static_cast<std::ptrdiff_t>(ext[a]), &stride)) {
            if (!empty)
                throw shape_error(message("typegrad: the extents of '", PP::program::info[n].name, "' (node ", n,
                                          ") overflow an element count"));
            stride = 0;
        }
    }
}

template <class PP>
tensor_ref ref_of(const typename PP::state_type& st, std::size_t n) {
    return {st.ptr[n], st.ext.data() + PP::rank_offset[n], st.stride.data() + PP::rank_offset[n],
            PP::program::info[n].rank};
}

// Elementwise and reduction extents from the children's, with the broadcasting checks.
template <class PP>
void elementwise_shape(typename PP::state_type& st, std::size_t n) {
    constexpr auto& info = PP::program::info;
    const node_info& ni = info[n];
    std::size_t* out = st.ext.data() + PP::rank_offset[n];
    if (ni.kind == op_kind::reduce) {
        const std::size_t c = ni.child[0];
        const std::size_t lead = info[c].rank - ni.rank;
        for (std::size_t a = 0; a < ni.rank; ++a)
            out[a] = ni.ext[a] != dyn ? ni.ext[a] : st.ext[PP::rank_offset[c] + a + lead];
        return;
    }
    for (std::size_t a = 0; a < ni.rank; ++a) {
        std::size_t e = ni.ext[a];
        if (e == dyn) {
            for (std::size_t k = 0; k < ni.arity && e == dyn; ++k) {
                const node_info& ci = info[ni.child[k]];
                const std::size_t lead = ni.rank - ci.rank;
                if (a >= lead && ci.ext[a - lead] != 1) e = st.ext[PP::rank_offset[ni.child[k]] + a - lead];
            }
            if (e == dyn) e = 1;
        }
        out[a] = e;
    }
    for (std::size_t k = 0; k < ni.arity; ++k) {
        const node_info& ci = info[ni.child[k]];
        const std::size_t lead = ni.rank - ci.rank;
        const std::size_t* ce = st.ext.data() + PP::rank_offset[ni.child[k]];
        for (std::size_t a = 0; a < ci.rank; ++a) {
            if (ci.ext[a] == 1) continue;  // broadcast
            if (ce[a] != out[a + lead])
                throw shape_error(message("typegrad: '", ni.name, "' (node ", n, ") cannot combine extents ",
                                          extents_text(ce, ci.rank), " of operand ", k, " ('", ci.name,
                                          "') with the result extents ", extents_text(out, ni.rank),
                                          " (dynamic extents must match exactly; they never broadcast)"));
        }
    }
}

template <class PP, std::size_t N>
void shape_node(typename PP::state_type& st) {
    using node = typename PP::program::template node_at<N>;
    constexpr op_kind kind = node::kind;
    if constexpr (kind == op_kind::leaf) {
        dense_strides<PP>(st, N);
    } else if constexpr (kind == op_kind::elementwise || kind == op_kind::reduce) {
        elementwise_shape<PP>(st, N);
        dense_strides<PP>(st, N);
    } else if constexpr (kind == op_kind::view) {
        constexpr std::size_t arity = PP::program::info[N].arity;
        std::array<tensor_ref, arity> in{};
        for (std::size_t k = 0; k < arity; ++k) in[k] = ref_of<PP>(st, PP::program::info[N].child[k]);
        std::size_t* out = st.ext.data() + PP::rank_offset[N];
        std::ptrdiff_t* stride = st.stride.data() + PP::rank_offset[N];
        node::op::template layout<node>(in.data(), out, stride, st.view_offset[N]);
    } else if constexpr (kind == op_kind::kernel) {
        constexpr std::size_t arity = PP::program::info[N].arity;
        std::array<tensor_ref, arity> in{};
        for (std::size_t k = 0; k < arity; ++k) in[k] = ref_of<PP>(st, PP::program::info[N].child[k]);
        node::op::template extents<node>(in.data(), st.ext.data() + PP::rank_offset[N]);
        dense_strides<PP>(st, N);
    }
}

// Fills extents and strides of every non-leaf node from its children's, checking them. Leaf
// extents must have been filled by the caller. Throws before anything is written.
// Leaves, elementwise nodes and reductions share one run-time routine; only views and kernels
// instantiate shape_node (see node_filter.hpp: per-node instantiations grow compile time
// quadratically with the graph).
template <class PP>
void compute_shapes(typename PP::state_type& st) {
    std::size_t next = 0;
    auto generic_until = [&](std::size_t end) {
        for (; next < end; ++next) {
            const op_kind kind = PP::program::info[next].kind;
            if (kind == op_kind::elementwise || kind == op_kind::reduce) elementwise_shape<PP>(st, next);
            if (kind == op_kind::leaf || kind == op_kind::elementwise || kind == op_kind::reduce)
                dense_strides<PP>(st, next);
        }
    };
    for_each_node_of_kind<typename PP::program, op_kind::view, op_kind::kernel>(
        [&]<std::size_t N>(std::integral_constant<std::size_t, N>) {
            generic_until(N);
            shape_node<PP, N>(st);
            next = N + 1;
        });
    generic_until(PP::M);
}

// Scratch is counted in 8-byte units (a plan may hold float and double buffers); each buffer
// starts on a 64-byte boundary.
using scratch_unit = double;

// Element count of a node, or a shape_error when it (or its size in bytes) cannot be represented.
template <class PP>
std::size_t checked_numel(const typename PP::state_type& st, std::size_t node) {
    const std::size_t rank = PP::program::info[node].rank;
    const std::size_t* ext = st.ext.data() + PP::rank_offset[node];
    if (std::find(ext, ext + rank, std::size_t(0)) != ext + rank) return 0;  // however large the others
    std::size_t n = 1;
    for (std::size_t a = 0; a < rank; ++a)
        if (__builtin_mul_overflow(n, ext[a], &n))
            throw shape_error(message("typegrad: the extents of '", PP::program::info[node].name, "' (node ", node,
                                      ") overflow an element count"));
    std::size_t bytes = 0;
    if (__builtin_mul_overflow(n, PP::program::info[node].elem_size, &bytes) ||
        bytes > std::size_t(PTRDIFF_MAX) / 2)
        throw shape_error(message("typegrad: '", PP::program::info[node].name, "' (node ", node, ") would need ", n,
                                  " elements, more than memory can address"));
    return n;
}

template <class PP>
std::size_t scratch_layout(const typename PP::state_type& st, std::array<std::size_t, PP::M + 1>& offset) {
    std::size_t total = 0;
    for (std::size_t n = 0; n < PP::M; ++n) {
        offset[n] = total;
        if (PP::plan.computed[n])
            total += (checked_numel<PP>(st, n) * PP::program::info[n].elem_size + 63) / 64 * 8 +
                     (PP::program::info[n].extra_bytes + 63) / 64 * 8;
    }
    offset[PP::M] = total;
    return total;
}

template <class PP, std::size_t N>
void compute_meta(typename PP::state_type& st, void* buffer) {
    using node = typename PP::program::template node_at<N>;
    constexpr auto& info = PP::program::info;
    if constexpr (node::kind == op_kind::meta) {
        using T = buffer_t<node>;
        using target = typename node::op::target_shape;
        const std::size_t c = info[N].child[0];
        const std::size_t crank = info[c].rank;
        const std::size_t lead = crank - target::rank;
        double removed = 1;
        for (std::size_t a = 0; a < crank; ++a)
            if (a < lead || target::extents[a - lead] == 1) removed *= double(st.ext[PP::rank_offset[c] + a]);
        *static_cast<T*>(buffer) = static_cast<T>(static_cast<compute_t<T>>(1.0 / removed));
    }
}

template <class T>
void fill_identity(void* p, std::size_t n, reduce_kind k) {
    const T init = k == reduce_kind::sum   ? T(0)
                   : k == reduce_kind::max ? -std::numeric_limits<T>::infinity()
                                           : std::numeric_limits<T>::infinity();
    std::fill(static_cast<T*>(p), static_cast<T*>(p) + n, init);
}

// Points every computed node at its scratch buffer, computes metas, initialises reductions.
template <class PP>
void prepare_scratch(typename PP::state_type& st, scratch_unit* scratch,
                     const std::array<std::size_t, PP::M + 1>& offset) {
    constexpr auto& info = PP::program::info;
    for (std::size_t n = 0; n < PP::M; ++n) {
        if (!PP::plan.computed[n]) continue;
        void* p = scratch + offset[n];
        st.ptr[n] = p;
        if (info[n].kind == op_kind::reduce) {
            if (info[n].elem_size == sizeof(double)) fill_identity<double>(p, node_numel<PP>(st, n), info[n].combine);
            else fill_identity<float>(p, node_numel<PP>(st, n), info[n].combine);
        }
    }
    for_each_node_of_kind<typename PP::program, op_kind::meta>([&]<std::size_t N>(std::integral_constant<std::size_t, N>) {
        if (PP::plan.computed[N]) compute_meta<PP, N>(st, scratch + offset[N]);
    });
    // Views alias their input (children first, so chains of views resolve in one sweep).
    for (std::size_t n = 0; n < PP::M; ++n) {
        if (info[n].kind != op_kind::view || !PP::plan.needed[n] || st.ptr[n] != nullptr) continue;
        const auto* base = static_cast<const char*>(st.ptr[info[n].child[0]]);
        st.ptr[n] = base ? base + st.view_offset[n] * std::ptrdiff_t(info[n].elem_size) : nullptr;
    }
}

// The order of work: for each stage, its kernels (in id order) then its loops.
struct step_item {
    bool is_loop;
    std::size_t index;  // loop index or kernel node id
};
template <class PP>
constexpr std::size_t schedule_size() {
    std::size_t n = PP::plan.loop_count;
    for (std::size_t i = 0; i < PP::M; ++i)
        if (PP::plan.computed[i] && PP::program::info[i].kind == op_kind::kernel) ++n;
    return n;
}
template <class PP>
constexpr auto schedule() {
    std::array<step_item, schedule_size<PP>() + 1> r{};
    std::size_t k = 0;
    for (std::size_t s = 0; s <= PP::plan.max_stage; ++s) {
        for (std::size_t i = 0; i < PP::M; ++i)
            if (PP::plan.computed[i] && PP::program::info[i].kind == op_kind::kernel && PP::plan.stage[i] == s)
                r[k++] = {false, i};
        for (std::size_t l = 0; l < PP::plan.loop_count; ++l)
            if (PP::plan.loops[l].stage == s) r[k++] = {true, l};
    }
    return r;
}

// Each loop (loop_kernel::run) and kernel is its own function: inlined into one body, a plan's
// loops make one huge function, and the optimiser's cost grows faster than linearly with a
// function's size. A call per loop costs nothing next to the loop.
template <class PP, std::size_t N>
[[gnu::noinline]] void run_kernel(typename PP::state_type& st) {
    using node = typename PP::program::template node_at<N>;
    using T = buffer_t<node>;
    constexpr std::size_t arity = PP::program::info[N].arity;
    std::array<tensor_ref, arity> in{};
    for (std::size_t k = 0; k < arity; ++k) in[k] = ref_of<PP>(st, PP::program::info[N].child[k]);
    node::op::template run<node>(in.data(), const_cast<T*>(static_cast<const T*>(st.ptr[N])),
                                 st.ext.data() + PP::rank_offset[N]);
}

template <class PP>
inline constexpr auto schedule_v = schedule<PP>();

// After a kernel or loop in anomaly mode: the buffers it wrote must be finite.
template <class PP>
void check_buffer(const typename PP::state_type& st, std::size_t n) {
    if (anomaly_node() != no_anomaly) return;
    const std::size_t count = node_numel<PP>(st, n);
    auto scan = [&](const auto* p) {
        for (std::size_t i = 0; i < count; ++i)
            if (!std::isfinite(static_cast<double>(p[i]))) {
                anomaly_node() = n;
                return;
            }
    };
    switch (PP::program::info[n].buffer) {
        case dtype_code::f64: scan(static_cast<const double*>(st.ptr[n])); break;
        case dtype_code::f32: scan(static_cast<const float*>(st.ptr[n])); break;
        case dtype_code::bf16: scan(static_cast<const bf16*>(st.ptr[n])); break;
        case dtype_code::f16: scan(static_cast<const f16*>(st.ptr[n])); break;
        case dtype_code::other: break;
    }
}

template <class PP, class AccumulateMask, std::size_t I, bool Check>
void run_item(typename PP::state_type& st) {
    constexpr step_item item = schedule_v<PP>[I];
    if constexpr (item.is_loop) {
        loop_kernel<PP, item.index, AccumulateMask, Check>::run(st);
        if constexpr (Check) {
            constexpr loop_plan lp = PP::plan.loops[item.index];
            for (std::size_t m = lp.red_begin; m < lp.mat_end; ++m) check_buffer<PP>(st, PP::plan.members[m]);
        }
    } else {
        run_kernel<PP, item.index>(st);
        if constexpr (Check) check_buffer<PP>(st, item.index);
    }
}

template <class PP, class AccumulateMask, bool Check = false>
void run_loops(typename PP::state_type& st) {
    [&]<std::size_t... Is>(std::index_sequence<Is...>) {
        [[maybe_unused]] const int in_order[] = {0, (run_item<PP, AccumulateMask, Is, Check>(st), 0)...};
    }(std::make_index_sequence<schedule_size<PP>()>{});
}

}  // namespace typegrad::detail
