#pragma once
// typegrad's optimizers against torch::optim (optim_harness.cpp). Returns the failure count.
namespace typegrad_differential {
long run_optim_differential();
}
