#pragma once
// Bindings: caller buffers attached to leaves for one call, never copied.
//   tg::bind(x, range)            contiguous range (std::vector, std::span, std::array, C array)
//   tg::bind(x, range, {n, 3})    ... with the dynamic extents spelled out
//   tg::bind(x, pointer, {n, 3})  pointer + extents
//   tg::grad_into(W, range)       gradient destination, overwritten
//   tg::grad_into(W, range, tg::accumulate)   ... added to
//   tg::seed(range)               incoming gradient of a non-scalar output (backward)
#include <array>
#include <cstddef>
#include <iterator>
#include <ranges>
#include <string>
#include <type_traits>

#include <typegrad/core/error.hpp>
#include <typegrad/exec/device.hpp>
#include <typegrad/graph/node.hpp>

namespace typegrad {

// Tag for tg::grad_into(leaf, buffer, tg::accumulate): add to the buffer instead of overwriting.
struct accumulate_t {
    explicit constexpr accumulate_t() = default;
};
// Pass to tg::grad_into / tg::grads_into to add to the buffer instead of overwriting it.
inline constexpr accumulate_t accumulate{};

namespace detail {
struct retain_grad_op;
}
namespace detail {
// True for the node type of a tg::retain_grad(e) expression, whose gradient grad_into can request.
template <class N>
struct retained_node_trait : std::false_type {};
// retain_grad nodes are retained.
template <class X>
struct retained_node_trait<node<retain_grad_op, X>> : std::true_type {};
}  // namespace detail
template <class N>
concept retained_node_v = detail::retained_node_trait<N>::value;

namespace detail {

inline constexpr std::size_t unknown_size = static_cast<std::size_t>(-1);

// A call's bindings, one template each for host and device memory (Space): the call layer
// (exec/call.hpp) checks and attaches both alike; a device binding sends the call to the
// device backend (exec/device.hpp).
template <class Leaf, memory_space Space = memory_space::host>
struct leaf_binding {
    static constexpr memory_space space = Space;
    using leaf_type = Leaf;
    using value_type = typename Leaf::value_type;
    static constexpr std::size_t rank = Leaf::shape_type::rank;
    const value_type* data = nullptr;
    value_type* mutable_data = nullptr;  // set when bound from a writable host buffer (post hooks write)
    std::size_t size = unknown_size;  // elements available, when known
    std::array<std::size_t, rank> extents{};
    bool extents_given = false;
};

template <class Leaf, bool Accumulate, memory_space Space = memory_space::host>
struct grad_binding {
    static constexpr memory_space space = Space;
    using leaf_type = Leaf;
    using value_type = typename Leaf::value_type;
    static constexpr bool accumulate = Accumulate;
    value_type* data = nullptr;
    std::size_t size = unknown_size;
};

template <class T, memory_space Space = memory_space::host>
struct seed_binding {
    static constexpr memory_space space = Space;
    using value_type = T;
    const T* data = nullptr;
    std::size_t size = unknown_size;
};

// Binding kinds, in either memory space.
template <class T> inline constexpr bool is_leaf_binding_v = false;
template <class L, memory_space S> inline constexpr bool is_leaf_binding_v<leaf_binding<L, S>> = true;
template <class T> inline constexpr bool is_grad_binding_v = false;
template <class L, bool A, memory_space S> inline constexpr bool is_grad_binding_v<grad_binding<L, A, S>> = true;
// Whether an argument is a grad_into that adds to its buffer (tg::accumulate).
template <class T> struct accumulates : std::false_type {};
template <class L, bool A, memory_space S> struct accumulates<grad_binding<L, A, S>> : std::bool_constant<A> {};
template <class T> inline constexpr bool is_seed_binding_v = false;
template <class T, memory_space S> inline constexpr bool is_seed_binding_v<seed_binding<T, S>> = true;
// The memory space of an argument's buffer (host for arguments that are not bindings).
template <class T> inline constexpr memory_space binding_space_v = memory_space::host;
template <class L, memory_space S> inline constexpr memory_space binding_space_v<leaf_binding<L, S>> = S;
template <class L, bool A, memory_space S> inline constexpr memory_space binding_space_v<grad_binding<L, A, S>> = S;
template <class T, memory_space S> inline constexpr memory_space binding_space_v<seed_binding<T, S>> = S;
// The leaf a leaf or gradient binding names (void for other arguments).
template <class B> struct binding_leaf { using type = void; };
template <class L, memory_space S> struct binding_leaf<leaf_binding<L, S>> { using type = L; };
template <class L, bool A, memory_space S> struct binding_leaf<grad_binding<L, A, S>> { using type = L; };

template <class R>
using range_value_t = std::remove_cv_t<std::ranges::range_value_t<R>>;

// Checked in the body of each public function, and nothing is converted after a failed check:
// a helper function template would be instantiated only at the end of the translation unit, so
// the raw pointer conversion errors would come before the sentence.
template <class Leaf, class T>
inline constexpr bool element_type_ok_v = std::is_same_v<T, typename Leaf::value_type>;
#define TYPEGRAD_DETAIL_ELEMENT_TYPE_SENTENCE(fname)                                              \
    "typegrad: " fname " needs a buffer whose element type is the leaf's dtype (a float leaf "      \
    "binds float data, a double leaf double data); convert the data first, typegrad never "        \
    "converts silently"

// Extents from the buffer size when at most one is dynamic.
template <class Leaf>
std::array<std::size_t, Leaf::shape_type::rank> infer_extents(std::size_t size) {
    using S = typename Leaf::shape_type;
    std::array<std::size_t, S::rank> e{};
    for (std::size_t i = 0; i < S::rank; ++i) e[i] = S::extents[i];
    if constexpr (S::dyn_count == 1) {
        const std::size_t fixed = S::static_numel;
        if (fixed == 0 || size % fixed != 0)
            fail<shape_error>({"typegrad: bind(", Leaf::name(), ", buffer): ", size,
                               " elements cannot fill its static extents"});
        for (std::size_t i = 0; i < S::rank; ++i)
            if (S::extents[i] == dyn) e[i] = size / fixed;
    }
    return e;
}

}  // namespace detail

// tg::bind(leaf, range): binds a contiguous range (std::vector, std::span, std::array...) to a leaf,
// without copying; the data is row-major. The extents are the leaf's static ones, with at most
// one dynamic extent inferred from the range's length.
template <class E, std::ranges::contiguous_range R>
    requires std::ranges::sized_range<R>
auto bind(E, R&& range) {
    using Leaf = typename E::node_type;
    static_assert(is_leaf_v<Leaf>, "typegrad: bind(leaf, buffer) binds a leaf (tg::param or "
                                   "tg::input), not an expression.");
    constexpr bool ok = detail::element_type_ok_v<Leaf, detail::range_value_t<R>>;
    static_assert(ok, TYPEGRAD_DETAIL_ELEMENT_TYPE_SENTENCE("bind(leaf, buffer)"));
    static_assert(Leaf::shape_type::dyn_count <= 1,
                  "typegrad: bind(leaf, buffer) cannot infer two or more dynamic extents from a "
                  "buffer's size: pass them, bind(leaf, buffer, {n, m})");
    detail::leaf_binding<Leaf> b;
    if constexpr (!ok) return b;  // the sentence above is the error the user sees
    else {
    b.data = std::ranges::data(range);
    if constexpr (!std::is_const_v<std::remove_reference_t<std::ranges::range_reference_t<R>>>)
        b.mutable_data = std::ranges::data(range);
    b.size = std::ranges::size(range);
    b.extents = detail::infer_extents<Leaf>(b.size);
    return b;
    }
}

// tg::bind(leaf, range, {extents...}): binds a row-major range with explicit extents (every
// dynamic one given; static ones must agree).
template <class E, std::ranges::contiguous_range R>
    requires std::ranges::sized_range<R>
auto bind(E, R&& range,
          std::type_identity_t<std::array<std::size_t, E::node_type::shape_type::rank>> extents) {
    using Leaf = typename E::node_type;
    static_assert(is_leaf_v<Leaf>, "typegrad: bind(leaf, buffer, extents) binds a leaf (tg::param "
                                   "or tg::input), not an expression.");
    constexpr bool ok = detail::element_type_ok_v<Leaf, detail::range_value_t<R>>;
    static_assert(ok, TYPEGRAD_DETAIL_ELEMENT_TYPE_SENTENCE("bind(leaf, buffer, extents)"));
    detail::leaf_binding<Leaf> b;
    if constexpr (ok) {
        b.data = std::ranges::data(range);
        if constexpr (!std::is_const_v<std::remove_reference_t<std::ranges::range_reference_t<R>>>)
            b.mutable_data = std::ranges::data(range);
        b.size = std::ranges::size(range);
    }
    b.extents = extents;
    b.extents_given = true;
    return b;
}

// tg::bind(leaf, pointer, {extents...}): binds row-major memory at pointer with the given extents.
template <class E, class T>
auto bind(E, T* pointer,
          std::type_identity_t<std::array<std::size_t, E::node_type::shape_type::rank>> extents) {
    using Leaf = typename E::node_type;
    static_assert(is_leaf_v<Leaf>, "typegrad: bind(leaf, pointer, extents) binds a leaf (tg::param "
                                   "or tg::input), not an expression.");
    constexpr bool ok = detail::element_type_ok_v<Leaf, std::remove_cv_t<T>>;
    static_assert(ok, TYPEGRAD_DETAIL_ELEMENT_TYPE_SENTENCE("bind(leaf, pointer, extents)"));
    detail::leaf_binding<Leaf> b;
    if constexpr (ok) {
        b.data = pointer;
        if constexpr (!std::is_const_v<T>) b.mutable_data = pointer;
    }
    b.extents = extents;
    b.extents_given = true;
    return b;
}

// tg::grad_into(leaf, range): where the gradient of a wrt leaf is written (overwritten), one
// element per element of the leaf, row-major. Must not overlap any bound input.
template <class E, std::ranges::contiguous_range R>
    requires std::ranges::sized_range<R>
auto grad_into(E, R&& range) {
    using Leaf = typename E::node_type;
    static_assert(is_leaf_v<Leaf> || retained_node_v<Leaf>,
                  "typegrad: grad_into(leaf, buffer) names a leaf (a tg::param) or a tg::retain_grad(...) "
                  "expression.");
    static_assert(!std::is_const_v<std::remove_reference_t<std::ranges::range_reference_t<R>>>,
                  "typegrad: grad_into(leaf, buffer) needs a writable buffer.");
    constexpr bool ok = detail::element_type_ok_v<Leaf, detail::range_value_t<R>>;
    static_assert(ok, TYPEGRAD_DETAIL_ELEMENT_TYPE_SENTENCE("grad_into(leaf, buffer)"));
    if constexpr (!ok) return detail::grad_binding<Leaf, false>{};
    else return detail::grad_binding<Leaf, false>{std::ranges::data(range), std::ranges::size(range)};
}
// tg::grad_into(leaf, range, tg::accumulate): adds the gradient to the range's contents instead
// (PyTorch's .grad accumulation).
template <class E, std::ranges::contiguous_range R>
    requires std::ranges::sized_range<R>
auto grad_into(E e, R&& range, accumulate_t) {
    auto b = grad_into(e, std::forward<R>(range));
    return detail::grad_binding<typename E::node_type, true>{b.data, b.size};
}
// tg::grad_into(leaf, pointer, size): the gradient written to size elements at pointer.
template <class E, class T>
auto grad_into(E, T* pointer, std::size_t size) {
    using Leaf = typename E::node_type;
    constexpr bool ok = detail::element_type_ok_v<Leaf, std::remove_cv_t<T>>;
    static_assert(ok, TYPEGRAD_DETAIL_ELEMENT_TYPE_SENTENCE("grad_into(leaf, pointer, size)"));
    if constexpr (!ok) return detail::grad_binding<Leaf, false>{nullptr, size};
    else return detail::grad_binding<Leaf, false>{pointer, size};
}

// tg::seed(range): the incoming gradient of a non-scalar output for backward(), one element per
// output element, row-major (PyTorch: out.backward(gradient)); a scalar loss is seeded with 1.
template <std::ranges::contiguous_range R>
    requires std::ranges::sized_range<R>
auto seed(R&& range) {
    return detail::seed_binding<detail::range_value_t<R>>{std::ranges::data(range), std::ranges::size(range)};
}

}  // namespace typegrad
