// tg::tape (exec/tape.hpp): one backward through run-time segments.
#include <check_gradient.hpp>

#include <cmath>
#include <vector>

namespace tg = typegrad;

TEST_CASE("a tape runs one backward through run-time segments", "[tape]") {
    SECTION("x + 10 | + 10 | sum in three segments gives ones") {
        constexpr auto v = tg::param<"v", float, tg::shape<tg::dyn>>;
        auto add10 = tg::compile(v + tg::lit<10>, tg::wrt(v));
        auto total = tg::compile(tg::sum(v), tg::wrt(v));
        std::vector<float> xd{1, 2, 3, 4};
        tg::tape<float> tape;
        auto a = tape.record(add10, v, tg::bind(v, xd));
        auto b = tape.record(add10, v, tg::bind(v, a));
        auto c = tape.record(total, v, tg::bind(v, b));
        CHECK(c[0] == 1 + 2 + 3 + 4 + 80.f);
        CHECK(tape.size() == 3);
        std::vector<float> one{1.f};
        tape.backward(one);
        CHECK(tape.size() == 0);  // saved values freed as the backward passed
        CHECK(std::vector<float>(tape.carried_grad().begin(), tape.carried_grad().end()) == std::vector<float>(4, 1.f));
    }
    SECTION("a recurrent cell applied T times equals the unrolled static graph") {
        constexpr auto h = tg::param<"h", double, tg::shape<4>>;
        constexpr auto xin = tg::input<"x", double, tg::shape<4>>;
        constexpr auto W = tg::param<"W", double, tg::shape<4, 4>>;
        auto cell = tg::compile(tg::tanh(tg::matmul(W, h) + xin), tg::wrt(h, W));
        auto head = tg::compile(tg::sum(tg::square(h)), tg::wrt(h));
        std::vector<double> w(16), h0{0.1, -0.2, 0.3, 0.4}, gw(16, 0.0);
        for (int i = 0; i < 16; ++i) w[i] = 0.1 * ((i * 7) % 5 - 2);
        std::vector<std::vector<double>> xs{{1, 0, 0, 0}, {0, 1, 0, 0}, {0, 0, 1, 0}};
        tg::tape<double> tape;
        std::span<const double> state = h0;
        for (auto& xt : xs)  // T known only at run time
            state = tape.record(cell, h, tg::bind(h, state), tg::bind(xin, xt), tg::bind(W, w), tg::grad_into(W, gw));
        const double l = tape.record(head, h, tg::bind(h, state))[0];
        std::vector<double> one{1.0};
        tape.backward(one);

        constexpr auto x0 = tg::input<"x0", double, tg::shape<4>>;
        constexpr auto x1 = tg::input<"x1", double, tg::shape<4>>;
        constexpr auto x2 = tg::input<"x2", double, tg::shape<4>>;
        auto s3 = tg::tanh(tg::matmul(W, tg::tanh(tg::matmul(W, tg::tanh(tg::matmul(W, h) + x0)) + x1)) + x2);
        std::vector<double> gw2(16), gh2(4);
        const double l2 = tg::compile(tg::sum(tg::square(s3)), tg::wrt(h, W))
                              .value_and_grad(tg::bind(h, h0), tg::bind(x0, xs[0]), tg::bind(x1, xs[1]), tg::bind(x2, xs[2]),
                                              tg::bind(W, w), tg::grad_into(W, gw2), tg::grad_into(h, gh2));
        CHECK_THAT(l, Catch::Matchers::WithinRel(l2, 1e-14));
        for (int i = 0; i < 16; ++i) CHECK_THAT(gw[i], Catch::Matchers::WithinAbs(gw2[i], 1e-14));
        for (int i = 0; i < 4; ++i) CHECK_THAT(tape.carried_grad()[i], Catch::Matchers::WithinAbs(gh2[i], 1e-14));
    }
}
