#pragma once
// Run-time errors. Every one is thrown before anything is written to a caller's buffer.
#include <concepts>
#include <cstdint>
#include <initializer_list>
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
// Error and description texts. A piece is a text or an unsigned number, held as is: the call
// site builds an array of them and calls one out-of-line function that formats and joins them.
// A variadic template that formatted and appended its pieces itself was instantiated per call
// site's argument types (every literal length is a type) and inlined std::string's code for
// each piece, in every per-node and per-plan function that can throw: 13% of the code g++
// generated for a GPT block. Appending only (g++ 12 -O3 raises a false -Wrestrict on
// `"literal" + std::string`, GCC PR105329).
struct text_piece {
    std::string_view text;
    std::uint64_t number = 0;
    bool is_number = false;
    text_piece(std::string_view s) : text(s) {}
    text_piece(const char* s) : text(s) {}
    text_piece(const std::string& s) : text(s) {}
    template <std::unsigned_integral N>
    text_piece(N n) : number(n), is_number(true) {}
};
[[gnu::cold, gnu::noinline]] inline std::string join_text(std::initializer_list<text_piece> pieces) {
    std::string s;
    for (const text_piece& p : pieces) {
        if (p.is_number) s.append(std::to_string(p.number));
        else s.append(p.text);
    }
    return s;
}
template <class... Pieces>
std::string message(const Pieces&... pieces) {
    return join_text({text_piece(pieces)...});
}
// throw E(message(pieces...)), out of line: a throw site in a template is then a call.
template <class E>
[[noreturn, gnu::cold, gnu::noinline]] void fail(std::initializer_list<text_piece> pieces) {
    throw E(join_text(pieces));
}
}  // namespace detail

}  // namespace typegrad
