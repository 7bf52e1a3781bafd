#pragma once
// typegrad's optional CUDA backend (docs/cuda.md). Include it instead of (or after)
// <typegrad/typegrad.hpp> and link NVRTC, cuBLAS and libdl (CMake: typegrad::cuda); the driver
// is opened at run time. Compiled with g++ or clang: no nvcc is involved.
//
//   tg::cuda::tensor<float, tg::shape<tg::dyn, 3>> x = tg::cuda::tensor<...>::from_host(xs, {n, 3});
//   float loss = step.value_and_grad(tg::bind(X, x), tg::bind(W, w), tg::grad_into(W, gw));
#include <typegrad/exec/cuda/codegen.hpp>
#include <typegrad/exec/cuda/execute.hpp>
#include <typegrad/exec/cuda/runtime.hpp>
#include <typegrad/exec/cuda/step.hpp>
#include <typegrad/exec/cuda/tensor.hpp>
#include <typegrad/typegrad.hpp>
