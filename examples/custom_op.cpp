// Custom ops: a straight-through estimator (round forward, identity gradient, given as an
// expression so it stays differentiable) and a running counter that the backward mutates in the
// caller's buffer (a declared data mutation, as AOTAutograd allows).
#include <typegrad/typegrad.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

namespace tg = typegrad;

struct straight_through_round {
    template <class Ctx>
    static void forward(Ctx& ctx) {
        auto [x] = ctx.inputs();
        auto y = ctx.output();
        for (std::size_t i = 0; i < y.size(); ++i) y[i] = std::round(x[i]);
    }
    template <std::size_t I, class G, class Out, class X>
    static constexpr auto vjp(G g, Out, X) { return g; }
};

// y = x; every backward adds 1 to counter[0]. Only input 1 may be written, and only its data.
struct count_backward_calls {
    static constexpr auto backward_mutates = tg::mutates(tg::data<1>);
    template <class Ctx>
    static void forward(Ctx& ctx) {
        auto [x, counter] = ctx.inputs();
        (void)counter;
        auto y = ctx.output();
        for (std::size_t i = 0; i < y.size(); ++i) y[i] = x[i];
    }
    template <class Ctx>
    static void backward(Ctx& ctx) {
        auto [x, counter] = ctx.inputs();
        (void)x;
        counter[0] += 1;
        auto g = ctx.grad_output();
        auto [gx, gcounter] = ctx.grad_inputs();
        (void)gcounter;
        for (std::size_t i = 0; i < g.size(); ++i) gx[i] = g[i];
    }
    // The output has x's shape: declare it, since input 0 is x but we say so explicitly.
    template <class X, class C>
    struct result {
        using value_type = typename X::value_type;
        using shape_type = typename X::shape_type;
    };
};

constexpr auto w = tg::param<"w", double, tg::shape<4>>;
constexpr auto counter = tg::input<"counter", double, tg::shape<1>>;
constexpr auto target = tg::input<"target", double, tg::shape<4>>;

struct weights {
    BOOST_HANA_DEFINE_STRUCT(weights, (std::vector<double>, w));
};

int main() {
    // Quantisation-aware fit: the loss sees round(w), the gradient passes straight through.
    auto q = tg::custom<straight_through_round>(tg::custom<count_backward_calls>(w, counter));
    auto step = tg::compile(tg::mse_loss(q, target), tg::wrt(w));
    weights params{{0.2, 0.9, -1.4, 2.6}}, grads{std::vector<double>(4)};
    std::vector<double> tv{1, -1, 2, 0}, count{0};
    tg::sgd opt(params, {.lr = 0.5});
    double loss = 0;
    for (int it = 0; it < 50; ++it) {
        loss = tg::value_and_grad(step, tg::params(params), tg::bind(counter, count), tg::bind(target, tv),
                                  tg::grads_into(grads));
        opt.step(params, grads);
    }
    const std::vector<double>& wv = params.w;
    std::printf("loss %.3f, w = [%.2f %.2f %.2f %.2f], backward ran %.0f times\n", loss, wv[0], wv[1], wv[2], wv[3],
                count[0]);
    const bool ok = loss == 0.0 && count[0] == 50.0;
    return ok ? 0 : 1;
}
