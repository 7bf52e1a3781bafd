#pragma once
// Lowering: a graph type becomes a flat program of integer ids (one per unique node, children
// before parents), and every graph algorithm after this point is a constexpr function over
// std::arrays of those ids. Only kernels go back from an id to its node type.
#include <array>
#include <bit>
#include <cstdint>
#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>

#include <typegrad/core/device_kernel.hpp>
#include <typegrad/graph/cvec.hpp>
#include <typegrad/graph/node.hpp>
#include <typegrad/graph/topo.hpp>
#include <typegrad/ops/broadcast.hpp>
#include <typegrad/ops/op_base.hpp>

namespace typegrad::detail {

enum class dtype_code : unsigned char { f32, f64, bf16, f16, other };
template <class T>
constexpr dtype_code dtype_code_of() {
    if constexpr (std::is_same_v<T, float>) return dtype_code::f32;
    else if constexpr (std::is_same_v<T, double>) return dtype_code::f64;
    else if constexpr (std::is_same_v<T, bf16>) return dtype_code::bf16;
    else if constexpr (std::is_same_v<T, f16>) return dtype_code::f16;
    else return dtype_code::other;
}
struct node_info {
    op_kind kind = op_kind::leaf;
    std::size_t arity = 0;
    // Built-in arrays, not std::array: the planner's constant evaluations index them in every
    // step, and a call to std::array::operator[] costs clang about five of the 2^20 steps it
    // allows per evaluation (a built-in subscript costs none).
    std::size_t child[max_arity]{};
    bool shape_only[max_arity]{};
    // Operands whose values the shape pass reads (a bit each; narrow's length, always a leaf):
    // the CUDA backend copies them to the host for that pass.
    unsigned shape_values = 0;
    // Dense row-major when materialised (node::contiguous): fused loops read a contiguous view
    // (a reshape of a dense value) as they read a buffer, its axes coalesced.
    bool contiguous = true;
    std::size_t rank = 0;
    std::size_t ext[max_rank]{};  // static extents, `dyn` where dynamic
    reduce_kind combine = reduce_kind::sum;
    bool is_param = false;
    std::size_t elem_size = 0;  // bytes per element as stored
    dtype_code buffer = dtype_code::other;  // the element type of its buffer
    dtype_code value = dtype_code::other;   // its dtype (a bf16 reduction: value bf16, buffer f32)
    std::size_t extra_bytes = 0;  // kept after the elements (a custom op's saved values)
    std::string_view name{};
    std::uint64_t constant_bits = 0;  // a constant's value (its double's bits)
    // An elementwise op's cost per element in units of one arithmetic instruction (Op::cost;
    // about 12 for exp): the planner stores a value rather than recompute it where this is high.
    unsigned cost = 0;
    // A select (where): its value is operand 1 where operand 0 is nonzero, else operand 2
    // (Op::selects). A fused loop whose condition is the same along a row resolves it once per
    // row (exec/cpu/kernel.hpp, loop_desc::select).
    bool selects = false;
};

// Node N's row, without its operand ids. A class template's constant, not a function: a function
// instantiated for a node type is named (mangled) with the node's whole subtree spelled out, at a
// cost that grows with the subtree, and g++ names every function it instantiates.
template <class Shape>
constexpr node_info with_extents(node_info r) {
    for (std::size_t i = 0; i < Shape::rank; ++i) r.ext[i] = Shape::extents[i];
    return r;
}
template <class Op, std::size_t Arity>
constexpr node_info with_shape_only(node_info r) {
    for (std::size_t i = 0; i < Arity; ++i) r.shape_only[i] = Op::shape_only(i);
    if constexpr (requires { Op::shape_value(std::size_t{}); })
        for (std::size_t i = 0; i < Arity; ++i)
            if (Op::shape_value(i)) r.shape_values |= 1u << i;
    return r;
}
template <class Op>
constexpr reduce_kind combine_of() {
    if constexpr (Op::kind == op_kind::reduce) return Op::combine;
    else return reduce_kind::sum;
}
// (Elementwise ops declare a cost: the op protocol, graph/node.hpp. Other kinds have none.)
template <class Op>
constexpr unsigned cost_of() {
    if constexpr (requires { Op::cost; }) return Op::cost;
    else return 0;
}
template <class Op>
constexpr bool selects_of() {
    if constexpr (requires { Op::selects; }) return Op::selects;
    else return false;
}
template <class Op>
constexpr std::size_t extra_bytes_of() {
    if constexpr (requires { Op::extra_bytes; }) return Op::extra_bytes;
    else return 0;
}
// Rows are keyed by what they depend on (for an op node: the op, its arity, its shape, dtype and
// buffer type), never by the node type itself.
template <class Op, std::size_t Arity, class Shape, class Value, class Buffer>
struct op_row_key {};
template <class N>
struct row_key {
    using type = N;  // leaves and constants are small types
};
template <class Op, class... Cs>
struct row_key<node<Op, Cs...>> {
    using N = node<Op, Cs...>;
    using type = op_row_key<Op, sizeof...(Cs), typename N::shape_type, typename N::value_type, buffer_t<N>>;
};
template <class Key>
struct node_row;
template <class Name, class T, class S, leaf_role R>
struct node_row<leaf<Name, T, S, R>> {
    using N = leaf<Name, T, S, R>;
    static constexpr node_info value = with_extents<S>({.kind = op_kind::leaf,
                                                        .rank = S::rank,
                                                        .is_param = R == leaf_role::param,
                                                        .elem_size = sizeof(buffer_t<N>),
                                                        .buffer = dtype_code_of<buffer_t<N>>(),
                                                        .value = dtype_code_of<storage_t<T>>(),
                                                        .name = N::name()});
};
template <std::uint64_t V>
struct node_row<constant<V>> {
    using N = constant<V>;
    static constexpr node_info value{.kind = op_kind::constant,
                                     .rank = 0,
                                     .elem_size = sizeof(buffer_t<N>),
                                     .buffer = dtype_code_of<buffer_t<N>>(),
                                     .value = dtype_code_of<storage_t<typename N::value_type>>(),
                                     .name = "constant",
                                     .constant_bits = V};
};
template <class Op, std::size_t Arity, class Shape, class Value, class Buffer>
struct node_row<op_row_key<Op, Arity, Shape, Value, Buffer>> {
    static_assert(Arity <= max_arity, "typegrad: internal: an op has more operands than max_arity");
    static constexpr node_info value =
        with_shape_only<Op, Arity>(with_extents<Shape>({.kind = Op::kind,
                                                        .arity = Arity,
                                                        .rank = Shape::rank,
                                                        .combine = combine_of<Op>(),
                                                        .elem_size = sizeof(Buffer),
                                                        .buffer = dtype_code_of<Buffer>(),
                                                        .value = dtype_code_of<storage_t<Value>>(),
                                                        .extra_bytes = extra_bytes_of<Op>(),
                                                        .name = Op::name,
                                                        .cost = cost_of<Op>(),
                                                        .selects = selects_of<Op>()}));
};

// The flat program of a graph (a topo<Roots...>): its nodes in topological order and one
// node_info row per node.
// Rows of the nodes Ns, with their operand ids from the graph's topological table.
template <class Topo, class... Ns>
constexpr std::array<node_info, sizeof...(Ns)> make_info(type_list<Ns...>) {
    std::array<node_info, sizeof...(Ns)> r{node_row<typename row_key<Ns>::type>::value...};
    node_info* const p = r.data();
    const bool contiguous[] = {Ns::contiguous..., true};  // not in the row key: a view's depends on its operands
    for (std::size_t i = 0; i < sizeof...(Ns); ++i) p[i].contiguous = contiguous[i];
    const std::size_t* const child = Topo::table.child.data();
    for (std::size_t i = 0; i < sizeof...(Ns); ++i)
        for (std::size_t k = 0; k < p[i].arity; ++k) p[i].child[k] = child[i * max_arity + k];
    return r;
}
// Not a partial specialisation over the node pack: the member templates of one carry the whole
// pack as outer arguments, which g++ copies at every use (see type_at).
template <class Topo>
struct program {
    using nodes = typename Topo::type;
    static constexpr std::size_t size = Topo::size;
    static constexpr std::array<node_info, size> info = detail::make_info<Topo>(nodes{});
    // by the topological table's parent edge, O(1) per look-up (see type_at)
    template <std::size_t I>
    using node_at = typename topo_at<Topo, I>::type;
    // A node's id (`::value`; `size` when the graph does not hold it), as a type (see topo).
    template <class N>
    using id_of = std::integral_constant<std::size_t, Topo::template id_of<N>::value == no_parent
                                                          ? size
                                                          : Topo::template id_of<N>::value>;
    template <class N>
    using contains = std::bool_constant<Topo::template id_of<N>::value != no_parent>;
};

// ---- planning ------------------------------------------------------------------------------
//
// Elementwise nodes are recomputed by each loop that needs them, from materialised values
// (leaves, constants, shape-derived scalars, reductions of earlier loops), unless recomputing
// costs more than storing and reloading: a value needed by a loop of a later stage whose
// subgraph of recomputed ops costs at least save_cost (one transcendental op: exp, tanh, ...) is
// *saved*, written by a loop of its own stage that iterates over its shape anyway, and read by
// the later loops (loops of its own stage still compute it in place). A reduction ends a stage;
// a loop computes every reduction and store whose inputs are ready in its stage and that
// iterates over the same (provably equal) shape.
inline constexpr unsigned save_cost = 12;

struct loop_plan {
    std::size_t iter = 0;                       // node whose shape is the iteration space
    std::size_t stage = 0;
    std::size_t in_begin = 0, in_end = 0;       // materialised nodes the loop reads
    std::size_t body_begin = 0, body_end = 0;   // elementwise nodes it computes, in order
    std::size_t red_begin = 0, red_end = 0;     // reductions it accumulates
    std::size_t mat_begin = 0, mat_end = 0;     // elementwise nodes it writes to scratch
    std::size_t store_begin = 0, store_end = 0; // indices into the store list
};

template <std::size_t M, std::size_t L, std::size_t K>
struct plan_data {
    std::size_t loop_count = 0;
    std::array<loop_plan, L> loops{};
    std::array<std::size_t, K> members{};
    std::array<bool, M> needed{};        // evaluated or read by this plan
    std::array<bool, M> materialized{};  // has a buffer (or is a constant)
    std::array<bool, M> computed{};      // this plan writes its buffer (reductions, metas)
    std::array<bool, M> saved{};         // an elementwise value stored for later stages (above)
    std::array<std::size_t, M> stage{};  // the first stage whose loops can read the node
    std::size_t max_stage = 0;
};

struct plan_sizes {
    std::size_t loops = 0;
    std::size_t members = 0;
};

// Symbolic extents: a static extent, or a class of dynamic extents proven equal (negative).
using sym_extent = long long;

template <std::size_t M>
struct symbolic_shapes {
    sym_extent dims[M ? M : 1][max_rank]{};  // built-in arrays (see node_info); an empty plan has M = 0
};

constexpr std::size_t uf_find(std::size_t* parent, std::size_t a) {
    while (parent[a] != a) a = parent[a] = parent[parent[a]];
    return a;
}

// The constant evaluations below index built-in arrays and raw pointers, not std::array or cvec:
// clang allows 2^20 steps per evaluation and charges the statements of every function called,
// about five for a std::array subscript, so a 12-block model's planner went past the limit.
template <std::size_t M>
constexpr symbolic_shapes<M> symbolic(const std::array<node_info, M>& info_) {
    // Every (node, axis) starts as its own class; elementwise ops, expand and reductions unite
    // the dynamic axes that the run-time checks force to be equal.
    const node_info* const info = info_.data();
    std::array<std::size_t, M * max_rank> parent_{};
    std::size_t* const parent = parent_.data();
    for (std::size_t i = 0; i < M * max_rank; ++i) parent[i] = i;
    auto unite = [&](std::size_t a, std::size_t b) {
        a = uf_find(parent, a);
        b = uf_find(parent, b);
        if (a != b) parent[a < b ? b : a] = a < b ? a : b;
    };
    for (std::size_t n = 0; n < M; ++n) {
        const node_info& ni = info[n];
        if (ni.kind != op_kind::elementwise && ni.kind != op_kind::reduce) continue;
        for (std::size_t c = 0; c < ni.arity; ++c) {
            const bool expand_like = ni.kind == op_kind::elementwise && ni.shape_only[c];
            if (ni.shape_only[c] && !expand_like) continue;
            const node_info& ci = info[ni.child[c]];
            if (ni.kind == op_kind::reduce) {
                // target axes that are kept line up with the input's trailing axes
                const std::size_t lead = ci.rank - ni.rank;
                for (std::size_t a = 0; a < ni.rank; ++a)
                    if (ni.ext[a] == dyn) unite(n * max_rank + a, ni.child[c] * max_rank + a + lead);
                continue;
            }
            const std::size_t lead = ni.rank - ci.rank;
            for (std::size_t a = 0; a < ci.rank; ++a)
                if (ci.ext[a] == dyn && ni.ext[a + lead] == dyn)
                    unite(n * max_rank + a + lead, ni.child[c] * max_rank + a);
        }
    }
    symbolic_shapes<M> s;
    for (std::size_t n = 0; n < M; ++n)
        for (std::size_t a = 0; a < info[n].rank; ++a)
            s.dims[n][a] = info[n].ext[a] != dyn
                               ? static_cast<sym_extent>(info[n].ext[a])
                               : -1 - static_cast<sym_extent>(uf_find(parent, n * max_rank + a));
    return s;
}

template <std::size_t M>
constexpr bool same_iteration_space(const node_info* info, const symbolic_shapes<M>& s, std::size_t a,
                                    std::size_t b) {
    if (info[a].rank != info[b].rank) return false;
    for (std::size_t i = 0; i < info[a].rank; ++i)
        if (s.dims[a][i] != s.dims[b][i]) return false;
    return true;
}

// The planner. `stores` are elementwise nodes written to output buffers; `required` are
// non-elementwise nodes whose value must exist afterwards; `given` nodes are available from
// outside (saved by a forward pass) and are not recomputed.
template <std::size_t M, std::size_t NS, std::size_t NR, std::size_t NG>
struct plan_request {
    std::array<std::size_t, NS> stores{};
    std::array<std::size_t, NR> required{};
    std::array<std::size_t, NG> given{};
};

struct planner_output {
    cvec<loop_plan> loops;
    cvec<std::size_t> members;
};

// Stage semantics: ready[n] is the first stage whose loops can read n. Kernels of stage s run
// before the loops of stage s; a loop of stage s makes its reductions and materialisations
// ready at s + 1.
template <std::size_t M, class Request>
constexpr auto run_planner(const std::array<node_info, M>& info_, const symbolic_shapes<M>& sym,
                           const Request& req, std::array<bool, M>& needed_, std::array<bool, M>& materialized_,
                           std::array<bool, M>& computed_, std::array<bool, M>& saved_,
                           std::array<std::size_t, M>& stage_) {
    const node_info* const info = info_.data();
    bool* const needed = needed_.data();
    bool* const materialized = materialized_.data();
    bool* const computed = computed_.data();
    bool* const saved = saved_.data();
    std::size_t* const stage = stage_.data();
    std::array<bool, M> given_{}, store_in_scratch_{};
    std::array<std::size_t, M> loop_stage_{};
    bool* const given = given_.data();
    bool* const store_in_scratch = store_in_scratch_.data();
    std::size_t* const loop_stage = loop_stage_.data();
    for (std::size_t g : req.given) given[g] = true;

    // Which nodes are evaluated: one reverse sweep over the id order (children come first).
    for (std::size_t s : req.stores) needed[s] = true;
    for (std::size_t r : req.required) needed[r] = true;
    for (std::size_t n = M; n-- > 0;) {
        if (!needed[n] || given[n]) continue;
        const node_info& ni = info[n];
        if (ni.kind == op_kind::meta) continue;  // reads shapes only
        for (std::size_t c = 0; c < ni.arity; ++c) needed[ni.child[c]] |= !ni.shape_only[c];
    }
    // Views and kernels read buffers: their elementwise inputs are materialised.
    for (std::size_t n = 0; n < M; ++n) {
        const node_info& ni = info[n];
        if (!needed[n] || given[n] || (ni.kind != op_kind::view && ni.kind != op_kind::kernel)) continue;
        for (std::size_t c = 0; c < ni.arity; ++c)
            store_in_scratch[ni.child[c]] |=
                !ni.shape_only[c] && !given[ni.child[c]] && info[ni.child[c]].kind == op_kind::elementwise;
    }
    for (std::size_t n = 0; n < M; ++n) {
        if (!needed[n]) continue;
        const node_info& ni = info[n];
        const op_kind k = ni.kind;
        materialized[n] = given[n] || k != op_kind::elementwise || store_in_scratch[n];
        computed[n] = !given[n] && (k == op_kind::reduce || k == op_kind::meta || k == op_kind::kernel ||
                                    store_in_scratch[n]);
        std::size_t s = 0;
        for (std::size_t c = 0; c < ni.arity; ++c)
            s = !ni.shape_only[c] && stage[ni.child[c]] > s ? stage[ni.child[c]] : s;
        if (given[n] || k == op_kind::leaf || k == op_kind::constant || k == op_kind::meta) {
            stage[n] = 0;
        } else if (k == op_kind::reduce || store_in_scratch[n]) {
            loop_stage[n] = s;
            stage[n] = s + 1;
        } else {
            loop_stage[n] = s;  // elementwise (computed in a loop of stage s), view, kernel
            stage[n] = s;
        }
    }

    // Loop roots: reductions (iterate over their input), materialisations and stores; a loop's
    // members list them in this order.
    enum class root_role : unsigned char { reduction, materialisation, store };
    struct root {
        std::size_t iter, stage, node;
        root_role role;  // materialisation: into scratch; store: to an output
        std::size_t store_index;
    };
    cvec<root> roots_;
    for (std::size_t n = 0; n < M; ++n) {
        if (!needed[n] || given[n]) continue;
        if (info[n].kind == op_kind::reduce) roots_.push_back({info[n].child[0], loop_stage[n], n, root_role::reduction, 0});
        else if (store_in_scratch[n]) roots_.push_back({n, loop_stage[n], n, root_role::materialisation, 0});
    }
    for (std::size_t i = 0; i < req.stores.size(); ++i)
        roots_.push_back({req.stores[i], loop_stage[req.stores[i]], req.stores[i], root_role::store, i});

    // Everything below is linear in the graph plus the plan's size (a model's joint graph has
    // thousands of nodes, and g++ stops a constant evaluation after 2^25 operations): roots are
    // bucketed by stage, grouped by an iteration-space class id, and each loop's closure is a
    // search that marks nodes with the loop's number instead of clearing an M-sized array.
    std::size_t R = roots_.size();
    cvec<std::size_t> space_(R, 0);  // iteration-space class of each root
    {
        std::size_t* const space = space_.data();
        cvec<std::size_t> rep(R, 0);  // a representative iter node per class
        std::size_t classes = 0;
        const std::size_t mask = std::bit_ceil(2 * R + 2) - 1;
        cvec<std::size_t> bucket_(mask + 1, no_parent);
        std::size_t* const bucket = bucket_.data();
        // the class of node `it`'s shape, or no_parent for a shape no root iterates over (add: a
        // new class)
        auto class_of = [&](std::size_t it, bool add) {
            std::uint64_t h = info[it].rank;
            for (std::size_t a = 0; a < info[it].rank; ++a)
                h = hash_mix(h, static_cast<std::uint64_t>(sym.dims[it][a]));
            std::size_t b = hash_slot(h, mask);
            while (bucket[b] != no_parent && !same_iteration_space<M>(info, sym, rep.data()[bucket[b]], it))
                b = (b + 1) & mask;
            if (bucket[b] == no_parent) {
                if (!add) return no_parent;
                bucket[b] = classes;
                rep.data()[classes++] = it;
            }
            return bucket[b];
        };
        for (std::size_t i = 0; i < R; ++i) space[i] = class_of(roots_.data()[i].iter, true);

        // Saved values. The cost of recomputing each elementwise value: its op and the recomputed
        // ops below it (capped; a shared subexpression counts once per use, an estimate).
        cvec<unsigned> cost_(M, 0u);
        unsigned* const cost = cost_.data();
        for (std::size_t n = 0; n < M; ++n) {
            const node_info& ni = info[n];
            if (!needed[n] || given[n] || materialized[n] || ni.kind != op_kind::elementwise) continue;
            unsigned c = ni.cost;
            for (std::size_t k = 0; k < ni.arity; ++k)
                if (!ni.shape_only[k]) c += cost[ni.child[k]];
            cost[n] = c < 4096 ? c : 4096;
        }
        // The (class, stage) pairs that have a loop: a saved value is written by a loop that runs
        // anyway (a set of pairs, open addressing).
        const std::size_t pmask = std::bit_ceil(2 * R + 2) - 1;
        cvec<std::size_t> pair_(pmask + 1, no_parent);  // class * (max stage + 1) + stage
        std::size_t* const pair = pair_.data();
        std::size_t stages = 1;
        for (std::size_t i = 0; i < R; ++i) stages = roots_.data()[i].stage + 1 > stages ? roots_.data()[i].stage + 1 : stages;
        auto pair_slot = [&](std::size_t key) {
            std::size_t b = hash_slot(hash_mix(0x9e3779b97f4a7c15ull, key), pmask);
            while (pair[b] != no_parent && pair[b] != key) b = (b + 1) & pmask;
            return b;
        };
        for (std::size_t i = 0; i < R; ++i) {
            const std::size_t key = space[i] * stages + roots_.data()[i].stage;
            pair[pair_slot(key)] = key;
        }
        // Last node first: the latest stage whose loops compute each value follows from its
        // consumers' (a saved consumer is computed in its own stage only), and a value computed
        // after its own stage and costly enough is saved where a loop of its shape runs.
        cvec<std::size_t> last_(M, 0);
        std::size_t* const last = last_.data();
        for (std::size_t n = M; n-- > 0;) {
            if (!needed[n] || given[n]) continue;
            const node_info& ni = info[n];
            std::size_t at = loop_stage[n];
            if (ni.kind == op_kind::elementwise && !materialized[n] && last[n] > at) {
                const std::size_t cls = cost[n] >= save_cost && ni.cost > 0 ? class_of(n, false) : no_parent;
                if (cls != no_parent && pair[pair_slot(cls * stages + at)] != no_parent) {
                    saved[n] = true;
                    roots_.push_back({n, at, n, root_role::materialisation, 0});
                    space_.push_back(cls);
                } else {
                    at = last[n];
                }
            }
            for (std::size_t k = 0; k < ni.arity; ++k) {
                const std::size_t c = ni.child[k];
                if (!ni.shape_only[k] && at > last[c]) last[c] = at;
            }
        }
        for (std::size_t n = 0; n < M; ++n)
            if (saved[n]) materialized[n] = computed[n] = true;
    }
    R = roots_.size();
    const root* const roots = roots_.data();
    const std::size_t* const space = space_.data();
    std::size_t max_stage = 0;
    for (std::size_t i = 0; i < R; ++i) max_stage = roots[i].stage > max_stage ? roots[i].stage : max_stage;
    cvec<std::size_t> by_stage_(max_stage + 2, 0), fill_(max_stage + 2, 0), order_(R, 0);  // counting sort, stable
    std::size_t *const by_stage = by_stage_.data(), *const fill = fill_.data(), *const order = order_.data();
    for (std::size_t i = 0; i < R; ++i) ++by_stage[roots[i].stage + 1];
    for (std::size_t stage = 0; stage <= max_stage; ++stage) by_stage[stage + 1] += by_stage[stage];
    for (std::size_t stage = 0; stage <= max_stage + 1; ++stage) fill[stage] = by_stage[stage];
    for (std::size_t i = 0; i < R; ++i) order[fill[roots[i].stage]++] = i;

    // Each loop's roots and the nodes of its closure, unordered (a node: id * 2 + 1 if the loop
    // reads it as an input, id * 2 if it computes it). Loops, roots and entries go into arrays
    // grown ahead of use (a loop has at least one root; its entries are at most M).
    cvec<loop_plan> loops_(R + 1, loop_plan{});
    cvec<std::size_t> root_begin_(R + 2, 0), root_list_(R, 0), entry_begin_(R + 2, 0), entry_;
    cvec<std::size_t> loop_of_space_(R, 0), space_seen_(R, 0), loop_first_(R + 1, 0), loop_next_(R, 0);
    cvec<std::size_t> in_loop_(M, 0), own_(M, 0), work_(M, 0);  // marks: loop number + 1
    loop_plan* const loops = loops_.data();
    std::size_t *const root_begin = root_begin_.data(), *const root_list = root_list_.data(),
                       *const entry_begin = entry_begin_.data(), *const loop_of_space = loop_of_space_.data(),
                       *const space_seen = space_seen_.data(), *const loop_first = loop_first_.data(),
                       *const loop_next = loop_next_.data(), *const in_loop = in_loop_.data(),
                       *const own = own_.data(), *const work = work_.data();
    std::size_t n_loops = 0, n_entries = 0, n_roots = 0;
    entry_.resize(M);
    std::size_t* entry = entry_.data();
    for (std::size_t stage = 0; stage <= max_stage; ++stage) {
        // this stage's loops, in the order of their first root; each loop's roots in root order
        // (a list per loop through loop_next, kept in order by its tail in loop_first's slot)
        const std::size_t first_loop = n_loops;
        cvec<std::size_t> tail_(0);
        for (std::size_t k = by_stage[stage]; k < by_stage[stage + 1]; ++k) {
            const std::size_t i = order[k];
            if (space_seen[space[i]] != stage + 1) {
                space_seen[space[i]] = stage + 1;
                loop_of_space[space[i]] = n_loops;
                loop_first[n_loops++] = i;
                tail_.push_back(i);
            } else {
                std::size_t& tail = tail_.data()[loop_of_space[space[i]] - first_loop];
                loop_next[tail] = i;
                tail = i;
            }
            loop_next[i] = no_parent;
        }
        for (std::size_t l = first_loop; l < n_loops; ++l) {
            const std::size_t mark = l + 1;
            loop_plan lp;
            lp.iter = roots[loop_first[l]].iter;
            lp.stage = stage;
            for (std::size_t i = loop_first[l]; i != no_parent; i = loop_next[i]) {
                root_list[n_roots++] = i;
                if (roots[i].role == root_role::materialisation) own[roots[i].node] = mark;
            }
            // at most M entries more
            if (entry_.size() < n_entries + M) {
                entry_.resize(n_entries + n_entries / 2 + M);
                entry = entry_.data();
            }
            const std::size_t first = n_entries;
            std::size_t top = 0;
            for (std::size_t i = loop_first[l]; i != no_parent; i = loop_next[i]) {
                const std::size_t it = roots[i].iter;
                if (in_loop[it] == mark) continue;
                in_loop[it] = mark;
                entry[n_entries++] = it;
                work[top++] = it;
            }
            // Close over value edges down to materialised nodes (a materialisation root is
            // computed in this loop, so it is not an input of it; nor is a value saved in this
            // stage, which loops of its stage compute in place).
            auto is_input = [&](std::size_t w) {
                return materialized[w] && own[w] != mark && !(saved[w] && loop_stage[w] == stage);
            };
            while (top) {
                const node_info& ni = info[work[--top]];
                if (is_input(work[top])) continue;
                for (std::size_t c = 0; c < ni.arity; ++c) {
                    const std::size_t ch = ni.child[c];
                    if (ni.shape_only[c] || in_loop[ch] == mark) continue;
                    in_loop[ch] = mark;
                    entry[n_entries++] = ch;
                    work[top++] = ch;
                }
            }
            for (std::size_t k = first; k < n_entries; ++k)
                entry[k] = entry[k] * 2 + (is_input(entry[k]) ? 1 : 0);
            root_begin[l + 1] = n_roots;
            entry_begin[l + 1] = n_entries;
            loops[l] = lp;
        }
    }
    // Every loop's nodes in id order, by one counting sort over all loops: a comparison sort per
    // loop costs g++'s constant evaluator about as much as the rest of the planner together.
    const std::size_t E = n_entries;
    cvec<std::size_t> owner_(E, 0), start_(M + 1, 0), by_node_(E, 0), sorted_(E, 0), efill_(n_loops + 1, 0);
    std::size_t *const owner = owner_.data(), *const start = start_.data(), *const by_node = by_node_.data(),
                       *const sorted = sorted_.data(), *const efill = efill_.data();
    for (std::size_t l = 0; l < n_loops; ++l)
        for (std::size_t k = entry_begin[l]; k < entry_begin[l + 1]; ++k) owner[k] = l;
    for (std::size_t k = 0; k < E; ++k) ++start[entry[k] / 2 + 1];
    for (std::size_t n = 0; n < M; ++n) start[n + 1] += start[n];
    for (std::size_t k = 0; k < E; ++k) by_node[start[entry[k] / 2]++] = k;
    for (std::size_t l = 0; l <= n_loops; ++l) efill[l] = entry_begin[l];
    for (std::size_t j = 0; j < E; ++j) sorted[efill[owner[by_node[j]]]++] = entry[by_node[j]];

    // members: per loop, inputs, body, then its reductions, materialisations and stores
    planner_output out;
    out.loops.resize(n_loops);
    out.members.resize(E + n_roots);
    loop_plan* const out_loops = out.loops.data();
    std::size_t* const members = out.members.data();
    std::size_t k_out = 0;
    for (std::size_t l = 0; l < n_loops; ++l) {
        loop_plan lp = loops[l];
        const std::size_t e0 = entry_begin[l], e1 = entry_begin[l + 1];
        lp.in_begin = k_out;
        for (std::size_t k = e0; k < e1; ++k)
            if (sorted[k] % 2 == 1) members[k_out++] = sorted[k] / 2;
        lp.in_end = lp.body_begin = k_out;
        for (std::size_t k = e0; k < e1; ++k)
            if (sorted[k] % 2 == 0) members[k_out++] = sorted[k] / 2;
        lp.body_end = lp.red_begin = k_out;
        for (const root_role role : {root_role::reduction, root_role::materialisation, root_role::store}) {
            for (std::size_t k = root_begin[l]; k < root_begin[l + 1]; ++k) {
                const root& r = roots[root_list[k]];
                if (r.role == role) members[k_out++] = role == root_role::store ? r.store_index : r.node;
            }
            if (role == root_role::reduction) lp.red_end = lp.mat_begin = k_out;
            if (role == root_role::materialisation) lp.mat_end = lp.store_begin = k_out;
        }
        lp.store_end = k_out;
        out_loops[l] = lp;
    }
    return out;
}

template <std::size_t M, class Request>
constexpr plan_sizes measure_plan(const std::array<node_info, M>& info, const symbolic_shapes<M>& sym,
                                  const Request& req) {
    std::array<bool, M> a{}, b{}, c{}, d{};
    std::array<std::size_t, M> s{};
    auto out = run_planner<M>(info, sym, req, a, b, c, d, s);
    return {out.loops.size(), out.members.size()};
}

template <std::size_t M, std::size_t L, std::size_t K, class Request>
constexpr plan_data<M, L, K> make_plan(const std::array<node_info, M>& info, const symbolic_shapes<M>& sym,
                                       const Request& req) {
    plan_data<M, L, K> p;
    const planner_output out = run_planner<M>(info, sym, req, p.needed, p.materialized, p.computed, p.saved, p.stage);
    p.loop_count = out.loops.size();
    const bool* const needed = p.needed.data();
    const std::size_t* const stage = p.stage.data();
    for (std::size_t i = 0; i < M; ++i) p.max_stage = needed[i] && stage[i] > p.max_stage ? stage[i] : p.max_stage;
    loop_plan* const loops = p.loops.data();
    std::size_t* const members = p.members.data();
    const loop_plan* const out_loops = out.loops.data();
    const std::size_t* const out_members = out.members.data();
    for (std::size_t i = 0; i < out.loops.size(); ++i) loops[i] = out_loops[i];
    for (std::size_t i = 0; i < out.members.size(); ++i) members[i] = out_members[i];
    return p;
}

// A plan by address: one plan_provider's tables (exec/execute.hpp) as plain data, so that code
// reading a plan (describe()'s flattening, exec/step_view.hpp; the CUDA generator and launcher,
// exec/cuda/plan_view.hpp) is compiled once, not once per plan type.
struct plan_tables {
    std::size_t node_count = 0;
    const node_info* info = nullptr;
    const loop_plan* loops = nullptr;
    std::size_t loop_count = 0;
    const std::size_t* members = nullptr;
    const bool* computed = nullptr;
    const bool* saved = nullptr;
    const std::size_t* stage = nullptr;
    const std::size_t* stores = nullptr;  // the store node of each store index
};
template <class Plan>
constexpr plan_tables plan_tables_of() {
    return {Plan::M,
            Plan::program::info.data(),
            Plan::plan.loops.data(),
            Plan::plan.loop_count,
            Plan::plan.members.data(),
            Plan::plan.computed.data(),
            Plan::plan.saved.data(),
            Plan::plan.stage.data(),
            Plan::stores.data()};
}

}  // namespace typegrad::detail
