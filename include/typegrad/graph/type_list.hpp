#pragma once
// The graph's node lists. Lowering a graph needs membership tests and filters over hundreds of
// node types; Hana's generic algorithms instantiate a function object per element there, so
// these few operations are pack expansions over the compiler's __is_same builtin, which
// instantiates nothing. None is a fold expression over a whole list: clang limits a fold's
// nesting to 256 operands. Everything downstream works on integer ids (see program.hpp).
#include <array>
#include <cstddef>
#include <initializer_list>
#include <type_traits>
#include <utility>

namespace typegrad::detail {

template <std::size_t N>
struct list_size {
    static constexpr std::size_t size = N;
};
// `size` lives in a base shared by all lists of that length (a static member of the list itself
// would be a variable named with the whole list).
template <class... Ts>
struct type_list : list_size<sizeof...(Ts)> {};

// For short lists (leaves, policies): an operator on a list of graph nodes makes clang's
// argument-dependent lookup walk every node type as a tree (graph/node.hpp, expr_handle); graph-
// sized lists are joined with concat_t.
template <class... As, class... Bs>
constexpr type_list<As..., Bs...> operator+(type_list<As...>, type_list<Bs...>) {
    return {};
}


// Position of T in the list (size when absent). A base class holds the value and contains_v is
// a concept: g++ names (mangles) every variable it instantiates, and a name holding a graph-sized
// list is long, so nothing here is a variable per (T, List).
constexpr std::size_t first_true(std::initializer_list<bool> hits) {
    std::size_t i = 0;
    for (bool h : hits) {
        if (h) return i;
        ++i;
    }
    return i;
}
template <class T, class List>
struct index_of;
template <class T, class... Ts>
struct index_of<T, type_list<Ts...>> : std::integral_constant<std::size_t, first_true({__is_same(T, Ts)...})> {};
template <class T, class List>
concept contains_v = index_of<T, List>::value < List::size;

// Pack helpers without fold expressions: a call may carry hundreds of bindings, a plan hundreds
// of steps, and clang nests a fold's operands (256 at most).
template <class F, class... As>
constexpr void for_each_arg(F&& f, As&&... as) {
    [[maybe_unused]] const int in_order[] = {0, (static_cast<void>(f(static_cast<As&&>(as))), 0)...};
}
constexpr std::size_t count_true(std::initializer_list<bool> flags) {
    std::size_t n = 0;
    for (bool b : flags) n += b;
    return n;
}
constexpr bool any_true(std::initializer_list<bool> flags) { return count_true(flags) != 0; }
constexpr bool all_true(std::initializer_list<bool> flags) { return count_true(flags) == flags.size(); }

// No type appears twice.
template <class... Ts>
constexpr bool distinct() {
    constexpr std::size_t at[] = {index_of<Ts, type_list<Ts...>>::value..., 0};
    for (std::size_t i = 0; i < sizeof...(Ts); ++i)
        if (at[i] != i) return false;
    return true;
}

// The I-th element. Clang has a builtin; elsewhere one overload resolution against a base
// class per element, built once per list. The list is passed whole (list_indexer<List>), never
// re-expanded per index: g++ copies a pack's arguments into a new vector each time it
// substitutes it, and for a graph-sized list (past about 500 elements, where the vector no
// longer fits g++'s small-object pages) that made N look-ups cost O(N^2) slow allocations.
template <std::size_t I, class T>
struct indexed {
    using type = T;
};
template <class Seq, class... Ts>
struct indexer;
template <std::size_t... Is, class... Ts>
struct indexer<std::index_sequence<Is...>, Ts...> : indexed<Is, Ts>... {};
template <class List>
struct list_indexer;
template <class... Ts>
struct list_indexer<type_list<Ts...>> : indexer<std::index_sequence_for<Ts...>, Ts...> {};
template <std::size_t I, class T>
indexed<I, T> select_indexed(const indexed<I, T>&);

template <std::size_t I, class List>
struct type_at {
    using type = typename decltype(detail::select_indexed<I>(list_indexer<List>{}))::type;
};
#if defined(__clang__) && __has_builtin(__type_pack_element)
template <std::size_t I, class... Ts>
struct type_at<I, type_list<Ts...>> {
    using type = __type_pack_element<I, Ts...>;
};
#endif
template <std::size_t I, class List>
using type_at_t = typename type_at<I, List>::type;

// The concatenation of type_lists, four at a time (a fold would hit clang's nesting limit with
// hundreds of lists, e.g. one per argument of a call).
template <class... Lists>
struct concat {
    using type = type_list<>;
};
template <class... As>
struct concat<type_list<As...>> {
    using type = type_list<As...>;
};
template <class... As, class... Bs>
struct concat<type_list<As...>, type_list<Bs...>> {
    using type = type_list<As..., Bs...>;
};
template <class... As, class... Bs, class... Cs>
struct concat<type_list<As...>, type_list<Bs...>, type_list<Cs...>> {
    using type = type_list<As..., Bs..., Cs...>;
};
template <class... As, class... Bs, class... Cs, class... Ds, class... Rest>
struct concat<type_list<As...>, type_list<Bs...>, type_list<Cs...>, type_list<Ds...>, Rest...> {
    using type = typename concat<type_list<As..., Bs..., Cs..., Ds...>, Rest...>::type;
};
template <class... As, class... Bs, class... Cs, class... Ds, class... Es, class... Fs, class... Gs, class... Hs,
          class... Rest>
struct concat<type_list<As...>, type_list<Bs...>, type_list<Cs...>, type_list<Ds...>, type_list<Es...>,
              type_list<Fs...>, type_list<Gs...>, type_list<Hs...>, Rest...> {
    using type = typename concat<type_list<As..., Bs..., Cs..., Ds..., Es..., Fs..., Gs..., Hs...>, Rest...>::type;
};
template <class... Lists>
using concat_t = typename concat<Lists...>::type;

// The elements T of List with Pred<T>::value, in order: the concatenation of one list per
// element (its own or the empty one). Classes only: static arrays or functions per (List, Pred)
// would be named (mangled) with the whole list.
template <class List, template <class> class Pred>
struct filter;
template <class... Ts, template <class> class Pred>
struct filter<type_list<Ts...>, Pred> {
    using type = typename concat<std::conditional_t<bool(Pred<Ts>::value), type_list<Ts>, type_list<>>...>::type;
};
template <class List, template <class> class Pred>
using filter_t = typename filter<List, Pred>::type;


}  // namespace typegrad::detail
