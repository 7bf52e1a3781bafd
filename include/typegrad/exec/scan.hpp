#pragma once
// tg::scan: one layer expression, compiled once, applied L times over stacked params.
//
//   constexpr auto h = tg::param<"h", double, tg::shape<tg::dyn, 64>>;   // the carried activation
//   constexpr auto W = tg::param<"W", double, tg::shape<64, 64>>;        // one layer's params
//   constexpr auto b = tg::param<"b", double, tg::shape<64>>;
//   constexpr auto layer = tg::tanh(tg::matmul(h, W) + b) + h;          // h_{l+1} = layer(h_l, W_l, b_l)
//
//   constexpr auto x = tg::input<"x", double, tg::shape<tg::dyn, 64>>;
//   constexpr auto Ws = tg::param<"Ws", double, tg::shape<12, 64, 64>>;  // W_0 .. W_11 stacked
//   constexpr auto bs = tg::param<"bs", double, tg::shape<12, 64>>;
//   auto out = tg::scan(layer, tg::carry(h, x), tg::stacked(W, Ws), tg::stacked(b, bs));
//   auto step = tg::compile(tg::mean(tg::square(out)), tg::wrt(Ws, bs));
//
// `out` has the initial carry's shape and is an ordinary expression of the outer graph. Layer l
// reads slice l of every stacked param (offset l * numel); the gradient of a stacked param
// holds layer l's gradient in slice l. The layer's inner tg::compile steps (a forward-only one
// and its fused value-and-gradient, or one split step under scan_memory::layers) are
// instantiated once whatever L and run in a loop: the compile cost does not depend on L
// (jax.lax.scan, flax nn.scan, PyTorch/XLA scan_layers).
//
// Saved values. The scan is a custom op (ops/custom.hpp), whose saved_type is fixed-size, so
// nothing run-time sized outlives the forward: the forward keeps only the running carry. The
// backward replays the layers from the initial carry (an input of the op, so still alive) and
// then runs each layer's backward in reverse. The policy says what the replay keeps:
//   tg::scan_memory::carries  (default) only the L carries; each layer then runs as one fused
//                             value_and_grad of sum(layer * seed) (activation checkpointing of
//                             the layer body, as jax.checkpoint): two extra forwards in all, the
//                             second fused with the backward; peak memory L x carry.
//   tg::scan_memory::layers   every layer's inner forward context (the carry and the values the
//                             layer's backward reads: matmul outputs, reductions), then the split
//                             backward: one extra forward; peak memory L x one layer's saved
//                             values. Slower today (the split backward fuses less: 1.5x the
//                             step time of `carries` on a 12-layer MLP block, docs/scan.md).
//   tg::scan<tg::scan_memory::layers>(layer, tg::carry(h, x), tg::stacked(W, Ws))
// The replay's buffers are thread_local, reused across calls and emptied when the backward
// ends (also on an exception), so steps stay reentrant across threads.
//
// Limits: every leaf the layer reads is the carry or a stacked param; the carry leaf is a
// tg::param; L (the leading extent of the stacked params) is static or a run-time extent, the
// same for all of them. A custom op has at most four inputs, so more than three stacks are
// first packed into one buffer (a copy per call; their shapes, L included, must be static).
#include <algorithm>
#include <array>
#include <cstddef>
#include <span>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <typegrad/core/error.hpp>
#include <typegrad/exec/bind.hpp>
#include <typegrad/exec/step.hpp>
#include <typegrad/graph/node.hpp>
#include <typegrad/ops/custom.hpp>
#include <typegrad/ops/reduce.hpp>

namespace typegrad {

namespace scan_memory {
// tg::scan<tg::scan_memory::layers>: the backward's replay keeps every layer's inner forward
// context and runs the split backward (one extra forward; peak memory L x one layer's saved values).
struct layers {};
// tg::scan<tg::scan_memory::carries> (default): the replay keeps only the L carries; each layer's
// backward is one fused value_and_grad that recomputes its forward (activation checkpointing of the
// layer body, as jax.checkpoint; peak memory L x carry).
struct carries {};
}  // namespace scan_memory

// tg::carry(leaf, initial): the layer's carried leaf and the expression giving its first value.
template <class Leaf, class Init>
struct carry_t {
    // The leaf the layer reads the carry through.
    using leaf_expr = Leaf;
    // The expression giving the first layer's carry.
    using init_expr = Init;
};
// tg::stacked(leaf, stacked): a per-layer param and its [L, ...] stack.
template <class Leaf, class Stack>
struct stacked_t {
    // The per-layer param leaf the layer reads.
    using leaf_expr = Leaf;
    // The [L, ...] param leaf the step binds (one slice per layer).
    using stack_expr = Stack;
};

// tg::carry(leaf, init): the activation a scan carries from layer to layer, read by the layer as
// leaf, starting at init.
template <expression Leaf, expression Init>
constexpr carry_t<Leaf, Init> carry(Leaf, Init) {
    return {};
}
// tg::stacked(leaf, stack): a per-layer parameter of a scan; the layer reads leaf, the step binds
// stack, whose leading axis is the layer.
template <expression Leaf, expression Stack>
constexpr stacked_t<Leaf, Stack> stacked(Leaf, Stack) {
    return {};
}

namespace detail {

// Does the layer graph read leaf Leaf / only the allowed leaves? Class templates, so each node
// is visited once (memoised by instantiation), not once per path through a DAG.
template <class N, class Leaf>
struct graph_uses_leaf;
template <class N, class Leaf, class Children = typename N::children>
struct graph_uses_leaf_children;
template <class N, class Leaf, class... Cs>
struct graph_uses_leaf_children<N, Leaf, type_list<Cs...>>
    : std::bool_constant<(graph_uses_leaf<Cs, Leaf>::value || ...)> {};
template <class N, class Leaf>
struct graph_uses_leaf {
    static constexpr bool value = [] {
        if constexpr (std::is_same_v<N, Leaf>) return true;
        else if constexpr (requires { typename N::children; }) return graph_uses_leaf_children<N, Leaf>::value;
        else return false;
    }();
};

template <class N, class Allowed>
struct graph_leaves_within;
template <class N, class Allowed, class Children = typename N::children>
struct graph_leaves_within_children;
template <class N, class Allowed, class... Cs>
struct graph_leaves_within_children<N, Allowed, type_list<Cs...>>
    : std::bool_constant<(graph_leaves_within<Cs, Allowed>::value && ...)> {};
template <class N, class... As>
struct graph_leaves_within<N, type_list<As...>> {
    static constexpr bool value = [] {
        if constexpr (is_leaf_v<N>) return (std::is_same_v<N, As> || ...);
        else if constexpr (requires { typename N::children; })
            return graph_leaves_within_children<N, type_list<As...>>::value;
        else return true;  // constants
    }();
};

// Shape agreement of the initial carry with the carried leaf: same rank, and each extent the
// same, or dynamic in the leaf (a static extent of the leaf must be static in the initial value
// too, so that every shape check of the scan happens at compile time).
template <class LeafShape, class InitShape>
constexpr bool carry_shape_fits() {
    if (LeafShape::rank != InitShape::rank) return false;
    for (std::size_t a = 0; a < LeafShape::rank; ++a)
        if (LeafShape::extents[a] != dyn && LeafShape::extents[a] != InitShape::extents[a]) return false;
    return true;
}
template <class LeafShape, class StackShape>
constexpr bool stack_shape_fits() {
    if (StackShape::rank != LeafShape::rank + 1) return false;
    for (std::size_t a = 0; a < LeafShape::rank; ++a)
        if (LeafShape::extents[a] != StackShape::extents[a + 1]) return false;
    return true;
}
// All static leading extents agree.
template <class... Stacks>
constexpr bool static_layer_counts_agree() {
    std::size_t l = dyn;
    bool ok = true;
    for (std::size_t e : {std::size_t(Stacks::shape_type::extents[0])...}) {
        if (e == dyn) continue;
        if (l != dyn && l != e) ok = false;
        l = e;
    }
    return ok;
}

template <class Ctx>
struct clear_on_exit {  // empties thread_local replay storage however the backward ends
    std::vector<Ctx>& contexts;
    ~clear_on_exit() { contexts.clear(); }
};

// Concatenates its (static-shaped) inputs, flattened, into one buffer; the backward splits the
// gradient. It carries more than three stacks into the scan op (a custom op has four inputs).
template <std::size_t Total>
struct scan_pack_op {
    template <class... Xs>
    struct result {
        using value_type = typename type_at_t<0, type_list<Xs...>>::value_type;
        using shape_type = shape<Total>;
    };
    template <class Ctx>
    static void forward(Ctx& ctx) {
        auto out = ctx.output();
        std::size_t at = 0;
        std::apply([&](const auto&... x) { ((std::copy(x.begin(), x.end(), out.data() + at), at += x.size()), ...); },
                   ctx.inputs());
    }
    template <class Ctx>
    static void backward(Ctx& ctx) {
        auto g = ctx.grad_output();
        std::size_t at = 0;
        std::apply([&](const auto&... gx) {
            ((std::copy(g.data() + at, g.data() + at + gx.size(), gx.data()), at += gx.size()), ...);
        }, ctx.grad_inputs());
    }
};
template <class... Es>
constexpr auto scan_pack_all(Es... es);
template <std::size_t G, class List>
constexpr auto scan_pack_group() {
    constexpr std::size_t first = 4 * G;
    constexpr std::size_t count = List::size - first < 4 ? List::size - first : 4;
    return []<std::size_t... Is>(std::index_sequence<Is...>) {
        return custom<scan_pack_op<(type_at_t<first + Is, List>::shape_type::static_numel + ...)>>(
            type_at_t<first + Is, List>{}...);
    }(std::make_index_sequence<count>{});
}
// All stacks in one buffer, in order (a tree of packs of at most four).
template <class... Es>
constexpr auto scan_pack_all(Es... es) {
    if constexpr (sizeof...(Es) <= 4) {
        return custom<scan_pack_op<(Es::shape_type::static_numel + ...)>>(es...);
    } else {
        return []<std::size_t... Gs>(std::index_sequence<Gs...>) {
            return scan_pack_all(scan_pack_group<Gs, type_list<Es...>>()...);
        }(std::make_index_sequence<(sizeof...(Es) + 3) / 4>{});
    }
}

// The custom op: inputs (initial carry, stack_0, ...), or (initial carry, all stacks packed)
// when PackedL is the static layer count (not dyn); output: the last carry.
template <class Policy, std::size_t PackedL, class Layer, class CarryLeaf, class... ParamLeaves>
struct scan_op {
    using T = typename CarryLeaf::value_type;
    static constexpr std::size_t P = sizeof...(ParamLeaves);
    static constexpr bool packed = PackedL != dyn;
    // Where stack K starts in the packed input.
    template <std::size_t K>
    static constexpr std::size_t packed_offset = [] {
        constexpr std::array<std::size_t, P> numel{ParamLeaves::shape_type::static_numel...};
        std::size_t at = 0;
        for (std::size_t j = 0; j < K; ++j) at += PackedL * numel[j];
        return at;
    }();
    template <std::size_t K, class Ctx>
    static const T* stack_data(const Ctx& ctx) {
        if constexpr (packed) return ctx.template input<1>().data() + packed_offset<K>;
        else return ctx.template input<K + 1>().data();
    }
    template <std::size_t K, class Ctx>
    static T* stack_grad(const Ctx& ctx) {
        if constexpr (packed) return ctx.template grad_input<1>().data() + packed_offset<K>;
        else return ctx.template grad_input<K + 1>().data();
    }
    // scan_memory::layers: one step, split forward/backward (the backward reads the contexts).
    static constexpr auto split_step = compile(Layer{}, wrt(CarryLeaf{}, ParamLeaves{}...));
    // scan_memory::carries: a forward-only step, and the layer's VJP as one fused value_and_grad:
    // d/d(h, W) sum(layer(h, W) * gy) is the backward seeded with gy.
    static constexpr auto seed_leaf = input<"typegrad::scan seed", T, typename CarryLeaf::shape_type>;
    static constexpr auto forward_step = compile(Layer{}, wrt());
    static constexpr auto vjp_step = compile(sum(Layer{} * seed_leaf), wrt(CarryLeaf{}, ParamLeaves{}...));

    template <std::size_t R>
    static std::array<std::size_t, R> extents_from(std::span<const std::size_t> e, std::size_t skip) {
        std::array<std::size_t, R> r{};
        for (std::size_t a = 0; a < R; ++a) r[a] = e[a + skip];
        return r;
    }

    // Per-layer geometry read from the op's input views.
    template <class Ctx>
    struct geometry {
        std::size_t layers = 0;
        std::size_t carry_numel = 0;
        std::array<std::size_t, CarryLeaf::shape_type::rank> carry_ext{};
        std::array<std::size_t, P> param_numel{};
        std::tuple<std::array<std::size_t, ParamLeaves::shape_type::rank>...> param_ext{};

        explicit geometry(const Ctx& ctx) {
            auto x = ctx.template input<0>();
            carry_ext = extents_from<CarryLeaf::shape_type::rank>(x.extents(), 0);
            carry_numel = x.size();
            if constexpr (packed) {  // every shape static
                layers = PackedL;
                param_numel = {ParamLeaves::shape_type::static_numel...};
                param_ext = {ParamLeaves::shape_type::extents...};
            } else [&]<std::size_t... Ks>(std::index_sequence<Ks...>) {
                const std::array<std::size_t, P> counts{ctx.template input<Ks + 1>().extents()[0]...};
                layers = counts[0];
                for (std::size_t c : counts)
                    if (c != layers)
                        fail<shape_error>({"typegrad: scan: the stacked params have different layer counts (",
                                           layers, " and ", c,
                                           "); every tg::stacked(...) leaf needs the same leading extent"});
                ((std::get<Ks>(param_ext) =
                      extents_from<std::tuple_element_t<Ks, std::tuple<ParamLeaves...>>::shape_type::rank>(
                          ctx.template input<Ks + 1>().extents(), 1)),
                 ...);
                ((param_numel[Ks] = layers == 0 ? 0 : ctx.template input<Ks + 1>().size() / layers), ...);
            }(std::make_index_sequence<P>{});
        }
    };

    // Bindings of layer l: the carry from `h`, params from slice l of each stack.
    template <class Ctx, class F>
    static decltype(auto) with_layer(const Ctx& ctx, const geometry<Ctx>& g, const T* h, std::size_t l, F&& f) {
        return [&]<std::size_t... Ks>(std::index_sequence<Ks...>) -> decltype(auto) {
            return f(bind(CarryLeaf{}, h, g.carry_ext),
                     bind(ParamLeaves{}, stack_data<Ks>(ctx) + l * g.param_numel[Ks],
                          std::get<Ks>(g.param_ext))...);
        }(std::make_index_sequence<P>{});
    }
    // Gradient destinations of layer l: the carry's into `gh`, the params' into slice l of each
    // stacked gradient (each slice is written by one layer only, so overwritten).
    template <class Ctx, class F>
    static void with_grads(const Ctx& ctx, const geometry<Ctx>& g, T* gh, std::size_t l, F&& f) {
        [&]<std::size_t... Ks>(std::index_sequence<Ks...>) {
            f(grad_into(CarryLeaf{}, std::span<T>(gh, g.carry_numel)),
              grad_into(ParamLeaves{}, std::span<T>(stack_grad<Ks>(ctx) + l * g.param_numel[Ks],
                                                    g.param_numel[Ks]))...);
        }(std::make_index_sequence<P>{});
    }
    template <class Step, class Ctx>
    static auto layer_forward(const Step& step, const Ctx& ctx, const geometry<Ctx>& g, const T* h, std::size_t l) {
        return with_layer(ctx, g, h, l, [&](const auto&... b) { return step.forward(b...); });
    }
    template <class Step, class Ctx>
    using context_t = decltype(layer_forward(std::declval<const Step&>(), std::declval<const Ctx&>(),
                                             std::declval<const geometry<Ctx>&>(), std::declval<const T*>(), 0));

    template <class Ctx>
    static void forward(Ctx& ctx) {
        const auto& step = [&]() -> const auto& {
            if constexpr (std::is_same_v<Policy, scan_memory::layers>) return split_step;
            else return forward_step;
        }();
        using step_ctx = context_t<std::remove_cvref_t<decltype(step)>, Ctx>;
        const geometry<Ctx> g(ctx);
        auto out = ctx.output();
        const T* h = ctx.template input<0>().data();
        if (g.layers == 0) {
            std::copy(h, h + g.carry_numel, out.data());
            return;
        }
        // Only the running carry is kept: the previous layer's context holds it.
        step_ctx prev = layer_forward(step, ctx, g, h, 0);
        for (std::size_t l = 1; l < g.layers; ++l) {
            step_ctx next = layer_forward(step, ctx, g, prev.values().data(), l);
            prev = std::move(next);
        }
        std::copy(prev.values().begin(), prev.values().end(), out.data());
    }

    template <class Ctx>
    static void backward(Ctx& ctx) {
        const geometry<Ctx> g(ctx);
        const std::size_t n = g.carry_numel;
        const T* h0 = ctx.template input<0>().data();
        const T* gy = ctx.grad_output().data();
        T* gh0 = ctx.template grad_input<0>().data();
        if (g.layers == 0) {
            std::copy(gy, gy + n, gh0);
            return;
        }
        // Carry gradients ping-pong between two buffers; the first layer's goes to the op's.
        thread_local std::vector<T> grad_buf;
        if (grad_buf.size() < 2 * n) grad_buf.resize(2 * n);
        auto gh_of = [&](std::size_t l) { return l == 0 ? gh0 : grad_buf.data() + (l % 2) * n; };
        auto gy_of = [&](std::size_t l) -> const T* {
            return l + 1 == g.layers ? gy : grad_buf.data() + ((l + 1) % 2) * n;
        };
        const std::array<std::size_t, CarryLeaf::shape_type::rank> ext = g.carry_ext;

        if constexpr (std::is_same_v<Policy, scan_memory::layers>) {
            using step_ctx = context_t<std::remove_cvref_t<decltype(split_step)>, Ctx>;
            thread_local std::vector<step_ctx> contexts;
            clear_on_exit<step_ctx> guard{contexts};
            contexts.clear();
            contexts.reserve(g.layers);  // no reallocation: layer l+1 reads layer l's storage
            contexts.push_back(layer_forward(split_step, ctx, g, h0, 0));
            for (std::size_t l = 1; l < g.layers; ++l)
                contexts.push_back(layer_forward(split_step, ctx, g, contexts[l - 1].values().data(), l));
            for (std::size_t l = g.layers; l-- > 0;) {
                with_grads(ctx, g, gh_of(l), l, [&](const auto&... gr) {
                    split_step.backward(contexts[l], seed(std::span<const T>(gy_of(l), n)), gr...);
                });
                contexts.pop_back();  // layer l's values are dead once its backward ran
            }
        } else {
            // Carries h_1 .. h_{L-1}; then each layer's fused forward and backward, in reverse.
            thread_local std::vector<T> carries;
            if (carries.size() < (g.layers - 1) * n) carries.resize((g.layers - 1) * n);
            auto h_of = [&](std::size_t l) -> const T* { return l == 0 ? h0 : carries.data() + (l - 1) * n; };
            for (std::size_t l = 0; l + 1 < g.layers; ++l) {
                const auto c = layer_forward(forward_step, ctx, g, h_of(l), l);
                std::copy(c.values().begin(), c.values().end(), carries.data() + l * n);
            }
            for (std::size_t l = g.layers; l-- > 0;) {
                with_layer(ctx, g, h_of(l), l, [&](const auto&... b) {
                    with_grads(ctx, g, gh_of(l), l, [&](const auto&... gr) {
                        vjp_step.value_and_grad(b..., bind(seed_leaf, gy_of(l), ext), gr...);
                    });
                    return 0;
                });
            }
        }
    }
};

template <class Policy>
inline constexpr bool is_scan_policy_v =
    std::is_same_v<Policy, scan_memory::layers> || std::is_same_v<Policy, scan_memory::carries>;

template <class T>
inline constexpr bool is_carry_v = false;
template <class L, class I>
inline constexpr bool is_carry_v<carry_t<L, I>> = true;
template <class T>
inline constexpr bool is_stacked_v = false;
template <class L, class S>
inline constexpr bool is_stacked_v<stacked_t<L, S>> = true;

template <class Leaf>
constexpr bool is_param_expr() {
    if constexpr (is_leaf_v<typename Leaf::node_type>) return Leaf::node_type::role == leaf_role::param;
    else return false;
}

// Every check of scan(); true when the op can be built (so a failed check stops there).
template <class Layer, class C, class... S>
constexpr bool check_scan() {
    using layer_node = typename Layer::node_type;
    using h = typename C::leaf_expr;
    using x = typename C::init_expr;
    static_assert(is_param_expr<h>(),
                  "typegrad: scan: the carried leaf of tg::carry(leaf, initial) must be a leaf declared with "
                  "tg::param (the layer is differentiated with respect to it to pass the gradient back to the "
                  "previous layer).");
    static_assert((is_param_expr<typename S::leaf_expr>() && ...),
                  "typegrad: scan: the per-layer leaf of tg::stacked(leaf, stack) must be a leaf declared with "
                  "tg::param.");
    static_assert(distinct<typename h::node_type, typename S::leaf_expr::node_type...>(),
                  "typegrad: scan: a leaf is named twice among tg::carry(...) and tg::stacked(...); each per-layer "
                  "leaf is stacked once, and the carried leaf is not a stacked param.");
    static_assert(sizeof...(S) <= 3 || (S::stack_expr::shape_type::is_static && ...),
                  "typegrad: scan with more than three tg::stacked(...) params needs static stack shapes (a static "
                  "L): they are packed into one buffer of static size, since a custom op has at most four inputs.");
    static_assert(std::is_same_v<typename h::value_type, typename x::value_type>,
                  "typegrad: scan: the initial carry's dtype differs from the carried leaf's; cast it (tg::cast).");
    static_assert(carry_shape_fits<typename h::shape_type, typename x::shape_type>(),
                  "typegrad: scan: the initial carry's shape differs from the carried leaf's (same rank, and every "
                  "static extent of the leaf static and equal in the initial carry).");
    static_assert(std::is_same_v<typename layer_node::value_type, typename h::value_type>,
                  "typegrad: scan: the layer's result dtype differs from the carried leaf's; the layer maps a carry "
                  "to the next carry.");
    static_assert(std::is_same_v<typename layer_node::shape_type, typename h::shape_type>,
                  "typegrad: scan: the layer's result shape differs from the carried leaf's; the layer maps a carry "
                  "to the next carry of the same shape.");
    static_assert(((std::is_same_v<typename S::leaf_expr::value_type, typename S::stack_expr::value_type>) && ...),
                  "typegrad: scan: a stacked param's dtype differs from its per-layer leaf's.");
    static_assert(((std::is_same_v<typename S::leaf_expr::value_type, typename h::value_type>) && ...),
                  "typegrad: scan: a per-layer param's dtype differs from the carry's; a scan runs in one dtype.");
    static_assert((stack_shape_fits<typename S::leaf_expr::shape_type, typename S::stack_expr::shape_type>() && ...),
                  "typegrad: scan: a stacked param's shape is not [L, the per-layer leaf's shape...]; stack the "
                  "layers' params along a new leading axis.");
    static_assert(static_layer_counts_agree<typename S::stack_expr...>(),
                  "typegrad: scan: the stacked params have different layer counts (leading extents); every "
                  "tg::stacked(...) leaf needs the same L.");
    static_assert(graph_uses_leaf<layer_node, typename h::node_type>::value,
                  "typegrad: scan: the layer does not read the carried leaf of tg::carry(leaf, initial).");
    static_assert((graph_uses_leaf<layer_node, typename S::leaf_expr::node_type>::value && ...),
                  "typegrad: scan: the layer does not read a leaf given to tg::stacked(leaf, stack).");
    static_assert(graph_leaves_within<layer_node, type_list<typename h::node_type, typename S::leaf_expr::node_type...>>::value,
                  "typegrad: scan: the layer reads a per-layer leaf with no stacked counterpart (neither the carry nor "
                  "a tg::stacked(leaf, stack) param); stack its values as [L, ...] and pass tg::stacked(leaf, stack).");
    return is_param_expr<h>() && (is_param_expr<typename S::leaf_expr>() && ...) &&
           distinct<typename h::node_type, typename S::leaf_expr::node_type...>() &&
           (sizeof...(S) <= 3 || (S::stack_expr::shape_type::is_static && ...)) &&
           std::is_same_v<typename h::value_type, typename x::value_type> &&
           carry_shape_fits<typename h::shape_type, typename x::shape_type>() &&
           std::is_same_v<typename layer_node::value_type, typename h::value_type> &&
           std::is_same_v<typename layer_node::shape_type, typename h::shape_type> &&
           ((std::is_same_v<typename S::leaf_expr::value_type, typename S::stack_expr::value_type>) && ...) &&
           ((std::is_same_v<typename S::leaf_expr::value_type, typename h::value_type>) && ...) &&
           (stack_shape_fits<typename S::leaf_expr::shape_type, typename S::stack_expr::shape_type>() && ...) &&
           static_layer_counts_agree<typename S::stack_expr...>() &&
           graph_uses_leaf<layer_node, typename h::node_type>::value &&
           (graph_uses_leaf<layer_node, typename S::leaf_expr::node_type>::value && ...) &&
           graph_leaves_within<layer_node, type_list<typename h::node_type, typename S::leaf_expr::node_type...>>::value;
}

}  // namespace detail

// scan<Policy>(layer, carry(h, initial), stacked(W, Ws), ...): the carry after L layers.
template <class Policy = scan_memory::carries, class Layer, class C, class... S>
constexpr auto scan(Layer, C, S...) {
    static_assert(is_expr_v<Layer>, "typegrad: scan(layer, carry, stacked...) takes the layer as a typegrad expression.");
    static_assert(detail::is_scan_policy_v<Policy>,
                  "typegrad: scan<Policy>: the policies are tg::scan_memory::layers and tg::scan_memory::carries.");
    static_assert(detail::is_carry_v<C>, "typegrad: scan(layer, carry, stacked...): the second argument is "
                                         "tg::carry(leaf, initial).");
    static_assert(sizeof...(S) >= 1, "typegrad: scan(layer, carry, stacked...) needs at least one "
                                     "tg::stacked(leaf, stack) param (the layer count L is its leading extent).");
    static_assert((detail::is_stacked_v<S> && ...), "typegrad: scan(layer, carry, stacked...): the arguments after "
                                                    "the carry are tg::stacked(leaf, stack).");
    if constexpr (detail::is_carry_v<C> && sizeof...(S) >= 1 && (detail::is_stacked_v<S> && ...) &&
                  detail::is_scan_policy_v<Policy> && is_expr_v<Layer>) {
        if constexpr (detail::check_scan<Layer, C, S...>()) {
            if constexpr (sizeof...(S) <= 3) {
                using op = detail::scan_op<Policy, dyn, Layer, typename C::leaf_expr, typename S::leaf_expr...>;
                return custom<op>(typename C::init_expr{}, typename S::stack_expr{}...);
            } else {
                constexpr std::size_t layers = detail::type_at_t<0, detail::type_list<S...>>::stack_expr::shape_type::extents[0];
                using op = detail::scan_op<Policy, layers, Layer, typename C::leaf_expr, typename S::leaf_expr...>;
                return custom<op>(typename C::init_expr{}, detail::scan_pack_all(typename S::stack_expr{}...));
            }
        } else {
            return typename C::init_expr{};
        }
    } else {
        return Layer{};
    }
}

}  // namespace typegrad
