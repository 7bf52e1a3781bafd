#pragma once
// What every op declares: its kind, whether it is differentiable, which children only lend
// their shape, and its shape/dtype rule. Elementwise ops broadcast like numpy and promote.
// An elementwise op also names its CUDA expression, `device`: {0}, {1}, ... are its value
// operands, T the loop's element type, tg_* the functions of the generated prelude
// (exec/cuda/prelude.hpp); the CUDA backend turns a plan into source from these strings.
#include <cstddef>
#include <string>
#include <type_traits>

#include <typegrad/core/device_kernel.hpp>
#include <typegrad/core/dtype.hpp>
#include <typegrad/core/shape.hpp>
#include <typegrad/graph/node.hpp>

namespace typegrad {
// Autocast (autocast/): the devices an autocast spec names, and the class an op belongs
// to there (PyTorch's autocast op lists). An op declares its class with
// `static constexpr autocast_class autocast_on(device_kind)`; without one it promotes.
enum class device_kind : unsigned char { cpu, cuda };
// What autocast does to an op's floating inputs (PyTorch's autocast op lists): lower_precision
// casts them to the spec's dtype (matmul, linear, conv), fp32 casts them up to f32 (losses, norms,
// and on CUDA exp, log, softmax, sum), promote runs in the widest input dtype (add, mul, where).
enum class autocast_class : unsigned char { lower_precision, fp32, promote };
}  // namespace typegrad

namespace typegrad::detail {

// What a view or kernel op sees of a materialised operand (its run(in, out, ext) and
// extents(in, ext) get one per input; the backends fill them).
struct tensor_ref {
    const void* data;
    const std::size_t* ext;
    const std::ptrdiff_t* stride;
    std::size_t rank;
};

// Kernels' helpers (the CUDA prelude's twins: tg_ref_offset, tg_numel, tg_cvt): the element at
// logical (row-major) position e of a strided operand, an operand's element count, and one
// element of buffer type B (value dtype V) as the output's storage type T.
template <class Ref>
inline std::ptrdiff_t strided_offset(const Ref& r, std::size_t e) {
    std::ptrdiff_t off = 0;
    for (std::size_t a = r.rank; a-- > 0;) {
        off += std::ptrdiff_t(e % r.ext[a]) * r.stride[a];
        e /= r.ext[a];
    }
    return off;
}
template <class Ref>
inline std::size_t numel_of(const Ref& r) {
    std::size_t n = 1;
    for (std::size_t a = 0; a < r.rank; ++a) n *= r.ext[a];
    return n;
}
// Dense row-major strides (extent-1 axes may have any stride): the operand can be read in place.
template <class Ref>
bool is_row_major(const Ref& r) {
    std::ptrdiff_t expect = 1;
    for (std::size_t a = r.rank; a-- > 0;) {
        if (r.ext[a] != 1 && r.stride[a] != expect) return false;
        expect *= std::ptrdiff_t(r.ext[a]);
    }
    return true;
}
template <class T, class V, class B>
inline T convert_element(B x) {
    if constexpr (std::is_same_v<T, B>) return x;
    else return T(static_cast<compute_t<V>>(static_cast<compute_t<B>>(x)));
}

constexpr autocast_class fp32_on_cuda(device_kind d) {
    return d == device_kind::cuda ? autocast_class::fp32 : autocast_class::promote;
}

struct elementwise_op {
    static constexpr op_kind kind = op_kind::elementwise;
    static constexpr bool differentiable = true;
    // Per element, in arithmetic instructions: the planner saves a value for later loops rather
    // than recompute it when its recomputed ops cost at least detail::save_cost (exec/program.hpp).
    static constexpr unsigned cost = 1;
    static constexpr bool shape_only(std::size_t) { return false; }
    template <class... Cs>
    struct rule {
        using value_type = promote_t<typename Cs::value_type...>;
        using shape_type = broadcast_t<typename Cs::shape_type...>;
    };
};

// The defaults of a kernel op, an op with a routine of its own: `extents<N>(in, ext)` and
// `run<N>(in, out, ext)` on the CPU, `device_source`, `device_call<N>()` and `device_words<N>(...)`
// on CUDA (core/device_kernel.hpp), beside its `name`, `rule` and `vjp`.
struct kernel_op_base {
    static constexpr op_kind kind = op_kind::kernel;
    static constexpr bool differentiable = true;
    static constexpr bool shape_only(std::size_t) { return false; }
};

// The rule of a part of a whole (a packed backward's part, a concat's gradient's part): the
// whole's dtype, and the shape of operand I among the rest (operands for their shapes only).
template <std::size_t I, class Whole, class... Xs>
struct part_rule {
    using value_type = typename Whole::value_type;
    using shape_type = typename type_at_t<I, type_list<Xs...>>::shape_type;
};

// Part I of a packed backward (a kernel op computing several inputs' gradients one after the
// other: a custom op's backward, the fused attention's): a dense view of input I's extents at its
// offset. Its children are (packed, inputs...), the inputs for their extents only. The deriving
// op gives `name` and a `vjp` (a packed backward is not differentiated again: it rejects grad of
// grad with its own sentence, which `differentiable` lets the reverse pass reach).
template <std::size_t I>
struct packed_part_view {
    static constexpr op_kind kind = op_kind::view;
    static constexpr bool differentiable = true;
    static constexpr bool keeps_contiguity = true;
    static constexpr bool shape_only(std::size_t i) { return i > 0; }
    template <class Packed, class... Xs>
    using rule = part_rule<I, Packed, Xs...>;
    template <class N, class Ref>
    static void layout(const Ref* in, std::size_t* ext, std::ptrdiff_t* stride, std::ptrdiff_t& offset) {
        offset = 0;
        for (std::size_t j = 0; j < I; ++j) offset += std::ptrdiff_t(numel_of(in[1 + j]));
        const Ref& r = in[1 + I];
        std::ptrdiff_t s = 1;
        for (std::size_t a = r.rank; a-- > 0;) {
            ext[a] = r.ext[a];
            stride[a] = s;
            s *= std::ptrdiff_t(r.ext[a]);
        }
    }
};

// Masks, detach: values flow forward, gradients do not.
struct nondifferentiable_elementwise_op : elementwise_op {
    static constexpr bool differentiable = false;
};

// The element type of a node's buffer: its dtype's storage type, except that a reduction with a
// bf16/f16 result accumulates in a float buffer (its readers round it once, on load) and a view
// shares its input's buffer (and an alias node is its operand).
template <class N>
struct buffer_type {
    using type = storage_t<typename N::value_type>;
};
template <class Op, class X>
    requires alias_op<Op>
struct buffer_type<node<Op, X>> : buffer_type<X> {};
// (Lazily: only a view reads its operand's, so that a deep chain of other ops does not recurse;
// graph/node.hpp's node_ref_to asks for the root's.)
template <class Op, class C0, class... Cs>
struct buffer_type<node<Op, C0, Cs...>> {
    using value = storage_t<typename node<Op, C0, Cs...>::value_type>;
    using type = typename std::conditional_t<
        Op::kind == op_kind::view, buffer_type<C0>,
        std::type_identity<std::conditional_t<Op::kind == op_kind::reduce && is_reduced_precision_v<value>, float, value>>>::type;
};
template <bool A, std::size_t I, class V, class S, op_kind K, bool R, bool C, class Buf>
struct buffer_type<node_ref<A, I, V, S, K, R, C, Buf>> {
    using type = Buf;  // its target's (graph/node.hpp)
};
template <class N>
using buffer_t = typename buffer_type<N>::type;

// The op protocol's members that take the node (graph/node.hpp checks the others at make_node,
// before the node type exists): a kernel op's run-time extents and CPU routine, a view's layout.
// The CPU executor checks them where it first calls them (exec/execute.hpp).
template <class N>
concept kernel_op_declares_extents = requires(const tensor_ref* in, std::size_t* ext) {
    N::op::template extents<N>(in, ext);
};
template <class N>
concept kernel_op_declares_run = requires(const tensor_ref* in, buffer_t<N>* out, const std::size_t* ext) {
    N::op::template run<N>(in, out, ext);
};
template <class N>
concept view_op_declares_layout = requires(const tensor_ref* in, std::size_t* ext, std::ptrdiff_t* stride,
                                           std::ptrdiff_t& offset) {
    N::op::template layout<N>(in, ext, stride, offset);
};

// The usual device_call of a kernel op (core/device_kernel.hpp): kernel<I, T, V, B>, I the element
// type of operand IdsAt (ids, a start, an rng), T the node's buffer type, V and B the value and
// buffer types of operand SrcAt (the values the kernel reads).
template <class N, std::size_t IdsAt, std::size_t SrcAt>
std::string device_call_of(const char* kernel) {
    using Src = type_at_t<SrcAt, typename N::children>;
    return device_template_call(kernel, {device_type_code<typename type_at_t<IdsAt, typename N::children>::value_type>(),
                                         device_type_code<buffer_t<N>>(), device_type_code<typename Src::value_type>(),
                                         device_type_code<buffer_t<Src>>()});
}

template <class A, class B>
inline constexpr bool same_shape_v = std::is_same_v<typename A::shape_type, typename B::shape_type>;

}  // namespace typegrad::detail

// Rejects plain numbers in graphs with a sentence that says what to write instead.
#define TYPEGRAD_DETAIL_NO_RUNTIME_NUMBER(fname)                                               \
    static_assert(::typegrad::detail::always_false<S>,                                         \
                  "typegrad: " fname " got a plain number; a number in a graph is part of its " \
                  "type, so write it as a compile-time constant, e.g. tg::lit<2.5>, or bind a "  \
                  "run-time value through a tg::input leaf")

// On failure GCC's note names both shapes, tg::dyn as dyn (detail::shapes_checked).
#define TYPEGRAD_DETAIL_CHECK_BROADCAST(fname, A, B)                                             \
    static_assert(::typegrad::detail::shapes_checked<                                            \
                      ::typegrad::detail::shape_text_v<typename A::shape_type,                   \
                          !::typegrad::detail::broadcastable_v<typename A::shape_type,           \
                                                               typename B::shape_type>>,         \
                      ::typegrad::detail::shape_text_v<typename B::shape_type,                   \
                          !::typegrad::detail::broadcastable_v<typename A::shape_type,           \
                                                               typename B::shape_type>>,         \
                      ::typegrad::detail::broadcastable_v<typename A::shape_type,                \
                                                          typename B::shape_type>>::ok,          \
                  "typegrad: " fname " needs broadcastable shapes: where both operands have a "   \
                  "static extent on an axis, the extents must be equal or one of them 1")

namespace typegrad::detail {
// Variadic: member templates over argument packs (tensor_view::transpose_(0, 1), set_()) use it
// with zero or several types, and must reach their sentence, not a template-arity error.
template <class...>
inline constexpr bool always_false = false;
}  // namespace typegrad::detail
