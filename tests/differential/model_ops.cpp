// Hand-written graphs (ids from 2000) over the model ops of issue 15 that the random generator
// does not draw (its leaves have rank <= 3 and it builds elementwise/reduction graphs): attention,
// layer_norm, conv1d/conv2d, max/avg pooling and batch_norm, in the generated graphs' format; and
// concat, stack and rms_norm from the first half of the issue.
// Rank-4 operands are rank-3 leaves reshaped in the graph (and in the line program). The LibTorch
// side evaluates F.layer_norm, F.conv1d, F.conv2d, F.max_pool2d, F.avg_pool2d, F.batch_norm, and
// attention written out as softmax(q k^T / sqrt(d) masked with -inf) v (LibTorch 1.13 has no
// scaled_dot_product_attention).
#include "graph_registry.hpp"

namespace tg = typegrad;

namespace typegrad_differential {
namespace {

template <class T>
T graph_2000(const tensors<T>& in, const extents&, tensors<T>& grad, bool) {
    constexpr auto q = tg::param<"q", T, tg::shape<2, 5, 4>>;
    constexpr auto k = tg::param<"k", T, tg::shape<2, 6, 4>>;
    constexpr auto v = tg::param<"v", T, tg::shape<2, 6, 3>>;
    constexpr auto w = tg::input<"w", T, tg::shape<2, 5, 3>>;
    constexpr auto step = tg::compile(tg::sum(tg::scaled_dot_product_attention(q, k, v, tg::causal) * w), tg::wrt(q, k, v));
    return step.value_and_grad(tg::bind(q, in[0]), tg::bind(k, in[1]), tg::bind(v, in[2]), tg::bind(w, in[3]),
                               tg::grad_into(q, grad[0]), tg::grad_into(k, grad[1]), tg::grad_into(v, grad[2]));
}
template <class T>
T graph_2001(const tensors<T>& in, const extents& ext, tensors<T>& grad, bool) {
    constexpr auto q = tg::param<"q", T, tg::shape<tg::dyn, 8>>;
    constexpr auto k = tg::param<"k", T, tg::shape<tg::dyn, 8>>;
    constexpr auto v = tg::param<"v", T, tg::shape<tg::dyn, 4>>;
    constexpr auto w = tg::input<"w", T, tg::shape<tg::dyn, 4>>;
    constexpr auto step = tg::compile(tg::sum(tg::scaled_dot_product_attention(q, k, v) * w), tg::wrt(q, k, v));
    return step.value_and_grad(tg::bind(q, in[0], {ext[0][0], 8}), tg::bind(k, in[1], {ext[1][0], 8}),
                               tg::bind(v, in[2], {ext[2][0], 4}), tg::bind(w, in[3], {ext[3][0], 4}),
                               tg::grad_into(q, grad[0]), tg::grad_into(k, grad[1]), tg::grad_into(v, grad[2]));
}
template <class T>
T graph_2002(const tensors<T>& in, const extents& ext, tensors<T>& grad, bool) {
    constexpr auto x = tg::param<"x", T, tg::shape<tg::dyn, 6>>;
    constexpr auto w = tg::param<"w", T, tg::shape<6>>;
    constexpr auto b = tg::param<"b", T, tg::shape<6>>;
    constexpr auto q = tg::input<"q", T, tg::shape<tg::dyn, 6>>;
    constexpr auto step = tg::compile(tg::sum(tg::layer_norm(x, w, b) * q), tg::wrt(x, w, b));
    return step.value_and_grad(tg::bind(x, in[0], {ext[0][0], 6}), tg::bind(w, in[1]), tg::bind(b, in[2]),
                               tg::bind(q, in[3], {ext[3][0], 6}), tg::grad_into(x, grad[0]), tg::grad_into(w, grad[1]),
                               tg::grad_into(b, grad[2]));
}
template <class T>
T graph_2003(const tensors<T>& in, const extents&, tensors<T>& grad, bool) {
    constexpr auto x = tg::param<"x", T, tg::shape<2, 3, 9>>;
    constexpr auto w = tg::param<"w", T, tg::shape<4, 3, 3>>;
    constexpr auto b = tg::param<"b", T, tg::shape<4>>;
    constexpr auto step = tg::compile(tg::sum(tg::square(tg::conv1d<2, 1>(x, w, b))), tg::wrt(x, w, b));
    return step.value_and_grad(tg::bind(x, in[0]), tg::bind(w, in[1]), tg::bind(b, in[2]), tg::grad_into(x, grad[0]),
                               tg::grad_into(w, grad[1]), tg::grad_into(b, grad[2]));
}
template <class T>
T graph_2004(const tensors<T>& in, const extents&, tensors<T>& grad, bool) {
    constexpr auto x = tg::param<"x", T, tg::shape<2, 3, 20>>;
    constexpr auto w = tg::param<"w", T, tg::shape<4, 3, 9>>;
    constexpr auto x4 = tg::reshape<tg::shape<2, 3, 4, 5>>(x);
    constexpr auto w4 = tg::reshape<tg::shape<4, 3, 3, 3>>(w);
    constexpr auto step =
        tg::compile(tg::sum(tg::tanh(tg::conv2d<1, 1>(x4, w4))) + tg::sum(tg::square(tg::conv2d<2>(x4, w4))), tg::wrt(x, w));
    return step.value_and_grad(tg::bind(x, in[0]), tg::bind(w, in[1]), tg::grad_into(x, grad[0]), tg::grad_into(w, grad[1]));
}
template <class T>
T graph_2005(const tensors<T>& in, const extents&, tensors<T>& grad, bool) {
    constexpr auto x = tg::param<"x", T, tg::shape<2, 3, 30>>;
    constexpr auto x4 = tg::reshape<tg::shape<2, 3, 5, 6>>(x);
    constexpr auto step =
        tg::compile(tg::sum(tg::square(tg::max_pool2d<3, 2, 1>(x4))) + tg::sum(tg::exp(tg::avg_pool2d<2>(x4))), tg::wrt(x));
    return step.value_and_grad(tg::bind(x, in[0]), tg::grad_into(x, grad[0]));
}
template <class T>
T graph_2006(const tensors<T>& in, const extents&, tensors<T>& grad, bool) {
    constexpr auto x = tg::param<"x", T, tg::shape<4, 3, 5>>;
    constexpr auto w = tg::param<"w", T, tg::shape<3>>;
    constexpr auto b = tg::param<"b", T, tg::shape<3>>;
    constexpr auto q = tg::input<"q", T, tg::shape<4, 3, 5>>;
    constexpr auto step = tg::compile(tg::sum(tg::batch_norm(x, w, b) * q), tg::wrt(x, w, b));
    return step.value_and_grad(tg::bind(x, in[0]), tg::bind(w, in[1]), tg::bind(b, in[2]), tg::bind(q, in[3]),
                               tg::grad_into(x, grad[0]), tg::grad_into(w, grad[1]), tg::grad_into(b, grad[2]));
}

// issue 15's first half: concat and stack (dynamic extents along and across the axis), rms_norm
template <class T>
T graph_2007(const tensors<T>& in, const extents& ext, tensors<T>& grad, bool) {
    constexpr auto a = tg::param<"a", T, tg::shape<tg::dyn, 3>>;
    constexpr auto b = tg::param<"b", T, tg::shape<tg::dyn, 3>>;
    constexpr auto c = tg::param<"c", T, tg::shape<2, 3>>;
    constexpr auto step = tg::compile(tg::sum(tg::square(tg::concat<0>(a, tg::exp(b), c))) +
                                          tg::sum(tg::sin(tg::stack<1>(a, b))),
                                      tg::wrt(a, b, c));
    return step.value_and_grad(tg::bind(a, in[0], {ext[0][0], 3}), tg::bind(b, in[1], {ext[1][0], 3}),
                               tg::bind(c, in[2]), tg::grad_into(a, grad[0]), tg::grad_into(b, grad[1]),
                               tg::grad_into(c, grad[2]));
}
template <class T>
T graph_2008(const tensors<T>& in, const extents& ext, tensors<T>& grad, bool) {
    constexpr auto x = tg::param<"x", T, tg::shape<tg::dyn, 5>>;
    constexpr auto w = tg::param<"w", T, tg::shape<5>>;
    constexpr auto q = tg::input<"q", T, tg::shape<tg::dyn, 5>>;
    constexpr auto step = tg::compile(tg::sum(tg::rms_norm<1, 1e-6>(x, w) * q), tg::wrt(x, w));
    return step.value_and_grad(tg::bind(x, in[0], {ext[0][0], 5}), tg::bind(w, in[1]), tg::bind(q, in[2], {ext[2][0], 5}),
                               tg::grad_into(x, grad[0]), tg::grad_into(w, grad[1]));
}

// The fused op across blocks of 64 queries: 100 queries (a partial second block) over 130 keys,
// causal (top-left aligned), two batches.
template <class T>
T graph_2009(const tensors<T>& in, const extents&, tensors<T>& grad, bool) {
    constexpr auto q = tg::param<"q", T, tg::shape<2, 100, 8>>;
    constexpr auto k = tg::param<"k", T, tg::shape<2, 130, 8>>;
    constexpr auto v = tg::param<"v", T, tg::shape<2, 130, 5>>;
    constexpr auto w = tg::input<"w", T, tg::shape<2, 100, 5>>;
    constexpr auto step = tg::compile(tg::sum(tg::scaled_dot_product_attention(q, k, v, tg::causal) * w), tg::wrt(q, k, v));
    return step.value_and_grad(tg::bind(q, in[0]), tg::bind(k, in[1]), tg::bind(v, in[2]), tg::bind(w, in[3]),
                               tg::grad_into(q, grad[0]), tg::grad_into(k, grad[1]), tg::grad_into(v, grad[2]));
}

const bool registered = [] {
    auto& r = registry();
    r.push_back({2000, 0, false, "tg::sum(tg::scaled_dot_product_attention(q, k, v, tg::causal) * w)",
                 "leaf 0\nleaf 1\nleaf 2\nleaf 3\nsdpa 0 1 2 1\nmul 4 3\nsum 5",
                 {{"q", true, 3, {2, 5, 4}, -2.0, 2.0}, {"k", true, 3, {2, 6, 4}, -2.0, 2.0},
                  {"v", true, 3, {2, 6, 3}, -1.0, 1.0}, {"w", false, 3, {2, 5, 3}, -1.0, 1.0}},
                 &graph_2000<double>, &graph_2000<float>});
    r.push_back({2001, 2, false, "tg::sum(tg::scaled_dot_product_attention(q, k, v) * w)",
                 "leaf 0\nleaf 1\nleaf 2\nleaf 3\nsdpa 0 1 2 0\nmul 4 3\nsum 5",
                 {{"q", true, 2, {-1, 8, 0}, -2.0, 2.0}, {"k", true, 2, {-2, 8, 0}, -2.0, 2.0},
                  {"v", true, 2, {-2, 4, 0}, -1.0, 1.0}, {"w", false, 2, {-1, 4, 0}, -1.0, 1.0}},
                 &graph_2001<double>, &graph_2001<float>});
    r.push_back({2009, 0, false, "tg::sum(tg::scaled_dot_product_attention(q, k, v, tg::causal) * w)  // 100 x 130",
                 "leaf 0\nleaf 1\nleaf 2\nleaf 3\nsdpa 0 1 2 1\nmul 4 3\nsum 5",
                 {{"q", true, 3, {2, 100, 8}, -2.0, 2.0}, {"k", true, 3, {2, 130, 8}, -2.0, 2.0},
                  {"v", true, 3, {2, 130, 5}, -1.0, 1.0}, {"w", false, 3, {2, 100, 5}, -1.0, 1.0}},
                 &graph_2009<double>, &graph_2009<float>});
    r.push_back({2002, 1, false, "tg::sum(tg::layer_norm(x, w, b) * q)",
                 "leaf 0\nleaf 1\nleaf 2\nleaf 3\nlayer_norm 0 1 2\nmul 4 3\nsum 5",
                 {{"x", true, 2, {-1, 6, 0}, -3.0, 3.0}, {"w", true, 1, {6, 0, 0}, 0.5, 1.5},
                  {"b", true, 1, {6, 0, 0}, -1.0, 1.0}, {"q", false, 2, {-1, 6, 0}, -1.0, 1.0}},
                 &graph_2002<double>, &graph_2002<float>});
    r.push_back({2003, 0, false, "tg::sum(tg::square(tg::conv1d<2, 1>(x, w, b)))",
                 "leaf 0\nleaf 1\nleaf 2\nconv1d 0 1 2 2 1\nsquare 3\nsum 4",
                 {{"x", true, 3, {2, 3, 9}, -1.0, 1.0}, {"w", true, 3, {4, 3, 3}, -1.0, 1.0},
                  {"b", true, 1, {4, 0, 0}, -1.0, 1.0}},
                 &graph_2003<double>, &graph_2003<float>});
    r.push_back({2004, 0, false,
                 "x4 = reshape<2, 3, 4, 5>(x), w4 = reshape<4, 3, 3, 3>(w): "
                 "tg::sum(tg::tanh(tg::conv2d<1, 1>(x4, w4))) + tg::sum(tg::square(tg::conv2d<2>(x4, w4)))",
                 "leaf 0\nleaf 1\nreshape4 0 2 3 4 5\nreshape4 1 4 3 3 3\nconv2d 2 3 1 1\ntanh 4\nsum 5\n"
                 "conv2d 2 3 2 0\nsquare 7\nsum 8\nadd 6 9",
                 {{"x", true, 3, {2, 3, 20}, -1.0, 1.0}, {"w", true, 3, {4, 3, 9}, -0.5, 0.5}},
                 &graph_2004<double>, &graph_2004<float>});
    r.push_back({2005, 0, false,
                 "x4 = reshape<2, 3, 5, 6>(x): "
                 "tg::sum(tg::square(tg::max_pool2d<3, 2, 1>(x4))) + tg::sum(tg::exp(tg::avg_pool2d<2>(x4)))",
                 "leaf 0\nreshape4 0 2 3 5 6\nmax_pool2d 1 3 2 1\nsquare 2\nsum 3\navg_pool2d 1 2 2 0\nexp 5\nsum 6\n"
                 "add 4 7",
                 {{"x", true, 3, {2, 3, 30}, -2.0, 2.0}}, &graph_2005<double>, &graph_2005<float>});
    r.push_back({2006, 0, false, "tg::sum(tg::batch_norm(x, w, b) * q)",
                 "leaf 0\nleaf 1\nleaf 2\nleaf 3\nbatch_norm 0 1 2\nmul 4 3\nsum 5",
                 {{"x", true, 3, {4, 3, 5}, -3.0, 3.0}, {"w", true, 1, {3, 0, 0}, 0.5, 1.5},
                  {"b", true, 1, {3, 0, 0}, -1.0, 1.0}, {"q", false, 3, {4, 3, 5}, -1.0, 1.0}},
                 &graph_2006<double>, &graph_2006<float>});
    r.push_back({2007, 1, false,
                 "tg::sum(tg::square(tg::concat<0>(a, tg::exp(b), c))) + tg::sum(tg::sin(tg::stack<1>(a, b)))",
                 "leaf 0\nleaf 1\nleaf 2\nexp 1\ncat0 0 3 2\nsquare 4\nsum 5\nstack1 0 1\nsin 7\nsum 8\nadd 6 9",
                 {{"a", true, 2, {-1, 3, 0}, -1.0, 1.0}, {"b", true, 2, {-1, 3, 0}, -1.0, 1.0},
                  {"c", true, 2, {2, 3, 0}, -1.0, 1.0}},
                 &graph_2007<double>, &graph_2007<float>});
    r.push_back({2008, 1, false, "tg::sum(tg::rms_norm<1, 1e-6>(x, w) * q)",
                 "leaf 0\nleaf 1\nleaf 2\nrms_norm 0 1\nmul 3 2\nsum 4",
                 {{"x", true, 2, {-1, 5, 0}, -3.0, 3.0}, {"w", true, 1, {5, 0, 0}, 0.5, 1.5},
                  {"q", false, 2, {-1, 5, 0}, -1.0, 1.0}},
                 &graph_2008<double>, &graph_2008<float>});
    return true;
}();

}  // namespace
}  // namespace typegrad_differential
