#pragma once
// Static and dynamic extents, and numpy broadcasting.
//
// Broadcasting is decided at compile time: a static extent 1 (or a missing leading axis)
// broadcasts; a dynamic extent never does, it must equal the extent it meets at run time
// (torch.compile makes the same assumption for dynamic sizes). So which axes broadcast is part
// of the graph type, and fused loops know their access patterns when they are compiled.
#include <array>
#include <cstddef>
#include <utility>

namespace typegrad {

// A dynamic extent, known at run time: tg::shape<tg::dyn, 3>. It must equal the extent it meets
// (it never broadcasts); tg::describe shows it as dyn.
inline constexpr std::size_t dyn = static_cast<std::size_t>(-1);

// A tensor's shape as extents, static (a number) or tg::dyn: tg::shape<4, 3>, tg::shape<tg::dyn, 3>.
template <std::size_t... Extents>
struct shape {
    // The number of extents (0 for a scalar).
    static constexpr std::size_t rank = sizeof...(Extents);
    // The extents, tg::dyn for dynamic ones.
    static constexpr std::array<std::size_t, rank> extents{Extents...};
    // True when no extent is tg::dyn.
    static constexpr bool is_static = ((Extents != dyn) && ...);
    // How many extents are tg::dyn.
    static constexpr std::size_t dyn_count = ((Extents == dyn ? 1u : 0u) + ... + 0u);
    // Product of the static extents (dynamic ones count as 1).
    static constexpr std::size_t static_numel = ((Extents == dyn ? 1u : Extents) * ... * 1u);
};

// The shape of a scalar (rank 0), the default of tg::param and tg::input.
using scalar_shape = shape<>;

namespace detail {

inline constexpr std::size_t max_rank = 8;
inline constexpr std::size_t max_arity = 6;  // children of one node

template <class S>
inline constexpr bool is_shape_v = false;
template <std::size_t... Es>
inline constexpr bool is_shape_v<shape<Es...>> = true;

struct extents_value {
    std::size_t rank = 0;
    std::array<std::size_t, max_rank> ext{};
    bool ok = true;
};

template <class S>
constexpr extents_value extents_of() {
    extents_value r;
    r.rank = S::rank;
    for (std::size_t i = 0; i < S::rank; ++i) r.ext[i] = S::extents[i];
    return r;
}

constexpr std::size_t broadcast_extent(std::size_t a, std::size_t b, bool& ok) {
    if (a == b) return a;
    if (a == 1) return b;
    if (b == 1) return a;
    if (a == dyn) return b;  // the dynamic side must equal b at run time
    if (b == dyn) return a;
    ok = false;
    return a;
}

constexpr extents_value broadcast_extents(const extents_value& a, const extents_value& b) {
    extents_value r;
    r.rank = a.rank > b.rank ? a.rank : b.rank;
    for (std::size_t i = 0; i < r.rank; ++i) {
        const std::size_t ea = i < r.rank - a.rank ? 1 : a.ext[i - (r.rank - a.rank)];
        const std::size_t eb = i < r.rank - b.rank ? 1 : b.ext[i - (r.rank - b.rank)];
        r.ext[i] = broadcast_extent(ea, eb, r.ok);
    }
    return r;
}

// Provider: a type with `static constexpr extents_value value` (a class-type template argument
// here crashes g++ 12).
template <class Provider, class Seq = std::make_index_sequence<Provider::value.rank>>
struct shape_from;
template <class Provider, std::size_t... Is>
struct shape_from<Provider, std::index_sequence<Is...>> {
    using type = shape<Provider::value.ext[Is]...>;
};
template <class Provider>
using shape_from_t = typename shape_from<Provider>::type;

template <class... Shapes>
constexpr extents_value broadcast_all() {
    extents_value r;  // rank 0: the identity of broadcasting
    ((r = broadcast_extents(r, extents_of<Shapes>())), ...);
    return r;
}

template <class... Shapes>
inline constexpr bool broadcastable_v = broadcast_all<Shapes...>().ok;

// A shape as text, "[dyn, 3]" (tg::dyn by its name, as describe() writes it), for compile-time
// diagnostics: compilers list tg::dyn inside template arguments as 18446744073709551615, but
// GCC shows a class-type template argument's characters. Only a failing check spells it out
// (Show), so passing checks share one empty value.
struct shape_chars {
    char text[max_rank * 22 + 3]{};  // 20 digits and ", " per axis, "[]" and the terminator
};
template <class S, bool Show>
inline constexpr shape_chars shape_text_v{};
template <std::size_t... E>
inline constexpr shape_chars shape_text_v<shape<E...>, true> = [] {
    shape_chars r;
    std::size_t n = 0;
    r.text[n++] = '[';
    bool first = true;
    for (std::size_t e : std::array<std::size_t, sizeof...(E)>{E...}) {
        if (!first) r.text[n++] = ',', r.text[n++] = ' ';
        first = false;
        if (e == dyn) {
            for (char ch : {'d', 'y', 'n'}) r.text[n++] = ch;
            continue;
        }
        char digits[20];
        std::size_t k = 0;
        do digits[k++] = char('0' + e % 10); while ((e /= 10) != 0);
        while (k) r.text[n++] = digits[--k];
    }
    r.text[n] = ']';
    return r;
}();
// The condition of a shape check, written so that a failing one names the operands' shapes in
// the compiler's note: 'shapes_checked<shape_chars{"[dyn, 3]"}, shape_chars{"[4]"}, false>::ok'.
template <shape_chars A, shape_chars B, bool Ok>
struct shapes_checked {
    static constexpr bool ok = Ok;
};

template <class... Shapes>
struct broadcast_provider {
    static constexpr extents_value value = broadcast_all<Shapes...>();
};
template <class... Shapes>
using broadcast_t = shape_from_t<broadcast_provider<Shapes...>>;

// True when axis `axis` (counted in the rank of Full) of an operand of shape Part is broadcast,
// i.e. read with stride 0, in an iteration over Full.
template <class Part, class Full>
constexpr bool is_broadcast_axis(std::size_t axis) {
    const std::size_t lead = Full::rank - Part::rank;
    if (axis < lead) return true;
    const std::size_t e = Part::extents[axis - lead];
    return e == 1 && Full::extents[axis] != 1;
}

}  // namespace detail
}  // namespace typegrad
