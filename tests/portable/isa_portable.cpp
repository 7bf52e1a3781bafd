// Compiled (syntax only, which instantiates every kernel the steps use) for baseline x86-64
// (SSE2) and for x86-64-v3 (AVX2, FMA) with the project's warnings as errors
// (tests/CMakeLists.txt): the development and CI hosts have AVX-512, so without this the code
// paths for other CPUs were compiled by no test (an unused typedef in simd::exp's AVX-512-less
// path was an error under -Wall -Werror for a user building without -march=native).
#include <typegrad/typegrad.hpp>

#include <vector>

namespace tg = typegrad;

template <class T>
T elementwise_and_reductions(const std::vector<T>& data, std::vector<T>& grad) {
    constexpr auto x = tg::param<"x", T, tg::shape<tg::dyn>>;
    const auto p = tg::sigmoid(x) + tg::lit<0.5>;
    const auto loss = tg::sum(tg::exp(x) + tg::log(p) + tg::sqrt(p) + tg::tanh(x) + tg::sin(x) * tg::cos(x) +
                              tg::erf(x) + tg::expm1(x) + tg::log1p(p) + tg::pow(p, x) + tg::gelu(x) + tg::silu(x) +
                              tg::softplus(x) + tg::elu(x) + tg::leaky_relu(x) + tg::relu(x) +
                              tg::clamp(x, tg::lit<-1>, tg::lit<1>) + tg::square(x) / p) +
                      tg::log_sum_exp(x) + tg::prod(p) + tg::max(x) * tg::min(x) + tg::mean(x);
    const auto n = data.size();
    return tg::compile(loss, tg::wrt(x)).value_and_grad(tg::bind(x, data, {n}), tg::grad_into(x, grad));
}

template <class T>
T rows_and_products(const std::vector<T>& a, const std::vector<T>& b, std::vector<T>& ga) {
    constexpr auto A = tg::param<"A", T, tg::shape<tg::dyn, 8>>;
    constexpr auto B = tg::input<"B", T, tg::shape<8, 4>>;
    const auto loss = tg::sum(tg::log_softmax(tg::matmul(A, B), tg::axes<1>)) + tg::sum(tg::softmax(A, tg::axes<1>) * A);
    return tg::compile(loss, tg::wrt(A)).value_and_grad(tg::bind(A, a, {a.size() / 8}), tg::bind(B, b),
                                                        tg::grad_into(A, ga));
}

template float elementwise_and_reductions<float>(const std::vector<float>&, std::vector<float>&);
template double elementwise_and_reductions<double>(const std::vector<double>&, std::vector<double>&);
template float rows_and_products<float>(const std::vector<float>&, const std::vector<float>&, std::vector<float>&);
template double rows_and_products<double>(const std::vector<double>&, const std::vector<double>&, std::vector<double>&);
