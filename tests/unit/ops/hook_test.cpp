// Hooks as graph nodes (ops/hook.hpp): elementwise and tensor hooks, post-accumulate hooks (their
// schedule inside the backward, optimizers in the backward), and retain_grad.
#include <check_gradient.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

namespace tg = typegrad;

namespace {
constexpr auto x = tg::param<"x", float, tg::shape<10, 10>>;
constexpr auto p = tg::param<"p", float, tg::shape<3>>;

// A tensor hook: clip the whole gradient to a global L2 norm of 1.
struct clip_to_unit_norm {
    void operator()(tg::grad_view<float> g) const {
        double n = 0;
        for (float v : g) n += double(v) * v;
        n = std::sqrt(n);
        if (n > 1)
            for (float& v : g) v = float(v / n);
    }
};
}  // namespace

TEST_CASE("an elementwise hook transforms the gradient inside the fused backward", "[hooks]") {
    std::vector<float> xd(100, 1.f), g(100);
    auto step = tg::compile(tg::sum(tg::hook(x, [](auto gr) { return gr + 10; })), tg::wrt(x));
    step.value_and_grad(tg::bind(x, xd), tg::grad_into(x, g));
    CHECK(g == std::vector<float>(100, 11.f));
    // the hook is visible in the backward graph that describe() prints
    const std::string text = tg::describe(step);
    CHECK(text.find("hook(") != std::string::npos);
    // the hook is a node of the gradient's type
    using G = tg::grad_t<decltype(tg::sum(tg::hook(x, [](auto gr) { return gr + 10; }))), decltype(x)>;
    STATIC_REQUIRE(G::node_type::kind == tg::op_kind::elementwise);
}

TEST_CASE("hooks on one node run in registration order; hooks on intermediates", "[hooks]") {
    std::vector<float> pd{1, 2, 3}, g(3);
    auto twice = tg::hook(tg::hook(p, [](auto gr) { return gr + 1; }), [](auto gr) { return gr * 2; });
    tg::compile(tg::sum(twice), tg::wrt(p)).value_and_grad(tg::bind(p, pd), tg::grad_into(p, g));
    CHECK(g == std::vector<float>{4, 4, 4});  // (1 + 1) * 2, not 1 * 2 + 1
    // on an intermediate: d/dp sum(exp(p)) with the gradient into exp(p) doubled
    auto e = tg::hook(tg::exp(p), [](auto gr) { return gr * 2; });
    tg::compile(tg::sum(e), tg::wrt(p)).value_and_grad(tg::bind(p, pd), tg::grad_into(p, g));
    for (int i = 0; i < 3; ++i) CHECK_THAT(g[i], Catch::Matchers::WithinRel(2 * std::exp(pd[i]), 1e-6f));
}

TEST_CASE("a tensor hook sees the whole gradient", "[hooks]") {
    std::vector<float> xd(100, 1.f), g(100);
    auto step = tg::compile(tg::sum(tg::hook(x, clip_to_unit_norm{}) * tg::lit<3>), tg::wrt(x));
    step.value_and_grad(tg::bind(x, xd), tg::grad_into(x, g));
    // every element was 3, the norm 30: clipped to 0.1 each
    for (float v : g) CHECK_THAT(v, Catch::Matchers::WithinRel(0.1f, 1e-6f));
}

TEST_CASE("pre-hook, accumulation, then post-accumulate hook", "[hooks][post]") {
    std::vector<float> pd{1, 1, 1}, g{100, 100, 100};
    auto hooked = tg::post_accumulate_grad_hook(tg::hook(p, [](auto gr) { return gr - 2; }),
                                                [](tg::grad_view<float>, tg::grad_view<float> gr) {
                                                    for (float& v : gr) v += 0.5f;
                                                });
    tg::compile(tg::sum(hooked * tg::lit<5>), tg::wrt(p))
        .value_and_grad(tg::bind(p, pd), tg::grad_into(p, g, tg::accumulate));
    // 5 - 2 = 3 added to 100, then + 0.5
    CHECK(g == std::vector<float>{103.5f, 103.5f, 103.5f});
}

TEST_CASE("a post-accumulate hook can update the param (an optimizer step in the backward)", "[hooks][post]") {
    std::vector<float> pd{0.5f, 0.5f, 0.5f}, g(3), seed{2, 2, 2};
    auto hooked = tg::post_accumulate_grad_hook(p, [](tg::grad_view<float> param, tg::grad_view<float> grad) {
        for (std::size_t i = 0; i < grad.size(); ++i) {
            param[i] *= grad[i];
            grad[i] *= 5;
        }
    });
    auto step = tg::compile(hooked * tg::lit<1>, tg::wrt(p));
    auto ctx = step.forward(tg::bind(p, pd));
    step.backward(ctx, tg::grad_into(p, g), tg::seed(seed));
    CHECK(pd == std::vector<float>{1, 1, 1});
    CHECK(g == std::vector<float>{10, 10, 10});
    // a read-only binding cannot be updated: an error before anything is written
    const std::vector<float> ro{0.5f, 0.5f, 0.5f};
    std::vector<float> g2{7, 7, 7};
    CHECK_THROWS_AS(tg::compile(tg::sum(hooked), tg::wrt(p)).value_and_grad(tg::bind(p, ro), tg::grad_into(p, g2)),
                    tg::binding_error);
    CHECK(g2 == std::vector<float>{7, 7, 7});
}

// ---- post-accumulate hooks run inside the backward, once their gradient is final -----------
namespace {
constexpr std::size_t mlp_n = 8, mlp_in = 3, mlp_hidden = 5, mlp_out = 2;
constexpr auto mX = tg::input<"X", float, tg::shape<mlp_n, mlp_in>>;
constexpr auto mW1 = tg::param<"fc1.W", float, tg::shape<mlp_hidden, mlp_in>>;
constexpr auto mb1 = tg::param<"fc1.b", float, tg::shape<mlp_hidden>>;
constexpr auto mW2 = tg::param<"fc2.W", float, tg::shape<mlp_out, mlp_hidden>>;
constexpr auto mb2 = tg::param<"fc2.b", float, tg::shape<mlp_out>>;
template <class A, class B, class C, class D>
constexpr auto two_layer(A w1, B bb1, C w2, D bb2) {
    return tg::mean(tg::square(tg::linear(tg::relu(tg::linear(mX, w1, bb1)), w2, bb2)));
}
struct layer {
    BOOST_HANA_DEFINE_STRUCT(layer, (std::vector<float>, W), (std::vector<float>, b));
};
struct two_layer_model {
    BOOST_HANA_DEFINE_STRUCT(two_layer_model, (layer, fc1), (layer, fc2));
};
two_layer_model two_layer_init() {
    two_layer_model m{{std::vector<float>(mlp_hidden * mlp_in), std::vector<float>(mlp_hidden)},
                      {std::vector<float>(mlp_out * mlp_hidden), std::vector<float>(mlp_out)}};
    int k = 0;
    tg::for_each_param(m, [&](std::string_view, auto& buf) {
        for (float& v : buf) v = 0.1f * float((k++ * 7) % 11 - 5);
    });
    return m;
}
std::vector<float> mlp_x() {
    std::vector<float> x(mlp_n * mlp_in);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.25f * float(int(i % 9) - 4);
    return x;
}

// What the hooks saw: which ran, in order; how many of the call's gradient buffers had been
// written (no longer hold the sentinel) when each ran; whether each saw its own final gradient.
std::vector<std::string> hook_log;
std::vector<std::size_t> written_when_run;
std::vector<bool> saw_final;
two_layer_model* probe_grads = nullptr;
const two_layer_model* final_grads = nullptr;
constexpr float sentinel = -12345.f;
constexpr const char* mlp_names[] = {"fc1.W", "fc1.b", "fc2.W", "fc2.b"};
template <int I>
struct record_hook {
    void operator()(tg::grad_view<float>, tg::grad_view<float> grad) const {
        hook_log.emplace_back(mlp_names[I]);
        std::size_t written = 0;
        tg::for_each_param(*probe_grads, [&](std::string_view, const auto& buf) { written += buf[0] != sentinel; });
        written_when_run.push_back(written);
        bool final = false;
        tg::for_each_param(*final_grads, [&](std::string_view name, const auto& want) {
            if (name == mlp_names[I]) final = std::equal(want.begin(), want.end(), grad.begin(), grad.end());
        });
        saw_final.push_back(final);
    }
};
void start_probe(two_layer_model& g, const two_layer_model& want) {
    tg::for_each_param(g, [](std::string_view, auto& buf) { std::fill(buf.begin(), buf.end(), sentinel); });
    hook_log.clear();
    written_when_run.clear();
    saw_final.clear();
    probe_grads = &g;
    final_grads = &want;
}
template <class N>
using post_hook_node = tg::detail::is_post_hook_trait<N>;
}  // namespace

TEST_CASE("post-accumulate hooks run as their gradients complete, inside the backward", "[hooks][post]") {
    auto plain = tg::compile(two_layer(mW1, mb1, mW2, mb2), tg::wrt(mW1, mb1, mW2, mb2));
    auto hooked = tg::compile(two_layer(tg::post_accumulate_grad_hook(mW1, record_hook<0>{}),
                                        tg::post_accumulate_grad_hook(mb1, record_hook<1>{}),
                                        tg::post_accumulate_grad_hook(mW2, record_hook<2>{}),
                                        tg::post_accumulate_grad_hook(mb2, record_hook<3>{})),
                              tg::wrt(mW1, mb1, mW2, mb2));
    // Compile-time: the first hook of the joint plan runs before its last step (inside the plan).
    using S = decltype(hooked);
    using PP = S::plans<>::joint;
    using hooks = tg::detail::post_hook_schedule<PP, PP, S::wrt_list,
                                                 tg::detail::filter_t<tg::detail::topo_t<S::loss_node>, post_hook_node>>;
    STATIC_REQUIRE(hooks::table.count == 4);
    STATIC_REQUIRE(hooks::table.after[0] + 1 < tg::detail::schedule_size<PP>());

    two_layer_model m = two_layer_init(), g = tg::zeros_like(m), ref = tg::zeros_like(m);
    const std::vector<float> x = mlp_x();
    const float l_ref = tg::value_and_grad(plain, tg::bind(mX, x), tg::params(m), tg::grads_into(ref));
    for (float v : ref.fc1.W) CHECK(std::isfinite(v));
    // The plan's order of completion (its schedule: fc2.W's store loop, then stage 4's fc1.W and
    // fc2.b, then fc1.b after one more reduction): each hook runs as soon as its gradient is
    // final, before the next gradient is written, and sees the final value. Before hooks ran
    // inside the schedule, all four ran after the plan, in graph order (fc1.W first).
    const std::vector<std::string> completion{"fc2.W", "fc1.W", "fc2.b", "fc1.b"};
    start_probe(g, ref);
    const float l = tg::value_and_grad(hooked, tg::bind(mX, x), tg::params(m), tg::grads_into(g));
    CHECK(hook_log == completion);
    CHECK(written_when_run == std::vector<std::size_t>{1, 2, 3, 4});
    CHECK(saw_final == std::vector<bool>(4, true));
    // the values are those of the step without hooks, bit for bit
    CHECK(l == l_ref);
    CHECK(g.fc1.W == ref.fc1.W);
    CHECK(g.fc1.b == ref.fc1.b);
    CHECK(g.fc2.W == ref.fc2.W);
    CHECK(g.fc2.b == ref.fc2.b);
    // backward(ctx) runs them inside its schedule too
    auto ctx = tg::forward(hooked, tg::bind(mX, x), tg::params(m));
    start_probe(g, ref);
    tg::backward(hooked, ctx, tg::grads_into(g));
    CHECK(hook_log.front() == "fc2.W");
    CHECK(written_when_run.front() < 4);
    CHECK(saw_final == std::vector<bool>(4, true));
    CHECK(g.fc1.W == ref.fc1.W);
    CHECK(g.fc2.b == ref.fc2.b);
    // accumulation: the hook sees the sum, final
    two_layer_model twice = ref;
    tg::for_each_param(twice, [](std::string_view, auto& buf) { for (float& v : buf) v *= 2; });
    g = ref;
    hook_log.clear();
    probe_grads = &g;
    final_grads = &twice;
    saw_final.clear();
    written_when_run.clear();
    tg::value_and_grad(hooked, tg::bind(mX, x), tg::params(m), tg::grads_into(g, tg::accumulate));
    CHECK(hook_log == completion);
    CHECK(saw_final == std::vector<bool>(4, true));
    probe_grads = nullptr;
    final_grads = nullptr;
}

namespace {
// A param read by the backward after its own gradient is final: s scales a doubly centred x, so
// s's gradient is a reduction finished early, while the gradient of w (in front of both
// centrings) needs two more reductions, whose loops recompute d(c * s)/dc = g * s and read s.
constexpr auto cX = tg::input<"X", float, tg::shape<4, 3>>;
constexpr auto cw = tg::param<"w", float, tg::shape<3>>;
constexpr auto cs = tg::param<"s", float, tg::shape<3>>;
template <class W, class S>
constexpr auto centred(W w, S s) {
    auto t = cX * w;
    auto u = t - tg::mean(t, tg::axes<1>, tg::keepdim);
    auto c = u - tg::mean(u, tg::axes<0>, tg::keepdim);
    return tg::sum(tg::square(c * s + tg::lit<0.5>));
}
struct scale_model {
    BOOST_HANA_DEFINE_STRUCT(scale_model, (std::vector<float>, w), (std::vector<float>, s));
};
template <class PP, class Leaf, std::size_t Store>
constexpr bool read_after_final() {
    constexpr auto& steps = tg::detail::buffer_steps_v<PP>;
    return steps.read[PP::program::template id_of<Leaf>::value] > steps.store[Store] &&
           steps.read[PP::program::template id_of<Leaf>::value] != tg::detail::no_step;
}
}  // namespace

TEST_CASE("a hook that updates its param waits for the plan's last read of it", "[hooks][post][optim]") {
    auto plain = tg::compile(centred(cw, cs), tg::wrt(cw, cs));
    auto hooked = tg::compile(centred(tg::post_accumulate_grad_hook(cw, tg::optimizer_step{}),
                                      tg::post_accumulate_grad_hook(cs, tg::optimizer_step{})),
                              tg::wrt(cw, cs));
    // The case this guards: in the joint plan s is read after the loop that finishes its gradient.
    using PP = decltype(hooked)::plans<>::joint;
    STATIC_REQUIRE(read_after_final<PP, tg::detail::node_of_t<decltype(cs)>, 1>());

    std::vector<float> x{0.5f, -1, 2, 1.5f, 0.25f, -0.75f, 3, -2, 1, 0, 1.25f, -0.5f};
    const scale_model start{{0.5f, 1.5f, -1}, {1, -0.5f, 2}};
    scale_model after = start, inside = start, g = tg::zeros_like(start);
    tg::sgd opt_after(after, {.lr = 0.05, .momentum = 0.9});
    tg::sgd opt_inside(inside, {.lr = 0.05, .momentum = 0.9});
    for (int t = 0; t < 3; ++t) {
        const float l1 = tg::value_and_grad(plain, tg::bind(cX, x), tg::params(after), tg::grads_into(g));
        opt_after.step(after, g);
        float l2 = 0;
        {
            tg::optimizer_in_backward scope(opt_inside, inside);
            l2 = tg::value_and_grad(hooked, tg::bind(cX, x), tg::params(inside));
        }
        CHECK(l1 == l2);
        // bitwise: every loop of the backward read the params of before the step
        CHECK(inside.w == after.w);
        CHECK(inside.s == after.s);
    }
    CHECK(inside.w != start.w);
    CHECK(inside.s != start.s);
}

TEST_CASE("an optimizer in the backward of an MLP equals one after it, bit for bit", "[hooks][post][optim]") {
    auto plain = tg::compile(two_layer(mW1, mb1, mW2, mb2), tg::wrt(mW1, mb1, mW2, mb2));
    constexpr tg::optimizer_step os{};
    auto hooked = tg::compile(two_layer(tg::post_accumulate_grad_hook(mW1, os), tg::post_accumulate_grad_hook(mb1, os),
                                        tg::post_accumulate_grad_hook(mW2, os), tg::post_accumulate_grad_hook(mb2, os)),
                              tg::wrt(mW1, mb1, mW2, mb2));
    const std::vector<float> x = mlp_x();
    two_layer_model after = two_layer_init(), inside = after, g = tg::zeros_like(after);
    tg::adam opt_after(after, {.lr = 0.01});
    tg::adam opt_inside(inside, {.lr = 0.01});
    for (int t = 0; t < 3; ++t) {
        tg::value_and_grad(plain, tg::bind(mX, x), tg::params(after), tg::grads_into(g));
        opt_after.step(after, g);
        tg::optimizer_in_backward scope(opt_inside, inside);
        tg::value_and_grad(hooked, tg::bind(mX, x), tg::params(inside));
    }
    CHECK(inside.fc1.W == after.fc1.W);
    CHECK(inside.fc1.b == after.fc1.b);
    CHECK(inside.fc2.W == after.fc2.W);
    CHECK(inside.fc2.b == after.fc2.b);
    CHECK(inside.fc1.W != two_layer_init().fc1.W);
}

TEST_CASE("backward(ctx) hands a hook its param where the backward plan does not read it", "[hooks][post]") {
    // d/dp sum(exp(x) * p) = exp(x): p is not a node of the backward plan, only of the forward's
    // (the hook's param was once looked up in the backward plan's state, one past its end).
    constexpr auto xi = tg::input<"xi", float, tg::shape<3>>;
    auto hooked = tg::post_accumulate_grad_hook(p, [](tg::grad_view<float> param, tg::grad_view<float> grad) {
        for (std::size_t i = 0; i < grad.size(); ++i) param[i] -= grad[i];
    });
    auto step = tg::compile(tg::sum(tg::exp(xi) * hooked), tg::wrt(p));
    std::vector<float> xd{0, 1, 2}, pd{1, 1, 1}, g(3);
    auto ctx = step.forward(tg::bind(xi, xd), tg::bind(p, pd));
    step.backward(ctx, tg::grad_into(p, g));
    for (std::size_t i = 0; i < 3; ++i) {
        CHECK_THAT(g[i], Catch::Matchers::WithinRel(std::exp(xd[i]), 1e-6f));
        CHECK(pd[i] == 1 - g[i]);
    }
}

TEST_CASE("retain_grad exposes an intermediate's gradient", "[hooks][retain]") {
    std::vector<float> xd(100, 1.f), ge(100), gx(100);
    auto e = tg::retain_grad(tg::exp(x));
    tg::compile(tg::sum(e * e), tg::wrt(x)).value_and_grad(tg::bind(x, xd), tg::grad_into(e, ge), tg::grad_into(x, gx));
    CHECK_THAT(ge[0], Catch::Matchers::WithinRel(2 * std::exp(1.f), 1e-6f));
    CHECK_THAT(gx[0], Catch::Matchers::WithinRel(2 * std::exp(2.f), 1e-6f));
}

TEST_CASE("op(x, x).sum() gradients with hooks present stay exact", "[hooks]") {
    std::vector<float> pd{1, 2, 3}, g(3);
    auto hp = tg::hook(p, [](auto gr) { return gr; });
    auto run = [&](auto loss) {
        tg::compile(loss, tg::wrt(p)).value_and_grad(tg::bind(p, pd), tg::grad_into(p, g));
        return g;
    };
    CHECK(run(tg::sum(hp + hp)) == std::vector<float>{2, 2, 2});
    CHECK(run(tg::sum(hp - hp)) == std::vector<float>{0, 0, 0});
    CHECK(run(tg::sum(hp * hp)) == std::vector<float>{2, 4, 6});
    CHECK(run(tg::sum(hp / hp)) == std::vector<float>{0, 0, 0});
}

namespace {
std::vector<int> post_hook_calls;
}  // namespace

TEST_CASE("several post-accumulate hooks on one param run in registration order", "[hooks][post][edge]") {
    constexpr auto p = tg::param<"p", float, tg::shape<3>>;
    auto hooked = tg::post_accumulate_grad_hook(
        tg::post_accumulate_grad_hook(p, [](tg::grad_view<float>, tg::grad_view<float>) { post_hook_calls.push_back(1); }),
        [](tg::grad_view<float> param, tg::grad_view<float> grad) {
            post_hook_calls.push_back(2);
            for (std::size_t i = 0; i < param.size(); ++i) param[i] -= grad[i];  // an SGD step
        });
    std::vector<float> pd{1, 2, 3}, g(3);
    post_hook_calls.clear();
    tg::compile(tg::sum(tg::square(hooked)), tg::wrt(p)).value_and_grad(tg::bind(p, pd), tg::grad_into(p, g));
    CHECK(post_hook_calls == std::vector<int>{1, 2});
    CHECK(g == std::vector<float>{2, 4, 6});
    CHECK(pd == std::vector<float>{-1, -2, -3});
}
