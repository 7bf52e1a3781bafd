#pragma once
// Runs a step with host bindings and with device bindings on the same random data and compares
// the values and gradients within the dtype's tolerance (device_test.cpp, emulation_test.cpp).
#include "graphs.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <sstream>
#include <span>
#include <string_view>
#include <tuple>
#include <vector>

namespace cuda_compare {
namespace tg = typegrad;

inline bool skip_without_device() {
    if (tg::cuda::available()) return false;
    WARN("SKIPPED: no usable CUDA device (" << tg::cuda::unavailable_reason()
                                            << "); the device tests run only where a GPU is present");
    return true;
}

template <class E>
struct leaf_data {
    using leaf = typename E::node_type;
    using value_type = typename leaf::value_type;
    using shape_type = typename leaf::shape_type;
    static constexpr std::size_t rank = shape_type::rank;
    std::vector<value_type> host;
    std::array<std::size_t, rank> extents{};
    std::vector<value_type> cpu_grad, gpu_grad;
    std::optional<tg::cuda::tensor<value_type, shape_type>> dev, dev_grad;

    // Data only for a leaf the graph reads (`used`): drawing every leaf of the universe at n = 70000
    // (images of n x 4 x 8 x 8) was a tenth of the emulation tests' time.
    leaf_data(std::size_t n, std::mt19937& rng, bool used) {
        std::size_t count = 1;
        for (std::size_t a = 0; a < rank; ++a) count *= (extents[a] = shape_type::extents[a] == tg::dyn ? n : shape_type::extents[a]);
        host.resize(used ? count : 0);
        std::uniform_real_distribution<double> u(-1.5, 1.5);
        for (std::size_t i = 0; i < host.size(); ++i) {
            if constexpr (tg::is_dtype_v<value_type>) host[i] = value_type(u(rng));
            else if constexpr (std::is_same_v<value_type, std::int64_t>)
                host[i] = leaf::name() == std::string_view("count") ? 3 : value_type((3 * i + 1) % 5);  // ids of 5 rows
            else host[i] = value_type(i % 2);  // class labels, valid for 2 and 5 classes
        }
    }

    template <class Topo>
    auto host_binding() {
        if constexpr (tg::detail::contains_v<leaf, Topo>) return std::make_tuple(tg::bind(E{}, host, extents));
        else return std::tuple<>{};
    }
    template <class Wrt>
    auto host_gradient() {
        if constexpr (tg::detail::contains_v<leaf, Wrt>) {
            cpu_grad.assign(host.size(), value_type(-7));
            return std::make_tuple(tg::grad_into(E{}, cpu_grad));
        } else {
            return std::tuple<>{};
        }
    }
    template <class Topo>
    auto device_binding() {
        if constexpr (tg::detail::contains_v<leaf, Topo>) {
            dev.emplace(tg::cuda::tensor<value_type, shape_type>::from_host(host, extents));
            return std::make_tuple(tg::bind(E{}, *dev));
        } else {
            return std::tuple<>{};
        }
    }
    template <class Wrt>
    auto device_gradient() {
        if constexpr (tg::detail::contains_v<leaf, Wrt>) {
            dev_grad.emplace(extents);
            dev_grad->copy_from(std::vector<value_type>(host.size(), value_type(-7)));
            return std::make_tuple(tg::grad_into(E{}, *dev_grad));
        } else {
            return std::tuple<>{};
        }
    }
    void fetch() {
        if (dev_grad) gpu_grad = dev_grad->to_host();
    }
};

template <class Topo, class... Es>
auto make_universe(std::size_t n, std::mt19937& rng) {
    return std::tuple<leaf_data<Es>...>{leaf_data<Es>(n, rng, tg::detail::contains_v<typename Es::node_type, Topo>)...};
}
// The leaves of every test graph; data for those of the graph Topo.
template <class Topo>
auto universe(std::size_t n) {
    using namespace cuda_tests;
    std::mt19937 rng(unsigned(n) * 7919u + 3u);
    return make_universe<Topo, decltype(A), decltype(B), decltype(v), decltype(w5), decltype(M), decltype(Wl), decltype(bl),
                         decltype(X3), decltype(D), decltype(labels), decltype(X), decltype(W1), decltype(b1),
                         decltype(W2), decltype(b2), decltype(Ah), decltype(Bh), decltype(Mh), decltype(Hf),
                         decltype(Mf), decltype(tokens), decltype(positions), decltype(start), decltype(count), decltype(seed_offset),
                         decltype(E), decltype(Ed), decltype(Img), decltype(Imgd), decltype(Wc), decltype(Wg),
                         decltype(Wcd), decltype(Wk), decltype(Imgh), decltype(Wch), decltype(Img4),
                         decltype(Wc4), decltype(Xa), decltype(Xad), decltype(Xah), decltype(Xh)>(n, rng);
}

template <class T>
double tolerance(std::size_t n) {
    return std::is_same_v<T, double> ? 1e-10 : (n > 100 ? 2e-3 : 2e-4);
}
// Graphs with bf16/f16 values: the device's exp/tanh may differ from the CPU's by an ulp of
// float, which can move a value across a bf16 rounding boundary (2^-8 relative) and on.
inline double tolerance_for(const char* name, double tol) {
    const std::string_view s(name);
    return s.starts_with("bf16") || s.starts_with("f16") || s.starts_with("autocast") ? 3e-2 : tol;
}
template <class T>
void check_close(const char* what, std::span<const T> gpu, std::span<const T> cpu, double tol) {
    REQUIRE(gpu.size() == cpu.size());
    // One assertion an array, naming the first element out of tolerance and how many are: an
    // INFO and a CHECK per element were most of the emulation tests' time (53 million assertions
    // in a quarter of the graphs, each formatting its message).
    std::size_t first = cpu.size(), bad = 0;
    for (std::size_t i = 0; i < cpu.size(); ++i) {
        const bool both_nan = std::isnan(double(gpu[i])) && std::isnan(double(cpu[i]));
        if (both_nan || std::abs(double(gpu[i]) - double(cpu[i])) <= tol * (1 + std::abs(double(cpu[i])))) continue;
        if (bad++ == 0) first = i;
    }
    std::ostringstream first_text;  // the first offending element, when there is one
    if (bad != 0) first_text << "; the first, " << what << "[" << first << "]: gpu " << gpu[first] << " cpu " << cpu[first];
    INFO(what << ": " << bad << " of " << cpu.size() << " elements beyond the tolerance " << tol << first_text.str());
    CHECK(bad == 0);
}

template <class Data>
void compare_gradients(Data& data, double tol) {
    std::apply([&](auto&... d) {
        (d.fetch(), ...);
        auto one = [&](auto& x) {
            if (!x.cpu_grad.empty())
                check_close<typename std::remove_cvref_t<decltype(x)>::value_type>(
                    "gradient", std::span(std::as_const(x.gpu_grad)), std::span(std::as_const(x.cpu_grad)), tol);
        };
        (one(d), ...);
    }, data);
}


template <class Step>
void compare_with_cpu(const char* name, const Step& step, std::size_t n) {
    INFO("graph " << name << ", n = " << n);
    using T = typename Step::value_type;
    using topo = typegrad::detail::topo_t<typename Step::loss_node>;
    using wrt = typename Step::wrt_list;
    auto data = universe<topo>(n);
    auto host_binds = std::apply([](auto&... d) { return std::tuple_cat(d.template host_binding<topo>()...); }, data);
    auto host_grads = std::apply([](auto&... d) { return std::tuple_cat(d.template host_gradient<wrt>()...); }, data);
    auto dev_binds = std::apply([](auto&... d) { return std::tuple_cat(d.template device_binding<topo>()...); }, data);
    auto dev_grads = std::apply([](auto&... d) { return std::tuple_cat(d.template device_gradient<wrt>()...); }, data);
    const double tol = tolerance_for(name, tolerance<T>(n));
    if constexpr (Step::scalar_loss) {
        const T cpu = std::apply([&](const auto&... b) { return step.value_and_grad(b...); }, std::tuple_cat(host_binds, host_grads));
        const T gpu = std::apply([&](const auto&... b) { return step.value_and_grad(b...); }, std::tuple_cat(dev_binds, dev_grads));
        const T c[] = {cpu}, g[] = {gpu};
        check_close<T>("loss", g, c, tol);
        compare_gradients(data, tol);
        // the forward alone, and a backward from its context (saved values), too
        auto cpu_ctx = std::apply([&](const auto&... b) { return step.forward(b...); }, host_binds);
        auto gpu_ctx = std::apply([&](const auto&... b) { return step.forward(b...); }, dev_binds);
        check_close<T>("forward value", gpu_ctx.values(), cpu_ctx.values(), tol);
        std::apply([&](const auto&... g) { step.backward(cpu_ctx, g...); }, host_grads);
        std::apply([&](const auto&... g) { step.backward(gpu_ctx, g...); }, dev_grads);
    } else {
        auto cpu_ctx = std::apply([&](const auto&... b) { return step.forward(b...); }, host_binds);
        auto gpu_ctx = std::apply([&](const auto&... b) { return step.forward(b...); }, dev_binds);
        check_close<T>("forward values", gpu_ctx.values(), cpu_ctx.values(), tol);
        std::vector<T> seed(cpu_ctx.values().size());
        for (std::size_t i = 0; i < seed.size(); ++i) seed[i] = T(1) + T(i % 3);
        auto dev_seed = tg::cuda::tensor<T, tg::shape<tg::dyn>>::from_host(seed);
        std::apply([&](const auto&... g) { step.backward(cpu_ctx, g..., tg::seed(seed)); }, host_grads);
        std::apply([&](const auto&... g) { step.backward(gpu_ctx, g..., tg::cuda::seed(tg::cuda::device_ptr<const T>{dev_seed.data()}, dev_seed.size())); },
                   dev_grads);
    }
    compare_gradients(data, tol);
}

}  // namespace cuda_compare
