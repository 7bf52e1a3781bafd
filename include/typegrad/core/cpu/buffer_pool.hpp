#pragma once
// Host buffers that outlive one call but not the next: a forward pass's context (step.forward()),
// of which tg::scan makes one per layer and call, and the temporaries of kernels (convolution's
// im2col and dense copies, pooling). Allocated afresh, each large buffer went back to
// the kernel when freed (glibc returns blocks above its mmap/trim thresholds), so every call
// faulted its pages in again and zeroed them: a quarter of a GPT training step's time. A
// pooled_buffer takes its memory from a per-thread cache of freed buffers instead, so a steady
// state of calls allocates nothing, as the step's own scratch arena (exec/step.hpp).
//
// The cache holds at most `max_cached` buffers per thread; a miss (no cached buffer is large
// enough) drops the smallest cached one, so a run whose sizes grow does not keep stale buffers.
// A buffer released on another thread (a context moved there) joins that thread's cache, and one
// released after its thread's cache is gone (a context in a static) is freed directly.
// Contents are uninitialised: plans initialise what they read (prepare_scratch).
#include <algorithm>
#include <cstddef>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace typegrad::detail {

class buffer_pool {
public:
    static constexpr std::size_t max_cached = 32;

    struct block {
        void* data = nullptr;
        std::size_t bytes = 0;
    };

    // A block of at least `bytes` bytes, 64-byte aligned.
    static block acquire(std::size_t bytes) {
        if (bytes == 0) return {};
        if (cache* c = local()) {
            std::vector<block>& f = c->free;
            std::size_t best = f.size(), smallest = f.size();
            for (std::size_t i = 0; i < f.size(); ++i) {
                if (f[i].bytes >= bytes && (best == f.size() || f[i].bytes < f[best].bytes)) best = i;
                if (smallest == f.size() || f[i].bytes < f[smallest].bytes) smallest = i;
            }
            if (best != f.size()) return take(f, best);
            if (smallest != f.size()) deallocate(take(f, smallest));
        }
        return {::operator new(bytes, std::align_val_t(64)), bytes};
    }
    // Returns b to this thread's cache (or frees it).
    static void release(block b) noexcept {
        if (!b.data) return;
        cache* c = local();
        if (c && c->free.size() < max_cached) {
            try {
                c->free.push_back(b);
                return;
            } catch (...) {
            }
        }
        deallocate(b);
    }
    // Buffers cached by the calling thread (for tests).
    static std::size_t cached_count() noexcept {
        cache* c = local();
        return c ? c->free.size() : 0;
    }

private:
    struct cache {
        std::vector<block> free;
        cache() { alive() = true; }
        ~cache() {
            alive() = false;
            for (const block& b : free) deallocate(b);
        }
    };
    // Constant-initialised and trivially destructible, so it can be read after the cache is gone.
    static bool& alive() noexcept {
        thread_local bool a = false;
        return a;
    }
    static cache* local() noexcept {
        thread_local cache c;  // (not constructed again once destroyed: alive() tells)
        return alive() ? &c : nullptr;
    }
    static block take(std::vector<block>& f, std::size_t i) noexcept {
        const block b = f[i];
        f[i] = f.back();
        f.pop_back();
        return b;
    }
    static void deallocate(block b) noexcept { ::operator delete(b.data, std::align_val_t(64)); }
};

// An owned buffer of `n` elements of T (trivial types only; uninitialised unless a value is
// given), from the calling thread's pool.
template <class T>
class pooled_buffer {
public:
    pooled_buffer() = default;
    explicit pooled_buffer(std::size_t n) : block_(buffer_pool::acquire(n * sizeof(T))), size_(n) {}
    pooled_buffer(std::size_t n, T value) : pooled_buffer(n) { std::fill_n(data(), n, value); }
    pooled_buffer(pooled_buffer&& o) noexcept
        : block_(std::exchange(o.block_, buffer_pool::block{})), size_(std::exchange(o.size_, 0)) {}
    pooled_buffer& operator=(pooled_buffer&& o) noexcept {
        if (this != &o) {
            buffer_pool::release(block_);
            block_ = std::exchange(o.block_, buffer_pool::block{});
            size_ = std::exchange(o.size_, 0);
        }
        return *this;
    }
    pooled_buffer(const pooled_buffer&) = delete;
    pooled_buffer& operator=(const pooled_buffer&) = delete;
    ~pooled_buffer() { buffer_pool::release(block_); }

    T* data() const noexcept { return static_cast<T*>(block_.data); }
    std::size_t size() const noexcept { return size_; }
    T& operator[](std::size_t i) const noexcept { return data()[i]; }
    T* begin() const noexcept { return data(); }
    T* end() const noexcept { return data() + size_; }

private:
    buffer_pool::block block_{};
    std::size_t size_ = 0;
};

// The result as a dense array of C: the output buffer itself when it has the compute dtype, else
// a buffer rounded into it by store() (once, at the end). Kernel outputs never overlap operands.
template <class C, class T>
struct dense_output {
    pooled_buffer<C> own;
    C* data;
    dense_output(T* out, std::size_t n) {
        if constexpr (std::is_same_v<T, C>) data = out;
        else {
            own = pooled_buffer<C>(n);
            data = own.data();
        }
    }
    void store(T* out) const {
        if constexpr (!std::is_same_v<T, C>)
            for (std::size_t e = 0; e < own.size(); ++e) out[e] = T(own[e]);
    }
};

}  // namespace typegrad::detail
