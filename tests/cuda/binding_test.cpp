// Runs without a GPU: host and device bindings mixed in one call are a tg::device_error before
// anything runs (no driver call is made, no buffer is touched); a missing device is a
// device_error naming the reason.
#include "graphs.hpp"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

namespace tg = typegrad;
using cuda_tests::A;
using cuda_tests::B;

namespace {
// Device addresses that are never dereferenced: the calls below must throw before using them.
float* fake_device_address() { return reinterpret_cast<float*>(std::uintptr_t(0x7f0000000000)); }
}  // namespace

TEST_CASE("mixing host and device bindings is a device_error before anything runs", "[cuda][binding]") {
    auto step = tg::compile(tg::sum(tg::exp(A) * B), tg::wrt(A, B));
    std::vector<float> a(10, 1.f), b(10, 2.f), ga(10, -7.f);
    const auto dev = tg::cuda::device_ptr<const float>{fake_device_address()};
    const auto dev_grad = tg::cuda::device_ptr<float>{fake_device_address()};

    // a host leaf with a device leaf
    CHECK_THROWS_AS(step.value_and_grad(tg::bind(A, a, {2, 5}), tg::cuda::bind(B, dev, {2, 5})), tg::device_error);
    // device leaves with a host gradient
    CHECK_THROWS_AS(step.value_and_grad(tg::cuda::bind(A, dev, {2, 5}), tg::cuda::bind(B, dev, {2, 5}),
                                        tg::grad_into(A, ga)),
                    tg::device_error);
    // host leaves with a device gradient
    CHECK_THROWS_AS(step.value_and_grad(tg::bind(A, a, {2, 5}), tg::bind(B, b, {2, 5}),
                                        tg::cuda::grad_into(A, dev_grad, 10)),
                    tg::device_error);
    CHECK_THROWS_AS(step.forward(tg::bind(A, a, {2, 5}), tg::cuda::bind(B, dev, {2, 5})), tg::device_error);
    // a host forward context with device gradients
    auto ctx = step.forward(tg::bind(A, a, {2, 5}), tg::bind(B, b, {2, 5}));
    CHECK_THROWS_AS(step.backward(ctx, tg::cuda::grad_into(A, dev_grad, 10)), tg::device_error);
    // the host buffers are untouched
    CHECK(ga == std::vector<float>(10, -7.f));
    try {
        step.value_and_grad(tg::bind(A, a, {2, 5}), tg::cuda::bind(B, dev, {2, 5}));
    } catch (const tg::device_error& e) {
        CHECK(std::string(e.what()).find("host and device bindings are mixed") != std::string::npos);
    }
    // device_error is a tg::error
    CHECK_THROWS_AS(step.value_and_grad(tg::bind(A, a, {2, 5}), tg::cuda::bind(B, dev, {2, 5})), tg::error);
}

TEST_CASE("without a device, device calls and allocations are device_errors that say why", "[cuda][binding]") {
    if (tg::cuda::available()) {
        WARN("a CUDA device is present (" << tg::cuda::device_name() << "): this test covers machines without one");
        return;
    }
    INFO("reason: " << tg::cuda::unavailable_reason());
    CHECK(!tg::cuda::unavailable_reason().empty());
    CHECK_THROWS_AS((tg::cuda::tensor<float, tg::shape<4>>{}), tg::device_error);
    auto step = tg::compile(tg::sum(tg::exp(A) * B), tg::wrt(A, B));
    const auto dev = tg::cuda::device_ptr<const float>{fake_device_address()};
    CHECK_THROWS_AS(step.value_and_grad(tg::cuda::bind(A, dev, {2, 5}), tg::cuda::bind(B, dev, {2, 5})),
                    tg::device_error);
}

TEST_CASE("device bindings are checked on the host before anything runs", "[cuda][binding]") {
    auto step = tg::compile(tg::sum(tg::exp(A) * B), tg::wrt(A, B));
    const auto dev = tg::cuda::device_ptr<const float>{fake_device_address()};
    const auto dev_grad = tg::cuda::device_ptr<float>{fake_device_address()};
    // mismatched dynamic extents, wrong gradient size, null addresses, overlapping outputs
    CHECK_THROWS_AS(step.value_and_grad(tg::cuda::bind(A, dev, {2, 5}), tg::cuda::bind(B, dev, {3, 5})),
                    tg::shape_error);
    CHECK_THROWS_AS(step.value_and_grad(tg::cuda::bind(A, dev, {2, 5}), tg::cuda::bind(B, dev, {2, 5}),
                                        tg::cuda::grad_into(A, dev_grad, 9)),
                    tg::shape_error);
    CHECK_THROWS_AS(step.value_and_grad(tg::cuda::bind(A, tg::cuda::device_ptr<const float>{}, {2, 5}),
                                        tg::cuda::bind(B, dev, {2, 5})),
                    tg::binding_error);
    CHECK_THROWS_AS(step.value_and_grad(tg::cuda::bind(A, dev, {2, 5}), tg::cuda::bind(B, dev, {2, 5}),
                                        tg::cuda::grad_into(A, dev_grad, 10)),
                    tg::aliasing_error);
    // tg::dyn marks a run-time extent inside a plan, never a size: the host's check (a shape_error
    // before any device call, not the missing device's device_error)
    try {
        step.value_and_grad(tg::cuda::bind(A, dev, {tg::dyn, 5}), tg::cuda::bind(B, dev, {tg::dyn, 5}));
        FAIL("no error");
    } catch (const tg::shape_error& e) {
        CHECK(std::string(e.what()).find("has extent tg::dyn (SIZE_MAX), which is not a size") != std::string::npos);
    }
    try {
        step.value_and_grad(tg::cuda::bind(A, dev, {2, 5}), tg::cuda::bind(B, dev, {2, 5}),
                            tg::cuda::grad_into(A, dev_grad, 9));
    } catch (const tg::shape_error& e) {
        CHECK(std::string(e.what()).find("the device buffer has 9 elements but the gradient has 10") != std::string::npos);
    }
}
