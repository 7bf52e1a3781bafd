#pragma once
// conv2d with zero padding, where a padded position takes part in no product: oneDNN's (LibTorch's
// float CPU path) and cuDNN's convolutions, and typegrad's (ops/conv.hpp). LibTorch 1.13's double
// CPU path (slow_conv2d) multiplies the im2col buffer's padding zeros instead, so an infinite
// weight or gradient there gives NaN where its float path gives +-inf (docs/reliability.md,
// finding 19): the double reference sums shifted slices, one per kernel offset (dilated, and per
// group), and pads the partial results (which adds zeros, never multiplies them). Differentiable
// (LibTorch autograd).
// Used by the plain and the autocast differential harnesses.
#include <torch/torch.h>

#include <cstdint>
#include <utility>

namespace typegrad_differential {

inline torch::Tensor conv2d_without_padding_products(const torch::Tensor& x, const torch::Tensor& w, std::int64_t sh,
                                                     std::int64_t sw, std::int64_t ph, std::int64_t pw, std::int64_t dh = 1,
                                                     std::int64_t dw = 1, std::int64_t groups = 1) {
    const std::int64_t N = x.size(0), H = x.size(2), W = x.size(3), O = w.size(0), CG = w.size(1), KH = w.size(2), KW = w.size(3);
    const std::int64_t Ho = (H + 2 * ph - dh * (KH - 1) - 1) / sh + 1, Wo = (W + 2 * pw - dw * (KW - 1) - 1) / sw + 1;
    // the outputs o whose input position o * s + k - p lies in [0, n) (k: the offset, times the dilation)
    auto range = [](std::int64_t k, std::int64_t s, std::int64_t p, std::int64_t n, std::int64_t outs) {
        std::int64_t lo = 0;
        while (lo < outs && lo * s + k - p < 0) ++lo;
        std::int64_t hi = outs - 1;
        while (hi >= lo && hi * s + k - p >= n) --hi;
        return std::pair{lo, hi};
    };
    torch::Tensor y = torch::zeros({N, O, Ho, Wo}, x.options());
    for (std::int64_t i = 0; i < KH; ++i)
        for (std::int64_t j = 0; j < KW; ++j) {
            const auto [hl, hh] = range(i * dh, sh, ph, H, Ho);
            const auto [wl, wh] = range(j * dw, sw, pw, W, Wo);
            if (hl > hh || wl > wh) continue;
            const auto xs = x.slice(2, hl * sh + i * dh - ph, hh * sh + i * dh - ph + 1, sh)
                                .slice(3, wl * sw + j * dw - pw, wh * sw + j * dw - pw + 1, sw);
            // group g's outputs read its CG input channels
            const auto part = torch::einsum("ngchw,goc->ngohw", {xs.reshape({N, groups, CG, xs.size(2), xs.size(3)}),
                                                                 w.select(3, j).select(2, i).reshape({groups, O / groups, CG})})
                                  .reshape({N, O, xs.size(2), xs.size(3)});
            y = y + torch::constant_pad_nd(part, {wl, Wo - 1 - wh, hl, Ho - 1 - hh});
        }
    return y;
}

}  // namespace typegrad_differential
