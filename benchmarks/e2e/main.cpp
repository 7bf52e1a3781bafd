// typegrad_e2e: one training step (value and gradient + optimizer) of the GPT and CNN examples'
// models, typegrad against LibTorch eager, at 1 thread and at all hardware threads. Steps of the
// two implementations alternate (warm-up first), so that a change of the machine's load hits
// both; each figure is the median of the timed steps. Prints a Markdown table. --profile runs
// one side alone (for perf record) and prints its median step per model.
//
//   typegrad_e2e [--steps N] [--threads 1,2] [--only gpt|cnn] [--quick] [--profile typegrad|torch]
#include "e2e.hpp"
#include "../step_timing.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace e2e {

std::string gpt_config::name() const {
    return "gpt T=" + std::to_string(T) + " D=" + std::to_string(D) + " B=" + std::to_string(B) + " (H=" +
           std::to_string(heads()) + ", L=" + std::to_string(L) + ")";
}
std::string cnn_config::name() const {
    return "cnn " + std::to_string(S) + "x" + std::to_string(S) + " C=" + std::to_string(C1) + "/" +
           std::to_string(C2) + " N=" + std::to_string(N);
}

void fill_tokens(std::size_t n, std::size_t vocab, std::uint32_t seed, int* out) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> d(0, int(vocab) - 1);
    for (std::size_t i = 0; i < n; ++i) out[i] = d(rng);
}

}  // namespace e2e

namespace {

using bench_timing::median;
using bench_timing::sample;

sample time_step(e2e::trainer& t, float& loss) {
    return bench_timing::time_call([&] { return t.step(); }, loss);
}

struct result {
    double wall, cpu;
    float first_loss, last_loss;
};

// Alternates steps of a and b after `warmup` steps of each; medians of `steps` timed steps.
std::pair<result, result> compare(e2e::trainer& a, e2e::trainer& b, int warmup, int steps) {
    float la0 = 0, lb0 = 0, la = 0, lb = 0;
    for (int i = 0; i < warmup; ++i) {
        time_step(a, la);
        time_step(b, lb);
        if (i == 0) la0 = la, lb0 = lb;
    }
    std::vector<double> aw, ac, bw, bc;
    for (int i = 0; i < steps; ++i) {
        // alternate which goes first, so neither always follows the other's cache footprint
        e2e::trainer& first = i % 2 == 0 ? a : b;
        e2e::trainer& second = i % 2 == 0 ? b : a;
        float l1 = 0, l2 = 0;
        const sample s1 = time_step(first, l1), s2 = time_step(second, l2);
        const sample& sa = i % 2 == 0 ? s1 : s2;
        const sample& sb = i % 2 == 0 ? s2 : s1;
        (i % 2 == 0 ? la : lb) = l1;
        (i % 2 == 0 ? lb : la) = l2;
        aw.push_back(sa.wall), ac.push_back(sa.cpu), bw.push_back(sb.wall), bc.push_back(sb.cpu);
    }
    return {{median(aw), median(ac), la0, la}, {median(bw), median(bc), lb0, lb}};
}

std::vector<std::size_t> parse_list(const char* s) {
    std::vector<std::size_t> v;
    for (const char* p = s; *p != '\0';) {
        char* end = nullptr;
        v.push_back(std::strtoul(p, &end, 10));
        p = *end == ',' ? end + 1 : end;
        if (end == p && *end != '\0') break;
    }
    return v;
}

}  // namespace

int main(int argc, char** argv) {
    int steps = 7, warmup = 2;
    std::vector<std::size_t> threads{1, std::max<std::size_t>(1, std::thread::hardware_concurrency())};
    std::string only;
    bool quick = false;
    std::string profile;  // "typegrad" or "torch": run that side's steps only (for perf record)
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = std::atoi(argv[++i]);
        else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) threads = parse_list(argv[++i]);
        else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (!std::strcmp(argv[i], "--quick")) quick = true;
        else if (!std::strcmp(argv[i], "--profile") && i + 1 < argc) profile = argv[++i];
        else {
            std::fprintf(stderr, "usage: %s [--steps N] [--threads 1,2] [--only gpt|cnn] [--quick] [--profile typegrad|torch]\n", argv[0]);
            return 2;
        }
    }
    std::vector<e2e::gpt_config> gpts{{128, 128, 8}, {256, 256, 4}, {512, 512, 2}};
    std::vector<e2e::cnn_config> cnns{{12, 8, 8, 64}, {28, 16, 32, 128}};
    if (quick) gpts.resize(1), cnns.resize(1);
    if (!profile.empty()) {
        // one side alone (for perf record, or for its time without the other's in the process:
        // the median of the steps after two untimed ones, at the last thread count given)
        const bool tgs = profile == "typegrad";
        for (std::size_t t : threads) e2e::typegrad_threads(t), e2e::torch_threads(t);
        const auto alone = [&](const std::string& name, auto m) {
            if (!m) return;
            float loss = 0;
            std::vector<double> wall;
            for (int i = 0; i < steps + 2; ++i) {
                const double w = time_step(*m, loss).wall;
                if (i >= 2) wall.push_back(w);
            }
            std::printf("%s %s, %zu threads: %.2f ms/step\n", profile.c_str(), name.c_str(), threads.back(),
                        1e3 * median(wall));
        };
        if (only.empty() || only == "gpt")
            for (const e2e::gpt_config& c : gpts) alone(c.name(), tgs ? e2e::typegrad_gpt(c) : e2e::torch_gpt(c));
        if (only.empty() || only == "cnn")
            for (const e2e::cnn_config& c : cnns) alone(c.name(), tgs ? e2e::typegrad_cnn(c) : e2e::torch_cnn(c));
        return 0;
    }

    std::printf("| model | threads | typegrad ms/step | LibTorch ms/step | LibTorch / typegrad | typegrad CPU ms "
                "| LibTorch CPU ms | tokens/s typegrad | tokens/s LibTorch | loss tg (first -> last) | loss torch |\n");
    std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n");
    std::fflush(stdout);
    const auto row = [&](const std::string& name, std::size_t t, const result& a, const result& b, double tokens) {
        std::printf("| %s | %zu | %.2f | %.2f | **%.2f** | %.2f | %.2f | %s | %s | %.3f -> %.3f | %.3f -> %.3f |\n",
                    name.c_str(), t, 1e3 * a.wall, 1e3 * b.wall, b.wall / a.wall, 1e3 * a.cpu, 1e3 * b.cpu,
                    tokens > 0 ? std::to_string(long(tokens / a.wall)).c_str() : "-",
                    tokens > 0 ? std::to_string(long(tokens / b.wall)).c_str() : "-", double(a.first_loss),
                    double(a.last_loss), double(b.first_loss), double(b.last_loss));
        std::fflush(stdout);
    };
    int missing = 0;
    if (only.empty() || only == "gpt")
        for (const e2e::gpt_config& c : gpts) {
            auto tg = e2e::typegrad_gpt(c);
            auto th = e2e::torch_gpt(c);
            if (!tg) {
                std::fprintf(stderr, "no typegrad instantiation for %s\n", c.name().c_str());
                ++missing;
                continue;
            }
            for (std::size_t t : threads) {
                e2e::typegrad_threads(t);
                e2e::torch_threads(t);
                const auto [a, b] = compare(*tg, *th, warmup, steps);
                row(c.name(), t, a, b, double(c.tokens()));
            }
        }
    if (only.empty() || only == "cnn")
        for (const e2e::cnn_config& c : cnns) {
            auto tg = e2e::typegrad_cnn(c);
            auto th = e2e::torch_cnn(c);
            if (!tg) {
                std::fprintf(stderr, "no typegrad instantiation for %s\n", c.name().c_str());
                ++missing;
                continue;
            }
            for (std::size_t t : threads) {
                e2e::typegrad_threads(t);
                e2e::torch_threads(t);
                const auto [a, b] = compare(*tg, *th, warmup, steps);
                row(c.name(), t, a, b, 0);
            }
        }
    return missing == 0 ? 0 : 1;
}
