// A character-level GPT: token and position embeddings, a stack of pre-norm transformer blocks
// (layer_norm, multi-head causal self-attention, GELU MLP), a final layer_norm and an LM head tied
// to the token embedding, trained with AdamW on a short public-domain text (Shakespeare's
// sonnets 18 and 116, 1609) kept below, then sampled.
//
// The blocks are one tg::scan: the block is compiled once and run L times over params stacked
// along a leading layer axis ("blocks.wq" is [L, D, D]), so the compile time does not grow with L
// (docs/scan.md). Batches are B sequences of T tokens, as B * T rows of the carried activation;
// the heads are views ([B * T, D] -> [B, T, H, D / H] -> [B, H, T, D / H]). At the end the model
// and the optimizer go to a safetensors checkpoint, and training resumes from it exactly.
#include <typegrad/typegrad.hpp>
#if __has_include(<nlohmann/json.hpp>)
#include <typegrad/train/checkpoint.hpp>
#endif

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace tg = typegrad;

constexpr std::size_t V = 48;  // vocabulary (at most; the text's characters)
constexpr std::size_t D = 32;  // model width
constexpr std::size_t H = 2;   // heads
constexpr std::size_t Dh = D / H;
constexpr std::size_t F = 4 * D;  // MLP width
constexpr std::size_t T = 32;  // context
constexpr std::size_t L = 2;   // blocks

constexpr std::string_view text =
    "shall i compare thee to a summer's day?\n"
    "thou art more lovely and more temperate:\n"
    "rough winds do shake the darling buds of may,\n"
    "and summer's lease hath all too short a date;\n"
    "sometime too hot the eye of heaven shines,\n"
    "and often is his gold complexion dimm'd;\n"
    "and every fair from fair sometime declines,\n"
    "by chance or nature's changing course untrimm'd;\n"
    "but thy eternal summer shall not fade,\n"
    "nor lose possession of that fair thou ow'st;\n"
    "nor shall death brag thou wander'st in his shade,\n"
    "when in eternal lines to time thou grow'st:\n"
    "so long as men can breathe or eyes can see,\n"
    "so long lives this, and this gives life to thee.\n"
    "let me not to the marriage of true minds\n"
    "admit impediments. love is not love\n"
    "which alters when it alteration finds,\n"
    "or bends with the remover to remove:\n"
    "o no! it is an ever-fixed mark\n"
    "that looks on tempests and is never shaken;\n"
    "it is the star to every wandering bark,\n"
    "whose worth's unknown, although his height be taken.\n";

// ---- one block, over the carried activation h ([B * T, D]) and one layer's params ------------
constexpr auto h = tg::param<"h", float, tg::shape<tg::dyn, D>>;
constexpr auto ln1_g = tg::param<"ln1_g", float, tg::shape<D>>;
constexpr auto ln1_b = tg::param<"ln1_b", float, tg::shape<D>>;
constexpr auto wq = tg::param<"wq", float, tg::shape<D, D>>;
constexpr auto wk = tg::param<"wk", float, tg::shape<D, D>>;
constexpr auto wv = tg::param<"wv", float, tg::shape<D, D>>;
constexpr auto wo = tg::param<"wo", float, tg::shape<D, D>>;
constexpr auto ln2_g = tg::param<"ln2_g", float, tg::shape<D>>;
constexpr auto ln2_b = tg::param<"ln2_b", float, tg::shape<D>>;
constexpr auto w1 = tg::param<"w1", float, tg::shape<D, F>>;
constexpr auto b1 = tg::param<"b1", float, tg::shape<F>>;
constexpr auto w2 = tg::param<"w2", float, tg::shape<F, D>>;
constexpr auto b2 = tg::param<"b2", float, tg::shape<D>>;

// [B * T, D] -> [B, H, T, Dh] (views; the attention makes them contiguous) and back
template <class X>
constexpr auto split_heads(X x) {
    return tg::permute<0, 2, 1, 3>(tg::reshape<tg::shape<tg::dyn, T, H, Dh>>(x));
}
template <class X>
constexpr auto merge_heads(X x) {
    return tg::reshape<tg::shape<tg::dyn, D>>(tg::permute<0, 2, 1, 3>(x));
}
constexpr auto block() {
    auto a = tg::layer_norm(h, ln1_g, ln1_b);
    auto att = tg::scaled_dot_product_attention(split_heads(tg::matmul(a, wq)), split_heads(tg::matmul(a, wk)),
                                                split_heads(tg::matmul(a, wv)), tg::causal);
    auto x = h + tg::matmul(merge_heads(att), wo);
    auto m = tg::gelu(tg::matmul(tg::layer_norm(x, ln2_g, ln2_b), w1) + b1);
    return x + tg::matmul(m, w2) + b2;
}

// ---- the model ----------------------------------------------------------------------------------
template <tg::fixed_string Name, std::size_t... E>
constexpr auto stack = tg::param<Name, float, tg::shape<L, E...>>;

constexpr auto ids = tg::input<"ids", std::int32_t, tg::shape<tg::dyn>>;  // B * T token ids
constexpr auto pos = tg::input<"pos", std::int32_t, tg::shape<tg::dyn>>;  // each row's position
constexpr auto targets = tg::input<"targets", std::int32_t, tg::shape<tg::dyn>>;
constexpr auto wte = tg::param<"wte", float, tg::shape<V, D>>;
constexpr auto wpe = tg::param<"wpe", float, tg::shape<T, D>>;
constexpr auto lnf_g = tg::param<"lnf_g", float, tg::shape<D>>;
constexpr auto lnf_b = tg::param<"lnf_b", float, tg::shape<D>>;

constexpr auto logits() {
    auto x0 = tg::embedding(ids, wte) + tg::embedding(pos, wpe);
    auto hl = tg::scan(block(), tg::carry(h, x0), tg::stacked(ln1_g, stack<"blocks.ln1_g", D>),
                       tg::stacked(ln1_b, stack<"blocks.ln1_b", D>), tg::stacked(wq, stack<"blocks.wq", D, D>),
                       tg::stacked(wk, stack<"blocks.wk", D, D>), tg::stacked(wv, stack<"blocks.wv", D, D>),
                       tg::stacked(wo, stack<"blocks.wo", D, D>), tg::stacked(ln2_g, stack<"blocks.ln2_g", D>),
                       tg::stacked(ln2_b, stack<"blocks.ln2_b", D>), tg::stacked(w1, stack<"blocks.w1", D, F>),
                       tg::stacked(b1, stack<"blocks.b1", F>), tg::stacked(w2, stack<"blocks.w2", F, D>),
                       tg::stacked(b2, stack<"blocks.b2", D>));
    return tg::matmul(tg::layer_norm(hl, lnf_g, lnf_b), tg::transpose(wte));  // tied LM head
}

// The parameters, named as the graph's params.
using buf = std::vector<float>;
struct blocks_t {
    BOOST_HANA_DEFINE_STRUCT(blocks_t, (buf, ln1_g), (buf, ln1_b), (buf, wq), (buf, wk), (buf, wv), (buf, wo),
                             (buf, ln2_g), (buf, ln2_b), (buf, w1), (buf, b1), (buf, w2), (buf, b2));
};
struct gpt {
    BOOST_HANA_DEFINE_STRUCT(gpt, (buf, wte), (buf, wpe), (blocks_t, blocks), (buf, lnf_g), (buf, lnf_b));
};

int main() {
    // the vocabulary: the text's characters, in order of first appearance
    std::string vocab;
    for (char c : text)
        if (vocab.find(c) == std::string::npos) vocab += c;
    if (vocab.size() > V) return 1;
    std::vector<std::int32_t> data;
    for (char c : text) data.push_back(std::int32_t(vocab.find(c)));

    // GPT-2's initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2L), norms 1 and 0
    gpt model{buf(V * D), buf(T * D),
              {buf(L * D, 1.f), buf(L * D), buf(L * D * D), buf(L * D * D), buf(L * D * D), buf(L * D * D),
               buf(L * D, 1.f), buf(L * D), buf(L * D * F), buf(L * F), buf(L * F * D), buf(L * D)},
              buf(D, 1.f), buf(D)};
    tg::generator gen{.seed = 1};
    for (buf* w : {&model.wte, &model.wpe, &model.blocks.wq, &model.blocks.wk, &model.blocks.wv, &model.blocks.w1})
        tg::normal(*w, 0.0, 0.02, gen);
    for (buf* w : {&model.blocks.wo, &model.blocks.w2}) tg::normal(*w, 0.0, 0.02 / std::sqrt(2.0 * L), gen);
    gpt grads = tg::zeros_like(model);
    tg::adamw opt(model, {.lr = 3e-3, .weight_decay = 0.01});

    const auto train = tg::compile(
        tg::cross_entropy(logits(), targets),
        tg::wrt(wte, wpe, lnf_g, lnf_b, stack<"blocks.ln1_g", D>, stack<"blocks.ln1_b", D>, stack<"blocks.wq", D, D>,
                stack<"blocks.wk", D, D>, stack<"blocks.wv", D, D>, stack<"blocks.wo", D, D>, stack<"blocks.ln2_g", D>,
                stack<"blocks.ln2_b", D>, stack<"blocks.w1", D, F>, stack<"blocks.b1", F>, stack<"blocks.w2", F, D>,
                stack<"blocks.b2", D>));
    const auto predict = tg::compile(logits(), tg::wrt(wte));

    // batches: B windows of T + 1 characters at random offsets (inputs and next characters)
    constexpr std::size_t B = 8;
    std::mt19937 rng(3);
    std::uniform_int_distribution<std::size_t> start(0, data.size() - T - 1);
    std::vector<std::int32_t> x(B * T), y(B * T), p(B * T);
    for (std::size_t r = 0; r < B * T; ++r) p[r] = std::int32_t(r % T);
    const int steps = 300;
    double first = 0, last = 0;
    for (int step = 1; step <= steps; ++step) {
        for (std::size_t b = 0; b < B; ++b) {
            const std::size_t s = start(rng);
            for (std::size_t t = 0; t < T; ++t) {
                x[b * T + t] = data[s + t];
                y[b * T + t] = data[s + t + 1];
            }
        }
        const float loss = tg::value_and_grad(train, tg::bind(ids, x), tg::bind(pos, p), tg::bind(targets, y),
                                              tg::params(model), tg::grads_into(grads));
        opt.step(model, grads);
        if (step == 1) first = loss;
        last = step > steps - 20 ? last + loss / 20.0 : last;  // mean of the last 20 steps
        if (step == 1 || step % 50 == 0) std::printf("step %3d  loss %.4f\n", step, double(loss));
    }
    std::printf("loss %.3f -> %.3f (mean of the last 20 steps; ln %zu = %.3f)\n", first, last, vocab.size(),
                std::log(double(vocab.size())));

    // a sample: the context at positions 0..n-1 of one sequence (causal: later rows do not matter)
    std::string sample = "shall i";
    std::vector<std::int32_t> ctx(T, 0), one(T);
    for (std::size_t t = 0; t < T; ++t) one[t] = std::int32_t(t);
    std::mt19937 sampler(11);
    for (int i = 0; i < 160; ++i) {
        const std::size_t n = std::min(sample.size(), T);
        for (std::size_t t = 0; t < n; ++t) ctx[t] = std::int32_t(vocab.find(sample[sample.size() - n + t]));
        auto out = tg::forward(predict, tg::bind(ids, ctx), tg::bind(pos, one), tg::params(model));
        const auto row = out.values().subspan((n - 1) * V, vocab.size());
        std::vector<double> w(row.begin(), row.end());
        const double mx = *std::max_element(w.begin(), w.end());
        for (double& e : w) e = std::exp((e - mx) / 0.8);  // temperature 0.8
        sample += vocab[std::discrete_distribution<std::size_t>(w.begin(), w.end())(sampler)];
    }
    std::printf("sample:\n%s\n", sample.c_str());
    bool resumed_exactly = true;

#if __has_include(<nlohmann/json.hpp>)
    // A checkpoint of the model (with the graph's shapes: "blocks.wq" is [L, D, D]) and of AdamW's
    // state, restored into a fresh model and optimizer: one more step from each, on the same batch,
    // must give the same parameters, bit for bit.
    const auto path = std::filesystem::temp_directory_path() /
                      ("typegrad_gpt_example_" + std::to_string(std::random_device{}()) + ".safetensors");
    tg::safetensors_writer writer;
    writer.add(model, "", tg::shapes_of(train));
    writer.add_optimizer(opt, "optim.");  // "optim.exp_avg.blocks.wq", ..., "optim.steps"
    writer.save(path);

    gpt resumed = tg::zeros_like(model), resumed_grads = tg::zeros_like(model);
    tg::adamw resumed_opt(resumed, opt.options);
    tg::safetensors_reader reader(path);
    reader.load(resumed, "", tg::shapes_of(train));
    reader.load_optimizer(resumed_opt, "optim.");
    std::filesystem::remove(path);

    tg::value_and_grad(train, tg::bind(ids, x), tg::bind(pos, p), tg::bind(targets, y), tg::params(model),
                       tg::grads_into(grads));
    opt.step(model, grads);
    tg::value_and_grad(train, tg::bind(ids, x), tg::bind(pos, p), tg::bind(targets, y), tg::params(resumed),
                       tg::grads_into(resumed_grads));
    resumed_opt.step(resumed, resumed_grads);
    auto flat = [](gpt& m) {
        buf all;
        tg::for_each_param(m, [&](std::string_view, const buf& b) { all.insert(all.end(), b.begin(), b.end()); });
        return all;
    };
    resumed_exactly = flat(model) == flat(resumed);
    std::printf("checkpoint %s: resumed training %s\n", path.filename().c_str(),
                resumed_exactly ? "matches" : "DIFFERS");
#endif
    return std::isfinite(last) && last < 0.6 * first && resumed_exactly ? 0 : 1;
}
