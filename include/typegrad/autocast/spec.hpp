#pragma once
// Autocast specs: the C++ form of torch.autocast's arguments (device, dtype, enabled) as types,
// with the device tags tg::cpu and tg::cuda_device. tg::autocast<Spec>(expr) (autocast/rewrite.hpp)
// takes one; docs/autocast.md.
#include <string_view>
#include <type_traits>

#include <typegrad/core/dtype.hpp>
#include <typegrad/ops/op_base.hpp>

namespace typegrad {

// The CPU device tag of autocast specs (PyTorch: device_type="cpu"); default dtype bf16.
struct cpu {
    // device_kind::cpu.
    static constexpr device_kind kind = device_kind::cpu;
    // "cpu", as tg::describe shows it.
    static constexpr std::string_view name = "cpu";
    // The autocast dtype when the spec names none (PyTorch's CPU default).
    using default_dtype = bf16;
};
// tg::cuda is the CUDA backend's namespace (tg::cuda::tensor), so the device tag has its own name.
struct cuda_device {
    // device_kind::cuda.
    static constexpr device_kind kind = device_kind::cuda;
    // "cuda", as tg::describe shows it.
    static constexpr std::string_view name = "cuda";
    // The autocast dtype when the spec names none (PyTorch's CUDA default).
    using default_dtype = f16;
};

// True for the device tags tg::cpu and tg::cuda_device.
template <class D>
inline constexpr bool is_device_v = std::is_same_v<D, cpu> || std::is_same_v<D, cuda_device>;

namespace detail {
template <class D, bool = is_device_v<D>>
struct default_autocast_dtype {
    using type = float;  // only reached with an unknown device, which autocast_spec rejects
};
template <class D>
struct default_autocast_dtype<D, true> {
    using type = typename D::default_dtype;
};
}  // namespace detail

// An autocast context as a type, the C++ form of torch.autocast's arguments: device (tg::cpu or
// tg::cuda_device), dtype (default bf16 on the CPU, f16 on CUDA) and whether it is enabled.
template <class Device, class DType = typename detail::default_autocast_dtype<Device>::type, bool Enabled = true>
struct autocast_spec {
    static_assert(is_device_v<Device>,
                  "typegrad: autocast_spec<Device, ...> names an unknown device; the devices are tg::cpu and tg::cuda_device.");
    static_assert(is_reduced_precision_v<DType> || std::is_same_v<DType, float>,
                  "typegrad: autocast_spec<Device, DType> needs a floating autocast dtype: tg::bf16, tg::f16 "
                  "(or float, which casts nothing down).");
    // tg::cpu or tg::cuda_device.
    using device = Device;
    // The lower-precision dtype lower_precision ops run in.
    using dtype = DType;
    // False for a region that turns autocast off (torch.autocast(enabled=False)).
    static constexpr bool enabled = Enabled;
};

// The usual specs: CPU or CUDA autocast to bf16 or f16, and a disabled region.
using cpu_bf16 = autocast_spec<cpu, bf16>;
// CPU autocast to f16.
using cpu_f16 = autocast_spec<cpu, f16>;
// CUDA autocast to f16 (PyTorch's CUDA default).
using cuda_f16 = autocast_spec<cuda_device, f16>;
// CUDA autocast to bf16.
using cuda_bf16 = autocast_spec<cuda_device, bf16>;
// A region with autocast disabled on Device: tg::autocast<tg::autocast_disabled<tg::cpu>>(e).
template <class Device>
using autocast_disabled = autocast_spec<Device, typename detail::default_autocast_dtype<Device>::type, false>;

// "No autocast": the spec of a step compiled without a region, and of backward_autocast::off.
struct no_autocast {
    // Always false.
    static constexpr bool enabled = false;
};

// True for autocast_spec<...> and no_autocast.
template <class S>
inline constexpr bool is_autocast_spec_v = std::is_same_v<S, no_autocast>;
// Every autocast_spec is a spec.
template <class D, class T, bool E>
inline constexpr bool is_autocast_spec_v<autocast_spec<D, T, E>> = true;

}  // namespace typegrad
