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
//
// The parts: exec/cuda/plan_view.hpp (what is read of a plan), launch.hpp (groups and parameter
// words), prelude.hpp (the text every module starts with); this header emits the kernels.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include <typegrad/exec/cuda/launch.hpp>
#include <typegrad/exec/cuda/plan_view.hpp>
#include <typegrad/exec/cuda/prelude.hpp>

namespace typegrad::cuda::detail {

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

// The host twin of a generated entry point (the prelude's TG_HOST_ENTRY: empty unless the module
// is compiled for the emulation of the device path).
inline std::string host_entry(const std::string& name, const std::string& args) {
    return "TG_HOST_ENTRY(" + name + ", " + args + ")\n";
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
    s += host_entry(name, args) + "\n";
}

// The whole module of a plan: the prelude, one kernel per loop group, one per kernel op's node.
inline std::string generate_source(const plan_view& pv) {
    std::string s = prelude();
    for (std::size_t L = 0; L < pv.loop_count; ++L) {
        const auto groups = loop_groups(pv, L);
        for (std::size_t gi = 0; gi < groups.size(); ++gi) emit_group(s, pv, groups[gi], gi);
    }
    std::vector<std::string_view> emitted;  // each op's templates once, whatever its parameters
    for (std::size_t n = 0; n < pv.node_count; ++n) {
        const node_kernel_text& k = pv.kernel[n];
        if (k.call.empty()) continue;
        if (k.shared != nullptr && std::find(emitted.begin(), emitted.end(), std::string_view(k.shared)) == emitted.end()) {
            emitted.push_back(k.shared);
            s += std::string("// kernel op ") + std::string(pv.info[n].name) + "\n" + k.shared + "\n";
        }
        s += k.definition;
        s += "TG_ENTRY(" + node_kernel_name(n) + ", tg_node_args, " + k.call + "(p))\n";
    }
    return s;
}
template <class Plan>
std::string generate_source() {
    return generate_source(view_of<Plan>());
}

}  // namespace typegrad::cuda::detail
