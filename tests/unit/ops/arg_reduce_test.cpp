// argmax and argmin (ops/arg_reduce.hpp): PyTorch's index rules (first of ties, NaN, empty axes).
#include <check_gradient.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace tg = typegrad;

TEST_CASE("argmax and argmin follow PyTorch's rules", "[ops][argmax]") {
    constexpr auto v = tg::param<"v", double, tg::shape<tg::dyn, 4>>;
    const double nan = std::numeric_limits<double>::quiet_NaN();
    // rows: a tie (first index wins), a NaN (its index wins, for both), all equal, a plain row
    const std::vector<double> d{1, 3, 3, 2,   5, nan, 9, nan,   7, 7, 7, 7,   -1, -4, 0, -4};
    auto idx = [&](auto e) {
        auto ctx = tg::compile(e, tg::wrt(v)).forward(tg::bind(v, d, {4, 4}));
        STATIC_REQUIRE(std::is_same_v<typename std::remove_cvref_t<decltype(ctx.values())>::value_type, std::int64_t>);
        return std::vector<std::int64_t>(ctx.values().begin(), ctx.values().end());
    };
    CHECK(idx(tg::argmax(v, tg::axes<1>)) == std::vector<std::int64_t>{1, 1, 0, 2});
    CHECK(idx(tg::argmin(v, tg::axes<-1>)) == std::vector<std::int64_t>{0, 1, 0, 1});
    CHECK(idx(tg::argmax(v, tg::axes<1>, tg::keepdim)) == std::vector<std::int64_t>{1, 1, 0, 2});
    STATIC_REQUIRE(std::is_same_v<decltype(tg::argmax(v, tg::axes<1>, tg::keepdim))::shape_type, tg::shape<tg::dyn, 1>>);
    STATIC_REQUIRE(std::is_same_v<decltype(tg::argmax(v, tg::axes<0>))::shape_type, tg::shape<4>>);
    // along axis 0 (strided reads): column maxima / minima
    CHECK(idx(tg::argmax(v, tg::axes<0>)) == std::vector<std::int64_t>{2, 1, 1, 1});
    CHECK(idx(tg::argmin(v, tg::axes<0>)) == std::vector<std::int64_t>{3, 1, 3, 1});
    // over all elements: the index into the flattened tensor (the first NaN)
    CHECK(idx(tg::argmax(v)) == std::vector<std::int64_t>{5});
    // of an expression (materialised for the kernel) and of a transposed view
    CHECK(idx(tg::argmin(-v * v, tg::axes<1>)) == std::vector<std::int64_t>{1, 1, 0, 1});
    CHECK(idx(tg::argmax(tg::transpose(v), tg::axes<1>)) == std::vector<std::int64_t>{2, 1, 1, 1});
    // no elements to reduce: an error, before anything is written
    auto step = tg::compile(tg::argmax(v, tg::axes<0>), tg::wrt(v));
    const std::vector<double> none;
    CHECK_THROWS_AS(step.forward(tg::bind(v, none, {0, 4})), tg::shape_error);
    // bf16 input, float32 and a float reduction input
    constexpr auto vb = tg::param<"vb", tg::bf16, tg::shape<3>>;
    const std::vector<tg::bf16> db{tg::bf16(1.0f), tg::bf16(-2.0f), tg::bf16(1.5f)};
    auto ctx = tg::compile(tg::argmin(vb), tg::wrt(vb)).forward(tg::bind(vb, db));
    CHECK(ctx.values()[0] == 1);
}
