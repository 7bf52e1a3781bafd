#pragma once
// Compile-time string usable as a template argument: leaf names live in the graph type.
#include <cstddef>
#include <string_view>

namespace typegrad {

template <std::size_t N>
struct fixed_string {
    char data[N]{};

    constexpr fixed_string(const char (&text)[N]) {
        for (std::size_t i = 0; i < N; ++i) data[i] = text[i];
    }
    constexpr std::string_view view() const { return {data, N - 1}; }
    constexpr std::size_t size() const { return N - 1; }
    friend constexpr bool operator==(const fixed_string&, const fixed_string&) = default;
};

}  // namespace typegrad
