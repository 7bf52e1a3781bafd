#pragma once
// matmul with PyTorch's shape rules (1-D, 2-D and batched 3-D operands), dot and linear.
// matmul is a kernel boundary: it reads materialised operands (transposed views included, handed
// to the GEMM as transpose flags instead of copies) and writes a dense result.
#include <algorithm>

#include <typegrad/core/cpu/buffer_pool.hpp>
#include <typegrad/core/cpu/gemm.hpp>
#include <typegrad/core/cpu/gemm_half.hpp>
#include <typegrad/core/error.hpp>
#include <typegrad/ops/arithmetic.hpp>
#include <typegrad/ops/autocast_entry.hpp>
#include <typegrad/ops/op_base.hpp>
#include <typegrad/ops/reduce.hpp>
#include <typegrad/ops/view.hpp>

namespace typegrad {
namespace detail {

template <class SA, class SB>
struct matmul_shape {
    static constexpr std::size_t ra = SA::rank, rb = SB::rank;
    static constexpr std::size_t m = SA::extents[ra - 2], k = SA::extents[ra - 1];
    static constexpr std::size_t k2 = SB::extents[rb - 2], n = SB::extents[rb - 1];
    static constexpr std::size_t ba = ra == 3 ? SA::extents[0] : 1, bb = rb == 3 ? SB::extents[0] : 1;
    static constexpr bool batched = ra == 3 || rb == 3;
    static constexpr std::size_t batch = ba == 1 ? bb : bb == 1 ? ba : (ba == dyn ? bb : ba);
    static constexpr bool inner_ok = k == dyn || k2 == dyn || k == k2;
    static constexpr bool batch_ok = ba == 1 || bb == 1 || ba == dyn || bb == dyn || ba == bb;
    using type = std::conditional_t<batched, shape<batch, m, n>, shape<m, n>>;
};

// How a GEMM reads one matmul operand, the host's (core/cpu/gemm.hpp) and cuBLAS alike: by rows
// (unit column stride, leading dimension ld), by columns (transposed: unit row stride), or not at
// all, when neither inner axis is unit-stride: the backend copies it densely (leading dimension
// cols). batch_stride is 0 for an operand broadcast over the batch.
enum class operand_layout : unsigned char { rows, columns, dense_copy };
struct operand_access {
    operand_layout layout;
    std::size_t ld;
    std::ptrdiff_t batch_stride;
};
template <class Ref>
constexpr operand_access operand_access_of(const Ref& r) {
    const std::size_t rows = r.ext[r.rank - 2], cols = r.ext[r.rank - 1];
    const std::ptrdiff_t sr = r.stride[r.rank - 2], sc = r.stride[r.rank - 1];
    const std::ptrdiff_t sb = r.rank == 3 && r.ext[0] != 1 ? r.stride[0] : 0;
    if (sc == 1 && sr >= std::ptrdiff_t(cols) && sr >= 1) return {operand_layout::rows, std::size_t(sr), sb};
    if (sr == 1 && sc >= std::ptrdiff_t(rows) && sc >= 1) return {operand_layout::columns, std::size_t(sc), sb};
    const std::size_t nb = r.rank == 3 ? r.ext[0] : 1;
    return {operand_layout::dense_copy, cols > 0 ? cols : 1, nb == 1 ? 0 : std::ptrdiff_t(rows * cols)};
}

struct matmul_op : kernel_op_base {
    static constexpr const char* name = "matmul";
    static constexpr autocast_class autocast_on(device_kind) { return autocast_class::lower_precision; }
    template <class A, class B>
    struct rule {
        using value_type = promote_t<typename A::value_type, typename B::value_type>;
        using shape_type = typename matmul_shape<typename A::shape_type, typename B::shape_type>::type;
    };

    template <class N, class Ref>
    static void extents(const Ref* in, std::size_t* ext) {
        const Ref& a = in[0];
        const Ref& b = in[1];
        const std::size_t m = a.ext[a.rank - 2], k = a.ext[a.rank - 1];
        const std::size_t k2 = b.ext[b.rank - 2], n = b.ext[b.rank - 1];
        if (k != k2)
            fail<shape_error>({"typegrad: matmul(a, b): a's last extent (", k,
                               ") differs from b's second-to-last (", k2, ")"});
        if constexpr (N::shape_type::rank == 3) {
            const std::size_t ba = a.rank == 3 ? a.ext[0] : 1, bb = b.rank == 3 ? b.ext[0] : 1;
            // Only a static 1 (or a missing batch axis) broadcasts; a dynamic extent bound as 1
            // must match, as everywhere else (README rule 1), or forward() would accept what
            // the backward's reduction rejects.
            using SA = typename type_at_t<0, typename N::children>::shape_type;
            using SB = typename type_at_t<1, typename N::children>::shape_type;
            constexpr bool a_broadcasts = SA::rank < 3 || SA::extents[0] == 1;
            constexpr bool b_broadcasts = SB::rank < 3 || SB::extents[0] == 1;
            if (ba != bb && !a_broadcasts && !b_broadcasts)
                fail<shape_error>({"typegrad: matmul(a, b): batch extents ", ba, " and ", bb,
                                   " differ (dynamic extents must match exactly; they never broadcast)"});
            ext[0] = std::max(ba, bb);
            ext[1] = m;
            ext[2] = n;
        } else {
            ext[0] = m;
            ext[1] = n;
        }
    }

    // One operand as the host GEMM reads it (operand_access_of), densely copied when neither of
    // its two inner axes is unit-stride.
    template <class T, class Ref>
    struct operand {
        const T* data;
        transpose trans;
        std::size_t ld;
        std::size_t batch_stride;
        pooled_buffer<T> copy;  // (kernel temporaries: core/cpu/buffer_pool.hpp)
        explicit operand(const Ref& r) {
            const operand_access access = operand_access_of(r);
            data = static_cast<const T*>(r.data);
            trans = access.layout == operand_layout::columns ? transpose::yes : transpose::no;
            ld = access.ld;
            batch_stride = std::size_t(access.batch_stride);
            if (access.layout == operand_layout::dense_copy) {
                const std::size_t nb = r.rank == 3 ? r.ext[0] : 1;
                const std::size_t rows = r.ext[r.rank - 2], cols = r.ext[r.rank - 1];
                const std::ptrdiff_t sr = r.stride[r.rank - 2], sc = r.stride[r.rank - 1];
                copy = pooled_buffer<T>(nb * rows * cols);
                for (std::size_t b = 0; b < nb; ++b)
                    for (std::size_t i = 0; i < rows; ++i)
                        for (std::size_t j = 0; j < cols; ++j)
                            copy[(b * rows + i) * cols + j] =
                                data[std::ptrdiff_t(b) * (r.rank == 3 ? r.stride[0] : 0) +
                                     std::ptrdiff_t(i) * sr + std::ptrdiff_t(j) * sc];
                data = copy.data();
            }
        }
    };

    template <class N, class Ref, class T>
    static void run(const Ref* in, T* out, const std::size_t* ext) {
        constexpr bool batched = N::shape_type::rank == 3;
        const std::size_t batch = batched ? ext[0] : 1;
        const std::size_t m = ext[batched ? 1 : 0], n = ext[batched ? 2 : 1];
        const std::size_t k = in[0].ext[in[0].rank - 1];
        using SA = buffer_t<type_at_t<0, typename N::children>>;
        using SB = buffer_t<type_at_t<1, typename N::children>>;
        if constexpr (is_reduced_precision_v<T> || is_reduced_precision_v<SA> || is_reduced_precision_v<SB>) {
            // 16-bit operands: f32 accumulation (gemm_half.hpp), one product per batch entry
            static_assert(std::is_same_v<T, buffer_t<N>> && !std::is_same_v<T, double>);
            auto view = [](const Ref& r, std::size_t b, auto* data) {
                const std::ptrdiff_t sb = r.rank == 3 && r.ext[0] != 1 ? r.stride[0] : 0;
                return strided_matrix<std::remove_cv_t<std::remove_pointer_t<decltype(data)>>>{
                    data + std::ptrdiff_t(b) * sb, r.stride[r.rank - 2], r.stride[r.rank - 1]};
            };
            for (std::size_t i = 0; i < batch; ++i)
                gemm_reduced<T>(m, n, k, view(in[0], i, static_cast<const SA*>(in[0].data)),
                                view(in[1], i, static_cast<const SB*>(in[1].data)), out + i * m * n);
        } else {
            operand<T, Ref> a(in[0]), b(in[1]);
            gemm_batched<T>(batch, a.trans, b.trans, m, n, k, a.data, a.ld, a.batch_stride, b.data, b.ld,
                            b.batch_stride, out, n, m * n, false);
        }
    }

    // The device: one strided-batched GEMM of the backend's BLAS (dev.gemm: cuBLAS, column-major),
    // operands read in place by rows or columns as on the host (operand_access_of), or copied
    // dense first (into the backend's scratch: steady-state steps allocate nothing). bf16/f16
    // operands accumulate in f32 and round the product once, as the host's kernel and PyTorch's
    // CUDA matmul do.
    template <class N, class Ref, class Device>
    static void device_run(const Ref* in, void* out, const std::size_t* ext, Device& dev) {
        using S = storage_t<typename N::value_type>;
        constexpr bool batched = N::shape_type::rank == 3;
        const std::size_t batch = batched ? ext[0] : 1;
        const std::size_t rows = ext[batched ? 1 : 0], cols = ext[batched ? 2 : 1];
        const std::size_t k = in[0].ext[in[0].rank - 1];
        if (batch == 0 || rows == 0 || cols == 0) return;
        if (k == 0) return dev.zero(out, batch * rows * cols * sizeof(S));
        struct device_operand {
            const S* data;
            bool transposed;
            int ld;
            long long batch_stride;
        };
        const operand_access access[2] = {operand_access_of(in[0]), operand_access_of(in[1])};
        scratch_carver sc;  // the dense copies
        std::size_t at[2] = {0, 0};
        for (int i = 0; i < 2; ++i)
            if (access[i].layout == operand_layout::dense_copy) at[i] = sc.take<S>(numel_of(in[i]));
        void* const scratch = sc.bytes > 0 ? dev.scratch(sc.bytes) : nullptr;
        auto operand = [&](int i) {
            device_operand o{static_cast<const S*>(in[i].data), access[i].layout == operand_layout::columns, int(access[i].ld),
                             (long long)access[i].batch_stride};
            if (access[i].layout == operand_layout::dense_copy) o.data = dev.template dense_copy<S>(in[i], sc.at<S>(scratch, at[i]));
            return o;
        };
        const device_operand a = operand(0), b = operand(1);
        // row-major C = A B is column-major C^T = B^T A^T: the BLAS gets B first
        dev.gemm(b.transposed, a.transposed, int(cols), int(rows), int(k), b.data, b.ld, b.batch_stride, a.data, a.ld,
                 a.batch_stride, static_cast<S*>(out), int(cols), (long long)(rows * cols), int(batch));
    }

    template <std::size_t I, class G, class Out, class A, class B>
    static constexpr auto vjp(G g, Out, A a, B b);
};

}  // namespace detail

// PyTorch's matmul for ranks 1-3: 1-D operands get a unit axis that the result drops again.
template <expression A, expression B>
constexpr auto matmul(A a, B b) {
    using SA = typename A::shape_type;
    using SB = typename B::shape_type;
    static_assert(SA::rank >= 1 && SA::rank <= 3 && SB::rank >= 1 && SB::rank <= 3,
                  "typegrad: matmul(a, b) takes operands of rank 1, 2 or 3.");
    if constexpr (SA::rank == 1 && SB::rank == 1) {
        static_assert(SA::extents[0] == dyn || SB::extents[0] == dyn || SA::extents[0] == SB::extents[0],
                      "typegrad: matmul(a, b) of two vectors needs equal lengths.");
        // torch.matmul is on autocast's lower-precision lists whatever the ranks: in a region the
        // vectors are cast like a GEMM's operands (the products then round to that dtype too).
        return sum(detail::lower_precision_entry(a) * detail::lower_precision_entry(b));
    } else if constexpr (SA::rank == 1) {
        return squeeze<-2>(matmul(unsqueeze<0>(a), b));
    } else if constexpr (SB::rank == 1) {
        return squeeze<-1>(matmul(a, unsqueeze<1>(b)));
    } else {
        using rule = detail::matmul_shape<SA, SB>;
        // GCC's note on failure names both shapes, tg::dyn as dyn (detail::shapes_checked)
        static_assert(detail::shapes_checked<detail::shape_text_v<SA, !rule::inner_ok>,
                                             detail::shape_text_v<SB, !rule::inner_ok>, rule::inner_ok>::ok,
                      "typegrad: matmul(a, b) needs a's last extent to equal b's second-to-last extent.");
        static_assert(detail::shapes_checked<detail::shape_text_v<SA, !rule::batch_ok>,
                                             detail::shape_text_v<SB, !rule::batch_ok>, rule::batch_ok>::ok,
                      "typegrad: matmul(a, b) needs equal (or 1) batch extents.");
        return detail::make_node<detail::matmul_op>(a, b);
    }
}

// Inner product of two vectors (fused elementwise, no GEMM). Unlike matmul it promotes in an
// autocast region: torch.dot is on none of PyTorch's autocast lists (LibTorch 1.13: a CPU
// bf16 region leaves dot of f32 vectors in f32).
template <expression A, expression B>
constexpr auto dot(A a, B b) {
    static_assert(A::shape_type::rank == 1 && B::shape_type::rank == 1,
                  "typegrad: dot(a, b) takes two vectors.");
    static_assert(A::shape_type::extents[0] == dyn || B::shape_type::extents[0] == dyn ||
                      A::shape_type::extents[0] == B::shape_type::extents[0],
                  "typegrad: dot(a, b) needs equal lengths.");
    return sum(a * b);
}

// x W^T (+ b), as torch.nn.functional.linear: W is (out_features, in_features).
template <expression X, expression W>
constexpr auto linear(X x, W w) {
    static_assert(W::shape_type::rank == 2, "typegrad: linear(x, W, b) needs a 2-D weight (out, in).");
    return matmul(x, transpose(w));
}
// x W^T + b (F.linear(x, W, b)); under autocast the bias is cast like the other inputs.
template <expression X, expression W, expression B>
constexpr auto linear(X x, W w, B b) {
    static_assert(B::shape_type::rank == 1, "typegrad: linear(x, W, b) needs a 1-D bias.");
    // PyTorch's autocast casts all of linear's inputs, the bias too: a bf16 region's linear is bf16.
    return linear(x, w) + detail::lower_precision_entry(b);
}

namespace detail {
// True for an operand that is a transposed view of its last two axes (linear's W^T).
template <class X>
constexpr bool transposed_view() {
    using N = typename X::node_type;
    if constexpr (!permute_node<N>::value) {
        return false;
    } else {
        constexpr auto p = permute_node<N>::perm;
        for (std::size_t i = 0; i + 2 < p.size(); ++i)
            if (p[i] != i) return false;
        return p.size() >= 2 && p[p.size() - 2] == p.size() - 1 && p[p.size() - 1] == p.size() - 2;
    }
}

template <std::size_t I, class G, class Out, class A, class B>
constexpr auto matmul_op::vjp(G g, Out, A a, B b) {
    // dA = g B^T, dB = A^T g. For a transposed view, whose VJP transposes its gradient back, the
    // same product is written transposed with the operands swapped ((g^T A)^T for dB): the two
    // transposes cancel (permute_node), and the GEMM writes the gradient in the layout of the
    // operand's source, reading g and A through transpose flags, instead of writing A^T g for a
    // strided copy to turn (linear's weight gradient: 19% of an MLP layer's step before).
    if constexpr (I == 0) {
        if constexpr (transposed_view<A>()) return typegrad::transpose(typegrad::matmul(b, typegrad::transpose(g)));
        else return typegrad::matmul(g, typegrad::transpose(b));
    } else {
        if constexpr (transposed_view<B>()) return typegrad::transpose(typegrad::matmul(typegrad::transpose(g), a));
        else return typegrad::matmul(typegrad::transpose(a), g);
    }
}
}  // namespace detail
}  // namespace typegrad
