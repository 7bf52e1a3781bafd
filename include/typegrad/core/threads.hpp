#pragma once
// The number of threads typegrad's CPU kernels may use.
//   tg::set_num_threads(n)   n threads for the following calls (1: serial; 0: back to the default)
//   tg::num_threads()        the count in effect
// The default is TYPEGRAD_NUM_THREADS when set, else the hardware's thread count (at most 64).
// Process-wide, like torch::set_num_threads; calls already running keep their count.
#include <cstddef>

#include <typegrad/core/cpu/thread_pool.hpp>

namespace typegrad {

// n threads for the following calls (1: serial; 0: back to the default).
inline void set_num_threads(std::size_t n) { detail::set_num_threads(n); }
// The thread count in effect.
inline std::size_t num_threads() { return detail::num_threads(); }

}  // namespace typegrad
