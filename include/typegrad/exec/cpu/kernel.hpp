#pragma once
// One fused loop of a plan: loads of materialised values, the elementwise body as straight-line
// code over an array of SIMD values, reductions and stores, all in one pass. The iteration
// space is coalesced at compile time (adjacent axes that every operand reads the same way are
// merged), the innermost axis runs over xsimd batches (its tail as one partial batch), and
// operands that are broadcast along it are loaded once per row. The outer axes are walked by one
// function for every loop (walk_rows), which hands each kernel runs of rows: a kernel holds
// only its row code.
#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cmath>
#include <limits>
#include <utility>

#include <typegrad/core/cpu/buffer_pool.hpp>
#include <typegrad/core/cpu/simd.hpp>
#include <typegrad/core/cpu/thread_pool.hpp>
#include <typegrad/exec/program.hpp>
#include <typegrad/exec/state.hpp>
#include <typegrad/ops/reduce_kind.hpp>

namespace typegrad::detail {

// Which stores add to their destination rather than overwrite it (grad_into(..., tg::accumulate)),
// one bit per store in 64-bit words: a template argument (a type) of the loops that write them.
// A type with integer arguments, not a class-type value: clang's cost for a 16-word array value
// in every loop's template arguments was 5x the compile time and 20x the memory.
template <std::uint64_t... Words>
struct grad_mask {
    static constexpr bool test(std::size_t i) {
        constexpr std::uint64_t words[] = {Words..., 0};
        return i / 64 < sizeof...(Words) && ((words[i / 64] >> (i % 64)) & 1u);
    }
};

template <reduce_kind K, class V>
inline V reduce_combine(const V& a, const V& b) {
    if constexpr (K == reduce_kind::sum) return a + b;
    else if constexpr (K == reduce_kind::max) return simd::max(a, b);
    else if constexpr (K == reduce_kind::min) return simd::min(a, b);
    else return a * b;
}
template <reduce_kind K, class T, class A>
inline T reduce_lanes(const xsimd::batch<T, A>& v) {
    if constexpr (K == reduce_kind::sum) return simd::reduce_sum(v);
    else if constexpr (K == reduce_kind::max) return simd::reduce_max(v);
    else if constexpr (K == reduce_kind::min) return -simd::reduce_max(-v);
    else return simd::reduce_prod(v);
}

// Anomaly mode: the first node (in evaluation order) whose value is not finite.
inline constexpr std::size_t no_anomaly = static_cast<std::size_t>(-1);
inline std::size_t& anomaly_node() {
    thread_local std::size_t node = no_anomaly;
    return node;
}
template <class V>
inline void note_nonfinite(const V& v, std::size_t node) {
    bool bad;
    if constexpr (simd::is_batch_v<V>) bad = xsimd::any(!xsimd::isfinite(v));
    else bad = !std::isfinite(v);
    if (bad && anomaly_node() == no_anomaly) anomaly_node() = node;
}

// 0, 1, ..., W - 1: a batch of lane numbers (a loop's tail masks the lanes past its end).
template <class T>
inline constexpr auto lane_index = [] {
    std::array<T, simd::width<T>> r{};
    for (std::size_t l = 0; l < r.size(); ++l) r[l] = T(l);
    return r;
}();

// Body node: its op, storage dtype, node id (anomaly mode only, for the report), its value's
// slot and its operands' slots.
template <class Op, class D, std::size_t Id, std::size_t Out, class Slots>
struct loop_instr {};

// One fused-loop node: v[Out] = Op(v[Cs]...), rounded to the node's storage dtype when that is
// bf16/f16. This and the other per-operand steps below are free functions whose names hold only
// what they depend on (op, dtypes, slot numbers), never the loop's signature: g++ mangles every
// function it instantiates, and as members of loop_kernel these were thousands of names of 1-7 KB
// each (a 4-block model: 4,000 names, 4.3 MB, most of its callgraph time).
template <bool Check, class Values, class Op, class D, std::size_t Id, std::size_t Out, std::size_t... Cs>
[[gnu::always_inline]] inline void eval_instr(Values& v, loop_instr<Op, D, Id, Out, std::index_sequence<Cs...>>) {
    if constexpr (is_reduced_precision_v<D>) v[Out] = simd::round_as<D>(Op::apply(v[Cs]...));
    else v[Out] = Op::apply(v[Cs]...);
    if constexpr (Check) note_nonfinite(v[Out], Id);
}
// A bf16/f16 value held in a float buffer (a reduction) is rounded when read.
template <class Val, class Buf, class V>
[[gnu::always_inline]] inline V loop_loaded(const V& x) {
    if constexpr (is_reduced_precision_v<Val> && !std::is_same_v<Val, Buf>) return simd::round_as<Val>(x);
    else return x;
}

// ---- a loop's signature ---------------------------------------------------------------------
// A loop kernel is instantiated from what its code depends on, numbered locally: its compute
// type, its operands' buffer and value types, its body (op, dtype, operand slots per node) and a
// flat list of integers (counts, operand flags, ranks, broadcast masks, reduction kinds, source
// slots). Never from the plan or the graph: a name that spells the graph makes every loop's
// symbol O(N) long (quadratic symbol text; a 4-block model spent 95% of its compile mangling),
// and equal loops of different blocks or graphs now share one function. The node ids it reads
// and writes come at run time (loop_args).

// Where a loop's operands live at run time.
struct loop_args {
    const void* const* ptr;         // materialised node buffers, by node id
    void* const* out;               // store destinations, by store index
    const std::size_t* ext;         // run-time extents (exec_state::ext)
    const std::ptrdiff_t* stride;   // element strides of materialised nodes (exec_state::stride)
    const std::size_t* node;        // per operand: node id (stores: store index)
    const std::size_t* offset;      // per operand: start of its extents; [n_ops]: the iteration node's
};

namespace loop_desc {
// The integer list: a header, then 4 words per operand, 2 per reduction, 1 per
// materialisation, 2 per store. The header's `select` word: 0, or 1 + the slot of a condition
// that is the same along every row (computed from inputs broadcast along the innermost axis and
// constants) and that a where of the body selects on: the loop then resolves that where once
// per row (loop_kernel).
inline constexpr std::size_t iter_rank = 0, n_in = 1, n_body = 2, n_red = 3, n_mat = 4, n_store = 5, select = 6,
                             header = 7;
inline constexpr std::size_t flag_view = 1, flag_constant = 2;
// A reduction's first word: its kind (these bits).
inline constexpr std::size_t red_kind_bits = 3;
}  // namespace loop_desc

// ---- a loop on several threads ------------------------------------------------------------
// A loop runs as tasks, each a range of rows (iterations of the outer axes) or a range of the
// innermost axis cut at multiples of the SIMD width (so every element takes the same vector or
// scalar path as in one pass). A reduction whose element several tasks would accumulate into
// (one broadcast along the axes that are cut: a loss, a bias gradient's column sums) decides the
// cut:
//  - rows or columns: when no reduction is shared across them; every element is then computed
//    and accumulated by one task, in the order of one pass;
//  - blocks: the rows (or a single row's columns) cut into blocks, each block accumulating the
//    shared reductions into its own copy of their buffers (from the buffer pool), and the copies
//    combined into the result in block order afterwards. The blocks depend on the loop's extents
//    only: one thread computes the same blocks in the same order.
// So a loop's results are bitwise the same on any number of threads.
// (Thresholds: parallel_min_work and parallel_task_work, core/cpu/thread_pool.hpp.)
inline constexpr std::size_t loop_block = std::size_t(1) << 13;          // elements per block, at least
inline constexpr std::size_t loop_max_blocks = 64;
inline constexpr std::size_t loop_block_copies = std::size_t(1) << 20;   // elements of all blocks' copies, at most

struct loop_split {
    std::size_t tasks = 1, rows = 0, cols = 0;  // task count; rows (row cut) or columns per task
    std::size_t threads = 1;
    bool by_rows = true, blocks = false;
};

// What a loop's signature says (loop_kernel): some reduction shared by the rows (broadcast along
// an outer axis), some shared by the columns (broadcast along the innermost axis); serial:
// anomaly mode (its first-bad-node record is per thread).
struct loop_traits {
    bool row_shared, col_shared, serial;
};
// cost: operations per element; shared_elements: the row-shared reductions' buffer sizes, summed.
// Writes the split into s (a loop's context: returned by value, it was copied there through a
// 32-byte register whose load waited for the callee's narrower stores, a store-forwarding stall).
// The traits come as three arguments: as one struct, run_loop built them in memory a byte at a
// time and passed them as one 4-byte load of those stores (a store-forwarding stall: most of
// run_loop's samples in a 16-element call).
[[gnu::noinline]] inline void split_loop_into(loop_split& s, std::size_t outer, std::size_t inner, std::size_t width,
                                              std::size_t cost, bool row_shared, bool col_shared, bool serial,
                                              std::size_t shared_elements) {
    const loop_traits lt{row_shared, col_shared, serial};
    s = loop_split{};
    s.rows = outer;
    s.cols = inner;
    if (outer == 1 && lt.col_shared && inner > loop_block) {
        std::size_t per = std::max(loop_block, (inner + loop_max_blocks - 1) / loop_max_blocks);
        per = (per + width - 1) / width * width;
        s.by_rows = false;
        s.cols = per;
        s.tasks = (inner + per - 1) / per;
        s.blocks = true;
    } else if (outer > 1 && lt.row_shared && (lt.col_shared || inner < 8 * width) && outer * inner > loop_block) {
        // (column sums over long rows are cut into columns instead, without copies)
        const std::size_t most = std::min(loop_max_blocks, loop_block_copies / std::max<std::size_t>(shared_elements, 1));
        if (most >= 2) {
            s.rows = std::max((loop_block + inner - 1) / inner, (outer + most - 1) / most);
            s.tasks = (outer + s.rows - 1) / s.rows;
            s.blocks = s.tasks > 1;
            if (!s.blocks) s.rows = outer;
        }
    }
    const std::size_t work = outer * inner * cost;
    if (lt.serial || work < parallel_min_work) return;
    const std::size_t threads = num_threads();
    if (threads <= 1) return;
    if (s.blocks) {
        s.threads = threads;
        return;
    }
    const std::size_t want = parallel_tasks(outer * inner, work, threads);
    const bool rows_ok = outer >= 2 && !lt.row_shared, cols_ok = inner >= 2 * width && !lt.col_shared;
    if (rows_ok && (outer >= want || !cols_ok)) {
        const std::size_t tasks = std::min(want, outer);
        s.rows = (outer + tasks - 1) / tasks;
        s.tasks = (outer + s.rows - 1) / s.rows;
        s.threads = threads;
    } else if (cols_ok) {
        s.by_rows = false;
        s.cols = ((inner + want - 1) / want + width - 1) / width * width;
        s.tasks = (inner + s.cols - 1) / s.cols;
        s.threads = threads;
    }
}
// The same, returned (tests and one-off callers).
inline loop_split split_loop(std::size_t outer, std::size_t inner, std::size_t width, std::size_t cost,
                             loop_traits lt, std::size_t shared_elements) {
    loop_split s;
    split_loop_into(s, outer, inner, width, cost, lt.row_shared, lt.col_shared, lt.serial, shared_elements);
    return s;
}

// Runs call(ctx, t) for t < tasks, on the shared pool when threads > 1. One function for every
// loop kernel: each kernel passes its task through a plain function pointer.
[[gnu::noinline]] inline void run_loop_tasks(std::size_t tasks, std::size_t threads, void (*call)(const void*, std::size_t),
                           const void* ctx) {
    if (threads <= 1 || tasks <= 1) {
        for (std::size_t t = 0; t < tasks; ++t) call(ctx, t);
        return;
    }
    default_thread_pool().run(tasks, threads, call, ctx);
}

// What a loop kernel tells the driver below about its reductions (at most loop_max_reductions;
// a loop with more runs on one thread): which ones several rows or several elements of a row
// accumulate into (bit r), their kinds (2 bits each) and their buffers' ranks (4 bits each).
// Packed into words, so that a kernel passes it as a few immediate values.
inline constexpr std::size_t loop_max_reductions = 32;
struct loop_reductions {
    std::size_t count = 0, first = 0;  // how many; the first one's operand index
    std::uint64_t row_shared = 0, col_shared = 0, kinds = 0;
    std::array<std::uint64_t, 2> ranks{};
    constexpr reduce_kind kind(std::size_t r) const { return static_cast<reduce_kind>((kinds >> (2 * r)) & 3u); }
    constexpr std::size_t rank(std::size_t r) const { return (ranks[r / 16] >> (4 * (r % 16))) & 15u; }
};
static_assert(max_rank < 16, "typegrad: internal: loop_reductions packs a rank into 4 bits");
inline constexpr std::size_t no_block_copy = static_cast<std::size_t>(-1);

// What the row walk (walk_rows) needs of one operand of a loop: its buffer's rank and element
// size, the iteration axes it is broadcast along (bit per axis), and where its strides come from.
struct loop_operand {
    std::uint32_t rank = 0, elem_size = 0;
    std::uint64_t broadcast = 0;
    bool input = false, view = false;
    bool constant = false;  // a compile-time constant: the kernel has its value, the walk skips it
};
// One run of a loop's rows, handed to the kernel's row code: every operand's address at the
// first row (bytes), how far the next row is (bytes), the rows' count and their elements
// [j0, j1); inputs' element strides along the row (views; 1 otherwise).
struct row_run {
    const loop_args* a;
    char* const* ptr;
    const std::ptrdiff_t* next;
    const std::ptrdiff_t* inner_stride;
    std::size_t rows, j0, j1;
};
// A loop kernel's shape for the walk: counts, the last iteration axis of each coalesced axis
// group (a group's stride is its last axis's), its operands, and the code for a run of rows.
struct loop_walk {
    std::size_t n_in = 0, n_red = 0, n_mat = 0, n_ops = 0, iter_rank = 0, groups = 1, value_size = 0;
    std::array<std::size_t, max_rank> last{};
    const loop_operand* op = nullptr;
    void (*rows)(const row_run&) = nullptr;
};

// A loop's run-time state, shared by its tasks (walk_rows reads it).
struct loop_context {
    const loop_walk* walk = nullptr;
    const loop_args* a = nullptr;
    // Not zeroed (each call wrote 73 words, a `rep stos` that was a third of a one-batch loop's
    // set-up): gext is written for the loop's groups, copy_at and numel for its reductions, before
    // anything reads them.
    std::array<std::size_t, max_rank + 1> gext;  // extents of the coalesced axis groups
    std::size_t outer = 1, inner = 1;
    loop_split split;
    void* copies = nullptr;  // blocks: every block's copies of the shared reductions
    std::size_t copies_per_block = 0;
    std::array<std::size_t, loop_max_reductions> copy_at, numel;  // per reduction (no_block_copy: none)
};

// reduce_identity and reduce_combine for a kind known at run time (the driver's copies).
template <class T>
inline void fill_identity(T* p, std::size_t n, reduce_kind k) {
    switch (k) {
        case reduce_kind::sum: std::fill(p, p + n, reduce_identity<T, reduce_kind::sum>()); break;
        case reduce_kind::max: std::fill(p, p + n, reduce_identity<T, reduce_kind::max>()); break;
        case reduce_kind::min: std::fill(p, p + n, reduce_identity<T, reduce_kind::min>()); break;
        case reduce_kind::prod: std::fill(p, p + n, reduce_identity<T, reduce_kind::prod>()); break;
    }
}
template <class T>
inline void combine_into(T* p, const T* q, std::size_t n, reduce_kind k) {
    auto each = [&]<reduce_kind K>() {
        for (std::size_t e = 0; e < n; ++e) p[e] = reduce_combine<K>(p[e], q[e]);
    };
    switch (k) {
        case reduce_kind::sum: each.template operator()<reduce_kind::sum>(); break;
        case reduce_kind::max: each.template operator()<reduce_kind::max>(); break;
        case reduce_kind::min: each.template operator()<reduce_kind::min>(); break;
        case reduce_kind::prod: each.template operator()<reduce_kind::prod>(); break;
    }
}

// Splits a loop (split_loop) and runs its tasks, range(&c, t); a cut into blocks gives every
// block its copies of the shared reductions, filled with their identities, then combines them
// into the reductions' buffers in block order. One function per element type, not per loop.
// (outer and inner come as arguments too: read back from c right after the caller's stores, the
// pair was one 16-byte load that waited for both, a store-forwarding stall.)
template <class T>
[[gnu::noinline]] void run_loop(loop_context& c, std::size_t outer, std::size_t inner, const loop_reductions& rt,
                                std::size_t width, std::size_t cost, bool serial,
                                void (*range)(const void*, std::size_t)) {
    const loop_args& a = *c.a;
    if (rt.count > loop_max_reductions) {
        c.split.rows = outer, c.split.cols = inner;
        return range(&c, 0);
    }
    std::size_t shared_elements = 0;
    for (std::size_t r = 0; r < rt.count; ++r) {
        std::size_t n = 1;
        for (std::size_t k = 0; k < rt.rank(r); ++k) n *= a.ext[a.offset[rt.first + r] + k];
        c.numel[r] = n;
        if ((rt.row_shared >> r) & 1u) shared_elements += n;
    }
    split_loop_into(c.split, outer, inner, width, cost, rt.row_shared != 0, rt.col_shared != 0, serial,
                    shared_elements);
    if (!c.split.blocks) return run_loop_tasks(c.split.tasks, c.split.threads, range, &c);
    const bool rows = c.split.by_rows;
    for (std::size_t r = 0; r < rt.count; ++r) {
        const bool shared = (((rows ? rt.row_shared : rt.col_shared) >> r) & 1u) != 0;
        if (!rows) c.numel[r] = 1;  // a single row: a reduction along it is one element
        c.copy_at[r] = shared ? c.copies_per_block : no_block_copy;
        if (shared) c.copies_per_block += c.numel[r];
    }
    const pooled_buffer<T> copies(c.split.tasks * c.copies_per_block);
    for (std::size_t b = 0; b < c.split.tasks; ++b)
        for (std::size_t r = 0; r < rt.count; ++r)
            if (c.copy_at[r] != no_block_copy)
                fill_identity(copies.data() + b * c.copies_per_block + c.copy_at[r], c.numel[r], rt.kind(r));
    c.copies = copies.data();
    run_loop_tasks(c.split.tasks, c.split.threads, range, &c);
    for (std::size_t r = 0; r < rt.count; ++r) {
        if (c.copy_at[r] == no_block_copy) continue;
        T* p = static_cast<T*>(const_cast<void*>(a.ptr[a.node[rt.first + r]]));
        for (std::size_t b = 0; b < c.split.tasks; ++b)
            combine_into(p, copies.data() + b * c.copies_per_block + c.copy_at[r], c.numel[r], rt.kind(r));
    }
}

// Task t of a loop (split_loop): its rows [r0, r1) or its elements [j0, j1) of every row; in a
// cut into blocks, the shared reductions accumulate into the block's copies. Walks the outer
// axis groups and hands the kernel's row code one run of rows at a time (along the last outer
// group). One function for every loop: the kernels hold only their row code.
[[gnu::noinline]] inline void walk_rows(const void* context, std::size_t t) {
    const loop_context& c = *static_cast<const loop_context*>(context);
    const loop_walk& w = *c.walk;
    const loop_args& a = *c.a;
    const std::size_t G = w.groups, n = w.n_ops;
    const loop_split& sp = c.split;
    std::size_t r0 = 0, r1 = c.outer, j0 = 0, j1 = c.inner;
    if (sp.by_rows) r0 = t * sp.rows, r1 = std::min(c.outer, r0 + sp.rows);
    else j0 = t * sp.cols, j1 = std::min(c.inner, j0 + sp.cols);
    // Byte strides per operand and group (stride[o * G + g]): inputs use their node's strides
    // (views may be anything), outputs are dense row-major buffers of their own shape.
    // One stack block (all three element types are 8 bytes): stride[n * G], inner_stride[n],
    // next[n], ptr[n], and idx[G], the row's mixed-radix index (below).
    static_assert(sizeof(std::ptrdiff_t) == sizeof(char*) && sizeof(std::size_t) == sizeof(char*));
    char* const block = static_cast<char*>(__builtin_alloca(sizeof(char*) * (n * G + 3 * n + G + 1)));
    auto* const stride = reinterpret_cast<std::ptrdiff_t*>(block);
    std::ptrdiff_t* const inner_stride = stride + n * G;
    std::ptrdiff_t* const next = inner_stride + n;
    auto** const ptr = reinterpret_cast<char**>(next + n);
    auto* const idx = reinterpret_cast<std::size_t*>(ptr + n);
    for (std::size_t o = 0; o < n; ++o) {
        const loop_operand& op = w.op[o];
        if (op.constant) {  // no buffer: nothing moves along any axis
            ptr[o] = nullptr, next[o] = 0, inner_stride[o] = 1;
            for (std::size_t g = 0; g < G; ++g) stride[o * G + g] = 0;
            continue;
        }
        const std::size_t lead = w.iter_rank - op.rank;
        if (o < w.n_in + w.n_red + w.n_mat) ptr[o] = static_cast<char*>(const_cast<void*>(a.ptr[a.node[o]]));
        else ptr[o] = static_cast<char*>(a.out[a.node[o]]);
        if (G == 1) {  // one row (most loops): only a view's stride along it is needed
            next[o] = 0;
            inner_stride[o] = 1;
            const std::size_t x = w.last[0];
            if (op.view && w.iter_rank > 0 && !((op.broadcast >> x) & 1u)) inner_stride[o] = a.stride[a.offset[o] + (x - lead)];
            continue;
        }
        for (std::size_t g = 0; g < G; ++g) {
            std::ptrdiff_t s = 0;
            const std::size_t x = w.last[g];
            if (w.iter_rank > 0 && !((op.broadcast >> x) & 1u)) {
                if (op.input) {
                    s = a.stride[a.offset[o] + (x - lead)];
                } else {
                    s = 1;
                    for (std::size_t b = x + 1; b < w.iter_rank; ++b)
                        if (b >= lead) s *= static_cast<std::ptrdiff_t>(a.ext[a.offset[o] + (b - lead)]);
                }
            }
            stride[o * G + g] = s * std::ptrdiff_t(op.elem_size);
        }
        inner_stride[o] = op.view ? stride[o * G + G - 1] / std::ptrdiff_t(op.elem_size) : 1;
        next[o] = stride[o * G + G - 2];
    }
    if (sp.blocks)
        for (std::size_t r = 0; r < w.n_red; ++r)
            if (c.copy_at[r] != no_block_copy)
                ptr[w.n_in + r] = static_cast<char*>(c.copies) + (t * c.copies_per_block + c.copy_at[r]) * w.value_size;
    // The mixed-radix index of row r0 over the outer groups.
    for (std::size_t g = 0; g < G; ++g) idx[g] = 0;
    if (r0 != 0)
        for (std::size_t g = G - 1, rest = r0; g-- > 0; rest /= c.gext[g]) {
            idx[g] = rest % c.gext[g];
            for (std::size_t o = 0; o < n; ++o) ptr[o] += stride[o * G + g] * std::ptrdiff_t(idx[g]);
        }
    for (std::size_t r = r0; r < r1;) {
        // a run along the last outer group (one row when there is no outer group)
        const std::size_t count = G >= 2 ? std::min(r1 - r, c.gext[G - 2] - idx[G - 2]) : r1 - r;
        w.rows({&a, ptr, next, inner_stride, count, j0, j1});
        r += count;
        if (G < 2) break;
        idx[G - 2] += count;
        for (std::size_t o = 0; o < n; ++o) ptr[o] += next[o] * std::ptrdiff_t(count);
        // carry into the outer groups
        for (std::size_t g = G - 1; g-- > 0;) {
            if (idx[g] < c.gext[g]) break;
            for (std::size_t o = 0; o < n; ++o) ptr[o] -= stride[o * G + g] * std::ptrdiff_t(idx[g]);
            idx[g] = 0;
            if (g == 0) break;
            ++idx[g - 1];
            for (std::size_t o = 0; o < n; ++o) ptr[o] += stride[o * G + g - 1];
        }
    }
}

// A loop's code but for its body: everything that depends only on its signature's types and
// integers. Its functions are named without the body (a loop_instr per node), which for a loop
// of thousands of nodes is a name of 100 KB: g++ spent a third of a 1000-op chain's compile
// mangling the 70-odd functions, lambdas and constants that once were loop_kernel's. The body
// comes in as a function pointer that the always_inline chain from loop_kernel::rows makes a
// constant, so it is inlined as before.
template <class T, class Bufs, class Vals, class Desc, bool Check>
struct loop_code;

template <class T, class... Bufs, class... Vals, std::size_t... Desc, bool Check>
struct loop_code<T, type_list<Bufs...>, type_list<Vals...>, std::index_sequence<Desc...>, Check> {
    static constexpr std::array<std::size_t, sizeof...(Desc)> d{Desc...};
    using batch_t = simd::batch<T>;
    static constexpr std::size_t W = simd::width<T>;
    static constexpr std::size_t iter_rank = d[loop_desc::iter_rank];
    static constexpr std::size_t n_in = d[loop_desc::n_in];
    static constexpr std::size_t n_body = d[loop_desc::n_body];
    static constexpr std::size_t n_red = d[loop_desc::n_red];
    static constexpr std::size_t n_mat = d[loop_desc::n_mat];
    static constexpr std::size_t n_store = d[loop_desc::n_store];
    static constexpr std::size_t n_slots = n_in + n_body;
    static constexpr std::size_t n_out = n_red + n_mat + n_store;
    static constexpr std::size_t n_ops = n_in + n_out;  // operands with memory
    static constexpr std::size_t op_base = loop_desc::header;
    static constexpr std::size_t red_base = op_base + 4 * n_ops;
    static constexpr std::size_t mat_base = red_base + 2 * n_red;
    static constexpr std::size_t store_base = mat_base + n_mat;

    static constexpr bool is_view_input(std::size_t o) { return o < n_in && (d[op_base + 4 * o] & loop_desc::flag_view); }
    static constexpr bool is_constant(std::size_t o) { return d[op_base + 4 * o] & loop_desc::flag_constant; }
    static constexpr std::size_t operand_rank(std::size_t o) { return d[op_base + 4 * o + 1]; }
    static constexpr bool broadcast_axis(std::size_t o, std::size_t axis) {
        return iter_rank == 0 || ((d[op_base + 4 * o + 2] >> axis) & 1u);
    }
    // Views may be strided arbitrarily: loops reading one keep every axis apart. (A contiguous
    // view, a reshape of a dense value, is not flagged: its strides are dense, as a buffer's.)
    static constexpr bool reads_views = [] {
        for (std::size_t o = 0; o < n_in; ++o)
            if (is_view_input(o)) return true;
        return false;
    }();
    template <std::size_t O>
    using buf_t = type_at_t<O, type_list<Bufs...>>;
    template <std::size_t O>
    using val_t = type_at_t<O, type_list<Vals...>>;

    // Coalesced axis groups: group g covers iteration axes [first[g], last[g]].
    struct groups_t {
        std::size_t count = 0;
        std::array<std::size_t, max_rank> first{}, last{};
    };
    static constexpr groups_t groups = [] {
        groups_t g;
        if (iter_rank == 0) {
            g.count = 1;
            return g;
        }
        g.first[0] = 0;
        g.last[0] = 0;
        g.count = 1;
        for (std::size_t a = 1; a < iter_rank; ++a) {
            bool same = !reads_views;
            for (std::size_t o = 0; o < n_ops; ++o)
                if (broadcast_axis(o, a) != broadcast_axis(o, a - 1)) same = false;
            if (same) {
                g.last[g.count - 1] = a;
            } else {
                g.first[g.count] = g.last[g.count] = a;
                ++g.count;
            }
        }
        return g;
    }();
    static constexpr std::size_t G = groups.count;
    static constexpr bool inner_broadcast(std::size_t o) {
        return broadcast_axis(o, groups.first[G - 1]);
    }

    using values = std::array<batch_t, n_slots + 1>;
    using eval_fn = void (*)(values&);

    // Group extents.
    static std::array<std::size_t, G> group_extents(const loop_args& a) {
        const std::size_t* iter_ext = a.ext + a.offset[n_ops];
        std::array<std::size_t, G> gext{};
        for (std::size_t g = 0; g < G; ++g) {
            std::size_t e = 1;
            if constexpr (iter_rank > 0)
                for (std::size_t x = groups.first[g]; x <= groups.last[g]; ++x) e *= iter_ext[x];
            gext[g] = e;
        }
        return gext;
    }

    // The walk's view of the operands (walk_rows).
    static constexpr std::array<loop_operand, n_ops + 1> operands() {
        std::array<loop_operand, n_ops + 1> r{};
        constexpr std::array<std::size_t, n_ops + 1> sizes{sizeof(Bufs)..., 0};
        for (std::size_t o = 0; o < n_ops; ++o) {
            r[o].rank = static_cast<std::uint32_t>(operand_rank(o));
            r[o].elem_size = static_cast<std::uint32_t>(sizes[o]);
            for (std::size_t x = 0; x < iter_rank; ++x)
                if (broadcast_axis(o, x)) r[o].broadcast |= std::uint64_t(1) << x;
            r[o].input = o < n_in;
            r[o].view = is_view_input(o);
            r[o].constant = o < n_in && is_constant(o);
        }
        return r;
    }

    [[gnu::noinline]] static void run(const loop_args& a, void (*rows)(const row_run&)) {
        // locals, copied from constants at each call: no symbol per loop
        constexpr loop_reductions rt = reductions();
        constexpr std::array<loop_operand, n_ops + 1> ops = operands();
        loop_walk w;
        w.n_in = n_in, w.n_red = n_red, w.n_mat = n_mat, w.n_ops = n_ops, w.iter_rank = iter_rank, w.groups = G;
        w.value_size = sizeof(T);
        for (std::size_t g = 0; g < G; ++g) w.last[g] = groups.last[g];
        w.op = ops.data();
        w.rows = rows;
        loop_context c;
        c.walk = &w;
        c.a = &a;
        const std::array<std::size_t, G> gext = group_extents(a);
        for (std::size_t g = 0; g < G; ++g) c.gext[g] = gext[g];
        std::size_t outer = 1;
        for (std::size_t g = 0; g + 1 < G; ++g) outer *= gext[g];
        c.outer = outer, c.inner = gext[G - 1];
        run_loop<T>(c, outer, gext[G - 1], rt, W, n_body + n_ops, Check, &walk_rows);
    }

    // The slot of a condition the same along every row that a where selects on, or none
    // (loop_desc::select).
    static constexpr std::size_t no_select = ~std::size_t(0);
    static constexpr std::size_t select_slot = d[loop_desc::select] == 0 ? no_select : d[loop_desc::select] - 1;

    // A run of rows (walk_rows): the loop's code, compiled once for the loop and its tasks.
    // With a select resolved per row (select_slot), `cond` computes the row's uniform values from
    // its row constants, and the row runs `yes` where the condition is nonzero (for every lane:
    // it is one value), else `no`: the body with those wheres replaced by their chosen operand.
    // Each element gets the bits the select would have chosen, and a row of the common case runs
    // without the select and the branch it drops (prod's gradient: a division, not a division
    // beside a comparison and three selects).
    template <bool Select>
    [[gnu::always_inline]] static void rows(const row_run& rr, eval_fn yes, [[maybe_unused]] eval_fn cond,
                                            [[maybe_unused]] eval_fn no) {
        std::array<const void*, n_in + 1> in_ptr{};
        std::array<void*, n_out + 1> out_ptr{};
        std::array<std::ptrdiff_t, n_in + 1> inner_stride{};
        for (std::size_t i = 0; i < n_in; ++i) in_ptr[i] = rr.ptr[i], inner_stride[i] = rr.inner_stride[i];
        for (std::size_t k = 0; k < n_out; ++k) out_ptr[k] = rr.ptr[n_in + k];
        constexpr std::array<std::ptrdiff_t, n_ops + 1> off{};  // the pointers are the row's
        for (std::size_t r = 0; r < rr.rows; ++r) {
            if constexpr (Select) {
                values v;
                load_row_constants(v, in_ptr, off);
                cond(v);
                if (simd::is_zero(v[select_slot])) row(*rr.a, in_ptr, out_ptr, off, rr.j0, rr.j1, inner_stride, no);
                else row(*rr.a, in_ptr, out_ptr, off, rr.j0, rr.j1, inner_stride, yes);
            } else {
                row(*rr.a, in_ptr, out_ptr, off, rr.j0, rr.j1, inner_stride, yes);
            }
            for (std::size_t i = 0; i < n_in; ++i) in_ptr[i] = static_cast<const char*>(in_ptr[i]) + rr.next[i];
            for (std::size_t k = 0; k < n_out; ++k) out_ptr[k] = static_cast<char*>(out_ptr[k]) + rr.next[n_in + k];
        }
    }

    // The driver's view of the reductions (loop_reductions): which ones several rows, or
    // several elements of a row, accumulate into.
    static constexpr loop_reductions reductions() {
        loop_reductions rt;
        rt.count = n_red;
        rt.first = n_in;
        for (std::size_t r = 0; r < n_red && r < loop_max_reductions; ++r) {
            for (std::size_t g = 0; g + 1 < G; ++g)
                if (broadcast_axis(n_in + r, groups.first[g])) rt.row_shared |= std::uint64_t(1) << r;
            if (inner_broadcast(n_in + r)) rt.col_shared |= std::uint64_t(1) << r;
            rt.kinds |= std::uint64_t(d[red_base + 2 * r] & loop_desc::red_kind_bits) << (2 * r);
            rt.ranks[r / 16] |= std::uint64_t(operand_rank(n_in + r)) << (4 * (r % 16));
        }
        return rt;
    }

    // Elements [j0, j1) of one row.
    template <class InPtr, class OutPtr, class Off, class InnerStride>
    [[gnu::always_inline]] static void row(const loop_args& a, const InPtr& in_ptr, const OutPtr& out_ptr,
                                           const Off& off, std::size_t j0, std::size_t j1,
                                           const InnerStride& inner_stride, eval_fn eval) {
        values v;
        load_row_constants(v, in_ptr, off);
        std::array<batch_t, n_red + 1> acc;
        [&]<std::size_t... Rs>(std::index_sequence<Rs...>) {
            ((acc[Rs] = batch_t(reduce_identity<T, red_kind<Rs>()>())), ...);
        }(std::make_index_sequence<n_red>{});

        std::size_t j = j0;
        // One full batch at `at`; Chain > 0: the chained row reductions accumulate in chain_acc.
        auto step = [&]<std::size_t Chain>(std::size_t at, auto& chain_acc) __attribute__((always_inline)) {
            [&]<std::size_t... Is>(std::index_sequence<Is...>) {
                [[maybe_unused]] const int in_order[] = {0, (static_cast<void>(load_vector<Is>(a, v, in_ptr, off, at, inner_stride)), 0)...};
            }(std::make_index_sequence<n_in>{});
            eval(v);
            finish<Chain>(v, acc, chain_acc, out_ptr, off, at, W);
        };
        if constexpr (split_chains) {
            // four batches a step, each row reduction in four chains
            std::array<batch_t, n_red + 1> acc1 = acc, acc2 = acc, acc3 = acc;
            for (; j + 4 * W <= j1; j += 4 * W) {
                step.template operator()<0>(j, acc);
                step.template operator()<1>(j + W, acc1);
                step.template operator()<2>(j + 2 * W, acc2);
                step.template operator()<3>(j + 3 * W, acc3);
            }
            [&]<std::size_t... Rs>(std::index_sequence<Rs...>) {
                [[maybe_unused]] const int in_order[] = {0, (static_cast<void>(join_chains<Rs>(acc, acc1, acc2, acc3)), 0)...};
            }(std::make_index_sequence<n_red>{});
        }
        // One batch a step, then the tail (fewer than W elements) as one more batch: its lanes past
        // the row's end repeat the last element (so they compute what a real lane does: no
        // spurious NaN or Inf for anomaly mode) and their results are dropped or masked out. No
        // scalar copy of the body. (One loop for both, the tail as its last step, compiles 4% faster
        // but its per-step choice of loads and masks cost 15% in a light loop: normal_log_pdf.)
        for (; j + W <= j1; j += W) step.template operator()<0>(j, acc);
        if (j < j1) {
            const std::size_t m = j1 - j;
            [&]<std::size_t... Is>(std::index_sequence<Is...>) {
                [[maybe_unused]] const int in_order[] = {0, (static_cast<void>(load_tail<Is>(a, v, in_ptr, off, j, m, inner_stride)), 0)...};
            }(std::make_index_sequence<n_in>{});
            eval(v);
            finish<0>(v, acc, acc, out_ptr, off, j, m);
        }
        [&]<std::size_t... Rs>(std::index_sequence<Rs...>) {
            [[maybe_unused]] const int in_order[] = {0, (static_cast<void>(close_reduction<Rs>(acc, out_ptr, off)), 0)...};
        }(std::make_index_sequence<n_red>{});
    }

    template <std::size_t R_>
    static constexpr reduce_kind red_kind() {
        return static_cast<reduce_kind>(d[red_base + 2 * R_] & loop_desc::red_kind_bits);
    }
    template <std::size_t I>
    static constexpr bool is_constant_input() {
        return is_constant(I);
    }

    // Inputs constant along the row.
    template <class InPtr, class Off>
    [[gnu::always_inline]] static void load_row_constants(values& v, const InPtr& in_ptr, const Off& off) {
        [&]<std::size_t... Is>(std::index_sequence<Is...>) {
            [[maybe_unused]] const int in_order[] = {0, (static_cast<void>(load_row_constant<Is>(v, in_ptr, off)), 0)...};
        }(std::make_index_sequence<n_in>{});
    }
    template <std::size_t I, class VB, class InPtr, class Off>
    static void load_row_constant(VB& v, const InPtr& in_ptr, const Off& off) {
        if constexpr (is_constant_input<I>()) {
            constexpr T c = static_cast<T>(std::bit_cast<double>(d[op_base + 4 * I + 3]));
            v[I] = batch_t(c);
        } else if constexpr (inner_broadcast(I)) {
            v[I] = batch_t(loop_loaded<val_t<I>, buf_t<I>>(simd::scalar_as<T>(static_cast<const buf_t<I>*>(in_ptr[I])[off[I]])));
        }
    }
    template <std::size_t I, class VB, class InPtr, class Off, class InnerStride>
    static void load_vector([[maybe_unused]] const loop_args& a, VB& v, const InPtr& in_ptr, const Off& off,
                            std::size_t j, const InnerStride& inner_stride) {
        using S = buf_t<I>;
        if constexpr (is_view_input(I) && !inner_broadcast(I)) {
            const std::ptrdiff_t state = inner_stride[I];
            const S* p = static_cast<const buf_t<I>*>(in_ptr[I]) + off[I];
            if (state == 1) {
                v[I] = loop_loaded<val_t<I>, buf_t<I>>(simd::load_as<T>(p + j));
            } else {
                alignas(64) S lanes[W];
                for (std::size_t l = 0; l < W; ++l) lanes[l] = p[std::ptrdiff_t(j + l) * state];
                v[I] = loop_loaded<val_t<I>, buf_t<I>>(simd::load_as<T>(lanes));
            }
        } else if constexpr (!is_constant_input<I>() && !inner_broadcast(I)) {
            v[I] = loop_loaded<val_t<I>, buf_t<I>>(simd::load_as<T>(static_cast<const buf_t<I>*>(in_ptr[I]) + off[I] + j));
        }
        if constexpr (Check && !is_constant_input<I>()) note_nonfinite(v[I], a.node[I]);
    }
    // Elements [j, j + m) of the row, m < W, into a batch: lanes past m repeat element j + m - 1.
    template <std::size_t I, class VB, class InPtr, class Off, class InnerStride>
    static void load_tail([[maybe_unused]] const loop_args& a, VB& v, const InPtr& in_ptr, const Off& off,
                          std::size_t j, std::size_t m, const InnerStride& inner_stride) {
        if constexpr (!is_constant_input<I>() && !inner_broadcast(I)) {
            using S = buf_t<I>;
            // only a view may be strided along the row (inner_stride is 1 otherwise)
            const std::ptrdiff_t step = is_view_input(I) ? inner_stride[I] : 1;
            const S* p = static_cast<const S*>(in_ptr[I]) + off[I] + std::ptrdiff_t(j) * step;
            if (std::is_same_v<S, T> && step == 1) {
                if constexpr (std::is_same_v<S, T>) v[I] = loop_loaded<val_t<I>, S>(simd::load_first(p, m));
            } else if constexpr (!std::is_same_v<S, T> || is_view_input(I)) {
                alignas(64) S lanes[W];
                for (std::size_t l = 0; l < W; ++l) lanes[l] = p[std::ptrdiff_t(std::min(l, m - 1)) * step];
                v[I] = loop_loaded<val_t<I>, S>(simd::load_as<T>(lanes));
            }
        }
        if constexpr (Check && !is_constant_input<I>()) note_nonfinite(v[I], a.node[I]);
    }

    // Every reduction along the row accumulates in four chains: a body of a few instructions (a
    // max loop of a softmax, a sum of squares) is bound by the latency of one accumulator chain.
    // Their order is the row's alone: element j goes to chain (j - j0) / W % 4 up to the last
    // full step of four batches, the chains are joined pairwise, then the rest go in one by one.
    // So a sum's bits do not depend on the loop it is fused into, nor on the thread count (a row
    // is cut into blocks by its length alone: split_loop_into).
    static constexpr bool chained(std::size_t r) { return inner_broadcast(n_in + r); }
    static constexpr bool split_chains = [] {
        for (std::size_t r = 0; r < n_red; ++r)
            if (chained(r)) return true;
        return false;
    }();
    template <std::size_t R_, class Acc>
    static void join_chains(Acc& acc, const Acc& acc1, const Acc& acc2, const Acc& acc3) {
        if constexpr (chained(R_)) {
            constexpr reduce_kind K = red_kind<R_>();
            acc[R_] = reduce_combine<K>(reduce_combine<K>(acc[R_], acc1[R_]), reduce_combine<K>(acc2[R_], acc3[R_]));
        }
    }

    // The outputs of a step's first m lanes (m == W but for the tail); Chain > 0: the chained row
    // reductions accumulate in chain_acc.
    template <std::size_t Chain, class Values, class Acc, class OutPtr, class Off>
    static void finish(const Values& v, Acc& acc, [[maybe_unused]] Acc& chain_acc, const OutPtr& out_ptr,
                       const Off& off, std::size_t j, std::size_t m) {
        [&]<std::size_t... Rs>(std::index_sequence<Rs...>) {
            [[maybe_unused]] const int in_order[] = {
                0, (static_cast<void>(reduce_step<Rs>(v, Chain > 0 && chained(Rs) ? chain_acc : acc, out_ptr, off, j, m)), 0)...};
        }(std::make_index_sequence<n_red>{});
        [&]<std::size_t... Ms>(std::index_sequence<Ms...>) {
            [[maybe_unused]] const int in_order[] = {0, (static_cast<void>(mat_step<Ms>(v, out_ptr, off, j, m)), 0)...};
        }(std::make_index_sequence<n_mat>{});
        [&]<std::size_t... Ss>(std::index_sequence<Ss...>) {
            [[maybe_unused]] const int in_order[] = {0, (static_cast<void>(store_step<Ss>(v, out_ptr, off, j, m)), 0)...};
        }(std::make_index_sequence<n_store>{});
    }
    // A batch into p[0, m): all of it when m == W, else a masked store (through a buffer when
    // the buffer's type is not the loop's).
    template <class S>
    [[gnu::always_inline]] static void store_lanes(S* p, const batch_t& x, std::size_t m) {
        if (m == W) {
            simd::store_as(p, x);
        } else if constexpr (std::is_same_v<S, T>) {
            simd::store_first(p, x, m);
        } else {
            alignas(64) S lanes[W];
            simd::store_as(lanes, x);
            for (std::size_t l = 0; l < m; ++l) p[l] = lanes[l];
        }
    }
    // p[0, m) as a batch (lanes past m: unspecified, dropped by the caller).
    template <class S>
    [[gnu::always_inline]] static batch_t load_lanes(const S* p, std::size_t m) {
        if (m == W) {
            return simd::load_as<T>(p);
        } else if constexpr (std::is_same_v<S, T>) {
            return simd::load_first(p, m);
        } else {
            alignas(64) S lanes[W] = {};
            for (std::size_t l = 0; l < m; ++l) lanes[l] = p[l];
            return simd::load_as<T>(lanes);
        }
    }
    // Lanes [0, m) set.
    static auto first_lanes(std::size_t m) { return simd::load(lane_index<T>.data()) < batch_t(T(m)); }
    template <std::size_t M_, class Values, class OutPtr, class Off>
    static void mat_step(const Values& v, const OutPtr& out_ptr, const Off& off, std::size_t j, std::size_t m) {
        constexpr std::size_t src = d[mat_base + M_];
        using S = buf_t<n_in + n_red + M_>;
        store_lanes(static_cast<S*>(out_ptr[n_red + M_]) + off[n_in + n_red + M_] + j, v[src], m);
    }
    template <std::size_t R_, class Values, class Acc, class OutPtr, class Off>
    static void reduce_step(const Values& v, Acc& acc, const OutPtr& out_ptr, const Off& off, std::size_t j,
                            std::size_t m) {
        constexpr std::size_t src = d[red_base + 2 * R_ + 1];
        constexpr reduce_kind K = red_kind<R_>();
        if constexpr (inner_broadcast(n_in + R_)) {
            if (m == W) acc[R_] = reduce_combine<K>(acc[R_], v[src]);
            else acc[R_] = reduce_combine<K>(acc[R_], simd::select(first_lanes(m), v[src], batch_t(reduce_identity<T, K>())));
        } else {
            static_assert(std::is_same_v<buf_t<n_in + R_>, T>, "typegrad: internal: a reduction buffer is not in the loop's type");
            T* p = static_cast<buf_t<n_in + R_>*>(out_ptr[R_]) + off[n_in + R_] + j;
            store_lanes(p, reduce_combine<K>(load_lanes(p, m), v[src]), m);
        }
    }
    template <std::size_t R_, class Acc, class OutPtr, class Off>
    static void close_reduction(const Acc& acc, const OutPtr& out_ptr, const Off& off) {
        if constexpr (inner_broadcast(n_in + R_)) {
            constexpr reduce_kind K = red_kind<R_>();
            T* p = static_cast<buf_t<n_in + R_>*>(out_ptr[R_]) + off[n_in + R_];
            *p = reduce_combine<K>(*p, reduce_lanes<K>(acc[R_]));
        }
    }
    template <std::size_t S_, class Values, class OutPtr, class Off>
    static void store_step(const Values& v, const OutPtr& out_ptr, const Off& off, std::size_t j, std::size_t m) {
        constexpr std::size_t src = d[store_base + 2 * S_];
        constexpr bool accumulate = d[store_base + 2 * S_ + 1] != 0;
        constexpr std::size_t o = n_in + n_red + n_mat + S_;
        using S = buf_t<o>;
        S* p = static_cast<buf_t<o>*>(out_ptr[n_red + n_mat + S_]) + off[o] + j;
        if constexpr (accumulate) store_lanes(p, load_lanes(p, m) + v[src], m);
        else store_lanes(p, v[src], m);
    }
};

// A loop body comes in chunks of up to body_chunk nodes (loop_kernel_of). One chunk is inlined
// into the batch loop and the tail; a longer body is one function per chunk, which both call.
// Cut, because g++'s inliner works per function at a cost that grows faster than the function
// (38% of a 1000-op chain's compile was its heuristics over one 3,300-node body); as functions
// of their own, because two copies of thousands of nodes would double the loop's compile (and
// g++ had kept such a body out of line itself). Named with their chunk only, not the loop.
inline constexpr std::size_t body_chunk = 128;
// At most this many inputs and body nodes in a loop that resolves a select once per row.
inline constexpr std::size_t select_max_slots = 512;
template <bool Check, class Values, class... Instrs>
[[gnu::noinline]] void eval_chunk(Values& v, type_list<Instrs...>) {
    [[maybe_unused]] const int in_order[] = {0, (eval_instr<Check>(v, Instrs{}), 0)...};
}

// A loop: its code (loop_code) and its body (a list of chunks, each a list of loop_instr). Only
// its rows and its body's evaluation are named with the whole body; a plan runs a loop as
// code::run(args, &rows) (loop_fns, exec/execute.hpp).
template <class T, class Bufs, class Vals, class Body, class Desc, bool Check>
struct loop_kernel;
template <class T, class Bufs, class Vals, class... Chunks, class Desc, bool Check>
struct loop_kernel<T, Bufs, Vals, type_list<Chunks...>, Desc, Check> {
    using code = loop_code<T, Bufs, Vals, Desc, Check>;
    [[gnu::always_inline]] static void eval(typename code::values& v) { (eval_chunk<Check>(v, Chunks{}), ...); }
    static void rows(const row_run& rr) { code::template rows<false>(rr, &eval, nullptr, nullptr); }
};
// The slots whose values are the same along a row (loop_desc::select): constants, inputs
// broadcast along the innermost axis, and body nodes of only such operands.
template <class Code, class... Instrs>
constexpr auto row_uniform_slots() {
    std::array<bool, Code::n_slots + 1> u{};
    for (std::size_t i = 0; i < Code::n_in; ++i) u[i] = Code::is_constant(i) || Code::inner_broadcast(i);
    auto mark = [&]<class Op, class D, std::size_t Id, std::size_t Out, std::size_t... Cs>(
                    loop_instr<Op, D, Id, Out, std::index_sequence<Cs...>>) { u[Out] = (u[Cs] && ...); };
    (mark(Instrs{}), ...);
    return u;
}
template <class T, class Bufs, class Vals, class... Instrs, class Desc, bool Check>
struct loop_kernel<T, Bufs, Vals, type_list<type_list<Instrs...>>, Desc, Check> {
    using code = loop_code<T, Bufs, Vals, Desc, Check>;
    using values = typename code::values;
    [[gnu::always_inline]] static void eval(values& v) {
        [[maybe_unused]] const int in_order[] = {0, (eval_instr<Check>(v, Instrs{}), 0)...};
    }
    // A select resolved per row (code::select_slot): Mode 0 computes the row-uniform nodes
    // only; 1 and 2 the body with every where on that condition replaced by its operand 1
    // (condition nonzero) or 2.
    template <int Mode, class Op, class D, std::size_t Id, std::size_t Out, std::size_t... Cs>
    [[gnu::always_inline]] static void eval_resolved(values& v, loop_instr<Op, D, Id, Out, std::index_sequence<Cs...>> i) {
        constexpr std::size_t cs[] = {Cs..., code::no_select};
        if constexpr (Mode == 0) {
            constexpr auto uniform = row_uniform_slots<code, Instrs...>();
            if constexpr (uniform[Out]) eval_instr<Check>(v, i);
        } else if constexpr (selects_of<Op>() && cs[0] == code::select_slot) {
            if constexpr (is_reduced_precision_v<D>) v[Out] = simd::round_as<D>(v[cs[Mode]]);
            else v[Out] = v[cs[Mode]];
        } else {
            eval_instr<Check>(v, i);
        }
    }
    template <int Mode>
    [[gnu::always_inline]] static void eval_as(values& v) {
        [[maybe_unused]] const int in_order[] = {0, (eval_resolved<Mode>(v, Instrs{}), 0)...};
    }
    static void rows(const row_run& rr) {
        if constexpr (code::select_slot == code::no_select) {
            code::template rows<false>(rr, &eval, nullptr, nullptr);
        } else {
            static_assert(row_uniform_slots<code, Instrs...>()[code::select_slot],
                          "typegrad: internal: a loop's per-row condition is not the same along its rows");
            code::template rows<true>(rr, &eval_as<1>, &eval_as<0>, &eval_as<2>);
        }
    }
};
// What a plan calls to run loop l (exec/execute.hpp).
struct loop_fns {
    void (*run)(const loop_args&, void (*)(const row_run&)) = nullptr;
    void (*rows)(const row_run&) = nullptr;
};

// ---- a plan's loops as signatures -------------------------------------------------------------
//
// Every loop of a plan is described by integers, computed once per plan in flat tables
// (loop_layout): its operands' node ids and extent offsets (read at run time), the node ids of
// its body, and its descriptor (part of its kernel's type). Each loop's kernel type is then
// derived by classes that hold type aliases only (loop_kernel_of, body_instr). g++ gives every
// function and static variable it instantiates a mangled name, and a name that holds the plan
// is O(N) long: a static member or function per loop of a plan would be O(N^2) symbol text
// (it was most of a 4-block model's compile time), while a type alias is never named.
// Plan provides: program (a program<>), plan (plan_data), stores (array of store node ids),
// rank_offset (array: start of each node's extents in exec_state::ext), value_type.
// Check: anomaly mode, every value computed or loaded is tested for NaN/Inf.
struct loop_counts {
    std::size_t n_in = 0, n_body = 0, n_red = 0, n_mat = 0, n_store = 0;
    constexpr std::size_t n_ops() const { return n_in + n_red + n_mat + n_store; }
    constexpr std::size_t desc_size() const {
        return loop_desc::header + 4 * n_ops() + 2 * n_red + n_mat + 2 * n_store;
    }
};
constexpr loop_counts counts_of(const loop_plan& lp) {
    return {lp.in_end - lp.in_begin, lp.body_end - lp.body_begin, lp.red_end - lp.red_begin,
            lp.mat_end - lp.mat_begin, lp.store_end - lp.store_begin};
}
struct loop_totals {
    std::size_t ops = 0, body = 0, desc = 0;
};
template <std::size_t L>
constexpr loop_totals totals_of(const std::array<loop_plan, L>& loops, std::size_t count) {
    loop_totals t;
    for (std::size_t l = 0; l < count; ++l) {
        const loop_counts c = counts_of(loops[l]);
        t.ops += c.n_ops() + 1;
        t.body += c.n_body;
        t.desc += c.desc_size();
    }
    return t;
}

// A plan's loop tables, a class keyed by their sizes only: nested in loop_layout it would be
// named with the plan's whole graph, and clang prints that name, subexpressions repeated once
// per path to them, for the LLVM type of the constant (15 of the 20 s of a transformer block).
template <std::size_t Count, std::size_t Ops, std::size_t Body, std::size_t Desc>
struct loop_tables_data {
    // per loop (count + 1 entries)
    std::array<std::size_t, Count + 1> op_start{}, n_ops{}, body_start{}, n_body{}, desc_start{}, desc_size{},
        iter{};
    // per operand (n_ops + 1 per loop): its node (for types), then the run-time table
    // ids: node ids (stores: the store index) then extent offsets, n_ops + 1 each
    std::array<std::size_t, Ops + 1> op_node{};
    std::array<std::size_t, 2 * Ops + 1> ids{};
    // per body node: its id, its value operands' slots
    std::array<std::size_t, Body + 1> body_id{}, body_nslots{};
    std::array<std::size_t, Body * max_arity + 1> body_slots{};
    std::array<std::size_t, Desc + 1> desc{};
};

template <class Plan, class AccumulateMask, bool Check>
struct loop_layout {
    using prog = typename Plan::program;
    static constexpr bool check = Check;
    static constexpr std::size_t count = Plan::plan.loop_count;
    static constexpr loop_totals totals = totals_of(Plan::plan.loops, count);
    using tables = loop_tables_data<count, totals.ops, totals.body, totals.desc>;
    // Over raw pointers, as the planner (exec/program.hpp): clang charges every std::array
    // subscript's statements against its 2^20 steps per constant evaluation.
    static constexpr tables make() {
        const node_info* const info = prog::info.data();
        const loop_plan* const loops = Plan::plan.loops.data();
        const std::size_t* const members = Plan::plan.members.data();
        const std::size_t* const stores = Plan::stores.data();
        const std::size_t* const rank_offset = Plan::rank_offset.data();
        tables t;
        std::size_t *const op_start = t.op_start.data(), *const n_ops_of = t.n_ops.data(),
                           *const body_start = t.body_start.data(), *const n_body = t.n_body.data(),
                           *const desc_start = t.desc_start.data(), *const desc_size = t.desc_size.data(),
                           *const iter = t.iter.data(), *const op_node = t.op_node.data(), *const ids = t.ids.data(),
                           *const body_id = t.body_id.data(), *const body_nslots = t.body_nslots.data(),
                           *const body_slots = t.body_slots.data(), *const descs = t.desc.data();
        // each node's slot in the current loop, valid where its stamp is the loop's number + 1
        // (a search per operand was quadratic in a loop's size)
        std::array<std::size_t, prog::size> slot_at_{}, stamp_{};
        std::size_t *const slot_at = slot_at_.data(), *const stamp = stamp_.data();
        std::size_t op = 0, body = 0, desc = 0;
        for (std::size_t l = 0; l < count; ++l) {
            const loop_plan& lp = loops[l];
            const loop_counts c = counts_of(lp);
            const std::size_t n_ops = c.n_ops(), n_slots = c.n_in + c.n_body;
            // slots: the inputs, then the body (contiguous in members when the body follows)
            for (std::size_t s = 0; s < c.n_in; ++s) slot_at[members[lp.in_begin + s]] = s, stamp[members[lp.in_begin + s]] = l + 1;
            for (std::size_t s = 0; s < c.n_body; ++s)
                slot_at[members[lp.body_begin + s]] = c.n_in + s, stamp[members[lp.body_begin + s]] = l + 1;
            auto slot_of = [&](std::size_t id) { return stamp[id] == l + 1 ? slot_at[id] : n_slots; };
            // operands: inputs, reductions, materialisations, stores (their node and table id)
            const std::size_t o_red = c.n_in, o_mat = o_red + c.n_red, o_store = o_mat + c.n_mat;
            auto operand_node = [&](std::size_t o) -> std::size_t {
                if (o < o_red) return members[lp.in_begin + o];
                if (o < o_mat) return members[lp.red_begin + (o - o_red)];
                if (o < o_store) return members[lp.mat_begin + (o - o_mat)];
                return stores[members[lp.store_begin + (o - o_store)]];
            };
            op_start[l] = op, n_ops_of[l] = n_ops, body_start[l] = body, n_body[l] = c.n_body;
            desc_start[l] = desc, desc_size[l] = c.desc_size(), iter[l] = lp.iter;
            // operands: node ids for the types and the run-time table
            for (std::size_t o = 0; o < n_ops; ++o) {
                const std::size_t node = operand_node(o);
                op_node[op + o] = node;
                ids[2 * op + o] = o < o_store ? node : members[lp.store_begin + (o - o_store)];
                ids[2 * op + (n_ops + 1) + o] = rank_offset[node];
            }
            ids[2 * op + (n_ops + 1) + n_ops] = rank_offset[lp.iter];
            // body nodes: their value children (shape-only children are not evaluated) as slots
            for (std::size_t b = 0; b < c.n_body; ++b) {
                const std::size_t id = members[lp.body_begin + b];
                const node_info& ni = info[id];
                body_id[body + b] = id;
                std::size_t n = 0;
                for (std::size_t i = 0; i < ni.arity; ++i)
                    if (!ni.shape_only[i]) body_slots[(body + b) * max_arity + n++] = slot_of(ni.child[i]);
                body_nslots[body + b] = n;
            }
            // the descriptor (loop_desc's layout)
            std::size_t* r = descs + desc;
            const node_info& f = info[lp.iter];
            r[loop_desc::select] = select_of(lp, c, slot_of);
            r[loop_desc::iter_rank] = f.rank;
            r[loop_desc::n_in] = c.n_in;
            r[loop_desc::n_body] = c.n_body;
            r[loop_desc::n_red] = c.n_red;
            r[loop_desc::n_mat] = c.n_mat;
            r[loop_desc::n_store] = c.n_store;
            std::size_t k = loop_desc::header;
            for (std::size_t o = 0; o < n_ops; ++o) {
                const node_info& ni = info[operand_node(o)];
                r[k++] = (o < c.n_in && ni.kind == op_kind::view && !ni.contiguous ? loop_desc::flag_view : 0) |
                         (ni.kind == op_kind::constant ? loop_desc::flag_constant : 0);
                r[k++] = ni.rank;
                std::size_t mask = 0;
                const std::size_t lead = f.rank - ni.rank;
                for (std::size_t a = 0; a < f.rank; ++a)
                    if (a < lead || (ni.ext[a - lead] == 1 && f.ext[a] != 1)) mask |= std::size_t(1) << a;
                r[k++] = mask;
                r[k++] = ni.kind == op_kind::constant ? ni.constant_bits : 0;
            }
            for (std::size_t i = 0; i < c.n_red; ++i) {
                const std::size_t node = members[lp.red_begin + i];
                r[k++] = static_cast<std::size_t>(info[node].combine);
                r[k++] = slot_of(info[node].child[0]);
            }
            for (std::size_t i = 0; i < c.n_mat; ++i) r[k++] = slot_of(members[lp.mat_begin + i]);
            for (std::size_t i = 0; i < c.n_store; ++i) {
                const std::size_t store_index = members[lp.store_begin + i];
                r[k++] = slot_of(stores[store_index]);
                r[k++] = AccumulateMask::test(store_index) ? 1 : 0;
            }
            op += n_ops + 1;
            body += c.n_body;
            desc += c.desc_size();
        }
        op_start[count] = op;
        return t;
    }
    static constexpr tables table = make();

    // loop_desc::select of loop lp: 1 + the condition slot of its first where whose condition is
    // the same along a row while the where's value is not (0: none). A value is the same along a
    // row when it is a constant, an input broadcast along the innermost iteration axis (loaded
    // once per row) or an elementwise op of such values. Not in anomaly mode (its report names the
    // first non-finite value computed, selected or not), not for a body of several chunks, not
    // for a loop of rank 0.
    template <class SlotOf>
    static constexpr std::size_t select_of(const loop_plan& lp, const loop_counts& c, SlotOf slot_of) {
        const node_info* const info = prog::info.data();
        const std::size_t* const members = Plan::plan.members.data();
        const node_info& f = info[lp.iter];
        if (Check || f.rank == 0 || c.n_body > body_chunk) return 0;
        bool any = false;
        for (std::size_t b = 0; b < c.n_body && !any; ++b) any = info[members[lp.body_begin + b]].selects;
        if (!any) return 0;
        std::array<bool, select_max_slots + 1> uniform_{};
        bool* const uniform = uniform_.data();
        const std::size_t n_slots = c.n_in + c.n_body;
        if (n_slots > select_max_slots) return 0;
        for (std::size_t s = 0; s < c.n_in; ++s) {
            const node_info& ni = info[members[lp.in_begin + s]];
            const std::size_t lead = f.rank - ni.rank;
            const std::size_t a = f.rank - 1;
            uniform[s] = ni.kind == op_kind::constant || a < lead || (ni.ext[a - lead] == 1 && f.ext[a] != 1);
        }
        for (std::size_t b = 0; b < c.n_body; ++b) {
            const node_info& ni = info[members[lp.body_begin + b]];
            bool u = true;
            std::size_t cond = n_slots;
            for (std::size_t i = 0, n = 0; i < ni.arity; ++i) {
                if (ni.shape_only[i]) continue;
                const std::size_t s = slot_of(ni.child[i]);
                if (n++ == 0) cond = s;
                u = u && s < n_slots && uniform[s];
            }
            uniform[c.n_in + b] = u;
            if (ni.selects && !u && cond < n_slots && uniform[cond]) return cond + 1;
        }
        return 0;
    }
};

// Body node J of a layout as a loop_instr whose value goes to slot Out.
template <class Layout, std::size_t J, std::size_t Out, class Ks = std::make_index_sequence<Layout::table.body_nslots[J]>>
struct body_instr;
template <class Layout, std::size_t J, std::size_t Out, std::size_t... Ks>
struct body_instr<Layout, J, Out, std::index_sequence<Ks...>> {
    using node = typename Layout::prog::template node_at<Layout::table.body_id[J]>;
    using type = loop_instr<typename node::op, storage_t<typename node::value_type>,
                            Layout::check ? Layout::table.body_id[J] : 0, Out,
                            std::index_sequence<Layout::table.body_slots[J * max_arity + Ks]...>>;
};
// Chunk C of loop L's body (body_chunk nodes, fewer in the last).
template <class Layout, std::size_t L, std::size_t C,
          class Is = std::make_index_sequence<std::min(body_chunk, Layout::table.n_body[L] - C * body_chunk)>>
struct body_chunk_of;
template <class Layout, std::size_t L, std::size_t C, std::size_t... Is>
struct body_chunk_of<Layout, L, C, std::index_sequence<Is...>> {
    static constexpr std::size_t first = C * body_chunk;
    static constexpr std::size_t n_in = Layout::table.desc[Layout::table.desc_start[L] + loop_desc::n_in];
    using type = type_list<typename body_instr<Layout, Layout::table.body_start[L] + first + Is, n_in + first + Is>::type...>;
};
template <class Layout, std::size_t L,
          class Cs = std::make_index_sequence<(Layout::table.n_body[L] + body_chunk - 1) / body_chunk>>
struct body_of;
template <class Layout, std::size_t L, std::size_t... Cs>
struct body_of<Layout, L, std::index_sequence<Cs...>> {
    using type = type_list<typename body_chunk_of<Layout, L, Cs>::type...>;
};
// Loop L's kernel type. A loop computes in its iteration node's compute type: double, or float
// for the float family (f32, bf16, f16 never meet f64); operands convert from and to their
// buffers' types.
template <class Layout, std::size_t L, class Os = std::make_index_sequence<Layout::table.n_ops[L]>,
          class Ds = std::make_index_sequence<Layout::table.desc_size[L]>>
struct loop_kernel_of;
template <class Layout, std::size_t L, std::size_t... Os, std::size_t... Ds>
struct loop_kernel_of<Layout, L, std::index_sequence<Os...>, std::index_sequence<Ds...>> {
    using prog = typename Layout::prog;
    using type = loop_kernel<
        compute_t<typename prog::template node_at<Layout::table.iter[L]>::value_type>,
        type_list<buffer_t<typename prog::template node_at<Layout::table.op_node[Layout::table.op_start[L] + Os]>>...>,
        type_list<storage_t<typename prog::template node_at<Layout::table.op_node[Layout::table.op_start[L] + Os]>::value_type>...>,
        typename body_of<Layout, L>::type,
        std::index_sequence<Layout::table.desc[Layout::table.desc_start[L] + Ds]...>, Layout::check>;
};

}  // namespace typegrad::detail
