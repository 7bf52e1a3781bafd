// Where LibTorch's CPU bf16 matrix products round (docs/reliability.md, autocast differential):
// compares at::mm and at::matmul of two bf16 vectors, bit for bit, with two models:
//   f32: exact products accumulated in float, one rounding to bf16 at the end (typegrad's GEMM,
//        PyTorch's CUDA and oneDNN kernels);
//   bf16: in order, every product and every partial sum rounded to bf16: s = bf16(s + bf16(a_p b_p)).
// LibTorch 1.13 (Debian libtorch-dev) matches the bf16 model in every call. Prints the counts;
// exits 0 whatever they are (a fact about LibTorch, not a test of typegrad).
//   cmake --build build/diff --target libtorch_bf16_accumulation && build/diff/tests/differential/libtorch_bf16_accumulation
#include <torch/torch.h>

#include <cstdio>
#include <random>
#include <vector>

namespace {

float to_bf16(float x) { return float(c10::BFloat16(x)); }

}  // namespace

int main() {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> pos(0.25f, 2.0f), sym(-1.0f, 1.0f);
    const int dots = 2000, mms = 500;
    int dot_f32 = 0, dot_bf16 = 0;
    for (int t = 0; t < dots; ++t) {
        const int k = 2 + int(rng() % 16);
        std::vector<float> a(static_cast<std::size_t>(k)), b(static_cast<std::size_t>(k));
        for (auto& x : a) x = to_bf16(pos(rng));
        for (auto& x : b) x = to_bf16(sym(rng));
        const float lib = torch::matmul(torch::tensor(a).to(at::kBFloat16), torch::tensor(b).to(at::kBFloat16)).item<float>();
        float f32 = 0, bf = 0;
        for (std::size_t p = 0; p < a.size(); ++p) {
            f32 += a[p] * b[p];
            bf = to_bf16(bf + to_bf16(a[p] * b[p]));
        }
        dot_f32 += lib == to_bf16(f32);
        dot_bf16 += lib == bf;
    }
    int mm_f32 = 0, mm_bf16 = 0;
    for (int t = 0; t < mms; ++t) {
        const int m = 1 + int(rng() % 4), k = 2 + int(rng() % 16), n = 1 + int(rng() % 4);
        std::vector<float> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(k * n));
        for (auto& x : a) x = to_bf16(sym(rng));
        for (auto& x : b) x = to_bf16(sym(rng));
        const auto c = torch::mm(torch::tensor(a).reshape({m, k}).to(at::kBFloat16),
                                 torch::tensor(b).reshape({k, n}).to(at::kBFloat16)).to(at::kFloat).contiguous();
        bool all_f32 = true, all_bf16 = true;
        for (int i = 0; i < m; ++i)
            for (int j = 0; j < n; ++j) {
                float f32 = 0, bf = 0;
                for (int p = 0; p < k; ++p) {
                    const float prod = a[std::size_t(i * k + p)] * b[std::size_t(p * n + j)];
                    f32 += prod;
                    bf = to_bf16(bf + to_bf16(prod));
                }
                const float lib = c.data_ptr<float>()[i * n + j];
                all_f32 = all_f32 && lib == to_bf16(f32);
                all_bf16 = all_bf16 && lib == bf;
            }
        mm_f32 += all_f32;
        mm_bf16 += all_bf16;
    }
    std::printf("LibTorch CPU bf16, results bit-identical to each model:\n"
                "  matmul of two vectors (K 2..17): f32 accumulation %d/%d, bf16 accumulation %d/%d\n"
                "  mm (M 1..4, K 2..17, N 1..4), whole result: f32 accumulation %d/%d, bf16 accumulation %d/%d\n",
                dot_f32, dots, dot_bf16, dots, mm_f32, mms, mm_bf16, mms);
    return 0;
}
