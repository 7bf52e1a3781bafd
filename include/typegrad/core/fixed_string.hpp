#pragma once
// Compile-time string usable as a template argument: leaf names live in the graph type.
#include <cstddef>
#include <string_view>

namespace typegrad {

// A string literal as a structural type, so that it can be a template argument: the name of a
// leaf, tg::param<"W", ...>, is a fixed_string<N> deduced from the literal (N counts the NUL).
template <std::size_t N>
struct fixed_string {
    // The characters, NUL-terminated.
    char data[N]{};

    // From a string literal (implicit, so that `tg::param<"W", ...>` deduces it).
    constexpr fixed_string(const char (&text)[N]) {
        for (std::size_t i = 0; i < N; ++i) data[i] = text[i];
    }
    // The text without the terminating NUL.
    constexpr std::string_view view() const { return {data, N - 1}; }
    // The number of characters, without the NUL.
    constexpr std::size_t size() const { return N - 1; }
    // Equal when the characters are equal (leaves are matched by name).
    friend constexpr bool operator==(const fixed_string&, const fixed_string&) = default;
};

}  // namespace typegrad
