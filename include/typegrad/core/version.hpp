#pragma once
// typegrad's version, and the language check every public header goes through.
// The numbers must equal project(typegrad VERSION ...) in CMakeLists.txt: CMake reads them from
// this file, so there is one place to bump.

// C++20 is required: class-type template arguments (leaf names), concepts, consteval.
// __cplusplus is 201703L or lower under -std=c++17 (MSVC reports it only with /Zc:__cplusplus).
#if !defined(_MSVC_LANG) && __cplusplus < 202002L
#error "typegrad: typegrad needs C++20; compile with -std=c++20 (or link typegrad::typegrad, which asks for cxx_std_20)."
#elif defined(_MSVC_LANG) && _MSVC_LANG < 202002L
#error "typegrad: typegrad needs C++20; compile with /std:c++20."
#endif

// The version of the headers: major, minor, patch (the CMake package's version).
#define TYPEGRAD_VERSION_MAJOR 0
// The minor version: new features, compatible with the previous minor versions.
#define TYPEGRAD_VERSION_MINOR 1
// The patch version: fixes only.
#define TYPEGRAD_VERSION_PATCH 0
// One comparable number: major * 10000 + minor * 100 + patch.
#define TYPEGRAD_VERSION (TYPEGRAD_VERSION_MAJOR * 10000 + TYPEGRAD_VERSION_MINOR * 100 + TYPEGRAD_VERSION_PATCH)
// The version as text, "major.minor.patch".
#define TYPEGRAD_VERSION_STRING "0.1.0"

namespace typegrad {
// A version as numbers, comparable with ==; tg::version is the headers' own.
struct version_t {
    // TYPEGRAD_VERSION_MAJOR
    int major;
    // TYPEGRAD_VERSION_MINOR
    int minor;
    // TYPEGRAD_VERSION_PATCH
    int patch;
};
// The version of the headers in use.
inline constexpr version_t version{TYPEGRAD_VERSION_MAJOR, TYPEGRAD_VERSION_MINOR, TYPEGRAD_VERSION_PATCH};
}  // namespace typegrad
