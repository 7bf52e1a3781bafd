#pragma once
// A growable array for the graph algorithms that run as constant evaluations (topological
// order, planner, loop layouts). std::vector works there too, but g++ evaluates its allocator,
// iterator and construct_at layers operation by operation and stops one evaluation after 2^25
// operations (-fconstexpr-ops-limit): on a 12-block model's joint graph the planner alone went
// past that, and the resulting error message (which spells the graph type) ran the compiler out
// of memory. cvec costs a few operations per access. Elements are only read after being
// written; capacity grows by doubling.
#include <cstddef>

namespace typegrad::detail {

template <class T>
class cvec {
public:
    constexpr cvec() = default;
    constexpr explicit cvec(std::size_t n, const T& v = T{}) { assign(n, v); }
    constexpr cvec(const cvec& o) { copy_from(o); }
    constexpr cvec(cvec&& o) noexcept : data_(o.data_), size_(o.size_), cap_(o.cap_) {
        o.data_ = nullptr;
        o.size_ = o.cap_ = 0;
    }
    constexpr cvec& operator=(const cvec& o) {
        if (this != &o) {
            clear();
            copy_from(o);
        }
        return *this;
    }
    constexpr cvec& operator=(cvec&& o) noexcept {
        if (this != &o) {
            delete[] data_;
            data_ = o.data_;
            size_ = o.size_;
            cap_ = o.cap_;
            o.data_ = nullptr;
            o.size_ = o.cap_ = 0;
        }
        return *this;
    }
    constexpr ~cvec() { delete[] data_; }

    // Loops that run once per node take data() and index the pointer: every call costs clang
    // steps of its 2^20 per constant evaluation (two for operator[]), a built-in subscript none.
    constexpr T* data() { return data_; }
    constexpr const T* data() const { return data_; }
    constexpr T& operator[](std::size_t i) { return data_[i]; }
    constexpr const T& operator[](std::size_t i) const { return data_[i]; }
    constexpr std::size_t size() const { return size_; }
    constexpr bool empty() const { return size_ == 0; }
    constexpr T* begin() { return data_; }
    constexpr T* end() { return data_ + size_; }
    constexpr const T* begin() const { return data_; }
    constexpr const T* end() const { return data_ + size_; }
    constexpr T& back() { return data_[size_ - 1]; }
    constexpr const T& front() const { return data_[0]; }

    constexpr void push_back(const T& v) {
        if (size_ == cap_) reserve(cap_ ? 2 * cap_ : 16);
        data_[size_++] = v;
    }
    constexpr void pop_back() { --size_; }
    constexpr void clear() { size_ = 0; }
    // n copies of v (the old elements are dropped)
    constexpr void assign(std::size_t n, const T& v) {
        if (n > cap_) {
            delete[] data_;
            data_ = new T[n];
            cap_ = n;
        }
        for (std::size_t i = 0; i < n; ++i) data_[i] = v;
        size_ = n;
    }
    // n elements, the first min(n, size()) kept (new storage is value-initialized)
    constexpr void resize(std::size_t n) {
        reserve(n);
        size_ = n;
    }
    constexpr void reserve(std::size_t c) {
        if (c <= cap_) return;
        T* d = new T[c]{};  // value-initialized: resize() may copy elements never written
        for (std::size_t i = 0; i < size_; ++i) d[i] = static_cast<T&&>(data_[i]);
        delete[] data_;
        data_ = d;
        cap_ = c;
    }

private:
    constexpr void copy_from(const cvec& o) {
        reserve(o.size_);
        for (std::size_t i = 0; i < o.size_; ++i) data_[i] = o.data_[i];
        size_ = o.size_;
    }

    T* data_ = nullptr;
    std::size_t size_ = 0;
    std::size_t cap_ = 0;
};

}  // namespace typegrad::detail
