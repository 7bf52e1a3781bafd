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
// The id table of the search: open addressing over node ids (no_parent marks an empty bucket),
// keyed by the descriptor's hash, over raw pointers (see topo_search).
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

struct topo_frame {
    const node_desc* d;
    std::size_t next;  // the next operand to look at
    std::size_t slot;  // its operand position in the parent frame, or the root's index
    std::size_t head;  // tree children finished so far (a list through `link`)
};
// What the search writes: `cap` entries of each array (finished nodes and the stack's are
// distinct, a graph having no cycles, so `cap` entries hold both) and a hash table of mask + 1
// buckets.
struct topo_space {
    const node_desc** order;
    std::size_t* parent;  // id of the node that discovered it, or no_parent (a root)
    std::size_t* slot;    // its operand position there, or the root's index
    std::size_t* link;
    std::size_t* table;
    topo_frame* stack;
    std::size_t cap, mask;
};

// Iterative depth-first search (no recursion: a 1000-op chain is 1000 levels deep), written
// over raw pointers: clang allows 2^20 steps per constant evaluation and charges every statement
// evaluated, those of each operator[] called included (see cvec), so an 8-block model's search
// through cvec and std::array subscripts went past the limit. grow(space, m) makes room when the
// search has filled `cap`; the result is the number of nodes.
template <bool Alias, std::size_t NRoots, class Grow>
constexpr std::size_t topo_search(const std::array<const node_desc*, NRoots>& roots, ref_tables refs, topo_space& s,
                                  Grow grow) {
    std::size_t m = 0, depth = 0;
    for (std::size_t r = 0; r < NRoots; ++r) {
        const node_desc* root = seen<Alias>(roots[r], refs);
        if (hash_find(s.table, s.mask, s.order, root) != no_parent) continue;  // reached from an earlier root
        if (m + depth == s.cap) grow(s, m);
        s.stack[depth++] = {root, 0, r, no_parent};
        while (depth) {
            topo_frame& f = s.stack[depth - 1];
            if (f.next < f.d->arity) {
                const node_desc* c = seen<Alias>(f.d->child[f.next], refs);
                const std::size_t at = f.next++;
                // a graph type has no cycles: an unfinished node is never reached again
                if (hash_find(s.table, s.mask, s.order, c) == no_parent) {
                    if (m + depth == s.cap) grow(s, m);
                    s.stack[depth++] = {c, 0, at, no_parent};
                }
                continue;
            }
            const std::size_t id = m++;
            s.order[id] = f.d, s.slot[id] = f.slot, s.parent[id] = no_parent;
            hash_insert(s.table, s.mask, f.d->hash, id);
            for (std::size_t c = f.head; c != no_parent; c = s.link[c]) s.parent[c] = id;
            if (--depth) {
                s.link[id] = s.stack[depth - 1].head;
                s.stack[depth - 1].head = id;
            }
        }
    }
    return m;
}

// The number of nodes, in growable arrays (the size is not known yet).
template <bool Alias, std::size_t NRoots>
constexpr std::size_t topo_size(const std::array<const node_desc*, NRoots>& roots, ref_tables refs) {
    cvec<const node_desc*> order;
    cvec<std::size_t> parent, slot, link, table;
    cvec<topo_frame> stack;
    auto grow = [&](topo_space& s, std::size_t m) {
        const std::size_t cap = s.cap ? 2 * s.cap : 64;
        order.resize(cap), parent.resize(cap), slot.resize(cap), link.resize(cap), stack.resize(cap);
        table.assign(2 * cap, no_parent);
        s = {order.data(), parent.data(), slot.data(), link.data(), table.data(), stack.data(), cap, 2 * cap - 1};
        for (std::size_t i = 0; i < m; ++i) hash_insert(s.table, s.mask, s.order[i]->hash, i);
    };
    topo_space s{};
    grow(s, 0);
    return topo_search<Alias>(roots, refs, s, grow);
}

// The search's result in fixed-size arrays (a constexpr static member cannot hold vectors),
// with its hash table for id look-ups.
template <std::size_t M>
struct topo_arrays {
    static constexpr std::size_t buckets = std::bit_ceil(2 * M + 2);
    std::array<const node_desc*, M> order{};
    std::array<std::size_t, M> parent{}, slot{};
    std::array<std::size_t, M * max_arity> child{};  // operand ids, no_parent past a node's arity
    std::array<std::size_t, buckets> table{};

    constexpr std::size_t find(const node_desc* d) const {
        return hash_find(table.data(), buckets - 1, order.data(), d);
    }
};

// The search again, M known: it writes straight into the result (no growth, no copy), so this
// evaluation, the larger of the two, costs clang about as many steps as topo_size.
template <bool Alias, std::size_t M, std::size_t NRoots>
constexpr topo_arrays<M> topo_fixed(const std::array<const node_desc*, NRoots>& roots, ref_tables refs) {
    topo_arrays<M> r;
    cvec<std::size_t> link;
    cvec<topo_frame> stack;
    link.reserve(M), stack.reserve(M);
    std::size_t* tb = r.table.data();
    for (std::size_t i = 0; i < r.buckets; ++i) tb[i] = no_parent;
    topo_space s{r.order.data(), r.parent.data(), r.slot.data(), link.data(), tb, stack.data(), M, r.buckets - 1};
    // M is the node count of the same search: it never needs room (and growing would not be a
    // constant expression)
    topo_search<Alias>(roots, refs, s, [](topo_space&, std::size_t) { throw "typegrad: topo_fixed outgrew M"; });
    const node_desc** order = r.order.data();
    std::size_t* child = r.child.data();
    for (std::size_t i = 0; i < M; ++i) {
        std::size_t k = 0;
        for (; k < order[i]->arity; ++k) child[i * max_arity + k] = hash_find(tb, s.mask, order, seen<Alias>(order[i]->child[k], refs));
        for (; k < max_arity; ++k) child[i * max_arity + k] = no_parent;
    }
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
    static constexpr std::size_t size = topo_size<Alias>(root_descs, Refs::tables);
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
