#pragma once
// Indexing: embedding(ids, table) (torch.nn.functional.embedding, optional padding_idx),
// index_select(x, ids) and gather(x, index) along an axis (torch.index_select, torch.gather),
// concat and stack of several expressions along an axis (torch.cat, torch.stack),
// dynamic_slice<axis, length>(x, start): a slice whose start is a run-time value (torch.narrow
// with a tensor start; jax.lax.dynamic_slice_in_dim), and narrow<axis>(x, start, length), whose
// length is a run-time input too (its extent tg::dyn).
//
// Ids are integer tensors (a tg::input of std::int32_t or std::int64_t, of any shape, or the
// result of argmax/argmin). Every id is checked against the table's rows: an id out of range
// throws tg::shape_error naming it, from the shape pass when the ids are a leaf (before anything
// runs), otherwise before the kernel writes. Negative ids are errors, as in PyTorch.
//
// Gradients: the backward of a lookup is a deterministic scatter-add (rows added in the order of
// the ids: the same bits on every run), skipping padding_idx; each splits the gradient over the
// thread pool (embedding's and index_select's its rows, gather's its lines along the axis), each
// element summed by one task in the ids' order: the same bits on any number of threads. concat's gradient of each
// input is a zero-copy view of the incoming gradient.
//
// Autocast: embedding and index_select keep their dtypes (PyTorch lists neither); cat and stack
// promote to the widest input, as on PyTorch's CPU list.
//
// All are kernel ops (their own routines over strided operands), each with its device kernel
// beside it (index_device_source): the same values as the CPU, bad ids reported by the kernel
// and thrown by the host before any gradient is written; the scatter-add backwards run one
// thread per output line in the CPU's order (the same bits as the CPU) and accumulate f32/f64
// gradients on the device (a bf16/f16 gradient is a typegrad: static_assert there).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

#include <typegrad/core/cpu/buffer_pool.hpp>
#include <typegrad/core/cpu/thread_pool.hpp>
#include <typegrad/core/device_kernel.hpp>
#include <typegrad/core/error.hpp>
#include <typegrad/ops/arithmetic.hpp>
#include <typegrad/ops/broadcast.hpp>
#include <typegrad/ops/op_base.hpp>
#include <typegrad/ops/view.hpp>

namespace typegrad {

// embedding<padding_idx>: no padding index.
inline constexpr std::int64_t no_padding = std::numeric_limits<std::int64_t>::min();

namespace detail {


// The ids of an index op, checked: each in [0, rows). Throws before the caller writes.
template <class Id>
[[noreturn]] inline void throw_bad_id(const char* op, Id id, std::size_t position, std::size_t rows) {
    fail<shape_error>({"typegrad: ", op, ": id ", id < 0 ? "-" : "", std::uint64_t(id < 0 ? -id : id),
                       " at position ", position, " is out of range for ", rows, " rows"});
}
template <class Id, class Ref>
inline void check_ids(const char* op, const Ref& ids, std::size_t rows) {
    const auto* p = static_cast<const Id*>(ids.data);
    if (p == nullptr) return;  // not computed yet (checked again when the kernel runs)
    const std::size_t n = numel_of(ids);
    for (std::size_t e = 0; e < n; ++e) {
        const Id id = p[strided_offset(ids, e)];
        if (id < 0 || std::uint64_t(id) >= rows) throw_bad_id(op, id, e, rows);
    }
}
// The same error from a device kernel's report: the id at that position, read from the device.
template <class Id, class Ref>
[[noreturn]] inline void throw_bad_device_id(const char* op, const Ref& ids, std::size_t position, std::size_t rows,
                                             device_copy copy) {
    Id id{};
    copy(&id, static_cast<const Id*>(ids.data) + strided_offset(ids, position), sizeof id);
    throw_bad_id(op, id, position, rows);
}
template <std::int64_t Padding>
inline bool is_padding(std::int64_t id, std::size_t rows) {
    if constexpr (Padding == no_padding) return false;
    else return id == (Padding < 0 ? Padding + std::int64_t(rows) : Padding);
}

// ---- device kernels of the index ops (exec/cuda/codegen.hpp emits this once per module) ----------
// Element codes as core/device_kernel.hpp's device_type_code; I: the ids' type. A bad id records its
// position (tg_report) and the host throws the CPU's message. Scatter-adds run one thread per
// output line, adding in the CPU's order: the same bits as the CPU, run after run.
inline constexpr const char* index_device_source = R"CUDA(
// embedding. w: out, dim, rows, padding, has_padding, zero_padding, flag, ids ref, table ref
template <int I, int T, int V, int B> __device__ void tg_embedding(const tg_node_args& p) {
    typename tg_ty<T>::S* out = (typename tg_ty<T>::S*)p.w[0];
    const tg_i64 dim = (tg_i64)p.w[1], rows = (tg_i64)p.w[2], padding = (tg_i64)p.w[3];
    const bool pad = p.w[4] != 0 && p.w[5] != 0;
    const tg_ref ids = tg_ref_at(p, 7);
    const tg_ref table = tg_ref_at(p, 9 + 2 * ids.rank);
    const typename tg_ty<B>::S* tp = (const typename tg_ty<B>::S*)table.p;
    const tg_i64 n = tg_numel(ids);
    TG_GRID_LOOP(t, dim > 0 ? n * dim : n) {
        const tg_i64 e = dim > 0 ? t / dim : t, j = dim > 0 ? t % dim : 0;
        const tg_i64 id = tg_id<I>(ids, e);
        if (id < 0 || id >= rows) {
            tg_report(p.w[6], e);
            continue;
        }
        if (dim == 0) continue;
        if (pad && id == padding) out[t] = tg_ty<T>::to((typename tg_ty<T>::C)0);
        else out[t] = tg_cvt<T, V, B>(tp[id * (tg_i64)table.stride[0] + j * (tg_i64)table.stride[1]]);
    }
}
// embedding's backward (T f32/f64). w: out, dim, rows, padding, has_padding, flag, g ref, ids ref
template <int I, int T, int V, int B> __device__ void tg_embedding_backward(const tg_node_args& p) {
    typename tg_ty<T>::S* out = (typename tg_ty<T>::S*)p.w[0];
    const tg_i64 dim = (tg_i64)p.w[1], rows = (tg_i64)p.w[2], padding = (tg_i64)p.w[3];
    const bool pad = p.w[4] != 0;
    const tg_ref g = tg_ref_at(p, 6);
    const tg_ref ids = tg_ref_at(p, 8 + 2 * g.rank);
    const typename tg_ty<B>::S* gp = (const typename tg_ty<B>::S*)g.p;
    const tg_i64 n = tg_numel(ids), gs = (tg_i64)g.stride[g.rank - 1];
    TG_GRID_LOOP(j, dim > 0 ? dim : 1) {
        for (tg_i64 r = 0; r < rows && j < dim; ++r) out[r * dim + j] = 0;
        for (tg_i64 e = 0; e < n; ++e) {
            const tg_i64 id = tg_id<I>(ids, e);
            if (id < 0 || id >= rows) {
                tg_report(p.w[5], e);
                continue;
            }
            if (j >= dim || (pad && id == padding)) continue;
            const tg_i64 row = tg_offset(e, g.rank - 1, g.ext, g.stride);  // g's axes but the last
            out[id * dim + j] += tg_cvt<T, V, B>(gp[row + j * gs]);
        }
    }
}
// index_select. w: out, axis, rows, flag, x ref, ids ref
template <int I, int T, int V, int B> __device__ void tg_index_select(const tg_node_args& p) {
    typename tg_ty<T>::S* out = (typename tg_ty<T>::S*)p.w[0];
    const int axis = (int)p.w[1];
    const tg_i64 rows = (tg_i64)p.w[2];
    const tg_ref x = tg_ref_at(p, 4);
    const tg_ref ids = tg_ref_at(p, 6 + 2 * x.rank);
    const typename tg_ty<B>::S* xp = (const typename tg_ty<B>::S*)x.p;
    const tg_i64 m = (tg_i64)ids.ext[0];
    tg_i64 n = 1;
    for (int a = 0; a < x.rank; ++a) n *= a == axis ? m : (tg_i64)x.ext[a];
    TG_GRID_LOOP(e, n) {
        tg_i64 r = e, off = 0;
        bool ok = true;
        for (int a = x.rank - 1; a >= 0; --a) {
            const tg_i64 ext = a == axis ? m : (tg_i64)x.ext[a];
            tg_i64 i = r % ext;
            r /= ext;
            if (a == axis) {
                const tg_i64 at = i;
                i = tg_id<I>(ids, at);
                if (i < 0 || i >= rows) {
                    tg_report(p.w[3], at);
                    ok = false;
                }
            }
            off += i * (tg_i64)x.stride[a];
        }
        if (ok) out[e] = tg_cvt<T, V, B>(xp[off]);
    }
}
// index_select's backward (T f32/f64). w: out, axis, flag, g ref, ids ref, out extents
template <int I, int T, int V, int B> __device__ void tg_index_add(const tg_node_args& p) {
    typename tg_ty<T>::S* out = (typename tg_ty<T>::S*)p.w[0];
    const int axis = (int)p.w[1];
    const tg_ref g = tg_ref_at(p, 3);
    const tg_ref ids = tg_ref_at(p, 5 + 2 * g.rank);
    const tg_u64* oext = p.w + 7 + 2 * g.rank + 2 * ids.rank;
    const typename tg_ty<B>::S* gp = (const typename tg_ty<B>::S*)g.p;
    const tg_i64 len = (tg_i64)g.ext[axis], rows = (tg_i64)oext[axis];
    tg_i64 lines = 1;
    for (int a = 0; a < g.rank; ++a)
        if (a != axis) lines *= (tg_i64)g.ext[a];
    TG_GRID_LOOP(line, lines) {
        tg_i64 r = line, gbase = 0, obase = 0, scale = 1, ostep = 1;
        for (int a = g.rank - 1; a >= 0; --a) {
            if (a == axis) {
                ostep = scale;
            } else {
                const tg_i64 i = r % (tg_i64)g.ext[a];
                r /= (tg_i64)g.ext[a];
                gbase += i * (tg_i64)g.stride[a];
                obase += i * scale;
            }
            scale *= (tg_i64)oext[a];
        }
        for (tg_i64 k = 0; k < rows; ++k) out[obase + k * ostep] = 0;
        for (tg_i64 i = 0; i < len; ++i) {
            const tg_i64 id = tg_id<I>(ids, i);
            if (id < 0 || id >= rows) {
                tg_report(p.w[2], i);
                continue;
            }
            out[obase + id * ostep] += tg_cvt<T, V, B>(gp[gbase + i * (tg_i64)g.stride[axis]]);
        }
    }
}
// gather. w: out, axis, rows, flag, x ref, index ref
template <int I, int T, int V, int B> __device__ void tg_gather_index(const tg_node_args& p) {
    typename tg_ty<T>::S* out = (typename tg_ty<T>::S*)p.w[0];
    const int axis = (int)p.w[1];
    const tg_i64 rows = (tg_i64)p.w[2];
    const tg_ref x = tg_ref_at(p, 4);
    const tg_ref index = tg_ref_at(p, 6 + 2 * x.rank);
    const typename tg_ty<B>::S* xp = (const typename tg_ty<B>::S*)x.p;
    TG_GRID_LOOP(e, tg_numel(index)) {
        tg_i64 r = e, off = 0;
        for (int a = index.rank - 1; a >= 0; --a) {
            if (a != axis) off += (r % (tg_i64)index.ext[a]) * (tg_i64)x.stride[a];
            r /= (tg_i64)index.ext[a];
        }
        const tg_i64 id = tg_id<I>(index, e);
        if (id < 0 || id >= rows) {
            tg_report(p.w[3], e);
            continue;
        }
        out[e] = tg_cvt<T, V, B>(xp[off + id * (tg_i64)x.stride[axis]]);
    }
}
// gather's backward (T f32/f64). w: out, axis, flag, g ref, index ref, out extents
template <int I, int T, int V, int B> __device__ void tg_gather_backward(const tg_node_args& p) {
    typename tg_ty<T>::S* out = (typename tg_ty<T>::S*)p.w[0];
    const int axis = (int)p.w[1];
    const tg_ref g = tg_ref_at(p, 3);
    const tg_ref index = tg_ref_at(p, 5 + 2 * g.rank);
    const tg_u64* oext = p.w + 7 + 2 * g.rank + 2 * index.rank;
    const typename tg_ty<B>::S* gp = (const typename tg_ty<B>::S*)g.p;
    const tg_i64 rows = (tg_i64)oext[axis], len = (tg_i64)index.ext[axis];
    tg_i64 lines = 1;
    for (int a = 0; a < index.rank; ++a)
        if (a != axis) lines *= (tg_i64)oext[a];
    TG_GRID_LOOP(line, lines) {
        // the line's coordinates in out (every axis but axis), its position in index if inside
        tg_i64 r = line, obase = 0, scale = 1, ostep = 1, ebase = 0, escale = 1, estep = 1;
        bool inside = true;
        for (int a = index.rank - 1; a >= 0; --a) {
            if (a == axis) {
                ostep = scale;
                estep = escale;
            } else {
                const tg_i64 i = r % (tg_i64)oext[a];
                r /= (tg_i64)oext[a];
                obase += i * scale;
                inside = inside && i < (tg_i64)index.ext[a];
                ebase += i * escale;
            }
            scale *= (tg_i64)oext[a];
            escale *= (tg_i64)index.ext[a];
        }
        for (tg_i64 k = 0; k < rows; ++k) out[obase + k * ostep] = 0;
        if (!inside) continue;
        for (tg_i64 i = 0; i < len; ++i) {
            const tg_i64 e = ebase + i * estep;
            const tg_i64 id = tg_id<I>(index, e);
            if (id < 0 || id >= rows) {
                tg_report(p.w[2], e);
                continue;
            }
            out[obase + id * ostep] += tg_cvt<T, V, B>(gp[tg_ref_offset(g, e)]);
        }
    }
}
// dynamic_slice (mode 0) and its adjoint (mode 1). w: out, axis, length, mode, flag, start ref,
// src ref, out extents
template <int I, int T, int V, int B> __device__ void tg_dynamic_slice(const tg_node_args& p) {
    typename tg_ty<T>::S* out = (typename tg_ty<T>::S*)p.w[0];
    const int axis = (int)p.w[1];
    const tg_i64 length = (tg_i64)p.w[2];
    const bool adjoint = p.w[3] != 0;
    const tg_ref start = tg_ref_at(p, 5);
    const tg_ref src = tg_ref_at(p, 7 + 2 * start.rank);
    const tg_u64* oext = p.w + 9 + 2 * start.rank + 2 * src.rank;
    const typename tg_ty<B>::S* sp = (const typename tg_ty<B>::S*)src.p;
    const tg_i64 extent = adjoint ? (tg_i64)oext[axis] : (tg_i64)src.ext[axis];
    const tg_i64 s = tg_id<I>(start, 0), b = s < 0 ? s + extent : s;
    if (b < 0 || b + length > extent) {
        tg_report(p.w[4], 0);
        return;
    }
    tg_i64 n = 1;
    for (int a = 0; a < src.rank; ++a) n *= (tg_i64)oext[a];
    TG_GRID_LOOP(e, n) {
        tg_i64 r = e, off = 0;
        bool inside = true;
        for (int a = src.rank - 1; a >= 0; --a) {
            tg_i64 i = r % (tg_i64)oext[a];
            r /= (tg_i64)oext[a];
            if (a == axis) {
                if (adjoint) {
                    inside = i >= b && i < b + length;
                    i -= b;
                } else {
                    i += b;
                }
            }
            off += i * (tg_i64)src.stride[a];
        }
        out[e] = inside ? tg_cvt<T, V, B>(sp[off]) : tg_ty<T>::to((typename tg_ty<T>::C)0);
    }
}
// concat of up to 5 operands of any dtypes. w: out, axis, count, then per operand its buffer
// and value codes (B * 8 + V) and its ref
__device__ __forceinline__ double tg_load_any(int code, const void* p, tg_i64 off) {
    switch (code) {
        case 0: return ((const float*)p)[off];
        case 1: return ((const double*)p)[off];
        case 2: return tg_from_bf16(((const unsigned short*)p)[off]);
        default: return tg_from_f16(((const unsigned short*)p)[off]);
    }
}
template <int T> __device__ void tg_concat(const tg_node_args& p) {
    typename tg_ty<T>::S* out = (typename tg_ty<T>::S*)p.w[0];
    const int axis = (int)p.w[1], count = (int)p.w[2];
    int at[5];
    tg_i64 begin[6];
    begin[0] = 0;
    for (int k = 0, w = 3; k < count; ++k) {
        at[k] = w;
        begin[k + 1] = begin[k] + (tg_i64)p.w[w + 3 + axis];
        w += 3 + 2 * (int)p.w[w + 2];
    }
    const tg_ref first = tg_ref_at(p, at[0] + 1);
    tg_i64 outer = 1, inner = 1;
    for (int a = 0; a < axis; ++a) outer *= (tg_i64)first.ext[a];
    for (int a = axis + 1; a < first.rank; ++a) inner *= (tg_i64)first.ext[a];
    const tg_i64 total = begin[count];
    TG_GRID_LOOP(e, outer * total * inner) {
        const tg_i64 o = e / (total * inner), rest = e % (total * inner), pos = rest / inner, q = rest % inner;
        int k = 0;
        while (pos >= begin[k + 1]) ++k;
        const tg_ref x = tg_ref_at(p, at[k] + 1);
        const int codes = (int)p.w[at[k]];
        const tg_i64 len = begin[k + 1] - begin[k];
        double v = tg_load_any(codes >> 3, x.p, tg_ref_offset(x, o * len * inner + (pos - begin[k]) * inner + q));
        if ((codes & 7) != 1) v = (double)(float)v;  // the operand's value type
        out[e] = tg_ty<T>::to((typename tg_ty<T>::C)v);
    }
}
)CUDA";

// Parameter words of the scatter-add backwards (tg_index_add, tg_gather_backward): out, axis,
// flag, g, the ids, then the result's extents.
template <class Ref>
inline void scatter_add_words(std::size_t axis, const Ref* in, void* out, const std::size_t* ext, std::uint64_t* w,
                              void* flag) {
    w[0] = device_word(out);
    w[1] = axis;
    w[2] = device_word(flag);
    const std::size_t at = put_device_ref(w, put_device_ref(w, 3, in[0]), in[1]);
    for (std::size_t a = 0; a < in[0].rank; ++a) w[at + a] = ext[a];
}
// A scatter-add's lines (one device thread each): the product of the extents but the axis'.
inline std::size_t lines_but(std::size_t axis, const std::size_t* ext, std::size_t rank) {
    std::size_t lines = 1;
    for (std::size_t a = 0; a < rank; ++a)
        if (a != axis) lines *= ext[a];
    return lines;
}

// A scatter-add of rows over the thread pool (embedding's and index_select's backwards): the
// result is `rows` rows of `width` elements, accumulated in C (out itself when T is C, else a
// buffer rounded into out row by row). Tasks own ranges of rows [r0, r1): each zero-fills them,
// then add(r0, r1, acc) adds every contribution to those rows in the ids' order, then (T not C)
// stores them. Every element is summed by one task in one order: the bits of one thread on any
// number of threads, and each task writes whole rows, contiguous. cost: operations per row.
template <class C, class T, class Add>
void scatter_add_rows(std::size_t rows, std::size_t width, std::size_t cost, T* out, Add&& add) {
    const dense_output<C, T> acc(out, rows * width);
    C* const a = acc.data;
    parallel_ranges(rows, cost, [&](std::size_t r0, std::size_t r1) {
        std::fill(a + r0 * width, a + r1 * width, C(0));
        add(r0, r1, a);
        if constexpr (!std::is_same_v<C, T>)
            for (std::size_t i = r0 * width; i < r1 * width; ++i) out[i] = T(a[i]);
    });
}

// ---- embedding: out[i..., :] = table[ids[i...], :] -------------------------------------------
// ZeroPadding: rows of padding ids are written as zeros (the adjoint of embedding_backward).
template <std::int64_t Padding, bool ZeroPadding>
struct embedding_op : kernel_op_base {
    static constexpr const char* name = "embedding";
    static constexpr const char* device_source = index_device_source;
    template <class N>
    static std::string device_call() {
        return device_call_of<N, 0, 1>("tg_embedding");
    }
    template <class N, class Ref>
    static std::size_t device_words(const Ref* in, void* out, const std::size_t*, std::uint64_t* w, void* flag) {
        const std::size_t rows = in[1].ext[0], dim = in[1].ext[1];
        w[0] = device_word(out);
        w[1] = dim;
        w[2] = rows;
        w[3] = std::uint64_t(Padding < 0 ? Padding + std::int64_t(rows) : Padding);
        w[4] = Padding != no_padding;
        w[5] = ZeroPadding;
        w[6] = device_word(flag);
        put_device_ref(w, put_device_ref(w, 7, in[0]), in[1]);
        return numel_of(in[0]) * (dim > 0 ? dim : 1);
    }
    template <class N, class Ref>
    static void device_check(const Ref* in, std::size_t position, device_copy copy) {
        throw_bad_device_id<typename type_at_t<0, typename N::children>::value_type>("embedding(ids, table)", in[0], position,
                                                                                   in[1].ext[0], copy);
    }
    static constexpr bool differentiable = true;
    static constexpr bool shape_only(std::size_t) { return false; }
    template <class Ids, class Table>
    struct rule {
        template <std::size_t... Is>
        static auto make(std::index_sequence<Is...>)
            -> shape<Ids::shape_type::extents[Is]..., Table::shape_type::extents[1]>;
        using value_type = typename Table::value_type;
        using shape_type = decltype(make(std::make_index_sequence<Ids::shape_type::rank>{}));
    };
    template <class N, class Ref>
    static void extents(const Ref* in, std::size_t* ext) {
        using Id = typename type_at_t<0, typename N::children>::value_type;
        for (std::size_t a = 0; a < in[0].rank; ++a) ext[a] = in[0].ext[a];
        ext[in[0].rank] = in[1].ext[1];
        check_ids<Id>("embedding(ids, table)", in[0], in[1].ext[0]);
    }
    template <class N, class Ref, class T>
    static void run(const Ref* in, T* out, const std::size_t*) {
        using Id = typename type_at_t<0, typename N::children>::value_type;
        using Table = type_at_t<1, typename N::children>;
        using B = buffer_t<Table>;
        const Ref& ids = in[0];
        const Ref& table = in[1];
        const std::size_t rows = table.ext[0], dim = table.ext[1], n = numel_of(ids);
        check_ids<Id>("embedding(ids, table)", ids, rows);
        const auto* idp = static_cast<const Id*>(ids.data);
        const auto* tp = static_cast<const B*>(table.data);
        // each output row is its own: ranges of ids over the pool, the same values on any count
        parallel_ranges(n, dim, [&](std::size_t e0, std::size_t e1) {
            for (std::size_t e = e0; e < e1; ++e) {
                const auto id = std::int64_t(idp[strided_offset(ids, e)]);
                T* o = out + e * dim;
                if (ZeroPadding && is_padding<Padding>(id, rows)) {
                    std::fill_n(o, dim, T(0.0f));
                    continue;
                }
                // an element loop, not std::copy_n: glibc's memmove copies 2 KB rows with `rep movsb`,
                // 8% slower for the whole step on an AMD EPYC host
                const B* row = tp + std::ptrdiff_t(id) * table.stride[0];
                for (std::size_t j = 0; j < dim; ++j)
                    o[j] = convert_element<T, typename Table::value_type>(row[std::ptrdiff_t(j) * table.stride[1]]);
            }
        });
    }
    template <std::size_t I, class G, class Out, class Ids, class Table>
    static constexpr auto vjp(G g, Out, Ids ids, Table table);
};

// The table's gradient: zeros of the table's shape, each row of g added to its id's row, in
// order; padding rows get nothing. Operands: g, ids, table (shape only).
template <std::int64_t Padding>
struct embedding_backward_op : kernel_op_base {
    static constexpr const char* name = "embedding_backward";
    static constexpr const char* device_source = index_device_source;
    template <class N>
    static std::string device_call() {
        static_assert(device_accumulates_v<buffer_t<N>>,
                      "typegrad: cuda: the backward of embedding into a bf16/f16 gradient has no device kernel yet (it "
                      "accumulates in f32 on the CPU); keep that operand f32 or evaluate with host bindings");
        return device_call_of<N, 1, 0>("tg_embedding_backward");
    }
    template <class N, class Ref>
    static std::size_t device_words(const Ref* in, void* out, const std::size_t* ext, std::uint64_t* w, void* flag) {
        w[0] = device_word(out);
        w[1] = ext[1];
        w[2] = ext[0];
        w[3] = std::uint64_t(Padding < 0 ? Padding + std::int64_t(ext[0]) : Padding);
        w[4] = Padding != no_padding;
        w[5] = device_word(flag);
        put_device_ref(w, put_device_ref(w, 6, in[0]), in[1]);
        return ext[1] > 0 ? ext[1] : 1;
    }
    template <class N, class Ref>
    static void device_check(const Ref* in, std::size_t position, device_copy copy) {
        throw_bad_device_id<typename type_at_t<1, typename N::children>::value_type>("embedding(ids, table)", in[1], position,
                                                                                   in[2].ext[0], copy);
    }
    static constexpr bool differentiable = true;
    static constexpr bool shape_only(std::size_t i) { return i == 2; }
    template <class G, class Ids, class Table>
    struct rule {
        using value_type = typename G::value_type;
        using shape_type = typename Table::shape_type;
    };
    template <class N, class Ref>
    static void extents(const Ref* in, std::size_t* ext) {
        ext[0] = in[2].ext[0];
        ext[1] = in[2].ext[1];
    }
    template <class N, class Ref, class T>
    static void run(const Ref* in, T* out, const std::size_t* ext) {
        using Gn = type_at_t<0, typename N::children>;
        using Id = typename type_at_t<1, typename N::children>::value_type;
        using B = buffer_t<Gn>;
        using C = compute_t<T>;
        const Ref& g = in[0];
        const Ref& ids = in[1];
        const std::size_t rows = ext[0], dim = ext[1], n = numel_of(ids);
        check_ids<Id>("embedding(ids, table)", ids, rows);
        const auto* idp = static_cast<const Id*>(ids.data);
        const auto* gp = static_cast<const B*>(g.data);
        // Each id's row of acc (rows for a padding id: added nowhere) and g's offset of its row
        // (g has the ids' axes then the embedding axis), once for all tasks.
        pooled_buffer<std::ptrdiff_t> at(2 * n);
        std::ptrdiff_t* const atp = at.data();
        parallel_ranges(n, 4, [&](std::size_t e0, std::size_t e1) {
            row_walk<Ref> at_id(ids, ids.rank, e0), at_g(g, g.rank - 1, e0);
            for (std::size_t e = e0; e < e1; ++e, at_id.next(), at_g.next()) {
                const auto id = std::int64_t(idp[at_id.offset]);
                atp[2 * e] = is_padding<Padding>(id, rows) ? std::ptrdiff_t(rows) : std::ptrdiff_t(id);
                atp[2 * e + 1] = at_g.offset;
            }
        });
        const std::ptrdiff_t gj = g.stride[g.rank - 1];
        // Each task scans all ids and adds the g rows of those in its rows (by rows rather than by
        // columns: whole rows written, the zero-fill part of the same pass).
        const std::size_t cost = dim + (n * dim + rows - 1) / std::max<std::size_t>(rows, 1);  // per row
        scatter_add_rows<C>(rows, dim, cost, out, [&](std::size_t r0, std::size_t r1, C* acc) {
            for (std::size_t e = 0; e < n; ++e) {
                const auto r = std::size_t(atp[2 * e]);
                if (r < r0 || r >= r1) continue;  // another task's row, or padding
                C* row = acc + r * dim;
                const B* src = gp + atp[2 * e + 1];
                for (std::size_t j = 0; j < dim; ++j)
                    row[j] += static_cast<C>(convert_element<T, typename Gn::value_type>(src[std::ptrdiff_t(j) * gj]));
            }
        });
    }
    // The offsets of the row-major positions e, e + 1, ... over the first `rank` axes of r (for g:
    // its rows), one step at a time (an odometer: no division per position).
    template <class Ref>
    struct row_walk {
        const Ref& r;
        std::size_t rank;
        std::ptrdiff_t offset = 0;
        std::size_t index[max_rank] = {};
        row_walk(const Ref& r_, std::size_t rank_, std::size_t e) : r(r_), rank(rank_) {
            for (std::size_t a = rank; e > 0 && a-- > 0;) {
                index[a] = e % r.ext[a];
                e /= r.ext[a];
                offset += std::ptrdiff_t(index[a]) * r.stride[a];
            }
        }
        void next() {
            for (std::size_t a = rank; a-- > 0;) {
                offset += r.stride[a];
                if (++index[a] < r.ext[a]) return;
                offset -= std::ptrdiff_t(index[a]) * r.stride[a];
                index[a] = 0;
            }
        }
    };
    template <std::size_t I, class G, class Out, class Gr, class Ids, class Table>
    static constexpr auto vjp(G g, Out, Gr, Ids ids, Table);
};

// ---- index_select along Axis: out = x with axis Axis taken at ids (a vector) ------------------
template <std::size_t Axis>
struct index_select_op : kernel_op_base {
    static constexpr const char* name = "index_select";
    static constexpr const char* device_source = index_device_source;
    template <class N>
    static std::string device_call() {
        return device_call_of<N, 1, 0>("tg_index_select");
    }
    template <class N, class Ref>
    static std::size_t device_words(const Ref* in, void* out, const std::size_t* ext, std::uint64_t* w, void* flag) {
        w[0] = device_word(out);
        w[1] = Axis;
        w[2] = in[0].ext[Axis];
        w[3] = device_word(flag);
        put_device_ref(w, put_device_ref(w, 4, in[0]), in[1]);
        std::size_t n = 1;
        for (std::size_t a = 0; a < in[0].rank; ++a) n *= ext[a];
        return n;
    }
    template <class N, class Ref>
    static void device_check(const Ref* in, std::size_t position, device_copy copy) {
        throw_bad_device_id<typename type_at_t<1, typename N::children>::value_type>("index_select(x, ids)", in[1], position,
                                                                                   in[0].ext[Axis], copy);
    }
    static constexpr bool differentiable = true;
    static constexpr bool shape_only(std::size_t) { return false; }
    template <class X, class Ids>
    struct rule {
        template <std::size_t... Is>
        static auto make(std::index_sequence<Is...>)
            -> shape<(Is == Axis ? Ids::shape_type::extents[0] : X::shape_type::extents[Is])...>;
        using value_type = typename X::value_type;
        using shape_type = decltype(make(std::make_index_sequence<X::shape_type::rank>{}));
    };
    template <class N, class Ref>
    static void extents(const Ref* in, std::size_t* ext) {
        using Id = typename type_at_t<1, typename N::children>::value_type;
        for (std::size_t a = 0; a < in[0].rank; ++a) ext[a] = a == Axis ? in[1].ext[0] : in[0].ext[a];
        check_ids<Id>("index_select(x, ids)", in[1], in[0].ext[Axis]);
    }
    template <class N, class Ref, class T>
    static void run(const Ref* in, T* out, const std::size_t* ext) {
        using X = type_at_t<0, typename N::children>;
        using Id = typename type_at_t<1, typename N::children>::value_type;
        using B = buffer_t<X>;
        const Ref& x = in[0];
        const Ref& ids = in[1];
        check_ids<Id>("index_select(x, ids)", ids, x.ext[Axis]);
        const auto* xp = static_cast<const B*>(x.data);
        const auto* idp = static_cast<const Id*>(ids.data);
        std::size_t n = 1;
        for (std::size_t a = 0; a < x.rank; ++a) n *= ext[a];
        for (std::size_t e = 0; e < n; ++e) {
            std::size_t r = e;
            std::ptrdiff_t off = 0;
            for (std::size_t a = x.rank; a-- > 0;) {
                std::size_t i = r % ext[a];
                r /= ext[a];
                if (a == Axis) i = std::size_t(idp[std::ptrdiff_t(i) * ids.stride[0]]);
                off += std::ptrdiff_t(i) * x.stride[a];
            }
            out[e] = convert_element<T, typename X::value_type>(xp[off]);
        }
    }
    template <std::size_t I, class G, class Out, class X, class Ids>
    static constexpr auto vjp(G g, Out, X x, Ids ids);
};

// x's gradient: zeros like x, g's slices along Axis added at their ids, in order. Operands:
// g, ids, x (shape only).
template <std::size_t Axis>
struct index_add_op : kernel_op_base {
    static constexpr const char* name = "index_select_backward";
    static constexpr const char* device_source = index_device_source;
    template <class N>
    static std::string device_call() {
        static_assert(device_accumulates_v<buffer_t<N>>,
                      "typegrad: cuda: the backward of index_select into a bf16/f16 gradient has no device kernel yet (it "
                      "accumulates in f32 on the CPU); keep that operand f32 or evaluate with host bindings");
        return device_call_of<N, 1, 0>("tg_index_add");
    }
    template <class N, class Ref>
    static std::size_t device_words(const Ref* in, void* out, const std::size_t* ext, std::uint64_t* w, void* flag) {
        scatter_add_words(Axis, in, out, ext, w, flag);
        return lines_but(Axis, in[0].ext, in[0].rank);
    }
    template <class N, class Ref>
    static void device_check(const Ref* in, std::size_t position, device_copy copy) {
        throw_bad_device_id<typename type_at_t<1, typename N::children>::value_type>("index_select(x, ids)", in[1], position,
                                                                                   in[2].ext[Axis], copy);
    }
    static constexpr bool differentiable = true;
    static constexpr bool shape_only(std::size_t i) { return i == 2; }
    template <class G, class Ids, class X>
    struct rule {
        using value_type = typename G::value_type;
        using shape_type = typename X::shape_type;
    };
    template <class N, class Ref>
    static void extents(const Ref* in, std::size_t* ext) {
        for (std::size_t a = 0; a < in[2].rank; ++a) ext[a] = in[2].ext[a];
    }
    template <class N, class Ref, class T>
    static void run(const Ref* in, T* out, const std::size_t* ext) {
        using Gn = type_at_t<0, typename N::children>;
        using Id = typename type_at_t<1, typename N::children>::value_type;
        using B = buffer_t<Gn>;
        using C = compute_t<T>;
        const Ref& g = in[0];
        const Ref& ids = in[1];
        check_ids<Id>("index_select(x, ids)", ids, ext[Axis]);
        const auto* gp = static_cast<const B*>(g.data);
        const auto* idp = static_cast<const Id*>(ids.data);
        std::size_t total = 1;
        for (std::size_t a = 0; a < g.rank; ++a) total *= ext[a];
        // g dense: g as [outer, L, inner] and the gradient as [outer, E, inner], whose rows (outer,
        // e) go over the pool as embedding's: each task adds, for each of its outers, the g rows
        // whose ids fall in its rows, in the ids' order (the order of the general loop below)
        if (total == 0) return;
        if (is_row_major(g)) {
            std::size_t outer = 1, inner = 1;
            for (std::size_t a = 0; a < Axis; ++a) outer *= ext[a];
            for (std::size_t a = Axis + 1; a < g.rank; ++a) inner *= ext[a];
            const std::size_t L = g.ext[Axis], E = ext[Axis];
            scatter_add_rows<C>(outer * E, inner, inner * (L / E + 1), out, [&](std::size_t r0, std::size_t r1, C* dx) {
                for (std::size_t o = r0 / E; o * E < r1; ++o) {
                    const std::size_t lo = std::max(r0, o * E) - o * E, hi = std::min(r1, (o + 1) * E) - o * E;
                    for (std::size_t k = 0; k < L; ++k) {
                        const auto id = std::size_t(idp[std::ptrdiff_t(k) * ids.stride[0]]);
                        if (id < lo || id >= hi) continue;
                        C* d = dx + (o * E + id) * inner;
                        const B* s = gp + (o * L + k) * inner;
                        for (std::size_t i = 0; i < inner; ++i)
                            d[i] += static_cast<C>(convert_element<T, typename Gn::value_type>(s[i]));
                    }
                }
            });
            return;
        }
        pooled_buffer<C> acc(total, C(0));
        const std::size_t n = numel_of(g);
        for (std::size_t e = 0; e < n; ++e) {  // g in row-major order: ids in order on each line
            std::size_t r = e, o = 0, scale = 1;
            for (std::size_t a = g.rank; a-- > 0;) {
                std::size_t i = r % g.ext[a];
                r /= g.ext[a];
                if (a == Axis) i = std::size_t(idp[std::ptrdiff_t(i) * ids.stride[0]]);
                o += i * scale;
                scale *= ext[a];
            }
            acc[o] += static_cast<C>(convert_element<T, typename Gn::value_type>(gp[strided_offset(g, e)]));
        }
        for (std::size_t i = 0; i < total; ++i) out[i] = T(acc[i]);
    }
    template <std::size_t I, class G, class Out, class Gr, class Ids, class X>
    static constexpr auto vjp(G g, Out, Gr, Ids ids, X);
};

// ---- gather along Axis: out[i] = x[i with axis Axis replaced by index[i]] ---------------------
// index has x's rank; its extents may be smaller than x's on the other axes (torch.gather).
template <std::size_t Axis>
struct gather_op : kernel_op_base {
    static constexpr const char* name = "gather";
    static constexpr const char* device_source = index_device_source;
    template <class N>
    static std::string device_call() {
        return device_call_of<N, 1, 0>("tg_gather_index");
    }
    template <class N, class Ref>
    static std::size_t device_words(const Ref* in, void* out, const std::size_t*, std::uint64_t* w, void* flag) {
        w[0] = device_word(out);
        w[1] = Axis;
        w[2] = in[0].ext[Axis];
        w[3] = device_word(flag);
        put_device_ref(w, put_device_ref(w, 4, in[0]), in[1]);
        return numel_of(in[1]);
    }
    template <class N, class Ref>
    static void device_check(const Ref* in, std::size_t position, device_copy copy) {
        throw_bad_device_id<typename type_at_t<1, typename N::children>::value_type>("gather(x, index)", in[1], position,
                                                                                   in[0].ext[Axis], copy);
    }
    static constexpr bool differentiable = true;
    static constexpr bool shape_only(std::size_t) { return false; }
    template <class X, class Index>
    struct rule {
        using value_type = typename X::value_type;
        using shape_type = typename Index::shape_type;
    };
    template <class Ref>
    static void check(const Ref& x, const Ref& index, const char* op) {
        for (std::size_t a = 0; a < x.rank; ++a)
            if (a != Axis && index.ext[a] > x.ext[a])
                fail<shape_error>({"typegrad: ", op, ": index extent ", index.ext[a], " on axis ", a,
                                   " exceeds x's extent ", x.ext[a]});
    }
    template <class N, class Ref>
    static void extents(const Ref* in, std::size_t* ext) {
        using Id = typename type_at_t<1, typename N::children>::value_type;
        check(in[0], in[1], "gather(x, index)");
        for (std::size_t a = 0; a < in[1].rank; ++a) ext[a] = in[1].ext[a];
        check_ids<Id>("gather(x, index)", in[1], in[0].ext[Axis]);
    }
    template <class N, class Ref, class T>
    static void run(const Ref* in, T* out, const std::size_t* ext) {
        using X = type_at_t<0, typename N::children>;
        using Id = typename type_at_t<1, typename N::children>::value_type;
        using B = buffer_t<X>;
        const Ref& x = in[0];
        const Ref& index = in[1];
        check_ids<Id>("gather(x, index)", index, x.ext[Axis]);
        const auto* xp = static_cast<const B*>(x.data);
        const auto* ip = static_cast<const Id*>(index.data);
        const std::size_t n = numel_of(index);
        for (std::size_t e = 0; e < n; ++e) {
            std::size_t r = e;
            std::ptrdiff_t off = 0;
            for (std::size_t a = index.rank; a-- > 0;) {
                if (a != Axis) off += std::ptrdiff_t(r % ext[a]) * x.stride[a];
                r /= ext[a];
            }
            off += std::ptrdiff_t(ip[strided_offset(index, e)]) * x.stride[Axis];
            out[e] = convert_element<T, typename X::value_type>(xp[off]);
        }
    }
    template <std::size_t I, class G, class Out, class X, class Index>
    static constexpr auto vjp(G g, Out, X x, Index index);
};

// x's gradient: zeros like x, each g[i] added at x's position of out[i], in order. Operands:
// g, index, x (shape only).
template <std::size_t Axis>
struct gather_backward_op : kernel_op_base {
    static constexpr const char* name = "gather_backward";
    static constexpr const char* device_source = index_device_source;
    template <class N>
    static std::string device_call() {
        static_assert(device_accumulates_v<buffer_t<N>>,
                      "typegrad: cuda: the backward of gather into a bf16/f16 gradient has no device kernel yet (it "
                      "accumulates in f32 on the CPU); keep that operand f32 or evaluate with host bindings");
        return device_call_of<N, 1, 0>("tg_gather_backward");
    }
    template <class N, class Ref>
    static std::size_t device_words(const Ref* in, void* out, const std::size_t* ext, std::uint64_t* w, void* flag) {
        scatter_add_words(Axis, in, out, ext, w, flag);
        return lines_but(Axis, ext, in[1].rank);
    }
    template <class N, class Ref>
    static void device_check(const Ref* in, std::size_t position, device_copy copy) {
        throw_bad_device_id<typename type_at_t<1, typename N::children>::value_type>("gather(x, index)", in[1], position,
                                                                                   in[2].ext[Axis], copy);
    }
    static constexpr bool differentiable = true;
    static constexpr bool shape_only(std::size_t i) { return i == 2; }
    template <class G, class Index, class X>
    struct rule {
        using value_type = typename G::value_type;
        using shape_type = typename X::shape_type;
    };
    template <class N, class Ref>
    static void extents(const Ref* in, std::size_t* ext) {
        for (std::size_t a = 0; a < in[2].rank; ++a) ext[a] = in[2].ext[a];
    }
    template <class N, class Ref, class T>
    static void run(const Ref* in, T* out, const std::size_t* ext) {
        using Gn = type_at_t<0, typename N::children>;
        using Id = typename type_at_t<1, typename N::children>::value_type;
        using B = buffer_t<Gn>;
        using C = compute_t<T>;
        const Ref& g = in[0];
        const Ref& index = in[1];
        check_ids<Id>("gather(x, index)", index, ext[Axis]);
        const auto* gp = static_cast<const B*>(g.data);
        const auto* ip = static_cast<const Id*>(index.data);
        const std::size_t rank = index.rank;
        std::size_t total = 1;
        for (std::size_t a = 0; a < rank; ++a) total *= ext[a];
        const dense_output<C, T> acc(out, total);  // out itself for f32/f64
        C* const dx = acc.data;
        std::fill_n(dx, total, C(0));
        std::size_t dstride[max_rank + 1] = {};  // the gradient's row-major strides
        for (std::size_t a = rank, s = 1; a-- > 0; s *= ext[a]) dstride[a] = s;
        // Lines: index's elements with equal coordinates but along Axis write the same line of
        // the gradient and no other's, so lines split over the pool; each adds along Axis in
        // order: every element is summed by one task in one thread's order.
        std::size_t outer = 1, inner = 1;
        for (std::size_t a = 0; a < Axis; ++a) outer *= index.ext[a];
        for (std::size_t a = Axis + 1; a < rank; ++a) inner *= index.ext[a];
        const std::size_t L = index.ext[Axis];
        parallel_ranges(outer * inner, L * (2 * rank + 2), [&](std::size_t l0, std::size_t l1) {
            for (std::size_t line = l0; line < l1; ++line) {
                const std::size_t o = line / inner, i = line % inner;
                std::size_t base = 0;
                for (std::size_t a = rank, r = i; a-- > Axis + 1; r /= index.ext[a]) base += r % index.ext[a] * dstride[a];
                for (std::size_t a = Axis, r = o; a-- > 0; r /= index.ext[a]) base += r % index.ext[a] * dstride[a];
                for (std::size_t k = 0; k < L; ++k) {
                    const std::size_t e = (o * L + k) * inner + i;
                    const auto id = std::size_t(ip[strided_offset(index, e)]);
                    dx[base + id * dstride[Axis]] += static_cast<C>(convert_element<T, typename Gn::value_type>(gp[strided_offset(g, e)]));
                }
            }
        });
        acc.store(out);
    }
    template <std::size_t I, class G, class Out, class Gr, class Index, class X>
    static constexpr auto vjp(G g, Out, Gr, Index index, X);
};

// A start or length operand: one element (rank 0, or rank 1 of extent 1 or dynamic). Keyed by
// the shape alone (a function of the expression type would be named with its whole graph).
template <class S>
constexpr bool one_element_shape() {
    return S::rank == 0 || (S::rank == 1 && (S::extents[0] == 1 || S::extents[0] == dyn));
}
// ---- dynamic_slice along Axis: Length elements from a run-time start -------------------------
// Mode 0: (x, start) -> x with Axis cut to [start, start + Length); mode 1: (g, start, x shape
// only) -> zeros like x with g written there (the adjoint). start is one integer (negative: from
// the end, as torch.narrow); out of range throws tg::shape_error before anything is written (from
// the shape pass when start is a leaf, otherwise before the kernel writes).
// Length == dyn is narrow (a run-time length): mode 0's operands are (x, start, length), the
// length a leaf whose value the shape pass reads (shape_value: the planner sizes buffers before
// anything runs, so a computed length cannot size one); mode 1's are (g, start, x, length), the
// length then g's extent (the length operand only carried for the adjoint's own VJP).
template <std::size_t Axis, std::size_t Length, int Mode>
struct dynamic_slice_op : kernel_op_base {
    static constexpr bool run_time_length = Length == dyn;
    static constexpr const char* name = run_time_length ? (Mode == 0 ? "narrow" : "narrow_backward")
                                                        : (Mode == 0 ? "dynamic_slice" : "dynamic_slice_backward");
    static constexpr const char* device_source = index_device_source;
    template <class N>
    static std::string device_call() {
        return device_call_of<N, 1, 0>("tg_dynamic_slice");
    }
    template <class N, class Ref>
    static std::size_t device_words(const Ref* in, void* out, const std::size_t* ext, std::uint64_t* w, void* flag) {
        w[0] = device_word(out);
        w[1] = Axis;
        w[2] = Mode == 0 ? ext[Axis] : in[0].ext[Axis];  // the length: the slice's extent
        w[3] = Mode;
        w[4] = device_word(flag);
        const std::size_t at = put_device_ref(w, put_device_ref(w, 5, in[1]), in[0]);
        std::size_t n = 1;
        for (std::size_t a = 0; a < in[0].rank; ++a) {
            w[at + a] = ext[a];
            n *= ext[a];
        }
        return n > 0 ? n : 1;
    }
    // the kernel found the start out of range: the CPU's message, from the start's value
    template <class N, class Ref>
    static void device_check(const Ref* in, std::size_t, device_copy copy) {
        using Id = typename type_at_t<1, typename N::children>::value_type;
        Id value{};
        copy(&value, in[1].data, sizeof value);
        Ref start = in[1];
        start.data = &value;
        std::size_t length = Length;
        if constexpr (run_time_length && Mode == 0) {
            using L = typename type_at_t<2, typename N::children>::value_type;
            L l{};
            copy(&l, in[2].data, sizeof l);
            length = std::size_t(l);
        } else if constexpr (run_time_length) {
            length = in[0].ext[Axis];
        }
        start_of<Id>(start, Mode == 0 ? in[0].ext[Axis] : in[2].ext[Axis], length);
        throw shape_error("typegrad: dynamic_slice: internal: the device reported a start the host accepts");
    }
    static constexpr bool differentiable = true;
    static constexpr bool shape_only(std::size_t i) { return Mode == 1 && i >= 2; }
    static constexpr bool shape_value(std::size_t i) { return run_time_length && Mode == 0 && i == 2; }
    template <class... Cs>
    struct rule {
        using source = type_at_t<Mode == 0 ? 0 : 2, type_list<Cs...>>;  // whose extents are kept
        template <std::size_t... Is>
        static auto make(std::index_sequence<Is...>)
            -> shape<(Mode == 0 && Is == Axis ? Length : source::shape_type::extents[Is])...>;
        using value_type = typename type_at_t<0, type_list<Cs...>>::value_type;
        using shape_type = decltype(make(std::make_index_sequence<source::shape_type::rank>{}));
    };
    static std::string label() {
        return run_time_length ? message("narrow<", Axis, ">(x, start, length)")
                               : message("dynamic_slice<", Axis, ", ", Length, ">(x, start)");
    }
    // the start, checked against the axis' extent; -1 when not computed yet
    template <class Id, class Ref>
    static std::ptrdiff_t start_of(const Ref& start, std::size_t extent, std::size_t length) {
        const auto* p = static_cast<const Id*>(start.data);
        if (p == nullptr) return -1;
        const auto s = std::int64_t(p[0]);
        const std::int64_t b = s < 0 ? s + std::int64_t(extent) : s;
        if (b < 0 || std::uint64_t(b) + length > extent)
            fail<shape_error>({"typegrad: ", label(), ": start ", s < 0 ? "-" : "", std::uint64_t(s < 0 ? -s : s),
                               run_time_length ? message(" with length ", length) : std::string(),
                               " leaves the axis' extent ", extent});
        return std::ptrdiff_t(b);
    }
    // mode 0 of narrow: the length operand's value, read by the shape pass (a leaf: bound)
    template <class N, class Ref>
    static std::size_t length_of(const Ref& l, std::size_t extent) {
        using L = typename type_at_t<2, typename N::children>::value_type;
        if (numel_of(l) != 1) fail<shape_error>({"typegrad: ", label(), " takes a length of one element"});
        if (l.data == nullptr)
            fail<binding_error>({"typegrad: ", label(), ": the length's buffer is null (the shape pass reads it "
                                 "before anything runs)"});
        const auto v = std::int64_t(static_cast<const L*>(l.data)[0]);
        if (v < 0 || std::uint64_t(v) > extent)
            fail<shape_error>({"typegrad: ", label(), ": length ", v < 0 ? "-" : "", std::uint64_t(v < 0 ? -v : v),
                               " is not within the axis' extent ", extent});
        return std::size_t(v);
    }
    template <class N, class Ref>
    static void extents(const Ref* in, std::size_t* ext) {
        using Id = typename type_at_t<1, typename N::children>::value_type;
        const Ref& x = in[Mode == 0 ? 0 : 2];
        if (numel_of(in[1]) != 1) fail<shape_error>({"typegrad: ", label(), " takes a start of one element"});
        std::size_t length = Length;
        if constexpr (run_time_length && Mode == 0) length = length_of<N>(in[2], x.ext[Axis]);
        else if constexpr (run_time_length) length = in[0].ext[Axis];
        if (x.ext[Axis] < length)
            fail<shape_error>({"typegrad: ", label(), ": the axis' extent ", x.ext[Axis], " is shorter than the length ",
                               length});
        start_of<Id>(in[1], x.ext[Axis], length);
        for (std::size_t a = 0; a < x.rank; ++a) ext[a] = Mode == 0 && a == Axis ? length : x.ext[a];
    }
    template <class N, class Ref, class T>
    static void run(const Ref* in, T* out, const std::size_t* ext) {
        using Src = type_at_t<0, typename N::children>;
        using Id = typename type_at_t<1, typename N::children>::value_type;
        using B = buffer_t<Src>;
        const Ref& src = in[0];
        const std::size_t extent = Mode == 0 ? src.ext[Axis] : ext[Axis];
        const std::size_t length = Mode == 0 ? ext[Axis] : src.ext[Axis];
        const std::ptrdiff_t b = start_of<Id>(in[1], extent, length);
        const auto* sp = static_cast<const B*>(src.data);
        if constexpr (Mode == 0) {
            std::size_t n = 1;
            for (std::size_t a = 0; a < src.rank; ++a) n *= ext[a];
            for (std::size_t e = 0; e < n; ++e) {
                std::size_t r = e;
                std::ptrdiff_t off = 0;
                for (std::size_t a = src.rank; a-- > 0;) {
                    const std::size_t i = r % ext[a];
                    r /= ext[a];
                    off += std::ptrdiff_t(a == Axis ? i + std::size_t(b) : i) * src.stride[a];
                }
                out[e] = convert_element<T, typename Src::value_type>(sp[off]);
            }
        } else {
            std::size_t total = 1;
            for (std::size_t a = 0; a < src.rank; ++a) total *= ext[a];
            for (std::size_t i = 0; i < total; ++i) out[i] = T(0.0f);
            const std::size_t n = numel_of(src);
            for (std::size_t e = 0; e < n; ++e) {
                std::size_t r = e, o = 0, scale = 1;
                for (std::size_t a = src.rank; a-- > 0;) {
                    const std::size_t i = r % src.ext[a];
                    r /= src.ext[a];
                    o += (a == Axis ? i + std::size_t(b) : i) * scale;
                    scale *= ext[a];
                }
                out[o] = convert_element<T, typename Src::value_type>(sp[strided_offset(src, e)]);
            }
        }
    }
    // mode 0's operands: x, start[, length]; mode 1's: g, start, x (shape only)[, length]
    template <std::size_t I, class G, class Out, class A, class Start, class... Rest>
    static constexpr auto vjp(G g, Out, A a, Start start, Rest... rest) {
        static_assert(I == 0, "typegrad: internal: dynamic_slice's start and length carry no gradient");
        if constexpr (Mode == 0) {
            return make_node<dynamic_slice_op<Axis, Length, 1>>(g, start, a, rest...);
        } else {
            return [&](auto, auto... length) { return make_node<dynamic_slice_op<Axis, Length, 0>>(g, start, length...); }(
                rest...);
        }
    }
};

// ---- concat along Axis of up to 5 operands (longer lists are chained) -----------------------
template <std::size_t Axis>
struct concat_op : kernel_op_base {
    static constexpr const char* name = "concat";
    static constexpr const char* device_source = index_device_source;
    template <class N>
    static std::string device_call() {
        return device_template_call("tg_concat", {device_type_code<buffer_t<N>>()});
    }
    template <class N, class Ref>
    static std::size_t device_words(const Ref* in, void* out, const std::size_t* ext, std::uint64_t* w, void*) {
        w[0] = device_word(out);
        w[1] = Axis;
        w[2] = N::children::size;
        std::size_t at = 3;
        [&]<class... Cs>(type_list<Cs...>) {
            std::size_t k = 0;
            ((w[at] = std::uint64_t(device_type_code<buffer_t<Cs>>() * 8 + device_type_code<typename Cs::value_type>()),
              at = put_device_ref(w, at + 1, in[k++])),
             ...);
        }(typename N::children{});
        std::size_t n = 1;
        for (std::size_t a = 0; a < in[0].rank; ++a) n *= ext[a];
        return n;
    }
    static constexpr bool differentiable = true;
    static constexpr bool shape_only(std::size_t) { return false; }
    template <class... Xs>
    struct rule {
        using first = typename type_at_t<0, type_list<Xs...>>::shape_type;
        static constexpr bool any_dyn = ((Xs::shape_type::extents[Axis] == dyn) || ...);
        static constexpr std::size_t total = (Xs::shape_type::extents[Axis] + ...);
        template <std::size_t... Is>
        static auto make(std::index_sequence<Is...>)
            -> shape<(Is == Axis ? (any_dyn ? dyn : total) : first::extents[Is])...>;
        using value_type = promote_t<typename Xs::value_type...>;
        using shape_type = decltype(make(std::make_index_sequence<first::rank>{}));
    };
    template <class N, class Ref>
    static void extents(const Ref* in, std::size_t* ext) {
        constexpr std::size_t n = N::children::size;
        const std::size_t rank = in[0].rank;
        std::size_t total = 0;
        for (std::size_t k = 0; k < n; ++k) {
            for (std::size_t a = 0; a < rank; ++a)
                if (a != Axis && in[k].ext[a] != in[0].ext[a])
                    fail<shape_error>({"typegrad: concat: operand ", k, " has extent ", in[k].ext[a], " on axis ",
                                       a, " where operand 0 has ", in[0].ext[a]});
            total += in[k].ext[Axis];
        }
        for (std::size_t a = 0; a < rank; ++a) ext[a] = a == Axis ? total : in[0].ext[a];
    }
    template <class N, class Ref, class T>
    static void run(const Ref* in, T* out, const std::size_t* ext) {
        const std::size_t rank = in[0].rank;
        std::size_t outer = 1, inner = 1;
        for (std::size_t a = 0; a < Axis; ++a) outer *= ext[a];
        for (std::size_t a = Axis + 1; a < rank; ++a) inner *= ext[a];
        const std::size_t row = ext[Axis] * inner;
        std::size_t at = 0;  // offset along Axis
        [&]<class... Cs>(type_list<Cs...>) {
            std::size_t k = 0;
            (copy_operand<Cs>(in[k++], out, outer, inner, row, at), ...);
        }(typename N::children{});
    }
    template <class C, class Ref, class T>
    static void copy_operand(const Ref& x, T* out, std::size_t outer, std::size_t inner, std::size_t row, std::size_t& at) {
        using B = buffer_t<C>;
        const auto* xp = static_cast<const B*>(x.data);
        const std::size_t len = x.ext[Axis], count = outer * len * inner;
        for (std::size_t e = 0; e < count; ++e) {
            const std::size_t o = e / (len * inner), rest = e % (len * inner);
            out[o * row + at * inner + rest] = convert_element<T, typename C::value_type>(xp[strided_offset(x, e)]);
        }
        at += len;
    }
    template <std::size_t I, class G, class Out, class... Xs>
    static constexpr auto vjp(G g, Out, Xs... xs);
};

// Operand I's part of a concat's gradient: a view of g. Operands: g, then the concat's operands
// (shape only).
template <std::size_t Axis, std::size_t I>
struct concat_part_op : view_op_base<concat_part_op<Axis, I>> {
    static constexpr const char* name = "concat_part";
    static constexpr bool keeps_contiguity = false;
    static constexpr bool shape_only(std::size_t i) { return i > 0; }
    template <class G, class... Xs>
    using rule = part_rule<I, G, Xs...>;
    template <class N, class Ref>
    static void layout(const Ref* in, std::size_t* ext, std::ptrdiff_t* stride, std::ptrdiff_t& offset) {
        std::size_t before = 0;
        for (std::size_t k = 0; k < I; ++k) before += in[1 + k].ext[Axis];
        for (std::size_t a = 0; a < in[0].rank; ++a) {
            ext[a] = in[1 + I].ext[a];
            stride[a] = in[0].stride[a];
        }
        offset = std::ptrdiff_t(before) * in[0].stride[Axis];
    }
    template <std::size_t J, class G, class Out, class Gr, class... Xs>
    static constexpr auto vjp(G g, Out, Gr, Xs... xs);
};

template <class X, class First>
constexpr bool concat_compatible(std::size_t axis) {
    using SX = typename X::shape_type;
    using SF = typename First::shape_type;
    if (SX::rank != SF::rank) return false;
    for (std::size_t a = 0; a < SX::rank; ++a)
        if (a != axis && SX::extents[a] != dyn && SF::extents[a] != dyn && SX::extents[a] != SF::extents[a])
            return false;
    return true;
}

template <std::size_t Axis, expression... Xs>
constexpr auto concat_node(Xs... xs) {
    return make_node<concat_op<Axis>>(xs...);
}
// groups of at most 5
template <std::size_t Axis, expression X0, expression... Xs>
constexpr auto concat_chain(X0 x0, Xs... xs) {
    if constexpr (sizeof...(Xs) == 0) {
        return x0;
    } else if constexpr (sizeof...(Xs) <= 4) {
        return concat_node<Axis>(x0, xs...);
    } else {
        return [&]<class X1, class X2, class X3, class X4, class... Rest>(X1 x1, X2 x2, X3 x3, X4 x4, Rest... rest) {
            return concat_chain<Axis>(concat_node<Axis>(x0, x1, x2, x3, x4), rest...);
        }(xs...);
    }
}

}  // namespace detail

// torch.nn.functional.embedding(ids, table, padding_idx): table is (rows, dim); the result has
// the ids' shape plus the embedding axis. padding_idx (negative: from the end) gets no gradient.
template <std::int64_t PaddingIdx = no_padding, expression Ids, expression Table>
constexpr auto embedding(Ids ids, Table table) {
    static_assert(is_index_type_v<typename Ids::value_type>,
                  "typegrad: embedding(ids, table) takes integer ids (a tg::input of std::int32_t or std::int64_t).");
    static_assert(Table::shape_type::rank == 2, "typegrad: embedding(ids, table) takes a 2-D table (rows, dim).");
    static_assert(is_dtype_v<typename Table::value_type>, "typegrad: embedding(ids, table) takes a floating table.");
    static_assert(Ids::shape_type::rank + 1 <= detail::max_rank, "typegrad: embedding(ids, table): ids of rank 8 leave no axis for the embedding.");
    static_assert(PaddingIdx == no_padding || Table::shape_type::extents[0] == dyn ||
                      (PaddingIdx < std::int64_t(Table::shape_type::extents[0]) &&
                       PaddingIdx >= -std::int64_t(Table::shape_type::extents[0])),
                  "typegrad: embedding<padding_idx>(ids, table): padding_idx must be within the table's rows.");
    return detail::make_node<detail::embedding_op<PaddingIdx, false>>(ids, table);
}

// torch.index_select(x, axis, ids): ids a vector of integers.
template <int Axis, expression X, expression Ids>
constexpr auto index_select(X x, Ids ids) {
    using S = typename X::shape_type;
    static_assert(is_index_type_v<typename Ids::value_type> && Ids::shape_type::rank == 1,
                  "typegrad: index_select<axis>(x, ids) takes a vector of integer ids (std::int32_t or std::int64_t).");
    static_assert(is_dtype_v<typename X::value_type>, "typegrad: index_select<axis>(x, ids) takes a floating x.");
    static_assert((Axis < 0 ? -Axis <= int(S::rank) : Axis < int(S::rank)),
                  "typegrad: index_select<axis>(x, ids) names an axis x does not have.");
    return detail::make_node<detail::index_select_op<detail::normalize_axis<S>(Axis)>>(x, ids);
}

// torch.gather(x, axis, index): index has x's rank (extents at most x's off the axis); the
// result has index's shape.
template <int Axis, expression X, expression Index>
constexpr auto gather(X x, Index index) {
    using S = typename X::shape_type;
    static_assert(is_index_type_v<typename Index::value_type>,
                  "typegrad: gather<axis>(x, index) takes an integer index (std::int32_t or std::int64_t).");
    static_assert(Index::shape_type::rank == S::rank, "typegrad: gather<axis>(x, index) needs index of x's rank.");
    static_assert(is_dtype_v<typename X::value_type>, "typegrad: gather<axis>(x, index) takes a floating x.");
    static_assert((Axis < 0 ? -Axis <= int(S::rank) : Axis < int(S::rank)),
                  "typegrad: gather<axis>(x, index) names an axis x does not have.");
    return detail::make_node<detail::gather_op<detail::normalize_axis<S>(Axis)>>(x, index);
}

// x.narrow(axis, start, Length) with a run-time start (jax.lax.dynamic_slice_in_dim): start is an
// integer tensor of one element (a tg::input, or computed, e.g. by argmax); the length is part of
// the type, so the result's extent along axis is static. Its gradient scatters into zeros of x.
template <int Axis, std::size_t Length, expression X, expression Start>
constexpr auto dynamic_slice(X x, Start start) {
    using S = typename X::shape_type;
    static_assert(is_index_type_v<typename Start::value_type>,
                  "typegrad: dynamic_slice<axis, length>(x, start) takes an integer start (std::int32_t or std::int64_t).");
    static_assert(detail::one_element_shape<typename Start::shape_type>(),
                  "typegrad: dynamic_slice<axis, length>(x, start) takes a start of one element.");
    static_assert((Axis < 0 ? -Axis <= int(S::rank) : Axis < int(S::rank)),
                  "typegrad: dynamic_slice<axis, length>(x, start) names an axis x does not have.");
    if constexpr (Axis < 0 ? -Axis <= int(S::rank) : Axis < int(S::rank)) {
        constexpr std::size_t a = detail::normalize_axis<S>(Axis);
        static_assert(S::extents[a] == dyn || Length <= S::extents[a],
                      "typegrad: dynamic_slice<axis, length>(x, start): length exceeds the axis' static extent.");
        return detail::make_node<detail::dynamic_slice_op<a, Length, 0>>(x, start);
    } else {
        return x;
    }
}

// x.narrow(axis, start, length) with a run-time length: the result's extent along axis is
// tg::dyn. start is as dynamic_slice's (a leaf or computed, negative from the end); length is an
// integer input of one element (a tg::input or tg::param, bound at each call): the planner sizes
// every buffer before anything runs, so the shape pass reads it (on CUDA, one 8-byte copy to the
// host, as PyTorch's .item()). A length outside [0, extent] or a window leaving the axis throws
// tg::shape_error before anything is written. Its gradient writes g into zeros of x.
template <int Axis, expression X, expression Start, expression Length>
constexpr auto narrow(X x, Start start, Length length) {
    using S = typename X::shape_type;
    static_assert(is_index_type_v<typename Start::value_type>,
                  "typegrad: narrow<axis>(x, start, length) takes an integer start (std::int32_t or std::int64_t).");
    static_assert(detail::one_element_shape<typename Start::shape_type>(),
                  "typegrad: narrow<axis>(x, start, length) takes a start of one element.");
    static_assert(is_index_type_v<typename Length::value_type>,
                  "typegrad: narrow<axis>(x, start, length) takes an integer length (std::int32_t or std::int64_t).");
    static_assert(detail::one_element_shape<typename Length::shape_type>(),
                  "typegrad: narrow<axis>(x, start, length) takes a length of one element.");
    static_assert(is_leaf_v<typename Length::node_type>,
                  "typegrad: narrow<axis>(x, start, length) takes its length from an input (a tg::input or tg::param): "
                  "buffers are sized before anything is computed, so a computed length cannot size one; "
                  "use dynamic_slice<axis, length> with the longest length and tg::where to mask.");
    static_assert((Axis < 0 ? -Axis <= int(S::rank) : Axis < int(S::rank)),
                  "typegrad: narrow<axis>(x, start, length) names an axis x does not have.");
    if constexpr ((Axis < 0 ? -Axis <= int(S::rank) : Axis < int(S::rank)) && is_leaf_v<typename Length::node_type>)
        return detail::make_node<detail::dynamic_slice_op<detail::normalize_axis<S>(Axis), dyn, 0>>(x, start, length);
    else
        return x;
}

// torch.cat(xs, axis): extents equal except along axis; the result has the widest dtype.
template <int Axis = 0, expression X0, expression... Xs>
constexpr auto concat(X0 x0, Xs... xs) {
    using S = typename X0::shape_type;
    static_assert(S::rank >= 1, "typegrad: concat<axis>(xs...) takes tensors of rank 1 or more.");
    static_assert((Axis < 0 ? -Axis <= int(S::rank) : Axis < int(S::rank)),
                  "typegrad: concat<axis>(xs...) names an axis the operands do not have.");
    constexpr std::size_t a = detail::normalize_axis<S>(Axis);
    static_assert((detail::concat_compatible<Xs, X0>(a) && ...),
                  "typegrad: concat<axis>(xs...) needs operands of one rank whose static extents agree on every "
                  "axis but the concatenated one.");
    static_assert(is_dtype_v<typename X0::value_type> && (is_dtype_v<typename Xs::value_type> && ...),
                  "typegrad: concat<axis>(xs...) takes floating expressions.");
    return detail::concat_chain<a>(x0, xs...);
}
// torch.stack(xs, axis): a new axis of extent len(xs).
template <int Axis = 0, expression X0, expression... Xs>
constexpr auto stack(X0 x0, Xs... xs) {
    using S = typename X0::shape_type;
    static_assert((std::is_same_v<typename Xs::shape_type, S> && ...),
                  "typegrad: stack<axis>(xs...) needs operands of one shape.");
    static_assert((Axis < 0 ? -Axis <= int(S::rank) + 1 : Axis <= int(S::rank)),
                  "typegrad: stack<axis>(xs...) names an axis out of range.");
    constexpr int a = Axis < 0 ? int(S::rank) + 1 + Axis : Axis;
    return concat<a>(unsqueeze<a>(x0), unsqueeze<a>(xs)...);
}

namespace detail {
template <std::int64_t Padding, bool ZeroPadding>
template <std::size_t I, class G, class Out, class Ids, class Table>
constexpr auto embedding_op<Padding, ZeroPadding>::vjp(G g, Out, Ids ids, Table table) {
    static_assert(I == 1, "typegrad: internal: embedding's ids carry no gradient");
    return make_node<embedding_backward_op<Padding>>(g, ids, table);
}
template <std::int64_t Padding>
template <std::size_t I, class G, class Out, class Gr, class Ids, class Table>
constexpr auto embedding_backward_op<Padding>::vjp(G g, Out, Gr, Ids ids, Table) {
    static_assert(I == 0, "typegrad: internal: embedding_backward's ids carry no gradient");
    return make_node<embedding_op<Padding, true>>(ids, g);  // padding rows received nothing
}
template <std::size_t Axis>
template <std::size_t I, class G, class Out, class X, class Ids>
constexpr auto index_select_op<Axis>::vjp(G g, Out, X x, Ids ids) {
    static_assert(I == 0, "typegrad: internal: index_select's ids carry no gradient");
    return make_node<index_add_op<Axis>>(g, ids, x);
}
template <std::size_t Axis>
template <std::size_t I, class G, class Out, class Gr, class Ids, class X>
constexpr auto index_add_op<Axis>::vjp(G g, Out, Gr, Ids ids, X) {
    static_assert(I == 0, "typegrad: internal: index_select_backward's ids carry no gradient");
    return make_node<index_select_op<Axis>>(g, ids);
}
template <std::size_t Axis>
template <std::size_t I, class G, class Out, class X, class Index>
constexpr auto gather_op<Axis>::vjp(G g, Out, X x, Index index) {
    static_assert(I == 0, "typegrad: internal: gather's index carries no gradient");
    return make_node<gather_backward_op<Axis>>(g, index, x);
}
template <std::size_t Axis>
template <std::size_t I, class G, class Out, class Gr, class Index, class X>
constexpr auto gather_backward_op<Axis>::vjp(G g, Out, Gr, Index index, X) {
    static_assert(I == 0, "typegrad: internal: gather_backward's index carries no gradient");
    return make_node<gather_op<Axis>>(g, index);
}
template <std::size_t Axis>
template <std::size_t I, class G, class Out, class... Xs>
constexpr auto concat_op<Axis>::vjp(G g, Out, Xs... xs) {
    return make_node<concat_part_op<Axis, I>>(g, xs...);
}
template <std::size_t Axis, std::size_t I>
template <std::size_t J, class G, class Out, class Gr, class... Xs>
constexpr auto concat_part_op<Axis, I>::vjp(G g, Out, Gr, Xs...) {
    // g in part I, zeros elsewhere: a concat of zeros shaped like the other operands
    return [&]<std::size_t... Ks>(std::index_sequence<Ks...>) {
        return make_node<concat_op<Axis>>([&] {
            if constexpr (Ks == I) return g;
            else return broadcast_like(lit<0>, type_at_t<Ks, type_list<Xs...>>{});
        }()...);
    }(std::index_sequence_for<Xs...>{});
}
}  // namespace detail
}  // namespace typegrad
