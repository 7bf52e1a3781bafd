// Every run-time error leaves every caller buffer byte-identical (inputs, grad buffers, also
// those in accumulate mode, seeds), and the next valid call gives exactly the result it gives
// when nothing failed before it. One section per throw in the library.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <span>
#include <vector>

#include <typegrad/typegrad.hpp>

namespace tg = typegrad;

namespace {

constexpr auto x = tg::param<"x", float, tg::shape<tg::dyn>>;
constexpr auto y = tg::param<"y", float, tg::shape<tg::dyn>>;
constexpr auto w = tg::param<"w", float, tg::shape<2, tg::dyn>>;  // static 2; the dyn axis meets x
constexpr auto loss = tg::log_sum_exp(tg::exp(x) * y) + tg::sum(w * x);

// Byte copies of caller buffers, to compare after a failed call.
class snapshot {
public:
    template <class... Vs>
    explicit snapshot(const Vs&... vs) {
        (add(vs), ...);
    }
    bool unchanged() const {
        for (const auto& e : saved_)
            if (std::memcmp(e.where, e.bytes.data(), e.bytes.size()) != 0) return false;
        return true;
    }

private:
    struct entry {
        const void* where;
        std::vector<unsigned char> bytes;
    };
    template <class T>
    void add(const std::vector<T>& v) {
        const auto* p = reinterpret_cast<const unsigned char*>(v.data());
        saved_.push_back({v.data(), std::vector<unsigned char>(p, p + v.size() * sizeof(T))});
    }
    std::vector<entry> saved_;
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Distinct, recognisable values; grad buffers hold values that accumulation would change.
std::vector<float> filled(std::size_t n, float start, float step) {
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = start + step * float(i);
    return v;
}

struct fixture {
    static constexpr std::size_t n = 5;
    std::vector<float> xd = filled(n, -0.5f, 0.3f), yd = filled(n, 1.f, -0.4f), wd = filled(2 * n, 0.1f, 0.05f);
    std::vector<float> gx = filled(n, 100.f, 1.f), gy = filled(n, 200.f, 1.f), gw = filled(2 * n, 300.f, 1.f);
    // What a valid overwrite call gives before anything has failed.
    float ref_loss = 0;
    std::vector<float> ref_gx, ref_gy, ref_gw;
};

// The value and gradients in double, independently of typegrad.
void check_against_double(const fixture& f) {
    const std::size_t n = fixture::n;
    double m = -INFINITY, s = 0, lin = 0;
    for (std::size_t i = 0; i < n; ++i) m = std::max(m, std::exp(double(f.xd[i])) * f.yd[i]);
    for (std::size_t i = 0; i < n; ++i) s += std::exp(std::exp(double(f.xd[i])) * f.yd[i] - m);
    for (std::size_t r = 0; r < 2; ++r)
        for (std::size_t i = 0; i < n; ++i) lin += double(f.wd[r * n + i]) * f.xd[i];
    CHECK(f.ref_loss == Approx(m + std::log(s) + lin).epsilon(1e-5));
    for (std::size_t i = 0; i < n; ++i) {
        const double e = std::exp(double(f.xd[i]));
        const double soft = std::exp(e * f.yd[i] - m) / s;
        CHECK(f.ref_gx[i] == Approx(soft * e * f.yd[i] + f.wd[i] + f.wd[n + i]).epsilon(1e-5).margin(1e-6));
        CHECK(f.ref_gy[i] == Approx(soft * e).epsilon(1e-5).margin(1e-6));
        CHECK(f.ref_gw[i] == Approx(f.xd[i]).epsilon(1e-6));
        CHECK(f.ref_gw[n + i] == Approx(f.xd[i]).epsilon(1e-6));
    }
}

}  // namespace

TEST_CASE("value_and_grad: every error leaves all buffers untouched", "[reliability][errors]") {
    const auto step = tg::compile(loss, tg::wrt(x, y, w));
    fixture f;
    const std::size_t n = fixture::n;
    {
        std::vector<float> gx(n), gy(n), gw(2 * n);
        f.ref_loss = step.value_and_grad(tg::bind(x, f.xd), tg::bind(y, f.yd), tg::bind(w, f.wd, {2, n}),
                                         tg::grad_into(x, gx), tg::grad_into(y, gy), tg::grad_into(w, gw));
        f.ref_gx = gx;
        f.ref_gy = gy;
        f.ref_gw = gw;
        check_against_double(f);
    }
    const snapshot all(f.xd, f.yd, f.wd, f.gx, f.gy, f.gw);

    // Overwrite and accumulate grad buffers in one call: neither may change on failure.
    auto call = [&](auto bx, auto by, auto bw) {
        return step.value_and_grad(bx, by, bw, tg::grad_into(x, f.gx), tg::grad_into(y, f.gy, tg::accumulate),
                                   tg::grad_into(w, f.gw, tg::accumulate));
    };
    const auto bx = tg::bind(x, f.xd);
    const auto by = tg::bind(y, f.yd);
    const auto bw = tg::bind(w, f.wd, {2, n});
    std::vector<float> short_y(f.yd.begin(), f.yd.end() - 1);
    const snapshot with_short(short_y);

    SECTION("dynamic extents of two operands disagree") {
        CHECK_THROWS_AS(call(bx, tg::bind(y, short_y), bw), tg::shape_error);
        // w's dynamic axis (4) meets x's (5) through broadcasting
        CHECK_THROWS_AS(call(bx, by, tg::bind(w, std::span(f.wd).first(8), {2, 4})), tg::shape_error);
        CHECK(with_short.unchanged());
    }
    SECTION("a static extent contradicted by the bind extents") {
        CHECK_THROWS_AS(call(bx, by, tg::bind(w, f.wd, {5, 2})), tg::shape_error);
        CHECK_THROWS_AS(call(bx, by, tg::bind(w, f.wd.data(), {1, 2 * n})), tg::shape_error);
    }
    SECTION("extents inferred from a buffer that cannot fill the static ones") {
        // bind itself throws: 9 elements cannot be 2 x something
        CHECK_THROWS_AS(tg::bind(w, std::span(f.wd).first(9)), tg::shape_error);
    }
    SECTION("the buffer size disagrees with the extents") {
        CHECK_THROWS_AS(call(tg::bind(x, f.xd, {4}), by, bw), tg::shape_error);
        CHECK_THROWS_AS(call(bx, by, tg::bind(w, f.wd, {2, 4})), tg::shape_error);
        CHECK_THROWS_AS(call(bx, by, tg::bind(w, std::span(f.wd).first(9), {2, n})), tg::shape_error);
    }
    SECTION("a grad buffer of the wrong size") {
        std::vector<float> small(n - 1, 7.f), big(n + 1, 7.f);
        const snapshot extra(small, big);
        CHECK_THROWS_AS(step.value_and_grad(bx, by, bw, tg::grad_into(x, small), tg::grad_into(y, f.gy)), tg::shape_error);
        CHECK_THROWS_AS(step.value_and_grad(bx, by, bw, tg::grad_into(y, f.gy, tg::accumulate), tg::grad_into(x, big, tg::accumulate)),
                        tg::shape_error);
        CHECK_THROWS_AS(step.value_and_grad(bx, by, bw, tg::grad_into(w, std::span(f.gw).first(2 * n - 1))), tg::shape_error);
        CHECK(extra.unchanged());
    }
    SECTION("null pointers") {
        const float* none = nullptr;
        CHECK_THROWS_AS(call(tg::bind(x, none, {n}), by, bw), tg::binding_error);
        CHECK_THROWS_AS(call(bx, by, tg::bind(w, none, {2, n})), tg::binding_error);
        // a null grad pointer: see the [known_ub] test case below
    }
    SECTION("a grad buffer overlapping an input") {
        CHECK_THROWS_AS(step.value_and_grad(bx, by, bw, tg::grad_into(x, f.xd)), tg::aliasing_error);
        CHECK_THROWS_AS(step.value_and_grad(bx, by, bw, tg::grad_into(x, f.yd, tg::accumulate)), tg::aliasing_error);
        // one element of overlap, at either end of a shared buffer
        std::vector<float> shared = filled(3 * n, 1.f, 0.5f);
        const snapshot s(shared);
        const std::span<float> sp(shared);
        CHECK_THROWS_AS(step.value_and_grad(tg::bind(x, sp.first(n)), by, bw, tg::grad_into(y, sp.subspan(n - 1, n))),
                        tg::aliasing_error);
        CHECK_THROWS_AS(step.value_and_grad(tg::bind(x, sp.subspan(n, n)), by, bw, tg::grad_into(y, sp.subspan(1, n), tg::accumulate)),
                        tg::aliasing_error);
        // an input bound by pointer + extents (size unknown to the library until the extents)
        CHECK_THROWS_AS(step.value_and_grad(tg::bind(x, static_cast<const float*>(shared.data()), {n}), by, bw,
                                            tg::grad_into(x, sp.subspan(n - 1, n))),
                        tg::aliasing_error);
        CHECK(s.unchanged());
    }
    SECTION("two grad buffers overlapping each other") {
        std::vector<float> shared = filled(2 * n, 9.f, 1.f);
        const snapshot s(shared);
        const std::span<float> sp(shared);
        CHECK_THROWS_AS(step.value_and_grad(bx, by, bw, tg::grad_into(x, sp.first(n)), tg::grad_into(y, sp.subspan(n - 1, n))),
                        tg::aliasing_error);
        CHECK_THROWS_AS(step.value_and_grad(bx, by, bw, tg::grad_into(x, sp.subspan(1, n), tg::accumulate),
                                            tg::grad_into(y, sp.first(n), tg::accumulate)),
                        tg::aliasing_error);
        CHECK(s.unchanged());
    }
    SECTION("the first error wins: several problems in one call") {
        CHECK_THROWS_AS(step.value_and_grad(tg::bind(x, f.xd, {4}), tg::bind(y, short_y), bw, tg::grad_into(x, f.xd)),
                        tg::error);
    }

    CHECK(all.unchanged());

    // The next valid call gives exactly what it gives when nothing failed before it.
    std::vector<float> gx(n, -1.f), gy(n, -1.f), gw(2 * n, -1.f);
    const float l = step.value_and_grad(bx, by, bw, tg::grad_into(x, gx), tg::grad_into(y, gy), tg::grad_into(w, gw));
    CHECK(same_bits(l, f.ref_loss));
    CHECK(same_bits(gx, f.ref_gx));
    CHECK(same_bits(gy, f.ref_gy));
    CHECK(same_bits(gw, f.ref_gw));
}

TEST_CASE("adjacent buffers and empty tensors are not errors", "[reliability][errors]") {
    const auto step = tg::compile(loss, tg::wrt(x, y, w));
    constexpr std::size_t n = 4;
    // x, y and both grads back to back in one buffer: touching, not overlapping
    std::vector<float> one(4 * n);
    for (std::size_t i = 0; i < 2 * n; ++i) one[i] = 0.1f * float(i);
    std::vector<float> wd(2 * n, 0.5f), gw(2 * n);
    const std::span<float> sp(one);
    CHECK_NOTHROW(step.value_and_grad(tg::bind(x, sp.first(n)), tg::bind(y, sp.subspan(n, n)), tg::bind(w, wd, {2, n}),
                                      tg::grad_into(x, sp.subspan(2 * n, n)), tg::grad_into(y, sp.subspan(3 * n, n)),
                                      tg::grad_into(w, gw)));
    // n = 0: a null pointer is fine where there is nothing to read
    const float* none = nullptr;
    std::vector<float> empty;
    float l = 0;
    CHECK_NOTHROW(l = step.value_and_grad(tg::bind(x, none, {0}), tg::bind(y, empty), tg::bind(w, none, {2, 0}),
                                          tg::grad_into(x, empty)));
    CHECK(l == -INFINITY);  // log_sum_exp of nothing, as torch.logsumexp
}

TEST_CASE("forward and backward: every error leaves all buffers untouched", "[reliability][errors]") {
    const auto step = tg::compile(loss, tg::wrt(x, y, w));
    fixture f;
    const std::size_t n = fixture::n;
    const auto bx = tg::bind(x, f.xd);
    const auto by = tg::bind(y, f.yd);
    const auto bw = tg::bind(w, f.wd, {2, n});
    std::vector<float> rx(n), ry(n), rw(2 * n);
    {
        auto ctx = step.forward(bx, by, bw);
        step.backward(ctx, tg::grad_into(x, rx), tg::grad_into(y, ry), tg::grad_into(w, rw));
    }
    const snapshot all(f.xd, f.yd, f.wd, f.gx, f.gy, f.gw);

    std::vector<float> short_y(f.yd.begin(), f.yd.end() - 1);
    CHECK_THROWS_AS(step.forward(bx, tg::bind(y, short_y), bw), tg::shape_error);
    CHECK_THROWS_AS(step.forward(bx, by, tg::bind(w, f.wd, {5, 2})), tg::shape_error);
    CHECK_THROWS_AS(step.forward(tg::bind(x, static_cast<const float*>(nullptr), {n}), by, bw), tg::binding_error);

    auto ctx = step.forward(bx, by, bw);
    CHECK_THROWS_AS(step.backward(ctx, tg::grad_into(x, std::span(f.gx).first(n - 1))), tg::shape_error);
    CHECK_THROWS_AS(step.backward(ctx, tg::grad_into(y, f.gy, tg::accumulate), tg::grad_into(w, std::span(f.gw).first(n), tg::accumulate)),
                    tg::shape_error);
    CHECK_THROWS_AS(step.backward(ctx, tg::grad_into(x, f.gy, tg::accumulate), tg::grad_into(y, f.gy, tg::accumulate)),
                    tg::aliasing_error);
    CHECK(all.unchanged());

    // The context survives failed backward calls.
    std::vector<float> gx(n, -1.f), gy(n, -1.f), gw(2 * n, -1.f);
    step.backward(ctx, tg::grad_into(x, gx), tg::grad_into(y, gy), tg::grad_into(w, gw));
    CHECK(same_bits(gx, rx));
    CHECK(same_bits(gy, ry));
    CHECK(same_bits(gw, rw));
}

TEST_CASE("backward of a non-scalar output: seed errors leave all buffers untouched", "[reliability][errors]") {
    const auto step = tg::compile(tg::exp(x) * y, tg::wrt(x, y));
    constexpr std::size_t n = 6;
    std::vector<float> xd = filled(n, -1.f, 0.4f), yd = filled(n, 2.f, -0.5f), seed = filled(n, 1.f, 0.25f);
    std::vector<float> gx = filled(n, 50.f, 1.f), gy = filled(n, 60.f, 1.f);
    auto ctx = step.forward(tg::bind(x, xd), tg::bind(y, yd));
    const snapshot all(xd, yd, seed, gx, gy);

    CHECK_THROWS_AS(step.backward(ctx, tg::grad_into(x, gx), tg::seed(std::span(seed).first(n - 1))), tg::shape_error);
    std::vector<float> long_seed(n + 1, 1.f);
    CHECK_THROWS_AS(step.backward(ctx, tg::grad_into(x, gx, tg::accumulate), tg::seed(long_seed)), tg::shape_error);
    // a grad buffer over the seed it reads
    CHECK_THROWS_AS(step.backward(ctx, tg::grad_into(x, seed), tg::seed(seed)), tg::aliasing_error);
    CHECK_THROWS_AS(step.backward(ctx, tg::grad_into(y, gy, tg::accumulate), tg::grad_into(x, std::span(seed)), tg::seed(seed)),
                    tg::aliasing_error);
    CHECK(all.unchanged());

    std::vector<float> out_x(n), out_y(n);
    step.backward(ctx, tg::grad_into(x, out_x), tg::grad_into(y, out_y), tg::seed(seed));
    for (std::size_t i = 0; i < n; ++i) {
        const double e = std::exp(double(xd[i]));
        CHECK(out_x[i] == Approx(seed[i] * e * yd[i]).epsilon(1e-5));
        CHECK(out_y[i] == Approx(seed[i] * e).epsilon(1e-5));
    }
}

// Was a library bug (docs/reliability.md): the aliasing check computed `nullptr + n` for a null
// grad pointer before the null check threw (UBSan: pointer-overflow). Fixed; runs under UBSan.
TEST_CASE("a null grad pointer is a binding_error", "[reliability][errors]") {
    const auto step = tg::compile(loss, tg::wrt(x, y, w));
    fixture f;
    const std::size_t n = fixture::n;
    const auto bx = tg::bind(x, f.xd);
    const auto by = tg::bind(y, f.yd);
    const auto bw = tg::bind(w, f.wd, {2, n});
    const snapshot all(f.xd, f.yd, f.wd, f.gx, f.gy, f.gw);
    CHECK_THROWS_AS(step.value_and_grad(bx, by, bw, tg::grad_into(y, f.gy), tg::grad_into(x, static_cast<float*>(nullptr), n)),
                    tg::binding_error);
    auto ctx = step.forward(bx, by, bw);
    CHECK_THROWS_AS(step.backward(ctx, tg::grad_into(y, f.gy), tg::grad_into(x, static_cast<float*>(nullptr), n)),
                    tg::binding_error);
    CHECK(all.unchanged());
}

// backward(ctx, ...) reads the inputs bound in forward(...): a grad buffer over one of them is
// an aliasing error there too.
TEST_CASE("backward rejects a grad buffer overlapping an input bound in forward", "[reliability][errors]") {
    const auto step = tg::compile(tg::sum(tg::square(x)), tg::wrt(x));
    constexpr std::size_t n = 40;
    std::vector<float> buf(n + 1);
    for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = 1.f + float(i);
    const std::span<float> sp(buf);
    auto ctx = step.forward(tg::bind(x, sp.first(n)));
    const snapshot s(buf);
    // The gradient lands one element after the input: each write clobbers an element still to be read.
    CHECK_THROWS_AS(step.backward(ctx, tg::grad_into(x, sp.subspan(1, n))), tg::aliasing_error);
    CHECK(s.unchanged());
}
