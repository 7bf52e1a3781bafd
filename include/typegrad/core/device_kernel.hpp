#pragma once
// What a kernel op needs to carry its device implementation beside its CPU `run` (docs/cuda.md,
// "Kernel ops carry their device kernel"): element type codes for its `device_call`, and the
// parameter words its `device_words` fills. Plain host code: an op header includes it without the
// CUDA backend. A kernel op's node kernel, if it has one, is `device_source` (CUDA text defining
// its templates, emitted once per module) with `device_call<N>()` (the node's instantiation), or
// `device_definition<N>(fn)` (the node's own function, ops/custom.hpp). The op runs through one of:
//  - `device_words<N>(in, out, ext, words, flag)`: the node kernel's parameter words (returns the
//    elements the grid covers), one launch; optionally `device_check<N>` (ops/index.hpp);
//  - `device_run<N>(in, out, ext, dev)`, host code driving the backend, where `dev` offers
//    `gemm(...)` (a column-major strided-batched BLAS product: cuBLAS), `zero(p, bytes)`,
//    `dense_copy<S>(ref, into)` (a dense device copy of a strided operand), `scratch(bytes)` (temporary
//    device memory for this call) and `launch(words, threads)` of the node kernel (ops/matmul.hpp,
//    ops/conv.hpp: passes of its kernel around GEMMs, ops/custom.hpp).
// Any op may declare `check_device<N>()`, whose static_asserts say what its device path cannot do.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

#include <typegrad/core/dtype.hpp>
#include <typegrad/core/half.hpp>

namespace typegrad::detail {

// Element types by code, as tg_ty<K> of the CUDA prelude (exec/cuda/prelude.hpp): 0 f32, 1 f64,
// 2 bf16, 3 f16, 4 int32, 5 int64 (storage types).
template <class T>
constexpr int device_type_code() {
    using S = storage_t<T>;
    if constexpr (std::is_same_v<S, float>) return 0;
    else if constexpr (std::is_same_v<S, double>) return 1;
    else if constexpr (std::is_same_v<S, bf16>) return 2;
    else if constexpr (std::is_same_v<S, f16>) return 3;
    else if constexpr (std::is_same_v<S, std::int32_t>) return 4;
    else if constexpr (std::is_same_v<S, std::int64_t>) return 5;
    else static_assert(std::is_same_v<S, float>, "typegrad: internal: a kernel op's device element type is not a dtype or index type");
}

// The parameter words of a kernel op's node (the prelude's tg_node_args).
inline constexpr std::size_t device_node_words = 128;

// A strided operand as parameter words: address, rank, extents, strides (2 + 2 rank words from
// `at`; tg_ref_at reads them on the device). Returns the next free word.
template <class Ref>
inline std::size_t put_device_ref(std::uint64_t* w, std::size_t at, const Ref& r) {
    w[at] = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(r.data));
    w[at + 1] = r.rank;
    for (std::size_t a = 0; a < r.rank; ++a) {
        w[at + 2 + a] = r.ext[a];
        w[at + 2 + r.rank + a] = static_cast<std::uint64_t>(r.stride[a]);
    }
    return at + 2 + 2 * r.rank;
}
inline std::uint64_t device_word(const void* p) { return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p)); }
inline std::uint64_t device_word(double d) { return std::bit_cast<std::uint64_t>(d); }

// "name<a, b, ...>": the call of a kernel op's device template for one node.
inline std::string device_template_call(const char* name, std::initializer_list<int> args) {
    std::string s = name;
    s += '<';
    for (const int a : args) {
        if (s.back() != '<') s += ", ";
        s += std::to_string(a);
    }
    return s + '>';
}

// A device_run's temporaries as 256-byte aligned arrays in one region of the backend's
// scratch: their offsets first (take), then the region (dev.scratch(bytes), at).
struct scratch_carver {
    std::size_t bytes = 0;
    template <class S>
    std::size_t take(std::size_t count) {
        const std::size_t at = bytes;
        bytes += (count * sizeof(S) + 255) / 256 * 256;
        return at;
    }
    template <class S>
    static S* at(void* base, std::size_t offset) {
        return reinterpret_cast<S*>(static_cast<char*>(base) + offset);
    }
};
// A host copy from device memory, handed to a kernel op's device_check (exec/cuda/execute.hpp).
using device_copy = void (*)(void* dst, const void* src, std::size_t bytes);

// The device kernels of the scatter-add backwards accumulate in their output's type.
template <class T>
inline constexpr bool device_accumulates_v = std::is_same_v<T, float> || std::is_same_v<T, double>;

}  // namespace typegrad::detail
