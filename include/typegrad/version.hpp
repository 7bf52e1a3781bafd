#pragma once
// <typegrad/version.hpp>: TYPEGRAD_VERSION_MAJOR/MINOR/PATCH, TYPEGRAD_VERSION(_STRING) and
// typegrad::version; the definitions live in core/version.hpp.
#include <typegrad/core/version.hpp>
