#pragma once
// Element types and promotion. Scalars written in expressions (tg::lit) are "weak", as Python
// scalars are in PyTorch: they take the dtype of the tensor they meet.
#include <concepts>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include <typegrad/core/half.hpp>

namespace typegrad {

// Marker dtype of compile-time constants.
struct weak_scalar {};

// Floating dtypes: f32, f64 and the 16-bit storage types bf16 and f16 (core/half.hpp), which
// compute in float and round once per op, as PyTorch's CPU kernels do.
template <class T>
inline constexpr bool is_dtype_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> || is_reduced_precision_v<T>;

// Integer inputs carry class labels (cross_entropy, one_hot); they never enter fused loops.
template <class T>
inline constexpr bool is_index_type_v = std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t>;

// The dtype's short name as describe() prints it: f64, f32, bf16, f16 (integer types too).
template <class T>
constexpr std::string_view dtype_name() {
    if constexpr (std::is_same_v<T, float>) return "f32";
    else if constexpr (std::is_same_v<T, double>) return "f64";
    else if constexpr (std::is_same_v<T, bf16>) return "bf16";
    else if constexpr (std::is_same_v<T, f16>) return "f16";
    else if constexpr (std::is_same_v<T, weak_scalar>) return "scalar";
    else if constexpr (std::is_same_v<T, std::int32_t>) return "i32";
    else if constexpr (std::is_same_v<T, std::int64_t>) return "i64";
    else return "?";
}

namespace detail {
// The float family (bf16, f16, f32) promotes to its widest member, as PyTorch does (bf16 with
// f16 gives f32). f64 mixes with nothing: a graph's loops run in one SIMD width, and a silent
// widening (or narrowing) of a double graph is never what its author meant.
template <class T>
inline constexpr int float_family_rank = std::is_same_v<T, float> ? 2 : is_reduced_precision_v<T> ? 1 : 0;

template <class A, class B>
struct promote {
    static_assert(std::is_same_v<A, B> || (float_family_rank<A> && float_family_rank<B>),
                  "typegrad: an elementwise op mixes double with float, bf16 or f16 operands; convert the "
                  "inputs to one floating type with tg::cast (a double graph evaluates in one SIMD width)");
    using type = std::conditional_t<
        std::is_same_v<A, B>, A,
        std::conditional_t<(float_family_rank<A> > float_family_rank<B>), A,
                           std::conditional_t<(float_family_rank<B> > float_family_rank<A>), B, float>>>;
};
template <class A> struct promote<A, weak_scalar> { using type = A; };
template <class B> struct promote<weak_scalar, B> { using type = B; };
template <> struct promote<weak_scalar, weak_scalar> { using type = weak_scalar; };
}  // namespace detail

// The dtype an elementwise op on operands of dtypes Ts... runs in (PyTorch's type promotion,
// torch.promote_types): within the float family (f32, bf16, f16) the widest wins and bf16 with
// f16 gives f32; a weak scalar (a tg::lit constant) takes the other operand's dtype. Mixing f64
// with another dtype is a `typegrad:` static_assert: convert with tg::cast. `promote<Ts...>::type`.
template <class... Ts>
struct promote;
// One dtype promotes to itself.
template <class T>
struct promote<T> {
    // T
    using type = T;
};
// Several dtypes promote pairwise, left to right.
template <class A, class B, class... Rest>
struct promote<A, B, Rest...> : promote<typename detail::promote<A, B>::type, Rest...> {};
// promote<Ts...>::type: the promoted dtype of Ts... .
template <class... Ts>
using promote_t = typename promote<Ts...>::type;

// The type a value is stored in (a graph of constants only evaluates in double).
template <class T>
using storage_t = std::conditional_t<std::is_same_v<T, weak_scalar>, double, T>;

// The type arithmetic on a value runs in: float for bf16 and f16, the storage type otherwise.
template <class T>
using compute_t = compute_type_t<storage_t<T>>;

}  // namespace typegrad
