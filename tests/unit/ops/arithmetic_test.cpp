// Arithmetic (ops/arithmetic.hpp: +, -, *, /, negation): gradients against finite differences in
// double, and closed forms where an operand is repeated.
#include <check_gradient.hpp>

namespace tg = typegrad;
using tg::testing::at;
using tg::testing::check_gradient;
using tg::testing::at_binary_points;
using tg::testing::at_unary_points;

namespace {
constexpr auto x = tg::param<"x", double, tg::shape<tg::dyn>>;
constexpr auto y = tg::param<"y", double, tg::shape<tg::dyn>>;
}  // namespace

TEST_CASE("negation matches finite differences", "[ops][arithmetic][gradient]") {
    at_unary_points([](std::size_t n, const auto& any, const auto&) {
        check_gradient(tg::sum(-x), at(x, any, {n}));
    });
}

TEST_CASE("+, -, * and / match finite differences, both operands", "[ops][arithmetic][gradient]") {
    at_binary_points([](std::size_t n, const auto& a, const auto& b) {
        check_gradient(tg::sum(x + y), at(x, a, {n}), at(y, b, {n}));
        check_gradient(tg::sum(x - y), at(x, a, {n}), at(y, b, {n}));
        check_gradient(tg::sum(x * y), at(x, a, {n}), at(y, b, {n}));
        check_gradient(tg::sum(x / y), at(x, a, {n}), at(y, b, {n}));
    });
}

TEST_CASE("op(x, x).sum() at [1, 2, 3]", "[ops][closed-form]") {
    constexpr auto v = tg::param<"v", float, tg::shape<3>>;
    std::vector<float> data{1, 2, 3}, g(3);
    auto run = [&](auto loss) {
        tg::compile(loss, tg::wrt(v)).value_and_grad(tg::bind(v, data), tg::grad_into(v, g));
        return g;
    };
    CHECK(run(tg::sum(v + v)) == std::vector<float>{2, 2, 2});
    CHECK(run(tg::sum(v - v)) == std::vector<float>{0, 0, 0});
    CHECK(run(tg::sum(v * v)) == std::vector<float>{2, 4, 6});
    CHECK(run(tg::sum(v / v)) == std::vector<float>{0, 0, 0});
}

// Gradients whose constant factors merge (ops/arithmetic.hpp, grad_mul): the merged product is
// the unmerged one bit for bit where a factor is a power of two, and where none is, nothing merges.
TEST_CASE("merged constant factors of a gradient give the unmerged bits", "[ops][arithmetic][closed-form]") {
    constexpr auto v = tg::param<"v", float, tg::shape<tg::dyn>>;
    const std::vector<float> data{-3.5f, -1.0f, -0.3f, 0.0f, 0.1f, 0.7f, 2.25f, 1e6f, -7e30f, 1e-30f, 123.456f};
    std::vector<float> g(data.size());
    auto grad = [&](auto loss) {
        tg::compile(loss, tg::wrt(v)).value_and_grad(tg::bind(v, data), tg::grad_into(v, g));
        return g;
    };
    // -0.5 * square(z), z = (v - 0.3) * 0.75: the gradient (-0.5 * (z * 2)) * 0.75 = -(z * 0.75)
    const auto z = (v - tg::lit<0.3>) * tg::lit<0.75>;
    const auto g1 = grad(tg::sum(tg::lit<-0.5> * tg::square(z)));
    for (std::size_t i = 0; i < data.size(); ++i) {
        const float zi = (data[i] - 0.3f) * 0.75f;
        CHECK(g1[i] == (-0.5f * (zi * 2.0f)) * 0.75f);
    }
    // 0.3 * (v * 0.7): not merged, so (1 * 0.3) * 0.7 rounded twice as written
    const auto g2 = grad(tg::sum(tg::lit<0.3> * (v * tg::lit<0.7>)));
    for (float gi : g2) CHECK(gi == 0.3f * 0.7f);
    // -(v * 3) / 4 and v / 3
    const auto g3 = grad(tg::sum(-(v * tg::lit<3>) / tg::lit<4>));
    for (float gi : g3) CHECK(gi == -0.75f);
    const auto g4 = grad(tg::sum(v / tg::lit<3>));
    for (float gi : g4) CHECK(gi == 1.0f / 3.0f);
}

TEST_CASE("merged constant factors match finite differences", "[ops][arithmetic][gradient]") {
    at_unary_points([](std::size_t n, const auto& any, const auto&) {
        const auto z = (x - tg::lit<0.3>) * tg::lit<0.75>;
        check_gradient(tg::sum(tg::lit<-0.5> * tg::square(z) - tg::lit<1.25>), at(x, any, {n}));
        check_gradient(tg::sum(-(x * tg::lit<3>) / tg::lit<4> + tg::lit<0.3> * (x * tg::lit<0.7>)), at(x, any, {n}));
        check_gradient(tg::sum(tg::exp(x) * tg::lit<2>) * tg::lit<-0.25>, at(x, any, {n}));
    });
}
