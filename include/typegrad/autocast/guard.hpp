#pragma once
// The autocast context at run time: tg::autocast_guard declares the context a backward runs in,
// which the step compares with the one it was compiled for (tg::autocast_mismatch).
#include <string>
#include <string_view>

#include <typegrad/autocast/spec.hpp>
#include <typegrad/core/dtype.hpp>
#include <typegrad/core/error.hpp>

namespace typegrad {

// A run-time image of a spec, for comparing the context a backward runs in with the one its
// step was compiled for.
struct autocast_state {
    // Whether autocast is on.
    bool enabled = false;
    // The device (meaningful when enabled).
    device_kind device = device_kind::cpu;
    // The autocast dtype's name ("bf16", "f16"; meaningful when enabled).
    std::string_view dtype{};
    // Equal when both are disabled, or both enabled with the same device and dtype.
    friend constexpr bool operator==(const autocast_state& a, const autocast_state& b) {
        return a.enabled == b.enabled && (!a.enabled || (a.device == b.device && a.dtype == b.dtype));
    }
};
// The run-time image of a spec.
template <class Spec>
constexpr autocast_state autocast_state_of() {
    if constexpr (!Spec::enabled) return {};
    else return {true, Spec::device::kind, dtype_name<typename Spec::dtype>()};
}
// "no autocast" or "device/dtype", as error messages and tg::describe show it.
inline std::string describe_autocast(const autocast_state& s) {
    if (!s.enabled) return "no autocast";
    return detail::message(s.device == device_kind::cpu ? "cpu" : "cuda", "/", s.dtype);
}

// The backward ran under a context that contradicts the one its step was compiled for.
struct autocast_mismatch : error {
    using error::error;
};

namespace detail {
struct guard_slot {
    bool active = false;
    autocast_state state{};
};
inline guard_slot& current_guard() {
    thread_local guard_slot slot;
    return slot;
}
}  // namespace detail

// Declares the autocast context of this thread (RAII; nests, restoring the outer one).
template <class Spec>
class autocast_guard {
public:
    static_assert(is_autocast_spec_v<Spec>, "typegrad: autocast_guard<Spec> takes a tg::autocast_spec<...>.");
    autocast_guard() : saved_(detail::current_guard()) { detail::current_guard() = {true, autocast_state_of<Spec>()}; }
    ~autocast_guard() { detail::current_guard() = saved_; }
    autocast_guard(const autocast_guard&) = delete;
    autocast_guard& operator=(const autocast_guard&) = delete;

private:
    detail::guard_slot saved_;
};

}  // namespace typegrad
