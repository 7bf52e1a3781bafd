// GPU benchmark of the CUDA backend (issue 8):
//   1. fused sum(exp(x) * y), value and gradient wrt x, N = 2^24 .. 2^28 floats: one kernel that
//      reads x and y and writes dx (12 bytes per element), against a device-to-device copy
//      (8 bytes per element) measured on the same device: the target is >= 80% of the copy's
//      bandwidth;
//   2. matmul forward + backward, sum(A B) with gradients for A and B, against the three cuBLAS
//      SGEMMs alone (C = A B, dA = G B^T, dB = A^T G);
//   3. the same under tg::autocast<tg::cuda_bf16> against three bf16 cublasGemmEx calls.
// Without a GPU it says so and exits 0.
#include <typegrad/cuda.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace tg = typegrad;

namespace {

void synchronize() { tg::cuda::detail::check(tg::cuda::detail::api().cuCtxSynchronize(), "cuCtxSynchronize"); }

// Median seconds of `reps` runs of f (after one warm-up).
template <class F>
double seconds(F&& f, int reps) {
    f();
    synchronize();
    std::vector<double> t;
    for (int r = 0; r < reps; ++r) {
        const auto start = std::chrono::steady_clock::now();
        f();
        synchronize();
        t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

constexpr auto x = tg::param<"x", float, tg::shape<tg::dyn>>;
constexpr auto y = tg::input<"y", float, tg::shape<tg::dyn>>;
constexpr auto A = tg::param<"A", float, tg::shape<tg::dyn, tg::dyn>>;
constexpr auto B = tg::param<"B", float, tg::shape<tg::dyn, tg::dyn>>;

void fused(int reps) {
    auto step = tg::compile(tg::sum(tg::exp(x) * y), tg::wrt(x));
    std::printf("\nfused sum(exp(x) * y), value and dx (reads x, y; writes dx), against a device copy\n");
    std::printf("%12s %12s %12s %12s %12s %8s\n", "N", "copy GB/s", "fused ms", "fused GB/s", "loss", "of copy");
    for (int p = 24; p <= 28; ++p) {
        const std::size_t n = std::size_t(1) << p;
        std::vector<float> h(n, 0.001f);
        auto dx = tg::cuda::tensor<float, tg::shape<tg::dyn>>::from_host(h);
        auto dy = tg::cuda::tensor<float, tg::shape<tg::dyn>>::from_host(h);
        tg::cuda::tensor<float, tg::shape<tg::dyn>> dg({n});
        const double copy = seconds([&] { tg::cuda::detail::copy_on_device(dg.data(), dx.data(), n * sizeof(float)); }, reps);
        float loss = 0;
        const double t = seconds([&] { loss = step.value_and_grad(tg::bind(x, dx), tg::bind(y, dy), tg::grad_into(x, dg)); }, reps);
        const double copy_bw = 2.0 * double(n) * 4 / copy / 1e9, fused_bw = 3.0 * double(n) * 4 / t / 1e9;
        std::printf("%12zu %12.1f %12.3f %12.1f %12.4g %7.1f%%\n", n, copy_bw, t * 1e3, fused_bw, double(loss),
                    100 * fused_bw / copy_bw);
    }
}

void matmul(int reps) {
    auto step = tg::compile(tg::sum(tg::matmul(A, B)), tg::wrt(A, B));
    std::printf("\nmatmul forward + backward: sum(A B) with dA, dB (3 GEMMs) against 3 cuBLAS SGEMMs alone\n");
    std::printf("%8s %14s %14s %10s %10s\n", "n", "typegrad ms", "cuBLAS ms", "TFLOP/s", "overhead");
    for (std::size_t n : {512u, 1024u, 2048u, 4096u}) {
        std::vector<float> h(n * n, 0.01f);
        auto da = tg::cuda::tensor<float, tg::shape<tg::dyn, tg::dyn>>::from_host(h, {n, n});
        auto db = tg::cuda::tensor<float, tg::shape<tg::dyn, tg::dyn>>::from_host(h, {n, n});
        tg::cuda::tensor<float, tg::shape<tg::dyn, tg::dyn>> ga({n, n}), gb({n, n}), c({n, n}), g({n, n});
        g.copy_from(std::vector<float>(n * n, 1.f));
        const double t = seconds([&] {
            step.value_and_grad(tg::bind(A, da), tg::bind(B, db), tg::grad_into(A, ga), tg::grad_into(B, gb));
        }, reps);
        cublasHandle_t hdl = tg::cuda::detail::blas_handle();
        const float one = 1, zero = 0;
        const int m = int(n);
        const double blas = seconds([&] {
            // row-major C = A B, dA = G B^T, dB = A^T G, as column-major calls
            cublasSgemm(hdl, CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, &one, db.data(), m, da.data(), m, &zero, c.data(), m);
            cublasSgemm(hdl, CUBLAS_OP_T, CUBLAS_OP_N, m, m, m, &one, db.data(), m, g.data(), m, &zero, ga.data(), m);
            cublasSgemm(hdl, CUBLAS_OP_N, CUBLAS_OP_T, m, m, m, &one, g.data(), m, da.data(), m, &zero, gb.data(), m);
        }, reps);
        const double flops = 3 * 2.0 * double(n) * double(n) * double(n);
        std::printf("%8zu %14.3f %14.3f %10.2f %9.1f%%\n", n, t * 1e3, blas * 1e3, flops / t / 1e12, 100 * (t / blas - 1));
    }
}

// The same sum(A B) with f32 leaves in a tg::autocast<tg::cuda_bf16> region: A and B are cast to
// bf16 (fused kernels), the three GEMMs run in bf16 with f32 accumulation (cublasGemmEx), the
// gradients are cast back to f32. Against three bf16 GemmEx calls alone on bf16 copies.
void matmul_bf16(int reps) {
    auto step = tg::compile(tg::autocast<tg::cuda_bf16>(tg::sum(tg::matmul(A, B))), tg::wrt(A, B));
    std::printf("\nautocast<cuda_bf16> matmul forward + backward (f32 leaves, casts included) against 3 bf16 "
                "cublasGemmEx alone\n");
    std::printf("%8s %14s %14s %10s %10s\n", "n", "typegrad ms", "cuBLAS ms", "TFLOP/s", "overhead");
    for (std::size_t n : {1024u, 2048u, 4096u, 8192u}) {
        std::vector<float> h(n * n, 0.01f);
        auto da = tg::cuda::tensor<float, tg::shape<tg::dyn, tg::dyn>>::from_host(h, {n, n});
        auto db = tg::cuda::tensor<float, tg::shape<tg::dyn, tg::dyn>>::from_host(h, {n, n});
        tg::cuda::tensor<float, tg::shape<tg::dyn, tg::dyn>> ga({n, n}), gb({n, n});
        const double t = seconds([&] {
            step.value_and_grad(tg::bind(A, da), tg::bind(B, db), tg::grad_into(A, ga), tg::grad_into(B, gb));
        }, reps);
        std::vector<tg::bf16> hb(n * n, tg::bf16(0.01f));
        std::vector<tg::cuda::tensor<tg::bf16, tg::shape<tg::dyn, tg::dyn>>> m;
        for (int i = 0; i < 5; ++i) m.push_back(tg::cuda::tensor<tg::bf16, tg::shape<tg::dyn, tg::dyn>>::from_host(hb, {n, n}));
        cublasHandle_t hdl = tg::cuda::detail::blas_handle();
        const float one = 1, zero = 0;
        const int k = int(n);
        auto gemm = [&](cublasOperation_t ta, cublasOperation_t tb, const void* x, const void* y, void* z) {
            cublasGemmEx(hdl, ta, tb, k, k, k, &one, x, CUDA_R_16BF, k, y, CUDA_R_16BF, k, &zero, z, CUDA_R_16BF, k,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        };
        const double blas = seconds([&] {
            gemm(CUBLAS_OP_N, CUBLAS_OP_N, m[1].data(), m[0].data(), m[2].data());
            gemm(CUBLAS_OP_T, CUBLAS_OP_N, m[1].data(), m[2].data(), m[3].data());
            gemm(CUBLAS_OP_N, CUBLAS_OP_T, m[2].data(), m[0].data(), m[4].data());
        }, reps);
        const double flops = 3 * 2.0 * double(n) * double(n) * double(n);
        std::printf("%8zu %14.3f %14.3f %10.2f %9.1f%%\n", n, t * 1e3, blas * 1e3, flops / t / 1e12, 100 * (t / blas - 1));
    }
}

}  // namespace

int main(int argc, char** argv) {
    if (!tg::cuda::available()) {
        std::printf("bench_cuda: no usable CUDA device (%s); nothing measured\n", tg::cuda::unavailable_reason().c_str());
        return 0;
    }
    const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
    std::printf("device: %s\n", tg::cuda::device_name().c_str());
    fused(reps);
    matmul(reps);
    matmul_bf16(reps);
}
