// Hand-written differential graphs (ids from 2100) over issue 15's ops that the line-program
// interpreters do not know; their LibTorch references are in model_ops_harness.cpp, by id, and
// each graph's `cpp` text says what they compute. Ids from 2150 run under
// tg::autocast<tg::cpu_bf16> against LibTorch's CPU autocast.
#include "model_ops_registry.hpp"

namespace tg = typegrad;

namespace typegrad_differential::model_ops {
namespace {

constexpr leaf_kind in_ = leaf_kind::input, par = leaf_kind::param, ids = leaf_kind::ids;

// conv2d: stride 2, padding 1, dilation 2, groups 2, bias
template <class T>
T graph_2100(const tensors<T>& in, const extents&, tensors<T>& grad) {
    constexpr auto x = tg::param<"x", T, tg::shape<2, 4, 7, 6>>;
    constexpr auto w = tg::param<"w", T, tg::shape<6, 2, 3, 2>>;
    constexpr auto b = tg::param<"b", T, tg::shape<6>>;
    constexpr auto q = tg::input<"q", T, tg::shape<2, 6, 3, 3>>;
    constexpr auto step = tg::compile(tg::sum(tg::tanh(tg::conv2d<2, 1, 2, 2>(x, w, b)) * q), tg::wrt(x, w, b));
    return step.value_and_grad(tg::bind(x, in[0]), tg::bind(w, in[1]), tg::bind(b, in[2]), tg::bind(q, in[3]),
                               tg::grad_into(x, grad[0]), tg::grad_into(w, grad[1]), tg::grad_into(b, grad[2]));
}
// conv1d: dilation 3 with groups 3 (two filters per channel), and depthwise with stride 2
template <class T>
T graph_2101(const tensors<T>& in, const extents& ext, tensors<T>& grad) {
    constexpr auto x = tg::param<"x", T, tg::shape<tg::dyn, 3, tg::dyn>>;
    constexpr auto w = tg::param<"w", T, tg::shape<6, 1, 3>>;
    constexpr auto v = tg::param<"v", T, tg::shape<3, 1, 2>>;
    constexpr auto step = tg::compile(
        tg::sum(tg::square(tg::conv1d<1, 2, 3, 3>(x, w))) + tg::sum(tg::exp(tg::conv1d<2, 0, 1, 3>(x, v))), tg::wrt(x, w, v));
    return step.value_and_grad(tg::bind(x, in[0], {ext[0][0], 3, ext[0][2]}), tg::bind(w, in[1]), tg::bind(v, in[2]),
                               tg::grad_into(x, grad[0]), tg::grad_into(w, grad[1]), tg::grad_into(v, grad[2]));
}
// depthwise conv2d (groups = channels), then adaptive_avg_pool2d to 3 x 2 and to 1 x 1
template <class T>
T graph_2102(const tensors<T>& in, const extents& ext, tensors<T>& grad) {
    constexpr auto x = tg::param<"x", T, tg::shape<tg::dyn, 4, 7, 5>>;
    constexpr auto w = tg::param<"w", T, tg::shape<4, 1, 3, 3>>;
    constexpr auto step = tg::compile(tg::sum(tg::square(tg::adaptive_avg_pool2d<3, 2>(tg::conv2d<1, 1, 1, 4>(x, w)))) +
                                          tg::sum(tg::sin(tg::adaptive_avg_pool2d<1>(x))),
                                      tg::wrt(x, w));
    return step.value_and_grad(tg::bind(x, in[0], {ext[0][0], 4, 7, 5}), tg::bind(w, in[1]), tg::grad_into(x, grad[0]),
                               tg::grad_into(w, grad[1]));
}
// adaptive_avg_pool2d over dynamic H, W (overlapping windows; repeated rows when H < 4)
template <class T>
T graph_2103(const tensors<T>& in, const extents& ext, tensors<T>& grad) {
    constexpr auto x = tg::param<"x", T, tg::shape<2, 3, tg::dyn, tg::dyn>>;
    constexpr auto q = tg::input<"q", T, tg::shape<2, 3, 4, 3>>;
    constexpr auto step = tg::compile(
        tg::sum(tg::adaptive_avg_pool2d<4, 3>(x) * q) + tg::sum(tg::square(tg::adaptive_avg_pool2d<2, 5>(x))), tg::wrt(x));
    return step.value_and_grad(tg::bind(x, in[0], {2, 3, ext[0][2], ext[0][3]}), tg::bind(q, in[1]), tg::grad_into(x, grad[0]));
}
// embedding with padding_idx 2 and without, ids of rank 2 (repeats: 7 rows, many ids)
template <class T>
T graph_2104(const tensors<T>& in, const extents& ext, tensors<T>& grad) {
    constexpr auto i = tg::input<"ids", std::int64_t, tg::shape<tg::dyn, 3>>;
    constexpr auto table = tg::param<"table", T, tg::shape<7, 5>>;
    constexpr auto q = tg::input<"q", T, tg::shape<tg::dyn, 3, 5>>;
    constexpr auto step = tg::compile(tg::sum(tg::tanh(tg::embedding<2>(i, table)) * q) +
                                          tg::sum(tg::square(tg::embedding(i, table))),
                                      tg::wrt(table));
    const auto iv = ids_of(in[0]);
    return step.value_and_grad(tg::bind(i, iv, {ext[0][0], 3}), tg::bind(table, in[1]), tg::bind(q, in[2], {ext[2][0], 3, 5}),
                               tg::grad_into(table, grad[0]));
}
// index_select along axis 0 (ids of any count, repeats) and -1, gather along axis 1
template <class T>
T graph_2105(const tensors<T>& in, const extents& ext, tensors<T>& grad) {
    constexpr auto x = tg::param<"x", T, tg::shape<tg::dyn, 6>>;
    constexpr auto rows = tg::input<"rows", std::int64_t, tg::shape<tg::dyn>>;
    constexpr auto cols = tg::input<"cols", std::int64_t, tg::shape<3>>;
    constexpr auto index = tg::input<"index", std::int64_t, tg::shape<tg::dyn, 4>>;
    constexpr auto step = tg::compile(tg::sum(tg::square(tg::index_select<0>(x, rows))) +
                                          tg::sum(tg::cos(tg::index_select<-1>(x, cols))) +
                                          tg::sum(tg::exp(tg::gather<1>(x, index))),
                                      tg::wrt(x));
    const auto rv = ids_of(in[1]), cv = ids_of(in[2]), iv = ids_of(in[3]);
    return step.value_and_grad(tg::bind(x, in[0], {ext[0][0], 6}), tg::bind(rows, rv, {ext[1][0]}), tg::bind(cols, cv),
                               tg::bind(index, iv, {ext[3][0], 4}), tg::grad_into(x, grad[0]));
}
// argmax/argmin (keepdim along an axis, and over everything) selecting what gets a gradient
template <class T>
T graph_2106(const tensors<T>& in, const extents& ext, tensors<T>& grad) {
    constexpr auto x = tg::param<"x", T, tg::shape<tg::dyn, 7>>;
    constexpr auto flat = tg::reshape<tg::shape<tg::dyn>>(x);
    constexpr auto step =
        tg::compile(tg::sum(tg::gather<1>(tg::square(x), tg::argmax(x, tg::axes<1>, tg::keepdim))) +
                        tg::sum(tg::gather<0>(tg::sin(x), tg::argmin(x, tg::axes<0>, tg::keepdim))) +
                        tg::sum(tg::exp(tg::dynamic_slice<0, 1>(flat, tg::argmax(x)))),
                    tg::wrt(x));
    return step.value_and_grad(tg::bind(x, in[0], {ext[0][0], 7}), tg::grad_into(x, grad[0]));
}
// dynamic_slice (run-time start, negative from the end), concat, stack
template <class T>
T graph_2107(const tensors<T>& in, const extents& ext, tensors<T>& grad) {
    constexpr auto a = tg::param<"a", T, tg::shape<tg::dyn, 6>>;
    constexpr auto b = tg::param<"b", T, tg::shape<tg::dyn, 6>>;
    constexpr auto c = tg::param<"c", T, tg::shape<2, 6>>;
    constexpr auto start = tg::input<"start", std::int64_t, tg::shape<1>>;
    constexpr auto step = tg::compile(tg::sum(tg::square(tg::concat<1>(a, tg::dynamic_slice<1, 4>(b, start)))) +
                                          tg::sum(tg::sin(tg::stack<2>(a, b))) + tg::sum(tg::exp(tg::concat<0>(c, a, c))),
                                      tg::wrt(a, b, c));
    const auto sv = ids_of(in[3]);
    return step.value_and_grad(tg::bind(a, in[0], {ext[0][0], 6}), tg::bind(b, in[1], {ext[1][0], 6}), tg::bind(c, in[2]),
                               tg::bind(start, sv), tg::grad_into(a, grad[0]), tg::grad_into(b, grad[1]),
                               tg::grad_into(c, grad[2]));
}
// dropout (p 0.3 and 0.5, the same {seed, offset}): the reference is x * m with typegrad's masks
template <class T>
T graph_2108(const tensors<T>& in, const extents& ext, tensors<T>& grad) {
    constexpr auto x = tg::param<"x", T, tg::shape<tg::dyn, 5>>;
    constexpr auto q = tg::input<"q", T, tg::shape<tg::dyn, 5>>;
    constexpr auto rng = tg::input<"rng", std::int64_t, tg::shape<2>>;
    constexpr auto step = tg::compile(
        tg::sum(tg::square(tg::dropout<0.3>(x, rng)) * q) + tg::sum(tg::dropout<0.5>(tg::sin(x), rng)), tg::wrt(x));
    const auto rv = ids_of(in[2]);
    return step.value_and_grad(tg::bind(x, in[0], {ext[0][0], 5}), tg::bind(q, in[1], {ext[1][0], 5}), tg::bind(rng, rv),
                               tg::grad_into(x, grad[0]));
}
void masks_2108(const tensors<double>& in, const extents& ext, tensors<double>& aux) {
    constexpr auto one = tg::param<"one", double, tg::shape<tg::dyn, 5>>;
    constexpr auto rng = tg::input<"rng", std::int64_t, tg::shape<2>>;
    const auto rv = ids_of(in[2]);
    const std::vector<double> ones(ext[0][0] * 5, 1.0);
    auto m3 = tg::compile(tg::dropout<0.3>(one, rng), tg::wrt(one)).forward(tg::bind(one, ones, {ext[0][0], 5}), tg::bind(rng, rv));
    auto m5 = tg::compile(tg::dropout<0.5>(one, rng), tg::wrt(one)).forward(tg::bind(one, ones, {ext[0][0], 5}), tg::bind(rng, rv));
    aux = {std::vector<double>(m3.values().begin(), m3.values().end()),
           std::vector<double>(m5.values().begin(), m5.values().end())};
}
// layer_norm and rms_norm over the last two axes without affine; batch_norm in evaluation mode
template <class T>
T graph_2109(const tensors<T>& in, const extents& ext, tensors<T>& grad) {
    constexpr auto x = tg::param<"x", T, tg::shape<tg::dyn, 3, 4>>;
    constexpr auto q = tg::input<"q", T, tg::shape<tg::dyn, 3, 4>>;
    constexpr auto rm = tg::input<"rm", T, tg::shape<3>>;
    constexpr auto rv = tg::input<"rv", T, tg::shape<3>>;
    constexpr auto w = tg::param<"w", T, tg::shape<3>>;
    constexpr auto b = tg::param<"b", T, tg::shape<3>>;
    constexpr auto step = tg::compile(tg::sum(tg::layer_norm<2>(x) * q) + tg::sum(tg::square(tg::rms_norm<2, 1e-6>(x))) +
                                          tg::sum(tg::tanh(tg::batch_norm<false>(x, rm, rv, w, b)) * q),
                                      tg::wrt(x, w, b));
    return step.value_and_grad(tg::bind(x, in[0], {ext[0][0], 3, 4}), tg::bind(q, in[1], {ext[1][0], 3, 4}),
                               tg::bind(rm, in[2]), tg::bind(rv, in[3]), tg::bind(w, in[4]), tg::bind(b, in[5]),
                               tg::grad_into(x, grad[0]), tg::grad_into(w, grad[1]), tg::grad_into(b, grad[2]));
}
// attention on [batch, heads, T, d] with a float mask [Tq, Tk] and scale 0.3
template <class T>
T graph_2110(const tensors<T>& in, const extents& ext, tensors<T>& grad) {
    constexpr auto q = tg::param<"q", T, tg::shape<2, 2, tg::dyn, 4>>;
    constexpr auto k = tg::param<"k", T, tg::shape<2, 2, tg::dyn, 4>>;
    constexpr auto v = tg::param<"v", T, tg::shape<2, 2, tg::dyn, 3>>;
    constexpr auto mask = tg::input<"mask", T, tg::shape<tg::dyn, tg::dyn>>;
    constexpr auto w = tg::input<"w", T, tg::shape<2, 2, tg::dyn, 3>>;
    constexpr auto step = tg::compile(tg::sum(tg::scaled_dot_product_attention<0.3>(q, k, v, mask) * w), tg::wrt(q, k, v));
    return step.value_and_grad(tg::bind(q, in[0], {2, 2, ext[0][2], 4}), tg::bind(k, in[1], {2, 2, ext[1][2], 4}),
                               tg::bind(v, in[2], {2, 2, ext[2][2], 3}), tg::bind(mask, in[3], {ext[3][0], ext[3][1]}),
                               tg::bind(w, in[4], {2, 2, ext[4][2], 3}), tg::grad_into(q, grad[0]),
                               tg::grad_into(k, grad[1]), tg::grad_into(v, grad[2]));
}
// prod along an axis with 0, 1 or more zeros per row (relu of x + 1), and along the rows, kept
template <class T>
T graph_2111(const tensors<T>& in, const extents& ext, tensors<T>& grad) {
    constexpr auto x = tg::param<"x", T, tg::shape<tg::dyn, 5>>;
    constexpr auto q = tg::input<"q", T, tg::shape<tg::dyn>>;
    constexpr auto step = tg::compile(tg::sum(tg::prod(tg::relu(x + tg::lit<1>), tg::axes<1>) * q) +
                                          tg::sum(tg::square(tg::prod(x, tg::axes<0>, tg::keepdim))),
                                      tg::wrt(x));
    return step.value_and_grad(tg::bind(x, in[0], {ext[0][0], 5}), tg::bind(q, in[1], {ext[0][0]}), tg::grad_into(x, grad[0]));
}
// linear_recurrence along the time axis with a decay per channel ([3] against [2, T, 3]), and
// cumsum along the first and the last axis
template <class T>
T graph_2112(const tensors<T>& in, const extents& ext, tensors<T>& grad) {
    constexpr auto a = tg::param<"a", T, tg::shape<3>>;
    constexpr auto b = tg::param<"b", T, tg::shape<2, tg::dyn, 3>>;
    constexpr auto step = tg::compile(tg::sum(tg::tanh(tg::linear_recurrence<1>(a, b))) +
                                          tg::sum(tg::square(tg::cumsum<0>(b))) + tg::sum(tg::sin(tg::cumsum<-1>(b))),
                                      tg::wrt(a, b));
    return step.value_and_grad(tg::bind(a, in[0]), tg::bind(b, in[1], {2, ext[1][1], 3}), tg::grad_into(a, grad[0]),
                               tg::grad_into(b, grad[1]));
}
// narrow: run-time start (negative from the end) and length along a static axis, and along the
// dynamic axis (lengths 0 .. rows - 1)
template <class T>
T graph_2113(const tensors<T>& in, const extents& ext, tensors<T>& grad) {
    constexpr auto x = tg::param<"x", T, tg::shape<tg::dyn, 7>>;
    constexpr auto s = tg::input<"s", std::int64_t, tg::shape<1>>;
    constexpr auto l = tg::input<"l", std::int64_t, tg::shape<1>>;
    constexpr auto one = tg::input<"one", std::int32_t, tg::shape<>>;
    constexpr auto m = tg::input<"m", std::int32_t, tg::shape<1>>;
    constexpr auto step = tg::compile(tg::sum(tg::square(tg::narrow<1>(x, s, l)) * tg::sin(tg::narrow<1>(x, s, l))) +
                                          tg::sum(tg::exp(tg::narrow<0>(x, one, m))),
                                      tg::wrt(x));
    const auto sv = ids_of(in[1]), lv = ids_of(in[2]);
    const auto ov = ids_of<std::int32_t>(in[3]), mv = ids_of<std::int32_t>(in[4]);
    return step.value_and_grad(tg::bind(x, in[0], {ext[0][0], 7}), tg::bind(s, sv), tg::bind(l, lv), tg::bind(one, ov),
                               tg::bind(m, mv), tg::grad_into(x, grad[0]));
}

// ---- under tg::autocast<tg::cpu_bf16> ---------------------------------------------------------

template <class E>
std::string_view dtype_in_region(E e) {
    if constexpr (typegrad::detail::topo_t<typename E::node_type>::size == 1) return tg::dtype_name<typename E::value_type>();
    else return tg::dtype_name<typename decltype(tg::autocast<tg::cpu_bf16>(e))::value_type>();
}
template <class T>
std::vector<double> widened(const std::vector<T>& v) {
    std::vector<double> r;
    for (const T& x : v) r.push_back(double(float(x)));
    return r;
}

// conv2d with dilation 2 and groups 2 (lower precision), then a bias and a square (promote)
double autocast_2150(const tensors<double>& in, const extents&, tensors<double>& grad, std::vector<std::string_view>* dtypes) {
    constexpr auto x = tg::input<"x", float, tg::shape<2, 4, 6, 5>>;
    constexpr auto w = tg::param<"w", float, tg::shape<6, 2, 3, 3>>;
    constexpr auto b = tg::param<"b", float, tg::shape<6>>;
    constexpr auto y = tg::conv2d<1, 2, 2, 2>(x, w, b);
    constexpr auto loss = tg::sum(tg::square(y));
    if (dtypes != nullptr) {
        *dtypes = {dtype_in_region(tg::conv2d<1, 2, 2, 2>(x, w)), dtype_in_region(y), dtype_in_region(loss)};
        return 0;
    }
    const std::vector<float> xv(in[0].begin(), in[0].end()), wv(in[1].begin(), in[1].end()), bv(in[2].begin(), in[2].end());
    std::vector<float> gw(wv.size()), gb(bv.size());
    constexpr auto step = tg::compile(tg::autocast<tg::cpu_bf16>(loss), tg::wrt(w, b));
    const double l = double(float(step.value_and_grad(tg::bind(x, xv), tg::bind(w, wv), tg::bind(b, bv), tg::grad_into(w, gw),
                                                      tg::grad_into(b, gb))));
    grad = {widened(gw), widened(gb)};
    return l;
}
// embedding keeps its dtype (f32 table), matmul lowers to bf16, concat promotes to f32,
// conv1d with groups lowers
double autocast_2151(const tensors<double>& in, const extents& ext, tensors<double>& grad,
                     std::vector<std::string_view>* dtypes) {
    constexpr auto i = tg::input<"ids", std::int64_t, tg::shape<tg::dyn>>;
    constexpr auto table = tg::param<"table", float, tg::shape<6, 4>>;
    constexpr auto m = tg::param<"m", float, tg::shape<4, 3>>;
    constexpr auto k = tg::param<"k", float, tg::shape<4, 2, 2>>;
    constexpr auto e = tg::embedding(i, table);
    constexpr auto h = tg::matmul(e, m);
    constexpr auto c = tg::concat<1>(h, e);
    constexpr auto s = tg::conv1d<1, 1, 2, 2>(tg::unsqueeze<0>(tg::transpose(e)), k);
    constexpr auto loss = tg::sum(tg::square(c)) + tg::mean(tg::tanh(s));
    if (dtypes != nullptr) {
        *dtypes = {dtype_in_region(e), dtype_in_region(h), dtype_in_region(c), dtype_in_region(s), dtype_in_region(loss)};
        return 0;
    }
    const auto iv = ids_of(in[0]);
    const std::vector<float> tv(in[1].begin(), in[1].end()), mv(in[2].begin(), in[2].end()), kv(in[3].begin(), in[3].end());
    std::vector<float> gt(tv.size()), gm(mv.size()), gk(kv.size());
    constexpr auto step = tg::compile(tg::autocast<tg::cpu_bf16>(loss), tg::wrt(table, m, k));
    const double l = double(float(step.value_and_grad(tg::bind(i, iv, {ext[0][0]}), tg::bind(table, tv), tg::bind(m, mv),
                                                      tg::bind(k, kv), tg::grad_into(table, gt), tg::grad_into(m, gm),
                                                      tg::grad_into(k, gk))));
    grad = {widened(gt), widened(gm), widened(gk)};
    return l;
}

// the fused attention (lower precision: bf16 output, computed in f32 and rounded once) over two
// blocks of queries; LibTorch 1.13 has no scaled_dot_product_attention: its reference is the
// composite under CPU autocast (bf16 matmuls, rounding the scores and the probabilities too), or
// the exact value
double autocast_2154(const tensors<double>& in, const extents&, tensors<double>& grad, std::vector<std::string_view>* dtypes) {
    constexpr auto q = tg::param<"q", float, tg::shape<2, 70, 8>>;
    constexpr auto k = tg::param<"k", float, tg::shape<2, 70, 8>>;
    constexpr auto v = tg::param<"v", float, tg::shape<2, 70, 4>>;
    constexpr auto o = tg::scaled_dot_product_attention(q, k, v, tg::causal);
    constexpr auto loss = tg::sum(tg::square(o));
    if (dtypes != nullptr) {
        *dtypes = {dtype_in_region(o), dtype_in_region(loss)};
        return 0;
    }
    const std::vector<float> qv(in[0].begin(), in[0].end()), kv(in[1].begin(), in[1].end()), vv(in[2].begin(), in[2].end());
    std::vector<float> gq(qv.size()), gk(kv.size()), gv(vv.size());
    constexpr auto step = tg::compile(tg::autocast<tg::cpu_bf16>(loss), tg::wrt(q, k, v));
    const double l = double(float(step.value_and_grad(tg::bind(q, qv), tg::bind(k, kv), tg::bind(v, vv), tg::grad_into(q, gq),
                                                      tg::grad_into(k, gk), tg::grad_into(v, gv))));
    grad = {widened(gq), widened(gk), widened(gv)};
    return l;
}

// after a bf16 matmul: gelu, layer_norm, softplus, erf (each op's CPU autocast class). The
// norm's affine is written out: LibTorch 1.13's CPU layer_norm and batch_norm reject a bf16
// input with f32 weights (on no CPU autocast list, nothing casts them), where typegrad promotes.
double autocast_2152(const tensors<double>& in, const extents& ext, tensors<double>& grad,
                     std::vector<std::string_view>* dtypes) {
    constexpr auto x = tg::input<"x", float, tg::shape<tg::dyn, 4>>;
    constexpr auto m = tg::param<"m", float, tg::shape<4, 6>>;
    constexpr auto w = tg::param<"w", float, tg::shape<6>>;
    constexpr auto b = tg::param<"b", float, tg::shape<6>>;
    constexpr auto h = tg::matmul(x, m);
    constexpr auto a = tg::gelu(h);
    constexpr auto l = tg::layer_norm(h) * w + b;
    constexpr auto s = tg::softplus<1.0>(h);
    constexpr auto e = tg::erf(h);
    constexpr auto loss = tg::sum(a) + tg::sum(tg::square(l)) + tg::mean(s) + tg::sum(e * l);
    if (dtypes != nullptr) {
        *dtypes = {dtype_in_region(h), dtype_in_region(a), dtype_in_region(tg::layer_norm(h)), dtype_in_region(l), dtype_in_region(s),
                   dtype_in_region(e), dtype_in_region(loss)};
        return 0;
    }
    const std::vector<float> xv(in[0].begin(), in[0].end()), mv(in[1].begin(), in[1].end()), wv(in[2].begin(), in[2].end()),
        bv(in[3].begin(), in[3].end());
    std::vector<float> gm(mv.size()), gw(wv.size()), gb(bv.size());
    constexpr auto step = tg::compile(tg::autocast<tg::cpu_bf16>(loss), tg::wrt(m, w, b));
    const double r = double(float(step.value_and_grad(tg::bind(x, xv, {ext[0][0], 4}), tg::bind(m, mv), tg::bind(w, wv),
                                                      tg::bind(b, bv), tg::grad_into(m, gm), tg::grad_into(w, gw),
                                                      tg::grad_into(b, gb))));
    grad = {widened(gm), widened(gw), widened(gb)};
    return r;
}
// cumsum of a bf16 matmul (stays bf16, f32 accumulation) and a linear recurrence with a float
// decay over it (promoted to f32, as LibTorch's mul and add)
double autocast_2153(const tensors<double>& in, const extents& ext, tensors<double>& grad,
                     std::vector<std::string_view>* dtypes) {
    constexpr auto x = tg::input<"x", float, tg::shape<tg::dyn, 4>>;
    constexpr auto m = tg::param<"m", float, tg::shape<4, 6>>;
    constexpr auto a = tg::param<"a", float, tg::shape<6>>;
    constexpr auto h = tg::matmul(x, m);
    constexpr auto c = tg::cumsum<0>(h);
    constexpr auto r = tg::linear_recurrence<0>(a, h);
    constexpr auto loss = tg::sum(tg::square(c)) + tg::sum(tg::tanh(r));
    if (dtypes != nullptr) {
        *dtypes = {dtype_in_region(h), dtype_in_region(c), dtype_in_region(r), dtype_in_region(loss)};
        return 0;
    }
    const std::vector<float> xv(in[0].begin(), in[0].end()), mv(in[1].begin(), in[1].end()), av(in[2].begin(), in[2].end());
    std::vector<float> gm(mv.size()), ga(av.size());
    constexpr auto step = tg::compile(tg::autocast<tg::cpu_bf16>(loss), tg::wrt(m, a));
    const double v = double(float(step.value_and_grad(tg::bind(x, xv, {ext[0][0], 4}), tg::bind(m, mv), tg::bind(a, av),
                                                      tg::grad_into(m, gm), tg::grad_into(a, ga))));
    grad = {widened(gm), widened(ga)};
    return v;
}
// narrow of a bf16 matmul along the dynamic axis (a run-time length, empty included) and along
// the static one: narrow keeps the dtype (PyTorch's autocast lists neither narrow nor slicing)
double autocast_2155(const tensors<double>& in, const extents& ext, tensors<double>& grad,
                     std::vector<std::string_view>* dtypes) {
    constexpr auto x = tg::input<"x", float, tg::shape<tg::dyn, 4>>;
    constexpr auto m = tg::param<"m", float, tg::shape<4, 6>>;
    constexpr auto s = tg::input<"s", std::int64_t, tg::shape<1>>;
    constexpr auto l = tg::input<"l", std::int64_t, tg::shape<1>>;
    constexpr auto l2 = tg::input<"l2", std::int32_t, tg::shape<>>;
    constexpr auto h = tg::matmul(x, m);
    constexpr auto rows = tg::narrow<0>(h, s, l);
    constexpr auto cols = tg::narrow<1>(h, s, l2);
    constexpr auto loss = tg::sum(tg::square(rows)) + tg::sum(tg::tanh(cols));
    if (dtypes != nullptr) {
        *dtypes = {dtype_in_region(h), dtype_in_region(rows), dtype_in_region(cols), dtype_in_region(loss)};
        return 0;
    }
    const std::vector<float> xv(in[0].begin(), in[0].end()), mv(in[1].begin(), in[1].end());
    const auto sv = ids_of(in[2]), lv = ids_of(in[3]);
    const auto l2v = ids_of<std::int32_t>(in[4]);
    std::vector<float> gm(mv.size());
    constexpr auto step = tg::compile(tg::autocast<tg::cpu_bf16>(loss), tg::wrt(m));
    const double v = double(float(step.value_and_grad(tg::bind(x, xv, {ext[0][0], 4}), tg::bind(m, mv), tg::bind(s, sv),
                                                      tg::bind(l, lv), tg::bind(l2, l2v), tg::grad_into(m, gm))));
    grad = {widened(gm)};
    return v;
}

const bool registered = [] {
    auto& r = registry();
    r.push_back({2100, 0, 1, "tg::sum(tg::tanh(tg::conv2d<2, 1, 2, 2>(x, w, b)) * q)  // stride 2, padding 1, dilation 2, groups 2",
                 {{"x", par, 4, {2, 4, 7, 6}, -1, 1}, {"w", par, 4, {6, 2, 3, 2}, -1, 1}, {"b", par, 1, {6}, -1, 1},
                  {"q", in_, 4, {2, 6, 3, 3}, -1, 1}},
                 &graph_2100<double>, &graph_2100<float>});
    r.push_back({2101, 2, 3,
                 "tg::sum(tg::square(tg::conv1d<1, 2, 3, 3>(x, w))) + tg::sum(tg::exp(tg::conv1d<2, 0, 1, 3>(x, v)))",
                 {{"x", par, 3, {-1, 3, -2}, -1, 1}, {"w", par, 3, {6, 1, 3}, -1, 1}, {"v", par, 3, {3, 1, 2}, -0.5, 0.5}},
                 &graph_2101<double>, &graph_2101<float>});
    r.push_back({2102, 1, 1,
                 "tg::sum(tg::square(tg::adaptive_avg_pool2d<3, 2>(tg::conv2d<1, 1, 1, 4>(x, w)))) + "
                 "tg::sum(tg::sin(tg::adaptive_avg_pool2d<1>(x)))",
                 {{"x", par, 4, {-1, 4, 7, 5}, -1, 1}, {"w", par, 4, {4, 1, 3, 3}, -1, 1}}, &graph_2102<double>,
                 &graph_2102<float>});
    r.push_back({2103, 2, 1,
                 "tg::sum(tg::adaptive_avg_pool2d<4, 3>(x) * q) + tg::sum(tg::square(tg::adaptive_avg_pool2d<2, 5>(x)))",
                 {{"x", par, 4, {2, 3, -1, -2}, -1, 1}, {"q", in_, 4, {2, 3, 4, 3}, -1, 1}}, &graph_2103<double>,
                 &graph_2103<float>});
    r.push_back({2104, 1, 1,
                 "tg::sum(tg::tanh(tg::embedding<2>(ids, table)) * q) + tg::sum(tg::square(tg::embedding(ids, table)))",
                 {{"ids", ids, 2, {-1, 3}, 0, 6}, {"table", par, 2, {7, 5}, -1, 1}, {"q", in_, 3, {-1, 3, 5}, -1, 1}},
                 &graph_2104<double>, &graph_2104<float>});
    r.push_back({2105, 2, 1,
                 "tg::sum(tg::square(tg::index_select<0>(x, rows))) + tg::sum(tg::cos(tg::index_select<-1>(x, cols))) + "
                 "tg::sum(tg::exp(tg::gather<1>(x, index)))",
                 {{"x", par, 2, {-1, 6}, -1, 1}, {"rows", ids, 1, {-2}, 0, -1, 0}, {"cols", ids, 1, {3}, 0, 5},
                  {"index", ids, 2, {-1, 4}, 0, 5}},
                 &graph_2105<double>, &graph_2105<float>});
    r.push_back({2106, 1, 1,
                 "flat = tg::reshape<tg::shape<tg::dyn>>(x): tg::sum(tg::gather<1>(tg::square(x), tg::argmax(x, tg::axes<1>, "
                 "tg::keepdim))) + tg::sum(tg::gather<0>(tg::sin(x), tg::argmin(x, tg::axes<0>, tg::keepdim))) + "
                 "tg::sum(tg::exp(tg::dynamic_slice<0, 1>(flat, tg::argmax(x))))",
                 {{"x", par, 2, {-1, 7}, -2, 2}}, &graph_2106<double>, &graph_2106<float>});
    r.push_back({2107, 1, 1,
                 "tg::sum(tg::square(tg::concat<1>(a, tg::dynamic_slice<1, 4>(b, start)))) + tg::sum(tg::sin(tg::stack<2>(a, "
                 "b))) + tg::sum(tg::exp(tg::concat<0>(c, a, c)))",
                 {{"a", par, 2, {-1, 6}, -1, 1}, {"b", par, 2, {-1, 6}, -1, 1}, {"c", par, 2, {2, 6}, -1, 1},
                  {"start", ids, 1, {1}, -6, 2, -1, -3, -1}},  // -6..-4 (from the end) and 0..2
                 &graph_2107<double>, &graph_2107<float>});
    r.push_back({2108, 1, 1,
                 "tg::sum(tg::square(tg::dropout<0.3>(x, rng)) * q) + tg::sum(tg::dropout<0.5>(tg::sin(x), rng))  // "
                 "reference: (x m3)^2 q + sin(x) m5, m_p = typegrad's dropout<p>(ones, rng)",
                 {{"x", par, 2, {-1, 5}, -2, 2}, {"q", in_, 2, {-1, 5}, -1, 1}, {"rng", ids, 1, {2}, 0, 1000000}},
                 &graph_2108<double>, &graph_2108<float>, &masks_2108});
    r.push_back({2109, 1, 1,
                 "tg::sum(tg::layer_norm<2>(x) * q) + tg::sum(tg::square(tg::rms_norm<2, 1e-6>(x))) + "
                 "tg::sum(tg::tanh(tg::batch_norm<false>(x, rm, rv, w, b)) * q)",
                 {{"x", par, 3, {-1, 3, 4}, -2, 2}, {"q", in_, 3, {-1, 3, 4}, -1, 1}, {"rm", in_, 1, {3}, -1, 1},
                  {"rv", in_, 1, {3}, 0.5, 2}, {"w", par, 1, {3}, 0.5, 1.5}, {"b", par, 1, {3}, -1, 1}},
                 &graph_2109<double>, &graph_2109<float>});
    r.push_back({2110, 2, 1, "tg::sum(tg::scaled_dot_product_attention<0.3>(q, k, v, mask) * w)  // q, k, v [2, 2, T, d]",
                 {{"q", par, 4, {2, 2, -1, 4}, -2, 2}, {"k", par, 4, {2, 2, -2, 4}, -2, 2}, {"v", par, 4, {2, 2, -2, 3}, -1, 1},
                  {"mask", in_, 2, {-1, -2}, -1, 1}, {"w", in_, 4, {2, 2, -1, 3}, -1, 1}},
                 &graph_2110<double>, &graph_2110<float>});
    r.push_back({2111, 1, 1,
                 "tg::sum(tg::prod(tg::relu(x + tg::lit<1>), tg::axes<1>) * q) + "
                 "tg::sum(tg::square(tg::prod(x, tg::axes<0>, tg::keepdim)))",
                 {{"x", par, 2, {-1, 5}, -1.5, 1.5}, {"q", in_, 1, {-1}, -1, 1}}, &graph_2111<double>, &graph_2111<float>});
    r.push_back({2112, 1, 1,
                 "tg::sum(tg::tanh(tg::linear_recurrence<1>(a, b))) + tg::sum(tg::square(tg::cumsum<0>(b))) + "
                 "tg::sum(tg::sin(tg::cumsum<-1>(b)))",
                 {{"a", par, 1, {3}, -1.2, 1.2}, {"b", par, 3, {2, -1, 3}, -1, 1}}, &graph_2112<double>, &graph_2112<float>});
    r.push_back({2113, 1, 2,
                 "tg::sum(tg::square(tg::narrow<1>(x, s, l)) * tg::sin(tg::narrow<1>(x, s, l))) + "
                 "tg::sum(tg::exp(tg::narrow<0>(x, one, m)))",
                 {{"x", par, 2, {-1, 7}, -1, 1},
                  {"s", ids, 1, {1}, -7, 3, -1, -3, -1},  // -7..-4 (from the end) and 0..3
                  {"l", ids, 1, {1}, 0, 4},
                  {"one", ids, 0, {}, 1, 1},
                  {"m", ids, 1, {1}, 0, -1, 0}},  // 0 .. rows - 1
                 &graph_2113<double>, &graph_2113<float>});
    r.push_back({2150, 0, 1, "tg::autocast<tg::cpu_bf16>(tg::sum(tg::square(tg::conv2d<1, 2, 2, 2>(x, w, b))))",
                 {{"x", in_, 4, {2, 4, 6, 5}, -1, 1}, {"w", par, 4, {6, 2, 3, 3}, -0.5, 0.5}, {"b", par, 1, {6}, -1, 1}},
                 nullptr, nullptr, nullptr, &autocast_2150});
    r.push_back({2151, 1, 2,
                 "e = tg::embedding(ids, table), h = tg::matmul(e, m), c = tg::concat<1>(h, e), s = tg::conv1d<1, 1, 2, "
                 "2>(tg::unsqueeze<0>(tg::transpose(e)), k): tg::autocast<tg::cpu_bf16>(tg::sum(tg::square(c)) + "
                 "tg::mean(tg::tanh(s)))",
                 {{"ids", ids, 1, {-1}, 0, 5}, {"table", par, 2, {6, 4}, -1, 1}, {"m", par, 2, {4, 3}, -1, 1},
                  {"k", par, 3, {4, 2, 2}, -1, 1}},
                 nullptr, nullptr, nullptr, &autocast_2151});
    r.push_back({2152, 1, 2,
                 "h = tg::matmul(x, m): tg::autocast<tg::cpu_bf16>(tg::sum(tg::gelu(h)) + tg::sum(tg::square(l)) + "
                 "tg::mean(tg::softplus<1.0>(h)) + tg::sum(tg::erf(h) * l)), l = tg::layer_norm(h) * w + b",
                 {{"x", in_, 2, {-1, 4}, -1, 1}, {"m", par, 2, {4, 6}, -1, 1}, {"w", par, 1, {6}, 0.5, 1.5},
                  {"b", par, 1, {6}, -1, 1}},
                 nullptr, nullptr, nullptr, &autocast_2152});
    r.push_back({2154, 0, 2, "o = tg::scaled_dot_product_attention(q, k, v, tg::causal): tg::autocast<tg::cpu_bf16>(tg::sum(tg::square(o)))  // q, k, v [2, 70, d], the fused op",
                 {{"q", par, 3, {2, 70, 8}, -1, 1}, {"k", par, 3, {2, 70, 8}, -1, 1}, {"v", par, 3, {2, 70, 4}, -1, 1}},
                 nullptr, nullptr, nullptr, &autocast_2154});
    r.push_back({2153, 1, 2,  // at least two rows: with one, a is not read (LibTorch: no gradient)
                 "h = tg::matmul(x, m): tg::autocast<tg::cpu_bf16>(tg::sum(tg::square(tg::cumsum<0>(h))) + "
                 "tg::sum(tg::tanh(tg::linear_recurrence<0>(a, h))))",
                 {{"x", in_, 2, {-1, 4}, -1, 1}, {"m", par, 2, {4, 6}, -1, 1}, {"a", par, 1, {6}, -0.9, 0.9}},
                 nullptr, nullptr, nullptr, &autocast_2153});
    r.push_back({2155, 1, 2,
                 "h = tg::matmul(x, m): tg::autocast<tg::cpu_bf16>(tg::sum(tg::square(tg::narrow<0>(h, s, l))) + "
                 "tg::sum(tg::tanh(tg::narrow<1>(h, s, l2))))",
                 {{"x", in_, 2, {-1, 4}, -1, 1}, {"m", par, 2, {4, 6}, -1, 1}, {"s", ids, 1, {1}, 0, 1},
                  {"l", ids, 1, {1}, 0, -2, 0},  // 0 .. rows - 2
                  {"l2", ids, 0, {}, 1, 4}},
                 nullptr, nullptr, nullptr, &autocast_2155});
    return true;
}();

}  // namespace
}  // namespace typegrad_differential::model_ops
