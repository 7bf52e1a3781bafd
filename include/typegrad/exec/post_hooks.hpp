#pragma once
// Post-accumulate hooks inside a step's schedule: when each runs (detail::post_hook_schedule, a
// constexpr table per plan) and the calls the schedule walk makes (exec/execute.hpp's run_loops).
#include <cstddef>
#include <span>

#include <typegrad/core/error.hpp>
#include <typegrad/exec/execute.hpp>
#include <typegrad/ops/hook.hpp>

namespace typegrad {

namespace detail {
// ---- post-accumulate hooks inside the schedule ------------------------------------------------
// A hook node's callables on a param buffer and its gradient: one function per (callables, dtype,
// rank), never per graph; the schedule walk calls it through post_hook_schedule's table.
template <class F, class T, std::size_t Rank>
void call_post_hook(void* param, void* grad, const std::size_t* ext) {
    const std::span<const std::size_t> e(ext, Rank);
    F{}(grad_view<T>{static_cast<T*>(param), e}, grad_view<T>{static_cast<T*>(grad), e});
}
template <class H>
using post_hook_leaf_t = typename underlying_leaf<type_at_t<0, typename H::children>>::type;

template <std::size_t K>
struct post_hook_table {
    std::size_t count = 0;
    std::size_t after[K + 1]{};
    post_hook_fn fn[K + 1]{};
    std::size_t store[K + 1]{};
    std::size_t param[K + 1]{};
    std::size_t param_ext[K + 1]{};
};

// When each post-accumulate hook of a call runs, as PyTorch: once its param's gradient is final,
// hooks of different params in the order their gradients complete (so a gradient all-reduce can
// start while the rest of the backward computes). A hook runs right after the later of two
// schedule steps of plan Plan: the loop that writes the gradient (store Grads-index of its leaf;
// nothing writes it again), and the last step that reads the param's buffer, because a hook may
// update the param (an optimizer in the backward) and later loops must still see the old value
// (dX = dY W^T reads W). Ties keep registration order (the hooks' order in the loss graph).
// Hooks: the step's post-accumulate hook nodes; those whose leaf has no grad_into do not run.
// ParamPlan: the plan whose state binds the params (value_and_grad: Plan; backward: the forward's,
// which holds every leaf even where the backward plan does not read it).
template <class Plan, class ParamPlan, class Grads, class Hooks>
struct post_hook_schedule;
template <class Plan, class ParamPlan, class Grads, class... Hs>
struct post_hook_schedule<Plan, ParamPlan, Grads, type_list<Hs...>> {
    static constexpr std::size_t K = sizeof...(Hs);
    static constexpr post_hook_table<K> make() {
        post_hook_table<K> t;
        if constexpr (K > 0) {
            constexpr std::size_t store[] = {index_of<post_hook_leaf_t<Hs>, Grads>::value...};
            constexpr std::size_t in_plan[] = {Plan::program::template id_of<post_hook_leaf_t<Hs>>::value...};
            constexpr std::size_t param[] = {ParamPlan::program::template id_of<post_hook_leaf_t<Hs>>::value...};
            constexpr post_hook_fn fn[] = {
                &call_post_hook<typename Hs::op::hook_type, typename post_hook_leaf_t<Hs>::value_type,
                                post_hook_leaf_t<Hs>::shape_type::rank>...};
            constexpr auto& steps = buffer_steps_v<Plan>;
            for (std::size_t h = 0; h < K; ++h) {
                if (store[h] >= Grads::size) continue;  // no grad_into: the hook does not run
                const std::size_t written = steps.store[store[h]];
                const std::size_t read = in_plan[h] < Plan::M ? steps.read[in_plan[h]] : no_step;
                const std::size_t after = written == no_step ? no_step : read != no_step && read > written ? read : written;
                // insertion by step, after the entries of the same step (registration order)
                std::size_t k = t.count++;
                for (; k > 0 && t.after[k - 1] > after; --k) {
                    t.after[k] = t.after[k - 1];
                    t.fn[k] = t.fn[k - 1];
                    t.store[k] = t.store[k - 1];
                    t.param[k] = t.param[k - 1];
                    t.param_ext[k] = t.param_ext[k - 1];
                }
                t.after[k] = after;
                t.fn[k] = fn[h];
                t.store[k] = store[h];
                t.param[k] = param[h];
                t.param_ext[k] = ParamPlan::rank_offset[param[h]];
            }
        }
        return t;
    }
    static constexpr post_hook_table<K> table = make();
};
// The calls for run_loops (functions of the table's size, not of the plan: see exec/execute.hpp);
// mut and ext: the state of the plan that binds the params.
template <std::size_t K>
post_hook_calls post_hook_calls_of(const post_hook_table<K>& t, void* const* mut, const std::size_t* ext) {
    return {t.count, t.after, t.fn, t.store, t.param, t.param_ext, mut, ext};
}
// A hook may update its param: it must have been bound writable (checked before anything runs).
template <std::size_t K>
void check_post_hook_params(const post_hook_table<K>& t, void* const* mut, const node_info* info) {
    for (std::size_t k = 0; k < t.count; ++k)
        if (mut[t.param[k]] == nullptr)
            fail<binding_error>({"typegrad: post_accumulate_grad_hook on ", info[t.param[k]].name,
                                 " writes the param, but it was bound read-only; bind a writable buffer"});
}

}  // namespace detail

}  // namespace typegrad
