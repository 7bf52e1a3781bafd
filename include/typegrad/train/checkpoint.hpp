#pragma once
// Checkpoints in the safetensors format (Hugging Face's): an 8-byte little-endian header length,
// a JSON header {"name": {"dtype", "shape", "data_offsets"}, "__metadata__": {...}}, then the
// tensors' bytes, row-major. The JSON is read and written by nlohmann-json (a separate
// dependency: this header is not in the umbrella; link nlohmann_json::nlohmann_json, or
// typegrad::checkpoint with CMake).
//
//   tg::safetensors_writer w;
//   w.add(model);                          // every buffer, named "fc1.W", ... (1-D shapes)
//   w.add(model, "", tg::shapes_of(step)); // ... with the graph params' static shapes
//   w.add_optimizer(opt, "optim.");        // state buffers and step counts
//   w.save("model.safetensors");
//
//   tg::safetensors_reader r("model.safetensors");   // reads and validates the whole file
//   r.load(model);  r.load_optimizer(opt, "optim.");
//
// f32, f64, bf16 and f16 buffers. Loading checks every tensor (present, dtype, element count, and
// shape when shapes are given) before it copies anything: on any error the destination is left
// untouched. Errors: tg::checkpoint_error (I/O, corrupt or truncated file, missing tensor, wrong
// dtype), tg::shape_error (sizes).
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <ranges>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include <typegrad/core/error.hpp>
#include <typegrad/core/half.hpp>
#include <typegrad/train/optim.hpp>
#include <typegrad/train/params.hpp>

namespace typegrad {

// A checkpoint file that cannot be written, read or trusted, or that lacks what is asked for.
struct checkpoint_error : error {
    using error::error;
};

// Static shapes of a step's graph params, by name (for safetensors shapes).
using shape_map = std::map<std::string, std::vector<std::size_t>, std::less<>>;
// The static shapes of a step's params by name, for safetensors_writer::add and
// safetensors_reader::load (params with a dynamic extent are left out).
template <class Step>
shape_map shapes_of(const Step&) {
    shape_map m;
    []<class... Ls>(shape_map& out, detail::type_list<Ls...>) {
        auto one = [&]<class L>(L*) {
            using S = typename L::shape_type;
            if constexpr (S::is_static)
                out.emplace(std::string(L::name()), std::vector<std::size_t>(S::extents.begin(), S::extents.end()));
        };
        (one(static_cast<Ls*>(nullptr)), ...);
    }(m, detail::graph_params_t<Step>{});
    return m;
}

namespace detail {

static_assert(std::endian::native == std::endian::little,
              "typegrad: safetensors I/O copies buffers as they are in memory and needs a little-endian host.");

template <class T>
constexpr const char* safetensors_dtype() {
    if constexpr (std::is_same_v<T, float>) return "F32";
    else if constexpr (std::is_same_v<T, double>) return "F64";
    else if constexpr (std::is_same_v<T, bf16>) return "BF16";
    else if constexpr (std::is_same_v<T, f16>) return "F16";
    else if constexpr (std::is_same_v<T, std::int64_t>) return "I64";
    else return nullptr;
}

struct st_tensor_ref {
    std::string name;
    const char* dtype;
    std::byte* data;
    std::size_t count;
    std::size_t element_size;
};

template <class Set>
std::vector<st_tensor_ref> tensor_refs(Set& set, std::string_view prefix) {
    std::vector<st_tensor_ref> out;
    for_each_param(set, [&](std::string_view name, auto& buf) {
        using T = std::remove_cv_t<std::ranges::range_value_t<std::remove_reference_t<decltype(buf)>>>;
        static_assert(safetensors_dtype<T>() != nullptr,
                      "typegrad: safetensors checkpoints hold f32, f64, bf16 and f16 buffers.");
        out.push_back({std::string(prefix) + std::string(name), safetensors_dtype<T>(),
                       reinterpret_cast<std::byte*>(const_cast<T*>(std::ranges::data(buf))),
                       std::size_t(std::ranges::size(buf)), sizeof(T)});
    });
    return out;
}

}  // namespace detail

// Writes parameter sets and optimizer state to a safetensors file (the Hugging Face format):
// add(...) what to save, then save(path); the file is written to a temporary name and renamed, so a
// failed save leaves no partial file.
class safetensors_writer {
public:
    // Every buffer of a parameter set, named prefix + dotted name; shapes from `shapes` when it has
    // the name (and the element count agrees), else 1-D.
    template <class Set>
    void add(const Set& set, std::string_view prefix = "", const shape_map& shapes = {}) {
        for (detail::st_tensor_ref& t : detail::tensor_refs(set, prefix)) {
            std::vector<std::size_t> shape{t.count};
            if (auto it = shapes.find(std::string_view(t.name).substr(prefix.size())); it != shapes.end()) {
                std::size_t n = 1;
                for (std::size_t e : it->second) n *= e;
                if (n != t.count)
                    detail::fail<shape_error>({"typegrad: safetensors_writer: '", t.name, "' has ", t.count,
                                               " elements, its shape ", n});
                shape = it->second;
            }
            add_entry(t, std::move(shape));
        }
    }
    // An optimizer's state (prefix + "exp_avg." + name, ...) and its per-buffer step counts
    // (prefix + "steps", I64).
    template <class Optimizer>
    void add_optimizer(Optimizer& opt, std::string_view prefix = "") {
        for (auto& [what, table] : opt.state_tables())
            for (const detail::buffer_ref& b : table)
                add_entry({std::string(prefix) + what + "." + b.name, b.is_double ? "F64" : "F32",
                           static_cast<std::byte*>(b.data), b.size, b.is_double ? 8u : 4u},
                          {b.size});
        add_entry({std::string(prefix) + "steps", "I64", reinterpret_cast<std::byte*>(opt.steps.data()),
                   opt.steps.size(), 8},
                  {opt.steps.size()});
    }
    // A string pair for the header's __metadata__ (Hugging Face's free-form metadata).
    void add_metadata(std::string key, std::string value) { metadata_[std::move(key)] = std::move(value); }

    // Writes to a temporary file beside `path`, then renames it: a failed save leaves no half file.
    void save(const std::filesystem::path& path) const {
        nlohmann::ordered_json header = nlohmann::ordered_json::object();
        if (!metadata_.empty()) header["__metadata__"] = metadata_;
        std::size_t offset = 0;
        for (const entry& e : entries_) {
            const std::size_t bytes = e.ref.count * e.ref.element_size;
            header[e.ref.name] = {{"dtype", e.ref.dtype}, {"shape", e.shape}, {"data_offsets", {offset, offset + bytes}}};
            offset += bytes;
        }
        std::string text = header.dump();
        text.append((8 - text.size() % 8) % 8, ' ');  // the tensors start 8-byte aligned
        const std::filesystem::path tmp = path.string() + ".tmp";
        {
            std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
            const std::uint64_t n = text.size();
            out.write(reinterpret_cast<const char*>(&n), 8);
            out.write(text.data(), std::streamsize(text.size()));
            for (const entry& e : entries_)
                out.write(reinterpret_cast<const char*>(e.ref.data), std::streamsize(e.ref.count * e.ref.element_size));
            if (!out.flush())
                detail::fail<checkpoint_error>({"typegrad: safetensors: cannot write ", tmp.string()});
        }
        std::error_code ec;
        std::filesystem::rename(tmp, path, ec);
        if (ec) detail::fail<checkpoint_error>({"typegrad: safetensors: cannot write ", path.string()});
    }

private:
    struct entry {
        detail::st_tensor_ref ref;
        std::vector<std::size_t> shape;
    };
    void add_entry(detail::st_tensor_ref ref, std::vector<std::size_t> shape) {
        for (const entry& e : entries_)
            if (e.ref.name == ref.name)
                detail::fail<checkpoint_error>({"typegrad: safetensors_writer: tensor '", ref.name, "' added twice"});
        entries_.push_back({std::move(ref), std::move(shape)});
    }
    std::vector<entry> entries_;
    std::map<std::string, std::string> metadata_;
};

// Reads a safetensors file: load(set) fills a parameter set by name, load_optimizer(opt) an
// optimizer's state; a missing tensor, a wrong dtype or shape, or a corrupt file throws
// (checkpoint_error, shape_error) before the destination is touched.
class safetensors_reader {
public:
    // One tensor of the file as its header describes it.
    struct tensor_info {
        // The safetensors dtype name: "F32", "F64", "BF16", "F16", "I64", ...
        std::string dtype;
        // The extents, row-major.
        std::vector<std::size_t> shape;
        // The offset of the tensor's first byte in the data section.
        std::size_t begin;
        // The offset one past its last byte.
        std::size_t end;
    };

    // Reads the file and validates the header: well-formed JSON, known dtypes, shapes that match
    // the byte ranges, ranges inside the file that tile the data section without overlap.
    explicit safetensors_reader(const std::filesystem::path& path) {
        std::ifstream in(path, std::ios::binary);
        if (!in) detail::fail<checkpoint_error>({"typegrad: safetensors: cannot open ", path.string()});
        std::vector<char> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        auto fail = [&](std::string_view why) {
            return checkpoint_error(detail::message("typegrad: safetensors: ", path.string(), ": ", why));
        };
        if (file.size() < 8) throw fail("truncated (no header length)");
        std::uint64_t n = 0;
        std::memcpy(&n, file.data(), 8);
        if (n > file.size() - 8) throw fail("truncated (header longer than the file)");
        nlohmann::json header;
        try {
            header = nlohmann::json::parse(file.begin() + 8, file.begin() + 8 + std::ptrdiff_t(n));
        } catch (const nlohmann::json::exception& e) {
            throw fail(std::string("corrupt header: ") + e.what());
        }
        if (!header.is_object()) throw fail("corrupt header: not a JSON object");
        data_.assign(file.begin() + 8 + std::ptrdiff_t(n), file.end());
        std::vector<std::pair<std::size_t, std::size_t>> ranges;
        try {
            for (auto it = header.begin(); it != header.end(); ++it) {
                if (it.key() == "__metadata__") {
                    for (auto m = it->begin(); m != it->end(); ++m) metadata_[m.key()] = m->get<std::string>();
                    continue;
                }
                tensor_info t;
                t.dtype = it->at("dtype").get<std::string>();
                t.shape = it->at("shape").get<std::vector<std::size_t>>();
                const auto off = it->at("data_offsets").get<std::vector<std::size_t>>();
                if (off.size() != 2 || off[0] > off[1] || off[1] > data_.size())
                    throw fail("tensor '" + it.key() + "' has data offsets outside the file (truncated?)");
                t.begin = off[0];
                t.end = off[1];
                std::size_t count = 1;
                for (std::size_t e : t.shape) count *= e;
                const std::size_t size = element_size(t.dtype);
                if (size == 0) throw fail("tensor '" + it.key() + "' has the unknown dtype " + t.dtype);
                if (count * size != t.end - t.begin)
                    throw fail("tensor '" + it.key() + "': its shape and byte range disagree");
                ranges.emplace_back(t.begin, t.end);
                tensors_.emplace(it.key(), std::move(t));
            }
        } catch (const nlohmann::json::exception& e) {
            throw fail(std::string("corrupt header: ") + e.what());
        }
        std::sort(ranges.begin(), ranges.end());
        std::size_t at = 0;
        for (auto [b, e] : ranges) {
            if (b != at) throw fail("tensor byte ranges overlap or leave gaps");
            at = e;
        }
        if (at != data_.size()) throw fail("bytes after the last tensor (or the file is corrupt)");
    }

    // Every tensor of the file, by name.
    const std::map<std::string, tensor_info, std::less<>>& tensors() const { return tensors_; }
    // The header's __metadata__ (empty when it has none).
    const std::map<std::string, std::string>& metadata() const { return metadata_; }

    // Fills every buffer of the set from the tensor named prefix + its dotted name. Checks all of
    // them first (present, same dtype, same element count, same shape when `shapes` names it).
    template <class Set>
    void load(Set& set, std::string_view prefix = "", const shape_map& shapes = {}) const {
        const auto refs = detail::tensor_refs(set, prefix);
        for (const detail::st_tensor_ref& r : refs) {
            const shape_map::const_iterator s = shapes.find(std::string_view(r.name).substr(prefix.size()));
            check(r, s == shapes.end() ? nullptr : &s->second);
        }
        for (const detail::st_tensor_ref& r : refs) copy(r);
    }
    // Fills an optimizer's state and step counts from the tensors add_optimizer wrote with the same
    // prefix. Checks everything first, leaving the optimizer untouched on error: a missing tensor,
    // another dtype or steps that do not match the optimizer throw checkpoint_error, another
    // element count shape_error.
    template <class Optimizer>
    void load_optimizer(Optimizer& opt, std::string_view prefix = "") const {
        std::vector<detail::st_tensor_ref> refs;
        for (auto& [what, table] : opt.state_tables())
            for (const detail::buffer_ref& b : table)
                refs.push_back({std::string(prefix) + what + "." + b.name, b.is_double ? "F64" : "F32",
                                static_cast<std::byte*>(b.data), b.size, b.is_double ? 8u : 4u});
        const auto steps = tensors_.find(std::string(prefix) + "steps");
        if (steps == tensors_.end())
            detail::fail<checkpoint_error>({"typegrad: safetensors: no tensor '", prefix, "steps'"});
        const std::size_t n_steps = (steps->second.end - steps->second.begin) / 8;
        if (steps->second.dtype != "I64" || n_steps != refs.size() / std::max<std::size_t>(opt.state_tables().size(), 1))
            detail::fail<checkpoint_error>({"typegrad: safetensors: '", prefix, "steps' does not match the optimizer"});
        for (const detail::st_tensor_ref& r : refs) check(r, nullptr);
        for (const detail::st_tensor_ref& r : refs) copy(r);
        opt.steps.resize(n_steps);
        std::memcpy(opt.steps.data(), data_.data() + steps->second.begin, n_steps * 8);
    }

private:
    static std::size_t element_size(std::string_view dtype) {
        if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
        if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
        if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
        if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" || dtype == "F8_E5M2") return 1;
        return 0;
    }
    void check(const detail::st_tensor_ref& r, const std::vector<std::size_t>* shape) const {
        const auto it = tensors_.find(r.name);
        if (it == tensors_.end())
            detail::fail<checkpoint_error>({"typegrad: safetensors: the file has no tensor '", r.name, "'"});
        const tensor_info& t = it->second;
        if (t.dtype != r.dtype)
            detail::fail<checkpoint_error>({"typegrad: safetensors: tensor '", r.name, "' is ", t.dtype,
                                            ", the buffer ", r.dtype, " (no silent conversion)"});
        if ((t.end - t.begin) / r.element_size != r.count)
            detail::fail<shape_error>({"typegrad: safetensors: tensor '", r.name, "' has ",
                                       (t.end - t.begin) / r.element_size, " elements, the buffer ", r.count});
        if (shape != nullptr && *shape != t.shape)
            detail::fail<shape_error>({"typegrad: safetensors: tensor '", r.name,
                                       "' has another shape than the graph param"});
    }
    void copy(const detail::st_tensor_ref& r) const {
        const tensor_info& t = tensors_.find(r.name)->second;
        if (t.end != t.begin) std::memcpy(r.data, data_.data() + t.begin, t.end - t.begin);
    }

    std::vector<char> data_;
    std::map<std::string, tensor_info, std::less<>> tensors_;
    std::map<std::string, std::string> metadata_;
};

}  // namespace typegrad
