// Entry point of typegrad_bench: records how the binary was built in the JSON context.
#include <benchmark/benchmark.h>

#include <xsimd/xsimd.hpp>

#ifndef TYPEGRAD_BENCH_COMPILER
#define TYPEGRAD_BENCH_COMPILER "unknown"
#endif
#ifndef TYPEGRAD_BENCH_FLAGS
#define TYPEGRAD_BENCH_FLAGS "unknown"
#endif

int main(int argc, char** argv) {
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::AddCustomContext("compiler", TYPEGRAD_BENCH_COMPILER);
    benchmark::AddCustomContext("cxx_flags", TYPEGRAD_BENCH_FLAGS);
    benchmark::AddCustomContext("xsimd_arch", xsimd::default_arch::name());
#ifdef TYPEGRAD_BENCH_HAVE_TORCH
    benchmark::AddCustomContext("libtorch", "yes");
#else
    benchmark::AddCustomContext("libtorch", "no");
#endif
#ifdef TYPEGRAD_BENCH_HAVE_SACADO
    benchmark::AddCustomContext("sacado", "yes");
#else
    benchmark::AddCustomContext("sacado", "no");
#endif
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
