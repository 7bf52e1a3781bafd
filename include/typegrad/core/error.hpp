#pragma once
// Run-time errors. Every one is thrown before anything is written to a caller's buffer.
#include <stdexcept>
#include <string>

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
// A binding is unusable for a reason other than its shape (e.g. a null pointer).
struct binding_error : error {
    using error::error;
};

}  // namespace typegrad
