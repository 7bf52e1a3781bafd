#pragma once
// Learning-rate schedules: callables from a step (or epoch) count to a learning rate, in the
// closed forms of PyTorch's schedulers. Assign the result to an optimizer before its step:
//   tg::cosine_annealing_lr sched{.base_lr = 1e-3, .t_max = 1000};
//   opt.options.lr = sched(t);
// Compose warmup with another schedule through tg::warmup_lr{.warmup_steps, ..., .after = sched}.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>

namespace typegrad {

// torch.optim.lr_scheduler.StepLR: base_lr * gamma^floor(t / step_size).
struct step_lr {
    // The learning rate at t = 0.
    double base_lr;
    // Steps between two decays.
    std::int64_t step_size;
    // The factor of each decay.
    double gamma = 0.1;
    // The learning rate at step t.
    double operator()(std::int64_t t) const {
        return base_lr * std::pow(gamma, double(t / std::max<std::int64_t>(step_size, 1)));
    }
};

// torch.optim.lr_scheduler.CosineAnnealingLR in its closed form:
// eta_min + (base_lr - eta_min) * (1 + cos(pi * t / t_max)) / 2 (past t_max it rises again, as
// PyTorch's does; stop at t_max or wrap it in your own clamp).
struct cosine_annealing_lr {
    // The learning rate at t = 0, the maximum.
    double base_lr;
    // Steps of the half cosine down to eta_min.
    std::int64_t t_max;
    // The learning rate at t_max.
    double eta_min = 0;
    // The learning rate at step t.
    double operator()(std::int64_t t) const {
        const double progress = double(t) / double(std::max<std::int64_t>(t_max, 1));
        return eta_min + (base_lr - eta_min) * (1 + std::cos(std::numbers::pi * progress)) / 2;
    }
};

// torch.optim.lr_scheduler.LinearLR: base_lr times a factor going linearly from start_factor to
// end_factor over total_iters steps, then constant.
struct linear_lr {
    // The learning rate the factors multiply.
    double base_lr;
    // The factor at t = 0.
    double start_factor = 1.0 / 3;
    // The factor from total_iters on.
    double end_factor = 1.0;
    // Steps from start_factor to end_factor.
    std::int64_t total_iters = 5;
    // The learning rate at step t.
    double operator()(std::int64_t t) const {
        const double k = double(std::min(t, total_iters)) / double(std::max<std::int64_t>(total_iters, 1));
        return base_lr * (start_factor + (end_factor - start_factor) * k);
    }
};

// Linear warmup from start_factor * after(0) to after(0) over warmup_steps, then after(t -
// warmup_steps) (PyTorch: SequentialLR of LinearLR then `after`).
template <class After>
struct warmup_lr {
    // Steps of the linear warmup.
    std::int64_t warmup_steps;
    // The schedule after the warmup (its t starts at 0 when the warmup ends).
    After after;
    // The factor of after(0) at t = 0.
    double start_factor = 0;
    // The learning rate at step t.
    double operator()(std::int64_t t) const {
        if (t >= warmup_steps) return after(t - warmup_steps);
        const double k = double(t) / double(warmup_steps);
        return after(0) * (start_factor + (1 - start_factor) * k);
    }
};
// Deduces After: tg::warmup_lr{100, tg::cosine_annealing_lr{...}, 0.1}.
template <class After>
warmup_lr(std::int64_t, After, double) -> warmup_lr<After>;
// Deduces After: tg::warmup_lr{100, tg::cosine_annealing_lr{...}}.
template <class After>
warmup_lr(std::int64_t, After) -> warmup_lr<After>;

}  // namespace typegrad
