// Losses (ops/loss.hpp): gradients against finite differences in double and closed forms, and
// cross_entropy with masked (-inf) logits.
#include <check_gradient.hpp>
#include <special_values.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace tg = typegrad;
using tg::testing::at;
using tg::testing::check_gradient;
using tg::testing::fixed;
using tg::testing::uniform;
using tg::testing::inf;
using tg::testing::qnan;
using tg::testing::same_special;

TEST_CASE("losses", "[ops][loss][gradient]") {
    constexpr auto logits = tg::param<"logits", double, tg::shape<tg::dyn, 4>>;
    constexpr auto labels = tg::input<"labels", std::int32_t, tg::shape<tg::dyn>>;
    constexpr auto target = tg::param<"target", double, tg::shape<tg::dyn, 4>>;
    std::vector<std::int32_t> lab{3, 0, 1};
    auto lv = uniform(12, -2.0, 2.0, 60), tv = uniform(12, 0.0, 1.0, 61);
    check_gradient(tg::cross_entropy(logits, labels), fixed(tg::bind(labels, lab)), at(logits, lv, {3, 4}));
    check_gradient(tg::nll_loss(tg::log_softmax(logits, tg::axes<1>), labels), fixed(tg::bind(labels, lab)),
                   at(logits, lv, {3, 4}));
    check_gradient(tg::mse_loss(logits, target), at(logits, lv, {3, 4}), at(target, tv, {3, 4}));
    check_gradient(tg::binary_cross_entropy_with_logits(logits, target), at(logits, lv, {3, 4}), at(target, tv, {3, 4}));
    // closed form: uniform logits give log(C) and gradient (softmax - onehot) / N
    std::vector<double> zeros(12, 0.0), g(12);
    const double l = tg::compile(tg::cross_entropy(logits, labels), tg::wrt(logits))
                         .value_and_grad(tg::bind(logits, zeros, {3, 4}), tg::bind(labels, lab), tg::grad_into(logits, g));
    CHECK_THAT(l, Catch::Matchers::WithinRel(std::log(4.0), 1e-14));
    CHECK_THAT(g[3], Catch::Matchers::WithinRel((0.25 - 1) / 3, 1e-14));
    CHECK_THAT(g[0], Catch::Matchers::WithinRel(0.25 / 3, 1e-14));
    // a label outside [0, C) throws before anything is written
    std::vector<std::int32_t> bad{3, 4, 0};
    std::vector<double> g0(12, 7.0);
    CHECK_THROWS_AS(tg::compile(tg::cross_entropy(logits, labels), tg::wrt(logits))
                        .value_and_grad(tg::bind(logits, zeros, {3, 4}), tg::bind(labels, bad), tg::grad_into(logits, g0)),
                    tg::shape_error);
    CHECK(g0 == std::vector<double>(12, 7.0));
}

TEST_CASE("cross_entropy with a masked (-inf) logit of another class is finite, as in PyTorch", "[ops][loss][edge]") {
    constexpr auto logits = tg::param<"logits", float, tg::shape<tg::dyn, 3>>;
    constexpr auto labels = tg::input<"labels", std::int64_t, tg::shape<tg::dyn>>;
    auto step = tg::compile(tg::cross_entropy(logits, labels), tg::wrt(logits));
    std::vector<float> ld{0, -inf, 0, -inf, 1, -inf}, g(6);
    std::vector<std::int64_t> lab{0, 1};
    const float l = step.value_and_grad(tg::bind(logits, ld, {2, 3}), tg::bind(labels, lab), tg::grad_into(logits, g));
    // rows: log 2 and 0 (PyTorch: torch.nn.functional.cross_entropy gives the same)
    CHECK_THAT(l, Catch::Matchers::WithinRel(float(std::log(2.0) / 2), 1e-6f));
    const std::vector<float> want{-0.25f, 0, 0.25f, 0, 0, 0};
    for (int i = 0; i < 6; ++i) CHECK_THAT(g[i], Catch::Matchers::WithinAbs(want[i], 1e-7));
    // nll_loss on log-probabilities with -inf entries: the same
    auto nll = tg::compile(tg::nll_loss(tg::log_softmax(logits, tg::axes<1>), labels), tg::wrt(logits));
    CHECK_THAT(nll.value_and_grad(tg::bind(logits, ld, {2, 3}), tg::bind(labels, lab), tg::grad_into(logits, g)),
               Catch::Matchers::WithinRel(float(std::log(2.0) / 2), 1e-6f));
    // the label's own logit masked: +inf, as in PyTorch
    std::vector<std::int64_t> masked{1, 1};
    CHECK(step.value_and_grad(tg::bind(logits, ld, {2, 3}), tg::bind(labels, masked), tg::grad_into(logits, g)) == inf);
}
