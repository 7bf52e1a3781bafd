#pragma once
// The combines of reductions (sum, max, min, prod) in one place: the kind, its name, its identity
// (the host's reduce_identity) and its spelling in the CUDA prelude, which builds tg_identity and
// tg_combine from reduce_kinds (exec/cuda/prelude.hpp). The host's SIMD combine is the fused
// loop's (exec/cpu/kernel.hpp, reduce_combine).
#include <cstddef>
#include <limits>

namespace typegrad::detail {

// The order is part of the kernels' tables (a 2-bit field) and of the prelude's kernel names.
enum class reduce_kind { sum, max, min, prod };
inline constexpr std::size_t reduce_kind_count = 4;

struct reduce_kind_info {
    const char* name;
    const char* device_identity;  // CUDA, of type T
    const char* device_combine;   // CUDA, of a and b
};
inline constexpr reduce_kind_info reduce_kinds[reduce_kind_count] = {
    {"sum", "(T)0", "a + b"},
    {"max", "-tg_infinity<T>()", "tg_max(a, b)"},
    {"min", "tg_infinity<T>()", "tg_min(a, b)"},
    {"prod", "(T)1", "a * b"},
};

template <class T, reduce_kind K>
constexpr T reduce_identity() {
    if constexpr (K == reduce_kind::sum) return T(0);
    else if constexpr (K == reduce_kind::max) return -std::numeric_limits<T>::infinity();
    else if constexpr (K == reduce_kind::min) return std::numeric_limits<T>::infinity();
    else return T(1);
}

}  // namespace typegrad::detail
