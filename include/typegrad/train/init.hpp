#pragma once
// Parameter initialisation on the counter-based Philox4x32-10 generator (core/philox.hpp), with
// PyTorch's distributions and fan rules (torch.nn.init):
//
//   tg::generator gen{.seed = 42};
//   tg::kaiming_uniform(model.fc1.W, {64, 2}, gen);          // extents row-major: {out, in, ...}
//   tg::kaiming_uniform(model.fc1.W, W1, gen);               // ... or from a static-shaped param
//   tg::uniform(model.fc1.b, -0.1, 0.1, gen);
//
// Every call takes the generator's next stream; element i of a call is a pure function of
// (seed, stream, i), so results do not depend on threads, buffer length or platform (up to the
// last bit of the platform's log/cos/erf in double, which normals pass through before rounding to
// the buffer's type). The bits differ from PyTorch's (which draws from a sequential mt19937 on the
// CPU): the distributions and their parameters are PyTorch's, the samples are not.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <numbers>
#include <ranges>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <typegrad/core/error.hpp>
#include <typegrad/core/philox.hpp>
#include <typegrad/graph/node.hpp>

namespace typegrad {

// A seed and the next stream: each initialiser call consumes one stream.
struct generator {
    // The Philox key: the same seed gives the same numbers on every platform.
    std::uint64_t seed = 0;
    // The stream the next initialiser call takes.
    std::uint64_t stream = 0;
    // Returns the current stream and advances to the next (called by every initialiser).
    std::uint64_t take_stream() { return stream++; }
};

// torch.nn.init's fan rules for a weight of extents {out, in, k...}: fan_in = in * prod(k),
// fan_out = out * prod(k). Fewer than 2 extents is an error, as in PyTorch.
struct fans {
    // fan_in: in * prod(k).
    std::size_t in;
    // fan_out: out * prod(k).
    std::size_t out;
};
// The fans of a weight with the given extents {out, in, k...} (PyTorch's
// _calculate_fan_in_and_fan_out); throws shape_error for fewer than 2 extents.
inline fans compute_fans(std::span<const std::size_t> extents) {
    if (extents.size() < 2)
        detail::fail<shape_error>({"typegrad: fan in and fan out need at least 2 extents, got ",
                                   extents.size()});
    std::size_t receptive = 1;
    for (std::size_t i = 2; i < extents.size(); ++i) receptive *= extents[i];
    return {extents[1] * receptive, extents[0] * receptive};
}

// The activation a gain is computed for (the strings of torch.nn.init.calculate_gain).
enum class nonlinearity { linear, conv, sigmoid, tanh, relu, leaky_relu, selu };
// Which fan kaiming initialisation preserves: fan_in (the forward's variance, PyTorch's default)
// or fan_out (the backward's).
enum class fan_mode { fan_in, fan_out };

// torch.nn.init.calculate_gain. `param` is leaky_relu's negative slope.
inline double calculate_gain(nonlinearity f, double param = 0.01) {
    switch (f) {
        case nonlinearity::tanh: return 5.0 / 3;
        case nonlinearity::relu: return std::numbers::sqrt2;
        case nonlinearity::leaky_relu: return std::sqrt(2.0 / (1 + param * param));
        case nonlinearity::selu: return 3.0 / 4;
        default: return 1.0;
    }
}

namespace detail {

template <class R>
using init_value_t = std::remove_cvref_t<std::ranges::range_value_t<R>>;

template <class R>
constexpr void check_init_buffer() {
    static_assert(std::is_floating_point_v<init_value_t<R>>,
                  "typegrad: initialisers fill float or double buffers; initialise an f32 copy and convert "
                  "it for bf16/f16.");
}

// Uniform [0, 1) for element i of a stream: floats take one 32-bit word (PyTorch's 24-bit rule),
// doubles two words (53 bits).
template <class T>
T unit_uniform(std::uint64_t i, std::uint64_t stream, philox_key key) {
    if constexpr (std::is_same_v<T, float>) {
        const auto r = philox4x32_10(philox_counter_at(i / 4, stream), key);
        return uniform_float(r[i % 4]);
    } else {
        const auto r = philox4x32_10(philox_counter_at(i / 2, stream), key);
        const std::size_t w = 2 * (i % 2);
        return T(uniform_double(r[w], r[w + 1]));
    }
}

// A standard normal for element i (Box-Muller on the two 53-bit halves of block i; 1 - u keeps
// the logarithm finite).
inline double unit_normal(std::uint64_t i, std::uint64_t stream, philox_key key) {
    const auto r = philox4x32_10(philox_counter_at(i, stream), key);
    const double u1 = uniform_double(r[0], r[1]), u2 = uniform_double(r[2], r[3]);
    return std::sqrt(-2 * std::log(1 - u1)) * std::cos(2 * std::numbers::pi * u2);
}

template <class E>
std::vector<std::size_t> static_extents() {
    using Leaf = typename E::node_type;
    using S = typename Leaf::shape_type;
    static_assert(is_leaf_v<Leaf> && S::is_static,
                  "typegrad: an initialiser given a graph leaf for the fans needs a leaf with a static shape; "
                  "pass the extents instead.");
    return std::vector<std::size_t>(S::extents.begin(), S::extents.end());
}

template <class R>
void check_numel(const R& buf, std::span<const std::size_t> extents, const char* what) {
    std::size_t n = 1;
    for (std::size_t e : extents) n *= e;
    if (n != std::size_t(std::ranges::size(buf)))
        fail<shape_error>({"typegrad: ", what, ": the extents hold ", n, " elements, the buffer ",
                           std::size_t(std::ranges::size(buf))});
}

}  // namespace detail

// The inverse error function in double: Giles' single-precision approximation refined by two
// Newton steps on std::erf. |y| < 1.
inline double erfinv(double y) {
    if (!(y > -1 && y < 1)) {
        if (y == 1) return INFINITY;
        if (y == -1) return -INFINITY;
        return NAN;
    }
    double w = -std::log((1 - y) * (1 + y)), x;
    if (w < 5) {
        w -= 2.5;
        double p = 2.81022636e-08;
        p = 3.43273939e-07 + p * w; p = -3.5233877e-06 + p * w; p = -4.39150654e-06 + p * w;
        p = 0.00021858087 + p * w; p = -0.00125372503 + p * w; p = -0.00417768164 + p * w;
        p = 0.246640727 + p * w; p = 1.50140941 + p * w;
        x = p * y;
    } else {
        w = std::sqrt(w) - 3;
        double p = -0.000200214257;
        p = 0.000100950558 + p * w; p = 0.00134934322 + p * w; p = -0.00367342844 + p * w;
        p = 0.00573950773 + p * w; p = -0.0076224613 + p * w; p = 0.00943887047 + p * w;
        p = 1.00167406 + p * w; p = 2.83297682 + p * w;
        x = p * y;
    }
    for (int k = 0; k < 2; ++k) x -= (std::erf(x) - y) / (2 / std::sqrt(std::numbers::pi) * std::exp(-x * x));
    return x;
}

// torch.nn.init.uniform_: values in [a, b).
template <class R>
void uniform(R&& buf, double a, double b, generator& gen) {
    detail::check_init_buffer<R>();
    using T = detail::init_value_t<R>;
    const std::uint64_t stream = gen.take_stream();
    const philox_key key = philox_key_from_seed(gen.seed);
    std::size_t i = 0;
    for (auto& v : buf) v = T(detail::unit_uniform<T>(i++, stream, key) * T(b - a) + T(a));
}

// torch.nn.init.normal_.
template <class R>
void normal(R&& buf, double mean, double std, generator& gen) {
    detail::check_init_buffer<R>();
    using T = detail::init_value_t<R>;
    const std::uint64_t stream = gen.take_stream();
    const philox_key key = philox_key_from_seed(gen.seed);
    std::size_t i = 0;
    for (auto& v : buf) v = T(mean + std * detail::unit_normal(i++, stream, key));
}

// torch.nn.init.trunc_normal_: a normal(mean, std) restricted to [a, b], by PyTorch's method
// (a uniform between the two CDF values through the inverse CDF), one draw per element.
template <class R>
void trunc_normal(R&& buf, double mean, double std, double a, double b, generator& gen) {
    detail::check_init_buffer<R>();
    using T = detail::init_value_t<R>;
    if (!(a < b) || !(std > 0)) throw error("typegrad: trunc_normal needs a < b and std > 0");
    auto cdf = [](double x) { return (1 + std::erf(x / std::numbers::sqrt2)) / 2; };
    const double lo = 2 * cdf((a - mean) / std) - 1, hi = 2 * cdf((b - mean) / std) - 1;
    const std::uint64_t stream = gen.take_stream();
    const philox_key key = philox_key_from_seed(gen.seed);
    std::size_t i = 0;
    for (auto& v : buf) {
        const double u = lo + (hi - lo) * detail::unit_uniform<double>(i++, stream, key);
        const double x = mean + std * std::numbers::sqrt2 * erfinv(u);
        v = T(std::fmin(std::fmax(x, a), b));
    }
}

// torch.nn.init.xavier_uniform_ / xavier_normal_ (Glorot): std = gain * sqrt(2 / (fan_in + fan_out)).
template <class R>
void xavier_uniform(R&& buf, std::span<const std::size_t> extents, generator& gen, double gain = 1) {
    detail::check_numel(buf, extents, "xavier_uniform");
    const fans f = compute_fans(extents);
    const double bound = std::sqrt(3.0) * gain * std::sqrt(2.0 / double(f.in + f.out));
    uniform(buf, -bound, bound, gen);
}
// torch.nn.init.xavier_normal_: normal with std = gain * sqrt(2 / (fan_in + fan_out)).
template <class R>
void xavier_normal(R&& buf, std::span<const std::size_t> extents, generator& gen, double gain = 1) {
    detail::check_numel(buf, extents, "xavier_normal");
    const fans f = compute_fans(extents);
    normal(buf, 0, gain * std::sqrt(2.0 / double(f.in + f.out)), gen);
}

// torch.nn.init.kaiming_uniform_ / kaiming_normal_ (He): std = gain(nonlinearity, a) / sqrt(fan),
// with PyTorch's defaults (a = 0, fan_in, leaky_relu: gain sqrt(2)).
struct kaiming_options {
    // The negative slope of leaky_relu (PyTorch's `a`).
    double a = 0;
    // The fan the std is computed from (PyTorch's `mode`).
    fan_mode mode = fan_mode::fan_in;
    // The nonlinearity of the gain (PyTorch's `nonlinearity`).
    nonlinearity nonlin = nonlinearity::leaky_relu;
};
namespace detail {
inline double kaiming_std(std::span<const std::size_t> extents, const kaiming_options& o) {
    const fans f = compute_fans(extents);
    const double fan = double(o.mode == fan_mode::fan_in ? f.in : f.out);
    return calculate_gain(o.nonlin, o.a) / std::sqrt(fan);
}
}  // namespace detail
// torch.nn.init.kaiming_uniform_: uniform in +-gain * sqrt(3 / fan), fan and gain from
// kaiming_options (PyTorch's defaults).
template <class R>
void kaiming_uniform(R&& buf, std::span<const std::size_t> extents, generator& gen, kaiming_options o = {}) {
    detail::check_numel(buf, extents, "kaiming_uniform");
    const double bound = std::sqrt(3.0) * detail::kaiming_std(extents, o);
    uniform(buf, -bound, bound, gen);
}
// torch.nn.init.kaiming_normal_: normal with std = gain / sqrt(fan).
template <class R>
void kaiming_normal(R&& buf, std::span<const std::size_t> extents, generator& gen, kaiming_options o = {}) {
    detail::check_numel(buf, extents, "kaiming_normal");
    normal(buf, 0, detail::kaiming_std(extents, o), gen);
}

// The same initialisers with the extents as a list, or taken from a static-shaped graph param.
#define TYPEGRAD_DETAIL_INIT_OVERLOADS(NAME, OPTIONS, DEFAULT)                                                  \
    template <class R>                                                                                  \
    void NAME(R&& buf, std::initializer_list<std::size_t> extents, generator& gen, OPTIONS o = DEFAULT) { \
        NAME(buf, std::span<const std::size_t>(extents.begin(), extents.size()), gen, o);                \
    }                                                                                                   \
    template <class R, expression E>                                                                    \
    void NAME(R&& buf, E, generator& gen, OPTIONS o = DEFAULT) {                                         \
        const std::vector<std::size_t> e = detail::static_extents<E>();                                 \
        NAME(buf, std::span<const std::size_t>(e), gen, o);                                              \
    }
// xavier_uniform with the extents as a list, xavier_uniform(buf, {out, in}, gen), or taken from a
// static-shaped param, xavier_uniform(buf, W, gen) (a shape_error when the sizes differ).
TYPEGRAD_DETAIL_INIT_OVERLOADS(xavier_uniform, double, 1.0)
// xavier_normal with the extents as a list, xavier_normal(buf, {out, in}, gen), or taken from a
// static-shaped param, xavier_normal(buf, W, gen) (a shape_error when the sizes differ).
TYPEGRAD_DETAIL_INIT_OVERLOADS(xavier_normal, double, 1.0)
// kaiming_uniform with the extents as a list, kaiming_uniform(buf, {out, in}, gen), or taken from a
// static-shaped param, kaiming_uniform(buf, W, gen) (a shape_error when the sizes differ).
TYPEGRAD_DETAIL_INIT_OVERLOADS(kaiming_uniform, kaiming_options, {})
// kaiming_normal with the extents as a list, kaiming_normal(buf, {out, in}, gen), or taken from a
// static-shaped param, kaiming_normal(buf, W, gen) (a shape_error when the sizes differ).
TYPEGRAD_DETAIL_INIT_OVERLOADS(kaiming_normal, kaiming_options, {})
#undef TYPEGRAD_DETAIL_INIT_OVERLOADS

}  // namespace typegrad
