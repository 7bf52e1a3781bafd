#pragma once
// A fixture of tests/layering: the op header that core/lower.hpp includes against the layers.
