#pragma once
// Parameter sets: a plain struct whose members are parameter buffers, made introspectable with
// Boost.Hana, binds every graph param whose name equals a member's name.
//
//   struct layer { BOOST_HANA_DEFINE_STRUCT(layer, (std::vector<float>, W), (std::vector<float>, b)); };
//   struct model { BOOST_HANA_DEFINE_STRUCT(model, (layer, fc1), (layer, fc2)); };
//   // graph params "fc1.W", "fc1.b", "fc2.W", "fc2.b": nested structs give dotted names
//
//   float l = tg::value_and_grad(step, tg::bind(X, xd), tg::params(m), tg::grads_into(g));
//   auto ctx = tg::forward(step, tg::bind(X, xd), tg::params(m));
//   tg::backward(step, ctx, tg::grads_into(g));
//
// Members are buffers (any contiguous sized range of a dtype: std::vector<float>,
// std::array<double, N>, ...; row-major, as every binding), nested Hana structs ("fc1.W"),
// std::array<Block, N> ("blocks.0.W", PyTorch's ModuleList naming) and std::vector<Block> of
// blocks. BOOST_HANA_ADAPT_STRUCT works as well as BOOST_HANA_DEFINE_STRUCT.
//
// Checked at compile time (typegrad: static_asserts, the name in the instantiation shown below
// them): a graph param with no member (unless bound by tg::bind in the same call), a buffer member
// no graph param uses, a wrong element type. At run time, before anything is written: a member
// whose size differs from its param's static size (shape_error naming the member), and a
// std::vector of blocks with a size the graph's names do not cover.
//
// The wrappers are free functions rather than members of the step so that the graph and
// execution layers never see Hana: a parameter set is expanded into the ordinary tg::bind /
// tg::grad_into arguments, and the step is called with those.
#include <array>
#include <cstddef>
#include <ranges>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <boost/hana/accessors.hpp>
#include <boost/hana/adapt_struct.hpp>
#include <boost/hana/at.hpp>
#include <boost/hana/define_struct.hpp>
#include <boost/hana/first.hpp>
#include <boost/hana/length.hpp>
#include <boost/hana/second.hpp>
#include <boost/hana/string.hpp>
#include <boost/hana/tuple.hpp>

#include <typegrad/core/dtype.hpp>
#include <typegrad/core/error.hpp>
#include <typegrad/exec/bind.hpp>
#include <typegrad/exec/step.hpp>
#include <typegrad/graph/topo.hpp>

namespace typegrad {

namespace detail {

template <class T>
concept hana_struct = boost::hana::Struct<T>::value;

template <class T>
concept param_buffer = std::ranges::contiguous_range<T> && std::ranges::sized_range<T> &&
                       (std::is_arithmetic_v<std::ranges::range_value_t<T>> ||
                        is_dtype_v<std::ranges::range_value_t<T>>);

template <class T> struct block_array : std::false_type {};
template <class B, std::size_t N>
    requires hana_struct<B>
struct block_array<std::array<B, N>> : std::true_type {
    using block = B;
    static constexpr std::size_t size = N;
};
template <class T> struct block_vector : std::false_type {};
template <class B, class A>
    requires hana_struct<B>
struct block_vector<std::vector<B, A>> : std::true_type {
    using block = B;
};

enum class member_kind { buffer, block, block_array, block_vector, other };

template <class T>
consteval member_kind kind_of() {
    if constexpr (hana_struct<T>) return member_kind::block;
    else if constexpr (block_array<T>::value) return member_kind::block_array;
    else if constexpr (block_vector<T>::value) return member_kind::block_vector;
    else if constexpr (param_buffer<T>) return member_kind::buffer;
    else return member_kind::other;
}

template <class S>
inline constexpr std::size_t member_count =
    decltype(boost::hana::length(boost::hana::accessors<S>()))::value;
template <class S, std::size_t I>
using member_t = std::remove_cvref_t<decltype(boost::hana::second(boost::hana::at_c<I>(
    boost::hana::accessors<S>()))(std::declval<S&>()))>;
template <class S, std::size_t I>
inline constexpr std::string_view member_name_v =
    std::remove_cvref_t<decltype(boost::hana::first(boost::hana::at_c<I>(boost::hana::accessors<S>())))>::c_str();

template <class S, std::size_t I, member_kind K>
constexpr void check_member_kind() {
    static_assert(K != member_kind::other,
                  "typegrad: params(model): every member of a parameter struct must be a buffer of a "
                  "dtype (std::vector<float>, std::array<double, N>, ...), a Hana struct of parameters, "
                  "or a std::array / std::vector of such structs; the member at index I of the struct S "
                  "named below is none of these.");
}

// Buffers reachable without passing through a std::vector of blocks (arrays expanded), and the
// std::vector-of-blocks members, both numbered depth-first.
template <class S>
consteval std::size_t fixed_leaf_count();
template <class S>
consteval std::size_t vector_slot_count();

template <class T>
consteval std::size_t member_fixed_leaves() {
    constexpr member_kind k = kind_of<T>();
    if constexpr (k == member_kind::buffer) return 1;
    else if constexpr (k == member_kind::block) return fixed_leaf_count<T>();
    else if constexpr (k == member_kind::block_array)
        return block_array<T>::size * fixed_leaf_count<typename block_array<T>::block>();
    else return 0;
}
template <class T>
consteval std::size_t member_vector_slots() {
    constexpr member_kind k = kind_of<T>();
    if constexpr (k == member_kind::block) return vector_slot_count<T>();
    else if constexpr (k == member_kind::block_array)
        return block_array<T>::size * vector_slot_count<typename block_array<T>::block>();
    else if constexpr (k == member_kind::block_vector) return 1;
    else return 0;
}
template <class S>
consteval std::size_t fixed_leaf_count() {
    return []<std::size_t... I>(std::index_sequence<I...>) {
        (check_member_kind<S, I, kind_of<member_t<S, I>>()>(), ...);
        return (member_fixed_leaves<member_t<S, I>>() + ... + 0);
    }(std::make_index_sequence<member_count<S>>{});
}
template <class S>
consteval std::size_t vector_slot_count() {
    return []<std::size_t... I>(std::index_sequence<I...>) {
        return (member_vector_slots<member_t<S, I>>() + ... + 0);
    }(std::make_index_sequence<member_count<S>>{});
}

inline constexpr std::size_t no_index = static_cast<std::size_t>(-1);
inline constexpr std::size_t max_path_depth = 16;

// Where a dotted name leads in a parameter struct: the member indices (and element indices of
// arrays / vectors of blocks) from the root, the buffer's depth-first number when it is not inside
// a std::vector, or else the number of that vector member.
struct member_path {
    bool found = false;
    std::array<std::size_t, max_path_depth> steps{};
    std::size_t depth = 0;
    std::size_t leaf = no_index;
    std::size_t vector_slot = no_index;
    std::size_t vector_element = no_index;
};

constexpr member_path prepend(member_path p, std::size_t a, std::size_t b = no_index) {
    const std::size_t k = b == no_index ? 1 : 2;
    for (std::size_t i = p.depth; i-- > 0;) p.steps[i + k] = p.steps[i];
    p.steps[0] = a;
    if (b != no_index) p.steps[1] = b;
    p.depth += k;
    return p;
}

// "m.rest" -> "rest" when name starts with "m."
constexpr bool strip_prefix(std::string_view& name, std::string_view m) {
    if (name.size() <= m.size() || !name.starts_with(m) || name[m.size()] != '.') return false;
    name.remove_prefix(m.size() + 1);
    return true;
}
// "12.rest" -> 12, "rest"
constexpr bool strip_index(std::string_view& name, std::size_t& k) {
    std::size_t i = 0, v = 0;
    while (i < name.size() && name[i] >= '0' && name[i] <= '9') v = v * 10 + std::size_t(name[i++] - '0');
    if (i == 0 || i >= name.size() || name[i] != '.' || (i > 1 && name[0] == '0')) return false;
    name.remove_prefix(i + 1);
    k = v;
    return true;
}

template <class S>
constexpr member_path resolve(std::string_view name, std::size_t leaf_base, std::size_t slot_base);

template <class S, std::size_t I>
constexpr bool resolve_member(std::string_view name, member_path& r, std::size_t& leaf_base, std::size_t& slot_base) {
    using T = member_t<S, I>;
    constexpr std::string_view m = member_name_v<S, I>;
    constexpr member_kind k = kind_of<T>();
    if constexpr (k == member_kind::buffer) {
        if (name == m) {
            r = member_path{true, {I}, 1, leaf_base, no_index, no_index};
            return true;
        }
    } else if constexpr (k == member_kind::block) {
        if (strip_prefix(name, m)) {
            if (member_path sub = resolve<T>(name, leaf_base, slot_base); sub.found) {
                r = prepend(sub, I);
                return true;
            }
        }
    } else if constexpr (k == member_kind::block_array) {
        using B = typename block_array<T>::block;
        std::size_t e = 0;
        if (strip_prefix(name, m) && strip_index(name, e) && e < block_array<T>::size) {
            if (member_path sub = resolve<B>(name, leaf_base + e * fixed_leaf_count<B>(),
                                             slot_base + e * vector_slot_count<B>());
                sub.found) {
                r = prepend(sub, I, e);
                return true;
            }
        }
    } else if constexpr (k == member_kind::block_vector) {
        using B = typename block_vector<T>::block;
        static_assert(vector_slot_count<B>() == 0,
                      "typegrad: params(model): a std::vector of blocks whose blocks hold std::vectors of "
                      "blocks again is not supported; use std::array for the inner level.");
        std::size_t e = 0;
        if (strip_prefix(name, m) && strip_index(name, e)) {
            if (member_path sub = resolve<B>(name, 0, 0); sub.found) {
                r = prepend(sub, I, e);
                r.leaf = no_index;
                r.vector_slot = slot_base;
                r.vector_element = e;
                return true;
            }
        }
    }
    leaf_base += member_fixed_leaves<T>();
    slot_base += member_vector_slots<T>();
    return false;
}

template <class S>
constexpr member_path resolve(std::string_view name, std::size_t leaf_base, std::size_t slot_base) {
    member_path r;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
        (resolve_member<S, I>(name, r, leaf_base, slot_base) || ...);
    }(std::make_index_sequence<member_count<S>>{});
    return r;
}

// Where Leaf's name leads in S (a type, not a class-type template argument: g++ 12 crashes on
// the latter in these dependent contexts).
template <class S, class Leaf>
struct located {
    static constexpr member_path path = resolve<S>(Leaf::name(), 0, 0);
};

// The member a path leads to.
template <class Loc, std::size_t D = 0, class S>
constexpr auto& member_at(S& s) {
    using U = std::remove_const_t<S>;
    auto& m = boost::hana::second(boost::hana::at_c<Loc::path.steps[D]>(boost::hana::accessors<U>()))(s);
    using T = std::remove_cvref_t<decltype(m)>;
    if constexpr (D + 1 == Loc::path.depth) return m;
    else if constexpr (kind_of<T>() == member_kind::block) return member_at<Loc, D + 1>(m);
    else return member_at<Loc, D + 2>(m[Loc::path.steps[D + 1]]);
}
template <class S, class Loc>
using member_at_t = std::remove_cvref_t<decltype(member_at<Loc>(std::declval<S&>()))>;

// The dotted name of a path, for messages.
template <class Loc, std::size_t D, class S>
void append_path_name(std::string& out) {
    constexpr member_path P = Loc::path;
    if constexpr (D < P.depth) {
        using T = member_t<S, P.steps[D]>;
        if (D != 0) out += '.';
        out += member_name_v<S, P.steps[D]>;
        if constexpr (kind_of<T>() == member_kind::block) append_path_name<Loc, D + 1, T>(out);
        else if constexpr (kind_of<T>() == member_kind::block_array) {
            out += '.' + std::to_string(P.steps[D + 1]);
            append_path_name<Loc, D + 2, typename block_array<T>::block>(out);
        } else if constexpr (kind_of<T>() == member_kind::block_vector) {
            out += '.' + std::to_string(P.steps[D + 1]);
            append_path_name<Loc, D + 2, typename block_vector<T>::block>(out);
        }
    }
}

// The dotted name of the depth-first buffer number `leaf`, for the "unused member" error.
template <std::size_t N>
struct path_name {
    char text[N]{};
};
template <class S>
constexpr void write_leaf_name(std::size_t leaf, char* out, std::size_t& len) {
    std::size_t base = 0;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
        auto one = [&]<std::size_t J>(std::integral_constant<std::size_t, J>) {
            using T = member_t<S, J>;
            constexpr std::size_t n = member_fixed_leaves<T>();
            if (leaf < base || leaf >= base + n) {
                base += n;
                return false;
            }
            auto put = [&](std::string_view s) {
                for (char c : s)
                    if (len + 1 < 96) out[len++] = c;
            };
            if (len != 0) put(".");
            put(member_name_v<S, J>);
            if constexpr (kind_of<T>() == member_kind::block) {
                write_leaf_name<T>(leaf - base, out, len);
            } else if constexpr (kind_of<T>() == member_kind::block_array) {
                using B = typename block_array<T>::block;
                const std::size_t e = (leaf - base) / fixed_leaf_count<B>();
                char digits[20]{};
                std::size_t nd = 0, v = e;
                do digits[nd++] = char('0' + v % 10); while ((v /= 10) != 0);
                put(".");
                while (nd != 0) put(std::string_view(&digits[--nd], 1));
                write_leaf_name<B>(leaf - base - e * fixed_leaf_count<B>(), out, len);
            }
            return true;
        };
        (one(std::integral_constant<std::size_t, I>{}) || ...);
    }(std::make_index_sequence<member_count<S>>{});
}
template <class S>
consteval path_name<96> leaf_name(std::size_t leaf) {
    path_name<96> p;
    std::size_t len = 0;
    write_leaf_name<S>(leaf, p.text, len);
    return p;
}

// The checks, each a template whose arguments name the offender in the compiler's note.
template <class Leaf, class Struct, bool Found>
constexpr void check_param_has_member() {
    static_assert(Found, "typegrad: params(model): the graph param Leaf named below has no member of that "
                         "name in the parameter struct (nested structs and arrays of blocks use dotted "
                         "names: \"fc1.W\" is member W of member fc1, \"blocks.0.W\" member W of "
                         "blocks[0]); add the member or bind the param with tg::bind.");
}
template <class Leaf, class Struct, bool Found>
constexpr void check_grad_has_member() {
    static_assert(Found, "typegrad: grads_into(grads): the param Leaf named below is in the step's "
                         "tg::wrt(...) list but has no member of that name in the gradient struct.");
}
template <char... Cs>
struct member_name {};
template <class S, std::size_t Leaf>
struct leaf_name_type {
    static constexpr path_name<96> text = leaf_name<S>(Leaf);
    static constexpr std::size_t size = std::string_view(text.text).size();
    using type = decltype([]<std::size_t... I>(std::index_sequence<I...>) {
        return member_name<text.text[I]...>{};
    }(std::make_index_sequence<size>{}));
};
template <class Struct, class Member, bool Used>
constexpr void check_member_used() {
    static_assert(Used, "typegrad: params(model) / grads_into(grads): the buffer member named below "
                        "(Member) is not a param of the compiled graph (for grads_into: not in its "
                        "tg::wrt(...) list); remove it, or name the graph param after it.");
}
template <class Leaf, class MemberValue>
constexpr void check_member_element() {
    static_assert(std::is_same_v<MemberValue, typename Leaf::value_type>,
                  "typegrad: params(model) / grads_into(grads): the member bound to the param Leaf "
                  "named below holds MemberValue elements, not the param's dtype; typegrad never "
                  "converts silently.");
}

template <class S, class Leaf>
constexpr bool element_matches() {
    return std::is_same_v<std::ranges::range_value_t<member_at_t<S, located<S, Leaf>>>, typename Leaf::value_type>;
}

template <class List>
struct param_leaves;
template <class... Ns>
struct param_leaves<type_list<Ns...>> {
    template <class N>
    static constexpr bool is_param() {
        if constexpr (is_leaf_v<N>) return N::role == leaf_role::param;
        else return false;
    }
    using type = decltype((type_list<>{} + ... + std::conditional_t<is_param<Ns>(), type_list<Ns>, type_list<>>{}));
};
// The params a step's graph reads.
template <class Step>
using graph_params_t = typename param_leaves<topo_t<typename Step::loss_node>>::type;

template <class Model>
struct param_set_binding {
    Model* model;
};
template <class Grads, bool Accumulate>
struct grad_set_binding {
    Grads* grads;
};
template <class T> inline constexpr bool is_param_set_v = false;
template <class M> inline constexpr bool is_param_set_v<param_set_binding<M>> = true;
template <class T> inline constexpr bool is_grad_set_v = false;
template <class G, bool A> inline constexpr bool is_grad_set_v<grad_set_binding<G, A>> = true;

template <class Leaf, class... Args>
inline constexpr bool bound_explicitly_v = ((is_leaf_binding_v<Args> && std::is_same_v<typename binding_leaf<Args>::type, Leaf>) || ...);
template <class Leaf, class... Args>
inline constexpr bool grad_bound_explicitly_v = ((is_grad_binding_v<Args> && std::is_same_v<typename binding_leaf<Args>::type, Leaf>) || ...);

// Compile-time: every buffer of a set is used by one of Leaves (fixed part); run time: every
// element of a std::vector of blocks is.
template <class Struct, class Leaves>
struct coverage;
template <class Struct, class... Leaves>
struct coverage<Struct, type_list<Leaves...>> {
    static constexpr std::size_t n = fixed_leaf_count<Struct>();
    static constexpr std::size_t slots = vector_slot_count<Struct>();
    static constexpr std::array<member_path, sizeof...(Leaves)> paths{resolve<Struct>(Leaves::name(), 0, 0)...};
    static constexpr std::size_t first_unused = [] {
        std::array<bool, n + 1> used{};
        for (const member_path& p : paths)
            if (p.found && p.leaf != no_index) used[p.leaf] = true;
        for (std::size_t i = 0; i < n; ++i)
            if (!used[i]) return i;
        return no_index;
    }();
    // Per std::vector member: how many graph params resolve into it, and the highest element + 1.
    static constexpr std::array<std::size_t, slots + 1> vector_uses = [] {
        std::array<std::size_t, slots + 1> u{};
        for (const member_path& p : paths)
            if (p.found && p.vector_slot != no_index) ++u[p.vector_slot];
        return u;
    }();
    static constexpr void check() {
        if constexpr (n != 0)
            check_member_used<Struct, typename leaf_name_type<Struct, first_unused == no_index ? 0 : first_unused>::type,
                              first_unused == no_index>();
    }
};

// Runtime sizes of the std::vector-of-blocks members, depth-first.
template <class S>
void vector_sizes(const S& s, std::size_t*& out) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
        auto one = [&]<std::size_t J>(std::integral_constant<std::size_t, J>) {
            using T = member_t<S, J>;
            const auto& m = boost::hana::second(boost::hana::at_c<J>(boost::hana::accessors<S>()))(s);
            if constexpr (kind_of<T>() == member_kind::block) vector_sizes(m, out);
            else if constexpr (kind_of<T>() == member_kind::block_array)
                for (const auto& b : m) vector_sizes(b, out);
            else if constexpr (kind_of<T>() == member_kind::block_vector) *out++ = m.size();
        };
        (one(std::integral_constant<std::size_t, I>{}), ...);
    }(std::make_index_sequence<member_count<S>>{});
}

// Buffers per block of each std::vector-of-blocks member, depth-first.
template <class S>
constexpr void vector_block_leaves(std::size_t* out, std::size_t& i) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
        auto one = [&]<std::size_t J>(std::integral_constant<std::size_t, J>) {
            using T = member_t<S, J>;
            if constexpr (kind_of<T>() == member_kind::block) vector_block_leaves<T>(out, i);
            else if constexpr (kind_of<T>() == member_kind::block_array)
                for (std::size_t e = 0; e < block_array<T>::size; ++e)
                    vector_block_leaves<typename block_array<T>::block>(out, i);
            else if constexpr (kind_of<T>() == member_kind::block_vector)
                out[i++] = fixed_leaf_count<typename block_vector<T>::block>();
        };
        (one(std::integral_constant<std::size_t, I>{}), ...);
    }(std::make_index_sequence<member_count<S>>{});
}

template <class Struct, class Leaves>
void check_vector_coverage(const Struct& s, const char* what) {
    using C = coverage<Struct, Leaves>;
    if constexpr (C::slots != 0) {
        constexpr auto per_block = [] {
            std::array<std::size_t, C::slots + 1> r{};
            std::size_t i = 0;
            vector_block_leaves<Struct>(r.data(), i);
            return r;
        }();
        std::array<std::size_t, C::slots + 1> sizes{};
        std::size_t* out = sizes.data();
        vector_sizes(s, out);
        for (const member_path& p : C::paths)
            if (p.found && p.vector_slot != no_index && p.vector_element >= sizes[p.vector_slot])
                fail<shape_error>({"typegrad: ", what, ": a std::vector of blocks has ",
                                   sizes[p.vector_slot], " elements, but the graph names element ",
                                   p.vector_element});
        // The graph's names are distinct and in range, so "every buffer used" is a count.
        for (std::size_t v = 0; v < C::slots; ++v)
            if (C::vector_uses[v] != sizes[v] * per_block[v])
                fail<shape_error>({"typegrad: ", what, ": a std::vector of blocks has ", sizes[v],
                                   " elements of ", per_block[v], " buffers, but the graph uses ",
                                   C::vector_uses[v], " of them; every buffer must be a graph param"});
    }
}

template <class Struct, class Loc>
std::string path_string() {
    std::string s;
    append_path_name<Loc, 0, Struct>(s);
    return s;
}

// f(dotted name, buffer) for every buffer, depth-first.
template <class S, class F>
void walk_buffers(S& s, const std::string& prefix, F& f) {
    using U = std::remove_const_t<S>;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
        auto one = [&]<std::size_t J>(std::integral_constant<std::size_t, J>) {
            using T = member_t<U, J>;
            auto& m = boost::hana::second(boost::hana::at_c<J>(boost::hana::accessors<U>()))(s);
            const std::string name = prefix + std::string(member_name_v<U, J>);
            if constexpr (kind_of<T>() == member_kind::buffer) f(std::string_view(name), m);
            else if constexpr (kind_of<T>() == member_kind::block) walk_buffers(m, name + ".", f);
            else if constexpr (kind_of<T>() == member_kind::block_array || kind_of<T>() == member_kind::block_vector)
                for (std::size_t e = 0; e < std::size(m); ++e) walk_buffers(m[e], name + "." + std::to_string(e) + ".", f);
        };
        (one(std::integral_constant<std::size_t, I>{}), ...);
    }(std::make_index_sequence<member_count<U>>{});
}

// tg::bind(leaf, member) for every graph param not bound explicitly in the call.
template <class Step, class Model, class... Args>
auto expand_params(const param_set_binding<Model>& set, type_list<Args...>) {
    using S = std::remove_const_t<Model>;
    return []<class... Leaves>(Model& m, type_list<Leaves...>) {
        using unbound = decltype((type_list<>{} + ... +
                                  std::conditional_t<bound_explicitly_v<Leaves, Args...>, type_list<>, type_list<Leaves>>{}));
        // Every member must be some graph param, bound here or explicitly.
        coverage<S, type_list<Leaves...>>::check();
        return [&]<class... Ls>(type_list<Ls...>) {
            (check_param_has_member<Ls, S, located<S, Ls>::path.found>(), ...);
            if constexpr (!(located<S, Ls>::path.found && ...)) {
                return std::tuple<>{};
            } else if constexpr (!(element_matches<S, Ls>() && ...)) {
                (check_member_element<Ls, std::ranges::range_value_t<member_at_t<S, located<S, Ls>>>>(), ...);
                return std::tuple<>{};
            } else {
                check_vector_coverage<S, type_list<Leaves...>>(m, "params(model)");
                auto check_size = [&]<class L>(L*) {
                    using p = located<S, L>;
                    using Sh = typename L::shape_type;
                    if constexpr (Sh::is_static) {
                        const std::size_t n = std::ranges::size(member_at<p>(m));
                        if (n != Sh::static_numel)
                            fail<shape_error>({"typegrad: params(model): member '", path_string<S, p>(),
                                               "' has ", n, " elements; the graph param '", L::name(),
                                               "' needs ", std::size_t(Sh::static_numel),
                                               " (row-major)"});
                    }
                };
                (check_size(static_cast<Ls*>(nullptr)), ...);
                return std::tuple{bind(expr<Ls>{}, member_at<located<S, Ls>>(m))...};
            }
        }(unbound{});
    }(*set.model, graph_params_t<Step>{});
}

// tg::grad_into(leaf, member) for every wrt param without an explicit grad_into in the call.
template <class Step, class Grads, bool Accumulate, class... Args>
auto expand_grads(const grad_set_binding<Grads, Accumulate>& set, type_list<Args...>) {
    using S = Grads;
    return []<class... Leaves>(S& g, type_list<Leaves...>) {
        using unbound = decltype((type_list<>{} + ... +
                                  std::conditional_t<grad_bound_explicitly_v<Leaves, Args...>, type_list<>, type_list<Leaves>>{}));
        // Every member must be some graph param, bound here or explicitly.
        coverage<S, type_list<Leaves...>>::check();
        return [&]<class... Ls>(type_list<Ls...>) {
            (check_grad_has_member<Ls, S, located<S, Ls>::path.found>(), ...);
            if constexpr (!(located<S, Ls>::path.found && ...)) {
                return std::tuple<>{};
            } else if constexpr (!(element_matches<S, Ls>() && ...)) {
                (check_member_element<Ls, std::ranges::range_value_t<member_at_t<S, located<S, Ls>>>>(), ...);
                return std::tuple<>{};
            } else {
                check_vector_coverage<S, type_list<Leaves...>>(g, "grads_into(grads)");
                auto check_size = [&]<class L>(L*) {
                    using p = located<S, L>;
                    using Sh = typename L::shape_type;
                    if constexpr (Sh::is_static) {
                        const std::size_t n = std::ranges::size(member_at<p>(g));
                        if (n != Sh::static_numel)
                            fail<shape_error>({"typegrad: grads_into(grads): member '", path_string<S, p>(),
                                               "' has ", n, " elements; the gradient of '", L::name(),
                                               "' needs ", std::size_t(Sh::static_numel)});
                    }
                };
                (check_size(static_cast<Ls*>(nullptr)), ...);
                if constexpr (Accumulate)
                    return std::tuple{grad_into(expr<Ls>{}, member_at<located<S, Ls>>(g), accumulate)...};
                else
                    return std::tuple{grad_into(expr<Ls>{}, member_at<located<S, Ls>>(g))...};
            }
        }(unbound{});
    }(*set.grads, typename Step::wrt_list{});
}

template <class Step, class Arg, class... All>
auto expand_argument(const Arg& a) {
    if constexpr (is_param_set_v<Arg>) return expand_params<Step>(a, type_list<All...>{});
    else if constexpr (is_grad_set_v<Arg>) return expand_grads<Step>(a, type_list<All...>{});
    else return std::tuple<const Arg&>{a};
}

// Params with a post-accumulate hook (e.g. tg::optimizer_step) need their gradient computed
// even when the caller keeps no gradient buffer: those get a reused thread-local scratch.
template <class N> struct post_hooked_leaf { using type = void; };
template <class F, class X>
struct post_hooked_leaf<node<post_accumulate_hook_op<F>, X>> {
    using type = typename underlying_leaf<X>::type;
};
template <class List> struct post_hooked_leaves;
template <class... Ns>
struct post_hooked_leaves<type_list<Ns...>> {
    using type = decltype((type_list<>{} + ... +
                           std::conditional_t<__is_same(typename post_hooked_leaf<Ns>::type, void), type_list<>,
                                              type_list<typename post_hooked_leaf<Ns>::type>>{}));
};
template <class Leaf>
std::vector<typename Leaf::value_type>& hook_scratch() {
    thread_local std::vector<typename Leaf::value_type> buffer;
    return buffer;
}
template <class Leaf, class Tuple>
std::size_t bound_size(const Tuple& t) {
    std::size_t n = unknown_size;
    std::apply([&](const auto&... b) {
        auto one = [&](const auto& x) {
            using B = std::remove_cvref_t<decltype(x)>;
            if constexpr (is_leaf_binding_v<B>)
                if constexpr (std::is_same_v<typename B::leaf_type, Leaf>) {
                    std::size_t k = 1;
                    for (std::size_t e : x.extents) k *= e;
                    n = k;
                }
        };
        (one(b), ...);
    }, t);
    return n;
}
template <class Step, class Tuple>
auto add_hook_scratch(Tuple t) {
    using hooked = typename post_hooked_leaves<topo_t<typename Step::loss_node>>::type;
    return [&]<class... Ls>(type_list<Ls...>) {
        [[maybe_unused]] auto extra = [&]<class L>(L*) {
            constexpr bool has_grad = []<class... Bs>(std::tuple<Bs...>*) {
                return ((is_grad_binding_v<std::remove_cvref_t<Bs>> &&
                         std::is_same_v<typename binding_leaf<std::remove_cvref_t<Bs>>::type, L>) || ...);
            }(static_cast<Tuple*>(nullptr));
            if constexpr (has_grad || !contains_v<L, typename Step::wrt_list>) {
                return std::tuple<>{};
            } else {
                const std::size_t n = bound_size<L>(t);
                auto& buf = hook_scratch<L>();
                if (n != unknown_size) buf.resize(n);
                return std::tuple{grad_into(expr<L>{}, buf)};
            }
        };
        return std::tuple_cat(std::move(t), extra(static_cast<Ls*>(nullptr))...);
    }(hooked{});
}

template <class Step, class... Args>
auto expand_arguments(const Args&... args) {
    // All expansions run (and throw) before the step sees any argument.
    return add_hook_scratch<Step>(std::tuple_cat(expand_argument<Step, Args, Args...>(args)...));
}

template <class... Args>
constexpr void check_one_set() {
    static_assert((std::size_t(is_param_set_v<Args>) + ... + 0) <= 1,
                  "typegrad: a call takes at most one tg::params(...); put all parameters in one struct "
                  "(nested structs for parts).");
    static_assert((std::size_t(is_grad_set_v<Args>) + ... + 0) <= 1,
                  "typegrad: a call takes at most one tg::grads_into(...).");
}

}  // namespace detail

// The parameters of a Hana struct, for one call. Const model: read-only bindings (a
// post-accumulate hook that updates params then reports a binding_error).
template <class Model>
auto params(Model& model) {
    static_assert(detail::hana_struct<std::remove_const_t<Model>>,
                  "typegrad: params(model) takes a struct made introspectable with "
                  "BOOST_HANA_DEFINE_STRUCT or BOOST_HANA_ADAPT_STRUCT.");
    return detail::param_set_binding<Model>{&model};
}
template <class Model>
auto params(Model&&) = delete;  // a temporary would dangle

// Gradient destinations by name: a struct (usually of the model's type) receiving the gradient of
// every param in the step's tg::wrt(...) list; overwritten, or added to with tg::accumulate.
template <class Grads>
auto grads_into(Grads& grads) {
    static_assert(detail::hana_struct<Grads> && !std::is_const_v<Grads>,
                  "typegrad: grads_into(grads) takes a writable struct made introspectable with "
                  "BOOST_HANA_DEFINE_STRUCT or BOOST_HANA_ADAPT_STRUCT.");
    return detail::grad_set_binding<Grads, false>{&grads};
}
// grads_into that adds to the gradients already in `grads` (gradient accumulation over
// micro-batches; PyTorch's default .grad behaviour).
template <class Grads>
auto grads_into(Grads& grads, accumulate_t) {
    static_assert(detail::hana_struct<Grads> && !std::is_const_v<Grads>,
                  "typegrad: grads_into(grads, tg::accumulate) takes a writable struct made introspectable "
                  "with BOOST_HANA_DEFINE_STRUCT or BOOST_HANA_ADAPT_STRUCT.");
    return detail::grad_set_binding<Grads, true>{&grads};
}

// step.value_and_grad / forward / backward with parameter sets among the arguments.
template <class Step, class... Args>
auto value_and_grad(const Step& step, const Args&... args) {
    detail::check_one_set<Args...>();
    auto expanded = detail::expand_arguments<Step>(args...);
    return std::apply([&](const auto&... a) { return step.value_and_grad(a...); }, expanded);
}
// step.forward(...) with parameter sets among the arguments: returns the forward context for
// tg::backward.
template <class Step, class... Args>
auto forward(const Step& step, const Args&... args) {
    detail::check_one_set<Args...>();
    auto expanded = detail::expand_arguments<Step>(args...);
    return std::apply([&](const auto&... a) { return step.forward(a...); }, expanded);
}
// step.backward(ctx, ...) with parameter sets (tg::grads_into) among the arguments.
template <class Step, class Ctx, class... Args>
void backward(const Step& step, const Ctx& ctx, const Args&... args) {
    detail::check_one_set<Args...>();
    auto expanded = detail::expand_arguments<Step>(args...);
    std::apply([&](const auto&... a) { step.backward(ctx, a...); }, expanded);
}

// Calls f(name, buffer) for every buffer of a parameter set, depth-first, with its dotted name.
template <class Set, class F>
void for_each_param(Set& set, F&& f) {
    static_assert(detail::hana_struct<std::remove_const_t<Set>>,
                  "typegrad: for_each_param(set, f) takes a struct made introspectable with "
                  "BOOST_HANA_DEFINE_STRUCT or BOOST_HANA_ADAPT_STRUCT.");
    detail::walk_buffers(set, std::string{}, f);
}

}  // namespace typegrad
