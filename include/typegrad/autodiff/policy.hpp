#pragma once
// The words of tg::compile and its calls that are not the step itself: tg::wrt (what to
// differentiate), tg::create_graph, and the policies compile<...> takes (backward autocast,
// tg::detect_anomaly, on_autocast_mismatch), resolved into detail::step_policy.
#include <cstddef>
#include <type_traits>

#include <typegrad/autocast/policy.hpp>
#include <typegrad/autocast/spec.hpp>
#include <typegrad/graph/node.hpp>
#include <typegrad/graph/type_list.hpp>

namespace typegrad {

// The leaves a step differentiates with respect to, as built by tg::wrt.
template <class... Leaves>
struct wrt_t {
    // The leaf types, in the order given to tg::wrt.
    using leaves = detail::type_list<Leaves...>;
};

// The params to differentiate with respect to: tg::compile(loss, tg::wrt(W, b)) (torch.autograd.grad's
// inputs, jax.grad's argnums). Expressions, inputs and repeated leaves are static_asserts.
template <class... Es>
constexpr auto wrt(Es...) {
    static_assert(detail::all_true({is_leaf_v<typename Es::node_type>...}),
                  "typegrad: wrt(...) takes leaves (tg::param), not expressions.");
    static_assert(detail::all_true({(Es::node_type::role == leaf_role::param)...}),
                  "typegrad: wrt(...) got a tg::input; only a tg::param has a gradient (declare "
                  "the leaf with tg::param to differentiate with respect to it).");
    static_assert(detail::distinct<typename Es::node_type...>(),
                  "typegrad: wrt(...) names the same leaf twice.");
    return wrt_t<typename Es::node_type...>{};
}

// Passed to backward(): the caller will differentiate the gradient again.
struct create_graph_t {
    // Whether the gradient will be differentiated again (as create_graph=True).
    bool enabled = true;
};
// Pass to backward(ctx, ..., tg::create_graph) when the caller will differentiate the gradient
// again (torch.autograd.grad(create_graph=True)); throws mutation_error if a custom op's backward
// mutates an input that requires grad.
inline constexpr create_graph_t create_graph{};

// Policy for compile<>: check every forward and backward value for NaN/Inf and throw
// tg::anomaly_error naming the first node that produced one (a checked dry run precedes the
// real one, so no caller buffer is written when it throws).
struct detect_anomaly {};

namespace detail {
template <class P>
inline constexpr bool is_backward_policy_v = std::is_same_v<P, backward_autocast::same_as_forward> ||
                                             std::is_same_v<P, backward_autocast::off>;
template <class S>
inline constexpr bool is_backward_policy_v<backward_autocast::custom<S>> = true;
template <class P>
inline constexpr bool is_known_policy_v = is_backward_policy_v<P> || std::is_same_v<P, detect_anomaly> ||
                                          std::is_same_v<P, on_autocast_mismatch::raise> ||
                                          std::is_same_v<P, on_autocast_mismatch::ignore>;

// The backward's autocast spec under policy P, given the forward's ambient spec.
template <class P, class Ambient>
struct backward_spec_of {
    using type = Ambient;  // same_as_forward
};
template <class Ambient>
struct backward_spec_of<backward_autocast::off, Ambient> {
    using type = no_autocast;
};
template <class S, class Ambient>
struct backward_spec_of<backward_autocast::custom<S>, Ambient> {
    using type = S;
};

// compile<Ps...>'s policies, with the ambient autocast spec of the compiled expression.
template <class Ambient, class... Ps>
struct step_policy {
    static_assert((is_known_policy_v<Ps> && ...),
                  "typegrad: compile<...> got an unknown policy; the policies are tg::backward_autocast::"
                  "same_as_forward, ::off, ::custom<Spec>, tg::detect_anomaly and tg::on_autocast_mismatch::ignore.");
    static_assert((std::size_t(is_backward_policy_v<Ps>) + ... + 0) <= 1,
                  "typegrad: compile<...> got more than one backward_autocast policy.");
    using backward_policy = type_at_t<0, decltype((type_list<>{} + ... +
                                                   std::conditional_t<is_backward_policy_v<Ps>, type_list<Ps>, type_list<>>{}) +
                                                  type_list<backward_autocast::same_as_forward>{})>;
    using ambient = Ambient;
    using backward_spec = typename backward_spec_of<backward_policy, Ambient>::type;
    static constexpr bool anomaly = (std::is_same_v<Ps, detect_anomaly> || ...);
    static constexpr bool check_mismatch = !(std::is_same_v<Ps, on_autocast_mismatch::ignore> || ...);
};
}  // namespace detail

}  // namespace typegrad
