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
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
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

constexpr std::size_t hash_slot(std::uint64_t h, std::size_t mask) {
    return static_cast<std::size_t>((h * 0x9E3779B97F4A7C15ull) >> 17) & mask;
}

// Iterative depth-first search (no recursion: a 1000-op chain is 1000 levels deep).
template <std::size_t NRoots>
constexpr topo_table run_topo(const std::array<const node_desc*, NRoots>& roots) {
    topo_table t;
    cvec<std::size_t> table(64, no_parent);  // open addressing: id or empty
    std::size_t mask = table.size() - 1;
    auto find = [&](const node_desc* d) -> std::size_t {
        for (std::size_t s = hash_slot(d->hash, mask);; s = (s + 1) & mask) {
            if (table[s] == no_parent) return no_parent;
            if (t.order[table[s]] == d) return table[s];
        }
    };
    auto insert = [&](const node_desc* d, std::size_t id) {
        if (2 * (id + 1) > table.size()) {
            table.assign(table.size() * 2, no_parent);
            mask = table.size() - 1;
            for (std::size_t i = 0; i < id; ++i) {
                std::size_t s = hash_slot(t.order[i]->hash, mask);
                while (table[s] != no_parent) s = (s + 1) & mask;
                table[s] = i;
            }
        }
        std::size_t s = hash_slot(d->hash, mask);
        while (table[s] != no_parent) s = (s + 1) & mask;
        table[s] = id;
    };
    struct frame {
        const node_desc* d;
        std::size_t next;  // the next operand to look at
        std::size_t slot;  // its operand position in the parent frame, or the root's index
        std::size_t head;  // tree children finished so far (a list through `link`)
    };
    cvec<frame> stack;
    cvec<std::size_t> link;
    for (std::size_t r = 0; r < NRoots; ++r) {
        if (find(roots[r]) != no_parent) continue;  // reached from an earlier root
        stack.push_back({roots[r], 0, r, no_parent});
        while (!stack.empty()) {
            frame& f = stack.back();
            if (f.next < f.d->arity) {
                const node_desc* c = f.d->child[f.next];
                const std::size_t slot = f.next++;
                // a graph type has no cycles: an unfinished node is never reached again
                if (find(c) == no_parent) stack.push_back({c, 0, slot, no_parent});
                continue;
            }
            const std::size_t id = t.order.size();
            t.order.push_back(f.d);
            t.slot.push_back(f.slot);
            t.parent.push_back(no_parent);
            link.push_back(no_parent);
            insert(f.d, id);
            for (std::size_t c = f.head; c != no_parent; c = link[c]) t.parent[c] = id;
            stack.pop_back();
            if (!stack.empty()) {
                link[id] = stack.back().head;
                stack.back().head = id;
            }
        }
    }
    const std::size_t m = t.order.size();
    t.child.assign(m * max_arity, no_parent);
    for (std::size_t i = 0; i < m; ++i)
        for (std::size_t k = 0; k < t.order[i]->arity; ++k) t.child[i * max_arity + k] = find(t.order[i]->child[k]);
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
        for (std::size_t s = hash_slot(d->hash, buckets - 1);; s = (s + 1) & (buckets - 1)) {
            if (table[s] == no_parent || order[table[s]] == d) return table[s];
        }
    }
};

template <std::size_t M, std::size_t NRoots>
constexpr topo_arrays<M> topo_fixed(const std::array<const node_desc*, NRoots>& roots) {
    const topo_table t = run_topo(roots);
    topo_arrays<M> r;
    // flat loops: clang charges a step per statement evaluated, and allows 2^20 per evaluation
    for (std::size_t i = 0; i < M; ++i) r.order[i] = t.order[i];
    for (std::size_t i = 0; i < M; ++i) r.parent[i] = t.parent[i];
    for (std::size_t i = 0; i < M; ++i) r.slot[i] = t.slot[i];
    for (std::size_t i = 0; i < M * max_arity; ++i) r.child[i] = t.child[i];
    for (std::size_t& b : r.table) b = no_parent;
    for (std::size_t i = 0; i < M; ++i) {
        std::size_t s = hash_slot(t.order[i]->hash, r.buckets - 1);
        while (r.table[s] != no_parent) s = (s + 1) & (r.buckets - 1);
        r.table[s] = i;
    }
    return r;
}

template <class Topo, std::size_t I, bool Root = Topo::table.parent[I] == no_parent>
struct topo_at {
    using type = type_at_t<Topo::table.slot[I], typename Topo::roots>;
};
template <class Topo, std::size_t I>
struct topo_at<Topo, I, false> {
    using type = type_at_t<Topo::table.slot[I], typename topo_at<Topo, Topo::table.parent[I]>::type::children>;
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
// (operand ids per node), `id_of<N>`.
template <class... Roots>
struct topo {
    using roots = type_list<Roots...>;
    static constexpr std::array<const node_desc*, sizeof...(Roots)> root_descs{&Roots::desc...};
    static constexpr std::size_t size = run_topo(root_descs).order.size();
    static constexpr topo_arrays<size> table = topo_fixed<size>(root_descs);
    using type = typename topo_list<topo>::type;
    template <class N>
    static constexpr std::size_t id_of = table.find(&N::desc);  // no_parent when absent
};

// The nodes reached from Roots, each once, children before parents.
template <class... Roots>
using topo_t = typename topo<Roots...>::type;

// The same for roots given as a type_list: graph_of_t is the topo struct, topo_of_t its list.
template <class List>
struct graph_of;
template <class... Roots>
struct graph_of<type_list<Roots...>> {
    using type = topo<Roots...>;
};
template <class List>
using graph_of_t = typename graph_of<List>::type;
template <class List>
using topo_of_t = typename graph_of_t<List>::type;

}  // namespace typegrad::detail
