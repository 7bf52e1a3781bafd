#pragma once
// Lowering: a graph type becomes a flat program of integer ids (one per unique node, children
// before parents), and every graph algorithm after this point is a constexpr function over
// std::arrays of those ids. Only kernels go back from an id to its node type.
#include <array>
#include <bit>
#include <cstdint>
#include <cstddef>
#include <string_view>

#include <typegrad/graph/cvec.hpp>
#include <typegrad/graph/node.hpp>
#include <typegrad/graph/topo.hpp>
#include <typegrad/ops/broadcast.hpp>

namespace typegrad::detail {

// The element type of a node's buffer: its dtype's storage type, except that a reduction with a
// bf16/f16 result accumulates in a float buffer (its readers round it once, on load) and a view
// shares its input's buffer.
template <class N>
struct buffer_type {
    using type = storage_t<typename N::value_type>;
};
template <class Op, class C0, class... Cs>
struct buffer_type<node<Op, C0, Cs...>> {
    using value = storage_t<typename node<Op, C0, Cs...>::value_type>;
    using type = std::conditional_t<
        Op::kind == op_kind::view, typename buffer_type<C0>::type,
        std::conditional_t<Op::kind == op_kind::reduce && is_reduced_precision_v<value>, float, value>>;
};
template <class N>
using buffer_t = typename buffer_type<N>::type;

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
    std::array<std::size_t, max_arity> child{};
    std::array<bool, max_arity> shape_only{};
    std::size_t rank = 0;
    std::array<std::size_t, max_rank> ext{};  // static extents, `dyn` where dynamic
    reduce_kind combine = reduce_kind::sum;
    bool is_param = false;
    std::size_t elem_size = 0;  // bytes per element as stored
    dtype_code buffer = dtype_code::other;  // the element type of its buffer
    dtype_code value = dtype_code::other;   // its dtype (a bf16 reduction: value bf16, buffer f32)
    std::size_t extra_bytes = 0;  // kept after the elements (a custom op's saved values)
    std::string_view name{};
    std::uint64_t constant_bits = 0;  // a constant's value (its double's bits)
};

// Node N's row, without its operand ids. A class template's constant, not a function: a function
// instantiated for a node type is named (mangled) with the node's whole subtree spelled out, at a
// cost that grows with the subtree, and g++ names every function it instantiates.
template <class Shape>
constexpr std::array<std::size_t, max_rank> shape_extents_of() {
    std::array<std::size_t, max_rank> e{};
    for (std::size_t i = 0; i < Shape::rank; ++i) e[i] = Shape::extents[i];
    return e;
}
template <class Op, std::size_t Arity>
constexpr std::array<bool, max_arity> shape_only_flags() {
    std::array<bool, max_arity> f{};
    for (std::size_t i = 0; i < Arity; ++i) f[i] = Op::shape_only(i);
    return f;
}
template <class Op>
constexpr reduce_kind combine_of() {
    if constexpr (Op::kind == op_kind::reduce) return Op::combine;
    else return reduce_kind::sum;
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
    static constexpr node_info value{.kind = op_kind::leaf,
                                     .rank = S::rank,
                                     .ext = shape_extents_of<S>(),
                                     .is_param = R == leaf_role::param,
                                     .elem_size = sizeof(buffer_t<N>),
                                     .buffer = dtype_code_of<buffer_t<N>>(),
                                     .value = dtype_code_of<storage_t<T>>(),
                                     .name = N::name()};
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
    static constexpr node_info value{.kind = Op::kind,
                                     .arity = Arity,
                                     .shape_only = shape_only_flags<Op, Arity>(),
                                     .rank = Shape::rank,
                                     .ext = shape_extents_of<Shape>(),
                                     .combine = combine_of<Op>(),
                                     .elem_size = sizeof(Buffer),
                                     .buffer = dtype_code_of<Buffer>(),
                                     .value = dtype_code_of<storage_t<Value>>(),
                                     .extra_bytes = extra_bytes_of<Op>(),
                                     .name = Op::name};
};

// The flat program of a graph (a topo<Roots...>): its nodes in topological order and one
// node_info row per node.
// Rows of the nodes Ns, with their operand ids from the graph's topological table.
template <class Topo, class... Ns>
constexpr std::array<node_info, sizeof...(Ns)> make_info(type_list<Ns...>) {
    std::array<node_info, sizeof...(Ns)> r{node_row<typename row_key<Ns>::type>::value...};
    for (std::size_t i = 0; i < sizeof...(Ns); ++i)
        for (std::size_t k = 0; k < r[i].arity; ++k) r[i].child[k] = Topo::table.child[i * max_arity + k];
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
    // A node's id; `size` when the graph does not hold it.
    template <class N>
    static constexpr std::size_t id_of = Topo::template id_of<N> == no_parent ? size : Topo::template id_of<N>;
    template <class N>
    static constexpr bool contains = Topo::template id_of<N> != no_parent;
};

// ---- planning ------------------------------------------------------------------------------
//
// Elementwise nodes are never stored: each loop recomputes the ones it needs from materialised
// values (leaves, constants, shape-derived scalars, reductions of earlier loops). A reduction
// ends a stage; a loop computes every reduction and store whose inputs are ready in its stage
// and that iterates over the same (provably equal) shape.

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
    std::array<std::array<sym_extent, max_rank>, M> dims{};
};

template <std::size_t M>
constexpr std::size_t uf_find(std::array<std::size_t, M * max_rank>& parent, std::size_t a) {
    while (parent[a] != a) a = parent[a] = parent[parent[a]];
    return a;
}

template <std::size_t M>
constexpr symbolic_shapes<M> symbolic(const std::array<node_info, M>& info) {
    // Every (node, axis) starts as its own class; elementwise ops, expand and reductions unite
    // the dynamic axes that the run-time checks force to be equal.
    std::array<std::size_t, M * max_rank> parent{};
    for (std::size_t i = 0; i < parent.size(); ++i) parent[i] = i;
    auto unite = [&](std::size_t a, std::size_t b) {
        a = uf_find<M>(parent, a);
        b = uf_find<M>(parent, b);
        if (a != b) parent[a < b ? b : a] = a < b ? a : b;
    };
    auto key = [](std::size_t n, std::size_t axis) { return n * max_rank + axis; };
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
                    if (ni.ext[a] == dyn) unite(key(n, a), key(ni.child[c], a + lead));
                continue;
            }
            const std::size_t lead = ni.rank - ci.rank;
            for (std::size_t a = 0; a < ci.rank; ++a)
                if (ci.ext[a] == dyn && ni.ext[a + lead] == dyn) unite(key(n, a + lead), key(ni.child[c], a));
        }
    }
    symbolic_shapes<M> s;
    for (std::size_t n = 0; n < M; ++n)
        for (std::size_t a = 0; a < info[n].rank; ++a)
            s.dims[n][a] = info[n].ext[a] != dyn
                               ? static_cast<sym_extent>(info[n].ext[a])
                               : -1 - static_cast<sym_extent>(uf_find<M>(parent, key(n, a)));
    return s;
}

template <std::size_t M>
constexpr bool same_iteration_space(const std::array<node_info, M>& info,
                                    const symbolic_shapes<M>& s, std::size_t a, std::size_t b) {
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
constexpr auto run_planner(const std::array<node_info, M>& info, const symbolic_shapes<M>& sym,
                           const Request& req, std::array<bool, M>& needed, std::array<bool, M>& materialized,
                           std::array<bool, M>& computed, std::array<std::size_t, M>& stage) {
    std::array<bool, M> given{};
    for (std::size_t g : req.given) given[g] = true;

    // Which nodes are evaluated: one reverse sweep over the id order (children come first).
    for (std::size_t s : req.stores) needed[s] = true;
    for (std::size_t r : req.required) needed[r] = true;
    for (std::size_t n = M; n-- > 0;) {
        if (!needed[n] || given[n]) continue;
        const node_info& ni = info[n];
        if (ni.kind == op_kind::meta) continue;  // reads shapes only
        for (std::size_t c = 0; c < ni.arity; ++c)
            if (!ni.shape_only[c]) needed[ni.child[c]] = true;
    }
    // Views and kernels read buffers: their elementwise inputs are materialised.
    std::array<bool, M> store_in_scratch{};
    for (std::size_t n = 0; n < M; ++n) {
        if (!needed[n] || given[n]) continue;
        const op_kind k = info[n].kind;
        if (k != op_kind::view && k != op_kind::kernel) continue;
        for (std::size_t c = 0; c < info[n].arity; ++c) {
            const std::size_t ch = info[n].child[c];
            if (!info[n].shape_only[c] && !given[ch] && info[ch].kind == op_kind::elementwise)
                store_in_scratch[ch] = true;
        }
    }
    std::array<std::size_t, M> loop_stage{};
    for (std::size_t n = 0; n < M; ++n) {
        if (!needed[n]) continue;
        const node_info& ni = info[n];
        const op_kind k = ni.kind;
        materialized[n] = given[n] || k != op_kind::elementwise || store_in_scratch[n];
        computed[n] = !given[n] && (k == op_kind::reduce || k == op_kind::meta || k == op_kind::kernel ||
                                    store_in_scratch[n]);
        std::size_t s = 0;
        for (std::size_t c = 0; c < ni.arity; ++c)
            if (!ni.shape_only[c] && stage[ni.child[c]] > s) s = stage[ni.child[c]];
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

    // Loop roots: reductions (iterate over their input), materialisations and stores.
    struct root {
        std::size_t iter, stage, node;
        int what;  // 0 reduction, 1 materialisation into scratch, 2 store to an output
        std::size_t store_index;
    };
    cvec<root> roots;
    for (std::size_t n = 0; n < M; ++n) {
        if (!needed[n] || given[n]) continue;
        if (info[n].kind == op_kind::reduce) roots.push_back({info[n].child[0], loop_stage[n], n, 0, 0});
        else if (store_in_scratch[n]) roots.push_back({n, loop_stage[n], n, 1, 0});
    }
    for (std::size_t i = 0; i < req.stores.size(); ++i)
        roots.push_back({req.stores[i], loop_stage[req.stores[i]], req.stores[i], 2, i});

    // Everything below is linear in the graph plus the plan's size (a model's joint graph has
    // thousands of nodes, and g++ stops a constant evaluation after 2^25 operations): roots are
    // bucketed by stage, grouped by an iteration-space class id, and each loop's closure is a
    // search that marks nodes with the loop's number instead of clearing an M-sized array.
    const std::size_t R = roots.size();
    cvec<std::size_t> space(R, 0);  // iteration-space class of each root
    {
        cvec<std::size_t> rep;      // a representative iter node per class
        const std::size_t mask = std::bit_ceil(2 * R + 2) - 1;
        cvec<std::size_t> bucket(mask + 1, no_parent);
        for (std::size_t i = 0; i < R; ++i) {
            const std::size_t it = roots[i].iter;
            std::uint64_t h = info[it].rank;
            for (std::size_t a = 0; a < info[it].rank; ++a)
                h = hash_mix(h, static_cast<std::uint64_t>(sym.dims[it][a]));
            std::size_t b = hash_slot(h, mask);
            while (bucket[b] != no_parent && !same_iteration_space<M>(info, sym, rep[bucket[b]], it))
                b = (b + 1) & mask;
            if (bucket[b] == no_parent) {
                bucket[b] = rep.size();
                rep.push_back(it);
            }
            space[i] = bucket[b];
        }
    }
    std::size_t max_stage = 0;
    for (const root& r : roots) max_stage = r.stage > max_stage ? r.stage : max_stage;
    cvec<std::size_t> by_stage(max_stage + 2, 0);  // counting sort, stable
    for (const root& r : roots) ++by_stage[r.stage + 1];
    for (std::size_t st = 0; st <= max_stage; ++st) by_stage[st + 1] += by_stage[st];
    cvec<std::size_t> order(R, 0);
    {
        cvec<std::size_t> fill = by_stage;
        for (std::size_t i = 0; i < R; ++i) order[fill[roots[i].stage]++] = i;
    }

    // Each loop's roots and the nodes of its closure, unordered (a node: id * 2 + 1 if the loop
    // reads it as an input, id * 2 if it computes it).
    cvec<loop_plan> loops;
    cvec<std::size_t> root_begin(1, 0), root_list, entry_begin(1, 0), entry;
    cvec<std::size_t> loop_of_space(R, 0), space_seen(R, 0);  // seen: stage + 1
    cvec<std::size_t> in_loop(M, 0), own(M, 0);                // marks: loop number + 1
    cvec<std::size_t> work;
    for (std::size_t st = 0; st <= max_stage; ++st) {
        // this stage's loops, in the order of their first root; each loop's roots in root order
        cvec<cvec<std::size_t>> loop_roots;
        for (std::size_t k = by_stage[st]; k < by_stage[st + 1]; ++k) {
            const std::size_t i = order[k];
            if (space_seen[space[i]] != st + 1) {
                space_seen[space[i]] = st + 1;
                loop_of_space[space[i]] = loop_roots.size();
                loop_roots.push_back(cvec<std::size_t>{});
            }
            loop_roots[loop_of_space[space[i]]].push_back(i);
        }
        for (const cvec<std::size_t>& lr : loop_roots) {
            const std::size_t mark = loops.size() + 1;
            loop_plan lp;
            lp.iter = roots[lr.front()].iter;
            lp.stage = st;
            for (std::size_t i : lr) {
                root_list.push_back(i);
                if (roots[i].what == 1) own[roots[i].node] = mark;
            }
            const std::size_t first = entry.size();
            for (std::size_t i : lr) {
                const std::size_t it = roots[i].iter;
                if (in_loop[it] == mark) continue;
                in_loop[it] = mark;
                entry.push_back(it);
                work.push_back(it);
            }
            // Close over value edges down to materialised nodes (a materialisation root is
            // computed in this loop, so it is not an input of it).
            while (!work.empty()) {
                const std::size_t n = work.back();
                work.pop_back();
                if (materialized[n] && own[n] != mark) continue;
                for (std::size_t c = 0; c < info[n].arity; ++c) {
                    const std::size_t ch = info[n].child[c];
                    if (info[n].shape_only[c] || in_loop[ch] == mark) continue;
                    in_loop[ch] = mark;
                    entry.push_back(ch);
                    work.push_back(ch);
                }
            }
            for (std::size_t k = first; k < entry.size(); ++k)
                entry[k] = entry[k] * 2 + (materialized[entry[k]] && own[entry[k]] != mark ? 1 : 0);
            root_begin.push_back(root_list.size());
            entry_begin.push_back(entry.size());
            loops.push_back(lp);
        }
    }
    // Every loop's nodes in id order, by one counting sort over all loops: a comparison sort per
    // loop costs g++'s constant evaluator about as much as the rest of the planner together.
    const std::size_t E = entry.size();
    cvec<std::size_t> owner(E, 0), start(M + 1, 0), by_node(E, 0), sorted(E, 0);
    for (std::size_t l = 0; l < loops.size(); ++l)
        for (std::size_t k = entry_begin[l]; k < entry_begin[l + 1]; ++k) owner[k] = l;
    for (std::size_t k = 0; k < E; ++k) ++start[entry[k] / 2 + 1];
    for (std::size_t n = 0; n < M; ++n) start[n + 1] += start[n];
    for (std::size_t k = 0; k < E; ++k) by_node[start[entry[k] / 2]++] = k;
    {
        cvec<std::size_t> fill = entry_begin;
        for (std::size_t k : by_node) sorted[fill[owner[k]]++] = entry[k];
    }

    planner_output out;
    for (std::size_t l = 0; l < loops.size(); ++l) {
        loop_plan lp = loops[l];
        const std::size_t e0 = entry_begin[l], e1 = entry_begin[l + 1];
        lp.in_begin = out.members.size();
        for (std::size_t k = e0; k < e1; ++k)
            if (sorted[k] % 2 == 1) out.members.push_back(sorted[k] / 2);
        lp.in_end = lp.body_begin = out.members.size();
        for (std::size_t k = e0; k < e1; ++k)
            if (sorted[k] % 2 == 0) out.members.push_back(sorted[k] / 2);
        lp.body_end = lp.red_begin = out.members.size();
        for (int what : {0, 1, 2}) {
            for (std::size_t k = root_begin[l]; k < root_begin[l + 1]; ++k) {
                const root& r = roots[root_list[k]];
                if (r.what == what) out.members.push_back(what == 2 ? r.store_index : r.node);
            }
            if (what == 0) lp.red_end = lp.mat_begin = out.members.size();
            if (what == 1) lp.mat_end = lp.store_begin = out.members.size();
        }
        lp.store_end = out.members.size();
        out.loops.push_back(lp);
    }
    return out;
}

template <std::size_t M, class Request>
constexpr plan_sizes measure_plan(const std::array<node_info, M>& info, const symbolic_shapes<M>& sym,
                                  const Request& req) {
    std::array<bool, M> a{}, b{}, c{};
    std::array<std::size_t, M> s{};
    auto out = run_planner<M>(info, sym, req, a, b, c, s);
    return {out.loops.size(), out.members.size()};
}

template <std::size_t M, std::size_t L, std::size_t K, class Request>
constexpr plan_data<M, L, K> make_plan(const std::array<node_info, M>& info, const symbolic_shapes<M>& sym,
                                       const Request& req) {
    plan_data<M, L, K> p;
    auto out = run_planner<M>(info, sym, req, p.needed, p.materialized, p.computed, p.stage);
    p.loop_count = out.loops.size();
    for (std::size_t i = 0; i < M; ++i)
        if (p.needed[i] && p.stage[i] > p.max_stage) p.max_stage = p.stage[i];
    for (std::size_t i = 0; i < out.loops.size(); ++i) p.loops[i] = out.loops[i];
    for (std::size_t i = 0; i < out.members.size(); ++i) p.members[i] = out.members[i];
    return p;
}

}  // namespace typegrad::detail
