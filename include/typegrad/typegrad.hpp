#pragma once
// typegrad: reverse-mode automatic differentiation in which the computation graph is a type.
// The only header users need.
#include <typegrad/core/version.hpp>  // first: its C++20 check must be the first error
#include <typegrad/core/dtype.hpp>
#include <typegrad/core/error.hpp>
#include <typegrad/core/fixed_string.hpp>
#include <typegrad/core/philox.hpp>
#include <typegrad/core/shape.hpp>
#include <typegrad/core/threads.hpp>
#include <typegrad/graph/node.hpp>
#include <typegrad/ops/activation.hpp>
#include <typegrad/ops/arg_reduce.hpp>
#include <typegrad/ops/arithmetic.hpp>
#include <typegrad/ops/attention.hpp>
#include <typegrad/ops/batch_norm.hpp>
#include <typegrad/ops/broadcast.hpp>
#include <typegrad/ops/cast.hpp>
#include <typegrad/ops/compare.hpp>
#include <typegrad/ops/conv.hpp>
#include <typegrad/ops/custom.hpp>
#include <typegrad/ops/dropout.hpp>
#include <typegrad/ops/exp_log.hpp>
#include <typegrad/ops/hook.hpp>
#include <typegrad/ops/index.hpp>
#include <typegrad/ops/log_sum_exp.hpp>
#include <typegrad/ops/loss.hpp>
#include <typegrad/ops/matmul.hpp>
#include <typegrad/ops/norm.hpp>
#include <typegrad/ops/piecewise.hpp>
#include <typegrad/ops/pool.hpp>
#include <typegrad/ops/recurrence.hpp>
#include <typegrad/ops/reduce.hpp>
#include <typegrad/ops/special.hpp>
#include <typegrad/ops/trig.hpp>
#include <typegrad/ops/view.hpp>
#include <typegrad/autocast/guard.hpp>
#include <typegrad/autocast/policy.hpp>
#include <typegrad/autocast/rewrite.hpp>
#include <typegrad/autocast/spec.hpp>
#include <typegrad/autodiff/reverse.hpp>
#include <typegrad/exec/bind.hpp>
#include <typegrad/exec/scan.hpp>
#include <typegrad/exec/step.hpp>
#include <typegrad/exec/tape.hpp>
#include <typegrad/inspect/describe.hpp>
#include <typegrad/inspect/dot.hpp>
// Training: parameter sets (Boost.Hana), optimizers, schedules, initialisers. Checkpoints need
// nlohmann-json and are included on their own: <typegrad/train/checkpoint.hpp>.
#include <typegrad/train/init.hpp>
#include <typegrad/train/optim.hpp>
#include <typegrad/train/params.hpp>
#include <typegrad/train/schedule.hpp>
