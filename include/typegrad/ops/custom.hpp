#pragma once
// Custom ops (the C++ form of torch.autograd.Function) and mutations in the backward.
//
//   struct my_op {
//       static constexpr auto backward_mutates = tg::mutates(tg::data<1>);   // optional
//       static constexpr auto forward_mutates = tg::mutates(tg::data<0>);    // optional
//       struct saved_type { float scale; };                                  // optional
//       static constexpr tg::autocast_class autocast = tg::autocast_class::fp32;  // optional
//       template <class Ctx> static void forward(Ctx& ctx);   // ctx.output(), ctx.inputs(), ctx.saved()
//       template <class Ctx> static void backward(Ctx& ctx);  // ctx.grad_output(), ctx.grad_inputs(),
//   };                                                        // ctx.inputs(), ctx.output(), ctx.saved()
//   (ctx.inputs() and ctx.grad_inputs() are tuples of views: auto [x, y] = ctx.inputs();)
//   auto y = tg::custom<my_op>(a, b);
//
// The output has input 0's shape and dtype unless the op declares `template <class... Xs>
// struct result { using value_type = ...; using shape_type = ...; }` with a static shape.
// Inputs an op does not declare as mutated reach it through read-only views, so an undeclared
// mutation does not compile; views have no way to change metadata (resize_, transpose_,
// as_strided_, set_ are static_asserts), and declaring tg::metadata<I> is rejected too. An op
// may give `template <std::size_t I, class G, class Out, class... Xs> static constexpr auto
// vjp(G, Out, Xs...)` as expressions instead of backward(): then it is differentiable again.
// An op that declares `static constexpr bool differentiable = false` gives an output that carries
// no gradient (ctx.mark_non_differentiable): it needs no backward, and its inputs need no
// tg::detach (a detach of a computed value is a copy).
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <new>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>

#include <typegrad/core/cpu/buffer_pool.hpp>
#include <typegrad/core/device_kernel.hpp>
#include <typegrad/core/error.hpp>
#include <typegrad/ops/arithmetic.hpp>

namespace typegrad {

// Tag type of tg::data<I>.
template <std::size_t I>
struct data_t {};
// In tg::mutates(...): the custom op writes into the data of its input I (an in-place update,
// e.g. a running statistic); the write is kept in the graph and visible in the caller's buffer.
template <std::size_t I>
inline constexpr data_t<I> data{};
// Tag type of tg::metadata<I>.
template <std::size_t I>
struct metadata_t {};
// In tg::mutates(...): a metadata mutation of input I (resize, transpose_, as_strided, set_).
// Declaring it is rejected with a `typegrad:` static_assert, as AOTAutograd rejects the mutation.
template <std::size_t I>
inline constexpr metadata_t<I> metadata{};
// Tag type of tg::grad_output_data.
struct grad_output_data_t {};
// In tg::mutates(...) for backward_mutates: the backward writes into its incoming gradient; it
// then gets a private copy, so other consumers of that gradient see the original.
inline constexpr grad_output_data_t grad_output_data{};

// The mutation declarations of a custom op, as built by tg::mutates(tg::data<I>, ...).
template <class... Ds>
struct mutation_list {
    // True when input I's data is declared mutated.
    template <std::size_t I>
    static constexpr bool data_of = (std::is_same_v<Ds, data_t<I>> || ...);
    // True when the incoming gradient is declared mutated (tg::grad_output_data).
    static constexpr bool grad_output = (std::is_same_v<Ds, grad_output_data_t> || ...);
};
// tg::mutates(tg::data<I>, ...): what a custom op's backward writes (static constexpr auto
// backward_mutates = ...).
template <class... Ds>
constexpr mutation_list<Ds...> mutates(Ds...) {
    return {};
}

// A view of one tensor inside a custom op. Mutable only where the op declared the mutation.
template <class T, bool Mutable>
class tensor_view {
public:
    // The element type.
    using value_type = T;
    // T& for a view the op declared mutable, const T& otherwise.
    using reference = std::conditional_t<Mutable, T&, const T&>;
    // T* for a view the op declared mutable, const T* otherwise.
    using pointer = std::conditional_t<Mutable, T*, const T*>;
    // A view of `data` with the given row-major extents (typegrad builds the views it hands to ops).
    tensor_view(pointer data, std::span<const std::size_t> extents) : data_(data), extents_(extents) {}
    // The number of elements.
    std::size_t size() const {
        std::size_t n = 1;
        for (std::size_t e : extents_) n *= e;
        return n;
    }
    // The extents, row-major.
    std::span<const std::size_t> extents() const { return extents_; }
    // Element i in row-major order.
    reference operator[](std::size_t i) const { return data_[i]; }
    // The first element.
    pointer data() const { return data_; }
    // Iteration over all elements, row-major.
    pointer begin() const { return data_; }
    // One past the last element.
    pointer end() const { return data_ + size(); }
    // Metadata changes are not data mutations: AOTAutograd rejects them, typegrad at compile time.
    template <class... A>
    void resize_(A&&...) const {
        static_assert(detail::always_false<A...>, "typegrad: a custom op may not resize_ a tensor (a metadata mutation); only data mutations are allowed.");
    }
    // Does not compile: an in-place transpose is a metadata mutation (see resize_).
    template <class... A>
    void transpose_(A&&...) const {
        static_assert(detail::always_false<A...>, "typegrad: a custom op may not transpose_ a tensor in place (a metadata mutation); only data mutations are allowed.");
    }
    // Does not compile: as_strided_ is a metadata mutation (see resize_).
    template <class... A>
    void as_strided_(A&&...) const {
        static_assert(detail::always_false<A...>, "typegrad: a custom op may not as_strided_ a tensor (a metadata mutation); only data mutations are allowed.");
    }
    // Does not compile: set_ replaces the storage, a metadata mutation (see resize_).
    template <class... A>
    void set_(A&&...) const {
        static_assert(detail::always_false<A...>, "typegrad: a custom op may not set_ a tensor's storage (a metadata mutation); only data mutations are allowed.");
    }

private:
    pointer data_;
    std::span<const std::size_t> extents_;
};

namespace detail {

template <class Op>
constexpr auto backward_mutations() {
    if constexpr (requires { Op::backward_mutates; }) return std::remove_cvref_t<decltype(Op::backward_mutates)>{};
    else return mutation_list<>{};
}
template <class Op>
constexpr auto forward_mutations() {
    if constexpr (requires { Op::forward_mutates; }) return std::remove_cvref_t<decltype(Op::forward_mutates)>{};
    else return mutation_list<>{};
}
template <class Op>
using backward_mutations_t = decltype(backward_mutations<Op>());
template <class Op>
using forward_mutations_t = decltype(forward_mutations<Op>());

template <class L>
struct has_metadata : std::false_type {};
template <class... Ds>
struct has_metadata<mutation_list<Ds...>> {
    template <class D> struct is_meta : std::false_type {};
    template <std::size_t I> struct is_meta<metadata_t<I>> : std::true_type {};
    static constexpr bool value = (is_meta<Ds>::value || ...);
};

// The mutations an op declares, as describe() / to_dot() show them on its nodes (AOTAutograd's
// graphs show the copy_ into the input): "backward mutates input 1 (data)".
template <class L>
[[gnu::cold]] inline std::string mutation_text(const char* when) {
    std::string s;
    [&]<std::size_t... Is>(std::index_sequence<Is...>) {
        auto one = [&](bool mutated, std::size_t i) {
            if (!mutated) return;
            s += s.empty() ? std::string(when) + " mutates input " : std::string(", input ");
            s += std::to_string(i);
        };
        (one(L::template data_of<Is>, Is), ...);
    }(std::make_index_sequence<max_arity>{});
    if (!s.empty()) s += " (data)";
    if constexpr (L::grad_output) s += std::string(s.empty() ? when : ",") + " mutates its copy of grad_output";
    return s;
}
template <class Op>
[[gnu::cold]] inline std::string custom_mutations_text(bool forward_too) {
    std::string f = forward_too ? mutation_text<forward_mutations_t<Op>>("forward") : std::string();
    const std::string b = mutation_text<backward_mutations_t<Op>>("backward");
    if (!f.empty() && !b.empty()) f += "; ";
    return f + b;
}
template <class Op>
inline constexpr bool declares_mutations_v =
    !std::is_same_v<forward_mutations_t<Op>, mutation_list<>> || !std::is_same_v<backward_mutations_t<Op>, mutation_list<>>;

template <class Op, class... Xs>
struct custom_result {
    using type = type_at_t<0, type_list<Xs...>>;  // like input 0
    using value_type = typename type::value_type;
    using shape_type = typename type::shape_type;
};
template <class Op, class... Xs>
    requires requires { typename Op::template result<Xs...>::shape_type; }
struct custom_result<Op, Xs...> {
    using value_type = typename Op::template result<Xs...>::value_type;
    using shape_type = typename Op::template result<Xs...>::shape_type;
    static_assert(shape_type::is_static, "typegrad: a custom op's declared result shape must be static "
                                         "(or leave it out to take input 0's shape).");
};

// Values a custom op keeps from forward to backward (`using saved_type = ...` in the op) live
// in the forward node's buffer, after the output's elements, on a 64-byte boundary.
template <class Op>
struct saved_of {
    struct none {};
    using type = none;
    static constexpr std::size_t bytes = 0;
};
template <class Op>
    requires requires { typename Op::saved_type; }
struct saved_of<Op> {
    using type = typename Op::saved_type;
    static_assert(std::is_trivially_copyable_v<type> && std::is_trivially_destructible_v<type> &&
                      std::is_default_constructible_v<type>,
                  "typegrad: a custom op's saved_type must be trivially copyable, trivially destructible and "
                  "default constructible (it lives in the step's scratch buffer, not on the heap).");
    static_assert(alignof(type) <= 64, "typegrad: a custom op's saved_type needs at most 64-byte alignment.");
    static constexpr std::size_t bytes = sizeof(type);
};
inline std::size_t saved_offset(std::size_t elements, std::size_t elem_size) {
    return (elements * elem_size + 63) / 64 * 64;
}

template <class Op, class Ref, class T, std::size_t N, bool Backward>
struct custom_context {
    const Ref* in;  // forward: the inputs; backward: grad_output, output, inputs
    T* out;
    const std::size_t* out_ext;
    std::size_t out_rank;
    T* grad_out_copy;
    void* saved_at = nullptr;

    // The op's saved values (its saved_type): writable in forward, read-only in backward.
    auto& saved() const {
        static_assert(saved_of<Op>::bytes > 0,
                      "typegrad: ctx.saved() of a custom op that declares no saved_type; add "
                      "`struct saved_type { ... };` (or a using declaration) to the op.");
        using S = typename saved_of<Op>::type;
        if constexpr (Backward) return *static_cast<const S*>(saved_at);
        else return *static_cast<S*>(saved_at);
    }

    static constexpr std::size_t first_input = Backward ? 2 : 0;
    using mutations = std::conditional_t<Backward, backward_mutations_t<Op>, forward_mutations_t<Op>>;

    template <std::size_t I>
    auto input() const {
        static_assert(I < N, "typegrad: ctx.input<I>() of a custom op: I is past the op's inputs.");
        using V = T;  // one dtype per graph (labels never reach a custom op)
        const Ref& r = in[first_input + I];
        std::span<const std::size_t> ext(r.ext, r.rank);
        if constexpr (mutations::template data_of<I>) return tensor_view<V, true>(const_cast<V*>(static_cast<const V*>(r.data)), ext);
        else return tensor_view<V, false>(static_cast<const V*>(r.data), ext);
    }
    // All inputs as a tuple of views: `auto [x, y] = ctx.inputs();`
    auto inputs() const {
        return [&]<std::size_t... Is>(std::index_sequence<Is...>) {
            return std::make_tuple(input<Is>()...);
        }(std::make_index_sequence<N>{});
    }
    // All input gradients (backward): `auto [gx, gy] = ctx.grad_inputs();`
    auto grad_inputs() const requires Backward {
        return [&]<std::size_t... Is>(std::index_sequence<Is...>) {
            return std::make_tuple(grad_input<Is>()...);
        }(std::make_index_sequence<N>{});
    }
    auto output() const {
        if constexpr (Backward) {
            const Ref& r = in[1];
            return tensor_view<T, false>(static_cast<const T*>(r.data), std::span<const std::size_t>(r.ext, r.rank));
        } else {
            return tensor_view<T, true>(out, std::span<const std::size_t>(out_ext, out_rank));
        }
    }
    auto grad_output() const requires Backward {
        const Ref& r = in[0];
        std::span<const std::size_t> ext(r.ext, r.rank);
        if constexpr (mutations::grad_output) return tensor_view<T, true>(grad_out_copy, ext);
        else return tensor_view<T, false>(static_cast<const T*>(r.data), ext);
    }
    // Gradient of input I, zero-initialised; written by backward.
    template <std::size_t I>
    auto grad_input() const requires Backward {
        std::size_t offset = 0;
        for (std::size_t j = 0; j < I; ++j) offset += numel(in[first_input + j]);
        const Ref& r = in[first_input + I];
        return tensor_view<T, true>(out + offset, std::span<const std::size_t>(r.ext, r.rank));
    }
    static std::size_t numel(const Ref& r) { return numel_of(r); }
};

template <class Op, std::size_t I>
struct custom_grad_part_op;
template <class Op>
struct custom_backward_op;

// A custom op's device path, a base of its forward and backward op structs (docs/cuda.md, "Custom
// ops on the device", and core/device_kernel.hpp): the op's CUDA statements
// (`device_forward`, `device_backward`) become the body of the node's kernel, which names the
// operands. Parameter words: forward out, n, then (in_k, n_k) per input; backward grad_out, n,
// out, n, then (in_k, n_k, grad_in_k) per input, the packed gradients zeroed before the launch.
template <class Op, bool Backward>
struct custom_device {
    static constexpr const char* statements() {
        if constexpr (Backward && requires { Op::device_backward; }) return Op::device_backward;
        else if constexpr (!Backward && requires { Op::device_forward; }) return Op::device_forward;
        else return nullptr;
    }
    template <class N>
    static constexpr void check_device() {
        static_assert(statements() != nullptr,
                      "typegrad: cuda: a custom op (tg::custom) of this graph has no device implementation; "
                      "give it `static constexpr const char* device_forward` and `device_backward` (CUDA "
                      "statements, docs/cuda.md) or evaluate this step with host bindings");
        static_assert(saved_of<Op>::bytes == 0 && std::is_same_v<forward_mutations_t<Op>, mutation_list<>> &&
                          std::is_same_v<backward_mutations_t<Op>, mutation_list<>>,
                      "typegrad: cuda: a custom op with saved values or declared mutations runs on the host "
                      "only; evaluate this step with host bindings (docs/cuda.md)");
        static_assert(std::is_same_v<storage_t<typename N::value_type>, float> ||
                          std::is_same_v<storage_t<typename N::value_type>, double>,
                      "typegrad: cuda: a custom op runs on the device in f32 or f64 only (docs/cuda.md)");
    }
    template <class N>
    static std::string device_definition(const std::string& fn) {
        constexpr std::size_t inputs = N::children::size - (Backward ? 2 : 0);
        std::string s = std::string("// custom op ") + (Backward ? "(backward)\n" : "(forward)\n");
        s += "__device__ void " + fn + "(const tg_node_args& p) {\n";
        s += std::string("    typedef ") + (std::is_same_v<storage_t<typename N::value_type>, double> ? "double" : "float") +
             " T;\n";
        s += "    const tg_i64 tg_thread = blockIdx.x * (tg_i64)blockDim.x + threadIdx.x, tg_threads = (tg_i64)gridDim.x * blockDim.x;\n";
        std::size_t w = 0;
        auto word = [&](const std::string& declaration) {  // "T* out = (T*)" and the next word
            s += "    " + declaration + "p.w[" + std::to_string(w++) + "];\n";
        };
        if (Backward) {
            word("const T* grad_out = (const T*)");
            word("const tg_i64 n = (tg_i64)");
            word("const T* out = (const T*)");
            word("(void)");
        } else {
            word("T* out = (T*)");
            word("const tg_i64 n = (tg_i64)");
        }
        for (std::size_t k = 0; k < inputs; ++k) {
            const std::string i = std::to_string(k);
            word("const T* in" + i + " = (const T*)");
            word("const tg_i64 n" + i + " = (tg_i64)");
            if (Backward) word("T* grad_in" + i + " = (T*)");
        }
        for (std::size_t k = 0; k < inputs; ++k) s += "    (void)n" + std::to_string(k) + ";\n";
        s += "    (void)tg_thread; (void)tg_threads; (void)n; (void)out;\n";
        if constexpr (statements() != nullptr) s += std::string("    {\n") + statements() + "\n    }\n";
        return s + "}\n";
    }
    // Launches the node's kernel with a grid covering its largest operand.
    template <class N, class Ref, class Device>
    static void device_run(const Ref* in, void* out, const std::size_t* ext, Device& dev) {
        using T = storage_t<typename N::value_type>;
        std::uint64_t w[device_node_words] = {};
        std::size_t word = 0, most = 0;
        auto put = [&](const void* p, std::size_t count) {
            w[word++] = device_word(p);
            w[word++] = count;
            most = count > most ? count : most;
        };
        if constexpr (Backward) {
            dev.zero(out, ext[0] * sizeof(T));
            put(in[0].data, numel_of(in[0]));
            put(in[1].data, numel_of(in[1]));
            std::size_t offset = 0;
            for (std::size_t k = 2; k < N::children::size; ++k) {
                put(in[k].data, numel_of(in[k]));
                w[word++] = device_word(static_cast<T*>(out) + offset);
                offset += numel_of(in[k]);
            }
        } else {
            std::size_t n = 1;
            for (std::size_t a = 0; a < N::shape_type::rank; ++a) n *= ext[a];
            put(out, n);
            for (std::size_t k = 0; k < N::children::size; ++k) put(in[k].data, numel_of(in[k]));
        }
        if (most) dev.launch(w, most);
    }
};

// (the device: custom_device, the op's device_forward statements)
template <class Op>
constexpr bool custom_differentiable() {
    if constexpr (requires { Op::differentiable; }) return bool(Op::differentiable);
    else return true;
}

template <class Op>
struct custom_forward_op : kernel_op_base, custom_device<Op, false> {
    static constexpr const char* name = "custom";
    static constexpr bool differentiable = custom_differentiable<Op>();
    static constexpr std::size_t extra_bytes = saved_of<Op>::bytes;
    using op = Op;
    // inspect/describe.hpp's extension point: the declared mutations, in red in to_dot()
    static std::string describe_extra() { return custom_mutations_text<Op>(true); }
    static std::string dot_attributes() { return declares_mutations_v<Op> ? "color=\"#c62828\", penwidth=2" : ""; }
    // Autocast: the class the op declares (`static constexpr tg::autocast_class autocast`), or
    // per device (`static constexpr tg::autocast_class autocast_on(tg::device_kind)`).
    static constexpr autocast_class autocast_on(device_kind d) {
        if constexpr (requires { Op::autocast_on(d); }) return Op::autocast_on(d);
        else if constexpr (requires { Op::autocast; }) return Op::autocast;
        else return autocast_class::promote;
    }
    template <class... Xs>
    struct rule {
        static_assert(((std::is_same_v<typename Xs::value_type, typename type_at_t<0, type_list<Xs...>>::value_type> ||
                        !is_dtype_v<typename Xs::value_type>) && ...),
                      "typegrad: a custom op's floating inputs must share one dtype (its views have one element "
                      "type); cast them, or declare the op's autocast class (tg::autocast_class::fp32).");
        using value_type = typename custom_result<Op, Xs...>::value_type;
        using shape_type = typename custom_result<Op, Xs...>::shape_type;
    };
    template <class N, class Ref>
    static void extents(const Ref* in, std::size_t* ext) {
        using S = typename N::shape_type;
        if constexpr (S::is_static) {
            for (std::size_t a = 0; a < S::rank; ++a) ext[a] = S::extents[a];
        } else {
            for (std::size_t a = 0; a < in[0].rank; ++a) ext[a] = in[0].ext[a];
        }
        for (std::size_t k = 0; k < N::children::size; ++k)
            if (!is_row_major(in[k]))
                throw shape_error("typegrad: a custom op's inputs must be dense (pass tg::contiguous(x))");
    }
    template <class N, class Ref, class T>
    static void run(const Ref* in, T* out, const std::size_t* ext) {
        custom_context<Op, Ref, T, N::children::size, false> ctx{in, out, ext, N::shape_type::rank, nullptr};
        if constexpr (saved_of<Op>::bytes > 0) {
            std::size_t n = 1;
            for (std::size_t a = 0; a < N::shape_type::rank; ++a) n *= ext[a];
            ctx.saved_at = new (reinterpret_cast<char*>(out) + saved_offset(n, sizeof(T))) typename saved_of<Op>::type{};
        }
        Op::forward(ctx);
    }
    template <std::size_t I, class G, class Out, class... Xs>
    static constexpr auto vjp(G g, Out out, Xs... xs);
};

}  // namespace detail

// tg::custom<Op>(inputs...): a user op (torch.autograd.Function): Op provides forward(ctx,
// views...), backward(ctx, grad_views...) and its declared mutations (tg::mutates); see
// examples/custom_op.cpp.
template <class Op, expression... Xs>
constexpr auto custom(Xs... xs) {
    static_assert(sizeof...(Xs) >= 1 && sizeof...(Xs) + 2 <= detail::max_arity,
                  "typegrad: custom<Op>(inputs...) takes one to four inputs.");
    static_assert(!detail::has_metadata<detail::backward_mutations_t<Op>>::value,
                  "typegrad: custom<Op>: backward_mutates declares a metadata mutation (tg::metadata<I>: "
                  "resize, in-place transpose, as_strided, set); only data mutations (tg::data<I>) are allowed.");
    static_assert(!detail::has_metadata<detail::forward_mutations_t<Op>>::value,
                  "typegrad: custom<Op>: forward_mutates declares a metadata mutation (tg::metadata<I>); only "
                  "data mutations (tg::data<I>) are allowed.");
    return detail::make_node<detail::custom_forward_op<Op>>(xs...);
}

namespace detail {

// All input gradients of one backward call, packed one after the other.
// (the device: custom_device, the op's device_backward statements)
template <class Op>
struct custom_backward_op : kernel_op_base, custom_device<Op, true> {
    static constexpr const char* name = "custom_backward";
    using op = Op;
    // where the backward's mutations happen (its operands are grad_output, output, inputs...)
    static std::string describe_extra() { return custom_mutations_text<Op>(false); }
    static std::string dot_attributes() {
        return std::is_same_v<backward_mutations_t<Op>, mutation_list<>> ? "" : "color=\"#c62828\", penwidth=2";
    }
    template <class G, class Out, class... Xs>
    struct rule {
        using value_type = typename G::value_type;
        using shape_type = shape<dyn>;
    };
    template <class N, class Ref>
    static void extents(const Ref* in, std::size_t* ext) {
        std::size_t n = 0;
        for (std::size_t k = 2; k < N::children::size; ++k) {
            std::size_t e = 1;
            for (std::size_t a = 0; a < in[k].rank; ++a) e *= in[k].ext[a];
            n += e;
        }
        ext[0] = n;
    }
    template <class N, class Ref, class T>
    static void run(const Ref* in, T* out, const std::size_t* ext) {
        std::fill(out, out + ext[0], T(0));
        constexpr bool copy_grad = backward_mutations_t<Op>::grad_output;
        // a mutable incoming gradient is the op's own copy: its changes stay local
        std::array<T, 1> none{};
        T* copy = none.data();
        pooled_buffer<T> local;  // (kernel temporaries: core/cpu/buffer_pool.hpp)
        if constexpr (copy_grad) {
            std::size_t n = 1;
            for (std::size_t a = 0; a < in[0].rank; ++a) n *= in[0].ext[a];
            local = pooled_buffer<T>(n);
            std::copy(static_cast<const T*>(in[0].data), static_cast<const T*>(in[0].data) + n, local.data());
            copy = local.data();
        }
        custom_context<Op, Ref, T, N::children::size - 2, true> ctx{in, out, ext, 1, copy};
        if constexpr (saved_of<Op>::bytes > 0) {
            using Out = type_at_t<1, typename N::children>;
            ctx.saved_at = const_cast<char*>(static_cast<const char*>(in[1].data)) +
                           saved_offset(ctx.numel(in[1]), sizeof(buffer_t<Out>));
        }
        Op::backward(ctx);
    }
    // A backward that mutates an input requiring grad has no derivative (create_graph).
    template <std::size_t I, class G, class Out, class Gr, class O, class... Xs>
    static constexpr auto vjp(G, Out, Gr, O, Xs...) {
        static_assert(!mutates_grad_input<Xs...>(),
                      "typegrad: differentiating through a custom op's backward (grad of grad, create_graph) "
                      "that mutates an input which requires grad: the mutation would be differentiated; "
                      "remove the mutation or the second derivative (the input index is in the instantiation below).");
        static_assert(always_false<Op>, "typegrad: a custom op's backward() is not differentiable; give the op "
                                         "expression vjp<I>(g, out, xs...) rules for higher order.");
        return lit<0>;
    }
    template <class... Xs>
    static constexpr bool mutates_grad_input() {
        return [&]<std::size_t... Is>(std::index_sequence<Is...>) {
            return ((backward_mutations_t<Op>::template data_of<Is> && Xs::requires_grad) || ...);
        }(std::index_sequence_for<Xs...>{});
    }
};

// Input I's gradient inside the packed buffer: a dense view at the right offset.
template <class Op, std::size_t I>
struct custom_grad_part_op : packed_part_view<I> {
    static constexpr const char* name = "custom_grad";
    // Differentiating a kernel backward (grad of grad) is rejected here, at the type level.
    template <std::size_t K, class G, class Out, class Packed, class... Xs>
    static constexpr auto vjp(G, Out, Packed, Xs...) {
        static_assert(!custom_backward_op<Op>::template mutates_grad_input<Xs...>(),
                      "typegrad: differentiating through a custom op's backward (grad of grad, create_graph) "
                      "that mutates an input which requires grad: the mutation would be differentiated; "
                      "remove the mutation or the second derivative (the input index is in the instantiation below).");
        static_assert(always_false<Op>, "typegrad: a custom op's backward() is not differentiable; give the op "
                                         "expression vjp<I>(g, out, xs...) rules for higher order.");
        return lit<0>;
    }
};

template <class Op>
template <std::size_t I, class G, class Out, class... Xs>
constexpr auto custom_forward_op<Op>::vjp(G g, Out out, Xs... xs) {
    if constexpr (requires { Op::template vjp<I>(g, out, xs...); }) {
        return Op::template vjp<I>(g, out, xs...);
    } else {
        auto packed = make_node<custom_backward_op<Op>>(g, out, xs...);
        return make_node<custom_grad_part_op<Op, I>>(packed, xs...);
    }
}

}  // namespace detail
}  // namespace typegrad
