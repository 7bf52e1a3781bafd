#pragma once
// One gradient checker for every op (after Stan's expect_ad): the analytic gradient of a
// double-precision loss against central finite differences, for every element of every
// param, at the caller's points.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <typegrad/typegrad.hpp>

namespace typegrad::testing {

template <class Leaf>
struct leaf_data {
    Leaf leaf;
    std::vector<double> values;
    std::array<std::size_t, Leaf::shape_type::rank> extents;
};

// Extents default to the leaf's static ones; pass them for dynamic leaves.
template <class Leaf>
leaf_data<Leaf> at(Leaf leaf, std::vector<double> values,
                   std::array<std::size_t, Leaf::shape_type::rank> extents = Leaf::shape_type::extents) {
    return {leaf, std::move(values), extents};
}

inline std::vector<double> uniform(std::size_t n, double lo, double hi, unsigned seed = 1) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> d(lo, hi);
    std::vector<double> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}

// The values a step's forward pass computes, in double.
template <class T = double, class Step, class... Bs>
std::vector<T> values_of(const Step& step, const Bs&... bs) {
    auto ctx = step.forward(bs...);
    return std::vector<T>(ctx.values().begin(), ctx.values().end());
}

// Element-wise closeness to a reference, relative to (1 + |reference|).
inline void require_close(const std::vector<double>& a, const std::vector<double>& b, double tol = 1e-12) {
    REQUIRE(a.size() == b.size());
    for (std::size_t e = 0; e < a.size(); ++e) {
        INFO("element " << e << ": " << a[e] << " vs " << b[e]);
        CHECK(std::abs(a[e] - b[e]) <= tol * (1 + std::abs(b[e])));
    }
}

// Bindings held fixed during a check (inputs that are not differentiated, e.g. class labels).
template <class... Bs>
struct fixed_bindings {
    std::tuple<Bs...> bindings;
};
template <class... Bs>
fixed_bindings<Bs...> fixed(Bs... bs) {
    return {std::make_tuple(bs...)};
}

struct tolerance {
    double absolute = 1e-6;
    double relative = 1e-6;
};

// Checks d loss / d leaf for every leaf in `data` (all must be tg::param).
template <class Loss, class... Fixed, class... Leaves>
void check_gradient(Loss loss, tolerance tol, fixed_bindings<Fixed...> fixed_in, leaf_data<Leaves>... data) {
    auto step = compile(loss, wrt(data.leaf...));
    auto data_t = std::make_tuple(data...);
    std::tuple<std::conditional_t<true, std::vector<double>, Leaves>...> grads{std::vector<double>(data.values.size())...};
    auto value_at = [&](auto& d_t) {
        return std::apply(
            [&](auto&... d) {
                return std::apply([&](auto&... f) { return step.value_and_grad(f..., bind(d.leaf, d.values, d.extents)...); },
                                  fixed_in.bindings);
            },
            d_t);
    };
    const double value = [&] {
        return std::apply(
            [&](auto&... d) {
                return std::apply(
                    [&](auto&... g) {
                        return std::apply(
                            [&](auto&... f) {
                                return step.value_and_grad(f..., bind(d.leaf, d.values, d.extents)...,
                                                           grad_into(d.leaf, g)...);
                            },
                            fixed_in.bindings);
                    },
                    grads);
            },
            data_t);
    }();
    REQUIRE(std::isfinite(value));
    auto check_leaf = [&]<std::size_t I>(std::integral_constant<std::size_t, I>) {
        auto& d = std::get<I>(data_t);
        const auto& g = std::get<I>(grads);
        for (std::size_t k = 0; k < d.values.size(); ++k) {
            const double x0 = d.values[k];
            const double h = 1e-6 * std::max(1.0, std::abs(x0));
            d.values[k] = x0 + h;
            const double up = value_at(data_t);
            d.values[k] = x0 - h;
            const double down = value_at(data_t);
            d.values[k] = x0;
            const double numeric = (up - down) / (2 * h);
            INFO("leaf " << decltype(d.leaf)::node_type::name() << " element " << k << " at " << x0
                         << ": analytic " << g[k] << " numeric " << numeric);
            CHECK(std::abs(g[k] - numeric) <= tol.absolute + tol.relative * std::abs(numeric));
        }
    };
    [&]<std::size_t... Is>(std::index_sequence<Is...>) {
        (check_leaf(std::integral_constant<std::size_t, Is>{}), ...);
    }(std::index_sequence_for<Leaves...>{});
}

template <class Loss, class... Leaves>
void check_gradient(Loss loss, tolerance tol, leaf_data<Leaves>... data) {
    check_gradient(loss, tol, fixed_bindings<>{}, data...);
}
template <class Loss, class... Leaves>
void check_gradient(Loss loss, leaf_data<Leaves>... data) {
    check_gradient(loss, tolerance{}, fixed_bindings<>{}, data...);
}
template <class Loss, class... Fixed, class... Leaves>
void check_gradient(Loss loss, fixed_bindings<Fixed...> f, leaf_data<Leaves>... data) {
    check_gradient(loss, tolerance{}, f, data...);
}

// The points of the elementwise finite-difference checks: sizes below, at and past the SIMD
// widths; a unary op's `any` values in [-2, 2] and `pos` values in [0.2, 3]; a binary op's `a` in
// [-2, 2] and `b` in [0.5, 2]. f(n, values...) runs the checks at each size.
template <class F>
void at_unary_points(F f) {
    for (std::size_t n : {1u, 7u, 16u, 33u}) f(n, uniform(n, -2.0, 2.0, unsigned(n)), uniform(n, 0.2, 3.0, unsigned(n + 1)));
}
template <class F>
void at_binary_points(F f) {
    for (std::size_t n : {1u, 9u, 17u}) f(n, uniform(n, -2.0, 2.0, unsigned(3 * n)), uniform(n, 0.5, 2.0, unsigned(3 * n + 1)));
}

}  // namespace typegrad::testing
