#pragma once
// Ids leaves arrive in the harnesses' value vectors as doubles (or floats) holding integers, exact
// below 2^24; the graphs bind them as integers.
#include <cstdint>
#include <vector>

namespace typegrad_differential {

template <class Id = std::int64_t, class T>
std::vector<Id> ids_of(const std::vector<T>& v) {
    return std::vector<Id>(v.begin(), v.end());
}

}  // namespace typegrad_differential
