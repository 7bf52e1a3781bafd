// EXPECT: typegrad: typegrad needs C\+\+20
// Compiled with -std=c++17: the first diagnostic is typegrad's, not a wall of template errors.
#include <typegrad/typegrad.hpp>

int main() {}
