#pragma once
// Element types and promotion. Scalars written in expressions (tg::lit) are "weak", as Python
// scalars are in PyTorch: they take the dtype of the tensor they meet.
#include <concepts>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace typegrad {

// Marker dtype of compile-time constants.
struct weak_scalar {};

template <class T>
inline constexpr bool is_dtype_v = std::is_same_v<T, float> || std::is_same_v<T, double>;

// Integer inputs carry class labels (cross_entropy, one_hot); they never enter fused loops.
template <class T>
inline constexpr bool is_index_type_v = std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t>;

template <class T>
constexpr std::string_view dtype_name() {
    if constexpr (std::is_same_v<T, float>) return "f32";
    else if constexpr (std::is_same_v<T, double>) return "f64";
    else if constexpr (std::is_same_v<T, weak_scalar>) return "scalar";
    else if constexpr (std::is_same_v<T, std::int32_t>) return "i32";
    else if constexpr (std::is_same_v<T, std::int64_t>) return "i64";
    else return "?";
}

namespace detail {
template <class A, class B>
struct promote {
    static_assert(std::is_same_v<A, B>,
                  "typegrad: an elementwise op mixes float and double operands; convert the "
                  "inputs to one floating type (a float/double graph evaluates in one SIMD width)");
    using type = A;
};
template <class A> struct promote<A, weak_scalar> { using type = A; };
template <class B> struct promote<weak_scalar, B> { using type = B; };
template <> struct promote<weak_scalar, weak_scalar> { using type = weak_scalar; };
}  // namespace detail

template <class... Ts>
struct promote;
template <class T>
struct promote<T> { using type = T; };
template <class A, class B, class... Rest>
struct promote<A, B, Rest...> : promote<typename detail::promote<A, B>::type, Rest...> {};
template <class... Ts>
using promote_t = typename promote<Ts...>::type;

// The type a computation actually runs in (a graph of constants only evaluates in double).
template <class T>
using compute_t = std::conditional_t<std::is_same_v<T, weak_scalar>, double, T>;

}  // namespace typegrad
