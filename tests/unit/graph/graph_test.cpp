// Compile-time facts: graph types, common subexpressions, gradient types, shape rules.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include <typegrad/typegrad.hpp>
#include <typegrad/exec/program.hpp>

namespace tg = typegrad;

namespace {
constexpr auto x = tg::param<"x", float, tg::shape<tg::dyn>>;
constexpr auto y = tg::input<"y", float, tg::shape<tg::dyn>>;
constexpr auto W = tg::param<"W", float, tg::shape<4, 3>>;
constexpr auto b = tg::param<"b", float, tg::shape<3>>;

template <class E>
using node_t = typename E::node_type;
template <class E>
constexpr std::size_t unique_nodes = tg::detail::topo_t<node_t<E>>::size;
}  // namespace

TEST_CASE("an expression is its type", "[graph]") {
    using L = decltype(tg::sum(tg::exp(x) * y));
    STATIC_REQUIRE(std::is_empty_v<L>);
    STATIC_REQUIRE(std::is_same_v<typename L::value_type, float>);
    STATIC_REQUIRE(std::is_same_v<typename L::shape_type, tg::shape<>>);
    STATIC_REQUIRE(L::requires_grad);
    STATIC_REQUIRE_FALSE(decltype(tg::exp(y))::requires_grad);
    STATIC_REQUIRE(std::is_same_v<decltype(tg::exp(x)), decltype(tg::exp(x))>);
}

namespace {
// Op structs that each lack one member of the op protocol (graph/node.hpp).
struct nameless_op : tg::detail::elementwise_op {};
struct costless_op {
    static constexpr tg::op_kind kind = tg::op_kind::elementwise;
    static constexpr const char* name = "costless";
    static constexpr bool differentiable = true;
    static constexpr bool shape_only(std::size_t) { return false; }
    template <class X>
    struct rule {
        using value_type = typename X::value_type;
        using shape_type = typename X::shape_type;
    };
};
struct ruleless_op : tg::detail::kernel_op_base {
    static constexpr const char* name = "ruleless";
};
}  // namespace

TEST_CASE("op structs of every kind follow the op protocol", "[graph][protocol]") {
    // one op of each kind and base: elementwise, reduce, meta, view, kernel (own base and derived)
    STATIC_REQUIRE(tg::op_struct<tg::detail::exp_op>);
    STATIC_REQUIRE(tg::op_struct<tg::detail::reduce_op<tg::detail::reduce_kind::sum, tg::scalar_shape>>);
    STATIC_REQUIRE(tg::op_struct<tg::detail::inv_count_op<tg::scalar_shape>>);
    STATIC_REQUIRE(tg::op_struct<tg::detail::permute_op<1, 0>>);
    STATIC_REQUIRE(tg::op_struct<tg::detail::matmul_op>);
    STATIC_REQUIRE(tg::op_struct<tg::detail::embedding_op<-1, false>>);
    // and each missing member is seen on its own
    STATIC_REQUIRE_FALSE(tg::op_declares_name<nameless_op>);
    STATIC_REQUIRE(tg::op_declares_rule<nameless_op>);
    STATIC_REQUIRE_FALSE(tg::op_struct<costless_op>);
    STATIC_REQUIRE(tg::op_declares_rule<costless_op>);
    STATIC_REQUIRE_FALSE(tg::op_declares_cost<costless_op>);
    STATIC_REQUIRE_FALSE(tg::op_declares_rule<ruleless_op>);
    STATIC_REQUIRE(tg::op_declares_shape_only<ruleless_op>);
    STATIC_REQUIRE_FALSE(tg::op_struct<ruleless_op>);
}

TEST_CASE("identical subexpressions are one node", "[graph][cse]") {
    using E = decltype(tg::exp(x) * tg::exp(x));
    // x, exp(x), mul: exp(x) appears once in the topological order
    STATIC_REQUIRE(unique_nodes<E> == 3);
    using F = decltype(tg::sum(tg::exp(x) * y) + tg::sum(tg::exp(x) * y));
    STATIC_REQUIRE(unique_nodes<F> == 6);
    using P = tg::detail::program<tg::detail::topo<node_t<F>>>;
    STATIC_REQUIRE(P::size == 6);
    // children always come before parents
    constexpr bool ordered = [] {
        for (std::size_t i = 0; i < P::size; ++i)
            for (std::size_t c = 0; c < P::info[i].arity; ++c)
                if (P::info[i].child[c] >= i) return false;
        return true;
    }();
    STATIC_REQUIRE(ordered);
}

TEST_CASE("broadcasting is decided by the types", "[graph][shape]") {
    STATIC_REQUIRE(std::is_same_v<typename decltype(W * b)::shape_type, tg::shape<4, 3>>);
    STATIC_REQUIRE(std::is_same_v<typename decltype(W + tg::lit<1>)::shape_type, tg::shape<4, 3>>);
    using D = decltype(tg::param<"d", float, tg::shape<tg::dyn, 1>>);
    STATIC_REQUIRE(std::is_same_v<typename decltype(D{} * b)::shape_type, tg::shape<tg::dyn, 3>>);
    STATIC_REQUIRE(tg::detail::broadcastable_v<tg::shape<4, 3>, tg::shape<3>>);
    STATIC_REQUIRE_FALSE(tg::detail::broadcastable_v<tg::shape<4, 3>, tg::shape<4>>);
    STATIC_REQUIRE(tg::detail::broadcastable_v<tg::shape<tg::dyn>, tg::shape<5>>);
}

TEST_CASE("constants fold and identities vanish", "[graph]") {
    STATIC_REQUIRE(std::is_same_v<decltype(tg::lit<2> * tg::lit<3>), std::remove_const_t<decltype(tg::lit<6>)>>);
    STATIC_REQUIRE(std::is_same_v<decltype(x * tg::lit<1>), std::remove_const_t<decltype(x)>>);
    STATIC_REQUIRE(std::is_same_v<decltype(-(-x)), std::remove_const_t<decltype(x)>>);
    STATIC_REQUIRE(std::is_same_v<decltype(tg::pow(x, tg::lit<2>)), decltype(tg::square(x))>);
    STATIC_REQUIRE(std::is_same_v<decltype(tg::lit<2.5>)::value_type, tg::weak_scalar>);
    STATIC_REQUIRE(std::is_same_v<decltype(x * tg::lit<2.5>)::value_type, float>);
}

TEST_CASE("grad_t names the gradient expression", "[graph][autodiff]") {
    using L = decltype(tg::sum(tg::exp(x) * y));
    // d/dx sum(exp(x) * y) = y * exp(x): the unit seed folds away
    STATIC_REQUIRE(std::is_same_v<tg::grad_t<L, decltype(x)>, decltype(y * tg::exp(x))>);
    using Q = decltype(tg::sum(tg::square(x)));
    STATIC_REQUIRE(std::is_same_v<tg::grad_t<Q, decltype(x)>, decltype(x * tg::lit<2>)>);
    // gradients are expressions: grad of grad
    using H = tg::grad_t<decltype(tg::sum(tg::grad_t<decltype(tg::sum(tg::exp(x) * tg::exp(x))), decltype(x)>{})),
                         decltype(x)>;
    STATIC_REQUIRE(std::is_same_v<typename H::shape_type, tg::shape<tg::dyn>>);
    STATIC_REQUIRE(std::is_same_v<typename H::value_type, float>);
    // a leaf the loss does not reach gets zeros of its own shape and dtype
    using Z = tg::grad_t<L, decltype(W)>;
    STATIC_REQUIRE(std::is_same_v<typename Z::shape_type, tg::shape<4, 3>>);
    // broadcast operands get their gradient summed back to their own shape
    using B = tg::grad_t<decltype(tg::sum(W * b)), decltype(b)>;
    STATIC_REQUIRE(std::is_same_v<typename B::shape_type, tg::shape<3>>);
}

TEST_CASE("constant factors of a gradient merge where the product is exact", "[graph][autodiff]") {
    // d/dx sum(-0.5 * square(z)), z = (x - 0.3) * 0.75: -0.5 * (z * 2) * 0.75 is z * -0.75, one
    // multiply (-0.5 and 2 are powers of two, so no rounding differs)
    constexpr auto z = (x - tg::lit<0.3>) * tg::lit<0.75>;
    using P = decltype(tg::sum(tg::lit<-0.5> * tg::square(z)));
    STATIC_REQUIRE(std::is_same_v<tg::grad_t<P, decltype(x)>, decltype(z * tg::lit<-0.75>)>);
    // the seed times constants stays a broadcast constant: -(x * 3) and x / 4
    using N = node_t<tg::grad_t<decltype(tg::sum(-(x * tg::lit<3>))), decltype(x)>>;
    STATIC_REQUIRE(tg::detail::constant_expand<N>::c == -3.0);
    using D = node_t<tg::grad_t<decltype(tg::sum(x / tg::lit<4>)), decltype(x)>>;
    STATIC_REQUIRE(tg::detail::constant_expand<D>::c == 0.25);
    // neither factor a power of two: 0.3 * 0.7 is not merged (it would round once, not twice)
    using M = node_t<tg::grad_t<decltype(tg::sum(tg::lit<0.3> * (x * tg::lit<0.7>))), decltype(x)>>;
    STATIC_REQUIRE_FALSE(tg::detail::constant_expand<M>::value);
    STATIC_REQUIRE(tg::detail::scaled<M>::value);
    STATIC_REQUIRE(tg::detail::scaled<M>::c == 0.7);
    // nor is a division by 3 made a product by 1/3
    using T3 = node_t<tg::grad_t<decltype(tg::sum(x / tg::lit<3>)), decltype(x)>>;
    STATIC_REQUIRE_FALSE(tg::detail::constant_expand<T3>::value);
    // the rule itself: powers of two, a product inside float's normal range
    STATIC_REQUIRE(tg::detail::power_of_two(-0.5));
    STATIC_REQUIRE_FALSE(tg::detail::power_of_two(0.75));
    STATIC_REQUIRE_FALSE(tg::detail::power_of_two(0.0));
    STATIC_REQUIRE(tg::detail::exact_product(0.75, -2.0));
    STATIC_REQUIRE_FALSE(tg::detail::exact_product(0.3, 0.7));
    STATIC_REQUIRE_FALSE(tg::detail::exact_product(0x1p-100, 0x1p-40));
    STATIC_REQUIRE_FALSE(tg::detail::exact_product(0x1p100, 0x1p40));
}

template <class T>
struct is_stand_in : std::false_type {};
template <std::size_t K, class T, class S, bool R, bool C, tg::op_kind Kind>
struct is_stand_in<tg::detail::stand_in<K, T, S, R, C, Kind>> : std::true_type {};
template <class... Ns>
constexpr bool has_stand_in(tg::detail::type_list<Ns...>) {
    return (is_stand_in<Ns>::value || ...);
}

TEST_CASE("VJP rules traced on stand-ins keep the simplifications of the graph's own types", "[graph][autodiff]") {
    // equal operands are one stand-in: d/dx sum(x * x) = x + x
    STATIC_REQUIRE(std::is_same_v<tg::grad_t<decltype(tg::sum(x * x)), decltype(x)>, decltype(x + x)>);
    // a negated adjoint negated again is the adjoint: the seed reaches x through y - (y - x) unchanged
    using N = node_t<tg::grad_t<decltype(tg::sum(y - (y - x))), decltype(x)>>;
    STATIC_REQUIRE_FALSE(tg::detail::is_neg_v<N>);
    STATIC_REQUIRE(tg::detail::constant_expand<N>::value);
    // contributions that are constants add up to a constant, never cast (a weak scalar has no dtype)
    STATIC_REQUIRE(std::is_same_v<typename tg::grad_t<decltype(tg::sum(x) + tg::sum(x)), decltype(x)>::value_type, float>);
    STATIC_REQUIRE(std::is_same_v<typename tg::grad_t<decltype(tg::min(x) + tg::min(x)), decltype(x)>::shape_type,
                                  tg::shape<tg::dyn>>);
    // the stand-ins never reach the gradient graph
    using G = node_t<tg::grad_t<decltype(tg::sum(tg::exp(x) * tg::sin(y) - tg::square(x))), decltype(x)>>;
    STATIC_REQUIRE(tg::detail::topo<G>::size > 3);
    STATIC_REQUIRE_FALSE(has_stand_in(tg::detail::topo_t<G>{}));
}

TEST_CASE("the plan fuses value and gradient of elementwise math into one loop", "[graph][plan]") {
    auto loss = tg::sum(tg::exp(x) * y);
    using G = tg::grad_t<decltype(loss), decltype(x)>;
    using nodes = tg::detail::topo<node_t<decltype(loss)>, node_t<G>>;
    using PP = tg::detail::plan_provider<nodes, tg::detail::type_list<node_t<G>>,
                                         tg::detail::type_list<node_t<decltype(loss)>>,
                                         tg::detail::type_list<>, float>;
    STATIC_REQUIRE(PP::plan.loop_count == 1);
    // log_sum_exp needs its max, then its sum, then the gradient: three passes
    using LSE = decltype(tg::log_sum_exp(x));
    using GL = tg::grad_t<LSE, decltype(x)>;
    using nodes2 = tg::detail::topo<node_t<LSE>, node_t<GL>>;
    using PP2 = tg::detail::plan_provider<nodes2, tg::detail::type_list<node_t<GL>>,
                                          tg::detail::type_list<>, tg::detail::type_list<>, float>;
    STATIC_REQUIRE(PP2::plan.loop_count == 3);
}

namespace {
// Whether the plan PP saves node N (writes it for later loops) and which loops read it.
template <class PP, class N>
constexpr bool saved_in = PP::plan.saved[PP::program::template id_of<N>::value];
template <class PP, class N>
constexpr std::size_t loops_reading() {
    constexpr std::size_t id = PP::program::template id_of<N>::value;
    std::size_t r = 0;
    for (std::size_t l = 0; l < PP::plan.loop_count; ++l)
        for (std::size_t k = PP::plan.loops[l].in_begin; k < PP::plan.loops[l].in_end; ++k)
            r += PP::plan.members[k] == id;
    return r;
}
template <class Loss, class Wrt>
using joint_plan = typename decltype(tg::compile(Loss{}, tg::wrt(Wrt{})))::template plans<>::joint;
}  // namespace

TEST_CASE("the planner saves a costly value a later stage needs, and recomputes a cheap one", "[graph][plan]") {
    // log_sum_exp: exp(x - max) is summed in stage 1 and needed by the gradient in stage 2
    using LSE = decltype(tg::log_sum_exp(x));
    using PL = joint_plan<LSE, decltype(x)>;
    constexpr auto xe = tg::detail::fp32_on_cuda_entry(x);  // log_sum_exp's own graph
    using E = node_t<decltype(tg::exp(xe - tg::detach(tg::detail::finite_or_zero(tg::max(tg::detail::below_inf(xe))))))>;
    STATIC_REQUIRE(saved_in<PL, E>);
    STATIC_REQUIRE(loops_reading<PL, E>() == 1);
    STATIC_REQUIRE(PL::plan.loop_count == 4);  // the same loops as before: the sum's loop writes it
    // the forward plan alone has no later use of it
    using FL = typename decltype(tg::compile(LSE{}, tg::wrt(x)))::template plans<>::forward;
    STATIC_REQUIRE_FALSE(saved_in<FL, E>);

    // (x * y + x) is cheap (two arithmetic ops): recomputed by the gradient's loop
    using C = decltype(x * y + x);
    using PC = joint_plan<decltype(tg::sum(C{} * tg::sum(C{}))), decltype(x)>;
    STATIC_REQUIRE_FALSE(saved_in<PC, node_t<C>>);
    STATIC_REQUIRE(loops_reading<PC, node_t<C>>() == 0);

    // tanh feeds a value of stage 1 (times its own sum): saved by stage 0's loop
    using T = decltype(tg::tanh(x * y));
    using PT = joint_plan<decltype(tg::sum(T{} * tg::sum(T{}))), decltype(x)>;
    STATIC_REQUIRE(saved_in<PT, node_t<T>>);
    STATIC_REQUIRE(PT::plan.loop_count == 2);

    // saved only where a loop of its shape runs in its stage: exp(b) [3] is computed inside a
    // [dyn, 3] loop only, so it is recomputed there (a loop of its own would cost a pass)
    constexpr auto m = tg::param<"m", float, tg::shape<tg::dyn, 3>>;
    using B = decltype(tg::exp(b));
    using PB = joint_plan<decltype(tg::sum(m * B{} * tg::sum(m * B{}))), decltype(m)>;
    STATIC_REQUIRE_FALSE(saved_in<PB, node_t<B>>);
}

TEST_CASE("autocast markers are aliases: a step lowers the user's graph, with no copy built without them",
          "[graph][autocast]") {
    constexpr auto A = tg::param<"A", double, tg::shape<3, 4>>;
    constexpr auto B = tg::input<"B", double, tg::shape<4, 3>>;
    // mse_loss marks both operands as fp32 autocast entries; transpose(A) is a strided view under its marker
    constexpr auto loss = tg::mse_loss(tg::transpose(A), B);
    using L = node_t<decltype(loss)>;
    const auto step = tg::compile(loss, tg::wrt(A));
    // the step keeps the user's own graph type (no marker-free copy of the graph above the markers)...
    STATIC_REQUIRE(std::is_same_v<typename decltype(step)::loss_node, L>);
    // ...and the graph algorithms see through the markers: the nodes of the graph written without them
    using plain = decltype(tg::mean(tg::square(tg::transpose(A) - B)));
    STATIC_REQUIRE(unique_nodes<decltype(loss)> == unique_nodes<plain>);
    STATIC_REQUIRE(tg::detail::marked_topo<L>::size == unique_nodes<plain> + 2);
    STATIC_REQUIRE(tg::detail::topo<L>::id_of<node_t<decltype(tg::transpose(A))>>::value !=
                   tg::detail::no_parent);

    // value and gradient through the strided view under a marker: d/dA = 2 (A^T - B)^T / 12
    std::vector<double> a(12), bv(12), g(12, -1.0);
    for (std::size_t i = 0; i < 12; ++i) a[i] = 0.25 * double(i) - 1.0, bv[i] = std::cos(double(i));
    const double v = step.value_and_grad(tg::bind(A, a), tg::bind(B, bv), tg::grad_into(A, g));
    double expect = 0;
    for (std::size_t r = 0; r < 4; ++r)
        for (std::size_t c = 0; c < 3; ++c) {
            const double d = a[c * 4 + r] - bv[r * 3 + c];  // (A^T - B)[r][c]
            expect += d * d;
            CHECK_THAT(g[c * 4 + r], Catch::Matchers::WithinRel(2.0 * d / 12.0, 1e-14));
        }
    CHECK_THAT(v, Catch::Matchers::WithinRel(expect / 12.0, 1e-14));
}

namespace {
// A chain of products by the input y, built by folds of 100 (clang stops a fold at 256 operands),
// so that building it recurses no deeper than one op.
template <std::size_t I>
struct chain_step {};
template <tg::expression E, std::size_t I>
constexpr auto operator|(E e, chain_step<I>) {
    return e * y;
}
template <tg::expression E, std::size_t... Is>
constexpr auto mul_chain(E e, std::index_sequence<Is...>) {
    return (e | ... | chain_step<Is>{});
}
template <tg::expression E>
constexpr auto mul_chain_100(E e) {
    return mul_chain(e, std::make_index_sequence<100>{});
}
}  // namespace

TEST_CASE("graphs deeper than the compilers' template depth", "[graph][depth]") {
    // 1200 nested nodes: a node's descriptor reads its operands' descriptors, so one first needed
    // at the root would instantiate the chain below it recursively (g++ stops at 900 levels,
    // clang at 1024); each is instantiated where its node is made instead (graph/node.hpp), and
    // each adjoint where the reverse pass forms it (autodiff/reverse.hpp).
    using deep = decltype(mul_chain_100(mul_chain_100(mul_chain_100(mul_chain_100(mul_chain_100(mul_chain_100(
        mul_chain_100(mul_chain_100(mul_chain_100(mul_chain_100(mul_chain_100(mul_chain_100(x)))))))))))));
    STATIC_REQUIRE(unique_nodes<deep> == 1202);  // x, y and 1200 products
    // d/dx sum(x y^N) = y^N as N - 1 nested products (the unit seed times y is y): y and N - 1
    // products, a graph as deep as the forward one
    using g3 = decltype(tg::grad(tg::sum(x * y * y * y), x));
    STATIC_REQUIRE(unique_nodes<g3> == 3);
    using g = decltype(tg::grad(tg::sum(deep{}), x));
    STATIC_REQUIRE(unique_nodes<g> == 1200);
}

namespace {
// The number of distinct structural hashes among a graph's nodes (graph/node.hpp's node_desc).
template <class Topo>
constexpr std::size_t distinct_hashes() {
    std::array<std::uint64_t, Topo::size> h{};
    for (std::size_t i = 0; i < Topo::size; ++i) h[i] = Topo::table.order[i]->hash;
    std::sort(h.begin(), h.end());
    return static_cast<std::size_t>(std::unique(h.begin(), h.end()) - h.begin());
}
template <class N>
constexpr std::uint64_t hash_of = N::desc.hash;
template <class PP>
struct graph_of_plan;
template <class Nodes, class Stores, class Required, class Given, class T>
struct graph_of_plan<tg::detail::plan_provider<Nodes, Stores, Required, Given, T>> {
    using type = Nodes;
};
// Eight ops of benchmarks/compile_time's chain (gen.py), each on the last.
template <tg::expression E>
constexpr auto chain_block(E v) {
    return tg::square(tg::cos(tg::sigmoid(tg::tanh(tg::exp(tg::tanh(tg::sin(v))))))) * tg::lit<0.75>;
}
}  // namespace

TEST_CASE("distinct nodes have distinct hashes, so the graph searches probe once", "[graph][hash]") {
    // The searches' hash tables key nodes by this hash; with equal hashes every look-up probes
    // past all of them (a 2000-op chain's backward spent g++'s whole constant-evaluation budget
    // so). (Equal types share one descriptor, so their hashes are equal by construction.)
    STATIC_REQUIRE(hash_of<node_t<decltype(tg::sin(x))>> != hash_of<node_t<decltype(tg::cos(x))>>);
    STATIC_REQUIRE(hash_of<node_t<decltype(x * tg::exp(x))>> != hash_of<node_t<decltype(tg::exp(x) * x)>>);
    STATIC_REQUIRE(hash_of<node_t<decltype(x * x)>> != hash_of<node_t<decltype(tg::exp(x) * tg::exp(x))>>);
    STATIC_REQUIRE(hash_of<node_t<decltype(x - y)>> != hash_of<node_t<decltype(y - x)>>);
    // value_and_grad's joint graph (forward, backward by reference, gradients) of 24 chained ops
    auto loss = tg::sum(chain_block(chain_block(chain_block(x))));
    using S = decltype(tg::compile(loss, tg::wrt(x)));
    using joint = typename graph_of_plan<typename S::template plans<>::joint>::type;
    STATIC_REQUIRE(joint::size > 60);
    STATIC_REQUIRE(distinct_hashes<joint>() == joint::size);
}

namespace {
// Whether a backward node's operand is a forward node spelled as its graph type (a leaf or a
// constant is small; a reference names a node by id).
template <class Forward, class C>
constexpr bool spells_forward_node() {
    if constexpr (tg::detail::is_node_ref_v<C> || tg::is_leaf_v<C> || tg::is_constant_v<C>) return false;
    else return Forward::template id_of<C>::value != tg::detail::no_parent;
}
template <class Forward, class... Cs>
constexpr std::size_t operands_spelling_forward(tg::detail::type_list<Cs...>) {
    return (std::size_t{0} + ... + spells_forward_node<Forward, Cs>());
}
template <class... Cs>
constexpr std::size_t reference_operands(tg::detail::type_list<Cs...>) {
    return (std::size_t{0} + ... + std::size_t(tg::detail::is_node_ref_v<Cs>));
}
template <class N>
struct operands_of {
    using type = tg::detail::type_list<>;  // a constant
};
template <class Op, class... Cs>
struct operands_of<tg::node<Op, Cs...>> {
    using type = tg::detail::type_list<Cs...>;
};
template <class N>
using children_of = typename operands_of<N>::type;
template <class Forward, class... Ns>
constexpr std::array<std::size_t, 2> backward_operands(tg::detail::type_list<Ns...>) {
    return {(std::size_t{0} + ... + operands_spelling_forward<Forward>(children_of<Ns>{})),
            (std::size_t{0} + ... + reference_operands(children_of<Ns>{}))};
}
}  // namespace

TEST_CASE("the backward graph names forward values and adjoints by reference", "[graph][autodiff]") {
    // A backward node reads forward values and other adjoints through node_refs, so its type never
    // spells the forward graph (nor the backward chain below it): the names g++ builds for the
    // backward stay short however deep the graph is.
    auto loss = tg::sum(tg::sin(tg::tanh(tg::exp(x) * y)) * tg::cos(x));
    using L = node_t<decltype(loss)>;
    auto s = tg::compile(loss, tg::wrt(x));
    using S = decltype(s);
    using bwd = tg::backward_nodes_t<S>;
    STATIC_REQUIRE(bwd::size > 3);
    constexpr auto counts = backward_operands<tg::detail::topo<L>>(bwd{});
    STATIC_REQUIRE(counts[0] == 0);  // no operand spelled as a forward subgraph
    STATIC_REQUIRE(counts[1] > 3);   // forward values and adjoints read by reference
    // the nested form (tg::grad) computes the same gradient
    const std::vector<float> xs{0.3f, -1.2f, 2.0f}, ys{0.5f, 1.5f, -0.25f};
    std::vector<float> g(3), h(3);
    const float v = s.value_and_grad(tg::bind(x, xs), tg::bind(y, ys), tg::grad_into(x, g));
    auto nested = tg::compile(tg::grad(loss, x), tg::wrt());
    const auto ctx = nested.forward(tg::bind(x, xs), tg::bind(y, ys));
    REQUIRE(ctx.values().size() == 3);
    for (std::size_t i = 0; i < 3; ++i) {
        REQUIRE(ctx.values()[i] == Approx(g[i]).epsilon(1e-6));
        const double e = std::exp(double(xs[i])) * ys[i];
        const double a = std::sin(std::tanh(e)), da = std::cos(std::tanh(e)) * (1 - std::tanh(e) * std::tanh(e)) * e;
        REQUIRE(g[i] == Approx(da * std::cos(double(xs[i])) - a * std::sin(double(xs[i]))).epsilon(1e-5));
    }
    REQUIRE(v == Approx(std::sin(std::tanh(std::exp(0.3) * 0.5)) * std::cos(0.3) +
                        std::sin(std::tanh(std::exp(-1.2) * 1.5)) * std::cos(-1.2) +
                        std::sin(std::tanh(std::exp(2.0) * -0.25)) * std::cos(2.0))
                     .epsilon(1e-5));
}
