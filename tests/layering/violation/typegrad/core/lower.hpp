#pragma once
// A fixture of tests/layering: a core header that includes an op header (core -> ops), which
// check_layers.cmake must reject.
#include <typegrad/ops/higher.hpp>
