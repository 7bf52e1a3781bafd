// The object that carries the compile-fail tests' precompiled <typegrad/typegrad.hpp>
// (tests/CMakeLists.txt); a .cxx, not a .cpp, so that the tests' glob does not take it.
