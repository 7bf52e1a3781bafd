// End-to-end training steps: the interface between the typegrad and the LibTorch translation
// units (each heavy to compile, so kept apart) and main.cpp, which times them side by side.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace e2e {

// The GPT of examples/gpt.cpp (token + position embeddings, L pre-norm blocks with causal
// multi-head attention and a GELU MLP, final layer_norm, LM head tied to the token embedding,
// cross_entropy, AdamW), B sequences of T tokens, width D, H = D / 64 heads, vocabulary V.
struct gpt_config {
    std::size_t T, D, B;
    static constexpr std::size_t L = 2, V = 64;
    std::size_t heads() const { return D / 64; }
    std::size_t tokens() const { return B * T; }
    std::string name() const;
};

// The CNN of examples/cnn.cpp (conv3x3 - batch_norm - relu - max_pool2 - conv3x3 + bias - relu -
// avg_pool2 - linear, cross_entropy, Adam): N images of S x S, C1 and C2 channels, 4 classes.
struct cnn_config {
    std::size_t S, C1, C2, N;
    static constexpr std::size_t classes = 4;
    std::string name() const;
};

// One model, set up with its data: step() runs one training step (forward, backward, optimizer)
// and returns the loss.
class trainer {
public:
    virtual ~trainer() = default;
    virtual float step() = 0;
};

// nullptr when this build has no instantiation for the configuration.
std::unique_ptr<trainer> typegrad_gpt(const gpt_config& c);
std::unique_ptr<trainer> typegrad_cnn(const cnn_config& c);
std::unique_ptr<trainer> torch_gpt(const gpt_config& c);
std::unique_ptr<trainer> torch_cnn(const cnn_config& c);

void typegrad_threads(std::size_t n);  // tg::set_num_threads
void torch_threads(std::size_t n);     // at::set_num_threads and OpenBLAS's own pool

// Deterministic data shared by both implementations.
void fill_tokens(std::size_t n, std::size_t vocab, std::uint32_t seed, int* out);

}  // namespace e2e
