#pragma once
// Autocast: regions of an expression whose ops run in reduced precision by op class, as
// torch.autocast does at trace time, but decided on the graph's type.
//
//   tg::autocast<tg::cpu_bf16>(expr)   rewrites every op of expr by its class on the device:
//     lower_precision  (matmul, dot, linear): float inputs are cast to the spec's dtype;
//     fp32             (losses; on CUDA also exp, log, pow, sum, log_sum_exp, softmax,
//                       log_softmax): bf16/f16 inputs are cast to float;
//     promote          (everything else): the op runs in its widest input dtype.
//   f64 is never cast down. Casts are graph nodes, so a parameter cast twice in a region is one
//   node (types are CSE'd). A nested region governs the ops it wraps; Enabled = false turns
//   autocast off inside it. The rewrite happens when the region is formed: the result keeps a
//   region marker (an identity node that compile() removes) so that an enclosing region leaves
//   the nested one alone, and so that compile() can read the step's ambient spec.
// Composite ops mark their inputs with autocast_entry nodes (ops/autocast_entry.hpp), so a region
// casts at a composite's entry as PyTorch does at the op's.
#include <cstddef>
#include <type_traits>
#include <utility>

#include <typegrad/autocast/spec.hpp>
#include <typegrad/graph/topo.hpp>
#include <typegrad/ops/autocast_entry.hpp>
#include <typegrad/ops/cast.hpp>

namespace typegrad {
namespace detail {

// The identity op that marks a region for the rewrite below. It is an alias op
// (graph/node.hpp): everything but the rewrite sees through it, so compile() lowers a graph
// with markers as the graph without them, and never builds a marker-free copy as types.
template <class Spec>
struct autocast_region_op : elementwise_op {
    static constexpr unsigned cost = 0;  // an identity: no instruction to recompute
    static constexpr const char* name = "autocast_region";
    static constexpr bool is_alias = true;
    template <class V>
    static V apply(const V& x) { return x; }
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X) { return g; }
};
template <class S>
inline constexpr bool is_autocast_marker_v<autocast_region_op<S>> = true;

template <class N>
inline constexpr bool is_region_node_v = false;
template <class S, class X>
inline constexpr bool is_region_node_v<node<autocast_region_op<S>, X>> = true;

// ---- the rewrite: one bottom-up pass over the graph's node table -----------------------------
// The rewritten type of node I is a class template keyed by I: it reads its children's
// rewritten types by their ids (graph/topo.hpp), so each node is rewritten once, with no map of
// old to new types (a map type grows with every node: O(N^2) and a 4-block model did not finish).
// cast<D>(C), with the cast moved below views (transpose(cast(W)) rather than cast(transpose(W))):
// the cast then reads its input densely, and a parameter cast once serves every view of it.
template <class D, class C>
struct cast_below_views {
    using type = typename decltype(cast<D>(expr<C>{}))::node_type;
};
template <class D, class Op, class C0, class... Cs>
    requires(Op::kind == op_kind::view && std::is_same_v<typename node<Op, C0, Cs...>::value_type, typename C0::value_type>)
struct cast_below_views<D, node<Op, C0, Cs...>> {
    using type = node<Op, typename cast_below_views<D, C0>::type, Cs...>;
};

// Child C (already rewritten) of an op of class Cls under Spec. Classes, not functions: g++
// names every function it instantiates, and a function of a node type is named with its subgraph.
template <class Spec>
struct spec_dtype {
    using type = void;
};
template <class Spec>
    requires(Spec::enabled)
struct spec_dtype<Spec> {
    using type = typename Spec::dtype;
};
template <class Spec, autocast_class Cls, class C, class T = typename C::value_type,
          bool Active = Spec::enabled && is_dtype_v<T> && !__is_same(T, double)>
struct cast_input {
    using type = C;
};
template <class Spec, autocast_class Cls, class C, class T>
struct cast_input<Spec, Cls, C, T, true> {
    using D = typename spec_dtype<Spec>::type;
    using type = typename std::conditional_t<
        Cls == autocast_class::lower_precision && !__is_same(T, D), cast_below_views<D, C>,
        std::conditional_t<Cls == autocast_class::fp32 && is_reduced_precision_v<T>, cast_below_views<float, C>,
                           std::type_identity<C>>>::type;
};

template <class Spec, class Op, std::size_t I, class C>
struct rewrite_child {
    using type = typename std::conditional_t<Op::shape_only(I), std::type_identity<C>,
                                             cast_input<Spec, autocast_class_of<Op>(Spec::device::kind), C>>::type;
};

template <class Spec, class N, class NewChildren>
struct rewrite_node {
    using type = N;  // leaves and constants
};
// A marker is replaced by its (cast) child.
template <class Spec, class Op, class C>
struct rewrite_marker {
    using type = C;
};
template <class Spec, class Op, class C>
    requires(requires { Op::class_on(device_kind::cpu); } && Spec::enabled)
struct rewrite_marker<Spec, Op, C> {
    using type = typename cast_input<Spec, Op::class_on(Spec::device::kind), C>::type;
};
template <class Spec, class Op, class Ns, class Is = std::make_index_sequence<Ns::size>>
struct rebuilt_node;
template <class Spec, class Op, class... Ns, std::size_t... Is>
struct rebuilt_node<Spec, Op, type_list<Ns...>, std::index_sequence<Is...>> {
    using type = node<Op, typename rewrite_child<Spec, Op, Is, Ns>::type...>;
};
template <class Spec, class Op, class... Cs, class... Ns>
struct rewrite_node<Spec, node<Op, Cs...>, type_list<Ns...>> {
    using type = typename std::conditional_t<
        is_autocast_marker_v<Op>, rewrite_marker<Spec, Op, type_at_t<0, type_list<Ns..., void>>>,
        std::conditional_t<!Spec::enabled, std::type_identity<node<Op, Ns...>>, rebuilt_node<Spec, Op, type_list<Ns...>>>>::type;
};

// Whether N is in the graph Fixed (a topo struct; void: none).
template <class Fixed, class N>
struct is_fixed_trait : std::bool_constant<Fixed::template id_of<N>::value != no_parent> {};
template <class N>
struct is_fixed_trait<void, N> : std::false_type {};
template <class Fixed, class N>
concept is_fixed_v = is_fixed_trait<Fixed, N>::value;

template <class Spec, class Graph, class Fixed, std::size_t I,
          class Old = typename topo_at<Graph, I>::type, bool Keep = is_fixed_v<Fixed, Old>>
struct rewrite_at {
    using type = Old;
};
template <class Spec, class Graph, class Fixed, std::size_t I, class Old>
struct rewrite_at<Spec, Graph, Fixed, I, Old, false> {
    template <std::size_t... Ks>
    static auto children(std::index_sequence<Ks...>)
        -> type_list<typename rewrite_at<Spec, Graph, Fixed, Graph::table.child[I * max_arity + Ks]>::type...>;
    using type = typename rewrite_node<Spec, Old, decltype(children(std::make_index_sequence<Old::desc.arity>{}))>::type;
};

// Root rewritten under Spec; the nodes of the graph Fixed keep their types (and so their
// subgraphs). The nodes are rewritten in id order (children first), so no instantiation
// recurses through the graph's depth.
template <class Root, class Spec, class Fixed>
struct rewrite {
    using graph = marked_topo<Root>;
    template <std::size_t... Is>
    static auto all(std::index_sequence<Is...>) -> type_list<typename rewrite_at<Spec, graph, Fixed, Is>::type...>;
    using type = type_at_t<graph::size - 1, decltype(all(std::make_index_sequence<graph::size>{}))>;
};
template <class Root, class Spec, class Fixed = void>
using rewrite_t = typename rewrite<Root, Spec, Fixed>::type;

// The nodes under nested region markers (an enclosing region leaves them alone).
template <class N>
struct region_contents {
    using type = type_list<>;
};
template <class S, class X>
struct region_contents<node<autocast_region_op<S>, X>> {
    using type = type_list<X>;
};
// (Their markers are nodes of that graph: an enclosing region's marker around a nested region
// is not.)
template <class List>
struct marked_graph_of;
template <class... Roots>
struct marked_graph_of<type_list<Roots...>> {
    using type = marked_topo<Roots...>;
};
template <class... Ns>
auto nested_regions(type_list<Ns...>) -> typename marked_graph_of<concat_t<typename region_contents<Ns>::type...>>::type;

// The spec of the region wrapping the whole expression, or no_autocast.
template <class Root>
struct ambient_autocast {
    using type = no_autocast;
};
template <class S, class X>
struct ambient_autocast<node<autocast_region_op<S>, X>> {
    using type = S;
};
template <class Root>
using ambient_autocast_t = typename ambient_autocast<Root>::type;

}  // namespace detail

// tg::autocast<Spec>(expr): the forward ops of expr run under the autocast spec (torch.autocast);
// wrapping the whole loss handed to tg::compile makes Spec the ambient autocast of the step
// (docs/autocast.md).
template <class Spec, expression X>
constexpr auto autocast(X) {
    static_assert(is_autocast_spec_v<Spec>,
                  "typegrad: autocast<Spec>(expr) takes a tg::autocast_spec<Device, DType, Enabled> (e.g. tg::cpu_bf16).");
    using N = typename X::node_type;
    if constexpr (!Spec::enabled) {
        return expr<node<detail::autocast_region_op<Spec>, N>>{};
    } else {
        using nested = decltype(detail::nested_regions(typename detail::marked_topo<N>::type{}));
        using R = detail::rewrite_t<N, Spec, nested>;
        return expr<node<detail::autocast_region_op<Spec>, R>>{};
    }
}

}  // namespace typegrad
