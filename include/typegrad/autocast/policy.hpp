#pragma once
// compile<> policies for autocast: the backward's context (backward_autocast::same_as_forward,
// off, custom<Spec>) and what a backward under a contradicting tg::autocast_guard does.
#include <typegrad/autocast/spec.hpp>

namespace typegrad {

// compile<> policies for the backward's autocast context.
namespace backward_autocast {
// Every backward op runs under the ambient autocast of the step, as in PyTorch (the default).
struct same_as_forward {};
// No autocast in the backward: backward ops run in their inputs' dtypes.
struct off {};
// Every backward op runs under Spec, whatever the forward's autocast.
template <class Spec>
struct custom {
    static_assert(is_autocast_spec_v<Spec>,
                  "typegrad: backward_autocast::custom<Spec> takes a tg::autocast_spec<Device, DType>.");
    // The spec the backward ops run under.
    using spec = Spec;
};
}  // namespace backward_autocast

namespace on_autocast_mismatch {
// Default: backward under a tg::autocast_guard that contradicts the step's policy throws
// autocast_mismatch.
struct raise {};
// compile<tg::on_autocast_mismatch::ignore>: no check (as PyTorch, which cannot check).
struct ignore {};
}  // namespace on_autocast_mismatch

}  // namespace typegrad
