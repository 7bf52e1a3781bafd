#pragma once
// Convolution: conv2d<stride, padding, dilation, groups>(x, w[, b]) over NCHW
// (torch.nn.functional.conv2d) and conv1d<stride, padding, dilation, groups>(x, w[, b]) over NCL
// (F.conv1d, as conv2d of height 1).
//
//   x [N, C, H, W], w [O, C / G, KH, KW] -> [N, O, Ho, Wo],
//   Ho = (H + 2P - D (KH - 1) - 1) / S + 1 (floor), Wo likewise
//
// Three kernel ops on the packed GEMM (core/cpu/gemm.hpp) through an im2col buffer
// ([C * KH * KW, Ho * Wo] per image, zeros where the (dilated) window leaves the padded input):
//   conv2d          y_n  = W . im2col(x_n)
//   conv2d_input    dx_n = col2im(W^T . g_n)          (the VJP for x)
//   conv2d_weight   dW   = sum_n g_n . im2col(x_n)^T  (the VJP for W)
// Images go in chunks: the im2col blocks of a chunk's images sit side by side ([C KH KW, nb Ho Wo]),
// so each product is one GEMM with nb times the columns (small images were one narrow GEMM each;
// the wide one packs W once per chunk). A chunk holds as many images as fit conv_chunk_elements
// of im2col, at least one; on several threads the chunks go in waves, one per thread (conv_waves).
// With G groups, channels [g C/G, (g+1) C/G) meet only output channels [g O/G, (g+1) O/G): each
// product above is G GEMMs over the matching row blocks of W, im2col(x_n) and g_n (block-diagonal
// W, never materialised).
// The forward's and the weight gradient's products never store im2col: the GEMM packs its
// panels of it straight from x (conv_panels, conv_row_panels; gemm_packed_b / gemm_packed_a), the
// same values, so the same bits. The input gradient writes W^T . g_n into an im2col-shaped buffer
// for col2im (the transposed convolution over panels of g packed 9x the elements col2im reads:
// no faster, benchmarks/README.md); on one thread each block of the product's rows is col2im'd
// as soon as it is final, while it is in cache (gemm_rows), and col2im gathers each element from
// its taps (col2im_set) where the width's stride is 1: the bits of the scatter into zeros.
// The three are bilinear and adjoint to each other, so each one's VJP is another of them: second
// derivatives come for free. Operands of any strides and dtypes are read into dense buffers of
// the compute dtype (f32 for bf16/f16, as PyTorch's CPU kernels accumulate); the result is
// rounded once. The bias is an ordinary broadcast add (its gradient the sum over N, H, W).
//
// Autocast: lower precision, as PyTorch's conv1d/conv2d. On the CUDA backend the same products
// run as passes of the op's own kernel around cuBLAS's GEMMs ("the device path" below).
// Extents: static ones are checked at compile time; dynamic ones when bound (tg::shape_error
// before anything is written): C must agree, and the padded input must hold one window.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <typegrad/core/cpu/buffer_pool.hpp>
#include <typegrad/core/cpu/gemm.hpp>
#include <typegrad/core/cpu/simd.hpp>
#include <typegrad/core/cpu/thread_pool.hpp>
#include <typegrad/core/error.hpp>
#include <typegrad/ops/arithmetic.hpp>
#include <typegrad/ops/autocast_entry.hpp>
#include <typegrad/ops/op_base.hpp>
#include <typegrad/ops/view.hpp>

namespace typegrad {
namespace detail {

// The compile-time parameters of a convolution (per spatial axis where PyTorch allows a pair).
struct conv_params {
    std::size_t sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1, groups = 1;
};

// The extent a dilated kernel spans: dilation (k - 1) + 1.
constexpr std::size_t conv_span(std::size_t k, std::size_t dilation) { return dilation * (k - 1) + 1; }

// One spatial extent of the output: (in + 2 pad - dilation (k - 1) - 1) / stride + 1, or dyn.
constexpr std::size_t conv_out_extent(std::size_t in, std::size_t k, std::size_t stride, std::size_t pad,
                                      std::size_t dilation = 1) {
    if (in == dyn || k == dyn) return dyn;
    if (k == 0 || in + 2 * pad < conv_span(k, dilation)) return 0;  // rejected by the shape check
    return (in + 2 * pad - conv_span(k, dilation)) / stride + 1;
}

struct conv_geometry {
    std::size_t n, c, h, w, o, kh, kw, ho, wo, sh, sw, ph, pw, dh, dw, groups;
    std::size_t ckk() const { return c * kh * kw; }
    std::size_t group_ckk() const { return c / groups * kh * kw; }  // rows of W and of a group's im2col block
    std::size_t group_o() const { return o / groups; }
    std::size_t pixels() const { return ho * wo; }
};

// im2col elements per chunk of images (2^18: 1 MiB of float, so that the buffer the GEMM packs
// from, written just before, is still in the core's L2; 2^21 made a one-thread CNN step 12-15%
// slower, benchmarks/README.md); a chunk takes at least one image. The chunk depends on the
// extents only, so the weight gradient, which sums chunk after chunk, has one order on any
// number of threads.
inline constexpr std::size_t conv_chunk_elements = std::size_t(1) << 18;
// A chunk also spans at least conv_chunk_columns output pixels: the packed GEMM computes whole
// micro-panels of columns, and one image of 14 x 14 (196 columns) was 14% padding.
inline constexpr std::size_t conv_chunk_columns = 1024;
inline std::size_t conv_chunk_images(const conv_geometry& g) {
    const std::size_t per = std::max<std::size_t>(1, g.ckk() * g.pixels());
    const std::size_t wide = (conv_chunk_columns + g.pixels() - 1) / std::max<std::size_t>(1, g.pixels());
    return std::clamp<std::size_t>(std::max(conv_chunk_elements / per, wide), 1, std::max<std::size_t>(1, g.n));
}

// A convolution's chunks, on several threads in waves of one chunk per thread: each chunk's
// im2col, copies and products run on one thread, the chunk in that core's L2, with one wake-up
// a wave (splitting each of them over the threads had woken the pool for every one, and a
// product of few outputs, the first layer's 9 x 16 weight gradient, had run on one thread).
// One chunk (a small batch) splits its work over the threads instead. The images are dealt
// to the chunks evenly (sizes differing by one at most: 8 images of conv_chunk_images 6 are two
// chunks of 4, not 6 and 2, which left one thread a quarter of the work), which depends on the
// extents only.
struct conv_waves {
    std::size_t n, chunks, nb, slots = 1;  // nb: the largest chunk
    explicit conv_waves(const conv_geometry& g) : conv_waves(g, conv_chunk_images(g)) {}
    conv_waves(const conv_geometry& g, std::size_t per_chunk)
        : n(g.n), chunks((g.n + per_chunk - 1) / per_chunk), nb(chunks > 0 ? (g.n + chunks - 1) / chunks : 1) {
        if (chunks > 1 && g.n * g.ckk() * g.pixels() >= parallel_min_work) slots = std::min(chunks, num_threads());
    }
    std::size_t first(std::size_t k) const { return k * n / chunks; }
    // Per-slot buffer sizes: a chunk's im2col columns, and its rows of y or g gathered into one
    // matrix (none for chunks of one image, whose rows are the caller's buffer's).
    std::size_t col_size(const conv_geometry& g) const { return g.ckk() * nb * g.pixels(); }
    std::size_t rows_size(const conv_geometry& g) const { return nb > 1 ? g.o * nb * g.pixels() : 0; }
    // fn(slot, n0, count, gemm_threads) for every chunk [n0, n0 + count), then after(wave) for
    // each wave of `wave` chunks (slots 0 .. wave - 1), in order
    template <class C, class F, class After>
    void run(F&& fn, After&& after) const {
        for (std::size_t k0 = 0; k0 < chunks; k0 += slots) {
            const std::size_t wave = std::min(slots, chunks - k0);
            const auto one = [&](std::size_t t, std::size_t threads) {
                const std::size_t n0 = first(k0 + t);
                fn(t, n0, first(k0 + t + 1) - n0, threads);
            };
            if (wave == 1) one(0, 0);
            else gemm_impl::parallel_slots<C>(wave, wave, [&](std::size_t t) { one(t, 1); });
            after(wave);
        }
    }
};

// A strided rank-4 operand as a dense buffer of C.
// (Kernel temporaries come from the per-thread buffer pool: fresh vectors of this size were
// page-faulted in and zeroed on every call.)
template <class C, class V, class B, class Ref>
pooled_buffer<C> dense_of(const Ref& r) {
    pooled_buffer<C> out(r.ext[0] * r.ext[1] * r.ext[2] * r.ext[3]);
    const auto* p = static_cast<const B*>(r.data);
    std::size_t e = 0;
    for (std::size_t a = 0; a < r.ext[0]; ++a)
        for (std::size_t b = 0; b < r.ext[1]; ++b)
            for (std::size_t i = 0; i < r.ext[2]; ++i) {
                const B* row = p + std::ptrdiff_t(a) * r.stride[0] + std::ptrdiff_t(b) * r.stride[1] +
                               std::ptrdiff_t(i) * r.stride[2];
                for (std::size_t j = 0; j < r.ext[3]; ++j, ++e) {
                    if constexpr (std::is_same_v<B, C>) out[e] = row[std::ptrdiff_t(j) * r.stride[3]];
                    else out[e] = C(static_cast<compute_t<V>>(static_cast<compute_t<B>>(row[std::ptrdiff_t(j) * r.stride[3]])));
                }
            }
    return out;
}
// An operand as a dense array of C: the caller's buffer itself when it already is one (most
// operands: a copy cost as much as im2col), else a dense copy.
template <class C>
struct dense_input {
    pooled_buffer<C> copy;  // empty when the operand is read in place
    const C* data;
};
template <class C, class V, class B, class Ref>
dense_input<C> dense_input_of(const Ref& r) {
    if constexpr (std::is_same_v<B, C>)
        if (is_row_major(r)) return {pooled_buffer<C>(), static_cast<const C*>(r.data)};
    dense_input<C> d{dense_of<C, V, B>(r), nullptr};
    d.data = d.copy.data();
    return d;
}

// The output columns [lo, hi) whose kernel column j reads inside the input row (the others read
// padding): iw = ow sw + j dw - pw in [0, w).
inline void conv_inner_columns(const conv_geometry& g, std::size_t j, std::size_t& lo, std::size_t& hi) {
    const std::size_t off = j * g.dw;
    lo = off >= g.pw ? 0 : (g.pw - off + g.sw - 1) / g.sw;
    hi = g.w - 1 + g.pw < off ? 0 : std::min(g.wo, (g.w - 1 + g.pw - off) / g.sw + 1);
    lo = std::min(lo, hi);
}
// Stride 1 and "same" width (W = Wo: 2 pw = dw (KW - 1)): output row oh of tap row i reads input
// row oh + i dh - ph at the same pitch, so the rows [oh0, oh1) inside the image are one run of the
// plane (shifted by the tap's column). False otherwise.
inline bool conv_same_rows(const conv_geometry& g, std::size_t i, std::size_t& oh0, std::size_t& oh1) {
    if (g.sh != 1 || g.sw != 1 || g.w != g.wo) return false;
    const std::ptrdiff_t shift = std::ptrdiff_t(i * g.dh) - std::ptrdiff_t(g.ph);  // ih = oh + shift
    oh0 = std::size_t(std::clamp<std::ptrdiff_t>(-shift, 0, std::ptrdiff_t(g.ho)));
    oh1 = std::size_t(std::clamp<std::ptrdiff_t>(std::ptrdiff_t(g.h) - shift, std::ptrdiff_t(oh0), std::ptrdiff_t(g.ho)));
    return true;
}
// columns [0, lo) and [hi, Wo) of rows [oh0, oh1) of a tap's row: 0
template <class C>
void conv_zero_edges(const conv_geometry& g, C* row, std::size_t oh0, std::size_t oh1, std::size_t lo, std::size_t hi) {
    for (std::size_t oh = oh0; oh < oh1; ++oh) {
        C* d = row + oh * g.wo;
        for (std::size_t ow = 0; ow < lo; ++ow) d[ow] = C(0);
        for (std::size_t ow = std::max(lo, hi); ow < g.wo; ++ow) d[ow] = C(0);
    }
}
// dst[0, n) = src[0, n) in registers: im2col copies runs of an output row (a few dozen elements),
// for which a memmove call apiece cost more than the copy
template <class C>
inline void copy_run(const C* src, C* dst, std::size_t n) {
    constexpr std::size_t W = simd::width<C>;
    std::size_t k = 0;
    for (; k + W <= n; k += W) simd::store(dst + k, simd::load(src + k));
    if (k < n) simd::store_upto(dst + k, simd::load_upto(src + k, n - k), n - k);
}
// col [C * KH * KW, Ho * Wo] of image x (dense [C, H, W]), rows ld apart (ld >= Ho * Wo: the
// image's block of a chunk's buffer); channels [c0, c1) only
template <class C>
void im2col(const conv_geometry& g, const C* x, C* col, std::size_t ld, std::size_t c0, std::size_t c1) {
    for (std::size_t c = c0; c < c1; ++c)
        for (std::size_t i = 0; i < g.kh; ++i)
            for (std::size_t j = 0; j < g.kw; ++j) {
                C* dst = col + ((c * g.kh + i) * g.kw + j) * ld;
                std::size_t lo, hi;
                conv_inner_columns(g, j, lo, hi);
                std::size_t oh0, oh1;
                if (conv_same_rows(g, i, oh0, oh1)) {
                    // the tap's rows are one run of the input plane, shifted: copied at once, then
                    // the columns that read padding (or, in the run, a neighbouring row) zeroed
                    std::fill_n(dst, oh0 * g.wo, C(0));
                    std::fill_n(dst + oh1 * g.wo, (g.ho - oh1) * g.wo, C(0));
                    if (oh0 == oh1) continue;
                    const std::size_t first = oh0 * g.wo + lo, last = (oh1 - 1) * g.wo + hi;
                    if (lo < hi)
                        copy_run(x + (c * g.h + oh0 + i * g.dh - g.ph) * g.w + lo + j * g.dw - g.pw, dst + first, last - first);
                    conv_zero_edges(g, dst, oh0, oh1, lo, hi);
                    continue;
                }
                for (std::size_t oh = 0; oh < g.ho; ++oh) {
                    const std::ptrdiff_t ih = std::ptrdiff_t(oh * g.sh + i * g.dh) - std::ptrdiff_t(g.ph);
                    C* d = dst + oh * g.wo;
                    if (ih < 0 || ih >= std::ptrdiff_t(g.h)) {
                        std::fill_n(d, g.wo, C(0));
                        continue;
                    }
                    for (std::size_t ow = 0; ow < lo; ++ow) d[ow] = C(0);  // a padding's width: a few
                    for (std::size_t ow = hi; ow < g.wo; ++ow) d[ow] = C(0);
                    if (lo == hi) continue;
                    const C* src = x + (c * g.h + std::size_t(ih)) * g.w + (j * g.dw + lo * g.sw - g.pw);
                    if (g.sw == 1) copy_run(src, d + lo, hi - lo);
                    else
                        for (std::size_t ow = lo; ow < hi; ++ow) d[ow] = src[(ow - lo) * g.sw];
                }
            }
}
// x (dense [C, H, W]) += col2im(col), col's rows ld apart; channels [c0, c1) only
template <class C>
void col2im_add(const conv_geometry& g, C* col, C* x, std::size_t ld, std::size_t c0, std::size_t c1) {
    for (std::size_t c = c0; c < c1; ++c)
        for (std::size_t i = 0; i < g.kh; ++i)
            for (std::size_t j = 0; j < g.kw; ++j) {
                C* srcc = col + ((c * g.kh + i) * g.kw + j) * ld;
                std::size_t lo, hi;
                conv_inner_columns(g, j, lo, hi);
                std::size_t oh0, oh1;
                if (conv_same_rows(g, i, oh0, oh1)) {
                    // one run, as im2col's: the entries standing for padding (col is the caller's
                    // scratch) zeroed first, so the run adds +0 where it crosses a row's edge, which
                    // leaves every sum as it was (the sums start at +0, so none is -0)
                    if (oh0 == oh1 || lo >= hi) continue;
                    conv_zero_edges(g, srcc, oh0, oh1, lo, hi);
                    const std::size_t first = oh0 * g.wo + lo, last = (oh1 - 1) * g.wo + hi;
                    C* dst = x + (c * g.h + oh0 + i * g.dh - g.ph) * g.w + lo + j * g.dw - g.pw;
                    const C* s = srcc + first;
                    for (std::size_t e = 0; e < last - first; ++e) dst[e] += s[e];
                    continue;
                }
                for (std::size_t oh = 0; oh < g.ho; ++oh) {
                    const std::ptrdiff_t ih = std::ptrdiff_t(oh * g.sh + i * g.dh) - std::ptrdiff_t(g.ph);
                    if (ih < 0 || ih >= std::ptrdiff_t(g.h) || lo == hi) continue;
                    C* dst = x + (c * g.h + std::size_t(ih)) * g.w + (j * g.dw + lo * g.sw - g.pw);
                    const C* s = srcc + oh * g.wo;
                    if (g.sw == 1)  // contiguous: vectorised
                        for (std::size_t ow = lo; ow < hi; ++ow) dst[ow - lo] += s[ow];
                    else
                        for (std::size_t ow = lo; ow < hi; ++ow) dst[(ow - lo) * g.sw] += s[ow];
                }
            }
}

// Lanes [lo, hi) of the vector at row[at] (row[at + lane]), the others 0 (at + lo >= 0: the vector
// may start before the row, at padding). `inside`: the whole vector lies in the operand, so it is
// loaded whole and the lanes cleared in registers (masked loads were slow on Zen 5, as for
// conv_merge); else only the lanes [lo, hi) are read.
template <class C>
inline simd::batch<C> conv_lanes(const C* row, std::ptrdiff_t at, std::size_t lo, std::size_t hi, bool inside) {
    using V = simd::batch<C>;
    constexpr std::size_t W = simd::width<C>;
    // the address as an integer: the vector may begin before the row's first element
    const auto* p = reinterpret_cast<const C*>(reinterpret_cast<std::uintptr_t>(row) + at * std::ptrdiff_t(sizeof(C)));
#if defined(__AVX512F__)
    const unsigned mask = ((1u << (hi - lo)) - 1u) << lo;
    if constexpr (std::is_same_v<C, float> && W == 16) {
        if (!inside) return _mm512_maskz_loadu_ps(static_cast<__mmask16>(mask), p);
        __m512 v = _mm512_loadu_ps(p);
        __asm__("" : "+v"(v));
        return _mm512_maskz_mov_ps(static_cast<__mmask16>(mask), v);
    } else if constexpr (std::is_same_v<C, double> && W == 8) {
        if (!inside) return _mm512_maskz_loadu_pd(static_cast<__mmask8>(mask), p);
        __m512d v = _mm512_loadu_pd(p);
        __asm__("" : "+v"(v));
        return _mm512_maskz_mov_pd(static_cast<__mmask8>(mask), v);
    }
#endif
    alignas(64) C lanes[W] = {};
    if (inside) {
        simd::store(lanes, simd::load(p));
        for (std::size_t l = 0; l < W; ++l)
            if (l < lo || l >= hi) lanes[l] = C(0);
    } else {
        for (std::size_t l = lo; l < hi; ++l) lanes[l] = row[at + std::ptrdiff_t(l)];
    }
    return V::load_aligned(lanes);
}
// x (dense [C, H, W]) channels [c0, c1) = col2im(col) where the width's stride is 1, col's rows ld
// apart: each element gathered vector by vector as the sum over its taps in tap order, from +0,
// so the bits of col2im_add into zeros (a sum from +0 is never -0, so the +0 col2im_add adds
// for a padding entry changes nothing). Each element is written once: no zeros first, and no
// read-modify-write of x per tap as in col2im_add (benchmarks/README.md, "col2im as a gather, as
// the product's rows come").
template <class C>
void col2im_set(const conv_geometry& g, const C* col, C* x, std::size_t ld, std::size_t c0, std::size_t c1, const C* first,
                const C* last) {
    using V = simd::batch<C>;
    constexpr std::size_t W = simd::width<C>, most = 64;
    const std::size_t taps = g.kh * g.kw, vectors = (g.w + W - 1) / W;
    // Per vector of a row and kernel column j, found once: the lanes [lo, hi) that read an
    // output column inside [0, Wo), and the offset of lane 0's in the tap's row
    struct piece {
        std::ptrdiff_t at;
        unsigned lo, hi;
    };
    piece table[most];
    const bool tabled = vectors * g.kw <= most;
    const auto piece_of = [&](std::size_t v, std::size_t j) {
        const std::size_t n = std::min(W, g.w - v * W);
        const std::ptrdiff_t ow0 = std::ptrdiff_t(v * W + g.pw) - std::ptrdiff_t(j * g.dw);
        const std::ptrdiff_t lo = std::clamp<std::ptrdiff_t>(-ow0, 0, std::ptrdiff_t(n));
        const std::ptrdiff_t hi = std::clamp<std::ptrdiff_t>(std::ptrdiff_t(g.wo) - ow0, lo, std::ptrdiff_t(n));
        return piece{std::ptrdiff_t(j * ld) + ow0, unsigned(lo), unsigned(hi)};
    };
    const std::uintptr_t begin = reinterpret_cast<std::uintptr_t>(first), end = reinterpret_cast<std::uintptr_t>(last);
    if (tabled)
        for (std::size_t v = 0; v < vectors; ++v)
            for (std::size_t j = 0; j < g.kw; ++j) table[v * g.kw + j] = piece_of(v, j);
    // U channels at once: each element's sum is one chain of dependent adds in tap order, so
    // independent chains side by side keep the adder busy (one chain at a time was latency-bound)
    const auto channels = [&](std::size_t c, auto u_count) {
        constexpr std::size_t U = decltype(u_count)::value;
        for (std::size_t h = 0; h < g.h; ++h)
            for (std::size_t v = 0; v < vectors; ++v) {
                V acc[U];
                for (std::size_t u = 0; u < U; ++u) acc[u] = V(C(0));
                for (std::size_t i = 0; i < g.kh; ++i) {
                    // input row h is output row oh of kernel row i: h = oh sh + i dh - ph
                    const std::ptrdiff_t d = std::ptrdiff_t(h + g.ph) - std::ptrdiff_t(i * g.dh);
                    if (d < 0 || std::size_t(d) % g.sh != 0 || std::size_t(d) / g.sh >= g.ho) continue;
                    const C* const row = col + (c * taps + i * g.kw) * ld + std::size_t(d) / g.sh * g.wo;
                    for (std::size_t j = 0; j < g.kw; ++j) {
                        const piece p = tabled ? table[v * g.kw + j] : piece_of(v, j);
                        if (p.lo == 0 && p.hi == W) {
                            for (std::size_t u = 0; u < U; ++u) acc[u] += simd::load(row + u * taps * ld + p.at);
                        } else if (p.lo < p.hi) {
                            for (std::size_t u = 0; u < U; ++u) {
                                const C* const r = row + u * taps * ld;
                                const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(r) + p.at * std::ptrdiff_t(sizeof(C));
                                acc[u] += conv_lanes(r, p.at, p.lo, p.hi, a >= begin && a + W * sizeof(C) <= end);
                            }
                        }
                    }
                }
                for (std::size_t u = 0; u < U; ++u)
                    simd::store_upto(x + ((c + u) * g.h + h) * g.w + v * W, acc[u], std::min(W, g.w - v * W));
            }
    };
    std::size_t c = c0;
    for (; c + 4 <= c1; c += 4) channels(c, std::integral_constant<std::size_t, 4>{});
    for (; c < c1; ++c) channels(c, std::integral_constant<std::size_t, 1>{});
}

// The chunk [n0, n0 + nb)'s im2col ([C KH KW, nb Ho Wo]: image i in columns [i Ho Wo, (i + 1) Ho Wo))
// and its col2im: every (image, channel) pair writes only its own block of rows (im2col) or its
// own plane (col2im), so the pairs are split over the thread pool with the results of one
// thread (pairs, not channels: a one-channel first layer has only its images to split).
template <class F>
void for_each_image_channels(const conv_geometry& g, std::size_t nb, F&& fn) {
    parallel_ranges(nb * g.c, g.kh * g.kw * g.pixels(), [&](std::size_t r0, std::size_t r1) {
        for (std::size_t r = r0; r < r1;) {
            const std::size_t i = r / g.c, c0 = r % g.c, c1 = std::min(g.c, c0 + (r1 - r));
            fn(i, c0, c1);
            r += c1 - c0;
        }
    });
}
template <class C>
void im2col_chunk(const conv_geometry& g, const C* x, std::size_t n0, std::size_t nb, C* col) {
    for_each_image_channels(g, nb, [&](std::size_t i, std::size_t c0, std::size_t c1) {
        im2col(g, x + (n0 + i) * g.c * g.h * g.w, col + i * g.pixels(), nb * g.pixels(), c0, c1);
    });
}
// x's images [n0, n0 + nb) = col2im(col): col2im_set where the width's stride is 1 (every element
// written), else col2im_add, into x's zeros
template <class C>
void col2im_image(const conv_geometry& g, C* col, std::size_t i, std::size_t n0, std::size_t nb, C* x, std::size_t c0, std::size_t c1) {
    C* const xi = x + (n0 + i) * g.c * g.h * g.w;
    if (g.sw == 1) col2im_set(g, col + i * g.pixels(), xi, nb * g.pixels(), c0, c1, col, col + g.ckk() * nb * g.pixels());
    else col2im_add(g, col + i * g.pixels(), xi, nb * g.pixels(), c0, c1);
}
template <class C>
void col2im_chunk(const conv_geometry& g, C* col, std::size_t n0, std::size_t nb, C* x) {
    for_each_image_channels(g, nb, [&](std::size_t i, std::size_t c0, std::size_t c1) { col2im_image(g, col, i, n0, nb, x, c0, c1); });
}
// The input gradient of the chunk of images [n0, n0 + cnt): x's images = col2im(W^T . src) per
// group, src g's rows [O, cnt P] (chunk_rows), col the chunk's im2col-shaped buffer; where the
// width's stride is not 1, x's images must be zeros (col2im_add). threads as gemm's n_threads.
template <class C>
void conv_input_chunk(const conv_geometry& g, const C* w, const C* src, C* col, std::size_t n0, std::size_t cnt,
                      std::size_t threads, C* x) {
    const std::size_t ld = cnt * g.pixels();
    if (threads != 1 && num_threads() > 1) {  // one chunk on every thread: the product, then col2im, threaded
        for (std::size_t b = 0; b < g.groups; ++b)
            gemm(transpose::yes, transpose::no, g.group_ckk(), ld, g.group_o(), w + b * g.group_o() * g.group_ckk(), g.group_ckk(),
                 src + b * g.group_o() * ld, ld, col + b * g.group_ckk() * ld, ld, false, threads);
        col2im_chunk(g, col, n0, cnt, x);
        return;
    }
    // On one thread, each channel's col2im as soon as the product has its rows, while they are in
    // cache (read back from L3 after the whole product, col2im took a quarter of the op's time):
    // the same values in the same order, so the same bits
    const std::size_t taps = g.kh * g.kw, cg = g.c / g.groups;
    for (std::size_t b = 0; b < g.groups; ++b) {
        std::size_t ready = 0;  // the group's channels done
        gemm_rows(transpose::yes, transpose::no, g.group_ckk(), ld, g.group_o(), w + b * g.group_o() * g.group_ckk(), g.group_ckk(),
                  src + b * g.group_o() * ld, ld, col + b * g.group_ckk() * ld, ld, false, [&](std::size_t, std::size_t i1) {
                      const std::size_t upto = i1 == g.group_ckk() ? cg : i1 / taps;
                      if (upto == ready) return;
                      for (std::size_t i = 0; i < cnt; ++i) col2im_image(g, col, i, n0, cnt, x, b * cg + ready, b * cg + upto);
                      ready = upto;
                  });
    }
}
// [N, O, P] images n0.. n0 + nb  <->  [O, nb P] (a chunk's GEMM layout; P = Ho Wo)
template <class C>
void images_to_rows(const conv_geometry& g, const C* y, std::size_t n0, std::size_t nb, C* rows) {
    for (std::size_t i = 0; i < nb; ++i)
        for (std::size_t o = 0; o < g.o; ++o)
            std::copy_n(y + ((n0 + i) * g.o + o) * g.pixels(), g.pixels(), rows + (o * nb + i) * g.pixels());
}
// g's rows for the chunk [n0, n0 + nb) as [O, nb P]: g's own rows for one image, else copied into rows
template <class C>
const C* chunk_rows(const conv_geometry& g, const C* gy, std::size_t n0, std::size_t nb, C* rows) {
    if (nb == 1) return gy + n0 * g.o * g.pixels();
    images_to_rows(g, gy, n0, nb, rows);
    return rows;
}
// [channels, nb P] -> [N, channels, P] images n0 .. n0 + nb
template <class C>
void rows_to_images(const C* rows, std::size_t n0, std::size_t nb, std::size_t channels, std::size_t pixels, C* y) {
    for (std::size_t i = 0; i < nb; ++i)
        for (std::size_t o = 0; o < channels; ++o)
            std::copy_n(rows + (o * nb + i) * pixels, pixels, y + ((n0 + i) * channels + o) * pixels);
}
template <class C>
void rows_to_images(const conv_geometry& g, const C* rows, std::size_t n0, std::size_t nb, C* y) {
    rows_to_images(rows, n0, nb, g.o, g.pixels(), y);
}

#if defined(__AVX512F__)
// acc with its lanes in mask taken from the vector at src: a whole-vector load merged in registers
// where the vector lies inside the operand, else a masked load (which reads no lane outside the
// mask). The empty asm keeps the compilers from folding load and merge back into one masked
// load: masked loads and stores were slow on Zen 5 (two thirds of a packing's samples).
inline __m512 conv_merge(__m512 acc, unsigned mask, const void* src, bool inside) {
    if (!inside) return _mm512_mask_loadu_ps(acc, static_cast<__mmask16>(mask), src);
    __m512 v = _mm512_loadu_ps(src);
    __asm__("" : "+v"(v));
    return _mm512_mask_mov_ps(acc, static_cast<__mmask16>(mask), v);
}
inline __m512d conv_merge(__m512d acc, unsigned mask, const void* src, bool inside) {
    if (!inside) return _mm512_mask_loadu_pd(acc, static_cast<__mmask8>(mask), src);
    __m512d v = _mm512_loadu_pd(src);
    __asm__("" : "+v"(v));
    return _mm512_mask_mov_pd(acc, static_cast<__mmask8>(mask), v);
}
#endif

// Output pixels [q, q + n) of a chunk (image q / P, then row and column) in runs, each in one
// output row of one image: a run's pixels read one input row at the stride (or the padding)
// whatever the tap. Writes at most n runs and returns their count.
template <class C>
struct conv_run {
    std::size_t at, len;    // the run's pixels [at, at + len) of the n
    const C* base;          // its image
    std::ptrdiff_t ih, iw;  // input row and column of its first pixel at tap (0, 0)
};
template <class C>
std::size_t conv_runs(const conv_geometry& g, const C* x, std::size_t image, std::size_t q, std::size_t n, conv_run<C>* runs) {
    const std::size_t pixels = g.pixels();
    std::size_t nr = 0, img = q / pixels, oh = q % pixels / g.wo, ow = q % pixels % g.wo;
    for (std::size_t at = 0; at < n;) {
        const std::size_t take = std::min(n - at, g.wo - ow);
        runs[nr++] = {at, take, x + img * image, std::ptrdiff_t(oh * g.sh) - std::ptrdiff_t(g.ph),
                      std::ptrdiff_t(ow * g.sw) - std::ptrdiff_t(g.pw)};
        at += take;
        ow = 0;
        if (++oh == g.ho) oh = 0, ++img;
    }
    return nr;
}

// A chunk's im2col matrix, never stored: packs its blocks for gemm_packed_b straight from the
// dense input ([images, channels, H, W], `x` at the chunk's first image and the group's first
// channel). Row p is tap (c, i, j), column q output pixel q of the chunk's images; the values are
// im2col's, so a product over them has the bits of one over im2col's buffer. Writing im2col and
// packing it read and wrote every element twice more (im2col, its zeros and the packing: 10% of
// a conv2d step, benchmarks/README.md).
template <class C>
struct conv_panels {
    const conv_geometry& g;  // the kernel, stride, padding, dilation and both extents
    const C* x;
    std::size_t image;  // elements between the input's images
    const C* first;     // the whole operand [first, last): what may be read
    const C* last;

    void operator()(std::size_t pc, std::size_t kc, std::size_t jc, std::size_t nc, C* out) const {
        constexpr std::size_t R = gemm_panel_width<C>, W = simd::width<C>;
        static_assert(R % W == 0);
        const std::size_t taps = g.kh * g.kw, plane = g.h * g.w;
        for (std::size_t jr = 0; jr < nc; jr += R, out += R * kc) {
            const std::size_t len = std::min(R, nc - jr);
            conv_run<C> runs[R];  // the panel's lanes
            const std::size_t nr = conv_runs(g, x, image, jc + jr, len, runs);
            std::size_t c = pc / taps, i = pc % taps / g.kw, j = pc % g.kw;
#if defined(__AVX512F__)
            // Stride 1 with AVX-512, tap by tap: a tap reads the same pieces of every channel's
            // plane (the vector, its lanes and their offset in the plane), found once for the panel;
            // each piece a whole-vector load merged into the row in registers, the row stored once.
            // Zeroing the row and copying the runs over it took a masked store per run and masked
            // loads, both slow on AMD's cores (two thirds of this packing's samples on Zen 5).
            if constexpr ((std::is_same_v<C, float> && W == 16) || (std::is_same_v<C, double> && W == 8))
                if (g.sw == 1) {
                    constexpr std::size_t V = R / W;
                    struct piece {
                        std::ptrdiff_t at;  // element offset from x (channel 0) of the vector's lane 0
                        unsigned mask, v;
                    };
                    piece pieces[R + V];
                    const std::ptrdiff_t w = std::ptrdiff_t(g.w);
                    const std::uintptr_t begin = reinterpret_cast<std::uintptr_t>(first);
                    const std::uintptr_t end = reinterpret_cast<std::uintptr_t>(last);
                    for (std::size_t t = 0; t < taps; ++t) {
                        const std::ptrdiff_t di = std::ptrdiff_t(t / g.kw * g.dh), dj = std::ptrdiff_t(t % g.kw * g.dw);
                        std::size_t np = 0;
                        for (std::size_t r = 0; r < nr; ++r) {
                            const conv_run<C>& u = runs[r];
                            const std::ptrdiff_t ih = u.ih + di, iw = u.iw + dj;
                            if (ih < 0 || ih >= std::ptrdiff_t(g.h)) continue;
                            for (std::size_t v = u.at / W * W; v < u.at + u.len; v += W) {
                                // the run's lanes e in [lo, hi) read iw + e, within vector v
                                const std::ptrdiff_t lo = std::max<std::ptrdiff_t>({0, -iw, std::ptrdiff_t(v) - std::ptrdiff_t(u.at)});
                                const std::ptrdiff_t hi = std::min<std::ptrdiff_t>(
                                    {std::ptrdiff_t(u.len), w - iw, std::ptrdiff_t(v + W) - std::ptrdiff_t(u.at)});
                                if (lo >= hi) continue;
                                const std::size_t a = u.at + std::size_t(lo) - v, b = u.at + std::size_t(hi) - v;
                                pieces[np++] = {(u.base - x) + ih * w + iw + lo - std::ptrdiff_t(a),
                                                ((1u << b) - 1u) & ~((1u << a) - 1u), unsigned(v / W)};
                            }
                        }
                        // this tap's rows of the block: p = c taps + t
                        for (std::size_t p = (pc + taps - 1 - t) / taps * taps + t; p < pc + kc; p += taps) {
                            const C* const channel = x + p / taps * plane;
                            // (pieces come in the order of their vectors: each vector's in one register)
                            std::size_t e = 0;
                            for (std::size_t v = 0; v < V; ++v) {
                                simd::batch<C> acc(C(0));
                                for (; e < np && pieces[e].v == v; ++e) {
                                    // lane 0's address formed as an integer: it can precede the row
                                    const std::uintptr_t at =
                                        reinterpret_cast<std::uintptr_t>(channel) + pieces[e].at * std::ptrdiff_t(sizeof(C));
                                    // the next panel reads the R elements after these: into L2 now (a
                                    // panel's rows are a stream each, too many for the prefetchers)
                                    _mm_prefetch(reinterpret_cast<const char*>(at + R * sizeof(C)), _MM_HINT_T1);
                                    // a whole vector unless it would reach outside the operand (its
                                    // first or last row)
                                    acc = conv_merge(acc, pieces[e].mask, reinterpret_cast<const void*>(at),
                                                     at >= begin && at + W * sizeof(C) <= end);
                                }
                                simd::store(out + (p - pc) * R + v * W, acc);
                            }
                        }
                    }
                    continue;
                }
#endif
            for (std::size_t p = 0; p < kc; ++p) {
                C* const dst = out + p * R;
                for (std::size_t v = 0; v < R; v += W) simd::store(dst + v, simd::batch<C>(C(0)));
                const std::ptrdiff_t di = std::ptrdiff_t(i * g.dh), dj = std::ptrdiff_t(j * g.dw);
                for (std::size_t r = 0; r < nr; ++r) {
                    const conv_run<C>& u = runs[r];
                    const std::ptrdiff_t ih = u.ih + di, iw = u.iw + dj;
                    if (ih < 0 || ih >= std::ptrdiff_t(g.h)) continue;
                    // lanes t of [lo, hi) read iw + t sw inside the row
                    const std::ptrdiff_t sw = std::ptrdiff_t(g.sw), w = std::ptrdiff_t(g.w);
                    const std::ptrdiff_t lo = iw >= 0 ? 0 : (-iw + sw - 1) / sw;
                    const std::ptrdiff_t hi = iw > w - 1 ? 0 : std::min<std::ptrdiff_t>(std::ptrdiff_t(u.len), (w - 1 - iw) / sw + 1);
                    if (lo >= hi) continue;
                    const C* src = u.base + c * plane + std::size_t(ih) * g.w + std::size_t(iw + lo * sw);
                    if (g.sw == 1) copy_run(src, dst + u.at + std::size_t(lo), std::size_t(hi - lo));
                    else
                        for (std::ptrdiff_t t = lo; t < hi; ++t) dst[u.at + std::size_t(t)] = src[(t - lo) * sw];
                }
                if (++j == g.kw) {
                    j = 0;
                    if (++i == g.kh) i = 0, ++c;
                }
            }
        }
    }
};
// The same matrix as the weight gradient's A (dW^T = im2col(x) g^T: rows are taps, the depth is
// pixels), never stored: packs its row panels for gemm_packed_a from x. A panel's taps are
// gathered first into a block that stays in L1 (im2col of its MR rows over kc pixels), which
// gemm's pack_a then transposes into the panel as it does im2col's rows: the same values, so
// the bits of the im2col path.
template <class C>
struct conv_row_panels {
    const conv_geometry& g;
    const C* x;         // the chunk's first image, the group's first channel
    std::size_t image;  // elements between the input's images
    const C* first;     // the whole operand [first, last): what may be read
    const C* last;

    void operator()(std::size_t ic, std::size_t mc, std::size_t pc, std::size_t kc, C* out) const {
        constexpr std::size_t MR = gemm_panel_height<C>, KC = gemm_panel_depth<C>, W = simd::width<C>;
        // Each row has W elements of slack: a run is written in whole vectors, which may run past
        // its end into the next run's elements (written after it) or the slack.
        constexpr std::size_t ld = KC + W;
        alignas(64) C rows[MR * ld];
        const std::size_t taps = g.kh * g.kw, plane = g.h * g.w;
        const auto zero = [](C* d, std::size_t n) {
            for (std::size_t e = 0; e < n; e += W) simd::store(d + e, simd::batch<C>(C(0)));
        };
        // dst[0, n) = src[0, n) in whole vectors (what they write past n is rewritten after), the
        // last one element by element where a whole one would read past the operand
        const auto copy = [this](const C* src, C* dst, std::size_t n) {
            std::size_t e = 0;
            for (; e + W <= n; e += W) simd::store(dst + e, simd::load(src + e));
            if (e < n) {
                if (reinterpret_cast<std::uintptr_t>(src + e) + W * sizeof(C) <= reinterpret_cast<std::uintptr_t>(last))
                    simd::store(dst + e, simd::load(src + e));
                else
                    for (; e < n; ++e) dst[e] = src[e];
            }
        };
        if (g.sh == 1 && g.sw == 1 && g.w == g.wo) {
            // Stride 1 and the same width in and out (a "same" convolution): a tap reads its rows
            // of the plane as one run, shifted, as im2col does (conv_same_rows); then the columns
            // that read padding are zeroed. Runs of one output row each were 10-20% slower.
            const std::size_t pixels = g.pixels();
            for (std::size_t i0 = 0; i0 < mc; i0 += MR, out += MR * kc) {
                const std::size_t mr = std::min(MR, mc - i0);
                for (std::size_t l = 0; l < mr; ++l) {
                    const std::size_t tap = ic + i0 + l, c = tap / taps;
                    std::size_t oh0 = 0, oh1 = 0, lo, hi;
                    conv_same_rows(g, tap % taps / g.kw, oh0, oh1);
                    conv_inner_columns(g, tap % g.kw, lo, hi);
                    // pixel q (of rows [oh0, oh1)) reads element q + offset of the input plane
                    const std::ptrdiff_t shift = std::ptrdiff_t(tap % taps / g.kw * g.dh) - std::ptrdiff_t(g.ph);
                    const std::ptrdiff_t offset = shift * std::ptrdiff_t(g.w) + std::ptrdiff_t(tap % g.kw * g.dw) - std::ptrdiff_t(g.pw);
                    C* const row = rows + l * ld;
                    // the block's pixels [p, p + len), image by image: pixels [q0, q0 + len) of image img
                    for (std::size_t p = 0; p < kc;) {
                        const std::size_t at = pc + p, img = at / pixels, q0 = at % pixels, len = std::min(kc - p, pixels - q0);
                        C* const d = row + p;  // d[q - q0]: pixel q
                        const std::size_t qa = std::clamp(oh0 * g.wo, q0, q0 + len), qb = std::clamp(oh1 * g.wo, qa, q0 + len);
                        zero(d, qa - q0);
                        // the run [qa, qb) reads [qa + offset, qb + offset) of the plane, [ra, rb) of it
                        // inside the plane (the pixels outside are padding columns, zeroed)
                        const std::ptrdiff_t a = std::ptrdiff_t(qa), b = std::ptrdiff_t(qb);
                        const std::size_t ra = std::size_t(std::clamp<std::ptrdiff_t>(-offset, a, b));
                        const std::size_t rb = std::size_t(std::clamp<std::ptrdiff_t>(std::ptrdiff_t(plane) - offset, std::ptrdiff_t(ra), b));
                        zero(d + (qa - q0), ra - qa);
                        if (ra < rb) copy(x + img * image + c * plane + std::size_t(std::ptrdiff_t(ra) + offset), d + (ra - q0), rb - ra);
                        zero(d + (rb - q0), q0 + len - rb);
                        // the columns [0, lo) and [hi, Wo) of the rows in [qa, qb)
                        if (lo > 0 || hi < g.wo)
                            for (std::size_t oh = qa / g.wo; oh * g.wo < qb; ++oh) {
                                const std::size_t r0 = oh * g.wo;
                                for (std::size_t q = std::max(r0, qa); q < std::min(r0 + lo, qb); ++q) d[q - q0] = C(0);
                                for (std::size_t q = std::max(r0 + hi, qa); q < std::min(r0 + g.wo, qb); ++q) d[q - q0] = C(0);
                            }
                        p += len;
                    }
                }
                gemm_impl::pack_gather<C, MR>(kc, mr, rows, ld, out);
            }
            return;
        }
        conv_run<C> runs[KC];  // the block's pixels
        const std::size_t nr = conv_runs(g, x, image, pc, kc, runs);
        for (std::size_t i0 = 0; i0 < mc; i0 += MR, out += MR * kc) {
            const std::size_t mr = std::min(MR, mc - i0);
            for (std::size_t l = 0; l < mr; ++l) {
                const std::size_t tap = ic + i0 + l, c = tap / taps;
                const std::ptrdiff_t di = std::ptrdiff_t(tap % taps / g.kw * g.dh), dj = std::ptrdiff_t(tap % g.kw * g.dw);
                C* const row = rows + l * ld;
                for (std::size_t r = 0; r < nr; ++r) {
                    const conv_run<C>& u = runs[r];
                    C* const d = row + u.at;
                    const std::ptrdiff_t ih = u.ih + di, iw = u.iw + dj, len = std::ptrdiff_t(u.len);
                    if (ih < 0 || ih >= std::ptrdiff_t(g.h)) {
                        zero(d, u.len);
                        continue;
                    }
                    // pixels t in [lo, hi) read iw + t sw inside the row
                    const std::ptrdiff_t sw = std::ptrdiff_t(g.sw), w = std::ptrdiff_t(g.w);
                    const std::ptrdiff_t lo = std::min(len, iw >= 0 ? 0 : (-iw + sw - 1) / sw);
                    const std::ptrdiff_t hi = std::max(lo, iw > w - 1 ? 0 : std::min(len, (w - 1 - iw) / sw + 1));
                    zero(d, std::size_t(lo));
                    const C* const src = u.base + c * plane + std::size_t(ih) * g.w + std::size_t(iw + lo * sw);
                    const std::size_t n = std::size_t(hi - lo);
                    if (g.sw == 1) {
                        copy(src, d + lo, n);
                    } else {
                        for (std::size_t e = 0; e < n; ++e) d[std::size_t(lo) + e] = src[e * g.sw];
                    }
                    zero(d + hi, std::size_t(len - hi));
                }
            }
            gemm_impl::pack_gather<C, MR>(kc, mr, rows, ld, out);
        }
    }
};

// Whether a chunk's product of m rows, n columns and depth k packs its B with conv_panels: the
// products gemm would run as packed blocks (not the small, unpacked or matrix-vector paths, which
// read a stored B), so that the bits are those of the im2col path.
template <class C>
inline bool conv_packs_directly(std::size_t m, std::size_t n, std::size_t k) {
    return m > 1 && n > 1 && k > 0 && !gemm_impl::use_small_path<C>(m, n, k);
}

// The padding is no input: a padded position takes part in no product (oneDNN's and cuDNN's
// convolutions, PyTorch's float CPU and CUDA paths). The GEMM over im2col multiplies the zeros
// standing for it, which is the same unless the other operand holds an infinity or NaN (0 * inf
// is NaN): then these direct loops, which skip the padding, run instead (docs/reliability.md,
// finding 19).
// The scan sums v - v (0 for a finite v; NaN for an infinity or NaN, and no sum makes a NaN
// finite) at SIMD width, block by block over the pool, stopping at the first block that holds
// one: the element-wise early exit ran at one element a cycle on the calling thread alone, 4% of
// a two-thread CNN step.
template <class C>
bool finite_block(const C* v, std::size_t m) {
    using B = simd::batch<C>;
    constexpr std::size_t w = simd::width<C>;
    B a0(C(0)), a1(C(0));
    std::size_t e = 0;
    for (; e + 2 * w <= m; e += 2 * w) {
        const B x0 = simd::load(v + e), x1 = simd::load(v + e + w);
        a0 += x0 - x0;
        a1 += x1 - x1;
    }
    C tail(0);
    for (; e < m; ++e) tail += v[e] - v[e];
    return simd::reduce_sum(a0 + a1) + tail == C(0);
}
template <class C>
bool all_finite(const C* v, std::size_t n) {
    constexpr std::size_t block = 4096;
    std::atomic<bool> finite{true};
    parallel_ranges((n + block - 1) / block, block, [&](std::size_t b0, std::size_t b1) {
        for (std::size_t b = b0; b < b1 && finite.load(std::memory_order_relaxed); ++b)
            if (!finite_block(v + b * block, std::min(block, n - b * block))) finite.store(false, std::memory_order_relaxed);
    });
    return finite.load();
}
// y [N, O, Ho, Wo] = conv(x [N, C, H, W], w [O, C / groups, KH, KW]); output channel o reads
// the input channels of its group.
template <class C>
void conv_direct(const conv_geometry& g, const C* x, const C* w, C* y) {
    const std::size_t cg = g.c / g.groups;
    for (std::size_t n = 0; n < g.n; ++n)
        for (std::size_t o = 0; o < g.o; ++o)
            for (std::size_t oh = 0; oh < g.ho; ++oh)
                for (std::size_t ow = 0; ow < g.wo; ++ow) {
                    const std::size_t c0 = o / g.group_o() * cg;
                    C acc(0);
                    for (std::size_t cl = 0; cl < cg; ++cl)
                        for (std::size_t i = 0; i < g.kh; ++i) {
                            const std::ptrdiff_t ih = std::ptrdiff_t(oh * g.sh + i * g.dh) - std::ptrdiff_t(g.ph);
                            if (ih < 0 || ih >= std::ptrdiff_t(g.h)) continue;
                            for (std::size_t j = 0; j < g.kw; ++j) {
                                const std::ptrdiff_t iw = std::ptrdiff_t(ow * g.sw + j * g.dw) - std::ptrdiff_t(g.pw);
                                if (iw < 0 || iw >= std::ptrdiff_t(g.w)) continue;
                                acc += w[((o * cg + cl) * g.kh + i) * g.kw + j] *
                                       x[((n * g.c + c0 + cl) * g.h + std::size_t(ih)) * g.w + std::size_t(iw)];
                            }
                        }
                    y[((n * g.o + o) * g.ho + oh) * g.wo + ow] = acc;
                }
}
// dw [O, C / groups, KH, KW] = sum over n and output pixels of gy [N, O, Ho, Wo] times x [N, C, H, W]
template <class C>
void conv_weight_direct(const conv_geometry& g, const C* gy, const C* x, C* dw) {
    const std::size_t cg = g.c / g.groups;
    for (std::size_t o = 0; o < g.o; ++o)
        for (std::size_t cl = 0; cl < cg; ++cl)
            for (std::size_t i = 0; i < g.kh; ++i)
                for (std::size_t j = 0; j < g.kw; ++j) {
                    const std::size_t c = o / g.group_o() * cg + cl;
                    C acc(0);
                    for (std::size_t n = 0; n < g.n; ++n)
                        for (std::size_t oh = 0; oh < g.ho; ++oh) {
                            const std::ptrdiff_t ih = std::ptrdiff_t(oh * g.sh + i * g.dh) - std::ptrdiff_t(g.ph);
                            if (ih < 0 || ih >= std::ptrdiff_t(g.h)) continue;
                            for (std::size_t ow = 0; ow < g.wo; ++ow) {
                                const std::ptrdiff_t iw = std::ptrdiff_t(ow * g.sw + j * g.dw) - std::ptrdiff_t(g.pw);
                                if (iw < 0 || iw >= std::ptrdiff_t(g.w)) continue;
                                acc += gy[((n * g.o + o) * g.ho + oh) * g.wo + ow] *
                                       x[((n * g.c + c) * g.h + std::size_t(ih)) * g.w + std::size_t(iw)];
                            }
                        }
                    dw[((o * cg + cl) * g.kh + i) * g.kw + j] = acc;
                }
}

// The geometry from x's and w's extents (in pixels of x), checked.
template <conv_params P>
conv_geometry conv_geometry_of(const std::size_t* xe, const std::size_t* we, const char* op) {
    conv_geometry g{xe[0], xe[1], xe[2], xe[3], we[0], we[2], we[3], 0, 0, P.sh, P.sw, P.ph, P.pw, P.dh, P.dw, P.groups};
    if (g.c % P.groups != 0 || we[1] * P.groups != g.c)
        fail<shape_error>({"typegrad: ", op, ": x has ", g.c, " channels but w expects ", we[1], " per group times ",
                           P.groups, " groups"});
    if (g.o % P.groups != 0)
        fail<shape_error>({"typegrad: ", op, ": w's ", g.o, " output channels are not a multiple of the ",
                           P.groups, " groups"});
    if (g.kh == 0 || g.kw == 0 || g.h + 2 * P.ph < conv_span(g.kh, P.dh) || g.w + 2 * P.pw < conv_span(g.kw, P.dw))
        fail<shape_error>({"typegrad: ", op, ": the padded input (", g.h + 2 * P.ph, " x ", g.w + 2 * P.pw,
                           ") is smaller than the dilated kernel (", conv_span(g.kh, P.dh), " x ",
                           conv_span(g.kw, P.dw), ")"});
    g.ho = (g.h + 2 * P.ph - conv_span(g.kh, P.dh)) / P.sh + 1;
    g.wo = (g.w + 2 * P.pw - conv_span(g.kw, P.dw)) / P.sw + 1;
    return g;
}

// ---- the device path ---------------------------------------------------------------------------
// The same three products on the backend's GEMM (cuBLAS), around passes of the op's own kernel,
// whose first word picks the pass (device_source below):
//   conv2d          im2col of every image ([N][C KH KW][Ho Wo]), one strided-batched GEMM per group
//                   (W shared by the batch), straight into y's [N, O, Ho Wo] rows
//   conv2d_input    one batched GEMM per group, W^T . g_n into the im2col layout, then col2im: one
//                   thread per input element gathers the taps that read it (in the CPU's tap
//                   order, without atomics)
//   conv2d_weight   g as rows [O][N Ho Wo] and im2col as [C KH KW][N Ho Wo]: one GEMM per group
//                   whose k is every pixel of every image
// in the compute dtype (f32 for bf16/f16, rounded once into the result, as on the host). The
// padding is no input here either: where W (forward) or g (weight gradient) holds an infinity or
// NaN, a flag pass notes it on the device and a fix-up pass recomputes, skipping the padding, the
// outputs the GEMM got from it (forward: the windows that reach into the padding; weight
// gradient: every element), without a host round trip. Images go in chunks of at most
// conv_device_chunk_elements of im2col (the weight gradient adds chunk after chunk, a fixed
// order); the temporaries come from the backend's per-thread scratch (steady-state steps
// allocate nothing).
enum class conv_pass : std::uint64_t { im2col, dense, col2im, store, flag, fix_forward, fix_weight, add };

// The device pass's words: the pass, the geometry (words 1-16, n the images of this pass), the
// first image (17), its own words from 18, and a strided operand (which of the node's first two,
// and its ref) from 22.
template <class Device, class Ref>
struct conv_device {
    Device& dev;
    conv_geometry g;
    std::size_t first = 0;
    // the passes that follow cover images [n0, n0 + count)
    void images(std::size_t n0, std::size_t count) {
        first = n0;
        g.n = count;
    }
    void pass(conv_pass p, std::size_t threads, std::initializer_list<std::uint64_t> own, const Ref* operand = nullptr,
              std::uint64_t which = 0) {
        if (threads == 0) return;
        std::uint64_t w[device_node_words] = {};
        w[0] = std::uint64_t(p);
        const std::size_t geometry[16] = {g.n, g.c, g.h, g.w, g.o, g.kh, g.kw, g.ho, g.wo, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, g.groups};
        for (std::size_t i = 0; i < 16; ++i) w[1 + i] = geometry[i];
        w[17] = first;
        std::size_t at = 18;
        for (const std::uint64_t v : own) w[at++] = v;
        if (operand) {
            w[22] = which;
            put_device_ref(w, 23, *operand);
        }
        dev.launch(w, threads);
    }
    // entries [from, from + count) of operand `which`'s axis 0 as dense S, element (a, b, r) at
    // a s0 + b s1 + r: read in place when they already are that array, else copied into `to`
    template <class S, class B>
    const S* dense(const Ref& r, std::uint64_t which, S* to, std::size_t s0, std::size_t s1, std::size_t from, std::size_t count) {
        const std::size_t plane = r.ext[2] * r.ext[3], per = r.ext[1] * plane;
        if (std::is_same_v<B, S> && is_row_major(r) && (r.ext[1] == 1 || s1 == plane) && (count == 1 || s0 == per))
            return static_cast<const S*>(r.data) + from * per;
        const std::size_t keep = first;
        first = from;
        pass(conv_pass::dense, count * per, {device_word(to), s0, s1, count * per}, &r, which);
        first = keep;
        return to;
    }
    // C = op(A) op(B) per group (column-major, batched with strides; alpha 1, beta 0): `at(b)`
    // gives group b's three pointers; batches of at most 2^16 - 1 (cuBLAS's grid limit)
    template <class S, class At>
    void gemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, std::size_t lda, long long sa,
              std::size_t ldb, long long sb, std::size_t ldc, long long sc, std::size_t batch, At at) {
        constexpr std::size_t most = 65535;
        for (std::size_t b = 0; b < g.groups; ++b) {
            const auto [a, bb, c] = at(b);
            for (std::size_t i = 0; i < batch; i += most)
                dev.gemm(ta, tb, int(m), int(n), int(k), a + (long long)i * sa, int(lda), sa, bb + (long long)i * sb, int(ldb), sb,
                         c + (long long)i * sc, int(ldc), sc, int(std::min(most, batch - i)));
        }
    }
};
// im2col elements per chunk of images on the device (2^26: 256 MB of f32), at least one image:
// the scratch a convolution takes is bounded whatever the batch.
inline constexpr std::size_t conv_device_chunk_elements = std::size_t(1) << 26;
inline std::size_t conv_device_chunk_images(const conv_geometry& g) {
    const std::size_t per = std::max<std::size_t>(1, g.ckk() * g.pixels());
    return std::clamp<std::size_t>(conv_device_chunk_elements / per, 1, std::max<std::size_t>(1, g.n));
}
// GEMM dimensions are int: the device path throws (before anything runs) past them.
inline void check_conv_device_extents(const conv_geometry& g, const char* op) {
    constexpr std::size_t most = std::size_t(1) << 31;
    if (conv_device_chunk_images(g) * g.pixels() >= most || g.ckk() * g.pixels() >= most || g.o * g.pixels() >= most)
        fail<shape_error>({"typegrad: cuda: ", op, ": the im2col product exceeds the BLAS's 32-bit extents"});
}

template <class Op>
struct conv_kernel_base : kernel_op_base {
    static constexpr autocast_class autocast_on(device_kind) { return autocast_class::lower_precision; }
    // The device passes (words: ops/conv.hpp, conv_device). S: the compute dtype's code (f32 or
    // f64), T: the result's; (V0, B0) and (V1, B1): value and buffer codes of the node's first two
    // operands. Pixel q of output row oh is q = oh Wo + ow; im2col row `row` is tap (c, i, j).
    static constexpr const char* device_source = R"CUDA(
struct tg_conv_geo { tg_i64 n, c, h, w, o, kh, kw, ho, wo, sh, sw, ph, pw, dh, dw, groups; };
template <int S, int V0, int B0, int V1, int B1>
__device__ typename tg_ty<S>::S tg_conv_read(const tg_ref& r, int which, tg_i64 e) {
    const tg_i64 off = tg_ref_offset(r, e);
    return which == 0 ? tg_cvt<S, V0, B0>(((const typename tg_ty<B0>::S*)r.p)[off])
                      : tg_cvt<S, V1, B1>(((const typename tg_ty<B1>::S*)r.p)[off]);
}
// the input element tap (i, j) of output pixel (oh, ow) reads, and whether it is inside the image
__device__ __forceinline__ bool tg_conv_inside(const tg_conv_geo& g, tg_i64 oh, tg_i64 ow, tg_i64 i, tg_i64 j,
                                               tg_i64* ih, tg_i64* iw) {
    *ih = oh * g.sh + i * g.dh - g.ph;
    *iw = ow * g.sw + j * g.dw - g.pw;
    return *ih >= 0 && *ih < g.h && *iw >= 0 && *iw < g.w;
}
template <int S, int T, int V0, int B0, int V1, int B1> __device__ void tg_conv(const tg_node_args& p) {
    typedef typename tg_ty<S>::S C;
    typedef typename tg_ty<T>::S R;
    tg_conv_geo g;
    tg_i64* f = &g.n;
    for (int i = 0; i < 16; ++i) f[i] = (tg_i64)p.w[1 + i];
    const tg_i64 first = (tg_i64)p.w[17];  // the pass covers images [first, first + n)
    const tg_i64 pixels = g.ho * g.wo, taps = g.kh * g.kw, ckk = g.c * taps, ckg = ckk / g.groups, og = g.o / g.groups;
    const int pass = (int)p.w[0];
    if (pass == 0) {  // im2col of the operand: col[n * w18 + row * w19 + q], 0 in the padding
        C* col = (C*)p.w[18];
        const tg_i64 image_stride = (tg_i64)p.w[19], ld = (tg_i64)p.w[20];
        const int which = (int)p.w[22];
        const tg_ref x = tg_ref_at(p, 23);
        TG_GRID_LOOP(e, g.n * ckk * pixels) {
            const tg_i64 q = e % pixels, row = (e / pixels) % ckk, n = e / (pixels * ckk);
            tg_i64 ih, iw;
            C v = 0;
            if (tg_conv_inside(g, q / g.wo, q % g.wo, (row / g.kw) % g.kh, row % g.kw, &ih, &iw))
                v = tg_conv_read<S, V0, B0, V1, B1>(x, which, (((first + n) * g.c + row / taps) * g.h + ih) * g.w + iw);
            col[n * image_stride + row * ld + q] = v;
        }
    } else if (pass == 1) {  // w21 elements of the operand (rank 4) from index `first` of axis 0,
        C* dst = (C*)p.w[18];  // dense: element (a, b, r) at a * w19 + b * w20 + r
        const tg_i64 s0 = (tg_i64)p.w[19], s1 = (tg_i64)p.w[20];
        const int which = (int)p.w[22];
        const tg_ref x = tg_ref_at(p, 23);
        const tg_i64 inner = (tg_i64)(x.ext[2] * x.ext[3]), mid = (tg_i64)x.ext[1];
        TG_GRID_LOOP(e, (tg_i64)p.w[21])
            dst[e / (inner * mid) * s0 + (e / inner) % mid * s1 + e % inner] =
                tg_conv_read<S, V0, B0, V1, B1>(x, which, first * mid * inner + e);
    } else if (pass == 2) {  // col2im: out[n, c, ih, iw] = the sum over the taps that read it
        const C* col = (const C*)p.w[18];
        R* out = (R*)p.w[19];
        TG_GRID_LOOP(e, g.n * g.c * g.h * g.w) {
            const tg_i64 iw = e % g.w, ih = e / g.w % g.h, c = e / (g.w * g.h) % g.c, n = e / (g.w * g.h * g.c);
            C s = 0;
            for (tg_i64 i = 0; i < g.kh; ++i) {
                const tg_i64 th = ih + g.ph - i * g.dh;
                if (th < 0 || th % g.sh != 0 || th / g.sh >= g.ho) continue;
                for (tg_i64 j = 0; j < g.kw; ++j) {
                    const tg_i64 tw = iw + g.pw - j * g.dw;
                    if (tw < 0 || tw % g.sw != 0 || tw / g.sw >= g.wo) continue;
                    s += col[(n * ckk + (c * g.kh + i) * g.kw + j) * pixels + th / g.sh * g.wo + tw / g.sw];
                }
            }
            out[e] = tg_ty<T>::to((typename tg_ty<T>::C)s);
        }
    } else if (pass == 3) {  // w20 elements of w18 rounded into the result w19
        const C* src = (const C*)p.w[18];
        R* out = (R*)p.w[19];
        TG_GRID_LOOP(e, (tg_i64)p.w[20]) out[e] = tg_ty<T>::to((typename tg_ty<T>::C)src[e]);
    } else if (pass == 4) {  // the flag w20 := 1 where one of the w19 elements of w18 is not finite
        const C* src = (const C*)p.w[18];
        TG_GRID_LOOP(e, (tg_i64)p.w[19]) if (!tg_isfinite(src[e])) *(tg_u64*)p.w[20] = 1;
    } else if (pass == 5) {  // flag set: y (w18) of the windows that reach into the padding, from col
        if (*(const tg_u64*)p.w[20] == 0) return;  // (w19) and W (w21), skipping the padding
        C* y = (C*)p.w[18];
        const C* col = (const C*)p.w[19];
        const C* wd = (const C*)p.w[21];
        TG_GRID_LOOP(e, g.n * g.o * pixels) {
            const tg_i64 q = e % pixels, o = e / pixels % g.o, n = e / (pixels * g.o), oh = q / g.wo, ow = q % g.wo;
            if (oh * g.sh >= g.ph && oh * g.sh + (g.kh - 1) * g.dh < g.h + g.ph && ow * g.sw >= g.pw &&
                ow * g.sw + (g.kw - 1) * g.dw < g.w + g.pw)
                continue;
            const tg_i64 b = o / og;
            C acc = 0;
            for (tg_i64 r = 0; r < ckg; ++r) {
                const tg_i64 row = b * ckg + r;
                tg_i64 ih, iw;
                if (tg_conv_inside(g, oh, ow, row / g.kw % g.kh, row % g.kw, &ih, &iw))
                    acc += wd[o * ckg + r] * col[(n * ckk + row) * pixels + q];
            }
            y[e] = acc;
        }
    } else if (pass == 6) {  // flag set: dW (w18) from col (w19, [C KH KW][n Ho Wo]) and g's rows (w21),
        if (*(const tg_u64*)p.w[20] == 0) return;  // skipping the padding
        C* dw = (C*)p.w[18];
        const C* col = (const C*)p.w[19];
        const C* rows = (const C*)p.w[21];
        const tg_i64 np = g.n * pixels;
        TG_GRID_LOOP(e, g.o * ckg) {
            const tg_i64 o = e / ckg, row = o / og * ckg + e % ckg;
            C acc = 0;
            for (tg_i64 t = 0; t < np; ++t) {
                const tg_i64 q = t % pixels;
                tg_i64 ih, iw;
                if (tg_conv_inside(g, q / g.wo, q % g.wo, row / g.kw % g.kh, row % g.kw, &ih, &iw))
                    acc += rows[o * np + t] * col[row * np + t];
            }
            dw[e] = acc;
        }
    } else {  // w20 elements: w18 += w19
        C* dst = (C*)p.w[18];
        const C* src = (const C*)p.w[19];
        TG_GRID_LOOP(e, (tg_i64)p.w[20]) dst[e] += src[e];
    }
}
)CUDA";
    template <class N>
    static std::string device_call() {
        using X0 = type_at_t<0, typename N::children>;
        using X1 = type_at_t<1, typename N::children>;
        using T = storage_t<typename N::value_type>;
        return device_template_call("tg_conv", {device_type_code<compute_t<T>>(), device_type_code<T>(),
                                                 device_type_code<typename X0::value_type>(), device_type_code<buffer_t<X0>>(),
                                                 device_type_code<typename X1::value_type>(), device_type_code<buffer_t<X1>>()});
    }
};

template <conv_params P>
struct conv2d_input_op;
template <conv_params P>
struct conv2d_weight_op;

// y = conv2d(x, w)
template <conv_params P>
struct conv2d_op : conv_kernel_base<conv2d_op<P>> {
    static constexpr const char* name = "conv2d";
    static constexpr bool shape_only(std::size_t) { return false; }
    template <class X, class W>
    struct rule {
        using SX = typename X::shape_type;
        using SWt = typename W::shape_type;
        using value_type = promote_t<typename X::value_type, typename W::value_type>;
        using shape_type = shape<SX::extents[0], SWt::extents[0], conv_out_extent(SX::extents[2], SWt::extents[2], P.sh, P.ph, P.dh),
                                 conv_out_extent(SX::extents[3], SWt::extents[3], P.sw, P.pw, P.dw)>;
    };
    template <class N, class Ref>
    static void extents(const Ref* in, std::size_t* ext) {
        const conv_geometry g = conv_geometry_of<P>(in[0].ext, in[1].ext, "conv2d(x, w)");
        ext[0] = g.n;
        ext[1] = g.o;
        ext[2] = g.ho;
        ext[3] = g.wo;
    }
    template <class N, class Ref, class T>
    static void run(const Ref* in, T* out, const std::size_t*) {
        using X = type_at_t<0, typename N::children>;
        using W = type_at_t<1, typename N::children>;
        using C = compute_t<T>;
        const conv_geometry g = conv_geometry_of<P>(in[0].ext, in[1].ext, "conv2d(x, w)");
        const auto x = dense_input_of<C, typename X::value_type, buffer_t<X>>(in[0]);
        const auto w = dense_input_of<C, typename W::value_type, buffer_t<W>>(in[1]);
        dense_output<C, T> y(out, g.n * g.o * g.pixels());
        if ((P.ph > 0 || P.pw > 0) && !all_finite(w.data, g.o * g.group_ckk())) {
            conv_direct(g, x.data, w.data, y.data);
            y.store(out);
            return;
        }
        const conv_waves waves(g);
        // (the smallest chunk decides: a larger one is no smaller a product)
        const bool direct = conv_packs_directly<C>(g.group_o(), g.n / waves.chunks * g.pixels(), g.group_ckk());
        const std::size_t col_n = direct ? 0 : waves.col_size(g), rows_n = waves.rows_size(g);
        pooled_buffer<C> col(waves.slots * col_n), rows(waves.slots * rows_n);
        const std::size_t image = g.c * g.h * g.w;
        waves.run<C>(
            [&](std::size_t t, std::size_t n0, std::size_t cnt, std::size_t threads) {
                const std::size_t ld = cnt * g.pixels();
                C* const cc = col.data() + t * col_n;
                if (!direct) im2col_chunk(g, x.data, n0, cnt, cc);
                C* dst = cnt > 1 ? rows.data() + t * rows_n : y.data + n0 * g.o * g.pixels();  // one image: its rows are y's
                for (std::size_t b = 0; b < g.groups; ++b) {
                    const C* wb = w.data + b * g.group_o() * g.group_ckk();
                    C* const yb = dst + b * g.group_o() * ld;
                    if (direct)
                        gemm_packed_b(transpose::no, g.group_o(), ld, g.group_ckk(), wb, g.group_ckk(),
                                      conv_panels<C>{g, x.data + n0 * image + b * (g.c / g.groups) * g.h * g.w, image, x.data, x.data + g.n * image}, yb, ld,
                                      false, threads);
                    else
                        gemm(transpose::no, transpose::no, g.group_o(), ld, g.group_ckk(), wb, g.group_ckk(),
                             cc + b * g.group_ckk() * ld, ld, yb, ld, false, threads);
                }
                if (cnt > 1) rows_to_images(g, dst, n0, cnt, y.data);
            },
            [](std::size_t) {});
        y.store(out);
    }
    // The device (conv_device): per chunk of images, im2col, then y_n = W . col_n per group as
    // one batched GEMM.
    template <class N, class Ref, class Device>
    static void device_run(const Ref* in, void* out, const std::size_t*, Device& dev) {
        using T = storage_t<typename N::value_type>;
        using S = compute_t<T>;
        using W = type_at_t<1, typename N::children>;
        const conv_geometry g = conv_geometry_of<P>(in[0].ext, in[1].ext, "conv2d(x, w)");
        const std::size_t ny = g.n * g.o * g.pixels(), nw = g.o * g.group_ckk(), nb = conv_device_chunk_images(g);
        if (ny == 0) return;
        if (g.group_ckk() == 0) return dev.zero(out, ny * sizeof(T));
        check_conv_device_extents(g, "conv2d(x, w)");
        conv_device<Device, Ref> d{dev, g};
        scratch_carver sc;
        const std::size_t col_at = sc.take<S>(g.ckk() * g.pixels() * nb), w_at = sc.take<S>(nw),
                          y_at = sc.take<S>(std::is_same_v<T, S> ? 0 : ny), flag_at = sc.take<std::uint64_t>(1);
        void* base = dev.scratch(sc.bytes);
        S* const col = sc.at<S>(base, col_at);
        S* const y = std::is_same_v<T, S> ? static_cast<S*>(out) : sc.at<S>(base, y_at);
        std::uint64_t* const flag = sc.at<std::uint64_t>(base, flag_at);
        const S* w = d.template dense<S, buffer_t<W>>(in[1], 1, sc.at<S>(base, w_at), g.group_ckk(), g.kh * g.kw, 0, g.o);
        constexpr bool padded = P.ph > 0 || P.pw > 0;
        if (padded) {
            dev.zero(flag, sizeof(std::uint64_t));
            d.pass(conv_pass::flag, nw, {device_word(w), nw, device_word(flag)});
        }
        for (std::size_t n0 = 0; n0 < g.n; n0 += nb) {
            const std::size_t cnt = std::min(nb, g.n - n0);
            S* const yc = y + n0 * g.o * g.pixels();
            d.images(n0, cnt);
            d.pass(conv_pass::im2col, cnt * g.ckk() * g.pixels(), {device_word(col), g.ckk() * g.pixels(), g.pixels()}, &in[0], 0);
            // column-major y_n^T [P x O/G] = col_n^T [P x CKK/G] . W^T [CKK/G x O/G]
            d.template gemm<S>(false, false, g.pixels(), g.group_o(), g.group_ckk(), g.pixels(), (long long)(g.ckk() * g.pixels()),
                               g.group_ckk(), 0, g.pixels(), (long long)(g.o * g.pixels()), cnt, [&](std::size_t b) {
                                   return std::tuple{static_cast<const S*>(col + b * g.group_ckk() * g.pixels()),
                                                     w + b * g.group_o() * g.group_ckk(), yc + b * g.group_o() * g.pixels()};
                               });
            if (padded)
                d.pass(conv_pass::fix_forward, cnt * g.o * g.pixels(), {device_word(yc), device_word(col), device_word(flag), device_word(w)});
        }
        if constexpr (!std::is_same_v<T, S>) d.pass(conv_pass::store, ny, {device_word(y), device_word(out), ny});
    }
    template <std::size_t I, class G, class Out, class X, class W>
    static constexpr auto vjp(G g, Out, X x, W w) {
        if constexpr (I == 0) return make_node<conv2d_input_op<P>>(g, w, x);
        else return make_node<conv2d_weight_op<P>>(g, x, w);
    }
};

// dx = conv2d_input(g, w; x's shape): the adjoint of conv2d in x
template <conv_params P>
struct conv2d_input_op : conv_kernel_base<conv2d_input_op<P>> {
    static constexpr const char* name = "conv2d_input_grad";
    static constexpr bool shape_only(std::size_t i) { return i == 2; }
    template <class G, class W, class X>
    struct rule {
        using value_type = promote_t<typename G::value_type, typename W::value_type>;
        using shape_type = typename X::shape_type;
    };
    template <class N, class Ref>
    static void extents(const Ref* in, std::size_t* ext) {
        const conv_geometry g = conv_geometry_of<P>(in[2].ext, in[1].ext, "conv2d backward (input)");
        if (in[0].ext[0] != g.n || in[0].ext[1] != g.o || in[0].ext[2] != g.ho || in[0].ext[3] != g.wo)
            throw shape_error("typegrad: conv2d backward (input): the gradient's extents differ from conv2d's output");
        for (std::size_t a = 0; a < 4; ++a) ext[a] = in[2].ext[a];
    }
    template <class N, class Ref, class T>
    static void run(const Ref* in, T* out, const std::size_t*) {
        using Gr = type_at_t<0, typename N::children>;
        using W = type_at_t<1, typename N::children>;
        using C = compute_t<T>;
        const conv_geometry g = conv_geometry_of<P>(in[2].ext, in[1].ext, "conv2d backward (input)");
        const auto gy = dense_input_of<C, typename Gr::value_type, buffer_t<Gr>>(in[0]);
        const auto w = dense_input_of<C, typename W::value_type, buffer_t<W>>(in[1]);
        dense_output<C, T> dx(out, g.n * g.c * g.h * g.w);
        const conv_waves waves(g);
        const std::size_t col_n = waves.col_size(g), rows_n = waves.rows_size(g);
        pooled_buffer<C> col(waves.slots * col_n), rows(waves.slots * rows_n);
        if (g.sw != 1) std::fill_n(dx.data, g.n * g.c * g.h * g.w, C(0));  // after the buffers: nothing written if they throw
        waves.run<C>(
            [&](std::size_t t, std::size_t n0, std::size_t cnt, std::size_t threads) {
                conv_input_chunk(g, w.data, chunk_rows(g, gy.data, n0, cnt, rows.data() + t * rows_n), col.data() + t * col_n, n0, cnt,
                                 threads, dx.data);
            },
            [](std::size_t) {});
        dx.store(out);
    }
    // The device: per chunk of images, W^T . g_n per group as one batched GEMM into the im2col
    // layout, then col2im.
    template <class N, class Ref, class Device>
    static void device_run(const Ref* in, void* out, const std::size_t*, Device& dev) {
        using T = storage_t<typename N::value_type>;
        using S = compute_t<T>;
        using Gr = type_at_t<0, typename N::children>;
        using W = type_at_t<1, typename N::children>;
        const conv_geometry g = conv_geometry_of<P>(in[2].ext, in[1].ext, "conv2d backward (input)");
        const std::size_t image = g.c * g.h * g.w, nx = g.n * image, nb = conv_device_chunk_images(g);
        if (nx == 0) return;
        if (g.group_o() == 0 || g.pixels() == 0) return dev.zero(out, nx * sizeof(T));
        check_conv_device_extents(g, "conv2d backward (input)");
        conv_device<Device, Ref> d{dev, g};
        scratch_carver sc;
        const std::size_t col_at = sc.take<S>(g.ckk() * g.pixels() * nb), w_at = sc.take<S>(g.o * g.group_ckk()),
                          g_at = sc.take<S>(g.n * g.o * g.pixels());
        void* base = dev.scratch(sc.bytes);
        S* const col = sc.at<S>(base, col_at);
        const S* gy = d.template dense<S, buffer_t<Gr>>(in[0], 0, sc.at<S>(base, g_at), g.o * g.pixels(), g.pixels(), 0, g.n);
        const S* w = d.template dense<S, buffer_t<W>>(in[1], 1, sc.at<S>(base, w_at), g.group_ckk(), g.kh * g.kw, 0, g.o);
        for (std::size_t n0 = 0; n0 < g.n; n0 += nb) {
            const std::size_t cnt = std::min(nb, g.n - n0);
            const S* const gc = gy + n0 * g.o * g.pixels();
            d.images(n0, cnt);
            // column-major col_n^T [P x CKK/G] = g_n^T [P x O/G] . W [O/G x CKK/G]
            d.template gemm<S>(false, true, g.pixels(), g.group_ckk(), g.group_o(), g.pixels(), (long long)(g.o * g.pixels()),
                               g.group_ckk(), 0, g.pixels(), (long long)(g.ckk() * g.pixels()), cnt, [&](std::size_t b) {
                                   return std::tuple{gc + b * g.group_o() * g.pixels(), w + b * g.group_o() * g.group_ckk(),
                                                     col + b * g.group_ckk() * g.pixels()};
                               });
            d.pass(conv_pass::col2im, cnt * image, {device_word(col), device_word(static_cast<T*>(out) + n0 * image)});
        }
    }
    // <conv2d_input(g, w), h> = <g, conv2d(h, w)>
    template <std::size_t I, class H, class Out, class G, class W, class X>
    static constexpr auto vjp(H h, Out, G g, W w, X) {
        static_assert(I < 2, "typegrad: internal: conv2d_input's third operand only lends its shape");
        if constexpr (I == 0) return make_node<conv2d_op<P>>(h, w);
        else return make_node<conv2d_weight_op<P>>(g, h, w);
    }
};

// dW = conv2d_weight(g, x; w's shape): the adjoint of conv2d in w
template <conv_params P>
struct conv2d_weight_op : conv_kernel_base<conv2d_weight_op<P>> {
    static constexpr const char* name = "conv2d_weight_grad";
    static constexpr bool shape_only(std::size_t i) { return i == 2; }
    template <class G, class X, class W>
    struct rule {
        using value_type = promote_t<typename G::value_type, typename X::value_type>;
        using shape_type = typename W::shape_type;
    };
    template <class N, class Ref>
    static void extents(const Ref* in, std::size_t* ext) {
        const conv_geometry g = conv_geometry_of<P>(in[1].ext, in[2].ext, "conv2d backward (weight)");
        if (in[0].ext[0] != g.n || in[0].ext[1] != g.o || in[0].ext[2] != g.ho || in[0].ext[3] != g.wo)
            throw shape_error("typegrad: conv2d backward (weight): the gradient's extents differ from conv2d's output");
        for (std::size_t a = 0; a < 4; ++a) ext[a] = in[2].ext[a];
    }
    template <class N, class Ref, class T>
    static void run(const Ref* in, T* out, const std::size_t*) {
        using Gr = type_at_t<0, typename N::children>;
        using X = type_at_t<1, typename N::children>;
        using C = compute_t<T>;
        const conv_geometry g = conv_geometry_of<P>(in[1].ext, in[2].ext, "conv2d backward (weight)");
        const auto gy = dense_input_of<C, typename Gr::value_type, buffer_t<Gr>>(in[0]);
        const auto x = dense_input_of<C, typename X::value_type, buffer_t<X>>(in[1]);
        dense_output<C, T> dw(out, g.o * g.group_ckk());
        if ((P.ph > 0 || P.pw > 0) && !all_finite(gy.data, g.n * g.o * g.pixels())) {
            conv_weight_direct(g, gy.data, x.data, dw.data);
            dw.store(out);
            return;
        }
        // dW^T = im2col(x) g^T, so that the large operand (im2col: ckk x pixels) is the GEMM's A,
        // packed once per block, and the small one (g: o x pixels) its B; dW = g im2col(x)^T
        // made the large operand B, repacked for every row panel of a small A (o rows): -15% of
        // a C = 64, 56x56 step, within noise at 14x14 (benchmarks/README.md, "Op benchmarks").
        // A chunk of images is one product with nb Ho Wo as its k, into a partial dW^T; the
        // partials are added chunk after chunk, wave after wave (conv_waves: a fixed order).
        const conv_waves waves(g);
        const std::size_t block = g.group_o() * g.group_ckk(), whole = g.o * g.group_ckk();
        // (A packed straight from x, as the forward's B: conv_row_panels; the smallest chunk decides)
        const bool direct = conv_packs_directly<C>(g.group_ckk(), g.group_o(), g.n / waves.chunks * g.pixels());
        const std::size_t col_n = direct ? 0 : waves.col_size(g), rows_n = waves.rows_size(g);
        const std::size_t image = g.c * g.h * g.w;
        pooled_buffer<C> col(waves.slots * col_n), rows(waves.slots * rows_n), part(waves.slots * whole), dwt(whole, C(0));
        waves.run<C>(
            [&](std::size_t t, std::size_t n0, std::size_t cnt, std::size_t threads) {
                const std::size_t ld = cnt * g.pixels();
                C* const cc = col.data() + t * col_n;
                if (!direct) im2col_chunk(g, x.data, n0, cnt, cc);
                const C* src = chunk_rows(g, gy.data, n0, cnt, rows.data() + t * rows_n);
                for (std::size_t b = 0; b < g.groups; ++b) {
                    C* const pb = part.data() + t * whole + b * block;
                    if (direct)
                        gemm_packed_a(transpose::yes, g.group_ckk(), g.group_o(), ld,
                                      conv_row_panels<C>{g, x.data + n0 * image + b * (g.c / g.groups) * g.h * g.w, image, x.data,
                                                         x.data + g.n * image},
                                      src + b * g.group_o() * ld, ld, pb, g.group_o(), false, threads);
                    else
                        gemm(transpose::no, transpose::yes, g.group_ckk(), g.group_o(), ld, cc + b * g.group_ckk() * ld, ld,
                             src + b * g.group_o() * ld, ld, pb, g.group_o(), false, threads);
                }
            },
            [&](std::size_t wave) {
                for (std::size_t t = 0; t < wave; ++t)
                    for (std::size_t e = 0; e < whole; ++e) dwt[e] += part[t * whole + e];
            });
        // dW = (dW^T)^T in tiles of 16 x 16: a row of dW^T at a time wrote dW a ckk-element stride
        // apart, a cache line (and at 256 x 2304, a page) per element
        constexpr std::size_t tile = 16;
        for (std::size_t b = 0; b < g.groups; ++b)
            for (std::size_t i0 = 0; i0 < g.group_ckk(); i0 += tile)
                for (std::size_t o0 = 0; o0 < g.group_o(); o0 += tile)
                    for (std::size_t o = o0; o < std::min(g.group_o(), o0 + tile); ++o)
                        for (std::size_t i = i0; i < std::min(g.group_ckk(), i0 + tile); ++i)
                            dw.data[b * block + o * g.group_ckk() + i] = dwt[b * block + i * g.group_o() + o];
        dw.store(out);
    }
    // The device: per chunk of images, g as rows [O][nb P] and im2col as [CKK][nb P], one GEMM
    // per group over every pixel of the chunk's images; chunk after chunk added in order.
    template <class N, class Ref, class Device>
    static void device_run(const Ref* in, void* out, const std::size_t*, Device& dev) {
        using T = storage_t<typename N::value_type>;
        using S = compute_t<T>;
        using Gr = type_at_t<0, typename N::children>;
        const conv_geometry g = conv_geometry_of<P>(in[1].ext, in[2].ext, "conv2d backward (weight)");
        const std::size_t nw = g.o * g.group_ckk(), nb = conv_device_chunk_images(g);
        if (nw == 0) return;
        if (g.n * g.pixels() == 0) return dev.zero(out, nw * sizeof(T));
        check_conv_device_extents(g, "conv2d backward (weight)");
        conv_device<Device, Ref> d{dev, g};
        scratch_carver sc;
        const std::size_t col_at = sc.take<S>(g.ckk() * nb * g.pixels()), g_at = sc.take<S>(g.o * nb * g.pixels()),
                          part_at = sc.take<S>(nb < g.n ? nw : 0), dw_at = sc.take<S>(std::is_same_v<T, S> ? 0 : nw),
                          flag_at = sc.take<std::uint64_t>(1);
        void* base = dev.scratch(sc.bytes);
        S* const col = sc.at<S>(base, col_at);
        S* const dw = std::is_same_v<T, S> ? static_cast<S*>(out) : sc.at<S>(base, dw_at);
        std::uint64_t* const flag = sc.at<std::uint64_t>(base, flag_at);
        for (std::size_t n0 = 0; n0 < g.n; n0 += nb) {
            const std::size_t cnt = std::min(nb, g.n - n0), np = cnt * g.pixels();
            S* const target = n0 == 0 ? dw : sc.at<S>(base, part_at);
            d.images(n0, cnt);
            d.pass(conv_pass::im2col, cnt * g.ckk() * g.pixels(), {device_word(col), g.pixels(), np}, &in[1], 1);
            const S* rows = d.template dense<S, buffer_t<Gr>>(in[0], 0, sc.at<S>(base, g_at), g.pixels(), np, n0, cnt);
            // column-major dW^T [CKK/G x O/G] = col [CKK/G x nb P] . rows^T [nb P x O/G]
            d.template gemm<S>(true, false, g.group_ckk(), g.group_o(), np, np, 0, np, 0, g.group_ckk(), 0, 1, [&](std::size_t b) {
                return std::tuple{static_cast<const S*>(col + b * g.group_ckk() * np), rows + b * g.group_o() * np,
                                  target + b * g.group_o() * g.group_ckk()};
            });
            // the flag per chunk: in a chunk whose g is finite, the GEMM's padding terms are 0 * finite
            if (P.ph > 0 || P.pw > 0) {
                dev.zero(flag, sizeof(std::uint64_t));
                d.pass(conv_pass::flag, g.o * np, {device_word(rows), g.o * np, device_word(flag)});
                d.pass(conv_pass::fix_weight, nw, {device_word(target), device_word(col), device_word(flag), device_word(rows)});
            }
            if (n0 > 0) d.pass(conv_pass::add, nw, {device_word(dw), device_word(target), nw});
        }
        if constexpr (!std::is_same_v<T, S>) d.pass(conv_pass::store, nw, {device_word(dw), device_word(out), nw});
    }
    // <conv2d_weight(g, x), h> = <g, conv2d(x, h)>
    template <std::size_t I, class H, class Out, class G, class X, class W>
    static constexpr auto vjp(H h, Out, G g, X x, W) {
        static_assert(I < 2, "typegrad: internal: conv2d_weight's third operand only lends its shape");
        if constexpr (I == 0) return make_node<conv2d_op<P>>(x, h);
        else return make_node<conv2d_input_op<P>>(g, h, x);
    }
};

// Static extents checked at the public entry (dynamic ones when bound).
template <class X, class W, std::size_t Groups>
constexpr bool conv_channels_agree() {
    constexpr std::size_t c = X::shape_type::extents[1], cg = W::shape_type::extents[1];
    return c == dyn || cg == dyn || c == cg * Groups;
}
template <class X, std::size_t Groups>
constexpr bool conv_channels_divisible() {
    constexpr std::size_t c = X::shape_type::extents[1];
    return c == dyn || c % Groups == 0;
}
template <class W, std::size_t Groups>
constexpr bool conv_out_channels_divisible() {
    constexpr std::size_t o = W::shape_type::extents[0];
    return o == dyn || o % Groups == 0;
}
template <class X, class W, std::size_t PH, std::size_t PW, std::size_t DH, std::size_t DW>
constexpr bool conv_window_fits() {
    using SX = typename X::shape_type;
    using SW = typename W::shape_type;
    const auto fits = [](std::size_t in, std::size_t k, std::size_t p, std::size_t d) {
        return in == dyn || k == dyn || (k > 0 && in + 2 * p >= conv_span(k, d));
    };
    return fits(SX::extents[2], SW::extents[2], PH, DH) && fits(SX::extents[3], SW::extents[3], PW, DW);
}

}  // namespace detail

// The checks every conv entry makes, at the user's call: rank, dtype, parameters, channels.
#define TYPEGRAD_DETAIL_CHECK_CONV(fname, R, X, W, Stride, Dilation, Groups)                                      \
    static_assert(Stride >= 1, "typegrad: " fname " needs stride >= 1.");                                            \
    static_assert(Dilation >= 1, "typegrad: " fname " needs dilation >= 1.");                                        \
    static_assert(Groups >= 1, "typegrad: " fname " needs groups >= 1.");                                            \
    static_assert(X::shape_type::rank == R && W::shape_type::rank == R,                                               \
                  "typegrad: " fname " takes x and w of rank " #R " (NCHW for conv2d, NCL for conv1d; w is "          \
                  "[out channels, in channels / groups, kernel...]).");                                                \
    static_assert(is_dtype_v<typename X::value_type> && is_dtype_v<typename W::value_type>,                          \
                  "typegrad: " fname " takes floating x and w.");                                                     \
    static_assert(X::shape_type::rank != R || ::typegrad::detail::conv_channels_divisible<X, Groups>(),               \
                  "typegrad: " fname " needs x's channel extent (axis 1) to be a multiple of groups.");              \
    static_assert(W::shape_type::rank != R || ::typegrad::detail::conv_out_channels_divisible<W, Groups>(),           \
                  "typegrad: " fname " needs w's out-channel extent (axis 0) to be a multiple of groups.");          \
    static_assert(X::shape_type::rank != R || W::shape_type::rank != R ||                                            \
                      ::typegrad::detail::conv_channels_agree<X, W, Groups>(),                                        \
                  "typegrad: " fname " needs x's channel extent (axis 1) to equal w's in-channel extent (axis 1) "   \
                  "times groups.")

// F.conv2d(x, w, stride=Stride, padding=Padding, dilation=Dilation, groups=Groups):
// x [N, C, H, W], w [O, C / Groups, KH, KW].
template <std::size_t Stride = 1, std::size_t Padding = 0, std::size_t Dilation = 1, std::size_t Groups = 1, expression X,
          expression W>
constexpr auto conv2d(X x, W w) {
    TYPEGRAD_DETAIL_CHECK_CONV("conv2d(x, w)", 4, X, W, Stride, Dilation, Groups);
    if constexpr (X::shape_type::rank == 4 && W::shape_type::rank == 4) {
        static_assert(detail::conv_window_fits<X, W, Padding, Padding, Dilation, Dilation>(),
                      "typegrad: conv2d(x, w): the (dilated) kernel is larger than the padded input.");
        return detail::make_node<detail::conv2d_op<detail::conv_params{Stride, Stride, Padding, Padding, Dilation, Dilation, Groups}>>(x, w);
    } else {
        return x;  // rejected above; one error, not two
    }
}
// F.conv2d(x, w, b, stride, padding, dilation, groups): b [O] added to every pixel.
template <std::size_t Stride = 1, std::size_t Padding = 0, std::size_t Dilation = 1, std::size_t Groups = 1, expression X,
          expression W, expression B>
constexpr auto conv2d(X x, W w, B b) {
    static_assert(B::shape_type::rank == 1, "typegrad: conv2d(x, w, b) takes a bias of rank 1 ([out channels]).");
    return conv2d<Stride, Padding, Dilation, Groups>(x, w) +
           reshape<shape<B::shape_type::extents[0], 1, 1>>(detail::lower_precision_entry(b));
}

// F.conv1d(x, w, stride, padding, dilation, groups): x [N, C, L], w [O, C / Groups, K]; conv2d
// of height 1.
template <std::size_t Stride = 1, std::size_t Padding = 0, std::size_t Dilation = 1, std::size_t Groups = 1, expression X,
          expression W>
constexpr auto conv1d(X x, W w) {
    TYPEGRAD_DETAIL_CHECK_CONV("conv1d(x, w)", 3, X, W, Stride, Dilation, Groups);
    if constexpr (X::shape_type::rank == 3 && W::shape_type::rank == 3) {
        static_assert(detail::conv_window_fits<decltype(unsqueeze<2>(x)), decltype(unsqueeze<2>(w)), 0, Padding, 1, Dilation>(),
                      "typegrad: conv1d(x, w): the (dilated) kernel is larger than the padded input.");
        auto y = detail::make_node<detail::conv2d_op<detail::conv_params{1, Stride, 0, Padding, 1, Dilation, Groups}>>(
            unsqueeze<2>(x), unsqueeze<2>(w));
        return squeeze<2>(y);
    } else {
        return x;
    }
}
// conv1d with a bias b [O] added to every position (F.conv1d(x, w, b, stride, padding, dilation, groups)).
template <std::size_t Stride = 1, std::size_t Padding = 0, std::size_t Dilation = 1, std::size_t Groups = 1, expression X,
          expression W, expression B>
constexpr auto conv1d(X x, W w, B b) {
    static_assert(B::shape_type::rank == 1, "typegrad: conv1d(x, w, b) takes a bias of rank 1 ([out channels]).");
    return conv1d<Stride, Padding, Dilation, Groups>(x, w) +
           reshape<shape<B::shape_type::extents[0], 1>>(detail::lower_precision_entry(b));
}
#undef TYPEGRAD_DETAIL_CHECK_CONV

}  // namespace typegrad
