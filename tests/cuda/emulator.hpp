#pragma once
// A host emulator for the CUDA backend (exec/cuda/runtime.hpp: emulator): each generated module is
// compiled by the host C++ compiler into a shared library with TG_EMULATION defined and a small
// header that maps CUDA's built-ins to host code, and kernels run block by block, one thread per
// block. GEMMs follow cuBLAS's column-major contract. No GPU, driver or NVRTC is involved.
#include <typegrad/cuda.hpp>

#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#ifndef TYPEGRAD_EMULATION_CXX
#define TYPEGRAD_EMULATION_CXX "c++"
#endif
#ifndef TYPEGRAD_EMULATION_DIR
#define TYPEGRAD_EMULATION_DIR "."
#endif

namespace cuda_emulation {

inline const char* header() {
    return R"EMU(// CUDA built-ins on the host, for typegrad's emulation test
#include <cmath>
#include <cstring>
#include <math.h>
struct tg_dim3 { unsigned x, y, z; };
static tg_dim3 threadIdx{0, 0, 0}, blockIdx{0, 0, 0}, blockDim{1, 1, 1}, gridDim{1, 1, 1};
extern "C" void tg_emulation_set(unsigned bx, unsigned by, unsigned gx, unsigned gy) {
    blockIdx = {bx, by, 0};
    gridDim = {gx, gy, 1};
}
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__ static
inline void __syncthreads() {}
template <class T> inline T __shfl_down_sync(unsigned, T v, int) { return v; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
inline double __longlong_as_double(long long i) { double d; std::memcpy(&d, &i, 8); return d; }
inline unsigned long long atomicMin(unsigned long long* p, unsigned long long value) {
    const unsigned long long old = *p;
    if (value < old) *p = value;
    return old;
}
inline unsigned long long atomicCAS(unsigned long long* p, unsigned long long expected, unsigned long long value) {
    const unsigned long long old = *p;
    if (old == expected) *p = value;
    return old;
}
)EMU";
}

class host_emulator final : public typegrad::cuda::detail::emulator {
public:
    void* load(const std::string& source) override {
        const std::string dir = TYPEGRAD_EMULATION_DIR;
        const std::string stem = dir + "/module_" + std::to_string(::getpid()) + "_" + std::to_string(store().modules.size());
        std::filesystem::create_directories(dir);
        {
            std::ofstream out(stem + ".cpp");
            out << "#define TG_EMULATION 1\n" << header() << source;
        }
        const std::string cmd = std::string(TYPEGRAD_EMULATION_CXX) +
                                " -std=c++17 -O1 -w -shared -fPIC -o '" + stem + ".so' '" + stem + ".cpp'";
        if (std::system(cmd.c_str()) != 0)
            throw typegrad::device_error("emulation: the host compiler rejected " + stem + ".cpp");
        void* lib = ::dlopen((stem + ".so").c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!lib) throw typegrad::device_error(std::string("emulation: dlopen: ") + ::dlerror());
        auto m = std::make_unique<module>();
        m->lib = lib;
        m->set = reinterpret_cast<void (*)(unsigned, unsigned, unsigned, unsigned)>(::dlsym(lib, "tg_emulation_set"));
        store().modules.push_back(std::move(m));
        ++loaded_;
        return store().modules.back().get();
    }
    void* function(void* mod, const char* name) override {
        auto* m = static_cast<module*>(mod);
        auto k = std::make_unique<kernel>();
        k->owner = m;
        k->run = reinterpret_cast<void (*)(const void*)>(::dlsym(m->lib, (std::string(name) + "_host").c_str()));
        if (!k->run) throw typegrad::device_error(std::string("emulation: no kernel ") + name);
        store().kernels.push_back(std::move(k));
        return store().kernels.back().get();
    }
    void launch(void* k, unsigned gx, unsigned gy, void* words) override {
        auto* kk = static_cast<kernel*>(k);
        for (unsigned by = 0; by < gy; ++by)
            for (unsigned bx = 0; bx < gx; ++bx) {
                kk->owner->set(bx, by, gx, gy);
                kk->run(words);
            }
    }
    void gemm(typegrad::cuda::detail::gemm_type type, bool ta, bool tb, int m, int n, int k, const void* a, int lda,
              long long sa, const void* b, int ldb, long long sb, void* c, int ldc, long long sc, int batch) override {
        using typegrad::cuda::detail::gemm_type;
        switch (type) {
            case gemm_type::f64: return run_gemm<double>(ta, tb, m, n, k, a, lda, sa, b, ldb, sb, c, ldc, sc, batch);
            case gemm_type::f32: return run_gemm<float>(ta, tb, m, n, k, a, lda, sa, b, ldb, sb, c, ldc, sc, batch);
            case gemm_type::bf16: return run_gemm<typegrad::bf16>(ta, tb, m, n, k, a, lda, sa, b, ldb, sb, c, ldc, sc, batch);
            case gemm_type::f16: return run_gemm<typegrad::f16>(ta, tb, m, n, k, a, lda, sa, b, ldb, sb, c, ldc, sc, batch);
        }
    }
    std::size_t modules() const { return loaded_; }

private:
    template <class T>
    static void run_gemm(bool ta, bool tb, int m, int n, int k, const void* a_, int lda, long long sa, const void* b_,
                         int ldb, long long sb, void* c_, int ldc, long long sc, int batch) {
        for (int p = 0; p < batch; ++p) {
            const T* a = static_cast<const T*>(a_) + p * sa;
            const T* b = static_cast<const T*>(b_) + p * sb;
            T* c = static_cast<T*>(c_) + p * sc;
            for (int j = 0; j < n; ++j)
                for (int i = 0; i < m; ++i) {
                    double acc = 0;
                    for (int l = 0; l < k; ++l) {
                        const T x = ta ? a[l + std::ptrdiff_t(i) * lda] : a[i + std::ptrdiff_t(l) * lda];
                        const T y = tb ? b[j + std::ptrdiff_t(l) * ldb] : b[l + std::ptrdiff_t(j) * ldb];
                        acc += double(x) * double(y);
                    }
                    // bf16/f16: accumulated wider, rounded once (as cuBLAS with f32 compute)
                    if constexpr (std::is_same_v<T, double>) c[i + std::ptrdiff_t(j) * ldc] = acc;
                    else c[i + std::ptrdiff_t(j) * ldc] = T(float(acc));
                }
        }
    }
    struct module {
        void* lib = nullptr;
        void (*set)(unsigned, unsigned, unsigned, unsigned) = nullptr;
    };
    struct kernel {
        module* owner = nullptr;
        void (*run)(const void*) = nullptr;
    };
    // Modules and kernels live until the process ends, as on a device: the backend caches a
    // plan's module per plan type (module_for), across emulator instances (tests in one process).
    struct storage {
        std::vector<std::unique_ptr<module>> modules;
        std::vector<std::unique_ptr<kernel>> kernels;
    };
    static storage& store() {
        static storage s;
        return s;
    }
    std::size_t loaded_ = 0;
};

// Installs an emulator for the lifetime of the object (one test process at a time).
class scoped_emulator {
public:
    scoped_emulator() { typegrad::cuda::detail::active_emulator() = &emulator_; }
    ~scoped_emulator() { typegrad::cuda::detail::active_emulator() = nullptr; }
    std::size_t modules() const { return emulator_.modules(); }

private:
    host_emulator emulator_;
};

}  // namespace cuda_emulation
