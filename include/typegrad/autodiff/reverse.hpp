#pragma once
// Reverse mode as a type transformation.
//
// One left-to-right pass over the loss's topological order, reversed: the state holds the
// gradient contributions still waiting for their target node. When a node is reached, all of
// its consumers have been processed, so its pending contributions are its whole adjoint; they
// are summed, and the node's VJP rules send new contributions to its children. The state is
// only as large as the graph's frontier, so a chain of N ops costs O(N) instantiations and no
// recursion through the graph's depth. Backward nodes read forward values and adjoints through
// references (node_ref), resolved by the pass's tables when the backward graph is searched;
// tg::grad gets the same gradient as one nested type (materialize).
#include <array>
#include <type_traits>
#include <utility>

#include <typegrad/graph/node.hpp>
#include <typegrad/graph/topo.hpp>
#include <typegrad/ops/arithmetic.hpp>
#include <typegrad/ops/autocast_entry.hpp>
#include <typegrad/ops/broadcast.hpp>
#include <typegrad/ops/cast.hpp>
#include <typegrad/ops/hook.hpp>
#include <typegrad/ops/view.hpp>

namespace typegrad {
namespace detail {

// A contribution to the adjoint of forward node Target (its id in the forward graph).
template <std::size_t Target, class Contribution>
struct pending {
    static constexpr std::size_t target = Target;
    using contribution = Contribution;
};

// VJP rules run on stand-ins, as JAX traces a function on abstract values. A rule is written with
// the ops' functions (operator*, sum_to, ...), and g++ names (mangles) every function it
// instantiates: called with the graph's own node types, each call would be named with the
// subgraphs of its operands, and a model's backward would pay for thousands of names each as long
// as the graph. So a rule is called on stand-ins that keep of each operand only what rules and
// shape rules read (dtype, shape, flags, and the two patterns the simplifications look for), and
// its result is mapped back onto the graph by a class-level substitution. Traces are shared by
// every node with the same op and operand metadata: the blocks of a transformer share them.
template <std::size_t K, class T, class Shape, bool RequiresGrad, bool Contiguous, op_kind Kind>
struct stand_in : operand_metadata<T, Shape, Kind, RequiresGrad, Contiguous> {
    static constexpr node_desc desc{0, hash_mix(0x57A4D1ull, K)};
};
template <std::size_t K, class P>
using stand_in_of = stand_in<K, typename P::value_type, typename P::shape_type, P::requires_grad, P::contiguous, P::kind>;

// What of an operand a stand-in keeps: `parts` are the graph types it stands for, `with<L>` the
// stand-in given a type_list of stand-ins for the parts. Constants are kept (they fold), and so
// are a negation and a broadcast constant (x - (-y), the seed of a sum times a value).
template <class T>
struct pattern_of {
    using parts = type_list<T>;
    template <class L>
    using with = type_at_t<0, L>;
};
template <std::uint64_t V>
struct pattern_of<constant<V>> {
    using parts = type_list<>;
    template <class L>
    using with = constant<V>;
};
template <class X>
struct pattern_of<node<neg_op, X>> {
    using parts = type_list<X>;
    template <class L>
    using with = node<neg_op, type_at_t<0, L>>;
};
template <std::uint64_t V, class Like>
struct pattern_of<node<expand_op, constant<V>, Like>> {
    using parts = type_list<Like>;
    template <class L>
    using with = node<expand_op, constant<V>, type_at_t<0, L>>;
};
// A permute (transpose) is kept too: matmul's VJP reads a transposed operand's layout, and a
// permute's VJP cancels against a permuted adjoint (ops/matmul.hpp, transposed_view).
template <std::size_t... Ps, class X>
struct pattern_of<node<permute_op<Ps...>, X>> {
    using parts = type_list<X>;
    template <class L>
    using with = node<permute_op<Ps...>, type_at_t<0, L>>;
};
// Equal parts get one stand-in (x * x stays a square), numbered by first occurrence in All.
template <class Parts, class All>
struct stand_ins_for;
template <class... Ps, class All>
struct stand_ins_for<type_list<Ps...>, All> {
    using type = type_list<stand_in_of<index_of<Ps, All>::value, Ps>...>;
};
template <class T, class All>
using stand_in_t = typename pattern_of<T>::template with<typename stand_ins_for<typename pattern_of<T>::parts, All>::type>;

// A part as the backward graph names it: a node of the forward graph Forward as a reference to
// it (graph/node.hpp, node_ref); leaves, constants, references and backward nodes as themselves.
// (Forward void: every part as itself.)
template <class Forward, class P>
struct ref_form {
    using type = P;
};
template <class Forward, class Op, class... Cs>
    requires(!std::is_void_v<Forward>)
struct ref_form<Forward, node<Op, Cs...>> {
    static constexpr std::size_t id = Forward::template id_of<node<Op, Cs...>>::value;
    using type = std::conditional_t<id == no_parent, node<Op, Cs...>, node_ref_to<false, id, node<Op, Cs...>>>;
};

// The stand-ins back to graph types (Map: what each stand-in stands for, in stand-in order).
template <class T, class Map>
struct substitute {
    using type = T;
};
template <std::size_t K, class T, class Shape, bool R, bool C, op_kind Kind, class Map>
struct substitute<stand_in<K, T, Shape, R, C, Kind>, Map> {
    using type = type_at_t<K, Map>;
};
template <class Op, class... Cs, class Map>
struct substitute<node<Op, Cs...>, Map> {
    using type = node<Op, typename substitute<Cs, Map>::type...>;
};

template <class Forward, class List>
struct ref_forms;
template <class Forward, class... Ps>
struct ref_forms<Forward, type_list<Ps...>> {
    using type = type_list<typename ref_form<Forward, Ps>::type...>;
};
// Rule::template apply<Ss...>::type (an expr over stand-ins) for the graph types Ts..., as a
// graph type whose nodes of the forward graph Forward are references (Forward void: none).
template <class Forward, class Rule, class... Ts>
struct traced {
    using all = concat_t<typename pattern_of<Ts>::parts...>;
    using type = typename substitute<typename Rule::template apply<stand_in_t<Ts, all>...>::type::node_type,
                                     typename ref_forms<Forward, all>::type>::type;
};

// The contribution of node N = node<Op, Cs...> with adjoint G to its I-th child, summed down
// to the child's shape where the op broadcast it: Op's VJP rule, traced.
// (The choices below are lazy: a branch not taken is never instantiated.)
template <class Shape, class E>
struct summed_to {
    using type = decltype(sum_to<Shape>(E{}));
};
template <class T, class E>
struct cast_to {
    using type = decltype(cast<T>(E{}));
};
template <class Op, std::size_t I, class ChildShape>
struct vjp_rule {
    template <class G, class Out, class... Cs>
    struct apply {
        using raw = decltype(Op::template vjp<I>(expr<G>{}, expr<Out>{}, expr<Cs>{}...));
        using type = typename std::conditional_t<__is_same(typename raw::shape_type, ChildShape),
                                                 std::type_identity<raw>, summed_to<ChildShape, raw>>::type;
    };
};
template <bool Active, class Forward, std::size_t ChildId, class N, class G, std::size_t I>
struct contribution_of {
    using type = type_list<>;
};
// (An operand that is an alias node, an autocast marker, is read as the node it stands for: the
// contribution goes to that node, which the topological order holds in its place.)
template <class Forward, std::size_t ChildId, class Op, class... Cs, class G, std::size_t I>
struct contribution_of<true, Forward, ChildId, node<Op, Cs...>, G, I> {
    using child = unalias_t<type_at_t<I, type_list<Cs...>>>;
    using type = type_list<pending<
        ChildId, typename traced<Forward, vjp_rule<Op, I, typename child::shape_type>, G, node<Op, Cs...>, unalias_t<Cs>...>::type>>;
};
template <class Forward, std::size_t Id, class N, class G, class Seq>
struct children_contributions {
    using type = type_list<>;  // a leaf
};
template <class Forward, std::size_t Id, class Op, class... Cs, class G, std::size_t... Is>
struct children_contributions<Forward, Id, node<Op, Cs...>, G, std::index_sequence<Is...>> {
    using type = concat_t<typename contribution_of<!Op::shape_only(Is) && type_at_t<Is, type_list<Cs...>>::requires_grad,
                                                   Forward, Forward::table.child[Id * max_arity + Is], node<Op, Cs...>, G,
                                                   Is>::type...>;
};

// A node's adjoint has the node's dtype, as in PyTorch's engine: a bf16 value gets a bf16
// gradient even where the op that read it computed in float (and so a leaf gets its own dtype).
// (A weak scalar, the sum of constant contributions, has no dtype to cast.)
template <class T, class V>
concept keeps_dtype = !is_dtype_v<T> || !is_dtype_v<V> || __is_same(T, V);
// A term of a sum of two or more contributions: the sum is taken in at least float and rounded
// once to the node's dtype (docs/autocast.md). A bf16/f16 term is widened; a float one is marked
// fp32 where the backward autocast rewrite will read the sum (Marked), so that a term it lowers
// is widened back rather than summed in bf16.
template <bool Marked, class M, class V = typename M::value_type>
struct sum_term {
    using type = expr<M>;  // f64, weak scalars, float unmarked
};
template <bool Marked, class M, class V>
    requires is_reduced_precision_v<V>
struct sum_term<Marked, M, V> {
    using type = decltype(cast<float>(expr<M>{}));
};
template <class M>
struct sum_term<true, M, float> {
    using type = decltype(fp32_entry(expr<M>{}));
};
template <bool Many, bool Marked, class M>
struct term_of {
    using type = expr<M>;
};
template <bool Marked, class M>
struct term_of<true, Marked, M> : sum_term<Marked, M> {};
// The sum of the contributions Ms, in dtype T (a single one: the cast alone).
template <class T, bool Marked = false>
struct sum_rule {
    template <class... Ms>
    struct apply {
        using total = decltype((typename term_of<(sizeof...(Ms) > 1), Marked, Ms>::type{} + ...));
        using type = typename std::conditional_t<keeps_dtype<T, typename total::value_type>,
                                                 std::type_identity<total>, cast_to<T, total>>::type;
    };
};
template <class T, bool Marked, class Contributions>
struct summed_contributions;
template <class T, bool Marked, class M>
struct summed_contributions<T, Marked, type_list<M>> {
    using type = typename std::conditional_t<keeps_dtype<T, typename M::value_type>, std::type_identity<M>,
                                             traced<void, sum_rule<T>, M>>::type;
};
template <class T, bool Marked, class... Ms>
struct summed_contributions<T, Marked, type_list<Ms...>> : traced<void, sum_rule<T, Marked>, Ms...> {};

// Filters of the pending list (no fold: the list can be long).
template <std::size_t Id>
struct targets {
    template <class P>
    struct test : std::bool_constant<P::target == Id> {};
    template <class P>
    struct other : std::bool_constant<P::target != Id> {};
};
template <class... Ps>
type_list<typename Ps::contribution...> contributions(type_list<Ps...>);

// How the backward names the adjoint Def of forward node I where it reads it: a reference, or
// Def itself where it is a leaf, a reference, or one of the patterns the stand-ins keep for the
// simplifications (pattern_of: a constant, a negation, a broadcast constant such as a sum's seed).
template <std::size_t I, class Def>
struct adjoint_handle {
    using type = std::conditional_t<is_leaf_v<Def> || is_node_ref_v<Def> ||
                                        !__is_same(typename pattern_of<Def>::parts, type_list<Def>),
                                    Def, node_ref_to<true, I, Def>>;
};

// Visiting forward node I (type N) with the contributions Matched sent to it: its adjoint's
// definition `def` (void when nothing reaches it), the handle its operands' contributions read,
// and the pending list after it.
template <class Forward, bool Marked, std::size_t I, class N, class Matched, class Rest, bool Any = (Matched::size > 0)>
struct reverse_visit {
    using def = void;
    using out = Rest;
};
template <class Forward, bool Marked, std::size_t I, class N, class Matched, class Rest>
struct reverse_visit<Forward, Marked, I, N, Matched, Rest, true> {
    using def = desc_forced_t<typename summed_contributions<typename N::value_type, Marked, Matched>::type>;  // (see desc_forced)
    using handle = typename adjoint_handle<I, def>::type;
    using out = concat_t<Rest, typename children_contributions<Forward, I, N, handle,
                                                               std::make_index_sequence<N::desc.arity>>::type>;
};
// The reverse pass after visiting nodes I..n-1 (Pass::init before any); a class per node, so
// that the pass is instantiated one node at a time, last to first (see reverse_defs).
template <class Pass, std::size_t I, bool End = (I == Pass::forward::size)>
struct reverse_at {
    using out = typename Pass::init;
};
template <class Pass, std::size_t I>
struct reverse_at<Pass, I, false> {
    using in = typename reverse_at<Pass, I + 1>::out;
    using node_type = typename topo_at<typename Pass::forward, I>::type;
    using visited = reverse_visit<typename Pass::forward, Pass::marked, I, node_type,
                                  decltype(detail::contributions(filter_t<in, targets<I>::template test>{})),
                                  filter_t<in, targets<I>::template other>>;
    using def = typename visited::def;
    using out = typename visited::out;
};
template <class T>
struct def_desc {
    static constexpr const node_desc* value = &T::desc;
};
template <>
struct def_desc<void> {
    static constexpr const node_desc* value = nullptr;
};
// The adjoint definitions by forward id (`type`, void where none) and their descriptors. The
// visits are instantiated from the last node down (`reversed`), each from its already visited
// successor, so that nothing recurses through the graph's depth.
template <class Pass, class Seq = std::make_index_sequence<Pass::forward::size>>
struct reverse_defs;
template <class Pass, std::size_t... Is>
struct reverse_defs<Pass, std::index_sequence<Is...>> {
    using reversed = type_list<typename reverse_at<Pass, sizeof...(Is) - 1 - Is>::def...>;
    using type = type_list<typename reverse_at<Pass, Is>::def...>;
    static constexpr std::array<const node_desc*, sizeof...(Is) + 1> descs{def_desc<typename reverse_at<Pass, Is>::def>::value...,
                                                                           nullptr};
};

// The type a reference names (any other type: itself).
template <class Pass, class T>
struct ref_target {
    using type = T;
};
template <class Pass, std::size_t I, class V, class S, op_kind K, bool R, bool C, class B>
struct ref_target<Pass, node_ref<false, I, V, S, K, R, C, B>> {
    using type = typename topo_at<typename Pass::forward, I>::type;
};
template <class Pass, std::size_t I, class V, class S, op_kind K, bool R, bool C, class B>
struct ref_target<Pass, node_ref<true, I, V, S, K, R, C, B>>
    : ref_target<Pass, type_at_t<I, typename reverse_defs<Pass>::type>> {};

// The seed as the reverse pass sends it: a unit seed has the output's shape (a [1, 1] loss is
// scalar too).
template <class Forward, class Root, class Seed>
struct seed_form {
    using type = Seed;
};
template <class Forward, class Root, std::uint64_t V>
    requires(Root::shape_type::rank > 0)
struct seed_form<Forward, Root, constant<V>> {
    using type = node<expand_op, constant<V>, typename ref_form<Forward, Root>::type>;
};

// The reverse pass of Root with output gradient Seed, over integer ids: one left-to-right pass
// over the forward graph's topological order, reversed. The pending list holds the contributions
// still waiting for their target node; when a node is reached, all of its consumers have been
// visited, so its pending contributions are its whole adjoint: they are summed into the node's
// adjoint definition, and the node's VJP rules send new contributions to its operands. The list
// is only as large as the graph's frontier, so a chain of N ops costs O(N) instantiations.
// Backward nodes read forward values and adjoints through references (node_ref), so no backward
// type spells the graph: a definition is as long as the VJP rules that made it. The pass is also
// the context that resolves those references (`tables`, `resolve`) when the backward graph is
// searched (graph/topo.hpp's basic_topo).
// Marked: the backward autocast rewrite will read the pass's sums (see sum_term).
template <class Root, class Seed, bool Marked = false>
struct reverse_pass {
    using forward = topo<Root>;
    static constexpr bool marked = Marked;
    // A root that does not require grad (detach, a mask, an input-only expression) sends
    // nothing: every gradient is zero.
    using init = std::conditional_t<Root::requires_grad,
                                    type_list<pending<forward::template id_of<unalias_t<Root>>::value,
                                                      typename seed_form<forward, unalias_t<Root>, Seed>::type>>,
                                    type_list<>>;
    static constexpr ref_tables tables{forward::table.order.data(), reverse_defs<reverse_pass>::descs.data()};
    template <class N>
    using resolve = typename ref_target<reverse_pass, N>::type;
};

// The gradient of Leaf in canonical form (`type`, a node): an elementwise node of the leaf's shape
// and dtype (zeros when the leaf does not reach the root). Traced, as the pass above.
template <class Adjoint, class Leaf>
struct expanded_to_leaf {
    using type = node<expand_op, Adjoint, Leaf>;
};
template <class Leaf, class Adjoint,
          bool NeedsCast = is_dtype_v<typename Adjoint::value_type> &&
                           !__is_same(typename Adjoint::value_type, typename Leaf::value_type)>
struct canonical_gradient {
    using type = typename std::conditional_t<Adjoint::kind == op_kind::elementwise &&
                                                 __is_same(typename Adjoint::shape_type, typename Leaf::shape_type),
                                             std::type_identity<Adjoint>, expanded_to_leaf<Adjoint, Leaf>>::type;
};
template <class Leaf, class Adjoint>
struct canonical_gradient<Leaf, Adjoint, true>
    : canonical_gradient<Leaf, typename traced<void, sum_rule<typename Leaf::value_type>, Adjoint>::type> {};
template <class Adjoint, class Leaf>
struct gradient_of_adjoint : canonical_gradient<Leaf, Adjoint> {};
template <class Leaf>
struct gradient_of_adjoint<void, Leaf> : expanded_to_leaf<typename std::remove_cvref_t<decltype(lit<0>)>::node_type, Leaf> {};

// The gradient node of Leaf (a leaf or a retain_grad node) for the reverse pass Pass, as the
// backward graph holds it (references resolved by Pass: graph_of_t<Stores, Pass>). Its root is
// never a reference.
template <class Pass, class Leaf, std::size_t Id = Pass::forward::template id_of<Leaf>::value,
          bool Reached = Id != no_parent && (Leaf::kind == op_kind::leaf || is_retained_v<Leaf>)>
struct gradient_ref {
    using type = typename Pass::template resolve<typename gradient_of_adjoint<void, Leaf>::type>;
};
template <class Pass, class Leaf, std::size_t Id>
struct gradient_ref<Pass, Leaf, Id, true> {
    using type = typename Pass::template resolve<
        typename gradient_of_adjoint<type_at_t<Id, typename reverse_defs<Pass>::type>, Leaf>::type>;
};
template <class Pass, class Leaf>
using gradient_ref_t = typename gradient_ref<Pass, Leaf>::type;

// A backward type with its references replaced by the types they name: the nested gradient graph
// that tg::grad returns (differentiable again) and the backward autocast rewrite reads. Each
// adjoint definition is materialised once, last forward node first (`reversed`), so that
// nothing recurses through the graph's depth.
template <class Pass, class T>
struct materialize {
    using type = T;
};
template <class Pass, std::size_t I, class V, class S, op_kind K, bool R, bool C, class B>
struct materialize<Pass, node_ref<false, I, V, S, K, R, C, B>> : ref_target<Pass, node_ref<false, I, V, S, K, R, C, B>> {};
template <class Pass, std::size_t I>
struct materialized_def {
    using type = typename materialize<Pass, type_at_t<I, typename reverse_defs<Pass>::type>>::type;
};
template <class Pass, std::size_t I, class V, class S, op_kind K, bool R, bool C, class B>
struct materialize<Pass, node_ref<true, I, V, S, K, R, C, B>> : materialized_def<Pass, I> {};
template <class Pass, class Op, class... Cs>
struct materialize<Pass, node<Op, Cs...>> {
    using type = desc_forced_t<node<Op, typename materialize<Pass, Cs>::type...>>;  // (see desc_forced)
};
template <class Pass, class Seq = std::make_index_sequence<Pass::forward::size>>
struct materialize_all;
template <class Pass, std::size_t... Is>
struct materialize_all<Pass, std::index_sequence<Is...>> {
    using reversed = type_list<typename materialized_def<Pass, sizeof...(Is) - 1 - Is>::type...>;
};
template <class Pass, class T>
struct materialized {
    using forced = typename materialize_all<Pass>::reversed;
    using type = typename materialize<Pass, T>::type;
};

// The gradient node of Leaf for the root Root with adjoint Seed, as one nested graph type.
template <class Root, class Seed, class Leaf, bool Marked = false>
using gradient_node_t =
    typename materialized<reverse_pass<Root, Seed, Marked>, gradient_ref_t<reverse_pass<Root, Seed, Marked>, Leaf>>::type;

template <class E>
using node_of_t = typename std::remove_cvref_t<E>::node_type;

template <class Loss>
inline constexpr bool is_scalar_loss_v =
    Loss::shape_type::is_static && Loss::shape_type::static_numel == 1;

}  // namespace detail

// The gradient of a scalar loss with respect to a leaf, as an expression (so differentiable).
template <class Loss, class Leaf>
constexpr auto grad(Loss, Leaf) {
    static_assert(is_expr_v<std::remove_cvref_t<Loss>> && is_expr_v<std::remove_cvref_t<Leaf>>,
                  "typegrad: grad(loss, leaf) takes two typegrad expressions.");
    using L = detail::node_of_t<Loss>;
    using W = detail::node_of_t<Leaf>;
    static_assert(detail::is_scalar_loss_v<L>,
                  "typegrad: grad(loss, leaf) needs a scalar loss; the gradient of a non-scalar "
                  "output needs a seed: use grad(output, leaf, seed)");
    static_assert(is_leaf_v<W>, "typegrad: grad(loss, leaf) differentiates with respect to a leaf "
                                "(a tg::param), not an expression.");
    return expr<detail::gradient_node_t<L, detail::node_of_t<decltype(lit<1>)>, W>>{};
}
// The gradient of a non-scalar output with respect to a leaf for the output gradient `seed` (an
// expression of the output's shape), as an expression (torch.autograd.grad(out, leaf, seed);
// JAX: the vjp function applied to seed).
template <class Out, class Leaf, class Seed>
constexpr auto grad(Out, Leaf, Seed) {
    using O = detail::node_of_t<Out>;
    using W = detail::node_of_t<Leaf>;
    using S = detail::node_of_t<Seed>;
    static_assert(std::is_same_v<typename S::shape_type, typename O::shape_type>,
                  "typegrad: grad(output, leaf, seed) needs the seed to have the output's shape.");
    static_assert(is_leaf_v<W>, "typegrad: grad(output, leaf, seed) differentiates with respect "
                                "to a leaf (a tg::param), not an expression.");
    return expr<detail::gradient_node_t<O, S, W>>{};
}

// The type of grad(loss, leaf): the gradient graph itself, differentiable again (higher order).
template <class Loss, class Leaf>
using grad_t = decltype(grad(std::declval<Loss>(), std::declval<Leaf>()));

}  // namespace typegrad
