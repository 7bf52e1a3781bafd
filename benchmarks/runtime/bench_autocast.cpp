// fp32 vs bf16 (autocast) matrix products and an MLP layer, forward and forward + backward.
// Names: autocast/<workload>/<f32|bf16>/<n>. Counters: GFLOP/s of the matrix products.
// One thread, as the rest of the suite (bench_gemm.cpp's _mt variants leave the pool at all
// threads): Google Benchmark's CPU time is the benchmark thread's, so a product split across
// the pool would count only its share.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstddef>
#include <vector>

#include <typegrad/typegrad.hpp>

namespace tg = typegrad;

namespace {

template <class T>
std::vector<T> filled(std::size_t n, float scale) {
    std::vector<T> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = T(scale * float(int(i * 7919 % 97) - 48) / 48.0f);
    return v;
}

// C = A B with A, B leaves of dtype T (n x n): the GEMM alone, as a forward pass.
template <class T, std::size_t N>
void matmul_forward(benchmark::State& state) {
    tg::set_num_threads(1);
    constexpr auto a = tg::input<"a", T, tg::shape<N, N>>;
    constexpr auto b = tg::input<"b", T, tg::shape<N, N>>;
    auto step = tg::compile(tg::sum(tg::matmul(a, b)), tg::wrt());
    const auto av = filled<T>(N * N, 1.0f), bv = filled<T>(N * N, 0.5f);
    for (auto _ : state) {
        auto ctx = step.forward(tg::bind(a, av), tg::bind(b, bv));
        benchmark::DoNotOptimize(ctx.value());
    }
    state.counters["GFLOP/s"] = benchmark::Counter(2.0 * N * N * N, benchmark::Counter::kIsIterationInvariantRate,
                                                   benchmark::Counter::kIs1000);
}

// One MLP layer, loss = sum(relu(x W^T + b)), value and gradients of W and b; f32 params. The
// bf16 variant wraps the loss in an autocast<cpu_bf16> region (same_as_forward: the backward's
// matmuls run in bf16 too).
template <bool Autocast, std::size_t Batch>
void mlp_layer(benchmark::State& state) {
    tg::set_num_threads(1);
    constexpr std::size_t in = 512, out = 512;
    constexpr auto x = tg::input<"x", float, tg::shape<Batch, in>>;
    constexpr auto w = tg::param<"W", float, tg::shape<out, in>>;
    constexpr auto b = tg::param<"b", float, tg::shape<out>>;
    auto body = tg::sum(tg::relu(tg::linear(x, w, b)));
    auto step = [&] {
        if constexpr (Autocast) return tg::compile(tg::autocast<tg::cpu_bf16>(body), tg::wrt(w, b));
        else return tg::compile(body, tg::wrt(w, b));
    }();
    const auto xv = filled<float>(Batch * in, 1.0f), wv = filled<float>(out * in, 0.05f), bv = filled<float>(out, 0.1f);
    std::vector<float> gw(out * in), gb(out);
    for (auto _ : state) {
        auto v = step.value_and_grad(tg::bind(x, xv), tg::bind(w, wv), tg::bind(b, bv), tg::grad_into(w, gw),
                                     tg::grad_into(b, gb));
        benchmark::DoNotOptimize(v);
        benchmark::DoNotOptimize(gw.data());
    }
    // forward x W^T and backward g^T x (the gradient of x is not requested)
    state.counters["GFLOP/s"] = benchmark::Counter(2.0 * 2.0 * Batch * in * out, benchmark::Counter::kIsIterationInvariantRate,
                                                   benchmark::Counter::kIs1000);
}

}  // namespace

BENCHMARK(matmul_forward<float, 256>)->Name("autocast/matmul_fwd/f32/256")->Unit(benchmark::kMicrosecond);
BENCHMARK(matmul_forward<tg::bf16, 256>)->Name("autocast/matmul_fwd/bf16/256")->Unit(benchmark::kMicrosecond);
BENCHMARK(matmul_forward<float, 512>)->Name("autocast/matmul_fwd/f32/512")->Unit(benchmark::kMicrosecond);
BENCHMARK(matmul_forward<tg::bf16, 512>)->Name("autocast/matmul_fwd/bf16/512")->Unit(benchmark::kMicrosecond);
BENCHMARK(mlp_layer<false, 256>)->Name("autocast/mlp_layer_fwd_bwd/f32/256")->Unit(benchmark::kMicrosecond);
BENCHMARK(mlp_layer<true, 256>)->Name("autocast/mlp_layer_fwd_bwd/bf16/256")->Unit(benchmark::kMicrosecond);
