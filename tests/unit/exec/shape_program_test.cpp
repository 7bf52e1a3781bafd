// The shape pass as a straight-line program (exec/execute.hpp, shape_program_of): every extent
// and stride it computes against the reference pass that checks every node
// (compute_shapes_checked), the checks it keeps, and the errors it leaves to the reference pass.
#include <catch2/catch.hpp>

#include <typegrad/typegrad.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <initializer_list>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace tg = typegrad;
namespace td = typegrad::detail;

namespace {

template <class Plan>
constexpr std::size_t steps_of(td::shape_op op) {
    constexpr auto& prog = td::shape_program_of<Plan>::value;
    std::size_t n = 0;
    for (std::size_t i = 0; i < prog.size; ++i) n += prog.steps[i].op == op;
    return n;
}

template <class Loss, class... Wrt>
using joint_plan = typename decltype(tg::compile(Loss{}, tg::wrt(Wrt{}...)))::template plans<>::joint;

// A plan's state with its leaves' extents set, as binding sets them.
template <class Plan>
struct shape_state {
    typename Plan::state_type state{};
    template <class Leaf>
    shape_state& leaf(Leaf, std::initializer_list<std::size_t> ext) {
        using N = typename Leaf::node_type;
        static_assert(Plan::program::template contains<N>::value);
        std::copy(ext.begin(), ext.end(), state.ext.begin() + Plan::rank_offset[Plan::program::template id_of<N>::value]);
        return *this;
    }
};

// The program and the reference pass give the same extents, strides and view offsets.
template <class Plan>
void require_same_shapes(const shape_state<Plan>& s) {
    auto fast = s.state, ref = s.state;
    REQUIRE(td::run_shape_program<Plan>(fast));
    td::compute_shapes_checked<Plan>(ref);
    CHECK(fast.ext == ref.ext);
    CHECK(fast.stride == ref.stride);
    CHECK(fast.view_offset == ref.view_offset);
}

// The program stops at a failed check; compute_shapes then throws the reference pass's error.
template <class Plan>
std::string rejected(const shape_state<Plan>& s) {
    auto fast = s.state;
    CHECK_FALSE(td::run_shape_program<Plan>(fast));
    auto ref = s.state;
    std::string what, ref_what;
    try {
        td::compute_shapes<Plan>(ref);
    } catch (const tg::shape_error& e) {
        what = e.what();
    }
    auto ref2 = s.state;
    try {
        td::compute_shapes_checked<Plan>(ref2);
    } catch (const tg::shape_error& e) {
        ref_what = e.what();
    }
    CHECK(what == ref_what);
    return what;
}

constexpr auto x = tg::param<"x", float, tg::shape<tg::dyn>>;
constexpr auto y = tg::param<"y", float, tg::shape<tg::dyn>>;
constexpr auto col = tg::param<"col", double, tg::shape<tg::dyn, 1>>;
constexpr auto row = tg::param<"row", double, tg::shape<1, tg::dyn>>;
constexpr auto m = tg::param<"m", double, tg::shape<tg::dyn, 3>>;
constexpr auto v3 = tg::param<"v3", double, tg::shape<3>>;
constexpr auto a = tg::param<"a", double, tg::shape<tg::dyn, tg::dyn>>;
constexpr auto b = tg::param<"b", double, tg::shape<tg::dyn, tg::dyn>>;

}  // namespace

TEST_CASE("the shape program: a chain over one leaf copies extents and checks nothing", "[exec][shapes]") {
    using P = joint_plan<decltype(tg::sum(tg::lit<-0.5> * tg::square((x - tg::lit<1.5>) * tg::lit<0.7>))), decltype(x)>;
    // one dynamic class: every node copies the leaf's extent (and strides), no check remains
    STATIC_REQUIRE(steps_of<P>(td::shape_op::check) == 0);
    STATIC_REQUIRE(steps_of<P>(td::shape_op::copy_node) > 0);
    STATIC_REQUIRE(steps_of<P>(td::shape_op::strides) == 1);  // the leaf's
    for (std::size_t n : {0u, 1u, 17u, 1000u}) {
        shape_state<P> s;
        require_same_shapes(s.leaf(x, {n}));
    }
}

TEST_CASE("the shape program: two leaves are checked once, and a mismatch is the reference pass's error",
          "[exec][shapes]") {
    using P = joint_plan<decltype(tg::sum(tg::exp(x) * y + x * tg::sin(y))), decltype(x), decltype(y)>;
    STATIC_REQUIRE(steps_of<P>(td::shape_op::check) == 1);  // x against y, once for the whole graph
    {
        shape_state<P> s;
        require_same_shapes(s.leaf(x, {5}).leaf(y, {5}));
    }
    shape_state<P> s;
    const std::string what = rejected(s.leaf(x, {5}).leaf(y, {4}));
    CHECK(what.find("typegrad: 'mul'") == 0);
    CHECK(what.find("cannot combine extents [4] of operand 1 ('y') with the result extents [5]") != std::string::npos);
}

TEST_CASE("the shape program: broadcasting, static axes, reductions, views and kernels", "[exec][shapes]") {
    SECTION("an outer product of a column and a row, reduced over each axis") {
        using L = decltype(tg::sum(tg::sum(tg::exp(col * row), tg::axes<0>)) +
                           tg::sum(tg::square(tg::sum(col * row, tg::axes<1>, tg::keepdim) * col)));
        using P = joint_plan<L, decltype(col), decltype(row)>;
        for (auto [r, c] : {std::pair<std::size_t, std::size_t>{1, 1}, {3, 1}, {1, 4}, {3, 4}, {0, 2}}) {
            shape_state<P> s;
            require_same_shapes(s.leaf(col, {r, 1}).leaf(row, {1, c}));
        }
    }
    SECTION("a dynamic axis beside a static one, and a static vector broadcast over rows") {
        using L = decltype(tg::sum(tg::tanh(m) * v3 + m) + tg::sum(tg::mean(m * m, tg::axes<0>) * v3));
        using P = joint_plan<L, decltype(m), decltype(v3)>;
        for (std::size_t r : {0u, 1u, 6u}) {
            shape_state<P> s;
            require_same_shapes(s.leaf(m, {r, 3}).leaf(v3, {3}));
        }
    }
    SECTION("kernels and views: a product of a transpose, then elementwise ops over it") {
        using L = decltype(tg::sum(tg::exp(tg::matmul(tg::transpose(a), b)) * tg::matmul(tg::transpose(a), b)) +
                           tg::sum(tg::reshape<tg::shape<tg::dyn>>(tg::sin(a)) * tg::lit<2>));
        using P = joint_plan<L, decltype(a), decltype(b)>;
        STATIC_REQUIRE(steps_of<P>(td::shape_op::routine) > 0);
        for (auto [k, i, j] : {std::tuple<std::size_t, std::size_t, std::size_t>{2, 3, 4}, {1, 1, 1}, {5, 2, 0}}) {
            shape_state<P> s;
            require_same_shapes(s.leaf(a, {k, i}).leaf(b, {k, j}));
        }
        shape_state<P> s;  // inner extents 2 and 3: the kernel's own check throws
        CHECK_THROWS_AS(td::compute_shapes<P>(s.leaf(a, {2, 3}).leaf(b, {3, 4}).state), tg::shape_error);
    }
    SECTION("two dynamic matrices added: each axis checked once, a mismatch on the second axis named") {
        using L = decltype(tg::sum(tg::exp(a + b) * (a - b)));
        using P = joint_plan<L, decltype(a), decltype(b)>;
        STATIC_REQUIRE(steps_of<P>(td::shape_op::check) == 2);
        {
            shape_state<P> s;
            require_same_shapes(s.leaf(a, {3, 2}).leaf(b, {3, 2}));
        }
        shape_state<P> s;
        const std::string what = rejected(s.leaf(a, {3, 2}).leaf(b, {3, 5}));
        CHECK(what.find("cannot combine extents [3, 5] of operand 1 ('b') with the result extents [3, 2]") !=
              std::string::npos);
    }
}

TEST_CASE("the shape program behind a call: sizes change, errors leave the caller's buffers untouched",
          "[exec][shapes]") {
    auto step = tg::compile(tg::sum(tg::exp(a + b) * (a - b)), tg::wrt(a, b));
    for (auto [r, c] : {std::pair<std::size_t, std::size_t>{3, 2}, {1, 7}, {4, 4}}) {
        std::vector<double> av(r * c), bv(r * c), ga(r * c), gb(r * c);
        double want = 0;
        for (std::size_t i = 0; i < r * c; ++i) {
            av[i] = 0.1 * double(i % 5), bv[i] = -0.05 * double(i % 3);
            want += std::exp(av[i] + bv[i]) * (av[i] - bv[i]);
        }
        CHECK_THAT(step.value_and_grad(tg::bind(a, av, {r, c}), tg::bind(b, bv, {r, c}), tg::grad_into(a, ga),
                                       tg::grad_into(b, gb)),
                   Catch::Matchers::WithinRel(want, 1e-12));
        const std::size_t last = r * c - 1;
        const double e = std::exp(av[last] + bv[last]);
        CHECK_THAT(ga[last], Catch::Matchers::WithinRel(e * (av[last] - bv[last]) + e, 1e-12));
        CHECK_THAT(gb[last], Catch::Matchers::WithinRel(e * (av[last] - bv[last]) - e, 1e-12));
    }
    std::vector<double> av(6, 1.0), bv(6, 1.0), ga(6, 9.0), gb(6, 9.0);
    CHECK_THROWS_AS(step.value_and_grad(tg::bind(a, av, {2, 3}), tg::bind(b, bv, {3, 2}), tg::grad_into(a, ga),
                                        tg::grad_into(b, gb)),
                    tg::shape_error);
    CHECK((ga == std::vector<double>(6, 9.0) && gb == std::vector<double>(6, 9.0)));
}
