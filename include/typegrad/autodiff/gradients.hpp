#pragma once
// A step's gradient nodes as types: detail::step_gradients (the reverse pass's references, or
// the nested gradient graph rewritten under a backward autocast spec), and the compile-time
// evidence of what the backward runs (tg::backward_nodes_t, tg::op_dtypes_t).
#include <string_view>
#include <type_traits>

#include <typegrad/autocast/rewrite.hpp>
#include <typegrad/autodiff/reverse.hpp>
#include <typegrad/graph/topo.hpp>
#include <typegrad/graph/type_list.hpp>

namespace typegrad {

namespace detail {

template <class N>
constexpr std::string_view op_name_of() {
    if constexpr (requires { N::op::name; }) return N::op::name;
    else return "";
}
template <fixed_string Name>
struct named {
    template <class N>
    struct test : std::bool_constant<op_name_of<N>() == Name.view()> {};
};
template <class... Ms>
type_list<typename Ms::value_type...> value_types(type_list<Ms...>);
template <fixed_string Name, class... Ns>
auto op_dtypes(type_list<Ns...>) -> decltype(detail::value_types(filter_t<type_list<Ns...>, named<Name>::template test>{}));

// A step's gradient nodes (`node<Leaf>`) and the context that resolves their references
// (`refs`, for graph_of_t). Without a backward autocast spec, the backward graph of the reverse
// pass, whose nodes read forward values and adjoints through references; with one, the nested
// gradient graph, whose backward nodes (those not in the forward graph) the autocast rewrite
// reads and rewrites under the spec.
template <class Loss, class Seed, class Spec, bool Rewrite = Spec::enabled>
struct step_gradients {
    using refs = reverse_pass<Loss, Seed>;
    template <class Leaf>
    using node = gradient_ref_t<refs, Leaf>;
};
template <class Loss, class Seed, class Spec>
struct step_gradients<Loss, Seed, Spec, true> {
    using refs = no_refs;
    template <class Leaf>
    using node = typename canonical_gradient<Leaf, rewrite_t<gradient_node_t<Loss, Seed, Leaf, true>, Spec, topo<Loss>>>::type;
};
}  // namespace detail

// The dtypes of the nodes named Name (an op name, e.g. "matmul") in a list of node types such as
// step::backward_nodes, in topological order: compile-time evidence of the dtype a (backward) op
// runs in, e.g. static_assert(std::is_same_v<tg::op_dtypes_t<S::backward_nodes, "matmul">,
// tg::type_list<tg::bf16>>).
template <class Nodes, fixed_string Name>
using op_dtypes_t = decltype(detail::op_dtypes<Name>(Nodes{}));
// A list of types (of nodes, dtypes), as op_dtypes_t and backward_nodes_t give them.
template <class... Ts>
using type_list = detail::type_list<Ts...>;

namespace detail {
template <class Loss>
struct not_in_forward {
    template <class N>
    struct test : std::bool_constant<topo<Loss>::template id_of<N>::value == no_parent> {};
};
template <class Step, class... Ls>
auto backward_nodes_of(type_list<Ls...>)
    -> filter_t<topo_of_t<type_list<typename Step::template grad_node<Ls, !Step::scalar_loss>...>,
                          typename Step::template grad_refs<!Step::scalar_loss>>,
                not_in_forward<typename Step::loss_node>::template test>;
}  // namespace detail

// The nodes of a step's backward graph for all its wrt leaves (forward nodes excluded), e.g. to
// static_assert the dtype a backward op runs in: tg::op_dtypes_t<tg::backward_nodes_t<S>, "matmul">.
template <class Step>
using backward_nodes_t = decltype(detail::backward_nodes_of<Step>(typename Step::wrt_list{}));

}  // namespace typegrad
