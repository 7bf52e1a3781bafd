#pragma once
// Runs a plan on the device: the host computes shapes and checks everything (the same code as
// the CPU path: exec/execute.hpp), lays out one device arena, then launches the plan's kernels
// in schedule order on the legacy default stream: generated loop kernels, and each kernel op's
// device path, carried beside its CPU run (core/device_kernel.hpp): its own kernel (embedding,
// one_hot, cast, ...) or host code on the backend's primitives (matmul: cuBLAS; custom ops).
#include <algorithm>
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

namespace typegrad::cuda::detail {

// ---- which nodes the device can run --------------------------------------------------------
// An elementwise node needs its op's device expression; a kernel node its op's device path (its
// own kernel or device_run, core/device_kernel.hpp); any op's check_device says what its device
// path cannot do.
template <class N>
constexpr void check_node_on_device() {
    if constexpr (requires { N::op::template check_device<N>(); }) N::op::template check_device<N>();
    if constexpr (N::kind == op_kind::elementwise) {
        static_assert(op_device_expr<typename N::op>::value != nullptr,
                      "typegrad: cuda: an elementwise op of this graph has no device expression. An elementwise "
                      "hook runs on the device only when its function object declares one, e.g. "
                      "`static constexpr const char* device = \"{0} + (T)10\";` (docs/cuda.md)");
    } else if constexpr (N::kind == op_kind::kernel) {
        static_assert(has_device_kernel<N> || has_device_run<N> || requires { N::op::template check_device<N>(); },
                      "typegrad: cuda: this graph has a kernel op with no device implementation (tensor hooks, "
                      "which take a host tg::grad_view, are one); evaluate it with host bindings (docs/cuda.md)");
    }
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
    gather_f32, gather_f64, gather_b16, prelude_fn_count
};
inline constexpr const char* prelude_names[prelude_fn_count] = {
    "tg_finish_sum_f32", "tg_finish_max_f32", "tg_finish_min_f32", "tg_finish_prod_f32",
    "tg_finish_sum_f64", "tg_finish_max_f64", "tg_finish_min_f64", "tg_finish_prod_f64",
    "tg_gather_f32", "tg_gather_f64", "tg_gather_b16"};

struct compiled_module {
    CUmodule module = nullptr;
    std::vector<std::vector<group_desc>> groups;       // [loop][group]
    std::vector<std::vector<CUfunction>> functions;    // [loop][group]
    std::array<CUfunction, prelude_fn_count> prelude{};
    std::vector<CUfunction> node_kernel;               // [node]: a kernel op's own kernel, or null
};

// The virtual architecture NVRTC targets for the device in use.
inline const std::string& device_architecture() {
    static const std::string arch = [] {
        const device_info& d = device_state();
        if (!d.usable) typegrad::detail::fail<device_error>({"typegrad: cuda: ", d.failure});
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
    c.node_kernel.assign(Plan::M, nullptr);
    for (std::size_t n = 0; n < Plan::M; ++n)
        if (!pv.kernel[n].call.empty()) c.node_kernel[n] = get(node_kernel_name(n));
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
    return std::is_same_v<T, float> ? gather_f32 : std::is_same_v<T, double> ? gather_f64 : gather_b16;
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

// What a kernel op's device_run drives (core/device_kernel.hpp): cuBLAS, memset, dense copies
// and the node's own kernel.
struct node_device {
    const compiled_module& m;
    CUfunction kernel;  // the node's own kernel, or null

    void zero(void* p, std::size_t bytes) { zero_on_device(p, bytes); }
    // Temporary device memory for this node's launches, valid until the next node's call: a
    // per-thread buffer that grows on demand (freeing the old one waits for the device), so
    // steady-state steps allocate nothing. Launches are stream-ordered, so the next node's
    // kernels run after this node's have read it.
    void* scratch(std::size_t bytes) {
        thread_local device_buffer buffer;
        buffer.reserve(bytes);
        return buffer.data();
    }
    void launch(std::uint64_t* words, std::size_t threads) { detail::launch(kernel, grid_for(threads), 1, words); }
    // A dense row-major copy of a strided operand into `into` (device memory of its size, from
    // scratch: nothing is allocated).
    template <class S>
    const S* dense_copy(const td::tensor_ref& r, void* into) {
        std::size_t numel = 1;
        for (std::size_t a = 0; a < r.rank; ++a) numel *= r.ext[a];
        gather(m, gather_fn<S>(), r.data, into, numel, r.rank, r.ext, r.stride);
        return static_cast<const S*>(into);
    }
    // C = op(A) op(B), column-major, strided batched (cublas<t>gemmStridedBatched, alpha 1, beta
    // 0); bf16/f16 operands accumulate in f32 and round the product once.
    template <class S>
    void gemm(bool ta, bool tb, int m_, int n_, int k_, const S* a, int lda, long long sa, const S* b, int ldb,
              long long sb, S* c, int ldc, long long sc, int batch) {
        if (emulator* e = active_emulator())
            return e->gemm(std::is_same_v<S, double> ? gemm_type::f64 : std::is_same_v<S, bf16> ? gemm_type::bf16
                           : std::is_same_v<S, f16> ? gemm_type::f16 : gemm_type::f32,
                           ta, tb, m_, n_, k_, a, lda, sa, b, ldb, sb, c, ldc, sc, batch);
        cublasHandle_t h = blas_handle();
        const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
        if constexpr (is_reduced_precision_v<S>) {
            const float one = 1, zero = 0;
            const cudaDataType_t dt = std::is_same_v<S, bf16> ? CUDA_R_16BF : CUDA_R_16F;
            check_cublas(cublasGemmStridedBatchedEx(h, opa, opb, m_, n_, k_, &one, a, dt, lda, sa, b, dt, ldb, sb, &zero, c, dt,
                                                    ldc, sc, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                         "cublasGemmStridedBatchedEx");
        } else if constexpr (std::is_same_v<S, float>) {
            const S one = 1, zero = 0;
            check_cublas(cublasSgemmStridedBatched(h, opa, opb, m_, n_, k_, &one, a, lda, sa, b, ldb, sb, &zero, c, ldc, sc, batch),
                         "cublasSgemmStridedBatched");
        } else {
            const S one = 1, zero = 0;
            check_cublas(cublasDgemmStridedBatched(h, opa, opb, m_, n_, k_, &one, a, lda, sa, b, ldb, sb, &zero, c, ldc, sc, batch),
                         "cublasDgemmStridedBatched");
        }
    }
};

// The shape pass of a device call. A kernel op's extents() checks its operands' values when the
// host can read them (embedding's ids, before anything runs); device memory is not readable from
// the host, so the pass sees no values and the op's kernel checks them (run_kernel's flag). The
// values a shape depends on (narrow's length, a leaf) are copied to the host for the pass: one
// element each, as PyTorch's .item().
template <class Plan>
void compute_device_shapes(typename Plan::state_type& state) {
    static constexpr auto& info = Plan::program::info;
    static constexpr bool reads_values = [] {
        for (std::size_t n = 0; n < Plan::M; ++n)
            if (info[n].shape_values != 0) return true;
        return false;
    }();
    const auto bound = state.ptr;
    state.ptr.fill(nullptr);
    std::array<std::uint64_t, reads_values ? Plan::M : 1> staged;  // only the staged leaves' slots are read
    for (std::size_t n = 0; reads_values && n < Plan::M; ++n) {
        if (info[n].shape_values == 0) continue;
        for (std::size_t k = 0; k < info[n].arity; ++k) {
            const std::size_t c = info[n].child[k];
            if (!(info[n].shape_values >> k & 1u) || info[c].kind != op_kind::leaf || bound[c] == nullptr) continue;
            const std::size_t* ext = state.ext.data() + Plan::rank_offset[c];
            if (std::find(ext, ext + info[c].rank, std::size_t(0)) != ext + info[c].rank) continue;  // no element
            copy_to_host(&staged[c], bound[c], info[c].elem_size);
            state.ptr[c] = &staged[c];
        }
    }
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
        std::array<td::tensor_ref, node::children::size> in{};
        for (std::size_t k = 0; k < in.size(); ++k) in[k] = td::ref_of<Plan>(state, info[N].child[k]);
        void* out = const_cast<void*>(state.ptr[N]);
        const std::size_t* ext = state.ext.data() + Plan::rank_offset[N];
        if constexpr (has_device_run<node>) {
            // host code on the backend's primitives (matmul: cuBLAS; conv: its passes around
            // cuBLAS; custom ops: their own kernel)
            node_device dev{m, m.node_kernel[N]};
            op::template device_run<node>(in.data(), out, ext, dev);
        } else {
            // the op's own kernel: it fills the parameter words and says how many elements the
            // grid covers; an op that checks ids gets a flag (the first bad position, or ~0)
            static_assert(has_device_kernel<node>, "typegrad: cuda: internal: kernel op without a device path");
            std::uint64_t w[td::device_node_words] = {};
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
