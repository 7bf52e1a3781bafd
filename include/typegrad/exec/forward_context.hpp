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

namespace detail {

// What the host's and the device's forward contexts share (the device's: exec/cuda/step.hpp):
// the step and plan they come from, the output's dtype, value() over the context's values(), the
// plan's bound state; move-only (the saved addresses point into the context's own storage).
template <class Context, class Step, class ForwardPlan>
class forward_context_base {
public:
    // The step that made the context.
    using step_type = Step;
    // The forward plan (its saved values are what backward reads).
    using plan_type = ForwardPlan;
    // The output's dtype.
    using value_type = typename Step::value_type;

    forward_context_base() = default;
    // Moves the saved state; contexts are not copyable.
    forward_context_base(forward_context_base&&) noexcept = default;
    // Move assignment (frees what the context held).
    forward_context_base& operator=(forward_context_base&&) noexcept = default;
    forward_context_base(const forward_context_base&) = delete;
    forward_context_base& operator=(const forward_context_base&) = delete;

    // The scalar output.
    value_type value() const {
        static_assert(Step::scalar_loss, "typegrad: value() is for scalar outputs; use values().");
        return static_cast<const Context&>(*this).values()[0];
    }

protected:
    typename ForwardPlan::state_type state_{};
};

}  // namespace detail

// The saved context of a forward pass on the host: the loss value, the extents and addresses of
// the bound inputs (they must stay alive and unchanged until backward), and the reductions the
// backward reads.
template <class Step, class ForwardPlan>
class forward_context : public detail::forward_context_base<forward_context<Step, ForwardPlan>, Step, ForwardPlan> {
public:
    using typename detail::forward_context_base<forward_context, Step, ForwardPlan>::value_type;
    // The output's elements in row-major order.
    std::span<const value_type> values() const { return {loss_, loss_size_}; }

private:
    detail::pooled_buffer<detail::scratch_unit> storage_;  // (reused across calls: core/cpu/buffer_pool.hpp)
    const value_type* loss_ = nullptr;
    std::size_t loss_size_ = 0;
    template <class, class, class...>
    friend class step;
};

}  // namespace typegrad
