// tg::scan: one layer compiled once, applied over stacked params, against the same model
// unrolled with L distinct param leaves (values and every gradient, double, to rounding).
#include <check_gradient.hpp>

#include <cmath>
#include <thread>
#include <vector>

namespace tg = typegrad;
using tg::testing::uniform;

namespace {

constexpr std::size_t D = 4;
constexpr auto h = tg::param<"h", double, tg::shape<tg::dyn, D>>;
constexpr auto W = tg::param<"W", double, tg::shape<D, D>>;
constexpr auto b = tg::param<"b", double, tg::shape<D>>;
constexpr auto x = tg::param<"x", double, tg::shape<tg::dyn, D>>;

template <class H, class Wl, class Bl>
constexpr auto layer_of(H hh, Wl w, Bl bb) {
    return tg::tanh(tg::matmul(hh, w) + bb) * tg::lit<0.75> + hh;
}
constexpr auto layer = layer_of(h, W, b);

template <std::size_t L>
constexpr auto Ws = tg::param<"Ws", double, tg::shape<L, D, D>>;
template <std::size_t L>
constexpr auto bs = tg::param<"bs", double, tg::shape<L, D>>;

template <class Out>
constexpr auto loss_of(Out out) {
    return tg::mean(tg::square(out));
}
// The initial carry is an expression of x, so its gradient goes through the scan's carry.
constexpr auto init = tg::sin(x) * tg::lit<1.5>;

template <std::size_t L, class Policy = tg::scan_memory::carries>
constexpr auto scanned_loss() {
    return loss_of(tg::scan<Policy>(layer, tg::carry(h, init), tg::stacked(W, Ws<L>), tg::stacked(b, bs<L>)));
}

// Distinct leaves per layer for the unrolled reference: names "W00", "b00", ...
template <char C, std::size_t I>
constexpr tg::fixed_string<4> indexed_name() {
    const char s[4] = {C, char('0' + I / 10), char('0' + I % 10), 0};
    return tg::fixed_string<4>(s);
}
template <std::size_t I>
constexpr auto Wu = tg::param<indexed_name<'W', I>(), double, tg::shape<D, D>>;
template <std::size_t I>
constexpr auto bu = tg::param<indexed_name<'b', I>(), double, tg::shape<D>>;

template <std::size_t I, std::size_t L, class H>
constexpr auto unroll(H hh) {
    if constexpr (I == L) return hh;
    else return unroll<I + 1, L>(layer_of(hh, Wu<I>, bu<I>));
}

struct data {
    std::size_t rows;
    std::vector<double> xv, wv, bv;
};
data make_data(std::size_t L, std::size_t rows) {
    return {rows, uniform(rows * D, -1.0, 1.0, 11), uniform(L * D * D, -0.6, 0.6, 12), uniform(L * D, -0.3, 0.3, 13)};
}

bool close(double a, double r) { return std::abs(a - r) <= 1e-13 * std::max(1.0, std::abs(r)); }

template <std::size_t L, class Policy = tg::scan_memory::carries>
void check_against_unrolled(std::size_t rows) {
    const data d = make_data(L, rows);
    // scan
    const auto scan_step = tg::compile(scanned_loss<L, Policy>(), tg::wrt(x, Ws<L>, bs<L>));
    std::vector<double> gx(d.xv.size()), gw(d.wv.size()), gb(d.bv.size());
    const double v = scan_step.value_and_grad(tg::bind(x, d.xv), tg::bind(Ws<L>, d.wv), tg::bind(bs<L>, d.bv),
                                              tg::grad_into(x, gx), tg::grad_into(Ws<L>, gw), tg::grad_into(bs<L>, gb));
    // unrolled, same data (slice l of the stacks)
    const auto loss_u = loss_of(unroll<0, L>(init));
    std::vector<double> gxu(d.xv.size()), gwu(d.wv.size()), gbu(d.bv.size());
    const double vu = [&]<std::size_t... Is>(std::index_sequence<Is...>) {
        const auto step = tg::compile(loss_u, tg::wrt(x, Wu<Is>..., bu<Is>...));
        return step.value_and_grad(
            tg::bind(x, d.xv), tg::bind(Wu<Is>, d.wv.data() + Is * D * D, {D, D})...,
            tg::bind(bu<Is>, d.bv.data() + Is * D, {D})..., tg::grad_into(x, gxu),
            tg::grad_into(Wu<Is>, std::span<double>(gwu.data() + Is * D * D, D * D))...,
            tg::grad_into(bu<Is>, std::span<double>(gbu.data() + Is * D, D))...);
    }(std::make_index_sequence<L>{});
    INFO("L = " << L << ", rows = " << rows);
    REQUIRE(std::isfinite(v));
    REQUIRE(close(v, vu));
    for (std::size_t i = 0; i < gx.size(); ++i) REQUIRE(close(gx[i], gxu[i]));
    for (std::size_t i = 0; i < gw.size(); ++i) REQUIRE(close(gw[i], gwu[i]));
    for (std::size_t i = 0; i < gb.size(); ++i) REQUIRE(close(gb[i], gbu[i]));
    // the gradients are not trivially zero (so the comparison means something)
    double norm = 0;
    for (double g : gw) norm += g * g;
    REQUIRE(norm > 1e-8);
}

}  // namespace

TEST_CASE("scan equals the unrolled graph: value and every gradient", "[scan]") {
    check_against_unrolled<1>(3);
    check_against_unrolled<3>(5);
#if !defined(__clang__)  // clang 14 needs over 10 minutes for the 12-layer unrolled reference
                         // graph (benchmarks/README.md, "Compile time"); g++ checks it, and clang
                         // still runs the 48-layer scan below
    check_against_unrolled<12>(2);
#endif
    check_against_unrolled<3>(1);  // the dynamic extent at another size, same plans
}

TEST_CASE("scan_memory::layers (each layer's context kept) equals the unrolled graph too", "[scan]") {
    check_against_unrolled<1, tg::scan_memory::layers>(2);
    check_against_unrolled<3, tg::scan_memory::layers>(4);
#if !defined(__clang__)  // clang 14 needs over 10 minutes for the 12-layer unrolled reference
                         // graph (benchmarks/README.md, "Compile time"); g++ checks it, and clang
                         // still runs the 48-layer scan below
    check_against_unrolled<12, tg::scan_memory::layers>(3);
#endif
}

TEST_CASE("scan against finite differences", "[scan]") {
    constexpr std::size_t L = 3;
    const data d = make_data(L, 2);
    tg::testing::check_gradient(scanned_loss<L>(), tg::testing::tolerance{1e-7, 1e-6}, tg::testing::at(x, d.xv, {2, D}),
                                tg::testing::at(Ws<L>, d.wv), tg::testing::at(bs<L>, d.bv));
}

TEST_CASE("scan accumulates into the stacked gradient buffer on request", "[scan]") {
    constexpr std::size_t L = 3;
    const data d = make_data(L, 2);
    const auto step = tg::compile(scanned_loss<L>(), tg::wrt(Ws<L>));
    std::vector<double> g1(d.wv.size()), g2(d.wv.size(), 1.0);
    step.value_and_grad(tg::bind(x, d.xv), tg::bind(Ws<L>, d.wv), tg::bind(bs<L>, d.bv), tg::grad_into(Ws<L>, g1));
    step.value_and_grad(tg::bind(x, d.xv), tg::bind(Ws<L>, d.wv), tg::bind(bs<L>, d.bv),
                        tg::grad_into(Ws<L>, g2, tg::accumulate));
    for (std::size_t i = 0; i < g1.size(); ++i) REQUIRE(close(g2[i], g1[i] + 1.0));
}

TEST_CASE("scan's result is an ordinary expression: forward values and split forward/backward", "[scan]") {
    constexpr std::size_t L = 3;
    const data d = make_data(L, 2);
    const auto out = tg::scan(layer, tg::carry(h, init), tg::stacked(W, Ws<L>), tg::stacked(b, bs<L>));
    const auto step = tg::compile(out, tg::wrt(x, Ws<L>, bs<L>));
    auto ctx = step.forward(tg::bind(x, d.xv), tg::bind(Ws<L>, d.wv), tg::bind(bs<L>, d.bv));
    // reference carry by hand: h <- tanh(h W_l + b_l) * 0.75 + h
    std::vector<double> hv(2 * D);
    for (std::size_t i = 0; i < hv.size(); ++i) hv[i] = std::sin(d.xv[i]) * 1.5;
    for (std::size_t l = 0; l < L; ++l) {
        std::vector<double> next(hv.size());
        for (std::size_t r = 0; r < 2; ++r)
            for (std::size_t j = 0; j < D; ++j) {
                double s = d.bv[l * D + j];
                for (std::size_t k = 0; k < D; ++k) s += hv[r * D + k] * d.wv[l * D * D + k * D + j];
                next[r * D + j] = std::tanh(s) * 0.75 + hv[r * D + j];
            }
        hv = next;
    }
    REQUIRE(ctx.values().size() == hv.size());
    for (std::size_t i = 0; i < hv.size(); ++i) REQUIRE(std::abs(ctx.values()[i] - hv[i]) <= 1e-14);
    // seeded backward of the non-scalar output equals the scalar loss sum(out * seed)
    std::vector<double> seed = uniform(hv.size(), -1, 1, 5), gw(d.wv.size()), gw_ref(d.wv.size());
    step.backward(ctx, tg::seed(seed), tg::grad_into(Ws<L>, gw));
    constexpr auto s = tg::input<"s", double, tg::shape<tg::dyn, D>>;
    const auto ref = tg::compile(tg::sum(out * s), tg::wrt(Ws<L>));
    ref.value_and_grad(tg::bind(x, d.xv), tg::bind(Ws<L>, d.wv), tg::bind(bs<L>, d.bv), tg::bind(s, seed),
                       tg::grad_into(Ws<L>, gw_ref));
    for (std::size_t i = 0; i < gw.size(); ++i) REQUIRE(close(gw[i], gw_ref[i]));
}

TEST_CASE("scan with a run-time layer count", "[scan]") {
    constexpr auto Wd = tg::param<"Wd", double, tg::shape<tg::dyn, D, D>>;
    constexpr auto bd = tg::param<"bd", double, tg::shape<tg::dyn, D>>;
    const auto step = tg::compile(loss_of(tg::scan(layer, tg::carry(h, init), tg::stacked(W, Wd), tg::stacked(b, bd))),
                                  tg::wrt(Wd, bd));
    const data d = make_data(3, 2);
    const auto ref = tg::compile(scanned_loss<3>(), tg::wrt(Ws<3>, bs<3>));
    std::vector<double> gw(d.wv.size()), gb(d.bv.size()), gw_ref(d.wv.size()), gb_ref(d.bv.size());
    const double v = step.value_and_grad(tg::bind(x, d.xv), tg::bind(Wd, d.wv, {3, D, D}), tg::bind(bd, d.bv, {3, D}),
                                         tg::grad_into(Wd, gw), tg::grad_into(bd, gb));
    const double v_ref = ref.value_and_grad(tg::bind(x, d.xv), tg::bind(Ws<3>, d.wv), tg::bind(bs<3>, d.bv),
                                            tg::grad_into(Ws<3>, gw_ref), tg::grad_into(bs<3>, gb_ref));
    REQUIRE(v == v_ref);
    REQUIRE(gw == gw_ref);
    REQUIRE(gb == gb_ref);
    // zero layers: the scan is the identity on the carry
    std::vector<double> none;
    const double v0 = step.value_and_grad(tg::bind(x, d.xv), tg::bind(Wd, none, {0, D, D}), tg::bind(bd, none, {0, D}),
                                          tg::grad_into(Wd, none), tg::grad_into(bd, none));
    double m = 0;
    for (double xi : d.xv) m += std::pow(std::sin(xi) * 1.5, 2);
    REQUIRE(std::abs(v0 - m / double(d.xv.size())) <= 1e-15);
    // stacks of different lengths are rejected before anything is written
    std::vector<double> short_b(2 * D), g_guard(d.wv.size(), 7.0);
    REQUIRE_THROWS_AS(step.value_and_grad(tg::bind(x, d.xv), tg::bind(Wd, d.wv, {3, D, D}),
                                          tg::bind(bd, short_b, {2, D}), tg::grad_into(Wd, g_guard)),
                      tg::shape_error);
    for (double gi : g_guard) REQUIRE(gi == 7.0);
}

TEST_CASE("a 48-layer scan compiles and runs", "[scan]") {
    constexpr std::size_t L = 48;
    const data d = make_data(L, 4);
    const auto step = tg::compile(scanned_loss<L>(), tg::wrt(x, Ws<L>, bs<L>));
    std::vector<double> gx(d.xv.size()), gw(d.wv.size()), gb(d.bv.size());
    const double v = step.value_and_grad(tg::bind(x, d.xv), tg::bind(Ws<L>, d.wv), tg::bind(bs<L>, d.bv),
                                         tg::grad_into(x, gx), tg::grad_into(Ws<L>, gw), tg::grad_into(bs<L>, gb));
    REQUIRE(std::isfinite(v));
    // the last layer's weight gradient is a rank-one-ish product of finite values, nonzero
    double last = 0;
    for (std::size_t i = (L - 1) * D * D; i < L * D * D; ++i) last += std::abs(gw[i]);
    REQUIRE(last > 0);
    REQUIRE(std::isfinite(last));
    // the same keeping each layer's context (the other policy): bitwise equal
    const auto step_c = tg::compile(scanned_loss<L, tg::scan_memory::layers>(), tg::wrt(x, Ws<L>, bs<L>));
    std::vector<double> gx_c(d.xv.size()), gw_c(d.wv.size()), gb_c(d.bv.size());
    const double v_c = step_c.value_and_grad(tg::bind(x, d.xv), tg::bind(Ws<L>, d.wv), tg::bind(bs<L>, d.bv),
                                             tg::grad_into(x, gx_c), tg::grad_into(Ws<L>, gw_c), tg::grad_into(bs<L>, gb_c));
    REQUIRE(v_c == v);
    REQUIRE(gx_c == gx);
    REQUIRE(gw_c == gw);
    REQUIRE(gb_c == gb);
}

TEST_CASE("scan steps are reentrant across threads", "[scan]") {
    constexpr std::size_t L = 12;
    const data d = make_data(L, 3);
    const auto step = tg::compile(scanned_loss<L>(), tg::wrt(Ws<L>));
    std::vector<double> g_ref(d.wv.size());
    const double v_ref = step.value_and_grad(tg::bind(x, d.xv), tg::bind(Ws<L>, d.wv), tg::bind(bs<L>, d.bv),
                                             tg::grad_into(Ws<L>, g_ref));
    std::vector<std::vector<double>> g(4, std::vector<double>(d.wv.size()));
    std::vector<double> v(4);
    {
        std::vector<std::jthread> ts;
        for (std::size_t t = 0; t < 4; ++t)
            ts.emplace_back([&, t] {
                for (int k = 0; k < 20; ++k)
                    v[t] = step.value_and_grad(tg::bind(x, d.xv), tg::bind(Ws<L>, d.wv), tg::bind(bs<L>, d.bv),
                                               tg::grad_into(Ws<L>, g[t]));
            });
    }
    for (std::size_t t = 0; t < 4; ++t) {
        REQUIRE(v[t] == v_ref);
        REQUIRE(g[t] == g_ref);
    }
}

namespace {
// Five per-layer params: more than a custom op's four inputs, so the stacks are packed.
constexpr std::size_t F = 6;
constexpr auto W1 = tg::param<"W1", double, tg::shape<D, F>>;
constexpr auto b1 = tg::param<"b1", double, tg::shape<F>>;
constexpr auto W2 = tg::param<"W2", double, tg::shape<F, D>>;
constexpr auto b2 = tg::param<"b2", double, tg::shape<D>>;
constexpr auto gain = tg::param<"g", double, tg::shape<D>>;
template <class H, class A, class B, class C, class E, class G>
constexpr auto mlp_of(H hh, A w1, B bb1, C w2, E bb2, G g) {
    return hh + (tg::matmul(tg::tanh(tg::matmul(hh, w1) + bb1), w2) + bb2) * g;
}
template <std::size_t L> constexpr auto W1s = tg::param<"W1s", double, tg::shape<L, D, F>>;
template <std::size_t L> constexpr auto b1s = tg::param<"b1s", double, tg::shape<L, F>>;
template <std::size_t L> constexpr auto W2s = tg::param<"W2s", double, tg::shape<L, F, D>>;
template <std::size_t L> constexpr auto b2s = tg::param<"b2s", double, tg::shape<L, D>>;
template <std::size_t L> constexpr auto gs = tg::param<"gs", double, tg::shape<L, D>>;
template <std::size_t I> constexpr auto W1u = tg::param<indexed_name<'A', I>(), double, tg::shape<D, F>>;
template <std::size_t I> constexpr auto b1u = tg::param<indexed_name<'B', I>(), double, tg::shape<F>>;
template <std::size_t I> constexpr auto W2u = tg::param<indexed_name<'C', I>(), double, tg::shape<F, D>>;
template <std::size_t I> constexpr auto b2u = tg::param<indexed_name<'E', I>(), double, tg::shape<D>>;
template <std::size_t I> constexpr auto gu = tg::param<indexed_name<'G', I>(), double, tg::shape<D>>;
template <std::size_t I, std::size_t L, class H>
constexpr auto unroll_mlp(H hh) {
    if constexpr (I == L) return hh;
    else return unroll_mlp<I + 1, L>(mlp_of(hh, W1u<I>, b1u<I>, W2u<I>, b2u<I>, gu<I>));
}

template <std::size_t L, class Policy>
void check_packed_against_unrolled(std::size_t rows) {
    const auto xv = uniform(rows * D, -1, 1, 21);
    std::array<std::vector<double>, 5> p{uniform(L * D * F, -0.5, 0.5, 22), uniform(L * F, -0.3, 0.3, 23),
                                         uniform(L * F * D, -0.5, 0.5, 24), uniform(L * D, -0.3, 0.3, 25),
                                         uniform(L * D, 0.5, 1.5, 26)};
    const auto out = tg::scan<Policy>(mlp_of(h, W1, b1, W2, b2, gain), tg::carry(h, init), tg::stacked(W1, W1s<L>),
                                      tg::stacked(b1, b1s<L>), tg::stacked(W2, W2s<L>), tg::stacked(b2, b2s<L>),
                                      tg::stacked(gain, gs<L>));
    const auto step = tg::compile(loss_of(out), tg::wrt(x, W1s<L>, b1s<L>, W2s<L>, b2s<L>, gs<L>));
    std::vector<double> gx(xv.size());
    std::array<std::vector<double>, 5> g;
    for (std::size_t k = 0; k < 5; ++k) g[k].assign(p[k].size(), 0.0);
    const double v = step.value_and_grad(tg::bind(x, xv), tg::bind(W1s<L>, p[0]), tg::bind(b1s<L>, p[1]),
                                         tg::bind(W2s<L>, p[2]), tg::bind(b2s<L>, p[3]), tg::bind(gs<L>, p[4]),
                                         tg::grad_into(x, gx), tg::grad_into(W1s<L>, g[0]), tg::grad_into(b1s<L>, g[1]),
                                         tg::grad_into(W2s<L>, g[2]), tg::grad_into(b2s<L>, g[3]), tg::grad_into(gs<L>, g[4]));
    std::vector<double> gxu(xv.size());
    std::array<std::vector<double>, 5> gu_;
    for (std::size_t k = 0; k < 5; ++k) gu_[k].assign(p[k].size(), 0.0);
    const double vu = [&]<std::size_t... Is>(std::index_sequence<Is...>) {
        const auto step_u =
            tg::compile(loss_of(unroll_mlp<0, L>(init)), tg::wrt(x, W1u<Is>..., b1u<Is>..., W2u<Is>..., b2u<Is>..., gu<Is>...));
        return step_u.value_and_grad(
            tg::bind(x, xv), tg::bind(W1u<Is>, p[0].data() + Is * D * F, {D, F})..., tg::bind(b1u<Is>, p[1].data() + Is * F, {F})...,
            tg::bind(W2u<Is>, p[2].data() + Is * F * D, {F, D})..., tg::bind(b2u<Is>, p[3].data() + Is * D, {D})...,
            tg::bind(gu<Is>, p[4].data() + Is * D, {D})..., tg::grad_into(x, gxu),
            tg::grad_into(W1u<Is>, std::span<double>(gu_[0].data() + Is * D * F, D * F))...,
            tg::grad_into(b1u<Is>, std::span<double>(gu_[1].data() + Is * F, F))...,
            tg::grad_into(W2u<Is>, std::span<double>(gu_[2].data() + Is * F * D, F * D))...,
            tg::grad_into(b2u<Is>, std::span<double>(gu_[3].data() + Is * D, D))...,
            tg::grad_into(gu<Is>, std::span<double>(gu_[4].data() + Is * D, D))...);
    }(std::make_index_sequence<L>{});
    INFO("L = " << L);
    REQUIRE(close(v, vu));
    for (std::size_t i = 0; i < gx.size(); ++i) REQUIRE(close(gx[i], gxu[i]));
    for (std::size_t k = 0; k < 5; ++k) {
        INFO("param " << k);
        double norm = 0;
        for (std::size_t i = 0; i < g[k].size(); ++i) {
            REQUIRE(close(g[k][i], gu_[k][i]));
            norm += g[k][i] * g[k][i];
        }
        REQUIRE(norm > 1e-10);
    }
}
}  // namespace

TEST_CASE("scan with more than three stacked params (packed) equals the unrolled graph", "[scan]") {
    check_packed_against_unrolled<1, tg::scan_memory::layers>(3);
    check_packed_against_unrolled<3, tg::scan_memory::layers>(2);
    check_packed_against_unrolled<3, tg::scan_memory::carries>(2);
}
