// detail::cvec, the growable array of the constant-evaluated graph algorithms: checked where it
// is used, in constant evaluation (an error there is a compile error, so each fact is a
// STATIC_REQUIRE), and at run time.
#include <catch2/catch.hpp>

#include <cstddef>

#include <typegrad/graph/cvec.hpp>

namespace {

using typegrad::detail::cvec;

// Past the first capacity (16) several times: growth keeps every element.
constexpr std::size_t grown_sum(std::size_t n) {
    cvec<std::size_t> v;
    for (std::size_t i = 0; i < n; ++i) v.push_back(i * i);
    std::size_t s = 0;
    for (std::size_t x : v) s += x;
    return v.size() == n ? s : std::size_t(-1);
}

constexpr bool copies_are_independent() {
    cvec<int> a(3, 7);
    cvec<int> b = a;
    b[1] = 1;
    b.push_back(9);
    cvec<int> c;
    c = b;
    c.pop_back();
    return a[1] == 7 && a.size() == 3 && b[1] == 1 && b.size() == 4 && c.size() == 3 && c[2] == 7;
}

constexpr bool moves_leave_empty() {
    cvec<int> a(40, 2);
    cvec<int> b = static_cast<cvec<int>&&>(a);
    cvec<int> c;
    c = static_cast<cvec<int>&&>(b);
    return a.empty() && b.empty() && c.size() == 40 && c.back() == 2 && c.front() == 2;
}

constexpr bool nested_and_assign() {
    cvec<cvec<int>> rows;
    for (int r = 0; r < 20; ++r) {
        rows.push_back(cvec<int>{});
        for (int k = 0; k <= r; ++k) rows.back().push_back(r);
    }
    bool ok = rows.size() == 20;
    for (std::size_t r = 0; r < rows.size(); ++r) ok = ok && rows[r].size() == r + 1 && rows[r][r] == int(r);
    cvec<int> v(5, 1);
    v.assign(50, 3);  // beyond the capacity
    ok = ok && v.size() == 50 && v[49] == 3;
    v.assign(2, 4);  // within it
    v.clear();
    return ok && v.empty();
}

}  // namespace

TEST_CASE("cvec grows, copies and moves in constant evaluation", "[graph][cvec]") {
    STATIC_REQUIRE(grown_sum(0) == 0);
    STATIC_REQUIRE(grown_sum(100) == 99 * 100 * 199 / 6);  // sum of i^2, i < 100
    STATIC_REQUIRE(copies_are_independent());
    STATIC_REQUIRE(moves_leave_empty());
    STATIC_REQUIRE(nested_and_assign());
}

TEST_CASE("cvec at run time", "[graph][cvec]") {
    CHECK(grown_sum(1000) == 999ull * 1000 * 1999 / 6);
    CHECK(copies_are_independent());
    CHECK(moves_leave_empty());
    CHECK(nested_and_assign());
}
