#pragma once
// The graph as a type: leaves, compile-time constants, op nodes and the expr<> wrapper.
//
// Every node type carries a constexpr descriptor (`desc`: its operands' descriptors and a
// structural hash), formed bottom-up as the user's expression is written. Graph algorithms
// (graph/topo.hpp) walk descriptors as plain constexpr data, so no template is instantiated per
// node and per graph, and nothing recurses through the depth of a graph.
#include <array>
#include <bit>
#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <type_traits>
#include <utility>

#include <typegrad/core/dtype.hpp>
#include <typegrad/core/fixed_string.hpp>
#include <typegrad/core/shape.hpp>
#include <typegrad/graph/type_list.hpp>

namespace typegrad {

// What a leaf is: a param (requires grad, tg::param), an input (no grad, tg::input) or the seed
// leaf of a non-scalar backward (bound with tg::seed).
enum class leaf_role { param, input, seed };

namespace detail {
// What graph algorithms see of a node type: its operands and a hash of its structure (equal
// types have equal hashes; distinct types rarely do). Its address is the type's identity.
struct node_desc {
    std::size_t arity;
    std::uint64_t hash;
    const node_desc* child[max_arity]{};  // built-in: see node_info in exec/program.hpp
    bool alias = false;                   // an alias_op's node: its operand under another name
    unsigned char ref = 0;                // a node_ref's: 1 forward node `index`, 2 its adjoint
    std::size_t index = 0;
};
constexpr std::uint64_t hash_mix(std::uint64_t h, std::uint64_t v) {
    h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    return h * 0xFF51AFD7ED558CCDull;
}
constexpr std::uint64_t hash_text(std::uint64_t h, std::string_view s) {
    for (char c : s) h = hash_mix(h, static_cast<unsigned char>(c));
    return h;
}
// An op node's hash: its op's kind and name, then each operand's hash in order, so that sin(x)
// and cos(x), a * b and b * a, x * x and y * y differ (the search's and the id tables' probes
// stay short; an XOR of the operands' hashes gave those equal hashes and, in a 2000-op chain's
// backward, g++'s constant-evaluation limit was spent probing).
constexpr std::uint64_t hash_op(std::uint64_t kind, std::string_view name, std::initializer_list<std::uint64_t> children) {
    std::uint64_t h = hash_text(hash_mix(kind + 3, children.size()), name);
    for (std::uint64_t c : children) h = hash_mix(h, c);
    return h;
}
template <class Shape>
constexpr std::uint64_t hash_shape(std::uint64_t h) {
    h = hash_mix(h, Shape::rank);
    for (std::size_t a = 0; a < Shape::rank; ++a) h = hash_mix(h, Shape::extents[a]);
    return h;
}
}  // namespace detail
// elementwise: fused into loops; reduce: ends a loop; meta: a scalar computed from shapes;
// view: a zero-copy reinterpretation (strides) of a materialised value; kernel: its own routine
// (matmul, ...) reading and writing materialised buffers.
enum class op_kind { leaf, constant, elementwise, reduce, meta, view, kernel };

// An op whose node is its one operand under another name: the autocast markers, which only the
// autocast rewrite reads (autocast/rewrite.hpp). Every other graph algorithm sees through such a node
// (graph/topo.hpp, `unalias_t`), so a graph with markers is lowered as the graph without them,
// and no marker-free copy of the graph above a marker is ever built as types.
template <class Op>
concept alias_op = requires { requires Op::is_alias; };

// ---- the op protocol -------------------------------------------------------------------------
// What make_node requires of an op struct, one concept per member, so that code can ask and a
// missing member is named where the node is made (detail::op_protocol_checked, below make_node).
// The bases in ops/op_base.hpp supply the usual defaults: detail::elementwise_op,
// view_op_base<Derived>, kernel_op_base. Members that depend on the node (a view's
// layout<N>, a kernel's extents<N> and run<N>, an elementwise op's apply and vjp) are checked
// where the planner and the backends call them.
namespace detail {
template <template <class...> class>
struct rule_probe {};
}  // namespace detail
// `static constexpr op_kind kind`.
template <class Op>
concept op_declares_kind = requires {
    { Op::kind } -> std::convertible_to<op_kind>;
};
// `static constexpr const char* name`: the op in describe(), to_dot() and messages.
template <class Op>
concept op_declares_name = requires {
    { Op::name } -> std::convertible_to<const char*>;
};
// `static constexpr bool differentiable`.
template <class Op>
concept op_declares_differentiable = requires {
    { Op::differentiable } -> std::convertible_to<bool>;
};
// `static constexpr bool shape_only(std::size_t i)`: whether input i lends only its shape.
template <class Op>
concept op_declares_shape_only = requires(std::size_t i) {
    { Op::shape_only(i) } -> std::convertible_to<bool>;
};
// `template <class... Inputs> struct rule { using value_type = ...; using shape_type = ...; };`.
template <class Op>
concept op_declares_rule = requires { typename detail::rule_probe<Op::template rule>; };
// An elementwise op's `static constexpr unsigned cost`: instructions per element, which the
// planner's save-or-recompute rule reads.
template <class Op>
concept op_declares_cost = requires {
    { Op::cost } -> std::convertible_to<unsigned>;
};
// The whole protocol.
template <class Op>
concept op_struct = op_declares_kind<Op> && op_declares_name<Op> && op_declares_differentiable<Op> &&
                    op_declares_shape_only<Op> && op_declares_rule<Op> &&
                    (Op::kind != op_kind::elementwise || op_declares_cost<Op>);

// A leaf's name as a pack of characters. Graph types hold no class-type template argument
// (fixed_string, num): g++ 12 gives a type with one no canonical form, so comparing two graph
// types walks their whole structure, again at every use, which grew exponentially with depth.
template <char... Cs>
struct name_chars {
    // The name, NUL-terminated.
    static constexpr char text[sizeof...(Cs) + 1] = {Cs..., '\0'};
    // The name as a string_view.
    static constexpr std::string_view view() { return {text, sizeof...(Cs)}; }
};
namespace detail {
template <fixed_string S, class = std::make_index_sequence<S.size()>>
struct name_of;
template <fixed_string S, std::size_t... Is>
struct name_of<S, std::index_sequence<Is...>> {
    using type = name_chars<S.data[Is]...>;
};
}  // namespace detail
// The name_chars type of a fixed_string: name_of_t<"W"> is name_chars<'W'>.
template <fixed_string S>
using name_of_t = typename detail::name_of<S>::type;

// A leaf of the graph: a named, typed, shaped tensor bound at call time (Name is a name_chars).
// Users write tg::param<"W", float, tg::shape<4, 3>> or tg::input<...>, which are expr<leaf<...>>.
template <class Name, class T, class Shape, leaf_role Role>
struct leaf {
    static_assert(is_dtype_v<T> || (Role == leaf_role::input && is_index_type_v<T>),
                  "typegrad: a leaf's element type must be a floating dtype (float, double, tg::bf16, "
                  "tg::f16); an input may also hold std::int32_t or std::int64_t ids or class labels.");
    static_assert(detail::is_shape_v<Shape>,
                  "typegrad: a leaf's third template argument must be a tg::shape<...>.");
    static_assert(Shape::rank <= detail::max_rank, "typegrad: a leaf has more than 8 axes.");
    // The element type (float, double, bf16, f16; an input may hold std::int32_t or std::int64_t).
    using value_type = T;
    // The shape (tg::shape<...>, tg::dyn for run-time extents).
    using shape_type = Shape;
    // op_kind::leaf.
    static constexpr op_kind kind = op_kind::leaf;
    // param, input or seed.
    static constexpr leaf_role role = Role;
    // True for params.
    static constexpr bool requires_grad = Role == leaf_role::param;
    // Bound buffers are dense and row-major.
    static constexpr bool contiguous = true;
    // The leaf's name, e.g. "W".
    static constexpr std::string_view name() { return Name::view(); }
    // Identity and structure hash for the graph algorithms (not API).
    static constexpr detail::node_desc desc{
        0,
        detail::hash_shape<Shape>(detail::hash_text(detail::hash_mix(1, std::size_t(Role) * 16 + sizeof(T)), Name::view()))};
};

// A double held in a structural type, so that it can be a template argument on every
// compiler (clang 14 has no floating-point template parameters).
struct num {
    // The double's bit pattern.
    std::uint64_t bits;
    // From a double (also from float and the integer types below): tg::lit<2.5>, tg::lit<3>.
    constexpr num(double v) : bits(std::bit_cast<std::uint64_t>(v)) {}
    // From a float.
    constexpr num(float v) : num(static_cast<double>(v)) {}
    // From an int.
    constexpr num(int v) : num(static_cast<double>(v)) {}
    // From a long.
    constexpr num(long v) : num(static_cast<double>(v)) {}
    // From a long long.
    constexpr num(long long v) : num(static_cast<double>(v)) {}
    // The value.
    constexpr double value() const { return std::bit_cast<double>(bits); }
};

// A constant's type holds its value's bits (an integer: see name_chars).
template <std::uint64_t Bits>
struct constant {
    // weak_scalar: the constant takes the dtype of the tensor it meets.
    using value_type = weak_scalar;
    // A scalar.
    using shape_type = scalar_shape;
    // op_kind::constant.
    static constexpr op_kind kind = op_kind::constant;
    // Constants have no gradient.
    static constexpr bool requires_grad = false;
    // The value.
    static constexpr double value = std::bit_cast<double>(Bits);
    // Always true (a scalar).
    static constexpr bool contiguous = true;
    // Identity and structure hash for the graph algorithms (not API).
    static constexpr detail::node_desc desc{0, detail::hash_mix(2, Bits)};
};

namespace detail {
// A node's flags from its op and its operands' flags: functions of the op alone (a function of
// the operand types would be named with their subgraphs), and a base class keyed by the values
// holds them (so they are not variables of each node type).
template <class Op>
constexpr bool value_child_requires_grad(std::initializer_list<bool> child_requires_grad) {
    std::size_t i = 0;
    for (bool r : child_requires_grad) {
        if (r && !Op::shape_only(i)) return true;
        ++i;
    }
    return false;
}
template <class Op>
constexpr bool node_contiguous(std::initializer_list<bool> child_contiguous) {
    if constexpr (alias_op<Op>) return *child_contiguous.begin();
    if constexpr (Op::kind == op_kind::view) {
        if (!Op::keeps_contiguity) return false;
        for (bool c : child_contiguous)
            if (!c) return false;
    }
    return true;
}
template <op_kind Kind, bool RequiresGrad, bool Contiguous>
struct node_flags {
    static constexpr op_kind kind = Kind;
    static constexpr bool requires_grad = RequiresGrad;
    // Row-major and dense when materialised (views may permute or skip).
    static constexpr bool contiguous = Contiguous;
};
}  // namespace detail

// An op applied to child nodes: the graph is this type, node<Op, Children...> nested down to the
// leaves and constants (the node_type of decltype(loss)). Identical subexpressions are identical
// types.
template <class Op, class... Children>
struct node
    : detail::node_flags<Op::kind,
                         Op::differentiable && detail::value_child_requires_grad<Op>(
                                                   std::initializer_list<bool>{Children::requires_grad...}),
                         detail::node_contiguous<Op>(std::initializer_list<bool>{Children::contiguous...})> {
    // The op (detail::exp_op, ...), with its shape/dtype rule, kernel and VJP.
    using op = Op;
    // The operands, in order.
    using children = detail::type_list<Children...>;
    // The op's result rule for these operands (dtype and shape).
    using rule = typename Op::template rule<Children...>;
    // The result's dtype.
    using value_type = typename rule::value_type;
    // The result's shape.
    using shape_type = typename rule::shape_type;
    // Identity and structure hash for the graph algorithms (not API).
    static constexpr detail::node_desc desc{
        sizeof...(Children),
        detail::hash_shape<shape_type>(detail::hash_op(std::uint64_t(Op::kind), Op::name, {Children::desc.hash...})),
        {&Children::desc...},
        alias_op<Op>};
};

namespace detail {
// The node an alias node stands for (any other node: itself).
template <class N>
struct unalias {
    using type = N;
};
template <class Op, class X>
    requires alias_op<Op>
struct unalias<node<Op, X>> : unalias<X> {};
template <class N>
using unalias_t = typename unalias<N>::type;
}  // namespace detail

namespace detail {
// expr's requires_grad, in a base keyed by its value (not a variable named by the node type).
template <bool RequiresGrad>
struct grad_flag {
    static constexpr bool requires_grad = RequiresGrad;
};
}  // namespace detail
// Makes expr<Node>, the user-facing handle: a local class of this function, because of what
// compilers do with a class's template arguments, which for a graph type spell a tree whose
// shared subexpressions repeat once per path to them (doubling with every residual connection):
// - argument-dependent lookup (every operator and unqualified call on an expression) looks into
//   the template arguments of a class template specialization, and clang 14 walks them as that
//   tree (a 2-block transformer did not compile in 14 minutes); a local class is no
//   specialization, so lookup sees its namespace and base only;
// - clang names each class it lowers to LLVM IR with its qualified name, template arguments
//   printed in full; a local class prints as its function's name and its own.
template <class Node>
constexpr auto expr_handle() {
    struct expr : detail::grad_flag<Node::requires_grad> {
        // (maybe_unused: g++ takes a local class's member typedefs for unused local typedefs)
        using node_type [[maybe_unused]] = Node;
        using value_type [[maybe_unused]] = typename Node::value_type;
        using shape_type [[maybe_unused]] = typename Node::shape_type;
    };
    return expr{};
}
// The user-facing handle. Empty: the whole expression is its type, `node_type` (the graph: a
// node, leaf or constant type); `value_type` and `shape_type` are its dtype and shape;
// `requires_grad` is true when it depends on a param through differentiable ops. Functions take
// it as a constrained parameter (`tg::expression auto x`); `expr<N>` names it but does not
// deduce N.
template <class Node>
using expr = decltype(expr_handle<Node>());

// Kind tests. Concepts over class traits, not variable templates: g++ names (mangles) every
// variable it instantiates, and a node type's name spells its whole subgraph.
namespace detail {
// (A failed requires-expression would have clang format its message, spelling the type.)
template <class T, class = void>
struct is_expr_trait : std::false_type {};
template <class T>
struct is_expr_trait<T, std::void_t<typename T::node_type>>
    : std::bool_constant<__is_same(T, expr<typename T::node_type>)> {};
template <class T>
struct is_leaf_trait : std::false_type {};
template <class Name, class T, class S, leaf_role R>
struct is_leaf_trait<leaf<Name, T, S, R>> : std::true_type {};
template <class T>
struct is_constant_trait : std::false_type {};
template <std::uint64_t V>
struct is_constant_trait<constant<V>> : std::true_type {};
// True for typegrad expressions (expr<N>); `expression` is the concept the ops constrain on.
}  // namespace detail
template <class T>
concept is_expr_v = detail::is_expr_trait<T>::value;
// A typegrad expression (expr<N>, cv/ref ignored): what every op takes, e.g.
// `template <tg::expression E> auto my_block(E x)`. Doxygen does not warn about concepts, so
// this one is listed by hand.
template <class T>
concept expression = is_expr_v<std::remove_cvref_t<T>>;
// True for leaf types (the node_type of tg::param and tg::input).
template <class T>
concept is_leaf_v = detail::is_leaf_trait<T>::value;
// True for constant types (the node_type of tg::lit).
template <class T>
concept is_constant_v = detail::is_constant_trait<T>::value;

// A trainable leaf (requires grad, PyTorch's nn.Parameter): tg::param<"W", float, tg::shape<4, 3>>.
// Bound at call time with tg::bind or tg::params; its gradient goes to tg::grad_into or
// tg::grads_into. Buffers are row-major.
template <fixed_string Name, class T, class Shape = scalar_shape>
inline constexpr expr<leaf<name_of_t<Name>, T, Shape, leaf_role::param>> param{};
// A data leaf (no gradient): tg::input<"x", float, tg::shape<tg::dyn, 3>>; a dynamic extent takes
// its size from the bound buffer. Buffers are row-major.
template <fixed_string Name, class T, class Shape = scalar_shape>
inline constexpr expr<leaf<name_of_t<Name>, T, Shape, leaf_role::input>> input{};
// A compile-time constant; it takes the dtype of the tensor it meets (a "weak" scalar).
template <num V>
inline constexpr expr<constant<V.bits>> lit{};

namespace detail {
// What op rules read of an operand, without its subgraph: the base of the stand-ins that VJP
// rules are traced on (autodiff/reverse.hpp) and of the operand stubs kernels are keyed by
// (exec/execute.hpp).
template <class V, class Shape, op_kind Kind, bool RequiresGrad, bool Contiguous>
struct operand_metadata {
    using value_type = V;
    using shape_type = Shape;
    static constexpr op_kind kind = Kind;
    static constexpr bool requires_grad = RequiresGrad;
    static constexpr bool contiguous = Contiguous;
};
// A reference, in a backward graph, to node Index of the forward graph (Adjoint false) or to the
// adjoint of forward node Index (Adjoint true), keeping only what rules read of it. Backward
// nodes name their operands by these instead of by their graph types, so that no backward node's
// type spells the graph above or below it (its name, which g++ computes for each descriptor and
// function it instantiates, would be as long as the graph: O(N^2) characters for the graph).
// The graph algorithms resolve a reference through the tables of the reverse pass that made it
// (autodiff/reverse.hpp's reverse_pass; graph/topo.hpp). Buf is its target's buffer type
// (ops/op_base.hpp's buffer_t): a view of a bf16 reduction reads a float buffer, and the view
// knows that only through its operand.
template <class N>
struct buffer_type;
template <bool Adjoint, std::size_t Index, class V, class Shape, op_kind Kind, bool RequiresGrad, bool Contiguous,
          class Buf>
struct node_ref : operand_metadata<V, Shape, Kind, RequiresGrad, Contiguous> {
    static constexpr node_desc desc{0, hash_mix(Adjoint ? 0xAD7ull : 0xF07ull, Index), {}, false,
                                    static_cast<unsigned char>(Adjoint ? 2 : 1), Index};
};
template <bool Adjoint, std::size_t Index, class N>
using node_ref_to = node_ref<Adjoint, Index, typename N::value_type, typename N::shape_type, N::kind,
                             N::requires_grad, N::contiguous, typename buffer_type<N>::type>;
template <class T>
struct is_node_ref_trait : std::false_type {};
template <bool A, std::size_t I, class V, class S, op_kind K, bool R, bool C, class B>
struct is_node_ref_trait<node_ref<A, I, V, S, K, R, C, B>> : std::true_type {};
template <class T>
concept is_node_ref_v = is_node_ref_trait<T>::value;

// N, with its descriptor instantiated now. A descriptor's initializer reads its operands'
// descriptors, so one first needed at the root of a deep graph (a topological search) would
// instantiate the whole chain below it recursively: past about 900 levels (a 1000-op chain, or
// its backward) that exceeds the compilers' template depth. Forced where each node is made, every
// descriptor is instantiated when its operands' already are, one level deep.
template <class N, std::uint64_t = N::desc.hash>
struct desc_forced {
    using type = N;
};
template <class N>
using desc_forced_t = typename desc_forced<N>::type;
// The op protocol, checked before the node type is formed: the first member Op lacks, as a
// sentence (Op itself is in the compiler's note, "required from op_protocol_checked<Op>").
template <class Op>
constexpr bool elementwise_without_cost() {
    if constexpr (op_declares_kind<Op>) return Op::kind == op_kind::elementwise && !op_declares_cost<Op>;
    else return false;
}
template <class Op>
struct op_protocol_checked {
    static constexpr bool k = op_declares_kind<Op>, n = op_declares_name<Op>, d = op_declares_differentiable<Op>,
                          s = op_declares_shape_only<Op>, r = op_declares_rule<Op>;
    static_assert(k, "typegrad: an op struct (Op, in the note below) lacks `static constexpr op_kind kind`; "
                     "derive it from detail::elementwise_op, view_op_base<Op> or kernel_op_base (ops/op_base.hpp)");
    static_assert(!k || n, "typegrad: an op struct (Op, in the note below) lacks `static constexpr const char* "
                           "name`, the op's name in describe(), to_dot() and messages");
    static_assert(!(k && n) || d, "typegrad: an op struct (Op, in the note below) lacks `static constexpr bool "
                                  "differentiable`");
    static_assert(!(k && n && d) || s, "typegrad: an op struct (Op, in the note below) lacks `static constexpr bool "
                                       "shape_only(std::size_t i)`, whether input i lends only its shape");
    static_assert(!(k && n && d && s) || r,
                  "typegrad: an op struct (Op, in the note below) lacks its shape and dtype rule, `template <class... "
                  "Inputs> struct rule { using value_type = ...; using shape_type = ...; };`");
    static_assert(!(k && n && d && s && r) || !elementwise_without_cost<Op>(),
                  "typegrad: an elementwise op struct (Op, in the note below) lacks `static constexpr unsigned cost`, "
                  "its arithmetic instructions per element (the planner's save-or-recompute rule reads it)");
    static constexpr bool value = true;
};
template <class Op, bool = op_protocol_checked<Op>::value, class... Es>
constexpr expr<desc_forced_t<node<Op, typename Es::node_type...>>> make_node(Es...) {
    return {};
}
// The scalar value of a constant node (NaN for any other node, equal to nothing): a class keyed
// by the constant, not a function of the node type.
struct not_a_constant {
    static constexpr double value = __builtin_nan("");
};
template <class N>
struct constant_of : not_a_constant {};
template <std::uint64_t V>
struct constant_of<constant<V>> : constant<V> {};
}  // namespace detail

}  // namespace typegrad
