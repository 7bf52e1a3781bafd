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
template <class N>
struct visit {};

// The contribution of node N = node<Op, Cs...> with adjoint G to its I-th child, summed down
// to the child's shape where the op broadcast it.
template <class N, class G, std::size_t I>
struct child_contribution;
template <class Op, class... Cs, class G, std::size_t I>
struct child_contribution<node<Op, Cs...>, G, I> {
    using child = type_at_t<I, type_list<Cs...>>;
    static constexpr bool active = !Op::shape_only(I) && child::requires_grad;
    static constexpr auto make() {
        if constexpr (!active) {
            return type_list<>{};
        } else {
            auto raw = Op::template vjp<I>(expr<G>{}, expr<node<Op, Cs...>>{}, expr<Cs>{}...);
            using raw_t = decltype(raw);
            if constexpr (std::is_same_v<typename raw_t::shape_type, typename child::shape_type>)
                return type_list<pending<child, typename raw_t::node_type>>{};
            else
                return type_list<pending<child, typename decltype(
                                                    sum_to<typename child::shape_type>(raw))::node_type>>{};
        }
    }
    using type = decltype(make());
};

template <class N, class G, class Seq>
struct children_contributions {
    using type = type_list<>;
};
template <class Op, class... Cs, class G, std::size_t... Is>
struct children_contributions<node<Op, Cs...>, G, std::index_sequence<Is...>> {
    using type = decltype((type_list<>{} + ... +
                           typename child_contribution<node<Op, Cs...>, G, Is>::type{}));
};

// A node's adjoint has the node's dtype, as in PyTorch's engine: a bf16 value gets a bf16
// gradient even where the op that read it computed in float (and so a leaf gets its own dtype).
template <class T, class... Ms>
constexpr auto sum_contributions(type_list<Ms...>) {
    auto total = (expr<Ms>{} + ...);
    using V = typename decltype(total)::value_type;
    if constexpr (!is_dtype_v<T> || !is_dtype_v<V> || std::is_same_v<T, V>) return total;
    else return cast<T>(total);
}

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

template <class N, class State>
struct reverse_step;
template <class N, class... Ps, class Results>
struct reverse_step<N, reverse_state<type_list<Ps...>, Results>> {
    using matched = decltype(contributions(filter_t<type_list<Ps...>, targets<N>::template test>{}));
    using rest = filter_t<type_list<Ps...>, targets<N>::template other>;
    static constexpr auto next() {
        if constexpr (matched::size == 0) {
            return reverse_state<type_list<Ps...>, Results>{};
        } else {
            using adjoint = typename decltype(sum_contributions<typename N::value_type>(matched{}))::node_type;
            if constexpr (N::kind == op_kind::leaf) {
                return reverse_state<rest, decltype(Results{} + type_list<pending<N, adjoint>>{})>{};
            } else {
                using more = typename children_contributions<
                    N, adjoint, std::make_index_sequence<N::children::size>>::type;
                // retain_grad nodes keep their adjoint for grad_into, and pass it on
                using results = std::conditional_t<is_retained_v<N>,
                                                   decltype(Results{} + type_list<pending<N, adjoint>>{}), Results>;
                return reverse_state<decltype(rest{} + more{}), results>{};
            }
        }
    }
    using type = decltype(next());
};

template <class N, class State>
typename reverse_step<N, State>::type operator<<(visit<N>, State);

// The nodes are visited last to first. One fold covers at most 16 of them (clang limits a fold
// to 256 operands): the first 16 are folded over the state the rest of the list produced.
template <class Topo, class Init>
struct run_reverse;
template <class... Ns, class Init>
struct run_reverse<type_list<Ns...>, Init> {
    using type = decltype((visit<Ns>{} << ... << Init{}));
};
template <class A0, class A1, class A2, class A3, class A4, class A5, class A6, class A7, class A8, class A9, class A10, class A11, class A12, class A13, class A14, class A15, class N, class... Rest, class Init>
struct run_reverse<type_list<A0, A1, A2, A3, A4, A5, A6, A7, A8, A9, A10, A11, A12, A13, A14, A15, N, Rest...>, Init> {
    using rest = typename run_reverse<type_list<N, Rest...>, Init>::type;
    using type = decltype((visit<A0>{} << (visit<A1>{} << (visit<A2>{} << (visit<A3>{} << (visit<A4>{} << (visit<A5>{} << (visit<A6>{} << (visit<A7>{} << (visit<A8>{} << (visit<A9>{} << (visit<A10>{} << (visit<A11>{} << (visit<A12>{} << (visit<A13>{} << (visit<A14>{} << (visit<A15>{} << rest{})))))))))))))))));
};

// Adjoints of every leaf reached from Root when its gradient is Seed: type_list<pending<Leaf, Adj>...>.
// A root that does not require grad (detach, a mask, an input-only expression) sends nothing:
// every gradient is zero.
template <class Root, class Seed>
using leaf_adjoints_t = typename run_reverse<
    topo_t<Root>,
    reverse_state<std::conditional_t<Root::requires_grad, type_list<pending<Root, Seed>>, type_list<>>,
                  type_list<>>>::type::results;

template <class Leaf, class Results>
struct find_adjoint {
    using type = void;
};
template <class Leaf, class... Rs>
struct find_adjoint<Leaf, type_list<Rs...>> {
    static constexpr std::size_t at = index_of_v<Leaf, type_list<typename Rs::target...>>;
    using type = typename type_at_t<at, type_list<Rs..., pending<void, void>>>::contribution;
};

// The gradient of Leaf in canonical form: an elementwise node of the leaf's shape and dtype
// (zeros when the leaf does not reach the root).
template <class Leaf, class Adjoint>
constexpr auto canonical_gradient() {
    if constexpr (is_dtype_v<typename Adjoint::value_type> &&
                  !std::is_same_v<typename Adjoint::value_type, typename Leaf::value_type>)
        return canonical_gradient<Leaf, typename decltype(cast<typename Leaf::value_type>(expr<Adjoint>{}))::node_type>();
    else if constexpr (Adjoint::kind == op_kind::elementwise &&
                       std::is_same_v<typename Adjoint::shape_type, typename Leaf::shape_type> &&
                       std::is_same_v<typename Adjoint::value_type, typename Leaf::value_type>)
        return expr<Adjoint>{};
    else return make_node<expand_op>(expr<Adjoint>{}, expr<Leaf>{});
}
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
template <class Root, class Seed, class Leaf>
constexpr auto gradient_expr() {
    using adjoint = typename find_adjoint<Leaf, leaf_adjoints_t<Root, typename shaped_seed<Root, Seed>::type>>::type;
    if constexpr (std::is_void_v<adjoint>) return make_node<expand_op>(lit<0>, expr<Leaf>{});
    else return canonical_gradient<Leaf, adjoint>();
}

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
    return detail::gradient_expr<L, detail::node_of_t<decltype(lit<1>)>, W>();
}
template <class Out, class Leaf, class Seed>
constexpr auto grad(Out, Leaf, Seed) {
    using O = detail::node_of_t<Out>;
    using W = detail::node_of_t<Leaf>;
    using S = detail::node_of_t<Seed>;
    static_assert(std::is_same_v<typename S::shape_type, typename O::shape_type>,
                  "typegrad: grad(output, leaf, seed) needs the seed to have the output's shape.");
    static_assert(is_leaf_v<W>, "typegrad: grad(output, leaf, seed) differentiates with respect "
                                "to a leaf (a tg::param), not an expression.");
    return detail::gradient_expr<O, S, W>();
}

template <class Loss, class Leaf>
using grad_t = decltype(grad(std::declval<Loss>(), std::declval<Leaf>()));

}  // namespace typegrad
