#pragma once
// The graphs the CUDA tests run: every op family, broadcasting, reductions over all and over
// axes, views, matmul/linear (2-D and batched), losses, cast, hooks with device expressions, f64,
// and the MLP of examples/mlp.cpp. for_each_graph(f) calls f(name, step) for each.
#include <typegrad/cuda.hpp>

#include <cstdint>

namespace cuda_tests {
namespace tg = typegrad;

constexpr auto A = tg::param<"A", float, tg::shape<tg::dyn, 5>>;
constexpr auto B = tg::param<"B", float, tg::shape<tg::dyn, 5>>;
constexpr auto v = tg::param<"v", float, tg::shape<5>>;
constexpr auto w5 = tg::param<"w5", float, tg::shape<5>>;
constexpr auto M = tg::param<"M", float, tg::shape<5, 4>>;
constexpr auto Wl = tg::param<"Wl", float, tg::shape<4, 5>>;
constexpr auto bl = tg::param<"bl", float, tg::shape<4>>;
constexpr auto X3 = tg::param<"X3", float, tg::shape<2, 3, 5>>;
constexpr auto D = tg::param<"D", double, tg::shape<tg::dyn, 5>>;
constexpr auto labels = tg::input<"labels", std::int32_t, tg::shape<tg::dyn>>;
// int64 ids (compare.hpp fills them with (3 i + 1) % 5: valid rows of a 5-row table)
constexpr auto tokens = tg::input<"tokens", std::int64_t, tg::shape<tg::dyn>>;
constexpr auto positions = tg::input<"positions", std::int64_t, tg::shape<tg::dyn, 5>>;
constexpr auto start = tg::input<"start", std::int64_t, tg::shape<1>>;
constexpr auto count = tg::input<"count", std::int64_t, tg::shape<>>;  // 3 (compare.hpp): narrow's length
constexpr auto seed_offset = tg::input<"seed_offset", std::int64_t, tg::shape<2>>;  // {seed, offset} = {1, 4}
constexpr auto E = tg::param<"E", float, tg::shape<5, 4>>;
constexpr auto Ed = tg::param<"Ed", double, tg::shape<5, 4>>;
// NCHW images (pooling)
constexpr auto Img = tg::param<"Img", float, tg::shape<tg::dyn, 2, 5, 6>>;
constexpr auto Imgd = tg::param<"Imgd", double, tg::shape<tg::dyn, 2, 5, 6>>;
// convolution weights [O, C / groups, KH, KW] for the images (C = 2), and conv1d's [O, C, K]
constexpr auto Wc = tg::param<"Wc", float, tg::shape<3, 2, 3, 3>>;
constexpr auto Wg = tg::param<"Wg", float, tg::shape<4, 1, 2, 2>>;
constexpr auto Wcd = tg::param<"Wcd", double, tg::shape<3, 2, 3, 3>>;
constexpr auto Wk = tg::param<"Wk", double, tg::shape<3, 2, 4>>;
constexpr auto Imgh = tg::param<"Imgh", tg::bf16, tg::shape<tg::dyn, 2, 5, 6>>;
constexpr auto Wch = tg::param<"Wch", tg::bf16, tg::shape<3, 2, 3, 3>>;
// 36 x 64 im2col elements per image: at n = 70000 the device goes in three chunks of images
constexpr auto Img4 = tg::param<"Img4", float, tg::shape<tg::dyn, 4, 8, 8>>;
constexpr auto Wc4 = tg::param<"Wc4", float, tg::shape<2, 4, 3, 3>>;
// attention: n matrices of 6 queries (d = 4); Xh's rows as two heads of 4 ([n, 6, 2, 4] -> [n, 2, 6, 4])
constexpr auto Xa = tg::param<"Xa", float, tg::shape<tg::dyn, 6, 4>>;
constexpr auto Xad = tg::param<"Xad", double, tg::shape<tg::dyn, 6, 4>>;
constexpr auto Xah = tg::param<"Xah", tg::bf16, tg::shape<tg::dyn, 6, 4>>;
constexpr auto Xh = tg::param<"Xh", float, tg::shape<tg::dyn, 6, 8>>;
// bf16 / f16 leaves
constexpr auto Ah = tg::param<"Ah", tg::bf16, tg::shape<tg::dyn, 5>>;
constexpr auto Bh = tg::param<"Bh", tg::bf16, tg::shape<tg::dyn, 5>>;
constexpr auto Mh = tg::param<"Mh", tg::bf16, tg::shape<5, 4>>;
constexpr auto Hf = tg::param<"Hf", tg::f16, tg::shape<tg::dyn, 5>>;
constexpr auto Mf = tg::param<"Mf", tg::f16, tg::shape<5, 4>>;
// the MLP
constexpr std::size_t hidden = 16;
constexpr auto X = tg::input<"X", float, tg::shape<tg::dyn, 2>>;
constexpr auto W1 = tg::param<"W1", float, tg::shape<hidden, 2>>;
constexpr auto b1 = tg::param<"b1", float, tg::shape<hidden>>;
constexpr auto W2 = tg::param<"W2", float, tg::shape<2, hidden>>;
constexpr auto b2 = tg::param<"b2", float, tg::shape<2>>;

// An elementwise hook that also runs on the device: its CUDA expression beside its C++ one.
struct double_the_gradient {
    static constexpr const char* device = "({0} * (T)2)";
    template <class V>
    V operator()(const V& g) const { return g * V(2); }
};

// A custom op with device implementations beside its host ones: y = x * w * w (elementwise),
// dx = g * w * w, dw = 2 g x w. Each device body is the inside of a kernel (docs/cuda.md).
struct weighted_square {
    template <class Ctx>
    static void forward(Ctx& ctx) {
        auto [x, w] = ctx.inputs();
        auto y = ctx.output();
        for (std::size_t i = 0; i < y.size(); ++i) y[i] = x[i] * w[i] * w[i];
    }
    template <class Ctx>
    static void backward(Ctx& ctx) {
        auto [x, w] = ctx.inputs();
        auto g = ctx.grad_output();
        auto [gx, gw] = ctx.grad_inputs();
        for (std::size_t i = 0; i < g.size(); ++i) {
            gx[i] = g[i] * w[i] * w[i];
            gw[i] = 2 * g[i] * x[i] * w[i];
        }
    }
    static constexpr const char* device_forward = R"(
        for (tg_i64 i = tg_thread; i < n; i += tg_threads) out[i] = in0[i] * in1[i] * in1[i];
    )";
    static constexpr const char* device_backward = R"(
        for (tg_i64 i = tg_thread; i < n; i += tg_threads) {
            grad_in0[i] = grad_out[i] * in1[i] * in1[i];
            grad_in1[i] = (T)2 * grad_out[i] * in0[i] * in1[i];
        }
    )";
};

// The graphs in two parts (Part 0: elementwise ops to convolutions; 1: views, losses, dtypes,
// indexing, attention, hooks, the MLP), so that the device tests compile in two units at once.
template <int Part, class F>
void for_each_graph_in(F&& f) {
    using tg::lit;
    if constexpr (Part == 0) {
        // elementwise
        f("add", tg::compile(tg::sum(A + B), tg::wrt(A, B)));
        f("sub", tg::compile(tg::sum((A - B) * A), tg::wrt(A, B)));
        f("mul", tg::compile(tg::sum(A * B), tg::wrt(A, B)));
        f("div", tg::compile(tg::sum(A / (tg::square(B) + lit<1>)), tg::wrt(A, B)));
        f("neg", tg::compile(tg::sum(-A * B), tg::wrt(A, B)));
        f("exp", tg::compile(tg::sum(tg::exp(A) * B), tg::wrt(A, B)));
        f("log", tg::compile(tg::sum(tg::log(tg::square(A) + lit<1>)), tg::wrt(A)));
        f("sqrt", tg::compile(tg::sum(tg::sqrt(tg::square(A) + lit<1>)), tg::wrt(A)));
        f("square", tg::compile(tg::sum(tg::square(A)), tg::wrt(A)));
        f("pow", tg::compile(tg::sum(tg::pow(tg::square(A) + lit<1>, B)), tg::wrt(A, B)));
        f("pow_constant", tg::compile(tg::sum(tg::pow(tg::abs(A) + lit<1>, lit<3>)), tg::wrt(A)));
        f("sin_cos", tg::compile(tg::sum(tg::sin(A) * tg::cos(B)), tg::wrt(A, B)));
        f("tanh", tg::compile(tg::sum(tg::tanh(A) * B), tg::wrt(A, B)));
        f("sigmoid", tg::compile(tg::sum(tg::sigmoid(A) * B), tg::wrt(A, B)));
        f("relu", tg::compile(tg::sum(tg::relu(A) * B), tg::wrt(A, B)));
        f("abs", tg::compile(tg::sum(tg::abs(A) * B), tg::wrt(A, B)));
        f("maximum_minimum", tg::compile(tg::sum(tg::max(A, B) + tg::min(A, B) * B), tg::wrt(A, B)));
        f("where_masks", tg::compile(tg::sum(tg::where(tg::gt(A, B), A, B * lit<2>) +
                                             A * tg::ge(A, B) + B * tg::le(A, B) + A * tg::lt(A, B) + B * tg::eq(A, B)),
                                     tg::wrt(A, B)));
        f("detach", tg::compile(tg::sum(tg::detach(A) * B), tg::wrt(A, B)));
        // activations, special functions and norms (ops/activation.hpp, special.hpp, norm.hpp)
        f("activations", tg::compile(tg::sum((tg::gelu(A) + tg::gelu<tg::approximate::tanh>(B) + tg::silu(A)) * B +
                                             tg::softplus<2>(A) + tg::leaky_relu<0.2>(B) * A + tg::elu(A) +
                                             tg::clamp(A, lit<-0.5>, B)),
                                     tg::wrt(A, B)));
        f("special", tg::compile(tg::sum(tg::erf(A) * B + tg::log1p(tg::square(A)) + tg::expm1(B * lit<0.5>)), tg::wrt(A, B)));
        f("layer_norm", tg::compile(tg::sum(tg::square(tg::layer_norm(A, v, w5)) + tg::rms_norm(B, v) * A), tg::wrt(A, v, w5, B)));
        f("bf16_activations", tg::compile(tg::sum(tg::cast<float>(tg::gelu(Ah) * tg::softplus(Bh) + tg::layer_norm(Ah))),
                                          tg::wrt(Ah, Bh)));
        // broadcasting
        f("broadcast_row", tg::compile(tg::sum((A + v) * B), tg::wrt(A, v, B)));
        f("broadcast_to", tg::compile(tg::sum(tg::square(tg::broadcast_to<tg::shape<4, 5>>(v))), tg::wrt(v)));
        // reductions
        f("mean", tg::compile(tg::mean(tg::square(A)), tg::wrt(A)));
        f("max_min_all", tg::compile(tg::max(A) + tg::min(B), tg::wrt(A, B)));
        f("sum_rows", tg::compile(tg::sum(tg::square(tg::sum(A, tg::axes<1>))), tg::wrt(A)));
        f("sum_columns", tg::compile(tg::sum(tg::square(tg::sum(A, tg::axes<0>))), tg::wrt(A)));
        f("mean_keepdim", tg::compile(tg::sum(tg::square(A - tg::mean(A, tg::axes<1>, tg::keepdim))), tg::wrt(A)));
        f("max_min_axes", tg::compile(tg::sum(tg::max(A, tg::axes<1>)) + tg::sum(tg::min(B, tg::axes<0>)), tg::wrt(A, B)));
        // prod: rows with 0, 1 or more zeros (relu), and long products near 1 (split over blocks)
        f("prod_axes", tg::compile(tg::sum(tg::prod(A, tg::axes<1>) + tg::prod(tg::relu(B), tg::axes<1>)) +
                                       tg::sum(tg::prod(lit<1> + A * lit<0.0001>, tg::axes<0>)),
                                   tg::wrt(A, B)));
        f("prod_all", tg::compile(tg::prod(lit<1> + B * lit<0.0001>), tg::wrt(B)));
        f("log_sum_exp", tg::compile(tg::log_sum_exp(A), tg::wrt(A)));
        f("log_softmax", tg::compile(tg::sum(tg::log_softmax(A) * B), tg::wrt(A, B)));
        f("softmax_axis0", tg::compile(tg::sum(tg::softmax(A, tg::axes<0>) * B), tg::wrt(A, B)));
        // views and matmul
        f("matmul", tg::compile(tg::sum(tg::square(tg::matmul(A, M))), tg::wrt(A, M)));
        f("linear", tg::compile(tg::sum(tg::square(tg::linear(A, Wl, bl))), tg::wrt(A, Wl, bl)));
        f("matmul_batched", tg::compile(tg::sum(tg::square(tg::matmul(X3, M))), tg::wrt(X3, M)));
        f("matmul_vector", tg::compile(tg::sum(tg::square(tg::matmul(A, w5))), tg::wrt(A, w5)));
        // pooling: overlapping and padded windows, their backwards (gathers per input element) and
        // max_pool2d's second order (the gather at the maxima)
        f("pool", tg::compile(tg::sum(tg::square(tg::max_pool2d<3, 2, 1>(Img))) + tg::sum(tg::exp(tg::avg_pool2d<2, 1, 1>(Img))) +
                                  tg::sum(tg::square(tg::adaptive_avg_pool2d<3, 4>(Img))),
                              tg::wrt(Img)));
        f("pool_f64", tg::compile(tg::sum(tg::square(tg::max_pool2d<2>(Imgd))) + tg::sum(tg::square(tg::avg_pool2d<3, 2, 1>(Imgd))) +
                                      tg::sum(tg::square(tg::adaptive_avg_pool2d<4, 3>(Imgd))),
                                  tg::wrt(Imgd)));
        f("pool_grad_grad", tg::compile(tg::sum(tg::square(tg::grad(tg::sum(tg::square(tg::max_pool2d<3, 2, 1>(Img))), Img))),
                                        tg::wrt(Img)));
        // convolution: padding, stride, dilation, groups, both backward products (in conv_grad_grad
        // also as each other's VJPs), conv1d as conv2d of height 1, bf16 operands computed in f32
        f("conv", tg::compile(tg::sum(tg::square(tg::conv2d<1, 1>(Img, Wc))) + tg::sum(tg::tanh(tg::conv2d<2, 1, 1, 2>(Img, Wg))) +
                                  tg::sum(tg::square(tg::conv2d<1, 0, 2>(Img, Wc))),
                              tg::wrt(Img, Wc, Wg)));
        f("conv_f64", tg::compile(tg::sum(tg::square(tg::conv2d<1, 1>(Imgd, Wcd))) +
                                      tg::sum(tg::square(tg::conv1d<2, 1>(tg::reshape<tg::shape<tg::dyn, 2, 30>>(Imgd), Wk))),
                                  tg::wrt(Imgd, Wcd, Wk)));
        // (tanh of the scaled weight gradient, not its square: that sums terms of the weight
        // gradient's size, ~ sqrt(N Ho Wo), to small results, and float noise dominates them)
        f("conv_grad_grad", tg::compile(tg::sum(tg::tanh(tg::grad(tg::sum(tg::square(tg::conv2d<1, 1>(Img, Wc))), Wc) * lit<0.001>)),
                                        tg::wrt(Img, Wc)));
        // batch_norm in training (batch statistics, its fused backward) and in evaluation
        f("batch_norm", tg::compile(tg::sum(tg::square(tg::batch_norm(Img, b2, b2))) +
                                        tg::sum(tg::square(tg::batch_norm<false>(Img, b2, tg::square(b2) + lit<1>, b2, b2))),
                                    tg::wrt(Img, b2)));
        f("conv_chunks", tg::compile(tg::sum(tg::square(tg::conv2d<1, 1>(Img4, Wc4))), tg::wrt(Img4, Wc4)));
        f("bf16_conv", tg::compile(tg::sum(tg::square(tg::cast<float>(tg::conv2d<1, 1>(Imgh, Wch)))), tg::wrt(Imgh, Wch)));
    } else {
        // permute<2, 0, 1>(X3) is [5, 2, 3] with neither inner axis unit-stride: a dense copy for cuBLAS
        f("matmul_dense_copy", tg::compile(tg::sum(tg::square(tg::matmul(tg::permute<2, 0, 1>(X3), tg::slice<0, 0, 3>(M)))),
                                           tg::wrt(X3, M)));
        f("dot", tg::compile(tg::dot(v, w5), tg::wrt(v, w5)));
        f("reshape", tg::compile(tg::sum(tg::square(tg::reshape<tg::shape<tg::dyn>>(A))), tg::wrt(A)));
        f("transpose", tg::compile(tg::sum(tg::square(tg::transpose(A)) * tg::transpose(B)), tg::wrt(A, B)));
        f("slice", tg::compile(tg::sum(tg::square(tg::slice<1, 1, 4>(A))), tg::wrt(A)));
        f("unsqueeze_squeeze", tg::compile(tg::sum(tg::square(tg::squeeze<0>(tg::unsqueeze<0>(v)))), tg::wrt(v)));
        f("contiguous", tg::compile(tg::sum(tg::square(tg::contiguous(tg::transpose(A)))), tg::wrt(A)));
        // losses
        f("mse_loss", tg::compile(tg::mse_loss(A, B), tg::wrt(A, B)));
        f("cross_entropy", tg::compile(tg::cross_entropy(A, labels), tg::wrt(A)));
        f("nll_loss", tg::compile(tg::nll_loss(tg::log_softmax(A, tg::axes<1>), labels), tg::wrt(A)));
        f("bce_with_logits", tg::compile(tg::binary_cross_entropy_with_logits(A, tg::sigmoid(B)), tg::wrt(A, B)));
        // dtypes
        f("cast", tg::compile(tg::sum(tg::cast<double>(A) * D), tg::wrt(A, D)));
        // bf16 -> f64 (exact): a bf16 loop's value, and a bf16 sum held in a float buffer (rounded first)
        f("cast_bf16_to_f64", tg::compile(tg::sum(tg::cast<double>(Ah * Bh) * D) +
                                              tg::sum(tg::cast<double>(tg::sum(Ah * Bh, tg::axes<1>)) * tg::sum(D, tg::axes<1>)),
                                          tg::wrt(D)));
        f("f64", tg::compile(tg::sum(tg::exp(D) * D), tg::wrt(D)));
        // bf16 / f16 (docs/cuda.md): per-op rounding in float loops, reductions in float buffers,
        // mixed promotion, views, cuBLAS GEMMs with f32 accumulation, autocast regions on CUDA
        f("bf16_elementwise", tg::compile(tg::sum(tg::cast<float>(tg::exp(Ah) * Bh + Ah)), tg::wrt(Ah, Bh)));
        f("f16_elementwise", tg::compile(tg::sum(tg::cast<float>(tg::tanh(Hf) * Hf - tg::square(Hf))), tg::wrt(Hf)));
        f("bf16_promote", tg::compile(tg::sum(Ah * A + tg::sigmoid(Bh)), tg::wrt(Ah, A, Bh)));
        f("bf16_reduction", tg::compile(tg::sum(tg::cast<float>(tg::square(tg::sum(Ah * Bh, tg::axes<1>)))), tg::wrt(Ah, Bh)));
        f("bf16_slice_transpose", tg::compile(tg::sum(tg::cast<float>(tg::square(tg::slice<1, 1, 4>(tg::transpose(tg::transpose(Ah)))))),
                                              tg::wrt(Ah)));
        f("bf16_matmul", tg::compile(tg::sum(tg::cast<float>(tg::square(tg::matmul(Ah, Mh)))), tg::wrt(Ah, Mh)));
        f("f16_matmul", tg::compile(tg::sum(tg::cast<float>(tg::matmul(Hf, Mf))), tg::wrt(Hf, Mf)));
        f("autocast_cuda_f16_mlp",
          tg::compile(tg::autocast<tg::cuda_f16>(tg::cross_entropy(tg::linear(tg::relu(tg::linear(X, W1, b1)), W2, b2), labels)),
                      tg::wrt(W1, b1, W2, b2)));
        f("autocast_cuda_bf16", tg::compile(tg::autocast<tg::cuda_bf16>(tg::sum(tg::exp(tg::matmul(A, M)))), tg::wrt(A, M)));
        // a custom op with device implementations, inside fused code on both sides
        f("custom_device", tg::compile(tg::sum(tg::square(tg::custom<weighted_square>(tg::exp(A), B)) + A), tg::wrt(A, B)));
        f("custom_device_f64", tg::compile(tg::sum(tg::custom<weighted_square>(D, D * D)), tg::wrt(D)));
        // kernel ops with device kernels beside their CPU ones (ops/index.hpp, dropout.hpp,
        // arg_reduce.hpp, attention.hpp)
        f("embedding", tg::compile(tg::sum(tg::square(tg::embedding(tokens, E)) * tg::slice<1, 0, 4>(tg::sum(A, tg::axes<0>, tg::keepdim))),
                                   tg::wrt(E, A)));
        f("embedding_padding_f64", tg::compile(tg::sum(tg::exp(tg::embedding<2>(tokens, Ed))), tg::wrt(Ed)));
        f("embedding_of_argmax", tg::compile(tg::sum(tg::square(tg::embedding(tg::argmax(A, tg::axes<1>), E)) * tg::slice<1, 1, 5>(B)),
                                             tg::wrt(E, B)));
        f("index_select", tg::compile(tg::sum(tg::square(tg::index_select<0>(M, tokens)) + tg::index_select<1>(A, tg::argmax(v, tg::axes<0>, tg::keepdim)) * tg::sum(B)),
                                      tg::wrt(M, A, B)));
        f("gather", tg::compile(tg::sum(tg::exp(tg::gather<1>(A, positions)) * B), tg::wrt(A, B)));
        f("dynamic_slice", tg::compile(tg::sum(tg::square(tg::dynamic_slice<1, 3>(tg::transpose(tg::transpose(A)), start))) +
                                           tg::sum(tg::dynamic_slice<0, 1>(v, tg::argmin(v))),
                                       tg::wrt(A, v)));
        // narrow: the lengths are leaves the device's shape pass copies to the host
        f("narrow", tg::compile(tg::sum(tg::square(tg::narrow<1>(tg::transpose(tg::transpose(A)), start, count))) +
                                    tg::sum(tg::exp(tg::narrow<1>(B, tg::argmin(v), start))),
                                tg::wrt(A, B)));
        f("concat_stack", tg::compile(tg::sum(tg::square(tg::concat<1>(A, tg::exp(B), tg::cast<float>(D)))) +
                                          tg::sum(tg::stack<0>(v, w5) * tg::stack<0>(w5, v)),
                                      tg::wrt(A, B, D, v, w5)));
        f("recurrence", tg::compile(tg::sum(tg::square(tg::linear_recurrence<0>(w5 * lit<0.5>, A)) * B) +
                                        tg::sum(tg::cumsum<-1>(tg::transpose(B)) * tg::transpose(A)),
                                    tg::wrt(A, B, w5)));
        f("bf16_recurrence", tg::compile(tg::sum(tg::cast<float>(tg::cumsum<0>(Ah) * tg::linear_recurrence<1>(Bh, Ah))),
                                         tg::wrt(Ah, Bh)));
        f("dropout", tg::compile(tg::sum(tg::square(tg::dropout<0.3>(A, seed_offset)) * B), tg::wrt(A, B)));
        f("attention_causal", tg::compile(tg::sum(tg::square(tg::scaled_dot_product_attention(X3, X3 * lit<0.5>, X3, tg::causal))),
                                          tg::wrt(X3)));
        // the fused op (forward and packed backward) over n matrices, plain and causal, strided heads
        f("attention", tg::compile(tg::sum(tg::square(tg::scaled_dot_product_attention(Xa, Xa * lit<0.5>, tg::tanh(Xa)))) +
                                       tg::sum(tg::sin(tg::scaled_dot_product_attention<0.7>(Xa, tg::exp(Xa), Xa, tg::causal))),
                                   tg::wrt(Xa)));
        f("attention_heads", tg::compile(tg::sum(tg::square(tg::scaled_dot_product_attention(
                                             tg::transpose<1, 2>(tg::reshape<tg::shape<tg::dyn, 6, 2, 4>>(Xh)),
                                             tg::transpose<1, 2>(tg::reshape<tg::shape<tg::dyn, 6, 2, 4>>(Xh * lit<0.5>)),
                                             tg::transpose<1, 2>(tg::reshape<tg::shape<tg::dyn, 6, 2, 4>>(tg::tanh(Xh))), tg::causal))),
                                         tg::wrt(Xh)));
        f("attention_f64", tg::compile(tg::sum(tg::square(tg::scaled_dot_product_attention(Xad, Xad, tg::tanh(Xad), tg::causal))),
                                       tg::wrt(Xad)));
        f("bf16_attention", tg::compile(tg::sum(tg::square(tg::cast<float>(tg::scaled_dot_product_attention(Xah, Xah, Xah, tg::causal)))),
                                        tg::wrt(Xah)));
        // hooks
        f("hook_device", tg::compile(tg::sum(tg::square(tg::hook(A, double_the_gradient{}))), tg::wrt(A)));
        f("retain_grad", tg::compile(tg::sum(tg::square(tg::retain_grad(A) * B)), tg::wrt(A, B)));
        // the MLP (examples/mlp.cpp) and a non-scalar output (forward + seeded backward)
        f("mlp", tg::compile(tg::cross_entropy(tg::linear(tg::relu(tg::linear(X, W1, b1)), W2, b2), labels),
                             tg::wrt(W1, b1, W2, b2)));
        f("non_scalar", tg::compile(tg::exp(A) * B + v, tg::wrt(A, B, v)));
    }
}

template <class F>
void for_each_graph(F&& f) {
    for_each_graph_in<0>(f);
    for_each_graph_in<1>(f);
}

}  // namespace cuda_tests
