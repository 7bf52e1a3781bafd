#pragma once
// The unique nodes of a graph in topological order, computed once per graph in linear time.
//
// Each node type carries a tiny constexpr descriptor (graph/node.hpp: its children's
// descriptors and a structural hash). A depth-first search over those descriptors runs as
// ordinary constexpr code: no template is instantiated per step, identity is the descriptor's
// address (one per type), and a hash table makes each visit O(1). It yields, for every unique
// node, the parent edge that discovered it; the node *types* are then recovered by walking
// those edges one level each (`topo<Roots...>::at<I>`), so building the list instantiates O(N)
// small templates and never a per-node list (the former per-node `topo` lists were O(N^2)
// types in all, and the cost of a 4-block model).
//
// The order is the depth-first post-order over the roots, children in operand order: the same
// order as the union of the roots' former topological lists, so node ids are unchanged.
//
// The search sees through alias nodes (graph/node.hpp: the autocast markers): a marker's id is
// its operand's, and a type recovered from a parent's operand list is unaliased. Only the
// autocast rewrite, which consumes the markers, walks a graph with them (`marked_topo`).
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include <typegrad/graph/cvec.hpp>
#include <typegrad/graph/node.hpp>
#include <typegrad/graph/type_list.hpp>

namespace typegrad::detail {

inline constexpr std::size_t no_parent = static_cast<std::size_t>(-1);

struct topo_table {
    cvec<const node_desc*> order;  // post-order
    cvec<std::size_t> parent;      // id of the node that discovered it, or no_parent (a root)
    cvec<std::size_t> slot;        // its operand position there, or the root's index
    cvec<std::size_t> child;       // ids of the operands, max_arity per node
};

// Where the references of a backward graph point (graph/node.hpp, node_ref): the descriptors of
// the forward graph's nodes and of the adjoint definitions, by index (none for a plain graph).
struct ref_tables {
    const node_desc* const* fwd = nullptr;
    const node_desc* const* adj = nullptr;
};
// The context of a graph without references.
struct no_refs {
    static constexpr ref_tables tables{};
    template <class N>
    using resolve = N;
};

// The descriptor the search takes for d: d itself, the node a reference names, or with Alias
// the operand of an alias chain.
template <bool Alias>
constexpr const node_desc* seen(const node_desc* d, ref_tables r) {
    for (;;) {
        if (Alias && d->alias) d = d->child[0];
        else if (d->ref == 1) d = r.fwd[d->index];
        else if (d->ref == 2) d = r.adj[d->index];
        else return d;
    }
}

constexpr std::size_t hash_slot(std::uint64_t h, std::size_t mask) {
    return static_cast<std::size_t>((h * 0x9E3779B97F4A7C15ull) >> 17) & mask;
}
// The id table of the search and of topo_arrays: open addressing over node ids (no_parent marks
// an empty bucket), keyed by the descriptor's hash, over raw pointers (see run_topo).
constexpr void hash_insert(std::size_t* table, std::size_t mask, std::uint64_t hash, std::size_t id) {
    std::size_t s = hash_slot(hash, mask);
    while (table[s] != no_parent) s = (s + 1) & mask;
    table[s] = id;
}
constexpr std::size_t hash_find(const std::size_t* table, std::size_t mask, const node_desc* const* order,
                                const node_desc* d) {
    std::size_t s = hash_slot(d->hash, mask);
    while (table[s] != no_parent && order[table[s]] != d) s = (s + 1) & mask;
    return table[s];  // no_parent when absent
}

// Iterative depth-first search (no recursion: a 1000-op chain is 1000 levels deep), written
// over raw pointers: clang allows 2^20 steps per constant evaluation and charges every statement
// evaluated, those of each operator[] called included (see cvec), so an 8-block model's search
// through cvec and std::array subscripts went past the limit.
template <bool Alias, std::size_t NRoots>
constexpr topo_table run_topo(const std::array<const node_desc*, NRoots>& roots, ref_tables refs) {
    struct frame {
        const node_desc* d;
        std::size_t next;  // the next operand to look at
        std::size_t slot;  // its operand position in the parent frame, or the root's index
        std::size_t head;  // tree children finished so far (a list through `link`)
    };
    topo_table t;
    cvec<std::size_t> table, link;  // table: open addressing, id or empty
    cvec<frame> stack;
    // Finished nodes and the stack's are distinct (a graph has no cycles), so `cap` entries hold
    // both; the hash table has 2 cap buckets.
    std::size_t cap = 0, m = 0, depth = 0, mask = 0;
    const node_desc** order = nullptr;
    std::size_t *parent = nullptr, *slot = nullptr, *lk = nullptr, *tb = nullptr;
    frame* st = nullptr;
    auto grow = [&] {
        cap = cap ? 2 * cap : 64;
        t.order.resize(cap), t.parent.resize(cap), t.slot.resize(cap), link.resize(cap), stack.resize(cap);
        order = t.order.data(), parent = t.parent.data(), slot = t.slot.data(), lk = link.data();
        st = stack.data();
        table.assign(2 * cap, no_parent);
        tb = table.data();
        mask = 2 * cap - 1;
        for (std::size_t i = 0; i < m; ++i) hash_insert(tb, mask, order[i]->hash, i);
    };
    auto find = [&](const node_desc* d) { return hash_find(tb, mask, order, d); };
    grow();
    for (std::size_t r = 0; r < NRoots; ++r) {
        const node_desc* root = seen<Alias>(roots[r], refs);
        if (find(root) != no_parent) continue;  // reached from an earlier root
        if (m + depth == cap) grow();
        st[depth++] = {root, 0, r, no_parent};
        while (depth) {
            frame& f = st[depth - 1];
            if (f.next < f.d->arity) {
                const node_desc* c = seen<Alias>(f.d->child[f.next], refs);
                const std::size_t s = f.next++;
                // a graph type has no cycles: an unfinished node is never reached again
                if (find(c) == no_parent) {
                    if (m + depth == cap) grow();
                    st[depth++] = {c, 0, s, no_parent};
                }
                continue;
            }
            const std::size_t id = m++;
            order[id] = f.d, slot[id] = f.slot, parent[id] = no_parent;
            hash_insert(tb, mask, f.d->hash, id);
            for (std::size_t c = f.head; c != no_parent; c = lk[c]) parent[c] = id;
            if (--depth) {
                lk[id] = st[depth - 1].head;
                st[depth - 1].head = id;
            }
        }
    }
    t.order.resize(m), t.parent.resize(m), t.slot.resize(m);
    t.child.assign(m * max_arity, no_parent);
    std::size_t* child = t.child.data();
    for (std::size_t i = 0; i < m; ++i)
        for (std::size_t k = 0; k < order[i]->arity; ++k) child[i * max_arity + k] = find(seen<Alias>(order[i]->child[k], refs));
    return t;
}

// The search's result in fixed-size arrays (a constexpr static member cannot hold vectors),
// with a hash table for id look-ups.
template <std::size_t M>
struct topo_arrays {
    static constexpr std::size_t buckets = std::bit_ceil(2 * M + 2);
    std::array<const node_desc*, M> order{};
    std::array<std::size_t, M> parent{}, slot{};
    std::array<std::size_t, M * max_arity> child{};
    std::array<std::size_t, buckets> table{};

    constexpr std::size_t find(const node_desc* d) const {
        return hash_find(table.data(), buckets - 1, order.data(), d);
    }
};

template <bool Alias, std::size_t M, std::size_t NRoots>
constexpr topo_arrays<M> topo_fixed(const std::array<const node_desc*, NRoots>& roots, ref_tables refs) {
    const topo_table t = run_topo<Alias>(roots, refs);
    topo_arrays<M> r;
    const node_desc** order = r.order.data();
    std::size_t *parent = r.parent.data(), *slot = r.slot.data(), *child = r.child.data(), *tb = r.table.data();
    const node_desc* const* t_order = t.order.data();
    const std::size_t *t_parent = t.parent.data(), *t_slot = t.slot.data(), *t_child = t.child.data();
    for (std::size_t i = 0; i < M; ++i) order[i] = t_order[i], parent[i] = t_parent[i], slot[i] = t_slot[i];
    for (std::size_t i = 0; i < M * max_arity; ++i) child[i] = t_child[i];
    for (std::size_t i = 0; i < r.buckets; ++i) tb[i] = no_parent;
    for (std::size_t i = 0; i < M; ++i) hash_insert(tb, r.buckets - 1, t_order[i]->hash, i);
    return r;
}

// (An operand that is an alias node stands for the node the search took: unalias_t; a
// reference, for the node it names.)
template <class Topo, class N>
using seen_t = typename Topo::refs::template resolve<std::conditional_t<Topo::alias, unalias_t<N>, N>>;
template <class Topo, std::size_t I, bool Root = Topo::table.parent[I] == no_parent>
struct topo_at {
    using type = seen_t<Topo, type_at_t<Topo::table.slot[I], typename Topo::roots>>;
};
template <class Topo, std::size_t I>
struct topo_at<Topo, I, false> {
    using type = seen_t<Topo, type_at_t<Topo::table.slot[I], typename topo_at<Topo, Topo::table.parent[I]>::type::children>>;
};

template <class Topo, class Seq = std::make_index_sequence<Topo::size>>
struct topo_list;
template <class Topo, std::size_t... Is>
struct topo_list<Topo, std::index_sequence<Is...>> {
    // Parents have larger ids: instantiating from the last id down resolves each node in one
    // step from its (already resolved) parent, so no instantiation recurses through the depth.
    using reversed = type_list<typename topo_at<Topo, Topo::size - 1 - Is>::type...>;
    using type = type_list<typename topo_at<Topo, Is>::type...>;
};

// The graph reached from Roots: `type` (a type_list in topological order), `size`, `table`
// (operand ids per node), `id_of<N>::value`. A node's id is a type (an integral_constant), not a
// variable template: g++ names every variable it instantiates, and a name spelling the graph and
// the node costs it a large allocation (and, past a few blocks, a walk of its free page list:
// about 10 ms each at 8 GPT blocks, for hundreds of look-ups).
// (Alias: whether the search sees through alias nodes; `topo` does, `marked_topo` does not.
// Refs: where the node references of a backward graph point, no_refs for other graphs.)
template <bool Alias, class Refs, class... Roots>
struct basic_topo {
    static constexpr bool alias = Alias;
    using refs = Refs;
    using roots = type_list<Roots...>;
    static constexpr std::array<const node_desc*, sizeof...(Roots)> root_descs{&Roots::desc...};
    static constexpr std::size_t size = run_topo<Alias>(root_descs, Refs::tables).order.size();
    static constexpr topo_arrays<size> table = topo_fixed<Alias, size>(root_descs, Refs::tables);
    using type = typename topo_list<basic_topo>::type;
    template <class N>
    using id_of = std::integral_constant<std::size_t, table.find(seen<Alias>(&N::desc, Refs::tables))>;  // no_parent when absent
};
template <class... Roots>
using topo = basic_topo<true, no_refs, Roots...>;
// The same with the alias nodes as nodes of their own (for the autocast rewrite).
template <class... Roots>
using marked_topo = basic_topo<false, no_refs, Roots...>;

// The nodes reached from Roots, each once, children before parents.
template <class... Roots>
using topo_t = typename topo<Roots...>::type;

// The same for roots given as a type_list: graph_of_t is the topo struct, topo_of_t its list
// (Refs: the reverse pass whose references the roots hold).
template <class List, class Refs>
struct graph_of;
template <class... Roots, class Refs>
struct graph_of<type_list<Roots...>, Refs> {
    using type = basic_topo<true, Refs, Roots...>;
};
template <class List, class Refs = no_refs>
using graph_of_t = typename graph_of<List, Refs>::type;
template <class List, class Refs = no_refs>
using topo_of_t = typename graph_of_t<List, Refs>::type;

}  // namespace typegrad::detail
