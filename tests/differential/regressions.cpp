// Hand-written graphs (ids from 1000) in the generated graphs' format: shapes of bugs found
// outside the random generator, kept so that the differential test watches them.
#include "graph_registry.hpp"

namespace tg = typegrad;

namespace typegrad_differential {
namespace {

// Finding 1 (docs/reliability.md), fixed: the gradient of max(exp(a)) was NaN/inf when exp(a) is
// also evaluated in a loop that broadcasts b along the rows, and the two loops split the maximum's
// element differently between SIMD body and scalar tail (xsimd::exp and std::exp differed by an
// ulp: no element equalled the saved maximum, the tie count was 0).
template <class T>
T graph_1000(const tensors<T>& in, const extents& ext, tensors<T>& grad, bool) {
    constexpr auto a = tg::param<"a", T, tg::shape<tg::dyn, tg::dyn>>;
    constexpr auto b = tg::input<"b", T, tg::shape<1, tg::dyn>>;
    constexpr auto e = tg::exp(a);
    constexpr auto step = tg::compile(tg::max(e) + tg::sum(e * b), tg::wrt(a));
    return step.value_and_grad(tg::bind(a, in[0], {ext[0][0], ext[0][1]}), tg::bind(b, in[1], {ext[1][0], ext[1][1]}),
                               tg::grad_into(a, grad[0]));
}

// softmax and log_softmax over the last axis (issue 17): the random generator does not draw them,
// and with special values a row holding +inf is NaN everywhere in PyTorch (x - max is NaN at the
// +inf and -inf elsewhere); typegrad gave NaN at the +inf and 0 (softmax) or -inf (log_softmax)
// elsewhere until its shift stopped mapping an infinite maximum to 0.
template <class T>
T graph_1001(const tensors<T>& in, const extents& ext, tensors<T>& grad, bool split) {
    constexpr auto x = tg::param<"x", T, tg::shape<tg::dyn, tg::dyn>>;
    constexpr auto q = tg::input<"q", T, tg::shape<tg::dyn, tg::dyn>>;
    constexpr auto step = tg::compile(tg::sum(tg::softmax(x) * q), tg::wrt(x));
    const auto bx = tg::bind(x, in[0], {ext[0][0], ext[0][1]});
    const auto bq = tg::bind(q, in[1], {ext[1][0], ext[1][1]});
    if (!split) return step.value_and_grad(bx, bq, tg::grad_into(x, grad[0]));
    auto fwd = step.forward(bx, bq);
    step.backward(fwd, tg::grad_into(x, grad[0]));
    return fwd.value();
}
template <class T>
T graph_1002(const tensors<T>& in, const extents& ext, tensors<T>& grad, bool) {
    constexpr auto x = tg::param<"x", T, tg::shape<tg::dyn, tg::dyn>>;
    constexpr auto q = tg::input<"q", T, tg::shape<tg::dyn, tg::dyn>>;
    constexpr auto step = tg::compile(tg::sum(tg::log_softmax(x) * q), tg::wrt(x));
    return step.value_and_grad(tg::bind(x, in[0], {ext[0][0], ext[0][1]}), tg::bind(q, in[1], {ext[1][0], ext[1][1]}),
                               tg::grad_into(x, grad[0]));
}

const bool registered = [] {
    registry().push_back({1000, 2, false,
                          "constexpr auto a = tg::param<\"a\", T, tg::shape<tg::dyn, tg::dyn>>;\n"
                          "constexpr auto b = tg::input<\"b\", T, tg::shape<1, tg::dyn>>;\n"
                          "constexpr auto e = tg::exp(a);\n"
                          "constexpr auto loss = tg::max(e) + tg::sum(e * b);",
                          "leaf 0\nleaf 1\nexp 0\nmax 2\nmul 2 1\nsum 4\nadd 3 5",
                          {{"a", true, 2, {-1, -2}, -2.0, 2.0}, {"b", false, 2, {1, -2}, -2.0, 2.0}},
                          &graph_1000<double>,
                          &graph_1000<float>});
    registry().push_back({1001, 2, true, "tg::sum(tg::softmax(x) * q)", "leaf 0\nleaf 1\nsoftmax 0\nmul 2 1\nsum 3",
                          {{"x", true, 2, {-1, -2}, -3.0, 3.0}, {"q", false, 2, {-1, -2}, -1.0, 1.0}},
                          &graph_1001<double>, &graph_1001<float>});
    registry().push_back({1002, 2, false, "tg::sum(tg::log_softmax(x) * q)", "leaf 0\nleaf 1\nlog_softmax 0\nmul 2 1\nsum 3",
                          {{"x", true, 2, {-1, -2}, -3.0, 3.0}, {"q", false, 2, {-1, -2}, -1.0, 1.0}},
                          &graph_1002<double>, &graph_1002<float>});
    return true;
}();

}  // namespace
}  // namespace typegrad_differential
