#pragma once
// The seam between a compiled step and an optional device backend (docs/cuda.md). A binding in
// device memory (its `space`) or a forward context that lives on a device (a member
// `typegrad_device_argument`) is a device argument; a step call with any such argument is handed to device_backend<Step>, which the backend
// (typegrad/cuda.hpp) defines. Nothing here depends on CUDA.
#include <type_traits>

#include <typegrad/graph/type_list.hpp>

namespace typegrad::detail {

// Where a binding's buffer lives (exec/bind.hpp's bindings carry it as their `space`).
enum class memory_space { host, device };

template <class T>
concept device_argument = requires { std::remove_cvref_t<T>::typegrad_device_argument; } ||
                          requires { requires std::remove_cvref_t<T>::space == memory_space::device; };

// not a fold: clang refuses one over more than 256 operands (a 12-block model's call binds 289)
template <class... Ts>
inline constexpr bool any_device_argument = any_true({device_argument<Ts>...});

// Defined by a device backend (typegrad/cuda.hpp defines it; device arguments exist only there).
template <class Step>
struct device_backend;

}  // namespace typegrad::detail
