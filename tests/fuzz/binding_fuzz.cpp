// libFuzzer harness for the run-time binding API (how to build and run: docs/reliability.md).
//
// The fuzz bytes pick one of four compiled steps and everything a caller controls at run time:
// dynamic extents (right, wrong, zero or huge; a huge extent is a lie told through the extents,
// never through a buffer's length, which would be the caller's own UB), the binding kind,
// NaN/Inf/subnormal/huge values, misaligned buffers (1..3 elements into an allocation), grad
// buffers overlapping inputs, seeds or each other, accumulate mode, seeds, repeated calls and
// forward/backward splits.
//
// Property, checked against an oracle that knows the documented rules:
//  * a call throws iff it is invalid, the exception is a tg::error subtype (the right one when
//    only one rule is broken), and then every byte of every caller buffer is unchanged;
//  * a valid call changes no byte outside its grad buffers, repeats bit for bit, and, when the
//    inputs are moderate (finite, |x| <= 4), its results match a double-precision reference;
//  * nothing else: no crash, no other exception, ASan/UBSan clean.
//
// No input is skipped: the library bugs this harness found (docs/reliability.md, findings 1 to 4)
// are fixed, and the inputs that hit them are generated like any other.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <typegrad/typegrad.hpp>

namespace tg = typegrad;

namespace {

// TYPEGRAD_FUZZ_VERBOSE=1: print each decoded case (to read a crash input).
bool verbose() {
    static const bool on = std::getenv("TYPEGRAD_FUZZ_VERBOSE") != nullptr;
    return on;
}

[[noreturn]] void violated(const char* what, const std::string& detail = {}) {
    std::fprintf(stderr, "\ntypegrad fuzz: property violated: %s%s%s\n", what, detail.empty() ? "" : ": ",
                 detail.c_str());
    std::abort();
}

constexpr std::size_t dyn = tg::dyn;
constexpr std::size_t max_rank = 3;
constexpr std::size_t huge_numel = std::size_t(1) << 16;  // beyond this, extents are a lie
constexpr double moderate_bound = 4;

// ---- graphs ----------------------------------------------------------------------------------

// A leaf as the oracle sees it: static extents (dyn where dynamic) and, for each dynamic axis,
// the size variable a valid call gives it. Axes sharing a variable meet in an elementwise op.
struct leaf_desc {
    std::size_t rank;
    std::array<std::size_t, max_rank> ext;
    std::array<std::size_t, max_rank> var;
};

std::size_t dyn_count(const leaf_desc& d) {
    std::size_t n = 0;
    for (std::size_t a = 0; a < d.rank; ++a) n += d.ext[a] == dyn;
    return n;
}

using dvec = std::vector<double>;

struct reference_result {
    double loss = 0;
    dvec values;              // non-scalar outputs
    std::vector<dvec> grads;  // one per param, leaf layout
};

double sigmoid(double v) { return 1 / (1 + std::exp(-v)); }

// Float, rank 1: log_sum_exp (three stages) and a mean.
struct graph_vec {
    static constexpr const char* name = "vec";
    using T = float;
    static constexpr auto x = tg::param<"x", float, tg::shape<tg::dyn>>;
    static constexpr auto y = tg::param<"y", float, tg::shape<tg::dyn>>;
    static constexpr auto leaf_exprs = std::tuple{x, y};
    static constexpr std::array<leaf_desc, 2> leaves{{{1, {dyn}, {0}}, {1, {dyn}, {0}}}};
    static constexpr std::array<std::size_t, 2> params{0, 1};
    static constexpr std::size_t vars = 1, max_size = 70;
    static constexpr bool scalar = true;
    static constexpr double rtol = 1e-4;
    static auto output() { return tg::log_sum_exp(tg::tanh(x) * y) + tg::mean(tg::sigmoid(x - y)); }

    static reference_result reference(const std::array<dvec, 2>& in, const std::array<std::array<std::size_t, 3>, 2>&,
                                      const dvec&) {
        const dvec& xs = in[0];
        const dvec& ys = in[1];
        const std::size_t n = xs.size();
        double m = -INFINITY;
        for (std::size_t i = 0; i < n; ++i) m = std::max(m, std::tanh(xs[i]) * ys[i]);
        const double shift = std::isfinite(m) ? m : 0;
        double s = 0, mean = 0;
        for (std::size_t i = 0; i < n; ++i) {
            s += std::exp(std::tanh(xs[i]) * ys[i] - shift);
            mean += sigmoid(xs[i] - ys[i]);
        }
        const double inv = 1 / double(n);
        reference_result r;
        r.loss = shift + std::log(s) + mean * inv;
        r.grads.assign(2, dvec(n));
        for (std::size_t i = 0; i < n; ++i) {
            const double t = std::tanh(xs[i]), p = std::exp(t * ys[i] - shift) / s;
            const double sg = sigmoid(xs[i] - ys[i]), ds = sg * (1 - sg) * inv;
            r.grads[0][i] = p * ys[i] * (1 - t * t) + ds;
            r.grads[1][i] = p * t - ds;
        }
        return r;
    }
};

// Double, rank 2: broadcasting along both axes (static 3, static 1), a static extent to
// contradict, and a max over a computed operand whose ties share the gradient (m * r is exact in
// double, so the reference sees the same ties).
struct graph_mat {
    static constexpr const char* name = "mat";
    using T = double;
    static constexpr auto m = tg::param<"m", double, tg::shape<tg::dyn, 3>>;
    static constexpr auto r = tg::param<"r", double, tg::shape<3>>;
    static constexpr auto c = tg::input<"c", double, tg::shape<tg::dyn, 1>>;
    static constexpr auto leaf_exprs = std::tuple{m, r, c};
    static constexpr std::array<leaf_desc, 3> leaves{{{2, {dyn, 3}, {0}}, {1, {3}, {}}, {2, {dyn, 1}, {0}}}};
    static constexpr std::array<std::size_t, 2> params{0, 1};
    static constexpr std::size_t vars = 1, max_size = 25;
    static constexpr bool scalar = true;
    static constexpr double rtol = 1e-10;
    static auto output() { return tg::sum(tg::sin(m * r + c)) + tg::max(m * r) * tg::mean(tg::cos(r)); }

    static reference_result reference(const std::array<dvec, 3>& in, const std::array<std::array<std::size_t, 3>, 3>& ext,
                                      const dvec&) {
        const dvec &ms = in[0], &rs = in[1], &cs = in[2];
        const std::size_t rows = ext[0][0];
        double mx = -INFINITY, sum_sin = 0, mean_cos = 0;
        for (std::size_t i = 0; i < ms.size(); ++i) mx = std::max(mx, ms[i] * rs[i % 3]);
        for (std::size_t j = 0; j < 3; ++j) mean_cos += std::cos(rs[j]) / 3;
        std::size_t ties = 0;
        for (std::size_t i = 0; i < ms.size(); ++i) ties += ms[i] * rs[i % 3] == mx;
        reference_result res;
        res.grads = {dvec(rows * 3), dvec(3)};
        for (std::size_t i = 0; i < rows; ++i)
            for (std::size_t j = 0; j < 3; ++j) {
                const double mij = ms[i * 3 + j], u = mij * rs[j] + cs[i];
                const double hit = mij * rs[j] == mx ? mean_cos / double(ties) : 0;  // ties share
                sum_sin += std::sin(u);
                res.grads[0][i * 3 + j] = std::cos(u) * rs[j] + hit * rs[j];
                res.grads[1][j] += std::cos(u) * mij + hit * mij;
            }
        for (std::size_t j = 0; j < 3; ++j) res.grads[1][j] -= mx * std::sin(rs[j]) / 3;
        res.loss = sum_sin + mx * mean_cos;
        return res;
    }
};

// Float, non-scalar output: forward, then backward with a seed.
struct graph_seeded {
    static constexpr const char* name = "seeded";
    using T = float;
    static constexpr auto v = tg::param<"v", float, tg::shape<tg::dyn>>;
    static constexpr auto u = tg::input<"u", float, tg::shape<tg::dyn>>;
    static constexpr auto leaf_exprs = std::tuple{v, u};
    static constexpr std::array<leaf_desc, 2> leaves{{{1, {dyn}, {0}}, {1, {dyn}, {0}}}};
    static constexpr std::array<std::size_t, 1> params{0};
    static constexpr std::size_t vars = 1, max_size = 70;
    static constexpr bool scalar = false;
    static constexpr double rtol = 1e-4;
    static auto output() { return tg::exp(tg::tanh(v)) * u; }

    static reference_result reference(const std::array<dvec, 2>& in, const std::array<std::array<std::size_t, 3>, 2>&,
                                      const dvec& seed) {
        reference_result r;
        const std::size_t n = in[0].size();
        r.values.resize(n);
        r.grads = {dvec(n)};
        for (std::size_t i = 0; i < n; ++i) {
            const double t = std::tanh(in[0][i]);
            r.values[i] = std::exp(t) * in[1][i];
            if (i < seed.size()) r.grads[0][i] = seed[i] * r.values[i] * (1 - t * t);
        }
        return r;
    }
};

// Double, rank 3 with two dynamic extents (so a lie can make their product overflow) and an
// input broadcast along the first and last axes.
struct graph_cube {
    static constexpr const char* name = "cube";
    using T = double;
    static constexpr auto t = tg::param<"t", double, tg::shape<tg::dyn, tg::dyn, 2>>;
    static constexpr auto q = tg::input<"q", double, tg::shape<1, tg::dyn, 1>>;
    static constexpr auto leaf_exprs = std::tuple{t, q};
    static constexpr std::array<leaf_desc, 2> leaves{{{3, {dyn, dyn, 2}, {0, 1}}, {3, {1, dyn, 1}, {0, 1}}}};
    static constexpr std::array<std::size_t, 1> params{0};
    static constexpr std::size_t vars = 2, max_size = 9;
    static constexpr bool scalar = true;
    static constexpr double rtol = 1e-10;
    static auto output() { return tg::sum(tg::square(t) * q) * tg::lit<0.5> + tg::log_sum_exp(t); }

    static reference_result reference(const std::array<dvec, 2>& in, const std::array<std::array<std::size_t, 3>, 2>& ext,
                                      const dvec&) {
        const dvec &ts = in[0], &qs = in[1];
        const std::size_t B = ext[0][1];
        double mx = -INFINITY;
        for (double v : ts) mx = std::max(mx, v);
        const double shift = std::isfinite(mx) ? mx : 0;
        double s = 0, quad = 0;
        for (double v : ts) s += std::exp(v - shift);
        reference_result r;
        r.grads = {dvec(ts.size())};
        for (std::size_t i = 0; i < ts.size(); ++i) {  // not over the extents: {2^40, 0, 2} is valid
            const std::size_t b = i / 2 % B;
            quad += ts[i] * ts[i] * qs[b];
            r.grads[0][i] = ts[i] * qs[b] + std::exp(ts[i] - shift) / s;
        }
        r.loss = quad * 0.5 + shift + std::log(s);
        return r;
    }
};

// ---- caller memory ---------------------------------------------------------------------------

// Every buffer is a region of an allocation ("group") of exactly the size its regions need, so
// ASan sees any access past a group; buffers that alias share a group.
template <class T>
struct memory {
    struct group {
        std::unique_ptr<T[]> data;
        std::size_t size = 0;
        std::vector<unsigned char> saved;
    };
    struct region {
        std::size_t group = 0, offset = 0, len = 0;
        bool null = false;
    };
    std::vector<group> groups;
    std::vector<region> regions;

    std::size_t place(std::size_t g, std::size_t offset, std::size_t len) {
        regions.push_back({g, offset, len, false});
        groups[g].size = std::max(groups[g].size, offset + len);
        return regions.size() - 1;
    }
    std::size_t own(std::size_t offset, std::size_t len) {
        groups.emplace_back();
        return place(groups.size() - 1, offset, len);
    }
    void allocate() {
        for (auto& g : groups) g.data.reset(new T[g.size]);
    }
    T* ptr(std::size_t r) const {
        const region& rg = regions[r];
        return rg.null ? nullptr : groups[rg.group].data.get() + rg.offset;
    }
    std::span<T> span(std::size_t r) const { return {ptr(r), regions[r].null ? 0 : regions[r].len}; }
    void save() {
        for (auto& g : groups) {
            const auto* p = reinterpret_cast<const unsigned char*>(g.data.get());
            g.saved.assign(p, p + g.size * sizeof(T));
        }
    }
    T saved_value(std::size_t r, std::size_t i) const {
        T v;
        std::memcpy(&v, groups[regions[r].group].saved.data() + (regions[r].offset + i) * sizeof(T), sizeof(T));
        return v;
    }
    // True when every byte outside the given (writable) regions is as saved.
    bool unchanged_except(const std::vector<std::size_t>& writable) const {
        for (std::size_t gi = 0; gi < groups.size(); ++gi) {
            const group& g = groups[gi];
            std::vector<char> skip(g.size, 0);
            for (std::size_t r : writable)
                if (regions[r].group == gi && !regions[r].null)
                    std::fill_n(skip.begin() + std::ptrdiff_t(regions[r].offset), regions[r].len, 1);
            const auto* now = reinterpret_cast<const unsigned char*>(g.data.get());
            for (std::size_t i = 0; i < g.size; ++i)
                if (!skip[i] && std::memcmp(now + i * sizeof(T), g.saved.data() + i * sizeof(T), sizeof(T)) != 0)
                    return false;
        }
        return true;
    }
};

// ---- the plan of one fuzz case -------------------------------------------------------------

enum class bind_kind { infer, extents, pointer };
enum problem : unsigned { shape_problem = 1, binding_problem = 2, aliasing_problem = 4 };

struct leaf_plan {
    bind_kind kind = bind_kind::extents;
    std::array<std::size_t, max_rank> ext{};  // what the library will see
    std::size_t region = 0;
    bool bind_throws = false;  // tg::bind itself cannot infer the extents
};
struct grad_plan {
    int state = 0;  // 0 absent, 1 overwrite, 2 accumulate
    std::size_t region = 0;
};

std::optional<std::size_t> numel(const std::array<std::size_t, max_rank>& e, std::size_t rank) {
    if (std::find(e.begin(), e.begin() + rank, std::size_t(0)) != e.begin() + rank) return 0;
    std::size_t n = 1;
    for (std::size_t a = 0; a < rank; ++a)
        if (__builtin_mul_overflow(n, e[a], &n)) return std::nullopt;
    return n;
}

// Mostly exact, sometimes a few elements off.
std::size_t perturb_length(FuzzedDataProvider& fdp, std::size_t n) {
    const int d = fdp.ConsumeIntegralInRange<int>(-8, 8);
    if (d >= -5 && d <= 5) return n;
    const std::size_t k = std::size_t(std::abs(d) - 5);
    return d < 0 ? (n >= k ? n - k : n + k) : n + k;
}

template <class T>
T special_value(int kind, bool negative) {
    using lim = std::numeric_limits<T>;
    T v = 0;
    switch (kind) {
        case 0: v = T(0); break;
        case 1: v = lim::denorm_min() * T(3); break;
        case 2: v = lim::quiet_NaN(); break;
        case 3: v = lim::infinity(); break;
        case 4: v = lim::max() / T(2); break;
        default: v = lim::min(); break;  // smallest normal
    }
    return negative ? -v : v;
}

struct splitmix {
    std::uint64_t s;
    std::uint64_t next() {
        std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    double uniform(double lo, double hi) { return lo + (hi - lo) * double(next() >> 11) * 0x1.0p-53; }
};

template <int S, class E, class T>
auto grad_arg(E e, T* p, std::size_t n) {
    if constexpr (S == 0) return std::tuple<>{};
    else if constexpr (S == 1) return std::tuple{tg::grad_into(e, p, n)};
    else return std::tuple{tg::grad_into(e, std::span<T>(p, n), tg::accumulate)};
}

template <class E, class T>
auto make_bind(E e, const leaf_plan& lp, std::span<T> buf) {
    using S = typename E::shape_type;
    std::array<std::size_t, S::rank> ext{};
    for (std::size_t a = 0; a < S::rank; ++a) ext[a] = lp.ext[a];
    const std::span<const T> in(buf.data(), buf.size());
    if constexpr (S::dyn_count <= 1)
        if (lp.kind == bind_kind::infer) return tg::bind(e, in);
    if (lp.kind == bind_kind::pointer) return tg::bind(e, static_cast<const T*>(buf.data()), ext);
    return tg::bind(e, in, ext);
}

// Grad states per param: 0 absent, 1 overwrite, 2 accumulate. Each combination is its own
// instantiation of value_and_grad/backward (compile time), so only a few are used: all params
// alike, or the first one different from the rest.
template <std::size_t P>
constexpr std::array<int, P> grad_states(int combo) {
    std::array<int, P> s{};
    s.fill(combo < 3 ? combo : 1);
    if (combo == 3) s[0] = 2;
    if (combo == 4) s[0] = 0;
    return s;
}
template <std::size_t P>
constexpr int grad_combos = P == 1 ? 3 : 5;

template <int S>
using state_c = std::integral_constant<int, S>;
template <std::size_t P, int Combo>
auto state_constants() {
    constexpr std::array<int, P> s = grad_states<P>(Combo);
    return [&]<std::size_t... Ks>(std::index_sequence<Ks...>) { return std::tuple<state_c<s[Ks]>...>{}; }(
        std::make_index_sequence<P>{});
}
template <std::size_t P, class F>
void dispatch_states(int combo, F&& f) {
    auto call = [&](auto constants) { std::apply(f, constants); };
    switch (combo) {
        case 0: call(state_constants<P, 0>()); break;
        case 1: call(state_constants<P, 1>()); break;
        case 2: call(state_constants<P, 2>()); break;
        case 3: if constexpr (P > 1) call(state_constants<P, 3>()); break;
        default: if constexpr (P > 1) call(state_constants<P, 4>()); break;
    }
}

template <class Step, class Binds>
struct forward_result;
template <class Step, class... Bs>
struct forward_result<Step, std::tuple<Bs...>> {
    using type = decltype(std::declval<const Step&>().forward(std::declval<const Bs&>()...));
};

enum class outcome { ok, shape, binding, aliasing, other_tg };
const char* name(outcome o) {
    switch (o) {
        case outcome::ok: return "success";
        case outcome::shape: return "shape_error";
        case outcome::binding: return "binding_error";
        case outcome::aliasing: return "aliasing_error";
        default: return "another tg::error";
    }
}

template <class F>
outcome attempt(F&& f) {
    try {
        f();
        return outcome::ok;
    } catch (const tg::shape_error&) {
        return outcome::shape;
    } catch (const tg::binding_error&) {
        return outcome::binding;
    } catch (const tg::aliasing_error&) {
        return outcome::aliasing;
    } catch (const tg::error&) {
        return outcome::other_tg;
    } catch (const std::exception& e) {
        violated("an exception that is not a tg::error", e.what());
    } catch (...) {
        violated("an exception that is not a std::exception");
    }
}

// `problems`: rules the call breaks for sure; `maybe_alias`: the library may also see an
// overlap (an empty range whose address lies inside a grad buffer), which is fine either way.
void judge(const char* where, outcome got, unsigned problems, bool maybe_alias) {
    if (got == outcome::ok) {
        if (problems != 0) violated(where, "an invalid call succeeded (problems " + std::to_string(problems) + ")");
        return;
    }
    if (problems == 0 && !(maybe_alias && got == outcome::aliasing))
        violated(where, std::string("a valid call threw ") + name(got));
    const outcome want = problems == shape_problem      ? outcome::shape
                         : problems == binding_problem  ? outcome::binding
                         : problems == aliasing_problem ? outcome::aliasing
                                                        : got;  // several: any of them
    if (problems != 0 && got != want && !(maybe_alias && got == outcome::aliasing))
        violated(where, std::string("expected ") + name(want) + ", got " + name(got));
}

bool close(double got, double want, double rtol) {
    if (!std::isfinite(want)) return !std::isfinite(got);  // both overflowed or undefined
    return std::isfinite(got) && std::abs(got - want) <= rtol * (1 + std::abs(want));
}

template <class G>
void run(FuzzedDataProvider& fdp) {
    using T = typename G::T;
    constexpr std::size_t L = G::leaves.size();
    constexpr std::size_t P = G::params.size();
    memory<T> mem;

    // Sizes, then each leaf: extents (maybe a lie), binding kind, buffer length, placement.
    std::array<std::size_t, G::vars> var{};
    for (auto& v : var) v = fdp.ConsumeIntegralInRange<std::size_t>(0, G::max_size);
    std::array<leaf_plan, L> lp{};
    for (std::size_t i = 0; i < L; ++i) {
        const leaf_desc& d = G::leaves[i];
        leaf_plan& p = lp[i];
        for (std::size_t a = 0; a < d.rank; ++a) p.ext[a] = d.ext[a] == dyn ? var[d.var[a]] : d.ext[a];
        const int lie = fdp.ConsumeIntegralInRange<int>(0, 15);
        if (lie >= 11 && d.rank > 0) {
            const std::size_t a = fdp.ConsumeIntegralInRange<std::size_t>(0, d.rank - 1);
            if (lie <= 12) p.ext[a] = fdp.ConsumeIntegralInRange<std::size_t>(0, 9);
            else if (lie <= 14) p.ext[a] = std::size_t(1) << fdp.ConsumeIntegralInRange<int>(16, 63);
            else p.ext[a] = fdp.ConsumeIntegral<std::size_t>();  // SIZE_MAX (== tg::dyn) included
        }
        p.kind = static_cast<bind_kind>(fdp.ConsumeIntegralInRange<int>(0, 2));
        if (p.kind == bind_kind::infer && dyn_count(d) > 1) p.kind = bind_kind::extents;
        const auto n = numel(p.ext, d.rank);
        const bool huge = !n || *n > huge_numel;
        if (p.kind == bind_kind::pointer && huge) p.kind = bind_kind::extents;  // a pointer cannot lie
        const std::size_t offset = fdp.ConsumeIntegralInRange<std::size_t>(0, 3);
        if (p.kind == bind_kind::pointer) {
            const bool null = fdp.ConsumeIntegralInRange<int>(0, 7) == 0;
            p.region = mem.own(offset, null ? 0 : *n);
            mem.regions[p.region].null = null;
            continue;
        }
        const std::size_t len = perturb_length(fdp, huge ? fdp.ConsumeIntegralInRange<std::size_t>(0, 64) : *n);
        p.region = mem.own(offset, len);
        if (p.kind == bind_kind::infer) {  // as tg::bind does it
            std::size_t fixed = 1;
            for (std::size_t a = 0; a < d.rank; ++a) fixed *= d.ext[a] == dyn ? 1 : d.ext[a];
            for (std::size_t a = 0; a < d.rank; ++a) p.ext[a] = d.ext[a];
            if (dyn_count(d) == 1) {
                p.bind_throws = fixed == 0 || len % fixed != 0;
                for (std::size_t a = 0; a < d.rank; ++a)
                    if (d.ext[a] == dyn) p.ext[a] = p.bind_throws ? 0 : len / fixed;
            }
        }
    }

    // Grad buffers: absent, overwrite or accumulate; own memory or overlapping something.
    std::array<grad_plan, P> gp{};
    const int combo = fdp.ConsumeIntegralInRange<int>(0, grad_combos<P> - 1);
    const std::array<int, P> states = grad_states<P>(combo);
    std::vector<std::size_t> grad_regions;
    for (std::size_t k = 0; k < P; ++k) {
        const std::size_t li = G::params[k];
        gp[k].state = states[k];
        if (gp[k].state == 0) continue;
        const auto n = numel(lp[li].ext, G::leaves[li].rank);
        const std::size_t len =
            perturb_length(fdp, !n || *n > huge_numel ? fdp.ConsumeIntegralInRange<std::size_t>(0, 64) : *n);
        const int where = fdp.ConsumeIntegralInRange<int>(0, 11);
        if (where <= 7 || (where == 10 && grad_regions.empty())) {
            gp[k].region = mem.own(fdp.ConsumeIntegralInRange<std::size_t>(0, 3), len);
        } else {
            // somewhere in (or just past) the group of an input or of an earlier grad buffer
            const std::size_t target = where == 10 ? grad_regions[fdp.ConsumeIntegralInRange<std::size_t>(0, grad_regions.size() - 1)]
                                                   : lp[fdp.ConsumeIntegralInRange<std::size_t>(0, L - 1)].region;
            const std::size_t g = mem.regions[target].group;
            gp[k].region = mem.place(g, fdp.ConsumeIntegralInRange<std::size_t>(0, mem.groups[g].size + 2), len);
        }
        if (fdp.ConsumeIntegralInRange<int>(0, 15) == 0 && (gp[k].state == 1 || len == 0))
            mem.regions[gp[k].region].null = true;
        grad_regions.push_back(gp[k].region);
    }

    const bool split = !G::scalar || fdp.ConsumeBool();
    const int repeats = fdp.ConsumeIntegralInRange<int>(1, 3);
    std::size_t seed_region = 0;
    std::size_t out_numel = 0;
    if constexpr (!G::scalar) {
        out_numel = lp[0].ext[0];  // the output has the shape of its (equal) operands
        const std::size_t len = perturb_length(fdp, out_numel <= huge_numel ? out_numel : 8);
        if (fdp.ConsumeIntegralInRange<int>(0, 7) == 0 && !grad_regions.empty()) {
            const std::size_t g = mem.regions[grad_regions[0]].group;
            seed_region = mem.place(g, fdp.ConsumeIntegralInRange<std::size_t>(0, mem.groups[g].size + 2), len);
        } else {
            seed_region = mem.own(fdp.ConsumeIntegralInRange<std::size_t>(0, 3), len);
        }
    }

    // Contents: moderate values, then a few special ones anywhere (grad buffers included).
    mem.allocate();
    splitmix rng{fdp.ConsumeIntegral<std::uint64_t>()};
    for (auto& g : mem.groups)
        for (std::size_t i = 0; i < g.size; ++i) g.data[i] = T(rng.uniform(-moderate_bound, moderate_bound));
    const int specials = fdp.ConsumeIntegralInRange<int>(0, 8) - 4;  // none half of the time
    for (int s = 0; s < specials; ++s) {
        const std::size_t r = fdp.ConsumeIntegralInRange<std::size_t>(0, mem.regions.size() - 1);
        const int kind = fdp.ConsumeIntegralInRange<int>(0, 5);
        const bool negative = fdp.ConsumeBool();
        if (mem.regions[r].len != 0 && !mem.regions[r].null)
            mem.ptr(r)[fdp.ConsumeIntegralInRange<std::size_t>(0, mem.regions[r].len - 1)] = special_value<T>(kind, negative);
    }
    mem.save();

    if (verbose()) {
        std::fprintf(stderr, "case: graph %s, %s, %d call(s), grad combo %d\n", G::name, split ? "forward/backward" : "value_and_grad",
                     repeats, combo);
        auto show = [&](const char* what, std::size_t r) {
            const auto& rg = mem.regions[r];
            std::fprintf(stderr, "  %s: group %zu offset %zu length %zu%s\n", what, rg.group, rg.offset, rg.len, rg.null ? " null" : "");
        };
        for (std::size_t i = 0; i < L; ++i) {
            std::fprintf(stderr, "  leaf %zu: kind %d extents", i, int(lp[i].kind));
            for (std::size_t a = 0; a < G::leaves[i].rank; ++a) std::fprintf(stderr, " %zu", lp[i].ext[a]);
            std::fprintf(stderr, "\n");
            show("  buffer", lp[i].region);
        }
        for (std::size_t k = 0; k < P; ++k)
            if (gp[k].state != 0) show(gp[k].state == 1 ? "grad (overwrite)" : "grad (accumulate)", gp[k].region);
        if constexpr (!G::scalar) show("seed", seed_region);
    }

    // ---- the oracle ----
    unsigned leaf_problems = 0;
    for (std::size_t i = 0; i < L; ++i) {
        const leaf_desc& d = G::leaves[i];
        const auto& rg = mem.regions[lp[i].region];
        const auto count = numel(lp[i].ext, d.rank);
        const std::size_t n = count.value_or(0);
        if (lp[i].bind_throws) leaf_problems |= shape_problem;
        // an element count (or byte count) that cannot be represented
        if (!count || *count > std::size_t(std::numeric_limits<std::ptrdiff_t>::max()) / 2 / sizeof(T))
            leaf_problems |= shape_problem;
        for (std::size_t a = 0; a < d.rank; ++a)
            if ((d.ext[a] != dyn && lp[i].ext[a] != d.ext[a]) || lp[i].ext[a] == dyn) leaf_problems |= shape_problem;
        if (lp[i].kind == bind_kind::pointer && rg.null && n != 0) leaf_problems |= binding_problem;
        if (lp[i].kind != bind_kind::pointer && rg.len != n) leaf_problems |= shape_problem;
    }
    for (std::size_t v = 0; v < G::vars; ++v) {  // dynamic extents never broadcast
        std::optional<std::size_t> seen;
        for (std::size_t i = 0; i < L; ++i)
            for (std::size_t a = 0; a < G::leaves[i].rank; ++a)
                if (G::leaves[i].ext[a] == dyn && G::leaves[i].var[a] == v) {
                    if (seen && *seen != lp[i].ext[a]) leaf_problems |= shape_problem;
                    seen = lp[i].ext[a];
                }
    }
    unsigned grad_problems = 0;
    for (std::size_t k = 0; k < P; ++k) {
        if (gp[k].state == 0) continue;
        const std::size_t li = G::params[k];
        const std::size_t n = numel(lp[li].ext, G::leaves[li].rank).value_or(0);
        const auto& rg = mem.regions[gp[k].region];
        if (rg.len != n) grad_problems |= shape_problem;
        if (rg.null && n != 0) grad_problems |= binding_problem;
    }
    const bool any_grad = std::any_of(states.begin(), states.end(), [](int s) { return s != 0; });
    if constexpr (!G::scalar)  // without a gradient to compute, backward reads no seed
        if (any_grad && mem.regions[seed_region].len != out_numel) grad_problems |= shape_problem;

    // Overlaps, as byte ranges. `strict`: a real overlap. `loose`: the library's test
    // (a0 < b1 && b0 < a1), which also fires for an empty range strictly inside another.
    struct range {
        const unsigned char *lo, *hi;
    };
    auto range_of = [&](std::size_t r, std::size_t n) {
        const auto* p = reinterpret_cast<const unsigned char*>(mem.ptr(r));
        return range{p, p == nullptr ? p : p + n * sizeof(T)};
    };
    auto strict = [](range a, range b) { return a.lo < a.hi && b.lo < b.hi && a.lo < b.hi && b.lo < a.hi; };
    auto loose = [](range a, range b) { return a.lo < b.hi && b.lo < a.hi; };
    std::vector<range> inputs, seeds, grads;
    for (std::size_t i = 0; i < L; ++i) {
        const auto& rg = mem.regions[lp[i].region];
        inputs.push_back(range_of(lp[i].region, lp[i].kind == bind_kind::pointer
                                                    ? numel(lp[i].ext, G::leaves[i].rank).value_or(0)
                                                    : rg.len));
    }
    if constexpr (!G::scalar) seeds.push_back(range_of(seed_region, mem.regions[seed_region].len));
    inputs.insert(inputs.end(), seeds.begin(), seeds.end());
    bool alias = false, maybe_alias = false;
    for (std::size_t k = 0; k < P; ++k) {
        if (gp[k].state == 0) continue;
        const range g = range_of(gp[k].region, mem.regions[gp[k].region].len);
        if (g.lo != g.hi) {
            // backward reads the inputs bound in forward too
            for (const range& in : inputs) {
                alias |= strict(g, in);
                maybe_alias |= loose(g, in);
            }
            for (const range& other : grads) {
                alias |= strict(g, other);
                maybe_alias |= loose(g, other);
            }
        }
        grads.push_back(g);
    }
    if (alias) grad_problems |= aliasing_problem;
    maybe_alias &= !alias;

    // ---- the calls ----
    const auto step = [&]<std::size_t... Ks>(std::index_sequence<Ks...>) {
        return tg::compile(G::output(), tg::wrt(std::get<G::params[Ks]>(G::leaf_exprs)...));
    }(std::make_index_sequence<P>{});
    auto binds = [&] {
        return [&]<std::size_t... Is>(std::index_sequence<Is...>) {
            return std::tuple{make_bind(std::get<Is>(G::leaf_exprs), lp[Is], mem.span(lp[Is].region))...};
        }(std::make_index_sequence<L>{});
    };
    std::vector<std::vector<T>> first(P);  // overwrite results of the first call, for the repeats
    auto check_success = [&](const char* where, int call) {
        if (!mem.unchanged_except(grad_regions)) violated(where, "a valid call changed a byte outside its grad buffers");
        for (std::size_t k = 0; k < P; ++k) {
            if (gp[k].state != 1) continue;
            const auto s = mem.span(gp[k].region);
            if (call == 0) first[k].assign(s.begin(), s.end());
            else if (!s.empty() && std::memcmp(first[k].data(), s.data(), s.size() * sizeof(T)) != 0)
                violated(where, "a repeated call gave different bits");
        }
    };

    // The reference, when every value the call reads (and every accumulate start) is moderate.
    auto moderate = [&](std::size_t r) {
        for (std::size_t i = 0; i < mem.regions[r].len && !mem.regions[r].null; ++i) {
            const double v = double(mem.saved_value(r, i));
            if (!std::isfinite(v) || std::abs(v) > moderate_bound) return false;
        }
        return true;
    };
    bool all_moderate = true;
    for (std::size_t i = 0; i < L; ++i) all_moderate &= moderate(lp[i].region);
    if constexpr (!G::scalar) all_moderate &= moderate(seed_region);
    std::optional<reference_result> ref;
    auto reference = [&]() -> const reference_result& {
        if (!ref) {
            std::array<dvec, L> in;
            std::array<std::array<std::size_t, 3>, L> ext{};
            for (std::size_t i = 0; i < L; ++i) {
                for (std::size_t a = 0; a < G::leaves[i].rank; ++a) ext[i][a] = lp[i].ext[a];
                for (std::size_t j = 0; j < mem.regions[lp[i].region].len; ++j)
                    in[i].push_back(double(mem.saved_value(lp[i].region, j)));
            }
            dvec seed;
            if constexpr (!G::scalar)
                for (std::size_t j = 0; j < mem.regions[seed_region].len; ++j)
                    seed.push_back(double(mem.saved_value(seed_region, j)));
            ref = G::reference(in, ext, seed);
        }
        return *ref;
    };
    auto check_value = [&](const char* what, double got, double want) {
        if (!close(got, want, G::rtol))
            violated(what, "got " + std::to_string(got) + ", the double reference says " + std::to_string(want));
    };
    auto check_grads = [&](int calls) {
        if (!all_moderate) return;
        for (std::size_t k = 0; k < P; ++k) {
            if (gp[k].state == 0 || (gp[k].state == 2 && !moderate(gp[k].region))) continue;
            const auto s = mem.span(gp[k].region);
            const dvec& want = reference().grads[k];
            for (std::size_t i = 0; i < s.size(); ++i) {
                const double start = gp[k].state == 2 ? double(mem.saved_value(gp[k].region, i)) : 0;
                const double scale = gp[k].state == 2 ? calls : 1;
                check_value("gradient", double(s[i]), start + scale * want[i]);
            }
        }
    };

    dispatch_states<P>(combo, [&](auto... cs) {
        auto grad_args = [&] {
            return [&]<std::size_t... Ks>(std::index_sequence<Ks...>) {
                return std::tuple_cat(grad_arg<decltype(cs)::value>(std::get<G::params[Ks]>(G::leaf_exprs),
                                                                    mem.ptr(gp[Ks].region),
                                                                    mem.regions[gp[Ks].region].len)...);
            }(std::make_index_sequence<P>{});
        };
        if constexpr (G::scalar) {
            if (!split) {
                T loss{};
                for (int call = 0; call < repeats; ++call) {
                    const outcome o = attempt([&] {
                        loss = std::apply([&](const auto&... a) { return step.value_and_grad(a...); },
                                          std::tuple_cat(binds(), grad_args()));
                    });
                    judge("value_and_grad", o, leaf_problems | grad_problems, maybe_alias);
                    if (o != outcome::ok) {
                        if (!mem.unchanged_except({})) violated("value_and_grad", "a failed call changed a buffer");
                        return;
                    }
                    check_success("value_and_grad", call);
                }
                if (all_moderate) check_value("loss", double(loss), reference().loss);
                check_grads(repeats);
                return;
            }
        }
        // forward, then backward `repeats` times
        std::optional<typename forward_result<decltype(step), decltype(binds())>::type> ctx;
        const outcome fo = attempt([&] { ctx.emplace(std::apply([&](const auto&... b) { return step.forward(b...); }, binds())); });
        judge("forward", fo, leaf_problems, false);
        if (!mem.unchanged_except({})) violated("forward", "forward changed a buffer");
        if (fo != outcome::ok) return;
        if constexpr (G::scalar) {
            if (all_moderate) check_value("loss", double(ctx->value()), reference().loss);
        } else {
            const auto vals = ctx->values();
            if (vals.size() != out_numel) violated("forward", "values() has the wrong size");
            if (all_moderate)
                for (std::size_t i = 0; i < vals.size(); ++i) check_value("output", double(vals[i]), reference().values[i]);
        }
        for (int call = 0; call < repeats; ++call) {
            const outcome o = attempt([&] {
                if constexpr (G::scalar) {
                    std::apply([&](const auto&... g) { step.backward(*ctx, g...); }, grad_args());
                } else {
                    const std::span<const T> seed(mem.ptr(seed_region), mem.regions[seed_region].len);
                    std::apply([&](const auto&... g) { step.backward(*ctx, g..., tg::seed(seed)); }, grad_args());
                }
            });
            judge("backward", o, grad_problems, maybe_alias);
            if (o != outcome::ok) {
                if (!mem.unchanged_except({})) violated("backward", "a failed call changed a buffer");
                return;
            }
            check_success("backward", call);
        }
        check_grads(repeats);
    });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    FuzzedDataProvider fdp(data, size);
    switch (fdp.ConsumeIntegralInRange<int>(0, 3)) {
        case 0: run<graph_vec>(fdp); break;
        case 1: run<graph_mat>(fdp); break;
        case 2: run<graph_seeded>(fdp); break;
        default: run<graph_cube>(fdp); break;
    }
    return 0;
}
