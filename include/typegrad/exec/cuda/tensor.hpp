#pragma once
// Device buffers and device bindings.
//   tg::cuda::tensor<T, Shape>       owns device memory (cuMemAlloc; never managed memory); copies
//                                    to and from the host are explicit (copy_from, copy_to, to_host)
//   tg::bind(x, t)                   binds a device tensor to a leaf: the step runs on the device
//   tg::grad_into(W, t[, tg::accumulate]), tg::seed(t)
//   tg::cuda::bind(x, tg::cuda::device_ptr<const T>{p}, {n, 3})   a raw device address
//   tg::cuda::grad_into(W, tg::cuda::device_ptr<T>{p}, size)
// A call whose bindings are all device bindings runs on the device; a host binding mixed in is
// a tg::device_error before anything runs.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include <typegrad/core/error.hpp>
#include <typegrad/exec/bind.hpp>
#include <typegrad/exec/cuda/runtime.hpp>
#include <typegrad/graph/node.hpp>

namespace typegrad::cuda {

// A device address. Never dereferenced on the host.
template <class T>
struct device_ptr {
    // The device address.
    T* address = nullptr;
};

namespace detail {

using typegrad::detail::message;

// Device memory: allocation and explicit copies (all synchronous, on the legacy default stream).
inline void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    if (active_emulator()) return ::operator new(bytes, std::align_val_t(256));
    CUdeviceptr p = 0;
    check(api().cuMemAlloc(&p, bytes), "cuMemAlloc");
    return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p));
}
inline void release(void* p) noexcept {
    if (p && active_emulator()) return ::operator delete(p, std::align_val_t(256));
    const driver_api& a = driver_functions();
    if (p && a.loaded) a.cuMemFree(static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p)));
}
inline CUdeviceptr address(const void* p) { return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p)); }
inline void copy_to_device(void* dst, const void* src, std::size_t bytes) {
    if (bytes && active_emulator()) std::memcpy(dst, src, bytes);
    else if (bytes) check(api().cuMemcpyHtoD(address(dst), src, bytes), "cuMemcpyHtoD");
}
inline void copy_to_host(void* dst, const void* src, std::size_t bytes) {
    if (bytes && active_emulator()) std::memcpy(dst, src, bytes);
    else if (bytes) check(api().cuMemcpyDtoH(dst, address(src), bytes), "cuMemcpyDtoH");
}
inline void copy_on_device(void* dst, const void* src, std::size_t bytes) {
    if (bytes && active_emulator()) std::memcpy(dst, src, bytes);
    else if (bytes) check(api().cuMemcpyDtoD(address(dst), address(src), bytes), "cuMemcpyDtoD");
}
inline void zero_on_device(void* dst, std::size_t bytes) {
    if (bytes && active_emulator()) std::memset(dst, 0, bytes);
    else if (bytes) check(api().cuMemsetD8(address(dst), 0, bytes), "cuMemsetD8");
}

// A growable device buffer (scratch arenas, saved forward values). Move-only.
class device_buffer {
public:
    device_buffer() = default;
    explicit device_buffer(std::size_t bytes) : data_(allocate(bytes)), bytes_(bytes) {}
    device_buffer(device_buffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
    device_buffer& operator=(device_buffer&& o) noexcept {
        if (this != &o) {
            release(data_);
            data_ = std::exchange(o.data_, nullptr);
            bytes_ = std::exchange(o.bytes_, 0);
        }
        return *this;
    }
    device_buffer(const device_buffer&) = delete;
    device_buffer& operator=(const device_buffer&) = delete;
    ~device_buffer() { release(data_); }
    // At least `bytes`, keeping nothing (grows geometrically; never shrinks).
    void reserve(std::size_t bytes) {
        if (bytes <= bytes_) return;
        const std::size_t want = bytes > 2 * bytes_ ? bytes : 2 * bytes_;
        void* p = allocate(want);
        release(data_);
        data_ = p;
        bytes_ = want;
    }
    void* data() const { return data_; }
    std::size_t bytes() const { return bytes_; }

private:
    void* data_ = nullptr;
    std::size_t bytes_ = 0;
};

// Device bindings: the call layer's binding templates in device memory (exec/bind.hpp).
template <class Leaf>
using device_leaf_binding = typegrad::detail::leaf_binding<Leaf, typegrad::detail::memory_space::device>;
template <class Leaf, bool Accumulate>
using device_grad_binding = typegrad::detail::grad_binding<Leaf, Accumulate, typegrad::detail::memory_space::device>;
template <class T>
using device_seed_binding = typegrad::detail::seed_binding<T, typegrad::detail::memory_space::device>;

}  // namespace detail

// A dense row-major tensor in device memory.
template <class T, class Shape>
class tensor {
    static_assert(is_dtype_v<T> || is_index_type_v<T>,
                  "typegrad: cuda::tensor<T, Shape> holds float, double, tg::bf16, tg::f16, std::int32_t or std::int64_t.");
    static_assert(typegrad::detail::is_shape_v<Shape>, "typegrad: cuda::tensor<T, Shape> needs a tg::shape<...>.");

public:
    // The element type.
    using value_type = T;
    // The declared shape (tg::shape<...>, tg::dyn for run-time extents).
    using shape_type = Shape;
    // The number of axes.
    static constexpr std::size_t rank = Shape::rank;

    // Static shapes only: uninitialised device memory of the shape's size.
    tensor() requires(Shape::is_static) : tensor(static_extents()) {}
    // Uninitialised device memory of the given extents (static ones must match).
    explicit tensor(const std::array<std::size_t, rank>& extents) : extents_(extents) {
        for (std::size_t a = 0; a < rank; ++a)
            if (Shape::extents[a] != dyn && extents[a] != Shape::extents[a])
                typegrad::detail::fail<shape_error>({"typegrad: cuda::tensor: axis ", a, " has extent ", extents[a],
                                                     " but the shape declares ", Shape::extents[a]});
        buffer_ = detail::device_buffer(size() * sizeof(T));
    }
    // A device copy of host data (its size must fill the extents).
    template <class R>
        requires std::ranges::contiguous_range<R> && std::ranges::sized_range<R>
    static tensor from_host(const R& host, const std::array<std::size_t, rank>& extents) {
        tensor t(extents);
        t.copy_from(host);
        return t;
    }
    // A device copy of host data, the extents inferred from its size (at most one dynamic extent).
    template <class R>
        requires std::ranges::contiguous_range<R> && std::ranges::sized_range<R> && (Shape::dyn_count <= 1)
    static tensor from_host(const R& host) {
        return from_host(host, typegrad::detail::infer_extents<leaf<name_of_t<"tensor">, T, Shape, leaf_role::input>>(
                                   std::ranges::size(host)));
    }

    // Moves the device buffer; tensors are not copyable.
    tensor(tensor&&) noexcept = default;
    // Move assignment (frees the previous device buffer).
    tensor& operator=(tensor&&) noexcept = default;
    tensor(const tensor&) = delete;
    tensor& operator=(const tensor&) = delete;

    // Host -> device; the host range must have size() elements.
    template <class R>
        requires std::ranges::contiguous_range<R> && std::ranges::sized_range<R>
    void copy_from(const R& host) {
        static_assert(std::is_same_v<std::remove_cv_t<std::ranges::range_value_t<R>>, T>,
                      "typegrad: cuda::tensor::copy_from(range) needs a range of the tensor's element type.");
        check_size(std::ranges::size(host), "copy_from");
        detail::copy_to_device(buffer_.data(), std::ranges::data(host), size() * sizeof(T));
    }
    // Device -> host; the host range must have size() elements.
    template <class R>
        requires std::ranges::contiguous_range<R> && std::ranges::sized_range<R>
    void copy_to(R&& host) const {
        static_assert(std::is_same_v<std::remove_cv_t<std::ranges::range_value_t<R>>, T>,
                      "typegrad: cuda::tensor::copy_to(range) needs a range of the tensor's element type.");
        check_size(std::ranges::size(host), "copy_to");
        detail::copy_to_host(std::ranges::data(host), buffer_.data(), size() * sizeof(T));
    }
    // A host copy of the data.
    std::vector<T> to_host() const {
        std::vector<T> v(size());
        copy_to(v);
        return v;
    }
    // Sets every byte to zero.
    void zero() {
        detail::zero_on_device(buffer_.data(), size() * sizeof(T));
    }

    // The device address (never dereference it on the host).
    T* data() { return static_cast<T*>(buffer_.data()); }
    // The device address (never dereference it on the host).
    const T* data() const { return static_cast<const T*>(buffer_.data()); }
    // The number of elements.
    std::size_t size() const {
        std::size_t n = 1;
        for (std::size_t e : extents_) n *= e;
        return n;
    }
    // The extents, row-major.
    const std::array<std::size_t, rank>& extents() const { return extents_; }

private:
    static std::array<std::size_t, rank> static_extents() {
        std::array<std::size_t, rank> e{};
        for (std::size_t a = 0; a < rank; ++a) e[a] = Shape::extents[a];
        return e;
    }
    void check_size(std::size_t n, const char* what) const {
        if (n != size())
            typegrad::detail::fail<shape_error>({"typegrad: cuda::tensor::", what, ": the host range has ", n,
                                                 " elements but the tensor has ", size()});
    }
    std::array<std::size_t, rank> extents_{};
    detail::device_buffer buffer_;
};

namespace detail {
template <class Leaf, class T>
constexpr void check_element_type() {
    static_assert(std::is_same_v<T, typename Leaf::value_type>,
                  "typegrad: binding a device buffer needs the leaf's dtype (a float leaf binds float data, a "
                  "double leaf double data); convert the data first, typegrad never converts silently");
}
template <class E>
constexpr void check_leaf() {
    static_assert(is_leaf_v<typename E::node_type>,
                  "typegrad: cuda bind(leaf, buffer) binds a leaf (tg::param or tg::input), not an expression.");
}
template <class E>
constexpr void check_grad_leaf() {
    using L = typename E::node_type;
    static_assert(is_leaf_v<L> || retained_node_v<L>,
                  "typegrad: grad_into(leaf, device buffer) names a leaf (a tg::param) or a tg::retain_grad(...) "
                  "expression.");
}
}  // namespace detail

// tg::cuda::bind(leaf, device_ptr, {extents...}): a raw device address holding the leaf's data,
// dense and row-major, with the given extents.
template <class E, class T>
auto bind(E, device_ptr<T> p, std::type_identity_t<std::array<std::size_t, E::node_type::shape_type::rank>> extents) {
    detail::check_leaf<E>();
    using Leaf = typename E::node_type;
    detail::check_element_type<Leaf, std::remove_cv_t<T>>();
    detail::device_leaf_binding<Leaf> b;
    b.data = p.address;
    b.extents = extents;
    return b;
}
// The gradient of leaf E written to `size` elements at device address p (row-major, overwritten).
template <class E, class T>
auto grad_into(E, device_ptr<T> p, std::size_t size) {
    detail::check_grad_leaf<E>();
    using Leaf = typename E::node_type;
    static_assert(!std::is_const_v<T>, "typegrad: cuda::grad_into(leaf, device_ptr, size) needs a writable address.");
    detail::check_element_type<Leaf, T>();
    return detail::device_grad_binding<Leaf, false>{p.address, size};
}
// The gradient of leaf E added to `size` elements at device address p.
template <class E, class T>
auto grad_into(E, device_ptr<T> p, std::size_t size, accumulate_t) {
    detail::check_grad_leaf<E>();
    using Leaf = typename E::node_type;
    detail::check_element_type<Leaf, T>();
    return detail::device_grad_binding<Leaf, true>{p.address, size};
}
// The output gradient of a non-scalar step's backward, from `size` elements on the device.
template <class T>
auto seed(device_ptr<const T> p, std::size_t size) {
    return detail::device_seed_binding<T>{p.address, size};
}

}  // namespace typegrad::cuda

namespace typegrad {

// tg::bind / tg::grad_into / tg::seed with a device tensor: the call runs on the device.
template <class E, class T, class S>
auto bind(E, const cuda::tensor<T, S>& t) {
    cuda::detail::check_leaf<E>();
    using Leaf = typename E::node_type;
    cuda::detail::check_element_type<Leaf, T>();
    static_assert(S::rank == Leaf::shape_type::rank,
                  "typegrad: bind(leaf, cuda::tensor): the tensor's rank differs from the leaf's.");
    cuda::detail::device_leaf_binding<Leaf> b;
    b.data = t.data();
    b.size = t.size();
    b.extents = t.extents();
    return b;
}
// The gradient of leaf E written into a device tensor.
template <class E, class T, class S>
auto grad_into(E, cuda::tensor<T, S>& t) {
    cuda::detail::check_grad_leaf<E>();
    cuda::detail::check_element_type<typename E::node_type, T>();
    return cuda::detail::device_grad_binding<typename E::node_type, false>{t.data(), t.size()};
}
// The gradient of leaf E added to a device tensor.
template <class E, class T, class S>
auto grad_into(E, cuda::tensor<T, S>& t, accumulate_t) {
    cuda::detail::check_grad_leaf<E>();
    cuda::detail::check_element_type<typename E::node_type, T>();
    return cuda::detail::device_grad_binding<typename E::node_type, true>{t.data(), t.size()};
}
// The output gradient of a non-scalar step's backward, from a device tensor.
template <class T, class S>
auto seed(const cuda::tensor<T, S>& t) {
    return cuda::detail::device_seed_binding<T>{t.data(), t.size()};
}

}  // namespace typegrad
