// The second part of the test graphs (graphs.hpp, for_each_graph_in<1>) against the CPU, on the
// device or in host emulation (graph_tests.hpp); device_test.cpp runs the first part.
#include "graph_tests.hpp"

#include <catch2/catch.hpp>

TEST_CASE("every test graph gives the CPU's values and gradients on the device, part 2", "[cuda][device]") {
    cuda_graph_tests::compare_on_device<1>();
}
TEST_CASE("every test graph gives the CPU's values and gradients in host emulation, part 3", "[cuda][emulation]") {
    cuda_graph_tests::emulate<1>(0);
}
TEST_CASE("every test graph gives the CPU's values and gradients in host emulation, part 4", "[cuda][emulation]") {
    cuda_graph_tests::emulate<1>(1);
}
