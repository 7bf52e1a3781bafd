#pragma once
// The graph's node lists. Lowering a graph needs membership tests and ordered unions over
// hundreds of node types; Hana's generic algorithms instantiate a function object per element
// there, so these few operations are pack folds over the compiler's __is_same builtin, which
// instantiates nothing. Everything downstream works on integer ids (see program.hpp).
#include <cstddef>
#include <type_traits>
#include <utility>

namespace typegrad::detail {

template <class... Ts>
struct type_list {
    static constexpr std::size_t size = sizeof...(Ts);
};

template <class... As, class... Bs>
constexpr type_list<As..., Bs...> operator+(type_list<As...>, type_list<Bs...>) {
    return {};
}

template <class T, class List>
inline constexpr bool contains_v = false;
template <class T, class... Ts>
inline constexpr bool contains_v<T, type_list<Ts...>> = (__is_same(T, Ts) || ...);

// Position of T in the list (size when absent).
template <class T, class List>
struct index_of;
template <class T, class... Ts>
struct index_of<T, type_list<Ts...>> {
    static constexpr std::size_t value = [] {
        constexpr bool hits[] = {__is_same(T, Ts)..., true};
        std::size_t i = 0;
        while (!hits[i]) ++i;
        return i;
    }();
};
template <class T, class List>
inline constexpr std::size_t index_of_v = index_of<T, List>::value;

// A followed by the elements of B not in A, order kept: the union of two topological orders
// is a topological order.
template <class A, class B>
struct ordered_union;
template <class... As, class... Bs>
struct ordered_union<type_list<As...>, type_list<Bs...>> {
    using type = decltype((type_list<As...>{} + ... +
                           std::conditional_t<contains_v<Bs, type_list<As...>>, type_list<>,
                                              type_list<Bs>>{}));
};

template <class List>
struct union_acc {
    using type = List;
};
template <class A, class B>
constexpr union_acc<typename ordered_union<A, B>::type> operator|(union_acc<A>, union_acc<B>) {
    return {};
}
template <class... Lists>
using union_all_t =
    typename decltype((union_acc<type_list<>>{} | ... | union_acc<Lists>{}))::type;

// The I-th element. Clang has a builtin; elsewhere one overload resolution against a base
// class per element, built once per list.
template <std::size_t I, class T>
struct indexed {
    using type = T;
};
template <class Seq, class... Ts>
struct indexer;
template <std::size_t... Is, class... Ts>
struct indexer<std::index_sequence<Is...>, Ts...> : indexed<Is, Ts>... {};
template <std::size_t I, class T>
indexed<I, T> select_indexed(const indexed<I, T>&);

template <std::size_t I, class List>
struct type_at;
template <std::size_t I, class... Ts>
struct type_at<I, type_list<Ts...>> {
#if defined(__clang__) && __has_builtin(__type_pack_element)
    using type = __type_pack_element<I, Ts...>;
#else
    using type = typename decltype(select_indexed<I>(
        indexer<std::index_sequence_for<Ts...>, Ts...>{}))::type;
#endif
};
template <std::size_t I, class List>
using type_at_t = typename type_at<I, List>::type;

}  // namespace typegrad::detail
