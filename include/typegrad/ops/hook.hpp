#pragma once
// Backward hooks as graph nodes (Compiled Autograd's view of hooks, at compile time).
//
//   tg::hook(e, f)        f transforms the total gradient flowing into e, before it propagates
//                         (on a leaf: before accumulation into grad_into). Elementwise hooks
//                         (f(g) for scalars and SIMD batches, e.g. [](auto g) { return g + 10; })
//                         are fused into the backward loops; tensor hooks (f(tg::grad_view<T>))
//                         see and may rewrite the whole gradient. Hooks on one node run in the
//                         order they were added.
//   tg::post_accumulate_grad_hook(p, f)   f(param, grad) runs once p's gradient is complete.
//   tg::retain_grad(e)    e's gradient can be requested with grad_into(e', buffer).
//
// A hook is part of the graph's type, so it is a stateless callable (a captureless lambda or a
// default-constructible function object); state it needs lives outside (globals, bound inputs).
#include <concepts>
#include <cstddef>
#include <span>
#include <type_traits>

#include <typegrad/ops/arithmetic.hpp>

namespace typegrad {

// The whole gradient of one node, writable, row-major.
template <class T>
struct grad_view {
    // The first element.
    T* data;
    // The node's extents (row-major).
    std::span<const std::size_t> extents;
    // The number of elements, the product of the extents.
    std::size_t size() const {
        std::size_t n = 1;
        for (std::size_t e : extents) n *= e;
        return n;
    }
    // Element i in row-major order.
    T& operator[](std::size_t i) const { return data[i]; }
    // Iteration over all elements, row-major.
    T* begin() const { return data; }
    // One past the last element.
    T* end() const { return data + size(); }
};

namespace detail {

// An elementwise hook maps a value to a value; anything else must take the whole gradient (a
// tensor hook names tg::grad_view<T> in its signature, so a generic elementwise lambda is never
// instantiated with a view).
template <class F, class T>
constexpr bool elementwise_hook() {
    if constexpr (std::is_invocable_v<const F&, T>) return !std::is_void_v<std::invoke_result_t<const F&, T>>;
    else return false;
}
template <class F, class T>
inline constexpr bool is_elementwise_hook_v = elementwise_hook<F, T>();
template <class F, class T>
constexpr bool tensor_hook() {
    if constexpr (is_elementwise_hook_v<F, T>) return false;
    else return std::is_invocable_v<const F&, grad_view<T>>;
}
template <class F, class T>
inline constexpr bool is_tensor_hook_v = tensor_hook<F, T>();

template <class F>
struct hook_apply_op : nondifferentiable_elementwise_op {
    static constexpr const char* name = "hook";
    template <class V> static V apply(const V& g) { return V(F{}(g)); }
};

template <class F>
struct tensor_hook_op : kernel_op_base {
    static constexpr const char* name = "tensor_hook";
    static constexpr bool differentiable = false;
    template <class G>
    struct rule {
        using value_type = typename G::value_type;
        using shape_type = typename G::shape_type;
    };
    template <class N, class Ref>
    static void extents(const Ref* in, std::size_t* ext) {
        for (std::size_t a = 0; a < in[0].rank; ++a) ext[a] = in[0].ext[a];
    }
    template <class N, class Ref, class T>
    static void run(const Ref* in, T* out, const std::size_t* ext) {
        const std::size_t rank = in[0].rank, n = numel_of(in[0]);
        const auto* g = static_cast<const T*>(in[0].data);
        // the gradient is materialised densely by a loop, but may be a strided view
        for (std::size_t e = 0; e < n; ++e) out[e] = g[strided_offset(in[0], e)];
        F{}(grad_view<T>{out, std::span<const std::size_t>(ext, rank)});
    }
};

template <class F, class T>
constexpr void check_hook() {
    static_assert(std::is_default_constructible_v<F>,
                  "typegrad: hook(e, f): f is part of the graph's type and must be stateless (a "
                  "captureless lambda or a default-constructible function object).");
    static_assert(is_tensor_hook_v<F, T> || is_elementwise_hook_v<F, T>,
                  "typegrad: hook(e, f): f must map a gradient value to a value (f(g), called on "
                  "scalars and SIMD batches) or take the whole gradient as tg::grad_view<T>.");
}

template <class T, class F, expression G>
constexpr auto apply_hook(G g) {
    if constexpr (is_tensor_hook_v<F, T>) return make_node<tensor_hook_op<F>>(g);
    else return make_node<hook_apply_op<F>>(g);
}

// Identity forward; the backward applies Fs... in order to the incoming gradient.
template <class... Fs>
struct hook_op : elementwise_op {
    static constexpr unsigned cost = 0;  // an identity: no instruction to recompute
    static constexpr const char* name = "hooked";
    static constexpr const char* device = "{0}";
    template <class V> static V apply(const V& x) { return x; }
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X) {
        using T = typename X::value_type;
        return apply_hooks<T, Fs...>(g);
    }
    template <class T, class F0, class... Rest, expression G>
    static constexpr auto apply_hooks(G g) {
        if constexpr (sizeof...(Rest) == 0) return apply_hook<T, F0>(g);
        else return apply_hooks<T, Rest...>(apply_hook<T, F0>(g));
    }
};

template <class N>
struct hooked {
    static constexpr bool value = false;
};
template <class... Fs, class X>
struct hooked<node<hook_op<Fs...>, X>> {
    static constexpr bool value = true;
    using inner = X;
    template <class F>
    using with = node<hook_op<Fs..., F>, X>;
};

// Several post-accumulate hooks on one param run in registration order, as in PyTorch.
template <class... Fs>
struct post_hooks_in_order {
    template <class P, class G>
    void operator()(const P& param, const G& grad) const { (Fs{}(param, grad), ...); }
};

// f(param, grad) after the gradient of the param is written (Fs... in order).
template <class... Fs>
struct post_accumulate_hook_op : elementwise_op {
    static constexpr unsigned cost = 0;  // an identity: no instruction to recompute
    static constexpr const char* name = "post_accumulate_grad_hook";
    static constexpr const char* device = "{0}";
    using hook_type = post_hooks_in_order<Fs...>;
    template <class N>
    static constexpr void check_device() {
        static_assert(always_false<N>, "typegrad: cuda: post_accumulate_grad_hook runs host code on the param and its "
                                       "gradient; it cannot run on the device (docs/cuda.md)");
    }
    template <class V> static V apply(const V& x) { return x; }
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X) { return g; }
};
// Node-kind tests are concepts over class traits (no variable named by a node type; see node.hpp).
template <class N>
struct is_post_hook_trait : std::false_type {};
template <class... Fs, class X>
struct is_post_hook_trait<node<post_accumulate_hook_op<Fs...>, X>> : std::true_type {};
template <class N>
concept is_post_hook_v = is_post_hook_trait<N>::value;

// post_accumulate_grad_hook(post_accumulate_grad_hook(p, f), g): one node with f, g.
template <class N, class F>
struct add_post_hook {
    using type = node<post_accumulate_hook_op<F>, N>;
};
template <class... Fs, class X, class F>
struct add_post_hook<node<post_accumulate_hook_op<Fs...>, X>, F> {
    using type = node<post_accumulate_hook_op<Fs..., F>, X>;
};
template <class N>
struct strip_post_hooks {
    using type = N;
};
template <class... Fs, class X>
struct strip_post_hooks<node<post_accumulate_hook_op<Fs...>, X>> {
    using type = X;
};

// Marks a node whose gradient grad_into may ask for.
struct retain_grad_op : elementwise_op {
    static constexpr unsigned cost = 0;  // an identity: no instruction to recompute
    static constexpr const char* name = "retain_grad";
    static constexpr const char* device = "{0}";
    template <class V> static V apply(const V& x) { return x; }
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X) { return g; }
};
template <class N>
struct is_retained_trait : std::false_type {};
template <class X>
struct is_retained_trait<node<retain_grad_op, X>> : std::true_type {};
template <class N>
concept is_retained_v = is_retained_trait<N>::value;

}  // namespace detail

// tg::hook(e, f): f transforms the gradient flowing into e (a tensor hook, as
// Tensor.register_hook): an elementwise f (taking and returning a value) is fused into the backward
// loops; one taking a tg::grad_view sees the whole gradient.
template <expression E, class F>
constexpr auto hook(E, F) {
    using T = compute_t<typename E::value_type>;
    detail::check_hook<F, T>();
    using N = typename E::node_type;
    if constexpr (detail::hooked<N>::value) return expr<typename detail::hooked<N>::template with<F>>{};
    else return expr<node<detail::hook_op<F>, N>>{};
}

namespace detail {
template <class N>
struct underlying_leaf {
    using type = N;
};
template <class... Fs, class X>
struct underlying_leaf<node<hook_op<Fs...>, X>> {
    using type = X;
};
}  // namespace detail

namespace detail {
template <class L>
constexpr bool is_param_leaf() {
    if constexpr (is_leaf_v<L>) return L::role == leaf_role::param;
    else return true;  // reported as "not a leaf"
}
}  // namespace detail

// p is a param, or a param with pre-hooks (tg::hook(p, f)): those run first, as in PyTorch; or
// the result of post_accumulate_grad_hook: the hooks then run in the order they were added.
template <expression P, class F>
constexpr auto post_accumulate_grad_hook(P, F) {
    using L = typename detail::underlying_leaf<typename detail::strip_post_hooks<typename P::node_type>::type>::type;
    using T = typename P::value_type;
    static_assert(is_leaf_v<L>,
                  "typegrad: post_accumulate_grad_hook(p, f) takes a tg::param, and p is not a leaf but "
                  "the result of an op (PyTorch too rejects post-accumulate hooks on non-leaf tensors).");
    static_assert(detail::is_param_leaf<L>(),
                  "typegrad: post_accumulate_grad_hook(p, f) takes a tg::param, and p is a tg::input, "
                  "which has no gradient.");
    static_assert(std::is_default_constructible_v<F>,
                  "typegrad: post_accumulate_grad_hook(p, f): f is part of the graph's type and must be "
                  "stateless (a captureless lambda or a default-constructible function object).");
    static_assert(std::is_invocable_v<const F&, grad_view<T>, grad_view<T>>,
                  "typegrad: post_accumulate_grad_hook(p, f): f must take (tg::grad_view<T> param, "
                  "tg::grad_view<T> grad).");
    static_assert(std::is_void_v<std::invoke_result_t<const F&, grad_view<T>, grad_view<T>>>,
                  "typegrad: post_accumulate_grad_hook(p, f): f must return void; it acts on the "
                  "param and its gradient in place (PyTorch ignores a returned value, typegrad rejects it).");
    if constexpr (!is_leaf_v<L>) return P{};  // rejected above; stops further errors
    else return expr<typename detail::add_post_hook<typename P::node_type, F>::type>{};
}

// tg::retain_grad(e): r, the same value as e, whose gradient can be requested with
// tg::grad_into(r, buffer) (Tensor.retain_grad).
template <expression E>
constexpr auto retain_grad(E) {
    return expr<node<detail::retain_grad_op, typename E::node_type>>{};
}

}  // namespace typegrad
