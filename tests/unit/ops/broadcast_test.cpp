// Broadcasting (elementwise ops over static 1, missing axes and scalars; ops/broadcast.hpp's
// expand and its reduction in the backward): gradients against finite differences in double.
#include <check_gradient.hpp>

namespace tg = typegrad;
using tg::testing::at;
using tg::testing::check_gradient;
using tg::testing::uniform;

namespace {
constexpr auto m = tg::param<"m", double, tg::shape<4, 3>>;
constexpr auto r = tg::param<"r", double, tg::shape<3>>;
constexpr auto c = tg::param<"c", double, tg::shape<4, 1>>;
constexpr auto s = tg::param<"s", double>;
}  // namespace

TEST_CASE("broadcasting: static 1, missing axes and scalars", "[ops][gradient][broadcast]") {
    auto mv = uniform(12, -1.0, 1.0, 7);
    auto rv = uniform(3, 0.5, 1.5, 8);
    auto cv = uniform(4, 0.5, 1.5, 9);
    std::vector<double> sv{0.7};
    check_gradient(tg::sum(m * r), at(m, mv), at(r, rv));
    check_gradient(tg::sum(tg::exp(m / c) + r), at(m, mv), at(c, cv), at(r, rv));
    check_gradient(tg::sum(c * r), at(c, cv), at(r, rv));           // [4,1] x [3] -> [4,3]
    check_gradient(tg::sum(tg::square(m - s) * s), at(m, mv), at(s, sv));
    check_gradient(tg::sum(tg::max(m, r)), at(m, mv), at(r, rv));
}
