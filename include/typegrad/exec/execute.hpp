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
#include <typegrad/exec/state.hpp>

namespace typegrad::detail {

template <class List, class T>
struct list_ids;
template <class... Ss, class Prog>
struct list_ids<type_list<Ss...>, Prog> {
    static constexpr std::array<std::size_t, sizeof...(Ss)> value{Prog::template id_of<Ss>::value...};
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
    // Each a constant evaluation of its own: clang stops one after 2^20 steps (a planner run
    // takes over 400 k for 4 GPT blocks), so the shape classes are not recomputed inside both
    // planner runs.
    static constexpr symbolic_shapes<M> sym = symbolic<M>(program::info);
    static constexpr plan_sizes sizes = measure_plan<M>(program::info, sym, request);
    static constexpr auto plan = make_plan<M, (sizes.loops ? sizes.loops : 1),
                                           (sizes.members ? sizes.members : 1)>(program::info, sym, request);
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

template <class Plan>
std::size_t node_numel(const typename Plan::state_type& state, std::size_t node) {
    std::size_t n = 1;
    for (std::size_t a = 0; a < Plan::program::info[node].rank; ++a) n *= state.ext[Plan::rank_offset[node] + a];
    return n;
}

// Row-major strides. They are computed before any size check, so their products are checked
// here: extents whose product overflows are a shape_error, unless one of them is 0 (no element:
// the strides address nothing, and those past the overflow are set to 0).
template <class Plan>
void dense_strides(typename Plan::state_type& state, std::size_t n) {
    const std::size_t rank = Plan::program::info[n].rank;
    const std::size_t* ext = state.ext.data() + Plan::rank_offset[n];
    const bool empty = std::find(ext, ext + rank, std::size_t(0)) != ext + rank;
    std::ptrdiff_t stride = 1;
    for (std::size_t a = rank; a-- > 0;) {
        state.stride[Plan::rank_offset[n] + a] = stride;
        if (ext[a] > std::size_t(PTRDIFF_MAX) ||
            __builtin_mul_overflow(stride, static_cast<std::ptrdiff_t>(ext[a]), &stride)) {
            if (!empty)
                fail<shape_error>({"typegrad: the extents of '", Plan::program::info[n].name, "' (node ", n,
                                   ") overflow an element count"});
            stride = 0;
        }
    }
}

template <class Plan>
tensor_ref ref_of(const typename Plan::state_type& state, std::size_t n) {
    return {state.ptr[n], state.ext.data() + Plan::rank_offset[n], state.stride.data() + Plan::rank_offset[n],
            Plan::program::info[n].rank};
}

// Elementwise and reduction extents from the children's, with the broadcasting checks.
template <class Plan>
void elementwise_shape(typename Plan::state_type& state, std::size_t n) {
    constexpr auto& info = Plan::program::info;
    const node_info& ni = info[n];
    std::size_t* out = state.ext.data() + Plan::rank_offset[n];
    if (ni.kind == op_kind::reduce) {
        const std::size_t c = ni.child[0];
        const std::size_t lead = info[c].rank - ni.rank;
        for (std::size_t a = 0; a < ni.rank; ++a)
            out[a] = ni.ext[a] != dyn ? ni.ext[a] : state.ext[Plan::rank_offset[c] + a + lead];
        return;
    }
    for (std::size_t a = 0; a < ni.rank; ++a) {
        std::size_t e = ni.ext[a];
        if (e == dyn) {
            for (std::size_t k = 0; k < ni.arity && e == dyn; ++k) {
                const node_info& ci = info[ni.child[k]];
                const std::size_t lead = ni.rank - ci.rank;
                if (a >= lead && ci.ext[a - lead] != 1) e = state.ext[Plan::rank_offset[ni.child[k]] + a - lead];
            }
            if (e == dyn) e = 1;
        }
        out[a] = e;
    }
    for (std::size_t k = 0; k < ni.arity; ++k) {
        const node_info& ci = info[ni.child[k]];
        const std::size_t lead = ni.rank - ci.rank;
        const std::size_t* ce = state.ext.data() + Plan::rank_offset[ni.child[k]];
        for (std::size_t a = 0; a < ci.rank; ++a) {
            if (ci.ext[a] == 1) continue;  // broadcast
            if (ce[a] != out[a + lead])
                fail<shape_error>({"typegrad: '", ni.name, "' (node ", n, ") cannot combine extents ",
                                   extents_text(ce, ci.rank), " of operand ", k, " ('", ci.name,
                                   "') with the result extents ", extents_text(out, ni.rank),
                                   " (dynamic extents must match exactly; they never broadcast)"});
        }
    }
}

// ---- per-node routines, instantiated from the node alone --------------------------------------
// Views, kernels and metas need their node's type. Their routines are instantiated from a
// shallow copy of the node: the op over stubs that hold only each operand's dtype, static shape
// and buffer type. A name holding the node's subgraph (or the plan) would be O(N) long for each
// of O(N) nodes: quadratic symbol text, which g++ builds even for functions it inlines away.
// The node and operand ids come at run time (node_call); a plan calls the routines through
// tables of function pointers (node_tables), so no function is instantiated per node of a plan.
template <class V, class S, class Buf, op_kind Kind, bool RequiresGrad, bool Contiguous>
struct operand_stub : operand_metadata<V, S, Kind, RequiresGrad, Contiguous> {
    static constexpr node_desc desc{0, 0};
};
template <class V, class S, class Buf, op_kind Kind, bool RequiresGrad, bool Contiguous>
struct buffer_type<operand_stub<V, S, Buf, Kind, RequiresGrad, Contiguous>> {
    using type = Buf;
};
template <class C>
using operand_stub_of = operand_stub<typename C::value_type, typename C::shape_type, buffer_t<C>, C::kind,
                                     C::requires_grad, C::contiguous>;
template <class N>
struct shallow_node;
template <class Op, class... Cs>
struct shallow_node<node<Op, Cs...>> {
    using type = node<Op, operand_stub_of<unalias_t<Cs>>...>;  // an operand's markers are not its own
    static_assert(__is_same(typename type::value_type, typename node<Op, Cs...>::value_type) &&
                      __is_same(typename type::shape_type, typename node<Op, Cs...>::shape_type) &&
                      __is_same(buffer_t<type>, buffer_t<node<Op, Cs...>>),
                  "typegrad: internal: an op's result type depends on more than its operands' dtypes and shapes");
};
template <class N>
using shallow_t = typename shallow_node<N>::type;

// A node's run-time view of a plan: ids[0] its id, ids[1] the start of its extents, ids[2] its
// arity, then (id, extents start) per operand.
inline constexpr std::size_t node_call_width = 3 + 2 * max_arity;
struct node_call {
    const void* const* ptr;
    std::size_t* ext;
    std::ptrdiff_t* stride;
    std::ptrdiff_t* view_offset;
    const std::size_t* ids;
};
template <class S>
[[gnu::always_inline]] inline std::array<tensor_ref, S::children::size + 1> operand_refs(const node_call& c) {
    std::array<tensor_ref, S::children::size + 1> in{};
    [&]<std::size_t... Ks>(std::index_sequence<Ks...>) {
        ((in[Ks] = tensor_ref{c.ptr[c.ids[3 + 2 * Ks]], c.ext + c.ids[4 + 2 * Ks], c.stride + c.ids[4 + 2 * Ks],
                              type_at_t<Ks, typename S::children>::shape_type::rank}),
         ...);
    }(std::make_index_sequence<S::children::size>{});
    return in;
}
// A view's layout, or a kernel's extents (its dense strides follow, by the caller).
template <class S>
[[gnu::noinline]] void node_shape(const node_call& c) {
    const auto in = operand_refs<S>(c);
    if constexpr (S::kind == op_kind::view) {
        static_assert(view_op_declares_layout<S>,
                      "typegrad: a view op struct lacks its layout (the op is the node type's first argument, in the note below): "
                      "template <class N, class Ref> static void layout(const Ref* in, std::size_t* ext, "
                      "std::ptrdiff_t* stride, std::ptrdiff_t& offset) (docs/design.md, \"Where do I add\")");
        if constexpr (view_op_declares_layout<S>)
            S::op::template layout<S>(in.data(), c.ext + c.ids[1], c.stride + c.ids[1], c.view_offset[c.ids[0]]);
    } else {
        static_assert(kernel_op_declares_extents<S>,
                      "typegrad: a kernel op struct lacks its run-time extents (the op is the node type's first argument, in the note below): "
                      "template <class N, class Ref> static void extents(const Ref* in, std::size_t* ext) "
                      "(docs/design.md, \"Where do I add\")");
        if constexpr (kernel_op_declares_extents<S>) S::op::template extents<S>(in.data(), c.ext + c.ids[1]);
    }
}
// Each kernel is its own function: inlined into one body, a plan's loops and kernels make one
// huge function, and the optimiser's cost grows faster than linearly with a function's size.
template <class S>
[[gnu::noinline]] void node_run(const node_call& c) {
    using T = buffer_t<S>;
    static_assert(kernel_op_declares_run<S>,
                  "typegrad: a kernel op struct lacks its CPU routine (the op is the node type's first argument, in the note below): "
                  "template <class N, class Ref, class T> static void run(const Ref* in, T* out, const std::size_t* ext) "
                  "(docs/design.md, \"Where do I add\")");
    const auto in = operand_refs<S>(c);
    if constexpr (kernel_op_declares_run<S>)
        S::op::template run<S>(in.data(), const_cast<T*>(static_cast<const T*>(c.ptr[c.ids[0]])), c.ext + c.ids[1]);
}
// A shape-derived scalar (1 / the count a mean divides by), from its operand's extents.
template <class S>
void write_meta(const std::size_t* cext, void* out) {
    using T = buffer_t<S>;
    using target = typename S::op::target_shape;
    constexpr std::size_t crank = type_at_t<0, typename S::children>::shape_type::rank;
    constexpr std::size_t lead = crank - target::rank;
    double removed = 1;
    for (std::size_t a = 0; a < crank; ++a)
        if (a < lead || target::extents[a - lead] == 1) removed *= double(cext[a]);
    *static_cast<T*>(out) = static_cast<T>(static_cast<compute_t<T>>(1.0 / removed));
}
template <class S>
[[gnu::noinline]] void node_meta(const node_call& c) {
    write_meta<S>(c.ext + c.ids[4], const_cast<void*>(c.ptr[c.ids[0]]));
}

using node_fn = void (*)(const node_call&);
// Keyed by the shallow node (node_fns_of): a static member per node of a plan would be named
// with the node's subgraph.
template <class N, op_kind Kind = N::kind>
struct node_fns {
    static constexpr node_fn shape = nullptr, run = nullptr, meta = nullptr;
};
template <class N>
struct node_fns<N, op_kind::view> {
    static constexpr node_fn shape = &node_shape<N>, run = nullptr, meta = nullptr;
};
template <class N>
struct node_fns<N, op_kind::kernel> {
    static constexpr node_fn shape = &node_shape<N>, run = &node_run<N>, meta = nullptr;
};
template <class N>
struct node_fns<N, op_kind::meta> {
    static constexpr node_fn shape = nullptr, run = nullptr, meta = &node_meta<N>;
};

struct no_node_fns {
    static constexpr node_fn shape = nullptr, run = nullptr, meta = nullptr;
};
template <class N>
struct node_fns_of {
    using type = no_node_fns;  // leaves and constants
};
template <bool HasRoutine, class N>
struct routine_fns {
    using type = no_node_fns;  // elementwise and reductions run in loops
};
template <class N>
struct routine_fns<true, N> {
    using type = node_fns<shallow_t<N>>;
};
template <class Op, class... Cs>
struct node_fns_of<node<Op, Cs...>>
    : routine_fns<Op::kind == op_kind::view || Op::kind == op_kind::kernel || Op::kind == op_kind::meta,
                  node<Op, Cs...>> {};

// The per-node routines of a plan and their operand tables: data, one symbol each per plan.
template <class Plan>
struct node_tables {
    using prog = typename Plan::program;
    static constexpr std::array<std::size_t, Plan::M * node_call_width + 1> ids = [] {
        std::array<std::size_t, Plan::M * node_call_width + 1> r{};
        for (std::size_t n = 0; n < Plan::M; ++n) {
            std::size_t* row = r.data() + n * node_call_width;
            const node_info& ni = prog::info[n];
            row[0] = n;
            row[1] = Plan::rank_offset[n];
            row[2] = ni.arity;
            for (std::size_t k = 0; k < ni.arity; ++k) {
                row[3 + 2 * k] = ni.child[k];
                row[4 + 2 * k] = Plan::rank_offset[ni.child[k]];
            }
        }
        return r;
    }();
    template <std::size_t... Is>
    static constexpr std::array<node_fn, Plan::M + 1> shapes(std::index_sequence<Is...>) {
        return {node_fns_of<typename prog::template node_at<Is>>::type::shape..., nullptr};
    }
    template <std::size_t... Is>
    static constexpr std::array<node_fn, Plan::M + 1> runs(std::index_sequence<Is...>) {
        return {node_fns_of<typename prog::template node_at<Is>>::type::run..., nullptr};
    }
    template <std::size_t... Is>
    static constexpr std::array<node_fn, Plan::M + 1> metas(std::index_sequence<Is...>) {
        return {node_fns_of<typename prog::template node_at<Is>>::type::meta..., nullptr};
    }
    static constexpr auto shape = shapes(std::make_index_sequence<Plan::M>{});
    static constexpr auto run = runs(std::make_index_sequence<Plan::M>{});
    static constexpr auto meta = metas(std::make_index_sequence<Plan::M>{});
};
template <class Plan>
node_call node_call_of(typename Plan::state_type& state, std::size_t n) {
    return {state.ptr.data(), state.ext.data(), state.stride.data(), state.view_offset.data(),
            node_tables<Plan>::ids.data() + n * node_call_width};
}

// Meta node N's value into buffer (the CUDA backend keeps it on the host).
template <class Plan, std::size_t N>
void compute_meta(typename Plan::state_type& state, void* buffer) {
    write_meta<shallow_t<typename Plan::program::template node_at<N>>>(
        state.ext.data() + Plan::rank_offset[Plan::program::info[N].child[0]], buffer);
}

// Fills extents and strides of every non-leaf node from its children's, checking every one:
// the reference pass, which names the node a check fails at. Leaf extents must have been
// filled by the caller. Throws before anything is written.
template <class Plan>
void compute_shapes_checked(typename Plan::state_type& state) {
    for (std::size_t n = 0; n < Plan::M; ++n) {
        const op_kind kind = Plan::program::info[n].kind;
        if (kind == op_kind::elementwise || kind == op_kind::reduce) elementwise_shape<Plan>(state, n);
        if (kind == op_kind::view || kind == op_kind::kernel) node_tables<Plan>::shape[n](node_call_of<Plan>(state, n));
        if (kind == op_kind::leaf || kind == op_kind::elementwise || kind == op_kind::reduce ||
            kind == op_kind::kernel)
            dense_strides<Plan>(state, n);
    }
}

// ---- the shape pass as a straight-line program ------------------------------------------------
// compute_shapes_checked walks every node and every operand axis on every call, reading the
// node rows at run time: a quarter of a small step (normal_log_pdf at 16 floats). The shape
// program is the same pass with what the plan knows done at compile time: each elementwise or
// reduced extent is a copy (or a constant), dense strides are copied from an operand with the
// same extents, and only the checks that earlier checks and copies do not already imply remain
// (a chain of elementwise ops over one leaf checks nothing). Rank-0 nodes cost nothing.
enum class shape_op : unsigned char { set, copy, check, routine, strides, copy_strides, copy_node };
struct shape_step {
    std::uint32_t a = 0, b = 0;  // positions in ext/stride, or a node id (routine, strides)
    std::uint16_t count = 0;     // copy_strides, copy_node: the rank
    shape_op op = shape_op::set;
};
template <std::size_t N>
struct shape_program {
    bool usable = true;  // false: ids or static extents past 32 bits (never in practice)
    std::size_t size = 0;
    shape_step steps[N ? N : 1]{};
};

// The program of a plan's nodes: writes its steps to out, returns their count. Union-find
// over (node, axis) positions: two positions in one class hold equal extents once the steps so
// far have run (a copy, or a check that passed). Static axes of elementwise and reduced nodes
// hold their static extents (the steps set them); leaves', views' and kernels' extents are
// not assumed (they come from bindings and routines). Linear in the positions and operand axes.
template <std::size_t M, std::size_t R>
constexpr std::size_t make_shape_steps(const node_info* info, const std::size_t* offset, shape_step* out,
                                       bool& usable) {
    std::size_t up_[R + 1]{};  // 0: a class's root; else its parent's position + 1
    std::size_t* const up = up_;
    auto find = [up](std::size_t a) {
        for (; up[a]; a = up[a] - 1)
            if (up[up[a] - 1]) up[a] = up[up[a] - 1];  // path halving
        return a;
    };
    auto unite = [&](std::size_t a, std::size_t b) {
        a = find(a);
        b = find(b);
        if (a != b) up[b] = a + 1;
    };
    auto set_by_steps = [info](std::size_t n) {
        return info[n].kind == op_kind::elementwise || info[n].kind == op_kind::reduce;
    };
    std::size_t count = 0;
    auto emit = [&](shape_op op, std::size_t a, std::size_t b, std::size_t c) {
        if (a > UINT32_MAX || b > UINT32_MAX) usable = false;
        out[count] = {static_cast<std::uint32_t>(a), static_cast<std::uint32_t>(b), static_cast<std::uint16_t>(c), op};
        ++count;
    };
    auto dense = [&](std::size_t n) {
        const op_kind k = info[n].kind;
        return k == op_kind::leaf || k == op_kind::elementwise || k == op_kind::reduce || k == op_kind::kernel;
    };
    for (std::size_t n = 0; n < M; ++n) {
        const node_info& ni = info[n];
        const std::size_t p0 = offset[n];
        if (ni.kind == op_kind::leaf) {
            if (ni.rank) emit(shape_op::strides, n, 0, 0);
        } else if (ni.kind == op_kind::view || ni.kind == op_kind::kernel) {
            emit(shape_op::routine, n, 0, 0);
            if (ni.kind == op_kind::kernel && ni.rank) emit(shape_op::strides, n, 0, 0);
        } else if (ni.kind == op_kind::reduce) {
            const std::size_t c = ni.child[0], lead = info[c].rank - ni.rank;
            for (std::size_t a = 0; a < ni.rank; ++a) {
                if (ni.ext[a] != dyn) {
                    emit(shape_op::set, p0 + a, ni.ext[a], 0);
                } else {
                    emit(shape_op::copy, p0 + a, offset[c] + a + lead, 0);
                    unite(offset[c] + a + lead, p0 + a);
                }
            }
            if (ni.rank) emit(shape_op::strides, n, 0, 0);
        } else if (ni.kind == op_kind::elementwise) {
            // extents: as compute_shapes_checked (the first operand not broadcast on the axis)
            std::size_t from[max_rank]{}, whole = M;  // whole: every axis from this dense operand's
            for (std::size_t a = 0; a < ni.rank; ++a) {
                from[a] = R;
                std::size_t c = M;
                if (ni.ext[a] == dyn)
                    for (std::size_t k = 0; k < ni.arity && from[a] == R; ++k) {
                        const node_info& ci = info[ni.child[k]];
                        const std::size_t lead = ni.rank - ci.rank;
                        if (a >= lead && ci.ext[a - lead] != 1)
                            from[a] = offset[ni.child[k]] + a - lead, c = lead == 0 ? ni.child[k] : M;
                    }
                whole = a == 0 ? c : whole == c ? whole : M;
            }
            if (ni.rank && whole != M && dense(whole)) {
                emit(shape_op::copy_node, p0, offset[whole], ni.rank);  // extents and strides
                for (std::size_t a = 0; a < ni.rank; ++a) unite(from[a], p0 + a);
            } else {
                whole = M;
                for (std::size_t a = 0; a < ni.rank; ++a) {
                    if (from[a] == R) {
                        emit(shape_op::set, p0 + a, ni.ext[a] == dyn ? 1 : ni.ext[a], 0);
                    } else {
                        emit(shape_op::copy, p0 + a, from[a], 0);
                        unite(from[a], p0 + a);
                    }
                }
            }
            // checks: those no earlier step implies
            for (std::size_t k = 0; k < ni.arity; ++k) {
                const node_info& ci = info[ni.child[k]];
                const std::size_t lead = ni.rank - ci.rank;
                for (std::size_t a = 0; a < ci.rank; ++a) {
                    if (ci.ext[a] == 1) continue;  // broadcast
                    const std::size_t q = offset[ni.child[k]] + a, p = p0 + a + lead;
                    const bool same_static = ci.ext[a] != dyn && ci.ext[a] == ni.ext[a + lead] &&
                                             set_by_steps(ni.child[k]);
                    if (!same_static && find(p) != find(q)) emit(shape_op::check, p, q, 0);
                    unite(p, q);
                }
            }
            // strides: an operand's, when it is dense with the same extents
            if (ni.rank && whole == M) {
                std::size_t same = M;
                for (std::size_t k = 0; k < ni.arity && same == M; ++k) {
                    const std::size_t c = ni.child[k];
                    if (info[c].rank != ni.rank || !dense(c)) continue;
                    bool eq = true;
                    for (std::size_t a = 0; a < ni.rank && eq; ++a)
                        eq = find(offset[c] + a) == find(p0 + a);
                    if (eq) same = c;
                }
                if (same == M) emit(shape_op::strides, n, 0, 0);
                else emit(shape_op::copy_strides, p0, offset[same], ni.rank);
            }
        }
    }
    return count;
}
// One evaluation into room for the most steps a plan can need (a set or copy per position, a
// check per union of two classes, two steps per node), then the steps copied to a program of
// their exact size: counting them first would repeat the whole pass.
template <class Plan>
struct shape_program_of {
    static constexpr shape_program<Plan::total_rank * 2 + Plan::M * 2> most = [] {
        shape_program<Plan::total_rank * 2 + Plan::M * 2> r;
        r.size = make_shape_steps<Plan::M, Plan::total_rank>(Plan::program::info.data(),
                                                             Plan::rank_offset.data(), r.steps, r.usable);
        return r;
    }();
    static constexpr shape_program<most.size> value = [] {
        shape_program<most.size> r;
        r.usable = most.usable;
        r.size = most.size;
        for (std::size_t i = 0; i < most.size; ++i) r.steps[i] = most.steps[i];
        return r;
    }();
};

// Runs the shape program; false when a check fails (compute_shapes_checked then names it).
template <class Plan>
bool run_shape_program(typename Plan::state_type& state) {
    constexpr auto& prog = shape_program_of<Plan>::value;
    std::size_t* const ext = state.ext.data();
    std::ptrdiff_t* const stride = state.stride.data();
    for (std::size_t i = 0; i < prog.size; ++i) {
        const shape_step& s = prog.steps[i];
        switch (s.op) {
        case shape_op::set: ext[s.a] = s.b; break;
        case shape_op::copy: ext[s.a] = ext[s.b]; break;
        case shape_op::check:
            if (ext[s.a] != ext[s.b]) return false;
            break;
        case shape_op::routine: node_tables<Plan>::shape[s.a](node_call_of<Plan>(state, s.a)); break;
        case shape_op::strides: dense_strides<Plan>(state, s.a); break;
        case shape_op::copy_strides:
            for (std::size_t a = 0; a < s.count; ++a) stride[s.a + a] = stride[s.b + a];
            break;
        case shape_op::copy_node:  // before the node's checks: a failed one discards both
            for (std::size_t a = 0; a < s.count; ++a) ext[s.a + a] = ext[s.b + a], stride[s.a + a] = stride[s.b + a];
            break;
        }
    }
    return true;
}

// Extents and strides of every non-leaf node (leaf extents filled by the caller), checked:
// throws before anything is written, naming the first node whose operands do not fit.
template <class Plan>
void compute_shapes(typename Plan::state_type& state) {
    if constexpr (shape_program_of<Plan>::value.usable)
        if (run_shape_program<Plan>(state)) return;
    compute_shapes_checked<Plan>(state);
}

// Scratch is counted in 8-byte units (a plan may hold float and double buffers); each buffer
// starts on a 64-byte boundary.
using scratch_unit = double;

// Element count of a node, or a shape_error when it (or its size in bytes) cannot be represented.
template <class Plan>
std::size_t checked_numel(const typename Plan::state_type& state, std::size_t node) {
    const std::size_t rank = Plan::program::info[node].rank;
    const std::size_t* ext = state.ext.data() + Plan::rank_offset[node];
    if (std::find(ext, ext + rank, std::size_t(0)) != ext + rank) return 0;  // however large the others
    std::size_t n = 1;
    for (std::size_t a = 0; a < rank; ++a)
        if (__builtin_mul_overflow(n, ext[a], &n))
            fail<shape_error>({"typegrad: the extents of '", Plan::program::info[node].name, "' (node ", node,
                               ") overflow an element count"});
    std::size_t bytes = 0;
    if (__builtin_mul_overflow(n, Plan::program::info[node].elem_size, &bytes) ||
        bytes > std::size_t(PTRDIFF_MAX) / 2)
        fail<shape_error>({"typegrad: '", Plan::program::info[node].name, "' (node ", node, ") would need ", n,
                           " elements, more than memory can address"});
    return n;
}

// The nodes a call visits outside its loops, by what it does with them: lists of ids, so that
// a call walks these (a few) rather than all M nodes and their rows.
enum class node_set { computed, reduce, meta, view };
template <class Plan, node_set Set>
struct node_list {
    static constexpr bool in(std::size_t n) {
        const op_kind k = Plan::program::info[n].kind;
        if constexpr (Set == node_set::view) return k == op_kind::view && Plan::plan.needed[n];
        else if constexpr (Set == node_set::reduce) return k == op_kind::reduce && Plan::plan.computed[n];
        else if constexpr (Set == node_set::meta) return k == op_kind::meta && Plan::plan.computed[n];
        else return Plan::plan.computed[n];
    }
    static constexpr std::size_t size = [] {
        std::size_t c = 0;
        for (std::size_t n = 0; n < Plan::M; ++n) c += in(n);
        return c;
    }();
    static constexpr std::array<std::size_t, size + 1> ids = [] {
        std::array<std::size_t, size + 1> r{};
        std::size_t c = 0;
        for (std::size_t n = 0; n < Plan::M; ++n)
            if (in(n)) r[c++] = n;
        return r;
    }();
};

// Scratch offsets of the computed nodes (the only ones read) and the total.
template <class Plan>
std::size_t scratch_layout(const typename Plan::state_type& state, std::array<std::size_t, Plan::M + 1>& offset) {
    using list = node_list<Plan, node_set::computed>;
    std::size_t total = 0;
    for (std::size_t i = 0; i < list::size; ++i) {
        const std::size_t n = list::ids[i];
        offset[n] = total;
        total += (checked_numel<Plan>(state, n) * Plan::program::info[n].elem_size + 63) / 64 * 8 +
                 (Plan::program::info[n].extra_bytes + 63) / 64 * 8;
    }
    offset[Plan::M] = total;
    return total;
}

// Points every computed node at its scratch buffer, computes metas, initialises reductions.
template <class Plan>
void prepare_scratch(typename Plan::state_type& state, scratch_unit* scratch,
                     const std::array<std::size_t, Plan::M + 1>& offset) {
    constexpr auto& info = Plan::program::info;
    using computed = node_list<Plan, node_set::computed>;
    using reduces = node_list<Plan, node_set::reduce>;
    using metas = node_list<Plan, node_set::meta>;
    using views = node_list<Plan, node_set::view>;
    for (std::size_t i = 0; i < computed::size; ++i) state.ptr[computed::ids[i]] = scratch + offset[computed::ids[i]];
    for (std::size_t i = 0; i < reduces::size; ++i) {
        const std::size_t n = reduces::ids[i];
        void* p = const_cast<void*>(state.ptr[n]);
        if (info[n].elem_size == sizeof(double)) fill_identity(static_cast<double*>(p), node_numel<Plan>(state, n), info[n].combine);
        else fill_identity(static_cast<float*>(p), node_numel<Plan>(state, n), info[n].combine);
    }
    for (std::size_t i = 0; i < metas::size; ++i)
        node_tables<Plan>::meta[metas::ids[i]](node_call_of<Plan>(state, metas::ids[i]));
    // Views alias their input (children first, so chains of views resolve in one sweep).
    for (std::size_t i = 0; i < views::size; ++i) {
        const std::size_t n = views::ids[i];
        if (state.ptr[n] != nullptr) continue;
        const auto* base = static_cast<const char*>(state.ptr[info[n].child[0]]);
        state.ptr[n] = base ? base + state.view_offset[n] * std::ptrdiff_t(info[n].elem_size) : nullptr;
    }
}

// The order of work: for each stage, its kernels (in id order) then its loops.
struct step_item {
    bool is_loop;
    std::size_t index;  // loop index or kernel node id
};
template <class Plan>
constexpr std::size_t schedule_size() {
    std::size_t n = Plan::plan.loop_count;
    for (std::size_t i = 0; i < Plan::M; ++i)
        if (Plan::plan.computed[i] && Plan::program::info[i].kind == op_kind::kernel) ++n;
    return n;
}
// One counting sort by (stage, kernel before loop), ids ascending within each: a scan of every
// node and loop per stage was quadratic, and crossed clang's limit of 2^20 steps per constant
// evaluation at 6 GPT blocks.
template <class Plan>
constexpr auto schedule() {
    constexpr auto& plan = Plan::plan;
    constexpr std::size_t keys = 2 * (plan.max_stage + 1);  // kernels of stage s: 2s, loops: 2s + 1
    auto is_kernel = [](std::size_t i) {
        return plan.computed[i] && Plan::program::info[i].kind == op_kind::kernel && plan.stage[i] <= plan.max_stage;
    };
    std::array<std::size_t, keys + 1> start{};
    for (std::size_t i = 0; i < Plan::M; ++i)
        if (is_kernel(i)) ++start[2 * plan.stage[i] + 1];
    for (std::size_t l = 0; l < plan.loop_count; ++l)
        if (plan.loops[l].stage <= plan.max_stage) ++start[2 * plan.loops[l].stage + 2];
    for (std::size_t k = 0; k < keys; ++k) start[k + 1] += start[k];
    std::array<step_item, schedule_size<Plan>() + 1> r{};
    for (std::size_t i = 0; i < Plan::M; ++i)
        if (is_kernel(i)) r[start[2 * plan.stage[i]]++] = {false, i};
    for (std::size_t l = 0; l < plan.loop_count; ++l)
        if (plan.loops[l].stage <= plan.max_stage) r[start[2 * plan.loops[l].stage + 1]++] = {true, l};
    return r;
}

template <class Plan>
inline constexpr auto schedule_v = schedule<Plan>();

// When buffers are final, for running post-accumulate hooks inside the schedule (PyTorch runs a
// param's hook once its .grad is final, while the rest of the backward goes on): store[g] is the
// schedule step whose loop writes store g (the only write of its output buffer); read[n] the last
// step that reads node n's buffer, directly or through views of it (no_step: none). One table of
// integers per plan, one linear pass over the schedule.
inline constexpr std::size_t no_step = static_cast<std::size_t>(-1);
template <std::size_t M, std::size_t NS>
struct buffer_steps {
    std::size_t store[NS + 1]{};
    std::size_t read[M + 1]{};
};
template <class Plan>
constexpr buffer_steps<Plan::M, Plan::NS> make_buffer_steps() {
    constexpr auto& plan = Plan::plan;
    const node_info* const info = Plan::program::info.data();
    const std::size_t* const members = plan.members.data();
    const step_item* const items = schedule_v<Plan>.data();
    buffer_steps<Plan::M, Plan::NS> r;
    std::size_t base_[Plan::M + 1]{};  // the node whose buffer a view aliases (views chain)
    std::size_t* const base = base_;
    for (std::size_t n = 0; n < Plan::M; ++n) base[n] = info[n].kind == op_kind::view ? base[info[n].child[0]] : n;
    for (std::size_t g = 0; g <= Plan::NS; ++g) r.store[g] = no_step;
    for (std::size_t n = 0; n <= Plan::M; ++n) r.read[n] = no_step;
    for (std::size_t i = 0; i < schedule_size<Plan>(); ++i) {
        if (items[i].is_loop) {
            const loop_plan& lp = plan.loops.data()[items[i].index];
            for (std::size_t m = lp.in_begin; m < lp.in_end; ++m) r.read[base[members[m]]] = i;
            for (std::size_t m = lp.store_begin; m < lp.store_end; ++m) r.store[members[m]] = i;
        } else {
            // every operand counts, shape-only ones too: a kernel is handed all their buffers
            const node_info& ni = info[items[i].index];
            for (std::size_t c = 0; c < ni.arity; ++c) r.read[base[ni.child[c]]] = i;
        }
    }
    return r;
}
template <class Plan>
inline constexpr buffer_steps<Plan::M, Plan::NS> buffer_steps_v = make_buffer_steps<Plan>();

// Saved values written straight into a gradient's buffer. When the loop that stores gradient g
// is the last to read saved node n, and reads it at the element it writes (the same static
// shape as its iteration space: dense, nothing broadcast, no view of n anywhere), and g
// overwrites its buffer (not tg::accumulate), n needs no scratch of its own: its loop writes it
// into g's buffer and the last loop overwrites it element by element, each element read before it
// is written, by the same task. log_sum_exp saves exp(x - max) and scales it into the gradient:
// its last loop then reads and writes one buffer, as a hand loop does in place (at 1e6 floats a
// third buffer cost the write's read-for-ownership and 4 MB more of cache). Gradient buffers never
// overlap an input or each other (exec/call.hpp checks), and a post-accumulate hook runs after
// its gradient's last write, so no one sees the buffer in between.
// Its table: a type keyed by a size, not by the plan (a struct nested in a plan-keyed class gets
// the plan's whole type printed into its code-generation name: clang's code generation then ran
// out of memory on two GPT blocks).
template <std::size_t N>
struct in_place_table {
    std::size_t count = 0;
    std::size_t node[N]{};
    std::size_t store[N]{};
};
// For the two tables below: the last schedule step (counted from 1) that reads each node
// directly, whether a view reads it, and whether a kernel step of the plan computes it. Not
// buffer_steps_v's table, which holds the same: read there, clang 14 ran past 12 minutes and
// 14 GB on the 12-block GPT (gen.py gpt 12) against 32 s with this loop.
template <class Plan>
struct step_readers {
    static constexpr void fill(std::size_t* last, bool* viewed, bool* kernel) {
        constexpr auto& plan = Plan::plan;
        const node_info* const info = Plan::program::info.data();
        const std::size_t* const members = plan.members.data();
        const step_item* const items = schedule_v<Plan>.data();
        // a constant, not a call per step: schedule_size walks every node (quadratic otherwise:
        // clang 14 ran past 12 minutes and 5 GB on gen.py gpt 12)
        constexpr std::size_t steps = schedule_size<Plan>();
        for (std::size_t n = 0; n < Plan::M; ++n)
            if (info[n].kind == op_kind::view) viewed[info[n].child[0]] = true;
        for (std::size_t i = 0; i < steps; ++i) {
            if (items[i].is_loop) {
                const loop_plan& lp = plan.loops.data()[items[i].index];
                for (std::size_t m = lp.in_begin; m < lp.in_end; ++m) last[members[m]] = i + 1;
            } else {
                const node_info& ni = info[items[i].index];
                kernel[items[i].index] = ni.kind == op_kind::kernel;
                for (std::size_t c = 0; c < ni.arity; ++c) last[ni.child[c]] = i + 1;
            }
        }
    }
};
template <class Plan, class AccumulateMask>
struct in_place_saves {
    using table = in_place_table<Plan::NS + 1>;
    static constexpr bool same_dense_shape(const node_info& a, const node_info& f) {
        if (a.rank != f.rank || a.rank == 0 || !a.contiguous) return false;
        for (std::size_t i = 0; i < a.rank; ++i)
            if (a.ext[i] != f.ext[i]) return false;
        return true;
    }
    static constexpr table make() {
        constexpr auto& plan = Plan::plan;
        const node_info* const info = Plan::program::info.data();
        const std::size_t* const members = plan.members.data();
        const step_item* const items = schedule_v<Plan>.data();
        constexpr std::size_t steps = schedule_size<Plan>();
        table t;
        // (views of a node are excluded below, so `last` counts its direct readers)
        std::size_t last_[Plan::M + 1]{};
        bool viewed_[Plan::M + 1]{}, kernel_[Plan::M + 1]{}, used_[Plan::NS + 1]{};
        std::size_t* const last = last_;
        bool *const viewed = viewed_, *const used = used_;
        step_readers<Plan>::fill(last, viewed, kernel_);
        for (std::size_t i = 0; i < steps; ++i) {
            if (!items[i].is_loop) continue;
            const loop_plan& lp = plan.loops.data()[items[i].index];
            const node_info& f = info[lp.iter];
            for (std::size_t m = lp.in_begin; m < lp.in_end; ++m) {
                const std::size_t n = members[m];
                if (!plan.saved[n] || !plan.computed[n] || info[n].kind != op_kind::elementwise || viewed[n] ||
                    last[n] != i + 1 || !same_dense_shape(info[n], f))
                    continue;
                for (std::size_t k = lp.store_begin; k < lp.store_end; ++k) {
                    const std::size_t g = members[k];
                    const node_info& sn = info[Plan::stores[g]];
                    if (used[g] || AccumulateMask::test(g) || !same_dense_shape(sn, f) || sn.buffer != info[n].buffer ||
                        sn.elem_size != info[n].elem_size)
                        continue;
                    used[g] = true;
                    t.node[t.count] = n, t.store[t.count] = g, ++t.count;
                    break;
                }
            }
        }
        return t;
    }
    static constexpr table value = make();
};
// Kernel results written straight into a gradient's buffer. A gradient that a kernel computes
// (a matmul's, a convolution's, embedding's scatter-add) reached its buffer through a loop that
// only copied it there: `expand(k, shape=param)`, the identity wherever the extents agree. When
// that loop reads nothing but kernel k of this plan, fuses nothing but the expand (or stores k
// itself), k has the store's element type and nothing stored after its elements, no view of k
// exists, no later step reads k, and the gradient overwrites its buffer (not tg::accumulate),
// then on a call where k's extents equal the store's (dynamic extents: checked per call), k
// writes into the gradient's buffer and the loop is skipped (run_loops): the same values, one
// pass less. It was a copy of every such gradient on every step: the 16 MB of an 8192 x 512
// embedding table's gradient, a convolution's input gradient, every weight's in a transformer.
// The table is indexed by loop: src[l] is k (or no_node) and store[l] the gradient's store.
template <std::size_t L>
struct kernel_store_table {
    static constexpr std::size_t no_node = static_cast<std::size_t>(-1);
    std::size_t count = 0;
    std::size_t src[L]{};
    std::size_t store[L]{};
    std::size_t loop[L]{};  // the entries' loops, count of them
};
template <class Plan, class AccumulateMask>
struct kernel_stores {
    static constexpr std::size_t L = Plan::plan.loops.size() + 1;
    using table = kernel_store_table<L>;
    static constexpr table make() {
        constexpr auto& plan = Plan::plan;
        const node_info* const info = Plan::program::info.data();
        const std::size_t* const members = plan.members.data();
        const step_item* const items = schedule_v<Plan>.data();
        constexpr std::size_t steps = schedule_size<Plan>();
        table t;
        for (std::size_t l = 0; l < L; ++l) t.src[l] = table::no_node;
        std::size_t last_[Plan::M + 1]{};
        bool viewed_[Plan::M + 1]{}, kernel_[Plan::M + 1]{};
        std::size_t* const last = last_;
        bool *const viewed = viewed_, *const kernel = kernel_;
        step_readers<Plan>::fill(last, viewed, kernel);
        for (std::size_t i = 0; i < steps; ++i) {
            if (!items[i].is_loop) continue;
            const loop_plan& lp = plan.loops.data()[items[i].index];
            if (lp.in_end - lp.in_begin != 1 || lp.red_begin != lp.red_end || lp.mat_begin != lp.mat_end ||
                lp.store_end - lp.store_begin != 1)
                continue;
            const std::size_t n = members[lp.in_begin], g = members[lp.store_begin], sn = Plan::stores[g];
            if (!kernel[n] || viewed[n] || last[n] != i + 1 || AccumulateMask::test(g)) continue;
            const node_info &k = info[n], &s = info[sn];
            // (extra bytes: a custom op keeps saved values after its elements, past a gradient's end)
            if (k.rank != s.rank || k.buffer != s.buffer || k.elem_size != s.elem_size || k.extra_bytes != 0) continue;
            const bool expand_of_n = lp.body_end - lp.body_begin == 1 && members[lp.body_begin] == sn && s.arity >= 1 &&
                                     s.child[0] == n && s.name == std::string_view("expand");
            if (!(sn == n && lp.body_begin == lp.body_end) && !expand_of_n) continue;
            t.src[items[i].index] = n, t.store[items[i].index] = g, t.loop[t.count++] = items[i].index;
        }
        return t;
    }
    static constexpr table value = make();
};

// Points those saved values at their gradients' buffers (after prepare_scratch and bind_grads),
// and those kernel results too where their extents equal their gradients' on this call.
template <class Plan, class AccumulateMask>
void save_in_place(typename Plan::state_type& state) {
    constexpr auto& t = in_place_saves<Plan, AccumulateMask>::value;
    for (std::size_t i = 0; i < t.count; ++i) state.ptr[t.node[i]] = state.out[t.store[i]];
    constexpr auto& k = kernel_stores<Plan, AccumulateMask>::value;
    for (std::size_t i = 0; i < k.count; ++i) {
        const std::size_t l = k.loop[i], n = k.src[l], s = Plan::stores[k.store[l]];
        bool same = state.out[k.store[l]] != nullptr;
        for (std::size_t a = 0; same && a < Plan::program::info[n].rank; ++a)
            same = state.ext[Plan::rank_offset[n] + a] == state.ext[Plan::rank_offset[s] + a];
        if (same) state.ptr[n] = state.out[k.store[l]];
    }
}

// Post-accumulate hooks run by the schedule walk: entry k runs right after schedule step
// after[k] (ascending; a step past the schedule: after its last one), on param buffer
// mut[param[k]] with extents ext + param_ext[k] and the gradient in store store[k]. The tables
// are constexpr data of the caller (exec/step.hpp); mut and ext belong to the call.
using post_hook_fn = void (*)(void* param, void* grad, const std::size_t* extents);
struct post_hook_calls {
    std::size_t count = 0;
    const std::size_t* after = nullptr;
    const post_hook_fn* fn = nullptr;
    const std::size_t* store = nullptr;
    const std::size_t* param = nullptr;
    const std::size_t* param_ext = nullptr;
    void* const* mut = nullptr;
    const std::size_t* ext = nullptr;
};
// Runs the hooks due by schedule step `step` from entry `next` on (a plain function: a lambda in
// run_loops would be one more function per plan, named with it). out: the plan's store buffers.
inline void run_post_hooks_until(const post_hook_calls& hooks, std::size_t& next, std::size_t step,
                                 void* const* out) {
    for (; next < hooks.count && hooks.after[next] <= step; ++next)
        hooks.fn[next](hooks.mut[hooks.param[next]], out[hooks.store[next]], hooks.ext + hooks.param_ext[next]);
}

// After a kernel or loop in anomaly mode: the buffers it wrote must be finite.
template <class Plan>
void check_buffer(const typename Plan::state_type& state, std::size_t n) {
    if (anomaly_node() != no_anomaly) return;
    const std::size_t count = node_numel<Plan>(state, n);
    auto scan = [&](const auto* p) {
        for (std::size_t i = 0; i < count; ++i)
            if (!std::isfinite(static_cast<double>(p[i]))) {
                anomaly_node() = n;
                return;
            }
    };
    switch (Plan::program::info[n].buffer) {
        case dtype_code::f64: scan(static_cast<const double*>(state.ptr[n])); break;
        case dtype_code::f32: scan(static_cast<const float*>(state.ptr[n])); break;
        case dtype_code::bf16: scan(static_cast<const bf16*>(state.ptr[n])); break;
        case dtype_code::f16: scan(static_cast<const f16*>(state.ptr[n])); break;
        case dtype_code::other: break;
    }
}

// The loops of a plan: their kernels and operand tables (node ids and extent offsets, one flat
// array per plan; loop l's starts at 2 * layout.op_start[l] and holds n_ops + 1 of each).
template <class Plan, class AccumulateMask, bool Check>
struct loop_tables {
    using layout = loop_layout<Plan, AccumulateMask, Check>;
    template <std::size_t... Ls>
    static constexpr std::array<loop_fns, layout::count + 1> make_fns(std::index_sequence<Ls...>) {
        return {loop_fns{&loop_kernel_of<layout, Ls>::type::code::run, &loop_kernel_of<layout, Ls>::type::rows}...,
                loop_fns{}};
    }
    static constexpr auto fns = make_fns(std::make_index_sequence<layout::count>{});
};

// The plan's work in order: a run-time walk over constexpr tables, so no function is
// instantiated per loop or kernel of the plan (each one's routine is keyed by its signature).
// Post-accumulate hooks (hooks) run between steps, each as soon as its gradient is final.
template <class Plan, class AccumulateMask, bool Check = false>
void run_loops(typename Plan::state_type& state, const post_hook_calls& hooks = {}) {
    using loops = loop_tables<Plan, AccumulateMask, Check>;
    constexpr std::size_t items = schedule_size<Plan>();
    std::size_t next = 0;  // the next post-accumulate hook to run
    for (std::size_t i = 0; i < items; ++i) {
        const step_item item = schedule_v<Plan>[i];
        if (item.is_loop) {
            // a loop that would copy a kernel's result into the buffer it was written to
            constexpr auto& k = kernel_stores<Plan, AccumulateMask>::value;
            if (k.src[item.index] != k.no_node && state.ptr[k.src[item.index]] == state.out[k.store[item.index]]) {
                if (next < hooks.count) run_post_hooks_until(hooks, next, i, state.out.data());
                continue;
            }
            constexpr auto& t = loops::layout::table;
            const std::size_t* ids = t.ids.data() + 2 * t.op_start[item.index];
            const loop_args args{state.ptr.data(), state.out.data(), state.ext.data(), state.stride.data(), ids,
                                 ids + t.n_ops[item.index] + 1};
            loops::fns[item.index].run(args, loops::fns[item.index].rows);
            if constexpr (Check) {
                const loop_plan& lp = Plan::plan.loops[item.index];
                for (std::size_t m = lp.red_begin; m < lp.mat_end; ++m) check_buffer<Plan>(state, Plan::plan.members[m]);
            }
        } else {
            node_tables<Plan>::run[item.index](node_call_of<Plan>(state, item.index));
            if constexpr (Check) check_buffer<Plan>(state, item.index);
        }
        if (next < hooks.count) run_post_hooks_until(hooks, next, i, state.out.data());
    }
    run_post_hooks_until(hooks, next, no_step, state.out.data());
}

}  // namespace typegrad::detail
