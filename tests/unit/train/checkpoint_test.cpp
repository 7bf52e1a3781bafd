// safetensors checkpoints: round trips, an independently written fixture, and corrupt files.
#if __has_include(<nlohmann/json.hpp>)
#include <catch2/catch.hpp>

#include <typegrad/typegrad.hpp>
#include <typegrad/train/checkpoint.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

namespace tg = typegrad;
namespace fs = std::filesystem;

namespace {

struct layer {
    BOOST_HANA_DEFINE_STRUCT(layer, (std::vector<float>, W), (std::vector<double>, b));
};
struct halves {
    BOOST_HANA_DEFINE_STRUCT(halves, (std::vector<tg::f16>, half), (std::vector<tg::bf16>, brain));
};
struct fixture_model {
    BOOST_HANA_DEFINE_STRUCT(fixture_model, (layer, fc1), (std::vector<tg::f16>, half), (std::vector<tg::bf16>, brain));
};

fs::path temp_file(const std::string& name) {
    return fs::temp_directory_path() / ("typegrad_" + std::to_string(::getpid()) + "_" + name);
}
std::vector<char> read_all(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_all(const fs::path& p, const std::vector<char>& bytes) {
    std::ofstream(p, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

}  // namespace

TEST_CASE("safetensors round trip of a parameter set, bf16/f16 included, with shapes", "[checkpoint]") {
    constexpr auto W = tg::param<"fc1.W", float, tg::shape<2, 3>>;
    constexpr auto b = tg::param<"fc1.b", double, tg::shape<3>>;
    auto step = tg::compile(tg::sum(W) + tg::cast<float>(tg::sum(b)), tg::wrt(W));
    fixture_model m{{{1, 2, 3, 4, 5, 6}, {0.5, -0.25, 1e-300}},
                    {tg::f16(0.5f), tg::f16(-3.0f)},
                    {tg::bf16(2.0f), tg::bf16(-0.375f), tg::bf16(1e30f)}};
    const fs::path path = temp_file("roundtrip.safetensors");
    tg::safetensors_writer w;
    w.add(m, "", tg::shapes_of(step));
    w.add_metadata("format", "pt");
    w.save(path);

    fixture_model back{{std::vector<float>(6), std::vector<double>(3)}, std::vector<tg::f16>(2), std::vector<tg::bf16>(3)};
    const tg::safetensors_reader r(path);
    CHECK(r.tensors().at("fc1.W").shape == std::vector<std::size_t>{2, 3});
    CHECK(r.tensors().at("fc1.b").shape == std::vector<std::size_t>{3});
    CHECK(r.tensors().at("brain").dtype == "BF16");
    CHECK(r.metadata().at("format") == "pt");
    r.load(back, "", tg::shapes_of(step));
    CHECK(back.fc1.W == m.fc1.W);
    CHECK(back.fc1.b == m.fc1.b);
    for (std::size_t i = 0; i < 2; ++i) CHECK(float(back.half[i]) == float(m.half[i]));
    for (std::size_t i = 0; i < 3; ++i) CHECK(float(back.brain[i]) == float(m.brain[i]));
    // The header is 8-byte aligned, so the data section starts aligned.
    const std::vector<char> bytes = read_all(path);
    std::uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    CHECK(n % 8 == 0);
    fs::remove(path);
}

TEST_CASE("a safetensors file written by Python's standard library loads bit-exactly", "[checkpoint]") {
    const fs::path path = temp_file("python.safetensors");
    const std::string cmd = "python3 " TYPEGRAD_TEST_SUPPORT_DIR "/write_safetensors_fixture.py " + path.string();
    if (std::system("python3 -c 'import struct, json' > /dev/null 2>&1") != 0) {
        WARN("python3 is not available: the independent fixture is skipped");
        return;
    }
    REQUIRE(std::system(cmd.c_str()) == 0);
    fixture_model m{{std::vector<float>(6), std::vector<double>(3)}, std::vector<tg::f16>(4), std::vector<tg::bf16>(2)};
    tg::safetensors_reader(path).load(m);
    for (std::size_t i = 0; i < 6; ++i) CHECK(m.fc1.W[i] == float(i) * 0.25f - 3);
    for (std::size_t i = 0; i < 3; ++i) CHECK(m.fc1.b[i] == 1.0 / double(i + 1));
    CHECK(float(m.half[0]) == 0.5f);
    CHECK(float(m.half[1]) == -2.0f);
    CHECK(float(m.half[2]) == 65504.0f);
    CHECK(float(m.half[3]) == 0.333251953125f);
    CHECK(float(m.brain[0]) == 1.5f);
    CHECK(float(m.brain[1]) == -0.15625f);
    // Our writer reproduces the Python file's data section byte for byte (same tensor order).
    const fs::path ours = temp_file("ours.safetensors");
    tg::safetensors_writer w;
    w.add(m, "", tg::shape_map{{"fc1.W", {2, 3}}});
    w.save(ours);
    auto data_section = [](const std::vector<char>& file) {
        std::uint64_t n = 0;
        std::memcpy(&n, file.data(), 8);
        return std::vector<char>(file.begin() + 8 + std::ptrdiff_t(n), file.end());
    };
    CHECK(data_section(read_all(ours)) == data_section(read_all(path)));
    CHECK(tg::safetensors_reader(ours).tensors().at("fc1.W").shape == std::vector<std::size_t>{2, 3});
    fs::remove(ours);
    fs::remove(path);
}

TEST_CASE("optimizer state round-trips: a restored Adam continues identically", "[checkpoint]") {
    layer p{{1, 2, 3}, {0.5, 0.25}}, g{{0.1f, -0.2f, 0.3f}, {1, -1}};
    tg::adam opt(p, {.lr = 0.1});
    opt.step(p, g);
    opt.step(p, g);
    const fs::path path = temp_file("optim.safetensors");
    tg::safetensors_writer w;
    w.add(p, "model.");
    w.add_optimizer(opt, "optim.");
    w.save(path);

    layer q = tg::zeros_like(p);
    tg::adam restored(q, {.lr = 0.1});
    const tg::safetensors_reader r(path);
    r.load(q, "model.");
    r.load_optimizer(restored, "optim.");
    CHECK(restored.steps == opt.steps);
    opt.step(p, g);
    restored.step(q, g);
    CHECK(q.W == p.W);
    CHECK(q.b == p.b);
    CHECK(restored.exp_avg_sq.b == opt.exp_avg_sq.b);
    fs::remove(path);
}

TEST_CASE("corrupt, truncated or mismatched files throw typed errors and leave the destination untouched", "[checkpoint]") {
    layer m{{1, 2, 3}, {4, 5}};
    const fs::path good = temp_file("good.safetensors"), bad = temp_file("bad.safetensors");
    tg::safetensors_writer w;
    w.add(m);
    w.save(good);
    const std::vector<char> bytes = read_all(good);
    layer dst{{7, 7, 7}, {7, 7}};
    const layer untouched = dst;
    auto expect_checkpoint_error = [&](const std::vector<char>& file) {
        write_all(bad, file);
        CHECK_THROWS_AS(tg::safetensors_reader(bad).load(dst), tg::checkpoint_error);
        CHECK(dst.W == untouched.W);
        CHECK(dst.b == untouched.b);
    };
    // truncated: inside the data, inside the header, inside the length
    expect_checkpoint_error({bytes.begin(), bytes.end() - 1});
    expect_checkpoint_error({bytes.begin(), bytes.begin() + 20});
    expect_checkpoint_error({bytes.begin(), bytes.begin() + 5});
    // corrupt JSON
    std::vector<char> corrupt = bytes;
    corrupt[8] = 'x';
    expect_checkpoint_error(corrupt);
    // a header length beyond the file
    std::vector<char> too_long = bytes;
    too_long[7] = 0x7f;
    expect_checkpoint_error(too_long);
    // trailing garbage
    std::vector<char> trailing = bytes;
    trailing.push_back(0);
    expect_checkpoint_error(trailing);
    CHECK_THROWS_AS(tg::safetensors_reader(temp_file("missing.safetensors")), tg::checkpoint_error);

    // A wrong dtype (the file's b is F64, here f32), a missing tensor, a wrong size.
    struct wrong_dtype_t {
        BOOST_HANA_DEFINE_STRUCT(wrong_dtype_t, (std::vector<float>, W), (std::vector<float>, b));
    };
    wrong_dtype_t wd{{7, 7, 7}, {7, 7}};
    CHECK_THROWS_AS(tg::safetensors_reader(good).load(wd), tg::checkpoint_error);
    CHECK(wd.W == std::vector<float>{7, 7, 7});  // W was valid, but nothing is copied before all checks pass
    CHECK_THROWS_AS(tg::safetensors_reader(good).load(dst, "other."), tg::checkpoint_error);
    dst.W.resize(4, 7.f);
    CHECK_THROWS_AS(tg::safetensors_reader(good).load(dst), tg::shape_error);
    CHECK(dst.b == untouched.b);
    fs::remove(good);
    fs::remove(bad);
}
#endif
