#pragma once
// Pooling over the last two axes of NCHW: max_pool2d<kernel, stride, padding>(x) and
// avg_pool2d<kernel, stride, padding>(x) (torch.nn.functional.max_pool2d / avg_pool2d with
// dilation 1, ceil_mode False, count_include_pad True; stride defaults to the kernel size).
//
//   x [N, C, H, W] -> [N, C, (H + 2P - K) / S + 1, (W + 2P - K) / S + 1]
//
// max_pool2d: padding counts as -inf; the window's first maximum in row-major order takes the
// gradient (a NaN counts as the maximum, the last one if several), as PyTorch's CPU kernel. The backward scatters the
// incoming gradient to those positions, recomputed from x (no index tensor is saved); overlapping
// windows add. Its VJP (second order) gathers at the same positions.
// avg_pool2d: the mean of K * K elements, padding included as zeros (count_include_pad); its
// backward spreads g / (K * K) over each window, and the two are each other's adjoints.
//
// adaptive_avg_pool2d<OH, OW>(x) (F.adaptive_avg_pool2d): output cell (i, j) is the mean of rows
// [floor(i H / OH), ceil((i + 1) H / OH)) and the columns likewise (PyTorch's start/end rule: the
// windows cover x, overlap when H is not a multiple of OH, and repeat rows when H < OH). Its
// backward spreads g / (window size) over each window; the two are each other's adjoints.
//
// Kernel ops, with device kernels beside their CPU runs (one thread per output element; the
// backwards gather from the windows holding an input element, in the CPU's window order, so the
// device adds in the same order without atomics). Autocast leaves them alone (they keep their dtype).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include <typegrad/core/cpu/buffer_pool.hpp>
#include <typegrad/core/cpu/simd.hpp>
#include <typegrad/core/cpu/thread_pool.hpp>
#include <typegrad/core/error.hpp>
#include <typegrad/ops/compare.hpp>
#include <typegrad/ops/conv.hpp>
#include <typegrad/ops/op_base.hpp>

namespace typegrad {
namespace detail {

struct pool_geometry {
    std::size_t planes, h, w, ho, wo;  // planes = N * C
};
template <std::size_t K, std::size_t S, std::size_t P>
pool_geometry pool_geometry_of(const std::size_t* xe, const char* op) {
    pool_geometry g{xe[0] * xe[1], xe[2], xe[3], 0, 0};
    if (g.h + 2 * P < K || g.w + 2 * P < K)
        fail<shape_error>({"typegrad: ", op, ": the padded input (", g.h + 2 * P, " x ", g.w + 2 * P,
                           ") is smaller than the window (", K, " x ", K, ")"});
    g.ho = (g.h + 2 * P - K) / S + 1;
    g.wo = (g.w + 2 * P - K) / S + 1;
    return g;
}
// Calls f(out_index, in_index) for each in-bounds element of each window of plane p.
template <std::size_t K, std::size_t S, std::size_t P, class F>
void for_each_window(const pool_geometry& g, std::size_t p, F&& f) {
    for (std::size_t i = 0; i < g.ho; ++i)
        for (std::size_t j = 0; j < g.wo; ++j) f((p * g.ho + i) * g.wo + j, i, j);
}
template <std::size_t K, std::size_t S, std::size_t P>
inline bool pool_in_bounds(const pool_geometry& g, std::size_t i, std::size_t j, std::size_t a, std::size_t b,
                           std::size_t& ih, std::size_t& iw) {
    const std::ptrdiff_t r = std::ptrdiff_t(i * S + a) - std::ptrdiff_t(P), c = std::ptrdiff_t(j * S + b) - std::ptrdiff_t(P);
    if (r < 0 || c < 0 || r >= std::ptrdiff_t(g.h) || c >= std::ptrdiff_t(g.w)) return false;
    ih = std::size_t(r);
    iw = std::size_t(c);
    return true;
}
// The in-bounds part of window (i, j): rows [a0, a1) and columns [b0, b1) of the K x K window,
// starting at input row r0 + a0 and column c0 + b0 (one bounds computation per window, not per element)
template <std::size_t K, std::size_t S, std::size_t P>
struct pool_window {
    std::size_t a0, a1, b0, b1, r, c;  // r, c: the input row and column of (a0, b0)
    pool_window(const pool_geometry& g, std::size_t i, std::size_t j) {
        const std::ptrdiff_t r0 = std::ptrdiff_t(i * S) - std::ptrdiff_t(P), c0 = std::ptrdiff_t(j * S) - std::ptrdiff_t(P);
        a0 = std::size_t(std::max<std::ptrdiff_t>(0, -r0));
        b0 = std::size_t(std::max<std::ptrdiff_t>(0, -c0));
        a1 = std::size_t(std::clamp<std::ptrdiff_t>(std::ptrdiff_t(g.h) - r0, std::ptrdiff_t(a0), std::ptrdiff_t(K)));
        b1 = std::size_t(std::clamp<std::ptrdiff_t>(std::ptrdiff_t(g.w) - c0, std::ptrdiff_t(b0), std::ptrdiff_t(K)));
        r = std::size_t(r0 + std::ptrdiff_t(a0));
        c = std::size_t(c0 + std::ptrdiff_t(b0));
    }
};
// The flat input index of window (i, j)'s maximum in plane p (x dense of C); none for an all-padding window
template <std::size_t K, std::size_t S, std::size_t P, class C>
std::size_t window_argmax(const pool_geometry& g, const C* x, std::size_t p, std::size_t i, std::size_t j) {
    const pool_window<K, S, P> win(g, i, j);
    // PyTorch's rule: the first in-bounds element, then strictly greater or NaN (so the last NaN)
    if (win.a1 - win.a0 == K && win.b1 - win.b0 == K) {  // the whole window: K x K, unrolled
        const std::size_t first = (p * g.h + win.r) * g.w + win.c;
        std::size_t best = first;
        C m = x[first];
        for (std::size_t a = 0; a < K; ++a)
            for (std::size_t b = 0; b < K; ++b) {
                const std::size_t e = first + a * g.w + b;
                const C v = x[e];
                // a select by masks: compilers branch on `take ? v : m`, and a max over data
                // mispredicts about once per window
                using U = std::conditional_t<sizeof(C) == 4, std::uint32_t, std::uint64_t>;
                const bool take = (v > m) | (v != v);
                best ^= (best ^ e) & (std::size_t(0) - std::size_t(take));
                m = std::bit_cast<C>(std::bit_cast<U>(m) ^ ((std::bit_cast<U>(m) ^ std::bit_cast<U>(v)) & (U(0) - U(take))));
            }
        return best;
    }
    std::size_t best = std::size_t(-1);
    C m = -std::numeric_limits<C>::infinity();
    for (std::size_t a = win.a0; a < win.a1; ++a) {
        const std::size_t row = (p * g.h + win.r + (a - win.a0)) * g.w + win.c;
        for (std::size_t b = 0; b < win.b1 - win.b0; ++b) {
            const std::size_t e = row + b;
            if (best == std::size_t(-1) || x[e] > m || x[e] != x[e]) {
                best = e;
                m = x[e];
            }
        }
    }
    return best;
}

// f(o, e, m) for every window of plane p in order: o its output index, e the flat input index of
// its maximum (window_argmax's rule; none for an all-padding window), m that value. Without
// padding every window is full: the plane's windows go W at a time (gathers at each window's
// offsets, across rows: pooled rows are often narrower than W), with window_argmax's rule.
template <std::size_t K, std::size_t S, std::size_t P, class C, class F>
void for_each_window_max(const pool_geometry& g, const C* x, std::size_t p, F&& f) {
    std::size_t o = 0;
    const std::size_t n = g.ho * g.wo, o0 = p * n, x0 = p * g.h * g.w;
    if constexpr (P == 0 && simd::width<C> > 1) {
        constexpr std::size_t W = simd::width<C>;
        using B = simd::batch<C>;
        using I = simd::gather_index_t<C>;
        if (g.h * g.w <= std::size_t(std::numeric_limits<I>::max())) {
            alignas(64) I off[W];
            alignas(64) C value[W], code[W];
            const C* plane = x + x0;
            std::size_t i = 0, j = 0;  // window o's row and column
            for (; o + W <= n; o += W) {
                for (std::size_t l = 0; l < W; ++l) {
                    off[l] = I(i * S * g.w + j * S);
                    if (++j == g.wo) j = 0, ++i;
                }
                const auto index = simd::gather_index<C>(off);
                B m = simd::gather(plane, index), c(C(0));
                for (std::size_t a = 0; a < K; ++a)
                    for (std::size_t b = a == 0 ? 1 : 0; b < K; ++b) {
                        const B v = simd::gather(plane + a * g.w + b, index);
                        // first maximum; a NaN wins (not v != v: xsimd's != is ordered, false for NaN)
                        const auto take = (v > m) | xsimd::isnan(v);
                        m = simd::select(take, v, m);
                        c = simd::select(take, B(C(a * K + b)), c);
                    }
                m.store_aligned(value);
                c.store_aligned(code);
                for (std::size_t l = 0; l < W; ++l) {
                    const std::size_t k = std::size_t(code[l]);
                    f(o0 + o + l, x0 + std::size_t(off[l]) + (k / K) * g.w + k % K, value[l]);
                }
            }
        }
    }
    for (; o < n; ++o) {
        const std::size_t e = window_argmax<K, S, P>(g, x, p, o / g.wo, o % g.wo);
        f(o0 + o, e, e == std::size_t(-1) ? -std::numeric_limits<C>::infinity() : x[e]);
    }
}

// 2 x 2 windows with stride 2 and no padding (max_pool2d<2>, avg_pool2d<2>: the common case)
// tile the plane (an odd last row or column is in no window), so a pooled row is computed from
// two input rows in registers: up to W windows at a time, their 2 W columns of each row loaded
// (masked at the row's end) and split into even and odd columns, no gathers; the backward
// writes both rows back interleaved. The same rules as the scalar scan (window_argmax): the
// first maximum in row-major order, a NaN wins (the last one); sums in the same order.
template <std::size_t K, std::size_t S, std::size_t P, class C>
inline constexpr bool pool_tiles_2x2 = K == 2 && S == 2 && P == 0 && simd::width<C> > 1;

// v[2 a + b] lane l = src(2 i + a, 2 (j0 + l) + b) for the cnt windows of pooled row i from j0
// (src: the plane, rows w apart)
template <class C>
void pool2_windows(const C* src, std::size_t w, std::size_t i, std::size_t j0, std::size_t cnt, simd::batch<C> (&v)[4]) {
    constexpr std::size_t W = simd::width<C>;
    for (std::size_t a = 0; a < 2; ++a) {
        const C* row = src + (2 * i + a) * w + 2 * j0;
        const simd::batch<C> lo = simd::load_upto(row, 2 * cnt), hi = simd::load_upto(row + W, 2 * cnt > W ? 2 * cnt - W : 0);
        v[2 * a] = simd::even_lanes(lo, hi);
        v[2 * a + 1] = simd::odd_lanes(lo, hi);
    }
}
// the windows' maxima and which of the four holds each (its code 2 a + b, as a C)
template <class C>
void pool2_max(const simd::batch<C> (&v)[4], simd::batch<C>& m, simd::batch<C>& code) {
    m = v[0];
    code = simd::batch<C>(C(0));
    for (std::size_t k = 1; k < 4; ++k) {
        const auto take = (v[k] > m) | xsimd::isnan(v[k]);  // xsimd's != is ordered: false for NaN
        m = simd::select(take, v[k], m);
        code = simd::select(take, simd::batch<C>(C(k)), code);
    }
}
// d[2 a + b] back into rows 2 i + a of dst (the plane), the windows' 2 cnt columns of each
template <class C>
void pool2_store(C* dst, std::size_t w, std::size_t i, std::size_t j0, std::size_t cnt, const simd::batch<C> (&d)[4]) {
    constexpr std::size_t W = simd::width<C>;
    for (std::size_t a = 0; a < 2; ++a) {
        simd::batch<C> lo, hi;
        simd::zip_lanes(d[2 * a], d[2 * a + 1], lo, hi);
        C* row = dst + (2 * i + a) * w + 2 * j0;
        simd::store_upto(row, lo, 2 * cnt);
        simd::store_upto(row + W, hi, 2 * cnt > W ? 2 * cnt - W : 0);
    }
}
// f(o, i, j0, cnt) for plane p's pooled rows in blocks of at most W windows (o: the first's output index)
template <class C, class F>
void pool2_blocks(const pool_geometry& g, std::size_t p, F&& f) {
    constexpr std::size_t W = simd::width<C>;
    for (std::size_t i = 0; i < g.ho; ++i)
        for (std::size_t j0 = 0; j0 < g.wo; j0 += W) f((p * g.ho + i) * g.wo + j0, i, j0, std::min(W, g.wo - j0));
}

// fn(p) for every plane (image x channel), split over the thread pool when the windows are
// many: every plane reads and writes only its own elements.
template <std::size_t K, class F>
void for_each_plane(const pool_geometry& g, F&& fn) {
    parallel_ranges(g.planes, g.ho * g.wo * K * K + 1, [&](std::size_t begin, std::size_t end) {
        for (std::size_t p = begin; p < end; ++p) fn(p);
    });
}

// Mode: 0 forward (x -> y), 1 backward scatter (g, x -> dx), 2 gather (h, x -> y-shaped)
template <bool Max, int Mode, std::size_t K, std::size_t S, std::size_t P>
struct pool_op : kernel_op_base {
    static constexpr const char* name = Max ? (Mode == 0 ? "max_pool2d" : Mode == 1 ? "max_pool2d_backward" : "max_pool2d_gather")
                                            : (Mode == 0 ? "avg_pool2d" : "avg_pool2d_backward");
    // avg's backward reads only x's shape; max's backward and gather read x's values
    static constexpr bool shape_only(std::size_t i) { return !Max && Mode == 1 && i == 1; }
    template <class SX>
    using pooled = shape<SX::extents[0], SX::extents[1], conv_out_extent(SX::extents[2], K, S, P),
                         conv_out_extent(SX::extents[3], K, S, P)>;
    template <class... Cs>
    struct rule;
    template <class X>
    struct rule<X> {
        using value_type = typename X::value_type;
        using shape_type = pooled<typename X::shape_type>;
    };
    template <class G, class X>
    struct rule<G, X> {
        using value_type = typename G::value_type;
        using shape_type = std::conditional_t<Mode == 1, typename X::shape_type, pooled<typename X::shape_type>>;
    };
    template <class N, class Ref>
    static void extents(const Ref* in, std::size_t* ext) {
        const Ref& x = in[Mode == 0 ? 0 : 1];
        const pool_geometry g = pool_geometry_of<K, S, P>(x.ext, name);
        if constexpr (Mode != 0) {
            const std::size_t* ge = in[0].ext;
            const bool ok = Mode == 1 ? (ge[0] == x.ext[0] && ge[1] == x.ext[1] && ge[2] == g.ho && ge[3] == g.wo)
                                      : (ge[0] == x.ext[0] && ge[1] == x.ext[1] && ge[2] == x.ext[2] && ge[3] == x.ext[3]);
            if (!ok) fail<shape_error>({"typegrad: ", name, ": the gradient's extents do not match"});
        }
        ext[0] = x.ext[0];
        ext[1] = x.ext[1];
        ext[2] = Mode == 1 ? x.ext[2] : g.ho;
        ext[3] = Mode == 1 ? x.ext[3] : g.wo;
    }
    template <class N, class Ref, class T>
    static void run(const Ref* in, T* out, const std::size_t*) {
        using X = type_at_t<Mode == 0 ? 0 : 1, typename N::children>;
        using C = compute_t<T>;
        const Ref& xr = in[Mode == 0 ? 0 : 1];
        const pool_geometry g = pool_geometry_of<K, S, P>(xr.ext, name);
        constexpr C inv = C(1.0 / double(K * K));
        if constexpr (Mode == 0) {
            const auto xd = dense_input_of<C, typename X::value_type, buffer_t<X>>(xr);
            const C* const x = xd.data;
            for_each_plane<K>(g, [&](std::size_t p) {
                if constexpr (pool_tiles_2x2<K, S, P, C> && std::is_same_v<T, C>) {
                    const C* plane = x + p * g.h * g.w;
                    pool2_blocks<C>(g, p, [&](std::size_t o, std::size_t i, std::size_t j0, std::size_t cnt) {
                        simd::batch<C> v[4], m, code;
                        pool2_windows(plane, g.w, i, j0, cnt, v);
                        if constexpr (Max) pool2_max(v, m, code);
                        else m = (((simd::batch<C>(C(0)) + v[0]) + v[1]) + v[2] + v[3]) * simd::batch<C>(inv);
                        simd::store_upto(out + o, m, cnt);
                    });
                } else if constexpr (Max) {
                    for_each_window_max<K, S, P>(g, x, p, [&](std::size_t o, std::size_t, C m) { out[o] = T(m); });
                } else {
                    for_each_window<K, S, P>(g, p, [&](std::size_t o, std::size_t i, std::size_t j) {
                        C s = 0;
                        for (std::size_t a = 0; a < K; ++a)
                            for (std::size_t b = 0; b < K; ++b) {
                                std::size_t ih, iw;
                                if (pool_in_bounds<K, S, P>(g, i, j, a, b, ih, iw)) s += x[(p * g.h + ih) * g.w + iw];
                            }
                        out[o] = T(s * inv);
                    });
                }
            });
        } else {
            using Gr = type_at_t<0, typename N::children>;
            const auto gd = dense_input_of<C, typename Gr::value_type, buffer_t<Gr>>(in[0]);
            const C* const gy = gd.data;
            dense_input<C> xd{};  // max's backward and gather read x's values; avg's only its shape
            if constexpr (Max) xd = dense_input_of<C, typename X::value_type, buffer_t<X>>(xr);
            const C* const x = xd.data;
            if constexpr (Mode == 1) {
                const dense_output<C, T> acc(out, g.planes * g.h * g.w);  // out itself for f32/f64
                C* const dx = acc.data;
                for_each_plane<K>(g, [&](std::size_t p) {  // a window's elements lie in its plane
                    C* const plane = dx + p * g.h * g.w;
                    if constexpr (pool_tiles_2x2<K, S, P, C>) {
                        // every element of a window written (0 + g: as the scalar scatter into
                        // zeros, -0 gives +0); the rest zeroed only when a row or column is left over
                        if (g.h % 2 != 0 || g.w % 2 != 0) std::fill_n(plane, g.h * g.w, C(0));
                        pool2_blocks<C>(g, p, [&](std::size_t o, std::size_t i, std::size_t j0, std::size_t cnt) {
                            const simd::batch<C> zero(C(0));
                            simd::batch<C> d[4];
                            if constexpr (Max) {
                                const simd::batch<C> gv = zero + simd::load_upto(gy + o, cnt);
                                simd::batch<C> v[4], m, code;
                                pool2_windows(x + p * g.h * g.w, g.w, i, j0, cnt, v);  // (avg reads no x)
                                pool2_max(v, m, code);
                                for (std::size_t k = 0; k < 4; ++k) d[k] = simd::select(code == simd::batch<C>(C(k)), gv, zero);
                            } else {
                                d[0] = d[1] = d[2] = d[3] = zero + simd::load_upto(gy + o, cnt) * simd::batch<C>(inv);
                            }
                            pool2_store(plane, g.w, i, j0, cnt, d);
                        });
                        return;
                    }
                    std::fill_n(plane, g.h * g.w, C(0));
                    if constexpr (Max) {
                        for_each_window_max<K, S, P>(g, x, p, [&](std::size_t o, std::size_t e, C) {
                            if (e != std::size_t(-1)) dx[e] += gy[o];
                        });
                    } else {
                        for_each_window<K, S, P>(g, p, [&](std::size_t o, std::size_t i, std::size_t j) {
                            for (std::size_t a = 0; a < K; ++a)
                                for (std::size_t b = 0; b < K; ++b) {
                                    std::size_t ih, iw;
                                    if (pool_in_bounds<K, S, P>(g, i, j, a, b, ih, iw))
                                        dx[(p * g.h + ih) * g.w + iw] += gy[o] * inv;
                                }
                        });
                    }
                });
                acc.store(out);
            } else {  // max gather: h (x-shaped) at each window's maximum
                for_each_plane<K>(g, [&](std::size_t p) {
                    if constexpr (pool_tiles_2x2<K, S, P, C> && std::is_same_v<T, C>) {
                        const C *xp = x + p * g.h * g.w, *hp = gy + p * g.h * g.w;
                        pool2_blocks<C>(g, p, [&](std::size_t o, std::size_t i, std::size_t j0, std::size_t cnt) {
                            simd::batch<C> v[4], hv[4], m, code;
                            pool2_windows(xp, g.w, i, j0, cnt, v);
                            pool2_windows(hp, g.w, i, j0, cnt, hv);
                            pool2_max(v, m, code);
                            simd::batch<C> r = hv[0];
                            for (std::size_t k = 1; k < 4; ++k) r = simd::select(code == simd::batch<C>(C(k)), hv[k], r);
                            simd::store_upto(out + o, r, cnt);
                        });
                        return;
                    }
                    for_each_window_max<K, S, P>(g, x, p, [&](std::size_t o, std::size_t e, C) {
                        out[o] = T(e == std::size_t(-1) ? C(0) : gy[e]);
                    });
                });
            }
        }
    }
    // The device: one thread per output element (per input element for the backward, which
    // gathers from the windows holding it, in the CPU's window order: the same sums, no atomics).
    static constexpr const char* device_source = R"CUDA(
// pooling (ops/pool.hpp). w: out, K, S, P, Max, then src (x; g for the backward; h for max's
// gather) and x as refs. T the output's code, B and X the buffer codes of src and x.
template <int T, int B, int X> __device__ typename tg_ty<T>::C tg_pool_at(const tg_ref& r, int code, tg_i64 e) {
    return code == 0 ? (typename tg_ty<T>::C)tg_ty<B>::from(((const typename tg_ty<B>::S*)r.p)[tg_ref_offset(r, e)])
                     : (typename tg_ty<T>::C)tg_ty<X>::from(((const typename tg_ty<X>::S*)r.p)[tg_ref_offset(r, e)]);
}
// the flat index of window (i, j)'s first maximum in plane p (PyTorch's rule, a NaN wins), or -1
template <int T, int B, int X> __device__ tg_i64 tg_pool_argmax(const tg_ref& x, int K, int S, int P, tg_i64 h,
                                                              tg_i64 w, tg_i64 p, tg_i64 i, tg_i64 j) {
    tg_i64 best = -1;
    typename tg_ty<T>::C m = 0;
    for (int a = 0; a < K; ++a)
        for (int b = 0; b < K; ++b) {
            const tg_i64 r = i * S + a - P, c = j * S + b - P;
            if (r < 0 || c < 0 || r >= h || c >= w) continue;
            const tg_i64 e = (p * h + r) * w + c;
            const typename tg_ty<T>::C v = tg_pool_at<T, B, X>(x, 1, e);
            if (best < 0 || v > m || v != v) {
                best = e;
                m = v;
            }
        }
    return best;
}
template <int Mode, int T, int B, int X> __device__ void tg_pool(const tg_node_args& p) {
    typedef typename tg_ty<T>::C C;
    typename tg_ty<T>::S* out = (typename tg_ty<T>::S*)p.w[0];
    const int K = (int)p.w[1], S = (int)p.w[2], P = (int)p.w[3], max = (int)p.w[4];
    const tg_ref src = tg_ref_at(p, 5);
    const tg_ref x = Mode == 0 ? src : tg_ref_at(p, 7 + 2 * src.rank);
    const tg_i64 h = (tg_i64)x.ext[2], w = (tg_i64)x.ext[3];
    const tg_i64 ho = (h + 2 * P - K) / S + 1, wo = (w + 2 * P - K) / S + 1;
    const C inv = (C)(1.0 / (double)(K * K));
    if (Mode == 1) {  // x-shaped: the gradient at input element e
        TG_GRID_LOOP(e, tg_numel(x)) {
            const tg_i64 c = e % w, r = (e / w) % h, pl = e / (h * w);
            const tg_i64 i0 = r + P - K + 1 > 0 ? (r + P - K + 1 + S - 1) / S : 0, i1 = (r + P) / S;
            const tg_i64 j0 = c + P - K + 1 > 0 ? (c + P - K + 1 + S - 1) / S : 0, j1 = (c + P) / S;
            C s = 0;
            for (tg_i64 i = i0; i <= i1 && i < ho; ++i)
                for (tg_i64 j = j0; j <= j1 && j < wo; ++j) {
                    const tg_i64 o = (pl * ho + i) * wo + j;
                    if (!max) s += tg_pool_at<T, B, X>(src, 0, o) * inv;
                    else if (tg_pool_argmax<T, B, X>(x, K, S, P, h, w, pl, i, j) == e) s += tg_pool_at<T, B, X>(src, 0, o);
                }
            out[e] = tg_ty<T>::to(s);
        }
        return;
    }
    TG_GRID_LOOP(o, (tg_i64)x.ext[0] * (tg_i64)x.ext[1] * ho * wo) {  // y-shaped
        const tg_i64 j = o % wo, i = (o / wo) % ho, pl = o / (ho * wo);
        C v = 0;
        if (max) {
            const tg_i64 e = tg_pool_argmax<T, B, X>(x, K, S, P, h, w, pl, i, j);
            if (Mode == 0) v = e < 0 ? -tg_infinity<C>() : tg_pool_at<T, B, X>(x, 1, e);
            else v = e < 0 ? (C)0 : tg_pool_at<T, B, X>(src, 0, e);
        } else {
            for (int a = 0; a < K; ++a)
                for (int b = 0; b < K; ++b) {
                    const tg_i64 r = i * S + a - P, c = j * S + b - P;
                    if (r >= 0 && c >= 0 && r < h && c < w) v += tg_pool_at<T, B, X>(x, 1, (pl * h + r) * w + c);
                }
            v = v * inv;
        }
        out[o] = tg_ty<T>::to(v);
    }
}
)CUDA";
    template <class N>
    static std::string device_call() {
        using X = type_at_t<Mode == 0 ? 0 : 1, typename N::children>;
        return device_template_call("tg_pool", {Mode, device_type_code<buffer_t<N>>(),
                                                device_type_code<buffer_t<type_at_t<0, typename N::children>>>(),
                                                device_type_code<buffer_t<X>>()});
    }
    template <class N, class Ref>
    static std::size_t device_words(const Ref* in, void* out, const std::size_t* ext, std::uint64_t* w, void*) {
        w[0] = device_word(out);
        w[1] = K;
        w[2] = S;
        w[3] = P;
        w[4] = Max ? 1 : 0;
        const std::size_t at = put_device_ref(w, 5, in[0]);
        if constexpr (Mode != 0) put_device_ref(w, at, in[1]);
        return ext[0] * ext[1] * ext[2] * ext[3];
    }
    // x reaches the max ops' backward detached: the positions of the maxima are piecewise constant
    template <std::size_t I, class G, class Out, class... Cs>
    static constexpr auto vjp(G g, Out, Cs... cs) {
        static_assert(I == 0, "typegrad: internal: only the first operand of a pooling op carries a gradient");
        if constexpr (Mode == 0) {
            if constexpr (Max) return make_node<pool_op<true, 1, K, S, P>>(g, detach(cs)...);
            else return make_node<pool_op<false, 1, K, S, P>>(g, cs...);
        } else if constexpr (Mode == 1) {
            if constexpr (Max) return make_node<pool_op<true, 2, K, S, P>>(g, last_of(cs...));
            else return make_node<pool_op<false, 0, K, S, P>>(g);
        } else {
            return make_node<pool_op<true, 1, K, S, P>>(g, last_of(cs...));
        }
    }

private:
    template <class A, class B>
    static constexpr B last_of(A, B b) { return b; }
};

// ---- adaptive average pooling ------------------------------------------------------------------
// Window [begin, end) of output cell i of `out` cells over `in` elements (PyTorch's
// start_index / end_index).
inline std::size_t adaptive_begin(std::size_t i, std::size_t out, std::size_t in) { return i * in / out; }
inline std::size_t adaptive_end(std::size_t i, std::size_t out, std::size_t in) { return ((i + 1) * in + out - 1) / out; }

// Mode 0: x -> [N, C, OH, OW]; mode 1: (g, x shape only) -> x-shaped, the adjoint.
template <std::size_t OH, std::size_t OW, int Mode>
struct adaptive_avg_pool_op : kernel_op_base {
    static constexpr const char* name = Mode == 0 ? "adaptive_avg_pool2d" : "adaptive_avg_pool2d_backward";
    static constexpr bool shape_only(std::size_t i) { return Mode == 1 && i == 1; }
    template <class... Cs>
    struct rule;
    template <class X>
    struct rule<X> {
        using S = typename X::shape_type;
        using value_type = typename X::value_type;
        using shape_type = shape<S::extents[0], S::extents[1], OH, OW>;
    };
    template <class G, class X>
    struct rule<G, X> {
        using value_type = typename G::value_type;
        using shape_type = typename X::shape_type;
    };
    template <class N, class Ref>
    static void extents(const Ref* in, std::size_t* ext) {
        const Ref& x = in[Mode == 0 ? 0 : 1];
        if (x.ext[2] == 0 || x.ext[3] == 0)
            fail<shape_error>({"typegrad: adaptive_avg_pool2d(x): x's spatial extents (", x.ext[2], " x ", x.ext[3],
                               ") must not be 0"});
        if constexpr (Mode == 1) {
            const std::size_t* ge = in[0].ext;
            if (ge[0] != x.ext[0] || ge[1] != x.ext[1] || ge[2] != OH || ge[3] != OW)
                throw shape_error("typegrad: adaptive_avg_pool2d backward: the gradient's extents do not match");
        }
        ext[0] = x.ext[0];
        ext[1] = x.ext[1];
        ext[2] = Mode == 0 ? OH : x.ext[2];
        ext[3] = Mode == 0 ? OW : x.ext[3];
    }
    template <class N, class Ref, class T>
    static void run(const Ref* in, T* out, const std::size_t*) {
        using C = compute_t<T>;
        const Ref& xr = in[Mode == 0 ? 0 : 1];
        const std::size_t planes = xr.ext[0] * xr.ext[1], h = xr.ext[2], w = xr.ext[3];
        using Src = type_at_t<0, typename N::children>;  // x (mode 0) or g (mode 1)
        const auto sd = dense_input_of<C, typename Src::value_type, buffer_t<Src>>(in[0]);
        const C* const src = sd.data;
        const dense_output<C, T> acc(out, Mode == 1 ? planes * h * w : 0);  // the backward's sums (out itself for f32/f64)
        C* const dx = acc.data;
        if constexpr (Mode == 1) std::fill_n(dx, planes * h * w, C(0));
        for (std::size_t p = 0; p < planes; ++p)
            for (std::size_t i = 0; i < OH; ++i)
                for (std::size_t j = 0; j < OW; ++j) {
                    const std::size_t r0 = adaptive_begin(i, OH, h), r1 = adaptive_end(i, OH, h);
                    const std::size_t c0 = adaptive_begin(j, OW, w), c1 = adaptive_end(j, OW, w);
                    const C inv = C(1) / C((r1 - r0) * (c1 - c0));
                    const std::size_t o = (p * OH + i) * OW + j;
                    if constexpr (Mode == 0) {
                        C s = 0;
                        for (std::size_t r = r0; r < r1; ++r)
                            for (std::size_t c = c0; c < c1; ++c) s += src[(p * h + r) * w + c];
                        out[o] = T(s * inv);
                    } else {
                        for (std::size_t r = r0; r < r1; ++r)
                            for (std::size_t c = c0; c < c1; ++c) dx[(p * h + r) * w + c] += src[o] * inv;
                    }
                }
        acc.store(out);
    }
    // The device: one thread per output element, or per input element for the backward (the
    // windows holding it, in the CPU's order: the same sums, no atomics).
    static constexpr const char* device_source = R"CUDA(
// adaptive_avg_pool2d (ops/pool.hpp). w: out, OH, OW, then src (x; g for the backward) and x as
// refs. T the output's code, B the buffer code of src.
template <int Mode, int T, int B> __device__ void tg_adaptive_pool(const tg_node_args& p) {
    typedef typename tg_ty<T>::C C;
    typename tg_ty<T>::S* out = (typename tg_ty<T>::S*)p.w[0];
    const tg_i64 OH = (tg_i64)p.w[1], OW = (tg_i64)p.w[2];
    const tg_ref src = tg_ref_at(p, 3);
    const tg_ref x = Mode == 0 ? src : tg_ref_at(p, 5 + 2 * src.rank);
    const typename tg_ty<B>::S* sp = (const typename tg_ty<B>::S*)src.p;
    const tg_i64 h = (tg_i64)x.ext[2], w = (tg_i64)x.ext[3], planes = (tg_i64)x.ext[0] * (tg_i64)x.ext[1];
    TG_GRID_LOOP(e, Mode == 0 ? planes * OH * OW : planes * h * w) {
        C s = 0;
        if (Mode == 0) {
            const tg_i64 j = e % OW, i = (e / OW) % OH, pl = e / (OH * OW);
            const tg_i64 r0 = i * h / OH, r1 = ((i + 1) * h + OH - 1) / OH, c0 = j * w / OW, c1 = ((j + 1) * w + OW - 1) / OW;
            for (tg_i64 r = r0; r < r1; ++r)
                for (tg_i64 c = c0; c < c1; ++c) s += (C)tg_ty<B>::from(sp[tg_ref_offset(src, (pl * h + r) * w + c)]);
            s = s * ((C)1 / (C)((r1 - r0) * (c1 - c0)));
        } else {
            const tg_i64 c = e % w, r = (e / w) % h, pl = e / (h * w);
            for (tg_i64 i = 0; i < OH; ++i) {
                const tg_i64 r0 = i * h / OH, r1 = ((i + 1) * h + OH - 1) / OH;
                if (r < r0 || r >= r1) continue;
                for (tg_i64 j = 0; j < OW; ++j) {
                    const tg_i64 c0 = j * w / OW, c1 = ((j + 1) * w + OW - 1) / OW;
                    if (c < c0 || c >= c1) continue;
                    const C inv = (C)1 / (C)((r1 - r0) * (c1 - c0));
                    s += (C)tg_ty<B>::from(sp[tg_ref_offset(src, (pl * OH + i) * OW + j)]) * inv;
                }
            }
        }
        out[e] = tg_ty<T>::to(s);
    }
}
)CUDA";
    template <class N>
    static std::string device_call() {
        return device_template_call("tg_adaptive_pool", {Mode, device_type_code<buffer_t<N>>(),
                                                         device_type_code<buffer_t<type_at_t<0, typename N::children>>>()});
    }
    template <class N, class Ref>
    static std::size_t device_words(const Ref* in, void* out, const std::size_t* ext, std::uint64_t* w, void*) {
        w[0] = device_word(out);
        w[1] = OH;
        w[2] = OW;
        const std::size_t at = put_device_ref(w, 3, in[0]);
        if constexpr (Mode != 0) put_device_ref(w, at, in[1]);
        return ext[0] * ext[1] * ext[2] * ext[3];
    }
    template <std::size_t I, class G, class Out, class... Cs>
    static constexpr auto vjp(G g, Out, Cs... cs) {
        static_assert(I == 0, "typegrad: internal: only the first operand of adaptive_avg_pool2d carries a gradient");
        if constexpr (Mode == 0) return make_node<adaptive_avg_pool_op<OH, OW, 1>>(g, cs...);
        else return make_node<adaptive_avg_pool_op<OH, OW, 0>>(g);
    }
};

}  // namespace detail

#define TYPEGRAD_DETAIL_CHECK_POOL(fname, X)                                                                         \
    static_assert(X::shape_type::rank == 4, "typegrad: " fname " takes x of rank 4 (NCHW).");                       \
    static_assert(is_dtype_v<typename X::value_type>, "typegrad: " fname " takes a floating x.");                   \
    static_assert(Kernel >= 1 && Stride >= 1, "typegrad: " fname " needs kernel >= 1 and stride >= 1.");              \
    static_assert(2 * Padding <= Kernel, "typegrad: " fname " needs padding <= kernel / 2 (PyTorch's rule).");        \
    static_assert(X::shape_type::rank != 4 || ::typegrad::detail::pool_window_fits<X, Kernel, Padding>(),            \
                  "typegrad: " fname ": the window is larger than the padded input.")

namespace detail {
template <class X, std::size_t K, std::size_t P>
constexpr bool pool_window_fits() {
    using S = typename X::shape_type;
    return (S::extents[2] == dyn || S::extents[2] + 2 * P >= K) && (S::extents[3] == dyn || S::extents[3] + 2 * P >= K);
}
}  // namespace detail

// F.max_pool2d(x, kernel, stride, padding); Stride 0 means the kernel size (PyTorch's default).
template <std::size_t Kernel, std::size_t StrideArg = 0, std::size_t Padding = 0, expression X>
constexpr auto max_pool2d(X x) {
    constexpr std::size_t Stride = StrideArg == 0 ? Kernel : StrideArg;
    TYPEGRAD_DETAIL_CHECK_POOL("max_pool2d<kernel, stride, padding>(x)", X);
    return detail::make_node<detail::pool_op<true, 0, Kernel, Stride, Padding>>(x);
}
// F.avg_pool2d(x, kernel, stride, padding) with count_include_pad=True.
template <std::size_t Kernel, std::size_t StrideArg = 0, std::size_t Padding = 0, expression X>
constexpr auto avg_pool2d(X x) {
    constexpr std::size_t Stride = StrideArg == 0 ? Kernel : StrideArg;
    TYPEGRAD_DETAIL_CHECK_POOL("avg_pool2d<kernel, stride, padding>(x)", X);
    return detail::make_node<detail::pool_op<false, 0, Kernel, Stride, Padding>>(x);
}
#undef TYPEGRAD_DETAIL_CHECK_POOL

// F.adaptive_avg_pool2d(x, (OH, OW)): x [N, C, H, W] -> [N, C, OH, OW] for any H, W >= 1.
template <std::size_t OH, std::size_t OW = OH, expression X>
constexpr auto adaptive_avg_pool2d(X x) {
    static_assert(X::shape_type::rank == 4, "typegrad: adaptive_avg_pool2d<oh, ow>(x) takes x of rank 4 (NCHW).");
    static_assert(is_dtype_v<typename X::value_type>, "typegrad: adaptive_avg_pool2d<oh, ow>(x) takes a floating x.");
    static_assert(OH >= 1 && OW >= 1, "typegrad: adaptive_avg_pool2d<oh, ow>(x) needs output extents >= 1.");
    if constexpr (X::shape_type::rank == 4) return detail::make_node<detail::adaptive_avg_pool_op<OH, OW, 0>>(x);
    else return x;
}

}  // namespace typegrad
