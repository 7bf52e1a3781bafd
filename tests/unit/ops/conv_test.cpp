// Convolution (ops/conv.hpp): conv2d and conv1d (stride, padding, dilation, groups, bias) against
// a direct double reference and finite differences in x, w and b; a strided (permuted) input;
// dynamic batch; second order (the backward ops are each other's adjoints); float; run-time shape
// errors.
#include <check_gradient.hpp>
#include <special_values.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace tg = typegrad;
using tg::testing::inf;
using tg::testing::at;
using tg::testing::check_gradient;
using tg::testing::fixed;
using tg::testing::uniform;
using tg::testing::values_of;
using tg::testing::require_close;

namespace {
// direct convolution, dense NCHW, in double: the definition (F.conv2d's documentation), with
// dilation dh, dw and groups (w is [o, c / groups, kh, kw])
std::vector<double> ref_conv2d(const std::vector<double>& x, const std::vector<double>& w, std::size_t n,
                               std::size_t c, std::size_t h, std::size_t wd, std::size_t o, std::size_t kh,
                               std::size_t kw, std::size_t sh, std::size_t sw, std::size_t ph, std::size_t pw,
                               const std::vector<double>& b = {}, std::size_t dh = 1, std::size_t dw = 1,
                               std::size_t groups = 1) {
    const std::size_t ho = (h + 2 * ph - dh * (kh - 1) - 1) / sh + 1, wo = (wd + 2 * pw - dw * (kw - 1) - 1) / sw + 1;
    const std::size_t cg = c / groups, og = o / groups;
    std::vector<double> y(n * o * ho * wo);
    for (std::size_t a = 0; a < n; ++a)
        for (std::size_t oc = 0; oc < o; ++oc)
            for (std::size_t i = 0; i < ho; ++i)
                for (std::size_t j = 0; j < wo; ++j) {
                    double s = b.empty() ? 0.0 : b[oc];
                    for (std::size_t k = 0; k < cg; ++k)
                        for (std::size_t p = 0; p < kh; ++p)
                            for (std::size_t q = 0; q < kw; ++q) {
                                const std::size_t ic = oc / og * cg + k;
                                const long ih = long(i * sh + p * dh) - long(ph), iw = long(j * sw + q * dw) - long(pw);
                                if (ih < 0 || iw < 0 || ih >= long(h) || iw >= long(wd)) continue;
                                s += x[((a * c + ic) * h + std::size_t(ih)) * wd + std::size_t(iw)] *
                                     w[((oc * cg + k) * kh + p) * kw + q];
                            }
                    y[((a * o + oc) * ho + i) * wo + j] = s;
                }
    return y;
}
}  // namespace

TEST_CASE("conv2d: values and gradients (stride, padding, bias)", "[ops][conv][gradient]") {
    constexpr auto x = tg::param<"x", double, tg::shape<tg::dyn, 2, 5, 4>>;
    constexpr auto w = tg::param<"w", double, tg::shape<3, 2, 3, 2>>;
    constexpr auto b = tg::param<"b", double, tg::shape<3>>;
    auto wv = uniform(36, -1.0, 1.0, 2), bv = uniform(3, -1.0, 1.0, 3);
    for (std::size_t n : {1u, 2u}) {
        auto xv = uniform(n * 40, -1.0, 1.0, 1);
        const auto bx = tg::bind(x, xv, {n, 2, 5, 4});
        require_close(values_of(tg::compile(tg::conv2d(x, w), tg::wrt(x)), bx, tg::bind(w, wv)),
                      ref_conv2d(xv, wv, n, 2, 5, 4, 3, 3, 2, 1, 1, 0, 0));
        require_close(values_of(tg::compile(tg::conv2d<2, 1>(x, w, b), tg::wrt(x)), bx, tg::bind(w, wv), tg::bind(b, bv)),
                      ref_conv2d(xv, wv, n, 2, 5, 4, 3, 3, 2, 2, 2, 1, 1, bv));
        // output [n, 3, 2, 2] for stride 2, padding 1: weights for the loss
        constexpr auto q = tg::input<"q", double, tg::shape<tg::dyn, 3, 3, 3>>;
        auto qv = uniform(n * 27, -1.0, 1.0, 4);
        check_gradient(tg::sum(tg::conv2d<1>(x, w) * q), fixed(tg::bind(q, qv, {n, 3, 3, 3})), at(x, xv, {n, 2, 5, 4}),
                       at(w, wv));
        check_gradient(tg::sum(tg::square(tg::conv2d<2, 1>(x, w, b))), at(x, xv, {n, 2, 5, 4}), at(w, wv), at(b, bv));
    }
}

TEST_CASE("conv2d of a permuted input, second order, float", "[ops][conv][gradient]") {
    // x given as NHWC, permuted to NCHW: a strided operand
    constexpr auto xh = tg::param<"xh", double, tg::shape<1, 4, 4, 2>>;
    constexpr auto w = tg::param<"w", double, tg::shape<2, 2, 2, 2>>;
    auto xv = uniform(32, -1.0, 1.0, 5), wv = uniform(16, -1.0, 1.0, 6);
    std::vector<double> nchw(32);
    for (std::size_t i = 0; i < 4; ++i)
        for (std::size_t j = 0; j < 4; ++j)
            for (std::size_t c = 0; c < 2; ++c) nchw[(c * 4 + i) * 4 + j] = xv[(i * 4 + j) * 2 + c];
    require_close(values_of(tg::compile(tg::conv2d<1, 1>(tg::permute<0, 3, 1, 2>(xh), w), tg::wrt(xh)), tg::bind(xh, xv),
                            tg::bind(w, wv)),
                  ref_conv2d(nchw, wv, 1, 2, 4, 4, 2, 2, 2, 1, 1, 1, 1));
    check_gradient(tg::sum(tg::sin(tg::conv2d<2>(tg::permute<0, 3, 1, 2>(xh), w))), at(xh, xv), at(w, wv));

    // second order: the gradient of sum(conv(x, w)^2) in w, differentiated again
    constexpr auto x = tg::param<"x", double, tg::shape<1, 1, 3, 3>>;
    constexpr auto k = tg::param<"k", double, tg::shape<1, 1, 2, 2>>;
    auto x2 = uniform(9, -1.0, 1.0, 7), k2 = uniform(4, -1.0, 1.0, 8);
    auto inner = tg::sum(tg::square(tg::conv2d(x, k)));
    check_gradient(tg::sum(tg::square(tg::grad(inner, k))), at(x, x2), at(k, k2));

    // float: the same numbers as double, to float precision
    constexpr auto xf = tg::input<"xf", float, tg::shape<2, 2, 5, 4>>;
    constexpr auto wf = tg::param<"wf", float, tg::shape<3, 2, 3, 2>>;
    auto xd = uniform(80, -1.0, 1.0, 9), wd = uniform(36, -1.0, 1.0, 10);
    std::vector<float> xs(xd.begin(), xd.end()), ws(wd.begin(), wd.end());
    auto ys = tg::compile(tg::conv2d<1, 1>(xf, wf), tg::wrt(wf)).forward(tg::bind(xf, xs), tg::bind(wf, ws));
    require_close(std::vector<double>(ys.values().begin(), ys.values().end()),
                  ref_conv2d(std::vector<double>(xs.begin(), xs.end()), std::vector<double>(ws.begin(), ws.end()), 2, 2, 5,
                             4, 3, 3, 2, 1, 1, 1, 1),
                  1e-5);
}

TEST_CASE("conv1d: values and gradients", "[ops][conv][gradient]") {
    constexpr auto x = tg::param<"x", double, tg::shape<2, 3, tg::dyn>>;
    constexpr auto w = tg::param<"w", double, tg::shape<2, 3, 3>>;
    constexpr auto b = tg::param<"b", double, tg::shape<2>>;
    const std::size_t len = 7;
    auto xv = uniform(2 * 3 * len, -1.0, 1.0, 11), wv = uniform(18, -1.0, 1.0, 12), bv = uniform(2, -1.0, 1.0, 13);
    // conv1d is conv2d of height 1
    require_close(values_of(tg::compile(tg::conv1d<2, 1>(x, w, b), tg::wrt(x)), tg::bind(x, xv, {2, 3, len}),
                            tg::bind(w, wv), tg::bind(b, bv)),
                  ref_conv2d(xv, wv, 2, 3, 1, len, 2, 1, 3, 1, 2, 0, 1, bv));
    check_gradient(tg::sum(tg::square(tg::conv1d<2, 1>(x, w, b))), at(x, xv, {2, 3, len}), at(w, wv), at(b, bv));
}

TEST_CASE("conv2d: dilation and groups (values, gradients)", "[ops][conv][gradient]") {
    // groups 2: x has 4 channels, w [6, 2, 2, 3]; dilation 2 spans 3 x 5 pixels
    constexpr auto x = tg::param<"x", double, tg::shape<tg::dyn, 4, 6, 7>>;
    constexpr auto w = tg::param<"w", double, tg::shape<6, 2, 2, 3>>;
    constexpr auto b = tg::param<"b", double, tg::shape<6>>;
    auto wv = uniform(72, -1.0, 1.0, 21), bv = uniform(6, -1.0, 1.0, 22);
    for (std::size_t n : {1u, 2u}) {
        auto xv = uniform(n * 168, -1.0, 1.0, 23);
        const auto bx = tg::bind(x, xv, {n, 4, 6, 7});
        // extents: (6 + 2 - 3) / 2 + 1 = 3, (7 + 2 - 5) / 2 + 1 = 3
        auto y = tg::conv2d<2, 1, 2, 2>(x, w, b);
        STATIC_REQUIRE(std::is_same_v<decltype(y)::shape_type, tg::shape<tg::dyn, 6, 3, 3>>);
        require_close(values_of(tg::compile(y, tg::wrt(x)), bx, tg::bind(w, wv), tg::bind(b, bv)),
                      ref_conv2d(xv, wv, n, 4, 6, 7, 6, 2, 3, 2, 2, 1, 1, bv, 2, 2, 2));
        require_close(values_of(tg::compile(tg::conv2d<1, 0, 3, 2>(x, w), tg::wrt(x)), bx, tg::bind(w, wv)),
                      ref_conv2d(xv, wv, n, 4, 6, 7, 6, 2, 3, 1, 1, 0, 0, {}, 3, 3, 2));
        check_gradient(tg::sum(tg::square(tg::conv2d<2, 1, 2, 2>(x, w, b))), at(x, xv, {n, 4, 6, 7}), at(w, wv), at(b, bv));
        check_gradient(tg::sum(tg::sin(tg::conv2d<1, 2, 3, 2>(x, w))), at(x, xv, {n, 4, 6, 7}), at(w, wv));
    }
    // depthwise (groups = channels), dilation 1: each channel its own 3 x 3 filter
    constexpr auto xd = tg::param<"xd", double, tg::shape<2, 3, 5, 5>>;
    constexpr auto wd = tg::param<"wd", double, tg::shape<3, 1, 3, 3>>;
    auto xv = uniform(150, -1.0, 1.0, 24), wv3 = uniform(27, -1.0, 1.0, 25);
    require_close(values_of(tg::compile(tg::conv2d<1, 1, 1, 3>(xd, wd), tg::wrt(xd)), tg::bind(xd, xv), tg::bind(wd, wv3)),
                  ref_conv2d(xv, wv3, 2, 3, 5, 5, 3, 3, 3, 1, 1, 1, 1, {}, 1, 1, 3));
    check_gradient(tg::sum(tg::tanh(tg::conv2d<1, 1, 1, 3>(xd, wd))), at(xd, xv), at(wd, wv3));
    // second order through groups and dilation
    constexpr auto k = tg::param<"k", double, tg::shape<3, 1, 2, 2>>;
    auto kv = uniform(12, -1.0, 1.0, 26);
    auto inner = tg::sum(tg::square(tg::conv2d<1, 0, 2, 3>(xd, k)));
    check_gradient(tg::sum(tg::square(tg::grad(inner, k))), at(xd, xv), at(k, kv));
}

TEST_CASE("conv1d: dilation and groups", "[ops][conv][gradient]") {
    constexpr auto x = tg::param<"x", double, tg::shape<2, 6, tg::dyn>>;
    constexpr auto w = tg::param<"w", double, tg::shape<4, 3, 3>>;
    constexpr auto b = tg::param<"b", double, tg::shape<4>>;
    auto wv = uniform(36, -1.0, 1.0, 27), bv = uniform(4, -1.0, 1.0, 28);
    for (std::size_t len : {5u, 9u}) {
        auto xv = uniform(12 * len, -1.0, 1.0, 29);
        require_close(values_of(tg::compile(tg::conv1d<1, 2, 2, 2>(x, w, b), tg::wrt(x)), tg::bind(x, xv, {2, 6, len}),
                                tg::bind(w, wv), tg::bind(b, bv)),
                      ref_conv2d(xv, wv, 2, 6, 1, len, 4, 1, 3, 1, 1, 0, 2, bv, 1, 2, 2));
        check_gradient(tg::sum(tg::square(tg::conv1d<2, 1, 2, 2>(x, w, b))), at(x, xv, {2, 6, len}), at(w, wv), at(b, bv));
    }
}

TEST_CASE("conv: groups and dilation checked at run time", "[ops][conv]") {
    // dynamic channels: 5 is not a multiple of 2 groups; a dilated kernel (span 5) larger than the input
    constexpr auto x = tg::input<"x", float, tg::shape<1, tg::dyn, tg::dyn, tg::dyn>>;
    constexpr auto w = tg::param<"w", float, tg::shape<2, 2, 3, 3>>;
    auto step = tg::compile(tg::sum(tg::conv2d<1, 0, 2, 2>(x, w)), tg::wrt(w));
    std::vector<float> wv(36, 1.0f), g(36, 5.0f), xv(5 * 6 * 6, 1.0f);
    CHECK_THROWS_AS(step.value_and_grad(tg::bind(x, xv, {1, 5, 6, 6}), tg::bind(w, wv), tg::grad_into(w, g)),
                    tg::shape_error);
    CHECK_THROWS_AS(step.value_and_grad(tg::bind(x, xv, {1, 4, 4, 6}), tg::bind(w, wv), tg::grad_into(w, g)),
                    tg::shape_error);
    CHECK(g == std::vector<float>(36, 5.0f));
    // 4 channels, 5 x 6: output 1 x 2 per out channel (2 of them), each window 2 x 3 x 3 ones
    std::vector<float> x4(4 * 5 * 6, 1.0f);
    CHECK(step.value_and_grad(tg::bind(x, x4, {1, 4, 5, 6}), tg::bind(w, wv), tg::grad_into(w, g)) == 18.0f * 2 * 2);
}

TEST_CASE("conv2d shape errors at run time throw before anything is written", "[ops][conv]") {
    constexpr auto x = tg::input<"x", float, tg::shape<1, tg::dyn, tg::dyn, tg::dyn>>;
    constexpr auto w = tg::param<"w", float, tg::shape<1, 2, 3, 3>>;
    auto step = tg::compile(tg::sum(tg::conv2d(x, w)), tg::wrt(w));
    std::vector<float> wv(18, 1.0f), g(18, 5.0f), xv(3 * 4 * 4, 1.0f);
    CHECK_THROWS_AS(step.value_and_grad(tg::bind(x, xv, {1, 3, 4, 4}), tg::bind(w, wv), tg::grad_into(w, g)),
                    tg::shape_error);  // 3 channels, w expects 2
    CHECK_THROWS_AS(step.value_and_grad(tg::bind(x, xv, {1, 2, 2, 12}), tg::bind(w, wv), tg::grad_into(w, g)),
                    tg::shape_error);  // height 2 < kernel 3
    CHECK(g == std::vector<float>(18, 5.0f));
    const float v = step.value_and_grad(tg::bind(x, xv, {1, 2, 4, 6}), tg::bind(w, wv), tg::grad_into(w, g));
    CHECK(v == 18.0f * 2 * 4);  // 2 x 4 windows of 18 ones
}

TEST_CASE("conv2d under CPU bf16 autocast: lower precision, then pooling in bf16", "[ops][conv][autocast]") {
    constexpr auto x = tg::input<"x", float, tg::shape<2, 3, 6, 6>>;
    constexpr auto w = tg::param<"w", float, tg::shape<4, 3, 3, 3>>;
    auto xd = uniform(216, -1.0, 1.0, 14), wd = uniform(108, -0.5, 0.5, 15);
    std::vector<float> xs(xd.begin(), xd.end()), ws(wd.begin(), wd.end()), g32(108), g16(108);
    auto conv = tg::conv2d<1, 1>(x, w);
    STATIC_REQUIRE(std::is_same_v<decltype(tg::autocast<tg::cpu_bf16>(conv))::value_type, tg::bf16>);
    const float l32 = tg::compile(tg::sum(tg::max_pool2d<2>(conv)), tg::wrt(w))
                          .value_and_grad(tg::bind(x, xs), tg::bind(w, ws), tg::grad_into(w, g32));
    const float l16 = tg::compile(tg::autocast<tg::cpu_bf16>(tg::sum(tg::max_pool2d<2>(conv))), tg::wrt(w))
                          .value_and_grad(tg::bind(x, xs), tg::bind(w, ws), tg::grad_into(w, g16));
    CHECK(std::abs(l16 - l32) <= 0.02f * (1 + std::abs(l32)));
    double num = 0, den = 0;
    for (std::size_t e = 0; e < 108; ++e) {
        num += std::pow(double(g16[e]) - double(g32[e]), 2);
        den += std::pow(double(g32[e]), 2);
    }
    CHECK(std::sqrt(num / den) < 0.02);
}

TEST_CASE("conv2d over several chunks of images (the last one partial): values and both gradients",
          "[ops][conv][gradient]") {
    // 16 channels of 30 x 30 with a 3 x 3 kernel: 144 x 900 im2col elements per image, so a chunk
    // holds up to two images and three images make two chunks, of one and two (on two threads,
    // one wave of both); groups 2, padding 1
    constexpr std::size_t n = 3, c = 16, h = 30, o = 4;
    const tg::detail::conv_geometry geo{n, c, h, h, o, 3, 3, h, h, 1, 1, 1, 1, 1, 1, 2};
    REQUIRE(tg::detail::conv_chunk_images(geo) == 2);
    const tg::detail::conv_waves waves(geo);
    REQUIRE(waves.chunks == 2);
    REQUIRE(waves.first(1) == 1);
    constexpr auto x = tg::param<"x", double, tg::shape<tg::dyn, c, h, h>>;
    constexpr auto w = tg::param<"w", double, tg::shape<o, c / 2, 3, 3>>;
    constexpr auto q = tg::input<"q", double, tg::shape<tg::dyn, o, h, h>>;
    auto xv = uniform(n * c * h * h, -1.0, 1.0, 31), wv = uniform(o * c / 2 * 9, -1.0, 1.0, 32),
         qv = uniform(n * o * h * h, -1.0, 1.0, 33);
    const auto step = tg::compile(tg::sum(tg::conv2d<1, 1, 1, 2>(x, w) * q), tg::wrt(x, w));
    const auto run = [&](std::size_t threads, std::vector<double>& gx, std::vector<double>& gw) {
        tg::set_num_threads(threads);
        gx.assign(xv.size(), 0.0);
        gw.assign(wv.size(), 0.0);
        const double value = step.value_and_grad(tg::bind(x, xv, {n, c, h, h}), tg::bind(w, wv), tg::bind(q, qv, {n, o, h, h}),
                                                 tg::grad_into(x, gx), tg::grad_into(w, gw));
        tg::set_num_threads(0);
        return value;
    };
    std::vector<double> gx, gw;
    const double v = run(1, gx, gw);
    // two and three threads: the chunks in one wave, each on its thread; the same bits
    for (const std::size_t threads : {2, 3}) {
        std::vector<double> hx, hw;
        const double u = run(threads, hx, hw);
        INFO(threads << " threads");
        CHECK(std::memcmp(&u, &v, sizeof v) == 0);
        CHECK(std::memcmp(hx.data(), gx.data(), gx.size() * sizeof(double)) == 0);
        CHECK(std::memcmp(hw.data(), gw.data(), gw.size() * sizeof(double)) == 0);
    }
    // the loss from the direct convolution; the gradients by their definitions: every product
    // x[a, ic, ih, iw] w[oc, k, p, r] of y[a, oc, i, j] contributes q[a, oc, i, j] times the other factor
    const auto y = ref_conv2d(xv, wv, n, c, h, h, o, 3, 3, 1, 1, 1, 1, {}, 1, 1, 2);
    double ref = 0, mag = 0;
    for (std::size_t e = 0; e < y.size(); ++e) {
        ref += y[e] * qv[e];
        mag += std::abs(y[e] * qv[e]);
    }
    CHECK(std::abs(v - ref) <= 1e-13 * mag);
    std::vector<double> rx(xv.size(), 0.0), rw(wv.size(), 0.0);
    for (std::size_t a = 0; a < n; ++a)
        for (std::size_t oc = 0; oc < o; ++oc)
            for (std::size_t i = 0; i < h; ++i)
                for (std::size_t j = 0; j < h; ++j) {
                    const double g = qv[((a * o + oc) * h + i) * h + j];
                    for (std::size_t k = 0; k < c / 2; ++k)
                        for (std::size_t p = 0; p < 3; ++p)
                            for (std::size_t r = 0; r < 3; ++r) {
                                const long ih = long(i + p) - 1, iw = long(j + r) - 1;
                                if (ih < 0 || iw < 0 || ih >= long(h) || iw >= long(h)) continue;
                                const std::size_t xe = ((a * c + oc / 2 * (c / 2) + k) * h + std::size_t(ih)) * h + std::size_t(iw),
                                                  we = ((oc * (c / 2) + k) * 3 + p) * 3 + r;
                                rx[xe] += g * wv[we];
                                rw[we] += g * xv[xe];
                            }
                }
    require_close(gx, rx);
    require_close(gw, rw, 1e-10);  // sums of 14,700 products, in another order

    // an infinite gradient at the corner pixel of the last image (the second chunk: on two
    // threads, the wave's second slot) sends the whole weight gradient to the direct loops: its
    // padded taps take no product (no NaN from 0 * inf), its inside taps are infinite
    qv[((2 * o + 0) * h + 0) * h + 0] = std::numeric_limits<double>::infinity();
    std::vector<double> one_x, one_w;
    run(1, one_x, one_w);
    for (const std::size_t threads : {1, 2, 3}) {
        std::vector<double> hx, hw;
        run(threads, hx, hw);
        INFO(threads << " threads");
        for (std::size_t e = 0; e < hw.size(); ++e) CHECK_FALSE(std::isnan(hw[e]));
        for (const std::size_t tap : {4, 5, 7, 8}) CHECK(std::isinf(hw[tap]));  // o = 0, k = 0: taps (1..2, 1..2)
        CHECK(std::memcmp(hw.data(), one_w.data(), hw.size() * sizeof(double)) == 0);
    }
}

TEST_CASE("conv1d/conv2d: the padding takes part in no product, so an infinite weight or gradient stays +-inf",
          "[ops][conv][edge]") {
    // Finding 19 (graph 2003): the im2col GEMM multiplied the zeros standing for the padding by the
    // other operand, and 0 * inf is NaN; PyTorch's float CPU path (oneDNN) and cuDNN read no
    // padding. x = [1, 2, 3], w = [w0, w1, w2], padding 1: y_l = w0 x_{l-1} + w1 x_l + w2 x_{l+1}.
    constexpr auto x = tg::param<"x", float, tg::shape<1, 1, 3>>;
    constexpr auto w = tg::param<"w", float, tg::shape<1, 1, 3>>;
    constexpr auto q = tg::input<"q", float, tg::shape<1, 1, 3>>;
    std::vector<float> xd{1, 2, 3}, wd{inf, 1, 1}, qd{1, 1, 1}, gx(3), gw(3);
    auto y = tg::compile(tg::conv1d<1, 1>(x, w), tg::wrt(x));
    const auto yv = values_of<float>(y, tg::bind(x, xd), tg::bind(w, wd));
    CHECK(yv[0] == 3.f);  // w0 meets the padding only: 1 * 1 + 1 * 2 (was NaN)
    CHECK(yv[1] == inf);
    CHECK(yv[2] == inf);
    // dw_k = sum_l q_l x_{l+k-1} over the positions inside x; q_0 = inf meets the padding at k = 0
    wd = {1, 1, 1};
    qd = {inf, 1, 1};
    tg::compile(tg::sum(tg::conv1d<1, 1>(x, w) * q), tg::wrt(x, w))
        .value_and_grad(tg::bind(x, xd), tg::bind(w, wd), tg::bind(q, qd), tg::grad_into(x, gx), tg::grad_into(w, gw));
    CHECK(gw[0] == 3.f);  // 1 * x_0 + 1 * x_1 (was NaN)
    CHECK(gw[1] == inf);
    CHECK(gw[2] == inf);
    CHECK(gx[0] == inf);  // dx_j = sum_l q_l w_{j-l+1}
    CHECK(gx[1] == inf);
    CHECK(gx[2] == 2.f);
    // conv2d, stride 2: the same through the direct loops
    constexpr auto x2 = tg::param<"x2", double, tg::shape<1, 1, 3, 3>>;
    constexpr auto w2 = tg::param<"w2", double, tg::shape<1, 1, 2, 2>>;
    constexpr double dinf = std::numeric_limits<double>::infinity();
    std::vector<double> x2d{1, 2, 3, 4, 5, 6, 7, 8, 9}, w2d{dinf, 1, 1, 1}, g2(4);
    // outputs 2 x 2 of windows at rows/cols {-1, 1}: y_00 = w3 x_00, y_01 = w2 x_01 + w3 x_02, ...
    const auto y2 = tg::compile(tg::conv2d<2, 1>(x2, w2), tg::wrt(x2)).forward(tg::bind(x2, x2d), tg::bind(w2, w2d));
    const std::vector<double> v2(y2.values().begin(), y2.values().end());
    CHECK(v2[0] == 1);
    CHECK(v2[1] == 2 + 3);
    CHECK(v2[2] == 4 + 7);
    CHECK(v2[3] == dinf);
}

TEST_CASE("conv2d with groups and dilation: the direct loops for non-finite operands read each group's own channels",
          "[ops][conv][edge]") {
    // An infinite weight of output channel 2 (group 1) sends conv2d through the direct loops; every
    // other output channel must equal the GEMM path's result with that weight set to 0, and so must
    // channel 2 where that tap reads the padding.
    constexpr auto x = tg::param<"x", double, tg::shape<1, 4, 5, 5>>;
    constexpr auto w = tg::param<"w", double, tg::shape<4, 2, 2, 2>>;  // groups 2: 2 input channels each
    constexpr auto q = tg::input<"q", double, tg::shape<1, 4, 7, 7>>;
    constexpr double dinf = std::numeric_limits<double>::infinity();
    std::vector<double> xd(100), wd(32), qd(196, 1.0);
    for (std::size_t i = 0; i < xd.size(); ++i) xd[i] = std::sin(0.37 * double(i) + 0.1);
    for (std::size_t i = 0; i < wd.size(); ++i) wd[i] = std::cos(0.53 * double(i) + 0.2);
    // stride 1, padding 2, dilation 2 (a 3 x 3 span), groups 2: 7 x 7 outputs
    const auto conv = tg::conv2d<1, 2, 2, 2>(x, w);
    const auto step = tg::compile(conv, tg::wrt(x));
    std::vector<double> w_zero = wd, w_inf = wd;
    w_zero[2 * 8 + 3] = 0;  // channel 2, input channel 0 of its group, tap (1, 1): reads x[oh, ow]
    w_inf[2 * 8 + 3] = dinf;
    const auto ref = values_of<float>(step, tg::bind(x, xd), tg::bind(w, w_zero));
    const auto got = values_of<float>(step, tg::bind(x, xd), tg::bind(w, w_inf));
    REQUIRE(got.size() == 196);
    for (std::size_t o = 0; o < 4; ++o)
        for (std::size_t oh = 0; oh < 7; ++oh)
            for (std::size_t ow = 0; ow < 7; ++ow) {
                const std::size_t e = (o * 7 + oh) * 7 + ow;
                if (o == 2 && oh < 5 && ow < 5) CHECK(std::isinf(got[e]));
                else CHECK(got[e] == Approx(ref[e]).epsilon(1e-12));
            }
    // the weight gradient with an infinite incoming gradient at one pixel of channel 0 (group 0):
    // channels 1 to 3 get the GEMM path's gradient
    std::vector<double> q_inf = qd, gw_ref(32), gw_got(32), gx(100);
    q_inf[0] = dinf;
    const auto grad_step = tg::compile(tg::sum(conv * q), tg::wrt(x, w));
    grad_step.value_and_grad(tg::bind(x, xd), tg::bind(w, wd), tg::bind(q, qd), tg::grad_into(x, gx),
                             tg::grad_into(w, gw_ref));
    grad_step.value_and_grad(tg::bind(x, xd), tg::bind(w, wd), tg::bind(q, q_inf), tg::grad_into(x, gx),
                             tg::grad_into(w, gw_got));
    for (std::size_t i = 8; i < 32; ++i) CHECK(gw_got[i] == Approx(gw_ref[i]).epsilon(1e-12));
}

TEST_CASE("conv's finiteness scan finds one infinity or NaN anywhere, on one thread and on two",
          "[ops][conv][edge]") {
    // all_finite picks the direct loops (above); it scans in blocks of 4096 at SIMD width, with a
    // scalar tail per block, the blocks split over the pool.
    const auto scan = [](auto zero) {
        using C = decltype(zero);
        const C bad[] = {std::numeric_limits<C>::infinity(), -std::numeric_limits<C>::infinity(),
                         std::numeric_limits<C>::quiet_NaN()};
        for (const std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(13), std::size_t(4096),
                                    std::size_t(4099), std::size_t(70001)}) {
            std::vector<C> v(n);
            for (std::size_t i = 0; i < n; ++i) v[i] = C(std::sin(0.1 * double(i))) * C(1e30);  // large, finite
            CHECK(tg::detail::all_finite(v.data(), n));
            for (const std::size_t at_ : {std::size_t(0), std::size_t(7), std::size_t(4095), std::size_t(4096),
                                          std::size_t(4098), std::size_t(65537), n - 1})
                for (const C b : bad) {
                    if (at_ >= n) continue;
                    const C keep = v[at_];
                    v[at_] = b;
                    CHECK_FALSE(tg::detail::all_finite(v.data(), n));
                    v[at_] = keep;
                }
        }
        CHECK(tg::detail::all_finite(std::vector<C>(5000, std::numeric_limits<C>::max()).data(), 5000));
    };
    for (const std::size_t threads : {1, 2}) {
        tg::set_num_threads(threads);
        scan(0.f);
        scan(0.0);
    }
    tg::set_num_threads(0);
}

namespace {
// check(T{}, g, seed) for every geometry, float and double, each with its own seeds; the
// geometries' output extents checked first; the thread count reset after
template <std::size_t N, class Check>
void for_each_geometry(const tg::detail::conv_geometry (&cases)[N], unsigned seed, Check check) {
    for (const tg::detail::conv_geometry& g : cases) {
        INFO("c " << g.c << " h " << g.h << " w " << g.w << " o " << g.o << " k " << g.kh << "x" << g.kw << " stride " << g.sh
                  << "," << g.sw << " pad " << g.ph << "," << g.pw << " dilation " << g.dh << "," << g.dw << " groups " << g.groups);
        REQUIRE(g.ho == tg::detail::conv_out_extent(g.h, g.kh, g.sh, g.ph, g.dh));
        REQUIRE(g.wo == tg::detail::conv_out_extent(g.w, g.kw, g.sw, g.pw, g.dw));
        check(float{}, g, seed);
        check(double{}, g, seed + 2);
        seed += 4;
    }
    tg::set_num_threads(0);
}

// conv2d's forward product with B packed straight from x (conv_panels), and its weight gradient's
// with A so packed (conv_row_panels), against im2col's buffer and the same GEMMs: the same bits,
// on 1 and 3 threads
template <class T>
void check_panels(const tg::detail::conv_geometry& g, unsigned seed) {
    using namespace tg::detail;
    const std::size_t image = g.c * g.h * g.w, ld = g.n * g.pixels(), cg = g.c / g.groups;
    const auto xv = uniform(g.n * image, -1.0, 1.0, seed), wv = uniform(g.o * g.group_ckk(), -1.0, 1.0, seed + 1);
    const std::vector<T> x(xv.begin(), xv.end()), w(wv.begin(), wv.end());
    REQUIRE(conv_packs_directly<T>(g.group_o(), ld, g.group_ckk()));
    std::vector<T> col(g.ckk() * ld), want(g.o * ld), got(g.o * ld, T(7));
    im2col_chunk(g, x.data(), 0, g.n, col.data());
    for (std::size_t b = 0; b < g.groups; ++b)
        gemm(transpose::no, transpose::no, g.group_o(), ld, g.group_ckk(), w.data() + b * g.group_o() * g.group_ckk(),
             g.group_ckk(), col.data() + b * g.group_ckk() * ld, ld, want.data() + b * g.group_o() * ld, ld, false, 1);
    for (std::size_t threads : {1, 3}) {
        tg::set_num_threads(threads);
        std::fill(got.begin(), got.end(), T(7));
        for (std::size_t b = 0; b < g.groups; ++b)
            gemm_packed_b(transpose::no, g.group_o(), ld, g.group_ckk(), w.data() + b * g.group_o() * g.group_ckk(), g.group_ckk(),
                          conv_panels<T>{g, x.data() + b * cg * g.h * g.w, image, x.data(), x.data() + g.n * image},
                          got.data() + b * g.group_o() * ld, ld, false, threads);
        CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(T)) == 0);
    }
    // the weight gradient's product dW^T = im2col(x) g^T, its A packed straight from x (conv_row_panels)
    const auto gv = uniform(g.o * ld, -1.0, 1.0, seed + 2);
    const std::vector<T> gy(gv.begin(), gv.end());
    const std::size_t block = g.group_ckk() * g.group_o();
    REQUIRE(conv_packs_directly<T>(g.group_ckk(), g.group_o(), ld));
    std::vector<T> dwt_want(g.groups * block), dwt_got(g.groups * block);
    for (std::size_t b = 0; b < g.groups; ++b)
        gemm(transpose::no, transpose::yes, g.group_ckk(), g.group_o(), ld, col.data() + b * g.group_ckk() * ld, ld,
             gy.data() + b * g.group_o() * ld, ld, dwt_want.data() + b * block, g.group_o(), false, 1);
    for (std::size_t threads : {1, 3}) {
        tg::set_num_threads(threads);
        std::fill(dwt_got.begin(), dwt_got.end(), T(7));
        for (std::size_t b = 0; b < g.groups; ++b)
            gemm_packed_a(transpose::yes, g.group_ckk(), g.group_o(), ld,
                          conv_row_panels<T>{g, x.data() + b * cg * g.h * g.w, image, x.data(), x.data() + g.n * image},
                          gy.data() + b * g.group_o() * ld, ld, dwt_got.data() + b * block, g.group_o(), false, threads);
        CHECK(std::memcmp(dwt_got.data(), dwt_want.data(), dwt_got.size() * sizeof(T)) == 0);
    }
}
}  // namespace

TEST_CASE("conv2d's forward and weight gradient pack their panels straight from x: the bits of im2col's path",
          "[ops][conv]") {
    // {n, c, h, w, o, kh, kw, ho, wo, sh, sw, ph, pw, dh, dw, groups}: output rows wider and
    // narrower than a panel (runs across rows and images), padding 0 to 2, stride 2 (the strided
    // loop), dilation, groups, a 1 x 1 kernel, a kernel wider than the padding
    using tg::detail::conv_geometry;
    const conv_geometry cases[] = {
        {2, 8, 30, 30, 16, 3, 3, 30, 30, 1, 1, 1, 1, 1, 1, 1},   // "same", rows of 30 (runs of 30 and 2)
        {3, 5, 9, 7, 12, 3, 3, 9, 7, 1, 1, 1, 1, 1, 1, 1},       // rows of 7: several a panel, across images
        {2, 6, 40, 37, 10, 3, 3, 38, 35, 1, 1, 0, 0, 1, 1, 1},   // no padding, "valid" output
        {2, 4, 21, 19, 9, 5, 5, 21, 19, 1, 1, 2, 2, 1, 1, 1},    // padding 2
        {2, 8, 23, 23, 16, 3, 3, 12, 12, 2, 2, 1, 1, 1, 1, 1},   // stride 2
        {1, 8, 25, 26, 8, 3, 3, 25, 26, 1, 1, 2, 2, 2, 2, 1},    // dilation 2
        {2, 8, 20, 20, 16, 3, 3, 20, 20, 1, 1, 1, 1, 1, 1, 2},   // two groups
        {2, 16, 17, 17, 24, 1, 1, 17, 17, 1, 1, 0, 0, 1, 1, 1},  // 1 x 1
        {2, 6, 15, 40, 8, 2, 7, 16, 40, 1, 1, 1, 3, 1, 1, 1},    // a 2 x 7 kernel, uneven padding
        {2, 32, 40, 40, 32, 3, 3, 40, 40, 1, 1, 1, 1, 1, 1, 1},  // large enough for 3 threads
    };
    for_each_geometry(cases, 61, [](auto type, const conv_geometry& g, unsigned seed) { check_panels<decltype(type)>(g, seed); });
}

namespace {
// The input gradient, chunk by chunk as conv2d_input runs it (conv_waves): on one thread each
// channel's col2im follows the product's rows (gemm_rows, col2im_set gathering where the width's
// stride is 1), on three the threaded product then col2im; against the product into im2col's
// layout, then col2im_add's scatter into zeros: the same bits
template <class T>
void check_input_chunks(const tg::detail::conv_geometry& g, unsigned seed) {
    using namespace tg::detail;
    const std::size_t image = g.c * g.h * g.w;
    const auto gv = uniform(g.n * g.o * g.pixels(), -1.0, 1.0, seed), wv = uniform(g.o * g.group_ckk(), -1.0, 1.0, seed + 1);
    const std::vector<T> gy(gv.begin(), gv.end()), w(wv.begin(), wv.end());
    const conv_waves waves(g, 2);  // chunks of two images, the last one partial for odd n
    std::vector<T> col(waves.col_size(g)), rows(waves.rows_size(g)), want(g.n * image, T(0)), got(g.n * image);
    for (std::size_t k = 0; k < waves.chunks; ++k) {
        const std::size_t n0 = waves.first(k), cnt = waves.first(k + 1) - n0, ld = cnt * g.pixels();
        const T* src = chunk_rows(g, gy.data(), n0, cnt, rows.data());
        for (std::size_t b = 0; b < g.groups; ++b)
            gemm(transpose::yes, transpose::no, g.group_ckk(), ld, g.group_o(), w.data() + b * g.group_o() * g.group_ckk(),
                 g.group_ckk(), src + b * g.group_o() * ld, ld, col.data() + b * g.group_ckk() * ld, ld, false, 1);
        for (std::size_t i = 0; i < cnt; ++i)
            col2im_add(g, col.data() + i * g.pixels(), want.data() + (n0 + i) * image, ld, 0, g.c);
    }
    for (const std::size_t threads : {1, 3}) {
        tg::set_num_threads(threads);
        std::fill(got.begin(), got.end(), g.sw == 1 ? T(7) : T(0));  // every element written where the width's stride is 1
        for (std::size_t k = 0; k < waves.chunks; ++k) {
            const std::size_t n0 = waves.first(k), cnt = waves.first(k + 1) - n0;
            std::fill(col.begin(), col.end(), T(9));
            conv_input_chunk(g, w.data(), chunk_rows(g, gy.data(), n0, cnt, rows.data()), col.data(), n0, cnt, threads == 1 ? 1 : 0,
                             got.data());
        }
        CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(T)) == 0);
    }
}
}  // namespace

TEST_CASE("conv2d's input gradient: col2im gathered and run as the product's rows come, the bits of col2im's scatter",
          "[ops][conv]") {
    // {n, c, h, w, o, kh, kw, ho, wo, sh, sw, ph, pw, dh, dw, groups}: rows shorter, as long as
    // and longer than a vector, padding 0 to 3 (lanes reading padding at both ends), stride 2 down
    // the height only and both ways (the scatter), dilation, groups, 1 x 1, a kernel wider than the
    // input, more channels than one block of the product's rows (72)
    using tg::detail::conv_geometry;
    const conv_geometry cases[] = {
        {3, 8, 30, 30, 16, 3, 3, 30, 30, 1, 1, 1, 1, 1, 1, 1},   // "same", rows of 30
        {3, 5, 9, 7, 12, 3, 3, 9, 7, 1, 1, 1, 1, 1, 1, 1},       // rows of 7
        {2, 6, 21, 16, 10, 3, 3, 19, 14, 1, 1, 0, 0, 1, 1, 1},   // no padding, rows of 16
        {2, 4, 21, 17, 9, 5, 5, 21, 17, 1, 1, 2, 2, 1, 1, 1},    // padding 2, rows of 17
        {2, 8, 23, 33, 16, 3, 3, 12, 33, 2, 1, 1, 1, 1, 1, 1},   // stride 2 down the height
        {2, 8, 23, 23, 16, 3, 3, 12, 12, 2, 2, 1, 1, 1, 1, 1},   // stride 2 both ways
        {1, 8, 25, 26, 8, 3, 3, 25, 26, 1, 1, 2, 2, 2, 2, 1},    // dilation 2
        {2, 8, 20, 20, 16, 3, 3, 20, 20, 1, 1, 1, 1, 1, 1, 2},   // two groups
        {2, 16, 17, 17, 24, 1, 1, 17, 17, 1, 1, 0, 0, 1, 1, 1},  // 1 x 1
        {2, 3, 6, 3, 4, 2, 7, 7, 3, 1, 1, 1, 3, 1, 1, 1},        // a 2 x 7 kernel over rows of 3
        {2, 40, 12, 40, 32, 3, 3, 12, 40, 1, 1, 1, 1, 1, 1, 1},  // 360 rows of W^T g: five blocks
    };
    for_each_geometry(cases, 71, [](auto type, const conv_geometry& g, unsigned seed) { check_input_chunks<decltype(type)>(g, seed); });
}
