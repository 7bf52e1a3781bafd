#pragma once
// The CUDA libraries the backend talks to, each behind one small wrapper that throws
// tg::device_error with the library's own words:
//   - the driver API (libcuda.so.1), opened with dlopen at first use, so that a program built
//     with the backend starts, and says "no CUDA driver", on a machine without one;
//   - NVRTC (linked: it is part of the toolkit and needs no GPU), which compiles generated
//     source to PTX;
//   - cuBLAS (linked), for GEMM.
// One device (ordinal 0, or TYPEGRAD_CUDA_DEVICE) and its primary context serve the process;
// every call makes that context current on the calling thread.
#include <cuda.h>
#include <cublas_v2.h>
#include <dlfcn.h>
#include <nvrtc.h>

#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include <typegrad/core/error.hpp>

namespace typegrad::cuda::detail {

using typegrad::detail::message;

// ---- the driver API, loaded at run time -----------------------------------------------------
struct driver_api {
    bool loaded = false;
    std::string failure;  // why it could not be used, when !loaded
#define TYPEGRAD_DETAIL_CUDA_DRIVER_FUNCTIONS(X)            \
    X(cuInit, "cuInit")                                     \
    X(cuDeviceGetCount, "cuDeviceGetCount")                 \
    X(cuDeviceGet, "cuDeviceGet")                           \
    X(cuDeviceGetName, "cuDeviceGetName")                   \
    X(cuDeviceGetAttribute, "cuDeviceGetAttribute")         \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain") \
    X(cuCtxSetCurrent, "cuCtxSetCurrent")                   \
    X(cuCtxSynchronize, "cuCtxSynchronize")                 \
    X(cuGetErrorString, "cuGetErrorString")                 \
    X(cuModuleLoadData, "cuModuleLoadData")                 \
    X(cuModuleGetFunction, "cuModuleGetFunction")           \
    X(cuLaunchKernel, "cuLaunchKernel")                     \
    X(cuMemAlloc, "cuMemAlloc_v2")                          \
    X(cuMemFree, "cuMemFree_v2")                            \
    X(cuMemcpyHtoD, "cuMemcpyHtoD_v2")                      \
    X(cuMemcpyDtoH, "cuMemcpyDtoH_v2")                      \
    X(cuMemcpyDtoD, "cuMemcpyDtoD_v2")                      \
    X(cuMemsetD8, "cuMemsetD8_v2")
#define TYPEGRAD_DETAIL_CUDA_DECLARE(fn, sym) decltype(&::fn) fn = nullptr;
    TYPEGRAD_DETAIL_CUDA_DRIVER_FUNCTIONS(TYPEGRAD_DETAIL_CUDA_DECLARE)
#undef TYPEGRAD_DETAIL_CUDA_DECLARE

    driver_api() {
        void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            const char* e = ::dlerror();
            failure = std::string("no CUDA driver (dlopen libcuda.so.1: ") + (e ? e : "unknown error") + ")";
            return;
        }
#define TYPEGRAD_DETAIL_CUDA_LOAD(fn, sym)                                           \
    fn = reinterpret_cast<decltype(fn)>(::dlsym(lib, sym));                          \
    if (!fn) {                                                                       \
        failure = std::string("the CUDA driver lacks ") + sym + " (driver too old)"; \
        return;                                                                      \
    }
        TYPEGRAD_DETAIL_CUDA_DRIVER_FUNCTIONS(TYPEGRAD_DETAIL_CUDA_LOAD)
#undef TYPEGRAD_DETAIL_CUDA_LOAD
        loaded = true;  // the library stays loaded for the life of the process
    }
};
#undef TYPEGRAD_DETAIL_CUDA_DRIVER_FUNCTIONS

inline const driver_api& driver_functions() {
    static const driver_api api;
    return api;
}

inline std::string driver_error_text(CUresult r) {
    const char* s = nullptr;
    const auto& api = driver_functions();
    if (api.loaded && api.cuGetErrorString(r, &s) == CUDA_SUCCESS && s) return s;
    return std::string("CUDA driver error ") + std::to_string(int(r));
}

inline void check(CUresult r, const char* what) {
    if (r != CUDA_SUCCESS)
        typegrad::detail::fail<device_error>({"typegrad: cuda: ", what, " failed: ", driver_error_text(r)});
}

// The device the process uses, its primary context and what the code generator needs to know.
struct device_info {
    bool usable = false;
    std::string failure;
    CUdevice device = 0;
    CUcontext context = nullptr;
    int ordinal = 0;
    int major = 0, minor = 0;
    int multiprocessors = 0;
    std::string name;
};

inline device_info open_device() {
    device_info d;
    const driver_api& api = driver_functions();
    if (!api.loaded) {
        d.failure = api.failure;
        return d;
    }
    CUresult r = api.cuInit(0);
    if (r != CUDA_SUCCESS) {
        d.failure = std::string("cuInit failed: ") + driver_error_text(r);
        return d;
    }
    int count = 0;
    r = api.cuDeviceGetCount(&count);
    if (r != CUDA_SUCCESS || count == 0) {
        d.failure = r != CUDA_SUCCESS ? std::string("cuDeviceGetCount failed: ") + driver_error_text(r) : "no CUDA device";
        return d;
    }
    if (const char* env = std::getenv("TYPEGRAD_CUDA_DEVICE")) d.ordinal = std::atoi(env);
    if (d.ordinal < 0 || d.ordinal >= count) {
        d.failure = std::string("TYPEGRAD_CUDA_DEVICE=") + std::to_string(d.ordinal) + std::string(" but there are ") +
                    std::to_string(count) + " devices";
        return d;
    }
    char name[256] = {};
    if ((r = api.cuDeviceGet(&d.device, d.ordinal)) != CUDA_SUCCESS ||
        (r = api.cuDeviceGetName(name, sizeof name, d.device)) != CUDA_SUCCESS ||
        (r = api.cuDeviceGetAttribute(&d.major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d.device)) != CUDA_SUCCESS ||
        (r = api.cuDeviceGetAttribute(&d.minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d.device)) != CUDA_SUCCESS ||
        (r = api.cuDeviceGetAttribute(&d.multiprocessors, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d.device)) != CUDA_SUCCESS ||
        (r = api.cuDevicePrimaryCtxRetain(&d.context, d.device)) != CUDA_SUCCESS) {
        d.failure = std::string("opening device ") + std::to_string(d.ordinal) + std::string(" failed: ") + driver_error_text(r);
        return d;
    }
    d.name = name;
    d.usable = true;
    return d;
}

inline const device_info& device_state() {
    static const device_info d = open_device();
    return d;
}

// Testing hook (tests/cuda/emulation_test.cpp): with an emulator installed, the backend runs its
// generated kernels on the host. "Device" memory is host memory, the module is the generated
// source compiled by the emulator (with TG_EMULATION defined), launches call the kernels block
// by block with one thread per block, and GEMMs follow cuBLAS's column-major contract. It
// exercises everything but the GPU itself: code generation, launch configuration, parameter
// layouts, reductions split into chunks, the finish kernels, cuBLAS arguments.
enum class gemm_type { f32, f64, bf16, f16 };
struct emulator {
    virtual ~emulator() = default;
    virtual void* load(const std::string& source) = 0;                     // a module
    virtual void* function(void* module, const char* name) = 0;            // a kernel
    virtual void launch(void* kernel, unsigned gx, unsigned gy, void* words) = 0;
    // C = op(A) op(B), column-major, batched with element strides (cublas<t>gemmStridedBatched;
    // bf16/f16: f32 accumulation, C rounded once).
    virtual void gemm(gemm_type type, bool transpose_a, bool transpose_b, int m, int n, int k, const void* a, int lda,
                      long long stride_a, const void* b, int ldb, long long stride_b, void* c, int ldc,
                      long long stride_c, int batch) = 0;
};
inline emulator*& active_emulator() {
    static emulator* e = nullptr;
    return e;
}

}  // namespace typegrad::cuda::detail

namespace typegrad::cuda {

// Whether a CUDA device can be used, and if not, why (tests skip on it).
inline bool available() { return detail::active_emulator() || detail::device_state().usable; }
// Why no device can be used (empty when one can): no driver, no device, too old a driver...
inline std::string unavailable_reason() { return detail::active_emulator() ? std::string() : detail::device_state().failure; }
// The device's name ("host emulation" under the test emulator).
inline std::string device_name() { return detail::active_emulator() ? "host emulation" : detail::device_state().name; }

}  // namespace typegrad::cuda

namespace typegrad::cuda::detail {

// The driver API, with the device's context current on this thread; throws when unusable.
inline const driver_api& api() {
    const device_info& d = device_state();
    if (!d.usable) typegrad::detail::fail<device_error>({"typegrad: cuda: ", d.failure});
    const driver_api& a = driver_functions();
    check(a.cuCtxSetCurrent(d.context), "cuCtxSetCurrent");
    return a;
}

// ---- NVRTC -------------------------------------------------------------------------------
inline void check_nvrtc(nvrtcResult r, const char* what) {
    if (r != NVRTC_SUCCESS)
        typegrad::detail::fail<device_error>({"typegrad: cuda: ", what, " failed: ", nvrtcGetErrorString(r)});
}

// The newest virtual architecture NVRTC supports that the device (major.minor) can run.
inline std::string nvrtc_architecture(int major, int minor) {
    int n = 0;
    check_nvrtc(nvrtcGetNumSupportedArchs(&n), "nvrtcGetNumSupportedArchs");
    std::vector<int> archs(std::size_t(n > 0 ? n : 1));
    if (n > 0) check_nvrtc(nvrtcGetSupportedArchs(archs.data()), "nvrtcGetSupportedArchs");
    const int want = major * 10 + minor;
    int best = 0;
    for (int a : archs)
        if (a <= want && a > best) best = a;
    if (best == 0)
        typegrad::detail::fail<device_error>({"typegrad: cuda: NVRTC cannot target compute capability ", unsigned(major), ".",
                                              unsigned(minor)});
    return std::string("compute_") + std::to_string(best);
}

// Compiles CUDA C++ source to PTX for a virtual architecture ("compute_90"). Needs no GPU.
inline std::string compile_to_ptx(const std::string& source, const std::string& arch,
                                  const std::string& name = "typegrad_kernels.cu") {
    nvrtcProgram prog = nullptr;
    check_nvrtc(nvrtcCreateProgram(&prog, source.c_str(), name.c_str(), 0, nullptr, nullptr), "nvrtcCreateProgram");
    struct release {
        nvrtcProgram& p;
        ~release() { nvrtcDestroyProgram(&p); }
    } guard{prog};
    const std::string arch_option = std::string("--gpu-architecture=") + arch;
    const char* options[] = {arch_option.c_str(), "--std=c++17", "--device-as-default-execution-space",
                             "--fmad=false"};
    const nvrtcResult r = nvrtcCompileProgram(prog, int(sizeof options / sizeof options[0]), options);
    if (r != NVRTC_SUCCESS) {
        std::size_t log_size = 0;
        nvrtcGetProgramLogSize(prog, &log_size);
        std::string log(log_size, '\0');
        if (log_size) nvrtcGetProgramLog(prog, log.data());
        typegrad::detail::fail<device_error>({"typegrad: cuda: NVRTC could not compile the generated kernels (",
                                              nvrtcGetErrorString(r), "):\n", log});
    }
    std::size_t size = 0;
    check_nvrtc(nvrtcGetPTXSize(prog, &size), "nvrtcGetPTXSize");
    std::string ptx(size, '\0');
    check_nvrtc(nvrtcGetPTX(prog, ptx.data()), "nvrtcGetPTX");
    return ptx;
}

// ---- cuBLAS ------------------------------------------------------------------------------
inline void check_cublas(cublasStatus_t s, const char* what) {
    if (s != CUBLAS_STATUS_SUCCESS)
        typegrad::detail::fail<device_error>({"typegrad: cuda: ", what, " failed: cuBLAS status ", unsigned(s)});
}

// One handle per thread (cuBLAS handles are not to be shared across threads), on the legacy
// default stream that the generated kernels use too, so launches stay in order.
inline cublasHandle_t blas_handle() {
    struct holder {
        cublasHandle_t h = nullptr;
        ~holder() {
            if (h) cublasDestroy(h);
        }
    };
    thread_local holder hold;
    if (!hold.h) {
        api();  // the context is current: cuBLAS binds to it
        check_cublas(cublasCreate(&hold.h), "cublasCreate");
    }
    return hold.h;
}

}  // namespace typegrad::cuda::detail
