// Runs everywhere the CUDA toolkit is (no GPU needed): the source generated for every test graph
// (value_and_grad, forward and backward plans) compiles to PTX with NVRTC, and every generated
// loop kernel is in the PTX. This is what keeps the backend from rotting on machines without a GPU.
#include "graphs.hpp"

#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

namespace {

std::size_t count(const std::string& text, const std::string& what) {
    std::size_t n = 0;
    for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
    return n;
}

struct totals {
    std::size_t modules = 0, loop_kernels = 0, entries = 0;
};

template <class Step>
void compile_all(const char* name, const Step& step, totals& t) {
    INFO("graph: " << name);
    const auto sources = typegrad::cuda::generated_source(step);
    for (const std::string* src : {&sources.joint, &sources.forward, &sources.backward}) {
        if (src->empty()) continue;  // a non-scalar output has no value_and_grad plan
        std::string ptx;
        try {
            ptx = typegrad::cuda::compile_ptx(*src, "compute_90");
        } catch (const typegrad::device_error& e) {
            FAIL(e.what() << "\n--- source ---\n" << *src);
        }
        const std::size_t loops = count(*src, "__launch_bounds__(TG_BLOCK) tg_loop_");
        const std::size_t loop_entries = count(ptx, ".entry tg_loop_");
        CHECK(loop_entries == loops);
        CHECK(count(ptx, ".entry tg_finish_sum_f32") == 1);
        ++t.modules;
        t.loop_kernels += loops;
        t.entries += count(ptx, ".entry ");
    }
}

// In four parts, so that ctest runs them in parallel.
void compile_part(std::size_t part, std::size_t parts) {
    totals t;
    std::size_t i = 0;
    cuda_tests::for_each_graph([&](const char* name, const auto& step) {
        if (i++ % parts == part) compile_all(name, step, t);
    });
    std::printf("cuda ptx, part %zu of %zu: %zu modules compiled by NVRTC to PTX (compute_90): %zu generated loop "
                "kernels, %zu kernel entries in all\n",
                part + 1, parts, t.modules, t.loop_kernels, t.entries);
    CHECK(t.modules >= 25);
}

}  // namespace

TEST_CASE("generated CUDA source of every test graph compiles to PTX with NVRTC, part 1", "[cuda][ptx]") { compile_part(0, 4); }
TEST_CASE("generated CUDA source of every test graph compiles to PTX with NVRTC, part 2", "[cuda][ptx]") { compile_part(1, 4); }
TEST_CASE("generated CUDA source of every test graph compiles to PTX with NVRTC, part 3", "[cuda][ptx]") { compile_part(2, 4); }
TEST_CASE("generated CUDA source of every test graph compiles to PTX with NVRTC, part 4", "[cuda][ptx]") { compile_part(3, 4); }

TEST_CASE("generated source for older and newer architectures", "[cuda][ptx]") {
    namespace tg = typegrad;
    using cuda_tests::A;
    using cuda_tests::B;
    const auto src = tg::cuda::generated_source(tg::compile(tg::sum(tg::exp(A) * B), tg::wrt(A, B)));
    for (const char* arch : {"compute_75", "compute_80", "compute_90", "compute_100"}) {
        INFO(arch);
        CHECK(tg::cuda::compile_ptx(src.joint, arch).find(".entry tg_loop_0_0") != std::string::npos);
    }
}

TEST_CASE("NVRTC failures are device_errors with the compiler's log", "[cuda][ptx]") {
    try {
        typegrad::cuda::compile_ptx("this is not CUDA", "compute_90");
        FAIL("no error");
    } catch (const typegrad::device_error& e) {
        CHECK(std::string(e.what()).find("NVRTC could not compile") != std::string::npos);
    }
}

TEST_CASE("the fused sum(exp(x) * y) value_and_grad is one kernel that reads x and y once", "[cuda][ptx]") {
    namespace tg = typegrad;
    constexpr auto x = tg::param<"x", float, tg::shape<tg::dyn>>;
    constexpr auto y = tg::input<"y", float, tg::shape<tg::dyn>>;
    const auto src = tg::cuda::generated_source(tg::compile(tg::sum(tg::exp(x) * y), tg::wrt(x)));
    CHECK(count(src.joint, "__launch_bounds__(TG_BLOCK) tg_loop_") == 1);
    CHECK(count(src.joint, "tg_exp(") >= 1);
    // one load per input, one reduction, one store
    CHECK(count(src.joint, "= ((const T*)p.w[") == 2);
    CHECK(count(src.joint, "tg_combine<0>(acc[0]") == 1);
    CHECK(count(src.joint, "*d += ") == 1);
}
