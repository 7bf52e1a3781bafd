#pragma once
// Reverse mode as a type transformation.
//
// One left-to-right pass over the loss's topological order, reversed: the state holds the
// gradient contributions still waiting for their target node. When a node is reached, all of
// its consumers have been processed, so its pending contributions are its whole adjoint; they
// are summed, and the node's VJP rules send new contributions to its children. The state is
// only as large as the graph's frontier, so a chain of N ops costs O(N) instantiations and no
// recursion through the graph's depth.
#include <type_traits>
#include <utility>

#include <typegrad/graph/node.hpp>
#include <typegrad/graph/topo.hpp>
#include <typegrad/ops/arithmetic.hpp>
#include <typegrad/ops/broadcast.hpp>
#include <typegrad/ops/cast.hpp>
#include <typegrad/ops/hook.hpp>

namespace typegrad {
namespace detail {

template <class Target, class Contribution>
struct pending {
    using target = Target;
    using contribution = Contribution;
};
template <class Pendings, class Results>
struct reverse_state {
    using pendings = Pendings;
    using results = Results;
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
// Equal parts get one stand-in (x * x stays a square), numbered by first occurrence in All.
template <class Parts, class All>
struct stand_ins_for;
template <class... Ps, class All>
struct stand_ins_for<type_list<Ps...>, All> {
    using type = type_list<stand_in_of<index_of<Ps, All>::value, Ps>...>;
};
template <class T, class All>
using stand_in_t = typename pattern_of<T>::template with<typename stand_ins_for<typename pattern_of<T>::parts, All>::type>;

// The stand-ins back to graph types (All: the parts in stand-in order).
template <class T, class All>
struct substitute {
    using type = T;
};
template <std::size_t K, class T, class Shape, bool R, bool C, op_kind Kind, class All>
struct substitute<stand_in<K, T, Shape, R, C, Kind>, All> {
    using type = type_at_t<K, All>;
};
template <class Op, class... Cs, class All>
struct substitute<node<Op, Cs...>, All> {
    using type = node<Op, typename substitute<Cs, All>::type...>;
};

// Rule::template apply<Ss...>::type (an expr over stand-ins) for the graph types Ts..., as a graph type.
template <class Rule, class... Ts>
struct traced {
    using all = concat_t<typename pattern_of<Ts>::parts...>;
    using type = typename substitute<typename Rule::template apply<stand_in_t<Ts, all>...>::type::node_type, all>::type;
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
template <bool Active, class N, class G, std::size_t I>
struct contribution_of {
    using type = type_list<>;
};
// (An operand that is an alias node, an autocast marker, is read as the node it stands for: the
// contribution goes to that node, which the topological order holds in its place.)
template <class Op, class... Cs, class G, std::size_t I>
struct contribution_of<true, node<Op, Cs...>, G, I> {
    using child = unalias_t<type_at_t<I, type_list<Cs...>>>;
    using type = type_list<pending<
        child, typename traced<vjp_rule<Op, I, typename child::shape_type>, G, node<Op, Cs...>, unalias_t<Cs>...>::type>>;
};
template <class N, class G, std::size_t I>
struct child_contribution;
template <class Op, class... Cs, class G, std::size_t I>
struct child_contribution<node<Op, Cs...>, G, I>
    : contribution_of<!Op::shape_only(I) && type_at_t<I, type_list<Cs...>>::requires_grad, node<Op, Cs...>, G, I> {};

template <class N, class G, class Seq>
struct children_contributions {
    using type = type_list<>;
};
template <class Op, class... Cs, class G, std::size_t... Is>
struct children_contributions<node<Op, Cs...>, G, std::index_sequence<Is...>> {
    using type = concat_t<typename child_contribution<node<Op, Cs...>, G, Is>::type...>;
};

// A node's adjoint has the node's dtype, as in PyTorch's engine: a bf16 value gets a bf16
// gradient even where the op that read it computed in float (and so a leaf gets its own dtype).
// (A weak scalar, the sum of constant contributions, has no dtype to cast.)
template <class T, class V>
concept keeps_dtype = !is_dtype_v<T> || !is_dtype_v<V> || __is_same(T, V);
// The sum of the contributions Ms, in dtype T (a single one: the cast alone).
template <class T>
struct sum_rule {
    template <class... Ms>
    struct apply {
        using total = decltype((expr<Ms>{} + ...));
        using type = typename std::conditional_t<keeps_dtype<T, typename total::value_type>,
                                                 std::type_identity<total>, cast_to<T, total>>::type;
    };
};
template <class T, class Contributions>
struct summed_contributions;
template <class T, class M>
struct summed_contributions<T, type_list<M>> {
    using type = typename std::conditional_t<keeps_dtype<T, typename M::value_type>, std::type_identity<M>,
                                             traced<sum_rule<T>, M>>::type;
};
template <class T, class... Ms>
struct summed_contributions<T, type_list<Ms...>> : traced<sum_rule<T>, Ms...> {};

// Filters of the pending list (no fold: the list can be long).
template <class N>
struct targets {
    template <class P>
    struct test : std::bool_constant<__is_same(typename P::target, N)> {};
    template <class P>
    struct other : std::bool_constant<!__is_same(typename P::target, N)> {};
};
template <class... Ps>
type_list<typename Ps::contribution...> contributions(type_list<Ps...>);

template <class N, class Matched, class Rest, class Results, bool IsLeaf = N::kind == op_kind::leaf>
struct reverse_visit {
    // a leaf keeps its adjoint
    using adjoint = desc_forced_t<typename summed_contributions<typename N::value_type, Matched>::type>;  // (see desc_forced)
    using type = reverse_state<Rest, concat_t<Results, type_list<pending<N, adjoint>>>>;
};
template <class N, class Matched, class Rest, class Results>
struct reverse_visit<N, Matched, Rest, Results, false> {
    using adjoint = desc_forced_t<typename summed_contributions<typename N::value_type, Matched>::type>;  // (see desc_forced)
    using more = typename children_contributions<N, adjoint, std::make_index_sequence<N::children::size>>::type;
    // retain_grad nodes keep their adjoint for grad_into, and pass it on
    using results = std::conditional_t<is_retained_v<N>, concat_t<Results, type_list<pending<N, adjoint>>>, Results>;
    using type = reverse_state<concat_t<Rest, more>, results>;
};
template <class N, class State>
struct reverse_step;
template <class N, class... Ps, class Results>
struct reverse_step<N, reverse_state<type_list<Ps...>, Results>> {
    using matched = decltype(detail::contributions(filter_t<type_list<Ps...>, targets<N>::template test>{}));
    using rest = filter_t<type_list<Ps...>, targets<N>::template other>;
    using type = typename std::conditional_t<matched::size == 0,
                                             std::type_identity<reverse_state<type_list<Ps...>, Results>>,
                                             reverse_visit<N, matched, rest, Results>>::type;
};

// The fold's operands are member classes (of fold_node, fold_state), so that the
// argument-dependent lookup of its operator<< does not look into the graph (see expr_handle in
// graph/node.hpp).
namespace reverse_fold {
template <class N>
struct fold_node {
    struct type {
        using node = N;
    };
};
template <class State>
struct fold_state {
    struct type {
        using state = State;
    };
};
template <class V, class S>
typename fold_state<typename reverse_step<typename V::node, typename S::state>::type>::type operator<<(V, S);
}  // namespace reverse_fold
template <class N>
using visit = typename reverse_fold::fold_node<N>::type;

// The nodes are visited last to first. One fold covers at most 16 of them (clang limits a fold
// to 256 operands): the first 16 are folded over the state the rest of the list produced.
template <class Topo, class Init>
struct run_reverse;
template <class... Ns, class Init>
struct run_reverse<type_list<Ns...>, Init> {
    using type = typename decltype((visit<Ns>{} << ... << typename reverse_fold::fold_state<Init>::type{}))::state;
};
template <class A0, class A1, class A2, class A3, class A4, class A5, class A6, class A7, class A8, class A9, class A10, class A11, class A12, class A13, class A14, class A15, class N, class... Rest, class Init>
struct run_reverse<type_list<A0, A1, A2, A3, A4, A5, A6, A7, A8, A9, A10, A11, A12, A13, A14, A15, N, Rest...>, Init> {
    using rest = typename reverse_fold::fold_state<typename run_reverse<type_list<N, Rest...>, Init>::type>::type;
    using type = typename decltype((visit<A0>{} << (visit<A1>{} << (visit<A2>{} << (visit<A3>{} << (visit<A4>{} << (visit<A5>{} << (visit<A6>{} << (visit<A7>{} << (visit<A8>{} << (visit<A9>{} << (visit<A10>{} << (visit<A11>{} << (visit<A12>{} << (visit<A13>{} << (visit<A14>{} << (visit<A15>{} << rest{})))))))))))))))))::state;
};

// Adjoints of every leaf reached from Root when its gradient is Seed: type_list<pending<Leaf, Adj>...>.
// A root that does not require grad (detach, a mask, an input-only expression) sends nothing:
// every gradient is zero.
template <class Root, class Seed>
using leaf_adjoints_t = typename run_reverse<
    topo_t<Root>,
    reverse_state<std::conditional_t<Root::requires_grad, type_list<pending<unalias_t<Root>, Seed>>, type_list<>>,
                  type_list<>>>::type::results;

template <class Leaf, class Results>
struct find_adjoint {
    using type = void;
};
template <class Leaf, class... Rs>
struct find_adjoint<Leaf, type_list<Rs...>> {
    using type = typename type_at_t<index_of<Leaf, type_list<typename Rs::target...>>::value,
                                    type_list<Rs..., pending<void, void>>>::contribution;
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
    : canonical_gradient<Leaf, typename traced<sum_rule<typename Leaf::value_type>, Adjoint>::type> {};
// A unit seed has the output's shape (a [1, 1] loss is scalar too).
template <class Root, class Seed>
struct shaped_seed {
    using type = Seed;
};
template <class Root, std::uint64_t V>
    requires(Root::shape_type::rank > 0)
struct shaped_seed<Root, constant<V>> {
    using type = node<expand_op, constant<V>, Root>;
};
template <class Adjoint, class Leaf>
struct gradient_of_adjoint : canonical_gradient<Leaf, Adjoint> {};
template <class Leaf>
struct gradient_of_adjoint<void, Leaf> : expanded_to_leaf<typename std::remove_cvref_t<decltype(lit<0>)>::node_type, Leaf> {};
// The gradient node of Leaf for the root Root with adjoint Seed.
template <class Root, class Seed, class Leaf>
using gradient_node_t = typename gradient_of_adjoint<
    typename find_adjoint<Leaf, leaf_adjoints_t<Root, typename shaped_seed<Root, Seed>::type>>::type, Leaf>::type;

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
