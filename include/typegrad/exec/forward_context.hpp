#pragma once
// The saved context of a host forward pass (step.forward(...)), which step.backward(ctx, ...)
// reads. The device backend has its own (exec/cuda/step.hpp: tg::cuda::forward_context).
#include <cstddef>
#include <span>

#include <typegrad/core/cpu/buffer_pool.hpp>
#include <typegrad/exec/execute.hpp>

namespace typegrad {

template <class Policy, class Loss, class... Wrt>
class step;

// The saved context of a forward pass: the loss value, the extents and addresses of the bound
// inputs (they must stay alive and unchanged until backward), and the reductions the backward
// reads. Move-only: the saved addresses point into its own storage.
template <class Step, class ForwardPlan>
class forward_context {
public:
    // The step that made the context.
    using step_type = Step;
    // The forward plan (its saved values are what backward reads).
    using plan_type = ForwardPlan;
    // The output's dtype.
    using value_type = typename Step::value_type;

    forward_context() = default;
    // Moves the saved state; contexts are not copyable.
    forward_context(forward_context&&) noexcept = default;
    // Move assignment.
    forward_context& operator=(forward_context&&) noexcept = default;
    forward_context(const forward_context&) = delete;
    forward_context& operator=(const forward_context&) = delete;

    // The scalar loss.
    value_type value() const {
        static_assert(Step::scalar_loss, "typegrad: value() is for scalar outputs; use values().");
        return *loss_;
    }
    // The output's elements in row-major order.
    std::span<const value_type> values() const { return {loss_, loss_size_}; }

private:
    typename ForwardPlan::state_type state_{};
    detail::pooled_buffer<detail::scratch_unit> storage_;  // (reused across calls: core/cpu/buffer_pool.hpp)
    const value_type* loss_ = nullptr;
    std::size_t loss_size_ = 0;
    template <class, class, class...>
    friend class step;
};

}  // namespace typegrad
