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
//
// Composite ops (losses, softmax, ...) are built from primitive nodes; they mark their inputs
// with an autocast_entry node that carries the composite's class, so a region casts at the
// composite's entry as PyTorch does at the op's. Outside any region entries are removed too.
#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>

#include <typegrad/core/error.hpp>
#include <typegrad/graph/topo.hpp>
#include <typegrad/ops/cast.hpp>
#include <typegrad/ops/op_base.hpp>

namespace typegrad {

// ---- devices and specs ----------------------------------------------------------------------
// The CPU device tag of autocast specs (PyTorch: device_type="cpu"); default dtype bf16.
struct cpu {
    // device_kind::cpu.
    static constexpr device_kind kind = device_kind::cpu;
    // "cpu", as tg::describe shows it.
    static constexpr std::string_view name = "cpu";
    // The autocast dtype when the spec names none (PyTorch's CPU default).
    using default_dtype = bf16;
};
// tg::cuda is the CUDA backend's namespace (tg::cuda::tensor), so the device tag has its own name.
struct cuda_device {
    // device_kind::cuda.
    static constexpr device_kind kind = device_kind::cuda;
    // "cuda", as tg::describe shows it.
    static constexpr std::string_view name = "cuda";
    // The autocast dtype when the spec names none (PyTorch's CUDA default).
    using default_dtype = f16;
};

// True for the device tags tg::cpu and tg::cuda_device.
template <class D>
inline constexpr bool is_device_v = std::is_same_v<D, cpu> || std::is_same_v<D, cuda_device>;

namespace detail {
template <class D, bool = is_device_v<D>>
struct default_autocast_dtype {
    using type = float;  // only reached with an unknown device, which autocast_spec rejects
};
template <class D>
struct default_autocast_dtype<D, true> {
    using type = typename D::default_dtype;
};
}  // namespace detail

// An autocast context as a type, the C++ form of torch.autocast's arguments: device (tg::cpu or
// tg::cuda_device), dtype (default bf16 on the CPU, f16 on CUDA) and whether it is enabled.
template <class Device, class DType = typename detail::default_autocast_dtype<Device>::type, bool Enabled = true>
struct autocast_spec {
    static_assert(is_device_v<Device>,
                  "typegrad: autocast_spec<Device, ...> names an unknown device; the devices are tg::cpu and tg::cuda_device.");
    static_assert(is_reduced_precision_v<DType> || std::is_same_v<DType, float>,
                  "typegrad: autocast_spec<Device, DType> needs a floating autocast dtype: tg::bf16, tg::f16 "
                  "(or float, which casts nothing down).");
    // tg::cpu or tg::cuda_device.
    using device = Device;
    // The lower-precision dtype lower_precision ops run in.
    using dtype = DType;
    // False for a region that turns autocast off (torch.autocast(enabled=False)).
    static constexpr bool enabled = Enabled;
};

// The usual specs: CPU or CUDA autocast to bf16 or f16, and a disabled region.
using cpu_bf16 = autocast_spec<cpu, bf16>;
// CPU autocast to f16.
using cpu_f16 = autocast_spec<cpu, f16>;
// CUDA autocast to f16 (PyTorch's CUDA default).
using cuda_f16 = autocast_spec<cuda_device, f16>;
// CUDA autocast to bf16.
using cuda_bf16 = autocast_spec<cuda_device, bf16>;
// A region with autocast disabled on Device: tg::autocast<tg::autocast_disabled<tg::cpu>>(e).
template <class Device>
using autocast_disabled = autocast_spec<Device, typename detail::default_autocast_dtype<Device>::type, false>;

// "No autocast": the spec of a step compiled without a region, and of backward_autocast::off.
struct no_autocast {
    // Always false.
    static constexpr bool enabled = false;
};

// True for autocast_spec<...> and no_autocast.
template <class S>
inline constexpr bool is_autocast_spec_v = std::is_same_v<S, no_autocast>;
// Every autocast_spec is a spec.
template <class D, class T, bool E>
inline constexpr bool is_autocast_spec_v<autocast_spec<D, T, E>> = true;

namespace detail {

// An op declares its class with `static constexpr autocast_class autocast_on(device_kind)`;
// ops that declare nothing promote. A custom op declares `static constexpr autocast_class
// autocast` (see custom.hpp), forwarded by its node op.
template <class Op>
constexpr autocast_class autocast_class_of(device_kind d) {
    if constexpr (requires { Op::autocast_on(device_kind::cpu); }) return Op::autocast_on(d);
    else return autocast_class::promote;
}

// The identity ops that carry autocast information for the rewrite below. They are alias ops
// (graph/node.hpp): everything but the rewrite sees through them, so compile() lowers a graph
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
// Class per device, for a composite op's inputs.
template <autocast_class OnCpu, autocast_class OnCuda>
struct autocast_entry_op : elementwise_op {
    static constexpr unsigned cost = 0;  // an identity: no instruction to recompute
    static constexpr const char* name = "autocast_entry";
    static constexpr bool is_alias = true;
    static constexpr autocast_class class_on(device_kind d) { return d == device_kind::cpu ? OnCpu : OnCuda; }
    template <class V>
    static V apply(const V& x) { return x; }
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X) { return g; }
};

template <class Op>
inline constexpr bool is_autocast_marker_v = false;
template <class S>
inline constexpr bool is_autocast_marker_v<autocast_region_op<S>> = true;
template <autocast_class A, autocast_class B>
inline constexpr bool is_autocast_marker_v<autocast_entry_op<A, B>> = true;

template <class N>
inline constexpr bool is_region_node_v = false;
template <class S, class X>
inline constexpr bool is_region_node_v<node<autocast_region_op<S>, X>> = true;

// A composite op's input under its class (no node at all for labels and constants).
template <autocast_class OnCpu, autocast_class OnCuda, expression X>
constexpr auto autocast_entry(X x) {
    if constexpr (is_dtype_v<typename X::value_type>) return make_node<autocast_entry_op<OnCpu, OnCuda>>(x);
    else return x;
}

// The entries of composites in PyTorch's fp32 lists: everywhere (losses) or on CUDA only
// (log_sum_exp, softmax, log_softmax).
template <expression X>
constexpr auto fp32_entry(X x) { return autocast_entry<autocast_class::fp32, autocast_class::fp32>(x); }
template <expression X>
constexpr auto fp32_on_cuda_entry(X x) { return autocast_entry<autocast_class::promote, autocast_class::fp32>(x); }
// The entries of ops on PyTorch's lower-precision lists that are not one matmul node: matmul of
// two vectors (a fused sum of products) and linear's bias (PyTorch casts all of linear's inputs).
template <expression X>
constexpr auto lower_precision_entry(X x) {
    return autocast_entry<autocast_class::lower_precision, autocast_class::lower_precision>(x);
}

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

// ---- the ambient context at run time: autocast_guard ------------------------------------------
// A run-time image of a spec, for comparing the context a backward runs in with the one its
// step was compiled for.
struct autocast_state {
    // Whether autocast is on.
    bool enabled = false;
    // The device (meaningful when enabled).
    device_kind device = device_kind::cpu;
    // The autocast dtype's name ("bf16", "f16"; meaningful when enabled).
    std::string_view dtype{};
    // Equal when both are disabled, or both enabled with the same device and dtype.
    friend constexpr bool operator==(const autocast_state& a, const autocast_state& b) {
        return a.enabled == b.enabled && (!a.enabled || (a.device == b.device && a.dtype == b.dtype));
    }
};
// The run-time image of a spec.
template <class Spec>
constexpr autocast_state autocast_state_of() {
    if constexpr (!Spec::enabled) return {};
    else return {true, Spec::device::kind, dtype_name<typename Spec::dtype>()};
}
// "no autocast" or "device/dtype", as error messages and tg::describe show it.
inline std::string describe_autocast(const autocast_state& s) {
    if (!s.enabled) return "no autocast";
    return detail::message(s.device == device_kind::cpu ? "cpu" : "cuda", "/", s.dtype);
}

// The backward ran under a context that contradicts the one its step was compiled for.
struct autocast_mismatch : error {
    using error::error;
};

namespace detail {
struct guard_slot {
    bool active = false;
    autocast_state state{};
};
inline guard_slot& current_guard() {
    thread_local guard_slot slot;
    return slot;
}
}  // namespace detail

// Declares the autocast context of this thread (RAII; nests, restoring the outer one).
template <class Spec>
class autocast_guard {
public:
    static_assert(is_autocast_spec_v<Spec>, "typegrad: autocast_guard<Spec> takes a tg::autocast_spec<...>.");
    autocast_guard() : saved_(detail::current_guard()) { detail::current_guard() = {true, autocast_state_of<Spec>()}; }
    ~autocast_guard() { detail::current_guard() = saved_; }
    autocast_guard(const autocast_guard&) = delete;
    autocast_guard& operator=(const autocast_guard&) = delete;

private:
    detail::guard_slot saved_;
};

// compile<> policies for the backward's autocast context.
namespace backward_autocast {
// Every backward op runs under the ambient autocast of the step, as in PyTorch (the default).
struct same_as_forward {};
// No autocast in the backward: backward ops run in their inputs' dtypes.
struct off {};
// Every backward op runs under Spec, whatever the forward's autocast.
template <class Spec>
struct custom {
    static_assert(is_autocast_spec_v<Spec>,
                  "typegrad: backward_autocast::custom<Spec> takes a tg::autocast_spec<Device, DType>.");
    // The spec the backward ops run under.
    using spec = Spec;
};
}  // namespace backward_autocast

namespace on_autocast_mismatch {
// Default: backward under a tg::autocast_guard that contradicts the step's policy throws
// autocast_mismatch.
struct raise {};
// compile<tg::on_autocast_mismatch::ignore>: no check (as PyTorch, which cannot check).
struct ignore {};
}  // namespace on_autocast_mismatch

}  // namespace typegrad
