#pragma once
// Run-time errors. Every one is thrown before anything is written to a caller's buffer.
#include <concepts>
#include <stdexcept>
#include <string>
#include <string_view>

namespace typegrad {

struct error : std::runtime_error {
    using std::runtime_error::runtime_error;
};
// A dynamic extent, or a buffer size, does not match what the graph needs.
struct shape_error : error {
    using error::error;
};
// Output buffers overlap inputs or each other.
struct aliasing_error : error {
    using error::error;
};
// A backward that mutates an input requiring grad was asked to build a differentiable graph.
struct mutation_error : error {
    using error::error;
};
// Anomaly mode found a NaN or Inf; the message names the first node that produced it.
struct anomaly_error : error {
    using error::error;
};
// A binding is unusable for a reason other than its shape (e.g. a null pointer).
struct binding_error : error {
    using error::error;
};
// A call that cannot run on the device: host and device bindings mixed in one call, no CUDA
// driver or device, or a failure reported by the driver, NVRTC or cuBLAS (docs/cuda.md).
struct device_error : error {
    using error::error;
};

namespace detail {
// Builds an error message by appending (g++ 12 -O3 raises a false -Wrestrict on
// `"literal" + std::string`, GCC PR105329).
inline void append_piece(std::string& s, std::string_view piece) { s.append(piece); }
inline void append_piece(std::string& s, const char* piece) { s.append(piece); }
template <std::unsigned_integral N>
void append_piece(std::string& s, N n) { s.append(std::to_string(n)); }
template <class... Pieces>
std::string message(const Pieces&... pieces) {
    std::string s;
    (append_piece(s, pieces), ...);
    return s;
}
}  // namespace detail

}  // namespace typegrad
