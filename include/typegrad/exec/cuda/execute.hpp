#pragma once
// Runs a plan on the device: the host computes shapes and checks everything (the same code as
// the CPU path: exec/execute.hpp), lays out one device arena, then launches the plan's kernels
// in schedule order on the legacy default stream: generated loop kernels, cuBLAS for matmul,
// prelude kernels for casts, and the device kernels that kernel ops carry beside their CPU run
// (device_source: embedding, one_hot, slice_backward, ...).
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include <typegrad/exec/cuda/codegen.hpp>
#include <typegrad/exec/cuda/runtime.hpp>
#include <typegrad/exec/cuda/tensor.hpp>
#include <typegrad/exec/custom_checks.hpp>
#include <typegrad/ops/cast.hpp>
#include <typegrad/ops/loss.hpp>
#include <typegrad/ops/matmul.hpp>

namespace typegrad::cuda::detail {

// ---- which nodes the device can run --------------------------------------------------------
template <class Op> inline constexpr bool is_matmul_v = std::is_same_v<Op, td::matmul_op>;
template <class Op> inline constexpr bool is_cast_v = false;
template <class To> inline constexpr bool is_cast_v<td::cast_op<To>> = true;

template <class N>
constexpr void check_node_on_device() {
    if constexpr (N::kind == op_kind::elementwise) {
        static_assert(op_device_expr<typename N::op>::value != nullptr,
                      "typegrad: cuda: an elementwise op of this graph has no device expression. An elementwise "
                      "hook runs on the device only when its function object declares one, e.g. "
                      "`static constexpr const char* device = \"{0} + (T)10\";` (docs/cuda.md)");
    } else if constexpr (N::kind == op_kind::kernel) {
        if constexpr (td::custom_kernel_info<N>::is_custom) {
            using op = typename td::custom_kernel_info<N>::op;
            static_assert(op_device_expr<typename N::op>::value != nullptr,
                          "typegrad: cuda: a custom op (tg::custom) of this graph has no device implementation; "
                          "give it `static constexpr const char* device_forward` and `device_backward` (CUDA "
                          "statements, docs/cuda.md) or evaluate this step with host bindings");
            static_assert(td::saved_of<op>::bytes == 0 && std::is_same_v<td::forward_mutations_t<op>, mutation_list<>> &&
                              std::is_same_v<td::backward_mutations_t<op>, mutation_list<>>,
                          "typegrad: cuda: a custom op with saved values or declared mutations runs on the host "
                          "only; evaluate this step with host bindings (docs/cuda.md)");
            static_assert(std::is_same_v<storage_t<typename N::value_type>, float> ||
                              std::is_same_v<storage_t<typename N::value_type>, double>,
                          "typegrad: cuda: a custom op runs on the device in f32 or f64 only (docs/cuda.md)");
        }
        if constexpr (is_cast_v<typename N::op>)
            static_assert(!is_reduced_precision_v<storage_t<typename N::value_type>> &&
                              !is_reduced_precision_v<storage_t<typename td::type_at_t<0, typename N::children>::value_type>>,
                          "typegrad: cuda: a cast to or from f64 with a bf16/f16 side has no device kernel yet; cast "
                          "through f32 (tg::cast<float>) first (docs/cuda.md)");
        // a kernel op with its own device implementation (device_source, ops/index.hpp); one
        // without names itself (ops/conv.hpp, pool.hpp)
        if constexpr (requires { N::op::device_source; }) {
        } else if constexpr (requires { N::op::template no_device_kernel<N>(); }) N::op::template no_device_kernel<N>();
        else static_assert(td::custom_kernel_info<N>::is_custom || is_matmul_v<typename N::op> ||
                          is_cast_v<typename N::op>,
                      "typegrad: cuda: this graph has a kernel op with no device implementation (tensor hooks, "
                      "which take a host tg::grad_view, are one); evaluate it with host bindings (docs/cuda.md)");
    }
    if constexpr (requires { typename N::op::hook_type; })
        static_assert(td::always_false<N>,
                      "typegrad: cuda: post_accumulate_grad_hook runs host code on the param and its gradient; "
                      "it cannot run on the device (docs/cuda.md)");
}

// The generator computes an f64 loop in double and an f32/bf16/f16 loop in float, converting
// each operand from and to its buffer's type; f64 never meets the float family in one loop
// (promotion rules), which this re-checks.
template <class Plan>
constexpr bool loops_have_one_compute_type() {
    using td::dtype_code;
    for (std::size_t L = 0; L < Plan::plan.loop_count; ++L) {
        const td::loop_plan& lp = Plan::plan.loops[L];
        const bool f64 = Plan::program::info[lp.iter].value == dtype_code::f64;
        for (std::size_t m = lp.in_begin; m < lp.store_end; ++m) {
            const std::size_t n = m >= lp.store_begin ? Plan::stores[Plan::plan.members[m]] : Plan::plan.members[m];
            const td::node_info& ni = Plan::program::info[n];
            if (ni.kind == op_kind::constant || ni.kind == op_kind::meta) continue;
            if (ni.buffer == dtype_code::other || (ni.buffer == dtype_code::f64) != f64) return false;
        }
    }
    return true;
}

template <class Plan>
constexpr bool check_plan_on_device() {
    static_assert(loops_have_one_compute_type<Plan>(),
                  "typegrad: cuda: a fused loop of this graph mixes f64 with f32/bf16/f16 values; the CUDA "
                  "backend computes a loop in double or in float (docs/cuda.md)");
    [&]<std::size_t... Ns>(std::index_sequence<Ns...>) {
        (check_node_on_device<typename Plan::program::template node_at<Ns>>(), ...);
    }(std::make_index_sequence<Plan::M>{});
    return true;
}

// ---- the compiled module of a plan, once per plan type ---------------------------------------
enum prelude_fn : std::size_t {
    // in detail::reduce_kind's order, f32 then f64 (a launch adds the kind to finish_sum_*)
    finish_sum_f32, finish_max_f32, finish_min_f32, finish_prod_f32,
    finish_sum_f64, finish_max_f64, finish_min_f64, finish_prod_f64,
    gather_f32_f32, gather_f64_f64, gather_f32_f64, gather_f64_f32, gather_b16_b16, prelude_fn_count
};
inline constexpr const char* prelude_names[prelude_fn_count] = {
    "tg_finish_sum_f32", "tg_finish_max_f32", "tg_finish_min_f32", "tg_finish_prod_f32",
    "tg_finish_sum_f64", "tg_finish_max_f64", "tg_finish_min_f64", "tg_finish_prod_f64",
    "tg_gather_f32_f32", "tg_gather_f64_f64", "tg_gather_f32_f64", "tg_gather_f64_f32", "tg_gather_b16_b16"};

struct compiled_module {
    CUmodule module = nullptr;
    std::vector<std::vector<group_desc>> groups;       // [loop][group]
    std::vector<std::vector<CUfunction>> functions;    // [loop][group]
    std::array<CUfunction, prelude_fn_count> prelude{};
    std::vector<CUfunction> custom;                    // [node]: a custom op's kernel, or null
    std::vector<CUfunction> node_kernel;               // [node]: a kernel op's device_source kernel, or null
};

// The virtual architecture NVRTC targets for the device in use.
inline const std::string& device_architecture() {
    static const std::string arch = [] {
        const device_info& d = device_state();
        if (!d.usable) throw device_error(message("typegrad: cuda: ", d.failure));
        return nvrtc_architecture(d.major, d.minor);
    }();
    return arch;
}

// Generates, compiles (NVRTC) and loads the plan's module. A named function, not a lambda
// invoked in module_for's initializer: clang tries to evaluate a static local's initializer at
// compile time, and the failure note of a lambda call spells the lambda's whole body.
template <class Plan>
compiled_module load_module() {
    compiled_module c;
    emulator* e = active_emulator();
    void* emulated = nullptr;
    const driver_api* a = nullptr;
    if (e) {
        emulated = e->load(generate_source<Plan>());
    } else {
        const std::string ptx = compile_to_ptx(generate_source<Plan>(), device_architecture());
        a = &api();
        check(a->cuModuleLoadData(&c.module, ptx.c_str()), "cuModuleLoadData");
    }
    auto get = [&](const std::string& name) {
        CUfunction f = nullptr;
        if (e) f = static_cast<CUfunction>(e->function(emulated, name.c_str()));
        else check(a->cuModuleGetFunction(&f, c.module, name.c_str()), "cuModuleGetFunction");
        return f;
    };
    for (std::size_t L = 0; L < Plan::plan.loop_count; ++L) {
        c.groups.push_back(loop_groups(view_of<Plan>(), L));
        c.functions.emplace_back();
        for (std::size_t g = 0; g < c.groups.back().size(); ++g) c.functions.back().push_back(get(kernel_name(L, g)));
    }
    for (std::size_t i = 0; i < prelude_fn_count; ++i) c.prelude[i] = get(prelude_names[i]);
    const plan_view pv = view_of<Plan>();
    c.custom.assign(Plan::M, nullptr);
    for (std::size_t n = 0; n < Plan::M; ++n)
        if (is_custom_node(pv.info[n]) && pv.device[n] != nullptr) c.custom[n] = get(custom_kernel_name(n));
    c.node_kernel.assign(Plan::M, nullptr);
    for (std::size_t n = 0; n < Plan::M; ++n)
        if (pv.kernel_source[n] != nullptr) c.node_kernel[n] = get(node_kernel_name(n));
    return c;
}
// The plan's module, loaded once per plan type; thread-safe (a function-local static; a failure
// throws and the next call tries again). Modules live until the process ends.
template <class Plan>
const compiled_module& module_for() {
    static const compiled_module m = load_module<Plan>();
    return m;
}

inline void launch(CUfunction f, unsigned gx, unsigned gy, std::uint64_t* words) {
    if (emulator* e = active_emulator()) return e->launch(static_cast<void*>(f), gx, gy, words);
    void* params[] = {words};
    check(api().cuLaunchKernel(f, gx, gy, 1, block_size, 1, 1, 0, nullptr, params, nullptr), "cuLaunchKernel");
}
inline unsigned grid_for(std::uint64_t n) {
    const std::uint64_t blocks = (n + block_size - 1) / block_size;
    return unsigned(blocks == 0 ? 1 : blocks > (1u << 20) ? (1u << 20) : blocks);
}

// ---- launch configuration of a loop group: a function of (O, K) only ----------------------------
struct group_launch {
    std::uint64_t O = 0, K = 0, G = 1, CH = 0;
    bool split = false;
};
inline group_launch configure(std::uint64_t O, std::uint64_t K) {
    group_launch c{O, K, 1, K, false};
    if (K <= 32 || O >= 65536) return c;  // serial
    c.split = true;
    const std::uint64_t per_block = std::uint64_t(block_size) * 16;
    std::uint64_t G = (K + per_block - 1) / per_block;
    G = G < 1 ? 1 : G > 1024 ? 1024 : G;
    c.G = G;
    c.CH = (K + G - 1) / G;
    return c;
}

template <class T>
constexpr std::size_t gather_fn() {
    return std::is_same_v<T, float> ? gather_f32_f32 : std::is_same_v<T, double> ? gather_f64_f64 : gather_b16_b16;
}

// Strided -> dense copy on the device.
inline void gather(const compiled_module& m, std::size_t fn, const void* src, void* dst, std::size_t n,
                   std::size_t rank, const std::size_t* ext, const std::ptrdiff_t* stride) {
    if (n == 0) return;
    std::uint64_t w[20] = {};
    w[0] = n;
    w[1] = rank;
    w[2] = reinterpret_cast<std::uintptr_t>(src);
    w[3] = reinterpret_cast<std::uintptr_t>(dst);
    for (std::size_t a = 0; a < rank; ++a) {
        w[4 + a] = ext[a];
        w[12 + a] = std::uint64_t(stride[a]);
    }
    launch(m.prelude[fn], grid_for(n), 1, w);
}

// What a loop launch reads of the run-time state (plain pointers: the launcher is compiled once).
struct state_view {
    const void* const* ptr;
    void* const* out;
    const std::size_t* ext;
    const std::ptrdiff_t* stride;
    const std::size_t* rank_offset;
    const double* meta;
};

struct loop_launches {
    std::vector<std::vector<group_launch>> launches;                // [loop][group]
    std::vector<std::vector<std::vector<std::size_t>>> partials;    // byte offsets [loop][group][reduction]
};

// Launch configurations of every loop group and the arena bytes their partials need, from `bytes` on.
inline std::size_t plan_launches(const plan_view& pv, const state_view& sv, loop_launches& out, std::size_t bytes) {
    auto align = [&] { bytes = (bytes + 255) / 256 * 256; };
    out.launches.assign(pv.loop_count, {});
    out.partials.assign(pv.loop_count, {});
    for (std::size_t L = 0; L < pv.loop_count; ++L) {
        const auto groups = loop_groups(pv, L);
        const td::loop_plan& lp = pv.loops[L];
        for (const auto& g : groups) {
            std::uint64_t O = 1, K = 1;
            for (std::size_t a = 0; a < pv.info[lp.iter].rank; ++a)
                ((g.mask >> a) & 1u ? K : O) *= sv.ext[sv.rank_offset[lp.iter] + a];
            const group_launch c = configure(O, K);
            out.launches[L].push_back(c);
            out.partials[L].emplace_back();
            if (c.split && c.G > 1)
                for (std::size_t r : g.reds) {
                    align();
                    out.partials[L].back().push_back(bytes);
                    bytes += std::size_t(O * c.G) * pv.info[r].elem_size;
                }
        }
    }
    align();
    return bytes;
}

// Launches the kernels of loop L: one per group, plus the finish kernels of split reductions.
inline void run_loop(const plan_view& pv, const state_view& sv, const compiled_module& m, const loop_launches& ll,
                     std::size_t L, const bool* accumulate, char* base, std::vector<std::uint64_t>& words) {
    const node_info* info = pv.info;
    const td::loop_plan& lp = pv.loops[L];
    const std::size_t iter = lp.iter;
    const std::size_t rank = info[iter].rank;
    for (std::size_t gi = 0; gi < m.groups[L].size(); ++gi) {
        const group_desc& g = m.groups[L][gi];
        const group_launch& c = ll.launches[L][gi];
        if (c.O == 0) continue;
        const auto ops = group_operands(pv, g);
        const word_layout w = layout_of(pv, g, ops);
        words.assign(w.words(), 0);
        words[0] = c.O;
        words[1] = c.K;
        words[2] = c.G;
        words[3] = c.CH;
        words[4] = c.split ? 1 : 0;
        for (std::size_t a = 0; a < rank; ++a) words[w.ext_begin + a] = sv.ext[sv.rank_offset[iter] + a];
        std::size_t store_k = 0;
        for (std::size_t o = 0; o < ops.size(); ++o) {
            const std::size_t n = ops[o].node;
            const std::size_t lead = rank - info[n].rank;
            if (ops[o].role == operand_role::input) {
                if (info[n].kind == op_kind::meta) std::memcpy(&words[w.operand(o)], &sv.meta[n], 8);
                else words[w.operand(o)] = reinterpret_cast<std::uintptr_t>(sv.ptr[n]);
                if (info[n].kind == op_kind::constant || info[n].kind == op_kind::meta) continue;
                for (std::size_t a = 0; a < rank; ++a)
                    if (!output_broadcast_axis(pv, n, iter, a))
                        words[w.stride(o, a)] = std::uint64_t(sv.stride[sv.rank_offset[n] + (a - lead)]);
                continue;
            }
            words[w.operand(o)] =
                reinterpret_cast<std::uintptr_t>(ops[o].role == operand_role::store ? sv.out[ops[o].store_index] : sv.ptr[n]);
            // outputs are dense in their own shape
            for (std::size_t a = 0; a < rank; ++a) {
                if (output_broadcast_axis(pv, n, iter, a)) continue;
                std::uint64_t stride = 1;
                for (std::size_t b = a + 1; b < rank; ++b)
                    if (b >= lead) stride *= sv.ext[sv.rank_offset[n] + (b - lead)];
                words[w.stride(o, a)] = stride;
            }
            if (ops[o].role == operand_role::store) words[w.flag(store_k++)] = accumulate[ops[o].store_index] ? 1 : 0;
        }
        const auto& partials = ll.partials[L][gi];
        for (std::size_t r = 0; r < partials.size(); ++r)
            words[w.partial(r)] = reinterpret_cast<std::uintptr_t>(base + partials[r]);
        const unsigned gy = unsigned(c.O > 65535 ? 65535 : c.O);
        if (c.split) launch(m.functions[L][gi], unsigned(c.G), gy, words.data());
        else launch(m.functions[L][gi], grid_for(c.O), 1, words.data());
        if (c.split && c.G > 1) {
            for (std::size_t r = 0; r < g.reds.size(); ++r) {
                const std::size_t n = g.reds[r];
                std::uint64_t fw[4] = {reinterpret_cast<std::uintptr_t>(base + partials[r]),
                                       reinterpret_cast<std::uintptr_t>(sv.ptr[n]), c.O, c.G};
                const std::size_t fn =
                    (info[n].elem_size == sizeof(double) ? finish_sum_f64 : finish_sum_f32) + std::size_t(info[n].combine);
                launch(m.prelude[fn], gy, 1, fw);
            }
        }
    }
}

// One matmul operand as cuBLAS reads it (td::operand_access_of, ops/matmul.hpp: the host GEMM's
// rule), or a dense device copy when neither inner axis is unit-stride.
template <class T>
struct matmul_operand {
    const T* data = nullptr;
    bool transposed = false;
    std::size_t ld = 0;
    long long batch_stride = 0;
    device_buffer copy;
    matmul_operand(const compiled_module& m, const td::tensor_ref& r) {
        const td::operand_access access = td::operand_access_of(r);
        data = static_cast<const T*>(r.data);
        transposed = access.layout == td::operand_layout::columns;
        ld = access.ld;
        batch_stride = access.batch_stride;
        if (access.layout == td::operand_layout::dense_copy) {
            const std::size_t nb = r.rank == 3 ? r.ext[0] : 1, numel = nb * r.ext[r.rank - 2] * r.ext[r.rank - 1];
            copy = device_buffer(numel * sizeof(T));
            gather(m, gather_fn<T>(), r.data, copy.data(), numel, r.rank, r.ext, r.stride);
            data = static_cast<const T*>(copy.data());
        }
    }
};

template <class T>
void run_matmul(const compiled_module& m, const td::tensor_ref& ra, const td::tensor_ref& rb, T* out,
                const std::size_t* ext, bool batched) {
    const std::size_t batch = batched ? ext[0] : 1;
    const std::size_t rows = ext[batched ? 1 : 0], cols = ext[batched ? 2 : 1];
    const std::size_t k = ra.ext[ra.rank - 1];
    if (batch == 0 || rows == 0 || cols == 0) return;
    if (k == 0) {
        zero_on_device(out, batch * rows * cols * sizeof(T));
        return;
    }
    matmul_operand<T> a(m, ra), b(m, rb);
    // Row-major C = A B is column-major C^T = B^T A^T: cuBLAS gets B first.
    const cublasOperation_t opb = b.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t opa = a.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (emulator* e = active_emulator())
        return e->gemm(std::is_same_v<T, double> ? gemm_type::f64 : std::is_same_v<T, bf16> ? gemm_type::bf16
                       : std::is_same_v<T, f16> ? gemm_type::f16 : gemm_type::f32, b.transposed, a.transposed, int(cols), int(rows), int(k), b.data,
                       int(b.ld), b.batch_stride, a.data, int(a.ld), a.batch_stride, out, int(cols),
                       (long long)(rows * cols), int(batch));
    cublasHandle_t h = blas_handle();
    const int n_ = int(cols), m_ = int(rows), k_ = int(k);
    if constexpr (is_reduced_precision_v<T>) {
        // bf16/f16 operands, f32 accumulation, the product rounded once to bf16/f16 (the CPU's
        // vdpbf16ps kernel and PyTorch's CUDA matmul do the same).
        const float one = 1, zero = 0;
        const cudaDataType_t dt = std::is_same_v<T, bf16> ? CUDA_R_16BF : CUDA_R_16F;
        check_cublas(cublasGemmStridedBatchedEx(h, opb, opa, n_, m_, k_, &one, b.data, dt, int(b.ld), b.batch_stride,
                                                a.data, dt, int(a.ld), a.batch_stride, &zero, out, dt, n_,
                                                (long long)(rows * cols), int(batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     "cublasGemmStridedBatchedEx");
    } else if constexpr (std::is_same_v<T, float>) {
        const T one = 1, zero = 0;
        check_cublas(cublasSgemmStridedBatched(h, opb, opa, n_, m_, k_, &one, b.data, int(b.ld), b.batch_stride,
                                               a.data, int(a.ld), a.batch_stride, &zero, out, n_,
                                               (long long)(rows * cols), int(batch)),
                     "cublasSgemmStridedBatched");
    } else {
        const T one = 1, zero = 0;
        check_cublas(cublasDgemmStridedBatched(h, opb, opa, n_, m_, k_, &one, b.data, int(b.ld), b.batch_stride,
                                               a.data, int(a.ld), a.batch_stride, &zero, out, n_,
                                               (long long)(rows * cols), int(batch)),
                     "cublasDgemmStridedBatched");
    }
}

// The shape pass of a device call. A kernel op's extents() checks its operands' values when the
// host can read them (embedding's ids, before anything runs); device memory is not readable from
// the host, so the pass sees no values and the op's kernel checks them (run_kernel's flag).
template <class Plan>
void compute_device_shapes(typename Plan::state_type& state) {
    const auto bound = state.ptr;
    state.ptr.fill(nullptr);
    td::compute_shapes<Plan>(state);
    state.ptr = bound;
}

// ---- one plan run ------------------------------------------------------------------------------
template <class Plan>
class device_run {
public:
    using state_type = typename Plan::state_type;
    static constexpr auto& info = Plan::program::info;

    // Layout of the arena for these shapes: computed nodes, split-reduction partials, the
    // flag of a kernel op's device_check, then `extra_bytes` for the caller (loss values).
    void layout(const state_type& state, std::size_t extra_bytes) {
        td::scratch_layout<Plan>(state, offset_);
        std::size_t bytes = offset_[Plan::M] * sizeof(td::scratch_unit);
        bytes = plan_launches(view_of<Plan>(), view(state), loops_, bytes);
        flag_ = bytes;
        bytes += 256;
        extra_ = bytes;
        bytes += extra_bytes;
        total_ = bytes;
    }
    std::size_t bytes() const { return total_; }
    void* extra(void* base) const { return static_cast<char*>(base) + extra_; }

    // Points computed nodes at the arena, metas at their values, views at their inputs.
    void bind(state_type& state, void* base) {
        base_ = static_cast<char*>(base);
        for (std::size_t n = 0; n < Plan::M; ++n)
            if (Plan::plan.computed[n]) state.ptr[n] = base_ + offset_[n] * sizeof(td::scratch_unit);
        [&]<std::size_t... Ns>(std::index_sequence<Ns...>) {
            ((Plan::plan.computed[Ns] ? meta_value<Ns>(state) : void()), ...);
        }(std::make_index_sequence<Plan::M>{});
        for (std::size_t n = 0; n < Plan::M; ++n) {
            if (info[n].kind != op_kind::view || !Plan::plan.needed[n] || state.ptr[n] != nullptr) continue;
            const auto base_address = reinterpret_cast<std::uintptr_t>(state.ptr[info[n].child[0]]);
            state.ptr[n] = base_address ? reinterpret_cast<const void*>(
                                           base_address + std::uintptr_t(state.view_offset[n] * std::ptrdiff_t(info[n].elem_size)))
                                     : nullptr;
        }
    }

    template <std::size_t NS>
    void run(state_type& state, const compiled_module& m, const std::array<bool, NS>& accumulate) {
        [&]<std::size_t... Is>(std::index_sequence<Is...>) {
            (run_item<Is>(state, m, accumulate), ...);
        }(std::make_index_sequence<td::schedule_size<Plan>()>{});
    }

private:
    template <std::size_t N>
    void meta_value(const state_type& state) {
        using node = typename Plan::program::template node_at<N>;
        if constexpr (node::kind == op_kind::meta) {
            alignas(8) unsigned char slot[8] = {};
            td::compute_meta<Plan, N>(const_cast<state_type&>(state), slot);
            using T = compute_t<typename node::value_type>;
            T v;
            std::memcpy(&v, slot, sizeof v);
            meta_[N] = double(v);
        }
    }

    template <std::size_t I, std::size_t NS>
    void run_item(state_type& state, const compiled_module& m, const std::array<bool, NS>& accumulate) {
        constexpr td::step_item item = td::schedule_v<Plan>[I];
        if constexpr (item.is_loop) run_loop(view_of<Plan>(), view(state), m, loops_, item.index, accumulate.data(), base_, words_);
        else run_kernel<item.index>(state, m);
    }

    state_view view(const state_type& state) const {
        return {state.ptr.data(), state.out.data(), state.ext.data(), state.stride.data(), Plan::rank_offset.data(), meta_.data()};
    }

    template <std::size_t N>
    void run_kernel(state_type& state, const compiled_module& m) {
        using node = typename Plan::program::template node_at<N>;
        using op = typename node::op;
        using T = compute_t<typename node::value_type>;
        using S = storage_t<typename node::value_type>;  // bf16/f16 kernels work on the stored type
        auto ref = [&](std::size_t k) { return td::ref_of<Plan>(state, info[N].child[k]); };
        void* out = const_cast<void*>(state.ptr[N]);
        const std::size_t* ext = state.ext.data() + Plan::rank_offset[N];
        const std::size_t n = td::node_numel<Plan>(state, N);
        if constexpr (requires { op::device_source; }) {
            // the op's own kernel: it fills the parameter words and says how many elements the
            // grid covers; an op that checks ids gets a flag (the first bad position, or ~0)
            std::uint64_t w[128] = {};
            std::array<td::tensor_ref, node::children::size> in{};
            for (std::size_t k = 0; k < in.size(); ++k) in[k] = ref(k);
            void* flag = base_ + flag_;
            constexpr bool checks = requires { op::template device_check<node>(in.data(), std::size_t{}, nullptr); };
            if constexpr (checks) {
                const std::uint64_t none = ~std::uint64_t{0};
                copy_to_device(flag, &none, sizeof none);
            }
            const std::size_t threads = op::template device_words<node>(in.data(), out, ext, w, flag);
            if (threads) launch(m.node_kernel[N], grid_for(threads), 1, w);
            if constexpr (checks) {
                std::uint64_t bad = 0;
                copy_to_host(&bad, flag, sizeof bad);
                if (bad != ~std::uint64_t{0}) op::template device_check<node>(in.data(), std::size_t(bad), &copy_to_host);
            }
        } else if constexpr (is_matmul_v<op>) {
            run_matmul<S>(m, ref(0), ref(1), static_cast<S*>(out), ext, node::shape_type::rank == 3);
        } else if constexpr (is_cast_v<op>) {
            using From = compute_t<typename td::type_at_t<0, typename node::children>::value_type>;
            const td::tensor_ref x = ref(0);
            const std::size_t fn = std::is_same_v<From, float> ? (std::is_same_v<T, float> ? gather_f32_f32 : gather_f32_f64)
                                                               : (std::is_same_v<T, float> ? gather_f64_f32 : gather_f64_f64);
            gather(m, fn, x.data, out, n, x.rank, ext, x.stride);
        } else if constexpr (td::custom_kernel_info<node>::is_custom) {
            // the op's kernel: operands as in emit_custom; a grid covering the largest operand
            std::uint64_t w[16] = {};
            std::size_t word = 0, most = n;
            auto numel = [](const td::tensor_ref& r) {
                std::size_t e = 1;
                for (std::size_t a = 0; a < r.rank; ++a) e *= r.ext[a];
                return e;
            };
            auto put = [&](const void* p, std::size_t count) {
                w[word++] = reinterpret_cast<std::uintptr_t>(p);
                w[word++] = count;
                most = count > most ? count : most;
            };
            if constexpr (td::custom_kernel_info<node>::backward) {
                zero_on_device(out, n * sizeof(T));  // the packed input gradients
                put(ref(0).data, numel(ref(0)));
                put(ref(1).data, numel(ref(1)));
                std::size_t offset = 0;
                for (std::size_t k = 2; k < info[N].arity; ++k) {
                    put(ref(k).data, numel(ref(k)));
                    w[word++] = reinterpret_cast<std::uintptr_t>(static_cast<T*>(out) + offset);
                    offset += numel(ref(k));
                }
            } else {
                put(out, n);
                for (std::size_t k = 0; k < info[N].arity; ++k) put(ref(k).data, numel(ref(k)));
            }
            if (most) launch(m.custom[N], grid_for(most), 1, w);
        } else {
            static_assert(td::always_false<node>, "typegrad: cuda: internal: kernel op without a device path");
        }
    }

    std::array<std::size_t, Plan::M + 1> offset_{};
    std::array<double, Plan::M + 1> meta_{};
    loop_launches loops_;
    std::vector<std::uint64_t> words_;
    std::size_t flag_ = 0, extra_ = 0, total_ = 0;
    char* base_ = nullptr;
};

// The arena of value_and_grad and backward calls: per plan and thread, grown on demand, so
// steady-state calls allocate nothing.
template <class Plan>
device_buffer& thread_arena() {
    thread_local device_buffer arena;
    return arena;
}

}  // namespace typegrad::cuda::detail
