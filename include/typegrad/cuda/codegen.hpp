#pragma once
// CUDA source from a plan. The planner's output (exec/program.hpp: loops over integer node ids)
// is turned into CUDA C++ text at run time, once per plan type, and compiled by NVRTC: no graph
// type (leaf names are class-type template arguments, which nvcc 13 cannot parse) ever reaches a
// CUDA compiler, and users build with g++ or clang.
//
// One loop of the plan becomes one kernel per group of its reductions that reduce the same
// iteration axes (most loops have one group). A kernel sees its iteration space as
// (o, k): o runs over the kept axes (the dense index of every reduction target of the group),
// k over the reduced axes. Two launch modes, chosen on the host from (O, K) alone, so a given
// shape always reduces in the same order (deterministic, no atomics):
//   serial: one thread per o, k in order (maps, and reductions of short rows);
//   split:  a block per (chunk of k, o); each thread strides the chunk, then a warp-shuffle and
//           shared-memory tree combines the block; with more than one chunk, a finish kernel
//           combines the per-chunk partials in chunk order.
// The elementwise body is straight-line code from each op's `device` expression; stores and
// materialisations are written in the same pass by the first group.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <typegrad/exec/execute.hpp>
#include <typegrad/ops/custom.hpp>
#include <typegrad/ops/hook.hpp>

namespace typegrad::cuda::detail {

namespace td = typegrad::detail;
using td::node_info;
using typegrad::op_kind;

inline constexpr unsigned block_size = 256;

// ---- the device expression of an elementwise node -----------------------------------------
template <class Op>
struct op_device_expr {
    static constexpr const char* value = nullptr;
};
template <class Op>
    requires requires { Op::device; }
struct op_device_expr<Op> {
    static constexpr const char* value = Op::device;
};
// An elementwise hook runs on the device when its function object names a device expression
// (`static constexpr const char* device = "{0} + (T)10";`).
template <class F>
struct op_device_expr<td::hook_apply_op<F>> {
    static constexpr const char* value = [] {
        if constexpr (requires { F::device; }) return static_cast<const char*>(F::device);
        else return static_cast<const char*>(nullptr);
    }();
};

// A custom op runs on the device when it gives CUDA statements for its forward and backward
// (`static constexpr const char* device_forward = "...";`, `device_backward`): the body of a
// kernel, see docs/cuda.md "Custom ops on the device".
template <class Op>
struct op_device_expr<td::custom_forward_op<Op>> {
    static constexpr const char* value = [] {
        if constexpr (requires { Op::device_forward; }) return static_cast<const char*>(Op::device_forward);
        else return static_cast<const char*>(nullptr);
    }();
};
template <class Op>
struct op_device_expr<td::custom_backward_op<Op>> {
    static constexpr const char* value = [] {
        if constexpr (requires { Op::device_backward; }) return static_cast<const char*>(Op::device_backward);
        else return static_cast<const char*>(nullptr);
    }();
};
inline bool is_custom_node(const node_info& n) {
    return n.kind == op_kind::kernel && (n.name == "custom" || n.name == "custom_backward");
}
inline std::string custom_kernel_name(std::size_t n) { return std::string("tg_custom_") + std::to_string(n); }

// Leaves and constants have no op.
template <class N>
struct node_op {
    using type = void;
};
template <class Op, class... Cs>
struct node_op<node<Op, Cs...>> {
    using type = Op;
};
template <>
struct op_device_expr<void> {
    static constexpr const char* value = nullptr;
};

// The value of every constant node (0 elsewhere).
template <class N>
constexpr double constant_value() {
    if constexpr (is_constant_v<N>) return N::value;
    else return 0.0;
}
template <class PP>
inline constexpr auto constant_values = [] {
    std::array<double, PP::M> r{};
    [&]<std::size_t... Ns>(std::index_sequence<Ns...>) {
        ((r[Ns] = constant_value<typename PP::program::template node_at<Ns>>()), ...);
    }(std::make_index_sequence<PP::M>{});
    return r;
}();

template <class PP>
inline constexpr auto device_exprs = [] {
    std::array<const char*, PP::M> r{};
    [&]<std::size_t... Ns>(std::index_sequence<Ns...>) {
        ((r[Ns] = op_device_expr<typename node_op<typename PP::program::template node_at<Ns>>::type>::value), ...);
    }(std::make_index_sequence<PP::M>{});
    return r;
}();
// A kernel op with a device implementation carries it beside its CPU `run` (ops/index.hpp is
// one): `device_source`, CUDA text defining its kernel templates (emitted once per module), and
// `device_call<N>()`, the call of the node's instantiation on the parameter words `p`.
template <class N>
struct node_kernel_source {
    static constexpr const char* value = nullptr;
    static std::string call() { return {}; }
};
template <class N>
    requires requires { N::op::device_source; }
struct node_kernel_source<N> {
    static constexpr const char* value = N::op::device_source;
    static std::string call() { return N::op::template device_call<N>(); }
};
template <class PP>
inline constexpr auto kernel_sources = [] {
    std::array<const char*, PP::M> r{};
    [&]<std::size_t... Ns>(std::index_sequence<Ns...>) {
        ((r[Ns] = node_kernel_source<typename PP::program::template node_at<Ns>>::value), ...);
    }(std::make_index_sequence<PP::M>{});
    return r;
}();
template <class PP>
const std::string* kernel_calls() {
    static const auto r = [] {
        std::array<std::string, PP::M> c;
        [&]<std::size_t... Ns>(std::index_sequence<Ns...>) {
            ((c[Ns] = node_kernel_source<typename PP::program::template node_at<Ns>>::call()), ...);
        }(std::make_index_sequence<PP::M>{});
        return c;
    }();
    return r.data();
}
inline std::string node_kernel_name(std::size_t n) { return std::string("tg_node_") + std::to_string(n); }

// A plan as plain data, so that the generator (and the launcher) are ordinary functions compiled
// once, not once per plan type.
struct plan_view {
    std::size_t node_count = 0;
    const node_info* info = nullptr;
    const td::loop_plan* loops = nullptr;
    std::size_t loop_count = 0;
    const std::size_t* members = nullptr;
    const std::size_t* stores = nullptr;
    const char* const* device = nullptr;
    const double* constants = nullptr;
    const char* const* kernel_source = nullptr;  // a kernel op's device_source, or null
    const std::string* kernel_call = nullptr;
};
template <class PP>
plan_view view_of() {
    return {PP::M,
            PP::program::info.data(),
            PP::plan.loops.data(),
            PP::plan.loop_count,
            PP::plan.members.data(),
            PP::stores.data(),
            device_exprs<PP>.data(),
            constant_values<PP>.data(),
            kernel_sources<PP>.data(),
            kernel_calls<PP>()};
}

// ---- loop groups and the layout of their parameter words -----------------------------------
struct group_desc {
    std::size_t loop = 0;
    std::uint32_t mask = 0;            // bit a: iteration axis a is reduced
    std::vector<std::size_t> reds;     // reduction node ids
    bool outputs = false;              // writes the loop's materialisations and stores
};

inline bool output_broadcast_axis(const plan_view& pv, std::size_t node, std::size_t iter, std::size_t axis) {
    const node_info& p = pv.info[node];
    const node_info& f = pv.info[iter];
    const std::size_t lead = f.rank - p.rank;
    if (axis < lead) return true;
    return p.ext[axis - lead] == 1 && f.ext[axis] != 1;
}

inline std::vector<group_desc> loop_groups(const plan_view& pv, std::size_t L) {
    const td::loop_plan& lp = pv.loops[L];
    const std::size_t rank = pv.info[lp.iter].rank;
    std::vector<group_desc> groups;
    for (std::size_t m = lp.red_begin; m < lp.red_end; ++m) {
        const std::size_t r = pv.members[m];
        std::uint32_t mask = 0;
        for (std::size_t a = 0; a < rank; ++a)
            if (output_broadcast_axis(pv, r, lp.iter, a)) mask |= 1u << a;
        bool placed = false;
        for (auto& g : groups)
            if (g.mask == mask) {
                g.reds.push_back(r);
                placed = true;
            }
        if (!placed) groups.push_back({L, mask, {r}, false});
    }
    if (groups.empty()) groups.push_back({L, 0, {}, false});
    groups.front().outputs = true;
    return groups;
}

// Operands of a group kernel, in parameter order: the loop's inputs, the group's reductions,
// then (first group) the materialisations and stores. For stores, `store_index` is set.
enum class operand_role { input, reduction, materialisation, store };
struct operand_desc {
    std::size_t node;
    operand_role role;
    std::size_t store_index = 0;
};

inline std::vector<operand_desc> group_operands(const plan_view& pv, const group_desc& g) {
    const td::loop_plan& lp = pv.loops[g.loop];
    std::vector<operand_desc> ops;
    for (std::size_t m = lp.in_begin; m < lp.in_end; ++m) ops.push_back({pv.members[m], operand_role::input});
    for (std::size_t r : g.reds) ops.push_back({r, operand_role::reduction});
    if (g.outputs) {
        for (std::size_t m = lp.mat_begin; m < lp.mat_end; ++m) ops.push_back({pv.members[m], operand_role::materialisation});
        for (std::size_t m = lp.store_begin; m < lp.store_end; ++m)
            ops.push_back({pv.stores[pv.members[m]], operand_role::store, pv.members[m]});
    }
    return ops;
}

// Word indices: 0 O, 1 K, 2 G (chunks), 3 CH (chunk length), 4 mode; 5.. iteration extents;
// then per operand its address (or, for a meta, its value as double bits) and one stride per
// iteration axis; then one accumulate flag per store; then one partials address per reduction.
struct word_layout {
    std::size_t rank = 0;
    std::size_t n_ops = 0;
    std::size_t n_stores = 0;
    std::size_t n_reds = 0;
    static constexpr std::size_t ext_begin = 5;
    std::size_t operand(std::size_t o) const { return ext_begin + rank + o * (1 + rank); }
    std::size_t stride(std::size_t o, std::size_t a) const { return operand(o) + 1 + a; }
    std::size_t flag(std::size_t s) const { return operand(n_ops) + s; }
    std::size_t partial(std::size_t r) const { return flag(n_stores) + r; }
    std::size_t words() const { return partial(n_reds); }
};

inline word_layout layout_of(const plan_view& pv, const group_desc& g, const std::vector<operand_desc>& ops) {
    word_layout w;
    w.rank = pv.info[pv.loops[g.loop].iter].rank;
    w.n_ops = ops.size();
    for (const auto& o : ops) w.n_stores += o.role == operand_role::store;
    w.n_reds = g.reds.size();
    return w;
}

inline std::string kernel_name(std::size_t loop, std::size_t group) {
    return std::string("tg_loop_") + std::to_string(loop) + std::string("_") + std::to_string(group);
}

// ---- text helpers ----------------------------------------------------------------------------
inline std::string literal(double v) {
    // hexadecimal floating point: exact
    char buf[64];
    std::snprintf(buf, sizeof buf, "%a", v);
    std::string s = buf;
    if (s == "inf") return "(1.0/0.0)";
    if (s == "-inf") return "(-1.0/0.0)";
    if (s == "nan" || s == "-nan") return "(0.0/0.0)";
    return s;
}

inline std::string substitute(std::string_view pattern, const std::vector<std::string>& args) {
    std::string out;
    for (std::size_t i = 0; i < pattern.size(); ++i) {
        if (pattern[i] == '{' && i + 2 < pattern.size() && pattern[i + 2] == '}' && pattern[i + 1] >= '0' &&
            pattern[i + 1] <= '9') {
            const std::size_t k = std::size_t(pattern[i + 1] - '0');
            out += k < args.size() ? args[k] : std::string("/*missing operand*/");
            i += 2;
        } else {
            out += pattern[i];
        }
    }
    return out;
}

template <class T>
constexpr const char* type_name() {
    if constexpr (std::is_same_v<T, float>) return "float";
    else if constexpr (std::is_same_v<T, double>) return "double";
    else if constexpr (std::is_same_v<T, std::int32_t>) return "int";
    else return "long long";
}

// ---- the prelude: math, reductions and the plan-independent kernels ------------------------
inline const char* prelude() {
    return R"CUDA(// generated by typegrad (cuda/codegen.hpp)
typedef unsigned long long tg_u64;
typedef long long tg_i64;
#define TG_BLOCK 256
#define TG_UNROLL_SPLIT 4  // elements per thread and iteration of a split reduction
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define TG_UNROLL _Pragma("unroll")
#else
#define TG_UNROLL
#endif

__device__ __forceinline__ float tg_exp(float x) { return expf(x); }
__device__ __forceinline__ double tg_exp(double x) { return exp(x); }
__device__ __forceinline__ float tg_log(float x) { return logf(x); }
__device__ __forceinline__ double tg_log(double x) { return log(x); }
__device__ __forceinline__ float tg_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double tg_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float tg_pow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double tg_pow(double x, double y) { return pow(x, y); }
__device__ __forceinline__ float tg_sin(float x) { return sinf(x); }
__device__ __forceinline__ double tg_sin(double x) { return sin(x); }
__device__ __forceinline__ float tg_cos(float x) { return cosf(x); }
__device__ __forceinline__ double tg_cos(double x) { return cos(x); }
__device__ __forceinline__ float tg_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double tg_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float tg_abs(float x) { return fabsf(x); }
__device__ __forceinline__ double tg_abs(double x) { return fabs(x); }
template <class T> __device__ __forceinline__ T tg_sigmoid(T x) { return (T)1 / ((T)1 + tg_exp(-x)); }
// NaN-propagating, as torch.maximum / torch.minimum (and the CPU kernels).
template <class T> __device__ __forceinline__ T tg_max(T a, T b) { return a != a ? a : (b != b ? b : (a < b ? b : a)); }
template <class T> __device__ __forceinline__ T tg_min(T a, T b) { return a != a ? a : (b != b ? b : (b < a ? b : a)); }
template <class T> __device__ __forceinline__ T tg_gt(T a, T b) { return a > b ? (T)1 : (T)0; }
template <class T> __device__ __forceinline__ T tg_ge(T a, T b) { return a >= b ? (T)1 : (T)0; }
template <class T> __device__ __forceinline__ T tg_lt(T a, T b) { return a < b ? (T)1 : (T)0; }
template <class T> __device__ __forceinline__ T tg_le(T a, T b) { return a <= b ? (T)1 : (T)0; }
template <class T> __device__ __forceinline__ T tg_eq(T a, T b) { return a == b ? (T)1 : (T)0; }
template <class T> __device__ __forceinline__ bool tg_isfinite(T x) { return x - x == (T)0; }
__device__ __forceinline__ double tg_double_bits(tg_u64 w) { return __longlong_as_double((tg_i64)w); }

// bf16 and f16 are buffers of 16-bit patterns; values are floats. Conversions round to nearest
// even, bit for bit the CPU's (core/half.hpp), in integer arithmetic so emulation computes the
// same bits.
__device__ __forceinline__ float tg_from_bf16(unsigned short b) { return __uint_as_float((unsigned)b << 16); }
__device__ __forceinline__ unsigned short tg_to_bf16(float f) {
    const unsigned x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40u);  // a quiet NaN
    return (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ float tg_from_f16(unsigned short h) {
    const unsigned sign = ((unsigned)h & 0x8000u) << 16, e = ((unsigned)h >> 10) & 0x1fu, m = (unsigned)h & 0x3ffu;
    if (e == 0x1fu) return __uint_as_float(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        const float x = (float)m * 5.9604644775390625e-8f;  // m * 2^-24, exact
        return sign ? -x : x;
    }
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}
__device__ __forceinline__ unsigned short tg_to_f16(float f) {
    const unsigned x = __float_as_uint(f);
    const unsigned sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (unsigned short)(sign | (ax > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (ax >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);  // 65520 and above round to inf
    const unsigned e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
    if (e >= 113u) {  // a normal half
        unsigned h = ((e - 112u) << 10) | ((ax & 0x7fffffu) >> 13);
        const unsigned r = ax & 0x1fffu;
        if (r > 0x1000u || (r == 0x1000u && (h & 1u))) ++h;
        return (unsigned short)(sign | h);
    }
    if (e < 102u) return (unsigned short)sign;  // below half the smallest subnormal
    const unsigned shift = 126u - e;  // 14..24: units of 2^-24
    unsigned q = m >> shift;
    const unsigned r = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (r > half || (r == half && (q & 1u))) ++q;
    return (unsigned short)(sign | q);
}
__device__ __forceinline__ float tg_round_bf16(float x) { return tg_from_bf16(tg_to_bf16(x)); }
__device__ __forceinline__ float tg_round_f16(float x) { return tg_from_f16(tg_to_f16(x)); }

// Element types of kernel ops by code (exec/program.hpp, device_type_code): storage S, value C,
// and the conversions; tg_cvt<To, V, From> is the CPU's convert_element (ops/index.hpp): From's
// value, as V's compute type, stored as To.
template <int K> struct tg_ty;
template <> struct tg_ty<0> { typedef float S; typedef float C;
    static __device__ __forceinline__ C from(S x) { return x; } static __device__ __forceinline__ S to(C x) { return x; } };
template <> struct tg_ty<1> { typedef double S; typedef double C;
    static __device__ __forceinline__ C from(S x) { return x; } static __device__ __forceinline__ S to(C x) { return x; } };
template <> struct tg_ty<2> { typedef unsigned short S; typedef float C;
    static __device__ __forceinline__ C from(S x) { return tg_from_bf16(x); } static __device__ __forceinline__ S to(C x) { return tg_to_bf16(x); } };
template <> struct tg_ty<3> { typedef unsigned short S; typedef float C;
    static __device__ __forceinline__ C from(S x) { return tg_from_f16(x); } static __device__ __forceinline__ S to(C x) { return tg_to_f16(x); } };
template <> struct tg_ty<4> { typedef int S; typedef tg_i64 C;
    static __device__ __forceinline__ C from(S x) { return x; } static __device__ __forceinline__ S to(C x) { return (S)x; } };
template <> struct tg_ty<5> { typedef tg_i64 S; typedef tg_i64 C;
    static __device__ __forceinline__ C from(S x) { return x; } static __device__ __forceinline__ S to(C x) { return x; } };
template <int To, int V, int From> __device__ __forceinline__ typename tg_ty<To>::S tg_cvt(typename tg_ty<From>::S x) {
    if (To == From) return (typename tg_ty<To>::S)x;
    return tg_ty<To>::to((typename tg_ty<To>::C)(typename tg_ty<V>::C)tg_ty<From>::from(x));
}
// The offset of logical (row-major) element e of a strided operand.
__device__ __forceinline__ tg_i64 tg_offset(tg_i64 e, int rank, const tg_u64* ext, const tg_u64* stride) {
    tg_i64 off = 0;
    for (int a = rank - 1; a >= 0; --a) {
        off += (e % (tg_i64)ext[a]) * (tg_i64)stride[a];
        e /= (tg_i64)ext[a];
    }
    return off;
}
// Parameter words of a kernel op's node (cuda/execute.hpp fills them with the op's device_words).
struct tg_node_args { tg_u64 w[128]; };
// A strided operand in the words (exec/program.hpp, put_device_ref): address, rank, extents, strides.
struct tg_ref { const void* p; int rank; const tg_u64* ext; const tg_u64* stride; };
__device__ __forceinline__ tg_ref tg_ref_at(const tg_node_args& a, int at) {
    tg_ref r;
    r.p = (const void*)a.w[at];
    r.rank = (int)a.w[at + 1];
    r.ext = a.w + at + 2;
    r.stride = a.w + at + 2 + r.rank;
    return r;
}
__device__ __forceinline__ tg_i64 tg_ref_offset(const tg_ref& r, tg_i64 e) { return tg_offset(e, r.rank, r.ext, r.stride); }
__device__ __forceinline__ tg_i64 tg_numel(const tg_ref& r) {
    tg_i64 n = 1;
    for (int a = 0; a < r.rank; ++a) n *= (tg_i64)r.ext[a];
    return n;
}
// An id of an index op's ids operand (int32 or int64, code 4 or 5)
template <int K> __device__ __forceinline__ tg_i64 tg_id(const tg_ref& r, tg_i64 e) {
    return (tg_i64)((const typename tg_ty<K>::S*)r.p)[tg_ref_offset(r, e)];
}
// The first bad position of an index op (its host side reads it and throws, cuda/execute.hpp).
__device__ __forceinline__ void tg_report(tg_u64 flag, tg_i64 position) {
    atomicMin((unsigned long long*)flag, (unsigned long long)position);
}
#define TG_GRID_LOOP(e, n) for (tg_i64 e = blockIdx.x * (tg_i64)blockDim.x + threadIdx.x; e < (tg_i64)(n); e += (tg_i64)gridDim.x * blockDim.x)

template <class T> __device__ __forceinline__ T tg_infinity();
template <> __device__ __forceinline__ float tg_infinity<float>() { return __int_as_float(0x7f800000); }
template <> __device__ __forceinline__ double tg_infinity<double>() { return __longlong_as_double(0x7ff0000000000000LL); }

// Reduction combines (0 sum, 1 max, 2 min, 3 prod: detail::reduce_kind) and their identities.
template <int C, class T> __device__ __forceinline__ T tg_identity() {
    return C == 0 ? (T)0 : C == 1 ? -tg_infinity<T>() : C == 2 ? tg_infinity<T>() : (T)1;
}
template <int C, class T> __device__ __forceinline__ T tg_combine(T a, T b) {
    return C == 0 ? a + b : C == 1 ? tg_max(a, b) : C == 2 ? tg_min(a, b) : a * b;
}
// A block-wide combine in a fixed order (warp shuffles, then one value per warp through shared
// memory); the result is valid in thread 0. Every thread of the block must call it.
template <int C, class T> __device__ __forceinline__ T tg_block_reduce(T v) {
    if (blockDim.x == 1) return v;  // host emulation (one thread per block)
    __shared__ T partial[32];
    for (int off = 16; off > 0; off >>= 1) v = tg_combine<C>(v, __shfl_down_sync(0xffffffffu, v, off));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    const int warps = (blockDim.x + 31) >> 5;
    v = lane < warps ? partial[lane] : tg_identity<C, T>();
    if (warp == 0)
        for (int off = 16; off > 0; off >>= 1) v = tg_combine<C>(v, __shfl_down_sync(0xffffffffu, v, off));
    return v;
}

// Partials of a split reduction, [O][G], combined in chunk order: one block per output.
struct tg_finish_args { tg_u64 w[4]; };  // partials, out, O, G
template <int C, class T> __device__ void tg_finish(const tg_finish_args& p) {
    const T* partials = (const T*)p.w[0];
    T* out = (T*)p.w[1];
    const tg_i64 O = (tg_i64)p.w[2], G = (tg_i64)p.w[3];
    for (tg_i64 o = blockIdx.x; o < O; o += gridDim.x) {
        T acc = tg_identity<C, T>();
        for (tg_i64 g = threadIdx.x; g < G; g += blockDim.x) acc = tg_combine<C>(acc, partials[o * G + g]);
        acc = tg_block_reduce<C>(acc);
        if (threadIdx.x == 0) out[o] = acc;
    }
}
extern "C" __global__ void __launch_bounds__(TG_BLOCK) tg_finish_sum_f32(const tg_finish_args p) { tg_finish<0, float>(p); }
#ifdef TG_EMULATION
extern "C" void tg_finish_sum_f32_host(const void* w) { tg_finish_sum_f32(*(const tg_finish_args*)w); }
#endif
extern "C" __global__ void __launch_bounds__(TG_BLOCK) tg_finish_max_f32(const tg_finish_args p) { tg_finish<1, float>(p); }
#ifdef TG_EMULATION
extern "C" void tg_finish_max_f32_host(const void* w) { tg_finish_max_f32(*(const tg_finish_args*)w); }
#endif
extern "C" __global__ void __launch_bounds__(TG_BLOCK) tg_finish_min_f32(const tg_finish_args p) { tg_finish<2, float>(p); }
#ifdef TG_EMULATION
extern "C" void tg_finish_min_f32_host(const void* w) { tg_finish_min_f32(*(const tg_finish_args*)w); }
#endif
extern "C" __global__ void __launch_bounds__(TG_BLOCK) tg_finish_prod_f32(const tg_finish_args p) { tg_finish<3, float>(p); }
#ifdef TG_EMULATION
extern "C" void tg_finish_prod_f32_host(const void* w) { tg_finish_prod_f32(*(const tg_finish_args*)w); }
#endif
extern "C" __global__ void __launch_bounds__(TG_BLOCK) tg_finish_sum_f64(const tg_finish_args p) { tg_finish<0, double>(p); }
#ifdef TG_EMULATION
extern "C" void tg_finish_sum_f64_host(const void* w) { tg_finish_sum_f64(*(const tg_finish_args*)w); }
#endif
extern "C" __global__ void __launch_bounds__(TG_BLOCK) tg_finish_max_f64(const tg_finish_args p) { tg_finish<1, double>(p); }
#ifdef TG_EMULATION
extern "C" void tg_finish_max_f64_host(const void* w) { tg_finish_max_f64(*(const tg_finish_args*)w); }
#endif
extern "C" __global__ void __launch_bounds__(TG_BLOCK) tg_finish_min_f64(const tg_finish_args p) { tg_finish<2, double>(p); }
#ifdef TG_EMULATION
extern "C" void tg_finish_min_f64_host(const void* w) { tg_finish_min_f64(*(const tg_finish_args*)w); }
#endif
extern "C" __global__ void __launch_bounds__(TG_BLOCK) tg_finish_prod_f64(const tg_finish_args p) { tg_finish<3, double>(p); }
#ifdef TG_EMULATION
extern "C" void tg_finish_prod_f64_host(const void* w) { tg_finish_prod_f64(*(const tg_finish_args*)w); }
#endif

// Strided -> dense copy with conversion (cast, dense operands for cuBLAS, strided outputs).
struct tg_gather_args { tg_u64 w[20]; };  // n, rank, src, dst, ext[8], stride[8]
template <class S, class D> __device__ void tg_gather(const tg_gather_args& p) {
    const tg_i64 n = (tg_i64)p.w[0];
    const int rank = (int)p.w[1];
    const S* src = (const S*)p.w[2];
    D* dst = (D*)p.w[3];
    for (tg_i64 e = blockIdx.x * (tg_i64)blockDim.x + threadIdx.x; e < n; e += (tg_i64)gridDim.x * blockDim.x) {
        tg_i64 r = e, off = 0;
        for (int a = rank - 1; a >= 0; --a) {
            const tg_i64 ext = (tg_i64)p.w[4 + a];
            off += (r % ext) * (tg_i64)p.w[12 + a];
            r /= ext;
        }
        dst[e] = (D)src[off];
    }
}
extern "C" __global__ void __launch_bounds__(TG_BLOCK) tg_gather_f32_f32(const tg_gather_args p) { tg_gather<float, float>(p); }
#ifdef TG_EMULATION
extern "C" void tg_gather_f32_f32_host(const void* w) { tg_gather_f32_f32(*(const tg_gather_args*)w); }
#endif
// bf16/f16 operands and outputs are copied as bit patterns
extern "C" __global__ void __launch_bounds__(TG_BLOCK) tg_gather_b16_b16(const tg_gather_args p) { tg_gather<unsigned short, unsigned short>(p); }
#ifdef TG_EMULATION
extern "C" void tg_gather_b16_b16_host(const void* w) { tg_gather_b16_b16(*(const tg_gather_args*)w); }
#endif
extern "C" __global__ void __launch_bounds__(TG_BLOCK) tg_gather_f64_f64(const tg_gather_args p) { tg_gather<double, double>(p); }
#ifdef TG_EMULATION
extern "C" void tg_gather_f64_f64_host(const void* w) { tg_gather_f64_f64(*(const tg_gather_args*)w); }
#endif
extern "C" __global__ void __launch_bounds__(TG_BLOCK) tg_gather_f32_f64(const tg_gather_args p) { tg_gather<float, double>(p); }
#ifdef TG_EMULATION
extern "C" void tg_gather_f32_f64_host(const void* w) { tg_gather_f32_f64(*(const tg_gather_args*)w); }
#endif
extern "C" __global__ void __launch_bounds__(TG_BLOCK) tg_gather_f64_f32(const tg_gather_args p) { tg_gather<double, float>(p); }
#ifdef TG_EMULATION
extern "C" void tg_gather_f64_f32_host(const void* w) { tg_gather_f64_f32(*(const tg_gather_args*)w); }
#endif

)CUDA";
}

// ---- one group kernel ------------------------------------------------------------------------
inline void emit_group(std::string& s, const plan_view& pv, const group_desc& g, std::size_t group_index) {
    const node_info* info = pv.info;
    const td::loop_plan& lp = pv.loops[g.loop];
    const node_info& it = info[lp.iter];
    const std::size_t rank = it.rank;
    const auto ops = group_operands(pv, g);
    const word_layout w = layout_of(pv, g, ops);
    const std::string name = kernel_name(g.loop, group_index);
    const std::string args = name + "_args";
    // f64 loops compute in double; f32/bf16/f16 loops in float, each operand converting from and
    // to its buffer's type and each bf16/f16 value rounded once, as the CPU's loops do.
    const char* T = info[lp.iter].value == td::dtype_code::f64 ? "double" : "float";
    auto W = [](std::size_t i) { return std::string("p.w[") + std::to_string(i) + "]"; };
    auto I = [&](std::size_t i) { return std::string("((tg_i64)") + W(i) + ")"; };
    auto extent = [&](std::size_t a) {
        return it.ext[a] != typegrad::dyn ? std::string("((tg_i64)") + std::to_string(it.ext[a]) + ")" : I(w.ext_begin + a);
    };
    // iteration axes along which operand o is broadcast (reads or writes the same element)
    auto broadcast = [&](std::size_t o, std::size_t a) {
        return output_broadcast_axis(pv, ops[o].node, lp.iter, a);
    };
    auto offset = [&](std::size_t o) {
        std::string e;
        for (std::size_t a = 0; a < rank; ++a) {
            if (broadcast(o, a)) continue;
            if (!e.empty()) e += " + ";
            e += std::string("i") + std::to_string(a) + std::string("[u] * ") + I(w.stride(o, a));
        }
        return e.empty() ? std::string("0") : e;
    };
    auto v = [](std::size_t n) { return std::string("v") + std::to_string(n); };
    auto rounded = [](td::dtype_code d, const std::string& e) {
        return d == td::dtype_code::bf16 ? std::string("tg_round_bf16(") + e + ")"
             : d == td::dtype_code::f16  ? std::string("tg_round_f16(") + e + ")"
                                         : e;
    };
    auto load = [&](std::size_t n, const std::string& ptr, const std::string& off) {
        const td::dtype_code b = info[n].buffer;
        std::string e = b == td::dtype_code::bf16 ? std::string("tg_from_bf16(((const unsigned short*)") + ptr + ")[" + off + "])"
                      : b == td::dtype_code::f16  ? std::string("tg_from_f16(((const unsigned short*)") + ptr + ")[" + off + "])"
                                                  : std::string("((const T*)") + ptr + ")[" + off + "]";
        return info[n].value != b ? rounded(info[n].value, e) : e;  // a bf16 value in a float buffer
    };
    auto store = [&](std::size_t n, const std::string& ptr, const std::string& off, const std::string& x,
                     const std::string& accumulate) {
        const td::dtype_code b = info[n].buffer;
        if (b != td::dtype_code::bf16 && b != td::dtype_code::f16) {
            if (accumulate.empty()) return std::string("((T*)") + ptr + ")[" + off + "] = " + x + ";";
            return std::string("{ T* d = (T*)") + ptr + " + (" + off + "); if (" + accumulate + ") *d += " + x + "; else *d = " + x + "; }";
        }
        const std::string to = b == td::dtype_code::bf16 ? "tg_to_bf16" : "tg_to_f16";
        const std::string from = b == td::dtype_code::bf16 ? "tg_from_bf16" : "tg_from_f16";
        if (accumulate.empty()) return std::string("((unsigned short*)") + ptr + ")[" + off + "] = " + to + "(" + x + ");";
        return std::string("{ unsigned short* d = (unsigned short*)") + ptr + " + (" + off + "); *d = " + to + "(" + accumulate + " ? " +
               from + "(*d) + " + x + " : " + x + "); }";
    };

    s += std::string("// loop ") + std::to_string(g.loop) + std::string(", group ") + std::to_string(group_index) + std::string(": iterates over node ") +
         std::to_string(lp.iter) + std::string(" ('") + std::string(it.name) + std::string("'), rank ") + std::to_string(rank) + "\n";
    s += std::string("struct ") + args + std::string(" { tg_u64 w[") + std::to_string(w.words()) + "]; };\n";
    // U elements per call, k, k + step, ..., k + (U-1) step (those < kend): every load of the U
    // elements is issued before any arithmetic or store, so a thread keeps U loads per operand in
    // flight (a memory-bound loop needs that to reach the device's bandwidth). The reduction still
    // combines in k order, so the result is the bits of U = 1.
    s += std::string("template <int U> __device__ __forceinline__ void ") + name + std::string("_element(const ") + args +
         std::string("& p, tg_i64 o, tg_i64 k, tg_i64 step, tg_i64 kend, ") + T + "* acc) {\n";
    s += std::string("    typedef ") + std::string(T) + " T;\n";
    s += "    bool ok[U];\n";
    for (std::size_t a = 0; a < rank; ++a) s += std::string("    tg_i64 i") + std::to_string(a) + "[U];\n";
    // the multi-index from (o, k): kept axes from o, reduced axes from k, each row-major
    s += "    TG_UNROLL for (int u = 0; u < U; ++u) {\n";
    s += "        tg_i64 ku = k + u * step;\n        ok[u] = ku < kend;\n        if (!ok[u]) ku = k;  // a valid index; nothing is combined or stored\n";
    for (std::size_t a = 0; a < rank; ++a) s += std::string("        i") + std::to_string(a) + "[u] = 0;\n";
    for (int part = 0; part < 2; ++part) {
        std::vector<std::size_t> axes;
        for (std::size_t a = 0; a < rank; ++a)
            if (bool((g.mask >> a) & 1u) == bool(part)) axes.push_back(a);
        if (axes.empty()) continue;
        s += std::string("        {\n            tg_i64 r = ") + std::string(part ? "ku" : "o") + ";\n";
        for (std::size_t j = axes.size(); j-- > 1;) {
            const std::size_t a = axes[j];
            s += std::string("            i") + std::to_string(a) + std::string("[u] = r % ") + extent(a) + std::string("; r /= ") + extent(a) + ";\n";
        }
        s += std::string("            i") + std::to_string(axes[0]) + "[u] = r;\n        }\n";
    }
    s += "    }\n";
    // loads of materialised values (a value per element: vN[u]; a scalar meta value: vN)
    for (std::size_t o = 0; o < ops.size(); ++o) {
        if (ops[o].role != operand_role::input) continue;
        const std::size_t n = ops[o].node;
        if (info[n].kind == op_kind::constant) continue;  // inlined at each use
        if (info[n].kind == op_kind::meta) {
            s += std::string("    const T ") + v(n) + std::string(" = (T)tg_double_bits(") + W(w.operand(o)) + ");\n";
        } else {
            s += std::string("    T ") + v(n) + std::string("[U];\n    TG_UNROLL for (int u = 0; u < U; ++u) ") + v(n) +
                 std::string("[u] = ") + load(n, W(w.operand(o)), offset(o)) + ";\n";
        }
    }
    auto value_of = [&](std::size_t n) -> std::string {
        if (info[n].kind == op_kind::constant) return rounded(info[n].value, std::string("((T)") + literal(pv.constants[n]) + ")");
        if (info[n].kind == op_kind::meta) return v(n);
        return v(n) + "[u]";
    };
    // the elementwise body
    for (std::size_t m = lp.body_begin; m < lp.body_end; ++m) {
        const std::size_t n = pv.members[m];
        std::vector<std::string> operands;
        for (std::size_t c = 0; c < info[n].arity; ++c)
            if (!info[n].shape_only[c]) operands.push_back(value_of(info[n].child[c]));
        const char* expr = pv.device[n];
        s += std::string("    T ") + v(n) + std::string("[U];  // ") + std::string(info[n].name) +
             std::string("\n    TG_UNROLL for (int u = 0; u < U; ++u) ") + v(n) + std::string("[u] = ") +
             rounded(info[n].value, substitute(expr ? expr : "/*no device expression*/", operands)) + ";\n";
    }
    // reductions, materialisations, stores
    s += "    TG_UNROLL for (int u = 0; u < U; ++u) {\n        if (!ok[u]) continue;\n";
    for (std::size_t r = 0; r < g.reds.size(); ++r) {
        const std::size_t n = g.reds[r];
        s += std::string("        acc[") + std::to_string(r) + std::string("] = tg_combine<") + std::to_string(int(info[n].combine)) + std::string(">(acc[") +
             std::to_string(r) + std::string("], ") + value_of(info[n].child[0]) + ");\n";
    }
    std::size_t store_k = 0;
    for (std::size_t o = 0; o < ops.size(); ++o) {
        if (ops[o].role == operand_role::materialisation) {
            s += std::string("        ") + store(ops[o].node, W(w.operand(o)), offset(o), value_of(ops[o].node), "") + "\n";
        } else if (ops[o].role == operand_role::store) {
            s += std::string("        ") + store(ops[o].node, W(w.operand(o)), offset(o), value_of(ops[o].node), W(w.flag(store_k))) + "\n";
            ++store_k;
        }
    }
    s += "    }\n}\n";

    // the kernel
    const std::size_t nr = g.reds.size();
    s += std::string("extern \"C\" __global__ void __launch_bounds__(TG_BLOCK) ") + name + std::string("(const ") + args + " p) {\n";
    s += std::string("    typedef ") + std::string(T) + " T;\n";
    s += std::string("    const tg_i64 O = ") + I(0) + std::string(", K = ") + I(1) + ";\n";
    s += std::string("    T acc[") + std::to_string(nr ? nr : 1) + "];\n";
    auto init = [&] {
        std::string t;
        for (std::size_t r = 0; r < nr; ++r)
            t += std::string("        acc[") + std::to_string(r) + std::string("] = tg_identity<") + std::to_string(int(info[g.reds[r]].combine)) +
                 ", T>();\n";
        if (!nr) t += "        acc[0] = (T)0;\n";
        return t;
    };
    s += std::string("    if (") + W(4) + " == 0) {  // serial: a thread per output\n";
    s += "      for (tg_i64 o = blockIdx.x * (tg_i64)blockDim.x + threadIdx.x; o < O; o += (tg_i64)gridDim.x * blockDim.x) {\n";
    s += init();
    s += std::string("        for (tg_i64 k = 0; k < K; ++k) ") + name + "_element<1>(p, o, k, 1, K, acc);\n";
    for (std::size_t r = 0; r < nr; ++r)
        s += std::string("        ((T*)") + W(w.operand(r + (lp.in_end - lp.in_begin))) + std::string(")[o] = acc[") + std::to_string(r) + "];\n";
    s += "      }\n";
    s += "    } else {  // split: a block per (chunk of k, output)\n";
    s += std::string("      const tg_i64 G = ") + I(2) + std::string(", CH = ") + I(3) + ";\n";
    s += "      for (tg_i64 o = blockIdx.y; o < O; o += gridDim.y) {\n";
    s += init();
    s += "        const tg_i64 k0 = blockIdx.x * CH, k1 = k0 + CH < K ? k0 + CH : K;\n";
    s += std::string("        for (tg_i64 k = k0 + threadIdx.x; k < k1; k += TG_UNROLL_SPLIT * (tg_i64)blockDim.x) ") + name +
         "_element<TG_UNROLL_SPLIT>(p, o, k, blockDim.x, k1, acc);\n";
    for (std::size_t r = 0; r < nr; ++r) {
        const std::string a = std::string("acc[") + std::to_string(r) + "]";
        s += std::string("        ") + a + std::string(" = tg_block_reduce<") + std::to_string(int(info[g.reds[r]].combine)) + std::string(">(") + a + ");\n";
        s += std::string("        if (threadIdx.x == 0) { if (G == 1) ((T*)") + W(w.operand(r + (lp.in_end - lp.in_begin))) +
             std::string(")[o] = ") + a + std::string("; else ((T*)") + W(w.partial(r)) + std::string(")[o * G + blockIdx.x] = ") + a + "; }\n";
    }
    s += "      }\n    }\n}\n";
    s += "#ifdef TG_EMULATION\nextern \"C\" void " + name + "_host(const void* w) { " + name + "(*(const " + args +
         "*)w); }\n#endif\n\n";
}

// A custom op's kernel: the op's statements inside a kernel that names its operands. Parameter
// words: forward out, n, then (in_k, n_k) per input; backward grad_out, n, out, n, then
// (in_k, n_k) and grad_in_k per input (the gradients are zeroed before the launch).
inline void emit_custom(std::string& s, const plan_view& pv, std::size_t n) {
    const node_info& ni = pv.info[n];
    const bool backward = ni.name == "custom_backward";
    const std::size_t inputs = ni.arity - (backward ? 2 : 0);
    const char* T = ni.value == td::dtype_code::f64 ? "double" : "float";
    auto W = [](std::size_t i) { return std::string("p.w[") + std::to_string(i) + "]"; };
    s += std::string("// custom op, node ") + std::to_string(n) + (backward ? " (backward)\n" : " (forward)\n");
    s += "struct " + custom_kernel_name(n) + "_args { tg_u64 w[16]; };\n";
    s += "extern \"C\" __global__ void __launch_bounds__(TG_BLOCK) " + custom_kernel_name(n) + "(const " +
         custom_kernel_name(n) + "_args p) {\n";
    s += std::string("    typedef ") + T + " T;\n";
    s += "    const tg_i64 tg_thread = blockIdx.x * (tg_i64)blockDim.x + threadIdx.x, tg_threads = (tg_i64)gridDim.x * blockDim.x;\n";
    std::size_t w = 0;
    auto word = [&](const std::string& declaration) {  // "T* out = (T*)" -> that plus the next word
        s += "    " + declaration + W(w) + ";\n";
        ++w;
    };
    if (backward) {
        word("const T* grad_out = (const T*)");
        word("const tg_i64 n = (tg_i64)");
        word("const T* out = (const T*)");
        word("(void)");
    } else {
        word("T* out = (T*)");
        word("const tg_i64 n = (tg_i64)");
    }
    for (std::size_t k = 0; k < inputs; ++k) {
        const std::string i = std::to_string(k);
        word("const T* in" + i + " = (const T*)");
        word("const tg_i64 n" + i + " = (tg_i64)");
        if (backward) word("T* grad_in" + i + " = (T*)");
    }
    for (std::size_t k = 0; k < inputs; ++k) s += "    (void)n" + std::to_string(k) + ";\n";
    s += "    (void)tg_thread; (void)tg_threads; (void)n; (void)out;\n";
    s += std::string("    {\n") + pv.device[n] + "\n    }\n}\n";
    s += "#ifdef TG_EMULATION\nextern \"C\" void " + custom_kernel_name(n) + "_host(const void* w) { " + custom_kernel_name(n) +
         "(*(const " + custom_kernel_name(n) + "_args*)w); }\n#endif\n\n";
}

// The whole module of a plan: the prelude, one kernel per loop group, one per custom op.
inline std::string generate_source(const plan_view& pv) {
    std::string s = prelude();
    for (std::size_t L = 0; L < pv.loop_count; ++L) {
        const auto groups = loop_groups(pv, L);
        for (std::size_t gi = 0; gi < groups.size(); ++gi) emit_group(s, pv, groups[gi], gi);
    }
    for (std::size_t n = 0; n < pv.node_count; ++n)
        if (is_custom_node(pv.info[n]) && pv.device[n] != nullptr) emit_custom(s, pv, n);
    std::vector<std::string_view> emitted;  // each op's templates once, whatever its parameters
    for (std::size_t n = 0; n < pv.node_count; ++n) {
        if (pv.kernel_source[n] == nullptr) continue;
        const std::string_view src = pv.kernel_source[n];
        if (std::find(emitted.begin(), emitted.end(), src) == emitted.end()) {
            emitted.push_back(src);
            s += std::string("// kernel op ") + std::string(pv.info[n].name) + "\n" + std::string(src) + "\n";
        }
        const std::string name = node_kernel_name(n);
        s += "extern \"C\" __global__ void __launch_bounds__(TG_BLOCK) " + name + "(const tg_node_args p) { " +
             pv.kernel_call[n] + "(p); }\n";
        s += "#ifdef TG_EMULATION\nextern \"C\" void " + name + "_host(const void* w) { " + name +
             "(*(const tg_node_args*)w); }\n#endif\n";
    }
    return s;
}
template <class PP>
std::string generate_source() {
    return generate_source(view_of<PP>());
}

}  // namespace typegrad::cuda::detail
