// typegrad_ops_bench: forward + backward of single ops (conv2d, layer_norm, causal attention,
// embedding, a fused pointwise chain, log_softmax), typegrad against LibTorch eager, at 1 thread and at all hardware threads. Each
// workload is loss = sum(op(inputs) * r) with a fixed random r, gradients into every float input,
// the same numbers on both sides; the two results are compared once before timing. Steps of the
// two implementations alternate (warm-up first) so that a change of the machine's load hits both,
// and the whole list is run `rounds` times so that a busy minute does not land on one workload
// only. Times are medians of all timed steps of all rounds; the ratio is the median of the rounds'
// ratios (each a quotient of that round's medians), shown with their range. Prints a Markdown table.
//
//   typegrad_ops_bench [--steps N] [--rounds R] [--threads 1,2]
//                      [--only conv2d|layer_norm|attention|embedding|pointwise|log_softmax] [--quick] [--profile typegrad|torch]
#include "ops.hpp"
#include "../step_timing.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace ops {

namespace {
std::string str(std::size_t v) { return std::to_string(v); }
}  // namespace

std::string config::name() const {
    switch (kind) {
        case op::conv2d: return "conv2d 3x3 N=" + str(n) + " C=" + str(c) + " " + str(s) + "x" + str(s);
        case op::layer_norm: return "layer_norm " + str(n) + "x" + str(d);
        case op::attention: return "attention causal B*H=" + str(n) + " T=" + str(t) + " d=" + str(head_dim);
        case op::embedding: return "embedding V=" + str(v) + " D=" + str(d) + " ids=" + str(n);
        case op::pointwise: return "pointwise tanh(x)*exp(-x^2) n=" + str(n);
        case op::log_softmax: return "log_softmax " + str(n) + "x" + str(d);
    }
    return "?";
}

data make_data(const config& c) {
    std::mt19937 rng(unsigned(c.n * 131 + c.c * 17 + c.s + c.d * 7 + c.t * 3 + c.v));
    std::normal_distribution<float> n01(0.f, 1.f);
    const auto normal = [&](std::size_t n, float scale, float shift = 0.f) {
        std::vector<float> v(n);
        for (float& x : v) x = shift + scale * n01(rng);
        return v;
    };
    data out;
    const std::size_t d = config::head_dim;
    switch (c.kind) {
        case op::conv2d: {
            const std::size_t xs = c.n * c.c * c.s * c.s;
            out.floats = {normal(xs, 1.f), normal(c.c * c.c * 9, 1.f / std::sqrt(float(c.c * 9))), normal(c.c, 0.1f),
                          normal(xs, 1.f)};
            break;
        }
        case op::layer_norm:
            out.floats = {normal(c.n * c.d, 2.f, 0.5f), normal(c.d, 0.1f, 1.f), normal(c.d, 0.1f), normal(c.n * c.d, 1.f)};
            break;
        case op::attention:
            for (int i = 0; i < 4; ++i) out.floats.push_back(normal(c.n * c.t * d, 1.f));
            break;
        case op::embedding: {
            out.floats = {normal(c.v * c.d, 1.f), normal(c.n * c.d, 1.f)};
            std::uniform_int_distribution<std::int32_t> id(0, std::int32_t(c.v) - 1);
            for (std::size_t i = 0; i < c.n; ++i) out.ids.push_back(id(rng));
            break;
        }
        case op::pointwise: out.floats = {normal(c.n, 1.f), normal(c.n, 1.f)}; break;
        case op::log_softmax: out.floats = {normal(c.n * c.d, 2.f), normal(c.n * c.d, 1.f)}; break;
    }
    return out;
}

}  // namespace ops

namespace {

using bench_timing::median;
using bench_timing::sample;

sample time_step(ops::workload& w) {
    volatile float loss = 0;
    float l = 0;
    const sample s = bench_timing::time_call([&] { return w.step(); }, l);
    loss = l;  // kept, so the step is not optimised away
    (void)loss;
    return s;
}

struct samples {
    std::vector<double> a_wall, a_cpu, b_wall, b_cpu;
    std::vector<double> ratios;  // b / a of each round's medians
};

// Alternates steps of a and b (which goes first alternates too) after `warmup` steps of each;
// appends the timed steps to `out`.
void compare(ops::workload& a, ops::workload& b, int warmup, int steps, samples& out) {
    for (int i = 0; i < warmup; ++i) time_step(a), time_step(b);
    std::vector<double> aw, bw;
    for (int i = 0; i < steps; ++i) {
        sample sa, sb;
        if (i % 2 == 0) sa = time_step(a), sb = time_step(b);
        else sb = time_step(b), sa = time_step(a);
        aw.push_back(sa.wall), bw.push_back(sb.wall);
        out.a_cpu.push_back(sa.cpu), out.b_cpu.push_back(sb.cpu);
    }
    out.ratios.push_back(median(bw) / median(aw));
    out.a_wall.insert(out.a_wall.end(), aw.begin(), aw.end());
    out.b_wall.insert(out.b_wall.end(), bw.begin(), bw.end());
}

// Relative L2 error of a against b.
double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return INFINITY;
    double num = 0, den = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        num += (double(a[i]) - double(b[i])) * (double(a[i]) - double(b[i]));
        den += double(b[i]) * double(b[i]);
    }
    return std::sqrt(num / std::max(den, 1e-300));
}

std::vector<std::size_t> parse_list(const char* s) {
    std::vector<std::size_t> v;
    for (const char* p = s; *p != '\0';) {
        char* end = nullptr;
        v.push_back(std::strtoul(p, &end, 10));
        if (end == p) break;
        p = *end == ',' ? end + 1 : end;
    }
    return v;
}

}  // namespace

int main(int argc, char** argv) {
    int steps = 9, warmup = 2, rounds = 3;
    std::vector<std::size_t> threads{1, std::max<std::size_t>(1, std::thread::hardware_concurrency())};
    std::string only, profile;
    bool quick = false;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = std::atoi(argv[++i]);
        else if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = std::max(1, std::atoi(argv[++i]));
        else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) threads = parse_list(argv[++i]);
        else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (!std::strcmp(argv[i], "--quick")) quick = true;
        else if (!std::strcmp(argv[i], "--profile") && i + 1 < argc) profile = argv[++i];
        else {
            std::fprintf(stderr,
                         "usage: %s [--steps N] [--rounds R] [--threads 1,2] [--only conv2d|layer_norm|attention|embedding|pointwise|log_softmax] "
                         "[--quick] [--profile typegrad|torch]\n",
                         argv[0]);
            return 2;
        }
    }
    using ops::op;
    std::vector<ops::config> all;
    for (auto [c, s] : {std::pair{64, 56}, {128, 28}, {256, 14}})
        all.push_back({.kind = op::conv2d, .n = 8, .c = std::size_t(c), .s = std::size_t(s)});
    all.push_back({.kind = op::layer_norm, .n = 4096, .d = 768});
    all.push_back({.kind = op::layer_norm, .n = 16384, .d = 256});
    for (auto [bh, t] : {std::pair{64, 128}, {32, 256}, {16, 512}, {8, 1024}})
        all.push_back({.kind = op::attention, .n = std::size_t(bh), .t = std::size_t(t)});
    all.push_back({.kind = op::embedding, .n = 4096, .d = 512, .v = 8192});
    all.push_back({.kind = op::embedding, .n = 16384, .d = 512, .v = 8192});
    all.push_back({.kind = op::pointwise, .n = std::size_t(1) << 18});
    all.push_back({.kind = op::pointwise, .n = std::size_t(1) << 22});
    all.push_back({.kind = op::log_softmax, .n = 4096, .d = 1024});
    all.push_back({.kind = op::log_softmax, .n = 16384, .d = 256});
    std::vector<ops::config> run;
    for (const ops::config& c : all) {
        const std::string name = c.name();
        if (!only.empty() && name.rfind(only, 0) != 0) continue;
        if (quick && !run.empty() && run.back().kind == c.kind) continue;  // the first size of each op
        run.push_back(c);
    }

    if (!profile.empty()) {  // one side alone, for perf record
        for (std::size_t t : threads) ops::typegrad_threads(t), ops::torch_threads(t);
        for (const ops::config& c : run) {
            const ops::data in = ops::make_data(c);
            auto w = profile == "typegrad" ? ops::typegrad_workload(c, in) : ops::torch_workload(c, in);
            for (int i = 0; w && i < steps; ++i) w->step();
        }
        return 0;
    }

    // All workloads stay alive across rounds (1.4 GB peak at the default sizes).
    struct entry {
        ops::config c;
        std::unique_ptr<ops::workload> tg, th;
        double loss_err = 0, grad_err = 0;
        std::vector<samples> per_thread;
    };
    std::vector<entry> entries;
    int failures = 0;
    for (const ops::config& c : run) {
        const ops::data in = ops::make_data(c);
        entry e{c, ops::typegrad_workload(c, in), ops::torch_workload(c, in), 0, 0, {}};
        if (!e.tg) {
            std::fprintf(stderr, "no typegrad instantiation for %s\n", c.name().c_str());
            ++failures;
            continue;
        }
        // The same computation on both sides: loss and every gradient (relative L2) once.
        ops::typegrad_threads(threads.front());
        ops::torch_threads(threads.front());
        const float la = e.tg->step(), lb = e.th->step();
        e.loss_err = std::abs(double(la) - double(lb)) / std::max(std::abs(double(lb)), 1e-30);
        const auto ga = e.tg->grads(), gb = e.th->grads();
        for (std::size_t i = 0; i < ga.size(); ++i)
            e.grad_err = std::max(e.grad_err, i < gb.size() ? rel_l2(ga[i], gb[i]) : INFINITY);
        // float sums of 1e5-1e7 terms in different orders: the loss agrees to ~1e-4 relative
        if (!(e.grad_err < 1e-3) || !(e.loss_err < 1e-2)) {
            std::fprintf(stderr, "%s: typegrad and LibTorch disagree (loss %g vs %g, grads rel. L2 %g)\n",
                         c.name().c_str(), double(la), double(lb), e.grad_err);
            ++failures;
        }
        e.per_thread.resize(threads.size());
        entries.push_back(std::move(e));
    }
    for (int r = 0; r < rounds; ++r) {
        std::fprintf(stderr, "round %d of %d\n", r + 1, rounds);
        for (std::size_t ti = 0; ti < threads.size(); ++ti) {
            ops::typegrad_threads(threads[ti]);
            ops::torch_threads(threads[ti]);
            // OpenBLAS's workers spin for a while after a multi-threaded call: let them sleep
            // before one-thread steps, whose CPU time would otherwise include their spinning.
            std::this_thread::sleep_for(std::chrono::milliseconds(500));
            for (entry& e : entries) compare(*e.tg, *e.th, warmup, steps, e.per_thread[ti]);
        }
    }

    std::printf("| workload | threads | typegrad ms | LibTorch ms | LibTorch / typegrad | per-round ratios | typegrad CPU ms "
                "| LibTorch CPU ms | rel. err. loss | rel. err. grads (max) |\n");
    std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (const entry& e : entries)
        for (std::size_t ti = 0; ti < threads.size(); ++ti) {
            const samples& s = e.per_thread[ti];
            const double a = median(s.a_wall), b = median(s.b_wall);
            const auto [lo, hi] = std::minmax_element(s.ratios.begin(), s.ratios.end());
            // The ratio is the median of the rounds' ratios, robust to one busy round; the times
            // are medians of all steps, so their quotient can differ a little.
            std::printf("| %s | %zu | %.2f | %.2f | **%.2f** | %.2f-%.2f | %.2f | %.2f | %.1e | %.1e |\n",
                        e.c.name().c_str(), threads[ti], 1e3 * a, 1e3 * b, median(s.ratios), *lo, *hi, 1e3 * median(s.a_cpu),
                        1e3 * median(s.b_cpu), e.loss_err, e.grad_err);
        }
    return failures == 0 ? 0 : 1;
}
