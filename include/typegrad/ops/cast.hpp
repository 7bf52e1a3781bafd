#pragma once
// cast<T>(x): float <-> double. A kernel boundary: loops run in one dtype, so the conversion
// reads one materialised buffer and writes another. Its gradient casts back.
#include <cstddef>

#include <typegrad/ops/arithmetic.hpp>

namespace typegrad {
namespace detail {

template <class To>
struct cast_op {
    static constexpr op_kind kind = op_kind::kernel;
    static constexpr const char* name = "cast";
    static constexpr bool differentiable = true;
    static constexpr bool shape_only(std::size_t) { return false; }
    template <class X>
    struct rule {
        using value_type = To;
        using shape_type = typename X::shape_type;
    };
    template <class N, class Ref>
    static void extents(const Ref* in, std::size_t* ext) {
        for (std::size_t a = 0; a < in[0].rank; ++a) ext[a] = in[0].ext[a];
    }
    template <class N, class Ref, class T>
    static void run(const Ref* in, T* out, const std::size_t* ext) {
        using From = compute_t<typename type_at_t<0, typename N::children>::value_type>;
        const auto* x = static_cast<const From*>(in[0].data);
        const std::size_t rank = in[0].rank;
        std::size_t n = 1;
        for (std::size_t a = 0; a < rank; ++a) n *= ext[a];
        for (std::size_t e = 0; e < n; ++e) {
            std::size_t r = e;
            std::ptrdiff_t off = 0;
            for (std::size_t a = rank; a-- > 0;) {
                off += std::ptrdiff_t(r % ext[a]) * in[0].stride[a];
                r /= ext[a];
            }
            out[e] = static_cast<T>(x[off]);
        }
    }
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X);
};

}  // namespace detail

template <class T, expression X>
constexpr auto cast(X x) {
    static_assert(is_dtype_v<T>, "typegrad: cast<T>(x) converts to float or double.");
    static_assert(is_dtype_v<typename X::value_type>,
                  "typegrad: cast<T>(x) converts a float or double expression (not labels or constants).");
    if constexpr (std::is_same_v<T, typename X::value_type>) return x;
    else return detail::make_node<detail::cast_op<T>>(x);
}

namespace detail {
template <class To>
template <std::size_t I, class G, class Out, class X>
constexpr auto cast_op<To>::vjp(G g, Out, X) {
    return cast<typename X::value_type>(g);
}
}  // namespace detail
}  // namespace typegrad
