#!/usr/bin/env python3
"""Writes tests/differential/generated/graphs_<k>.cpp: random typegrad graphs for the
differential test against LibTorch (see docs/reliability.md).

A typegrad graph is a type, so random graphs must exist as source code. Each graph is written
twice: as C++ (a function template over the dtype that compiles the graph with tg::compile and
runs value_and_grad, or forward + backward) and as a line program that the LibTorch side
interprets at run time. The template is registered (instantiated) for one dtype: double for even
generator indices, float for odd ones (CI time: each instantiation is a whole step). The output
is deterministic: a fixed seed, stdlib only. Rerun after changing this script and commit the
result:

    python3 tests/differential/generate.py

Graphs: rank 0..3, static and dynamic extents, leaves with static-1 (broadcast) axes or fewer
axes, every supported op, shared subexpressions (operands are drawn from all earlier nodes),
reductions feeding further math. Interval bounds on every node keep the math in its domain
(log/sqrt/pow of positive values, no division near 0, exp of bounded values) so that the
reference is finite and well conditioned.

Graphs FIRST_CONV.. are [N, C, L] graphs that also draw issue 15's model ops (CONV_OPS, four a
graph, in turn): conv1d, conv2d (stride 1 and 2), max/avg pooling, batch_norm, attention,
embedding, index_select, gather and dropout, with their weights as params and their ids as
std::int64_t inputs (leaf_spec::ids). Their program lines name their node operands by position
(Graph.add's refs), since they also hold integer parameters.

Graphs FIRST_CONV2.. draw, in their place, the rest of those ops' forms (CONV_OPS2, three a
graph): conv1d with dilation, grouped (depthwise) and dilated conv2d, adaptive average pooling,
argmax/argmin feeding gather, narrow with run-time start and length, and attention with an
additive float mask (a param: its gradient is compared), a custom scale, or the composite
(tg::attention_math).
"""
import math
import pathlib
import random

SEED = 20250611
GRAPHS = 152
FIRST_NEW = 64      # graphs from here on also draw the activations and special functions
FIRST_MODEL = 88    # graphs from here on also draw layer_norm, rms_norm, concat and stack
FIRST_PROD = 104    # graphs from here on also draw prod (as a reduction and in the loss)
FIRST_CONV = 116    # graphs from here on are [N, C, L] graphs that also draw CONV_OPS (try_conv)
FIRST_CONV2 = 140   # graphs from here on draw CONV_OPS2 instead
# ... and are registered as ids 2200.. (FIRST_MODEL + k -> MODEL_ID + k). Special values run over
# them too (docs/reliability.md, findings 19 to 21).
MODEL_ID = 2200
UNITS = 4           # generated translation units (compile time: about 16 graphs each)
MAX_DYN = 17        # largest dynamic extent the harness draws (sum bounds use it)
LEAF_NAMES = "abcd"
CONSTANTS = [0.5, 2.0, 1.5, -0.75, 3.0, 0.25, -2.0]

UNARY = ["neg", "exp", "log", "sqrt", "square", "sin", "cos", "tanh", "sigmoid", "relu", "abs",
         "powc", "detach"]
# ops/activation.hpp and ops/special.hpp; drawn by graphs FIRST_NEW.. only, so that graphs
# 0..FIRST_NEW-1 stay the ones docs/reliability.md measured
ACTIVATIONS = ["erf", "log1p", "expm1", "gelu", "gelu_tanh", "silu", "softplus", "leaky_relu", "elu", "clamp"]
ACTIVATION_PARAMS = {"softplus": [1.0, 2.0, 0.5], "leaky_relu": [0.01, 0.2], "elu": [1.0, 0.5],
                     "clamp": [(-1.0, 1.0), (0.0, 2.0), (-0.5, 0.5)]}
# unary ops that keep a row non-constant (model graphs' norms read only such rows)
VARYING_UNARY = ["neg", "exp", "log", "sqrt", "log1p", "expm1", "leaky_relu", "powc"]
BINARY = ["add", "sub", "mul", "div", "pow", "maximum", "minimum"]
MASKS = ["gt", "ge", "lt", "le"]
REDUCE = ["sum", "mean", "max", "min", "lse"]
# issue 15's model ops over the graph's [N, C, L] (as [N, C, H, W] through reshape where 2-D),
# drawn by graphs FIRST_CONV.., four a graph, in turn (try_conv). "_s2": stride 2, whose result
# has other extents and is reduced, as a concat's.
CONV_OPS = ["conv1d", "conv2d", "max_pool", "batch_norm", "sdpa", "embedding", "index_select", "gather", "dropout",
            "conv2d_s2", "avg_pool", "max_pool_s2"]
CONV_OPS_PER_GRAPH = 4
# graphs FIRST_CONV2..: three a graph, each op in six of the twelve, in varying company
CONV_OPS2 = ["conv1d_dil", "conv2d_groups", "adaptive_pool", "argmax", "narrow", "sdpa_mask"]
CONV_OPS2_PER_GRAPH = 3

CPP_UNARY = {"exp": "tg::exp", "log": "tg::log", "sqrt": "tg::sqrt", "square": "tg::square",
             "sin": "tg::sin", "cos": "tg::cos", "tanh": "tg::tanh", "sigmoid": "tg::sigmoid",
             "relu": "tg::relu", "abs": "tg::abs", "detach": "tg::detach",
             "sum": "tg::sum", "mean": "tg::mean", "max": "tg::max", "min": "tg::min",
             "lse": "tg::log_sum_exp", "prod": "tg::prod", "erf": "tg::erf", "log1p": "tg::log1p", "expm1": "tg::expm1",
             "gelu": "tg::gelu", "gelu_tanh": "tg::gelu<tg::approximate::tanh>", "silu": "tg::silu"}
CPP_BINOP = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
CPP_BINFN = {"pow": "tg::pow", "maximum": "tg::max", "minimum": "tg::min",
             "gt": "tg::gt", "ge": "tg::ge", "lt": "tg::lt", "le": "tg::le"}


class Node:
    def __init__(self, op, args, shape, lo, hi, text):
        self.op, self.args, self.shape, self.lo, self.hi, self.text = op, args, shape, lo, hi, text
        self.varies = False  # surely not constant along the last axis (model graphs' norms need it)


def broadcast(a, b):
    """Right-aligned numpy broadcasting of shapes whose axes are ints or 'dK' strings."""
    r = max(len(a), len(b))
    a = [1] * (r - len(a)) + list(a)
    b = [1] * (r - len(b)) + list(b)
    return tuple(y if x == 1 else x for x, y in zip(a, b))


def numel_bound(shape):
    n = 1
    for e in shape:
        n *= MAX_DYN if isinstance(e, str) else e
    return n


def hull(*pairs):
    return min(p[0] for p in pairs), max(p[1] for p in pairs)


def interval(op, a, b=None, c=None):
    """Bounds of the result, or None when the op leaves its safe domain."""
    lo, hi = a.lo, a.hi
    if op == "neg":
        return -hi, -lo
    if op == "exp":
        return (math.exp(lo), math.exp(hi)) if hi <= 4 and lo >= -40 else None
    if op in ("log", "sqrt"):
        if lo < 0.2:
            return None
        f = math.log if op == "log" else math.sqrt
        return f(lo), f(hi)
    if op == "square":
        m = max(lo * lo, hi * hi)
        return (0.0 if lo <= 0 <= hi else min(lo * lo, hi * hi)), m
    if op in ("sin", "cos"):
        return -1.0, 1.0
    if op == "tanh":
        return math.tanh(lo), math.tanh(hi)
    if op == "sigmoid":
        return 1 / (1 + math.exp(-lo)), 1 / (1 + math.exp(-hi))
    if op == "relu":
        return max(lo, 0.0), max(hi, 0.0)
    if op == "abs":
        return (0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi))), max(abs(lo), abs(hi))
    if op == "detach":
        return lo, hi
    if op == "erf":
        return math.erf(lo), math.erf(hi)
    if op == "log1p":
        return (math.log1p(lo), math.log1p(hi)) if lo >= -0.8 else None
    if op == "expm1":
        return (math.expm1(lo), math.expm1(hi)) if hi <= 4 and lo >= -40 else None
    if op in ("gelu", "gelu_tanh", "silu"):
        f = (lambda x: x * 0.5 * (1 + math.erf(x / math.sqrt(2)))) if op != "silu" else (lambda x: x / (1 + math.exp(-x)))
        low = (-0.18 if op != "silu" else -0.28) if lo < 0 else f(lo)
        return low, (f(hi) if hi > 0 else 0.0)
    if op == "softplus":  # c: beta; threshold 20
        f = lambda x: x if x * c > 20 else math.log1p(math.exp(x * c)) / c
        return f(lo), f(hi)
    if op == "leaky_relu":
        return (lo if lo > 0 else c * lo), (hi if hi > 0 else c * hi)
    if op == "elu":
        return (lo if lo > 0 else c * math.expm1(lo)), (hi if hi > 0 else c * math.expm1(hi))
    if op == "clamp":
        return min(max(lo, c[0]), c[1]), min(max(hi, c[0]), c[1])
    if op == "powc":
        if lo < 0.2 or hi > 20:
            return None
        ends = [lo ** c, hi ** c]
        return min(ends), max(ends)
    if op == "prod":  # None where a product of numel_bound factors could exceed 1e4
        n = numel_bound(a.shape)
        m = max(abs(lo), abs(hi))
        bound = m if m <= 1 else m ** min(n, 64)
        if m > 1 and (n > 64 or bound > 1e4):
            return None
        if lo < 0:
            return -bound, bound
        return (lo if lo >= 1 else 0.0), (hi if hi <= 1 else bound)
    if op in ("sum", "mean", "max", "min", "lse"):
        n = numel_bound(a.shape)
        if op == "sum":
            return min(lo, n * lo), max(hi, n * hi)
        if op == "lse":
            return lo, hi + math.log(n)
        return lo, hi
    blo, bhi = b.lo, b.hi
    if op == "add":
        return lo + blo, hi + bhi
    if op == "sub":
        return lo - bhi, hi - blo
    if op == "mul":
        p = [lo * blo, lo * bhi, hi * blo, hi * bhi]
        return min(p), max(p)
    if op == "div":
        if -0.25 < blo <= 0.25 or -0.25 <= bhi < 0.25 or (blo < 0 < bhi):
            return None
        p = [lo / blo, lo / bhi, hi / blo, hi / bhi]
        return min(p), max(p)
    if op == "pow":
        if lo < 0.2 or hi > 8 or blo < -3 or bhi > 3:
            return None
        p = [x ** y for x in (lo, hi) for y in (blo, bhi)]
        return min(p), max(p)
    if op == "maximum":
        return max(lo, blo), max(hi, bhi)
    if op == "minimum":
        return min(lo, blo), min(hi, bhi)
    if op in MASKS:
        return 0.0, 1.0
    if op == "where":  # a: condition, b and c: values
        return hull((b.lo, b.hi), (c.lo, c.hi))
    raise ValueError(op)


def cpp_num(v):
    return repr(float(v))


def activation_call(op, x_text, xi, c):
    """The typegrad call and the program line of activation `op` on node xi (text x_text), with
    its constants c (ACTIVATION_PARAMS); generate_autocast.py draws the same calls."""
    if op in ("softplus", "leaky_relu", "elu"):
        return "tg::%s<%s>(%s)" % (op, cpp_num(c), x_text), "%s %d %s" % (op, xi, repr(c))
    if op == "clamp":
        return ("tg::clamp(%s, tg::lit<%s>, tg::lit<%s>)" % (x_text, cpp_num(c[0]), cpp_num(c[1])),
                "clamp %d %s %s" % (xi, repr(c[0]), repr(c[1])))
    return "%s(%s)" % (CPP_UNARY[op], x_text), "%s %d" % (op, xi)


def log1p_operand(nodes, a, rng):
    """log1p's operand: a, or another node in its domain (lo >= -0.8) if a is not and there is one."""
    if a.lo >= -0.8:
        return a
    ok = [n for n in nodes if n.lo >= -0.8]
    return rng.choice(ok) if ok else a


class Graph:
    def __init__(self, gid, rng):
        self.gid = gid
        self.rng = rng
        self.nodes = []
        self.lines = []      # C++ statements, T is the dtype
        self.program = []    # the interpreter's lines
        self.leaves = []     # (name, is_param, shape, lo, hi)
        self.ids = set()     # leaves of std::int64_t ids (inputs; integers drawn in [lo, hi])
        self.ref_pos = []    # per program line: the token positions that are node numbers (None: every integer)
        self.activations_drawn = 0
        self.model_nodes = []  # norms and reduced concats/stacks (graphs FIRST_MODEL..)
        self.make()

    def add(self, op, args, shape, lo, hi, text, program_line, refs=None):
        n = Node(op, args, shape, lo, hi, text)
        self.nodes.append(n)
        self.program.append(program_line)
        self.ref_pos.append(refs)
        return len(self.nodes) - 1

    def make_leaves(self):
        rng = self.rng
        rank = rng.choice([0, 1, 1, 2, 2, 2, 3, 3])
        if self.gid >= FIRST_MODEL:  # the norms and concat want an axis
            rank = max(rank, 1)
        full, dyn = [], 0
        for _ in range(rank):
            if rng.random() < 0.6:
                full.append("d%d" % dyn)
                dyn += 1
            else:
                full.append(rng.choice([2, 3, 4, 5]))
        if self.gid >= FIRST_CONV:  # [N, C, L], N dynamic half the time; L = H W for the 2-D ops
            n = "d0" if rng.random() < 0.5 else 2
            self.hw = rng.choice([(2, 3), (3, 3), (3, 4), (4, 4), (2, 5), (3, 2)])
            full, dyn = [n, rng.choice([2, 3, 4]), self.hw[0] * self.hw[1]], int(n == "d0")
        if self.gid >= FIRST_MODEL and (isinstance(full[-1], str) or full[-1] < 3):
            # the norms' last axis: static and at least 3 (over 1 or 2 elements their gradients
            # are eps-sized differences of O(1) terms, hopelessly ill-conditioned in float)
            if isinstance(full[-1], str):
                dyn -= 1
            full[-1] = rng.choice([3, 4, 5])
        self.full, self.vars = full, dyn
        count = rng.choice([1, 2, 2, 3, 3, 4])
        for i in range(count):
            r = len(full) if i == 0 or rng.random() < 0.6 else rng.randint(0, len(full))
            shape = []
            for e in full[len(full) - r:]:
                shape.append(1 if (i > 0 and rng.random() < 0.3) else e)
            param = i == 0 or rng.random() < 0.6
            lo, hi = (0.25, 2.0) if rng.random() < 0.35 else (-2.0, 2.0)
            name = LEAF_NAMES[i]
            self.leaves.append((name, param, tuple(shape), lo, hi))
            ext = ", ".join("tg::dyn" if isinstance(e, str) else str(e) for e in shape)
            kind = "param" if param else "input"
            self.lines.append('constexpr auto %s = tg::%s<"%s", T, tg::shape<%s>>;' % (name, kind, name, ext))
            self.add("leaf", [i], tuple(shape), lo, hi, name, "leaf %d" % i)
            self.nodes[-1].varies = len(shape) > 0 and shape[-1] == full[-1] and shape[-1] != 1
        if self.gid >= FIRST_MODEL:
            # layer_norm's weight and bias and rms_norm's weight: params of the last extent
            last = full[-1]
            ext = "tg::dyn" if isinstance(last, str) else str(last)
            for name, lo, hi in (("g", 0.5, 1.5), ("h", -1.0, 1.0)):
                i = len(self.leaves)
                self.leaves.append((name, True, (last,), lo, hi))
                self.lines.append('constexpr auto %s = tg::param<"%s", T, tg::shape<%s>>;' % (name, name, ext))
                self.add("leaf", [i], (last,), lo, hi, name, "leaf %d" % i)
                self.nodes[-1].varies = True
            self.gain, self.shift = len(self.nodes) - 2, len(self.nodes) - 1
        if self.gid >= FIRST_CONV:
            self.make_conv_leaves()

    def make_conv_leaves(self):
        """The leaves of the graph's CONV_OPS: weights and biases (params), ids (std::int64_t inputs)."""
        rng = self.rng
        k = self.gid - FIRST_CONV
        n, c, l = self.full
        self.conv_leaf = {}
        wanted = []
        if self.gid >= FIRST_CONV2:
            self.make_conv2_leaves(wanted)
        else:
            self.conv_ops = [CONV_OPS[(CONV_OPS_PER_GRAPH * k + j) % len(CONV_OPS)] for j in range(CONV_OPS_PER_GRAPH)]
            self.k1 = rng.choice([1, 3, 5])  # conv1d's kernel (padding (k1 - 1) / 2 keeps L)
        for op in self.conv_ops:
            if op == "conv1d":
                wanted += [("u", True, (c, c, self.k1), -0.5, 0.5), ("s", True, (c,), -0.5, 0.5)]
            elif op.startswith("conv2d"):
                wanted += [("v", True, (c, c, 9), -0.5, 0.5)]  # 3 x 3, reshaped
            elif op == "batch_norm":
                wanted += [("p", True, (c,), 0.5, 1.5), ("q", True, (c,), -1.0, 1.0)]
            elif op == "embedding":  # a table of the graph's [C, L] and ids of [N, C]: [N, C, L]
                wanted += [("t", True, (c, l), -2.0, 2.0), ("k", False, (n, c), 0, c - 1)]
            elif op == "index_select":
                wanted += [("i", False, (c,), 0, c - 1)]
            elif op == "gather":
                wanted += [("j", False, (n, c, l), 0, l - 1)]
            elif op == "dropout":
                wanted += [("r", False, (2,), 0, 1000000)]  # {seed, offset}
        for name, param, shape, lo, hi in wanted:
            if name in self.conv_leaf:
                continue
            i = len(self.leaves)
            ids = name in ("k", "i", "j", "r", "o", "n")
            self.leaves.append((name, param, shape, lo, hi))
            ext = ", ".join("tg::dyn" if isinstance(e, str) else str(e) for e in shape)
            if ids:
                self.ids.add(i)
                self.lines.append('constexpr auto %s = tg::input<"%s", std::int64_t, tg::shape<%s>>;' % (name, name, ext))
            else:
                self.lines.append('constexpr auto %s = tg::%s<"%s", T, tg::shape<%s>>;' % (name, "param" if param else "input", name, ext))
            self.add("leaf", [i], shape, lo, hi, name, "leaf %d" % i)
            self.conv_leaf[name] = len(self.nodes) - 1
            # weights and ids are not of the graph's extents: operands of their op only
            self.nodes[-1].odd = name != "t"
            self.nodes[-1].varies = name == "t"

    def make_conv2_leaves(self, wanted):
        """Graphs FIRST_CONV2..: the ops of CONV_OPS2 this graph draws, their parameters, and the
        leaves they want (appended to wanted, as make_conv_leaves's)."""
        rng = self.rng
        k = self.gid - FIRST_CONV2
        start = CONV_OPS2_PER_GRAPH * k + k // 2  # six graphs cover each op three times
        self.conv_ops = [CONV_OPS2[(start + j) % len(CONV_OPS2)] for j in range(CONV_OPS2_PER_GRAPH)]
        self.k1 = rng.choice([3, 5])  # dilation 2 and padding k1 - 1 keep L
        n, c, l = self.full
        self.groups = rng.choice([g for g in (2, 3, 4) if c % g == 0])  # depthwise or two groups
        self.dilation = rng.choice([1, 2])  # conv2d's, with padding of the same value
        self.narrow_axis = rng.choice([1, 2])
        e = c if self.narrow_axis == 1 else l
        for op in self.conv_ops:
            if op == "conv1d_dil":
                wanted += [("u", True, (c, c, self.k1), -0.5, 0.5), ("s", True, (c,), -0.5, 0.5)]
            elif op == "conv2d_groups":
                wanted += [("v", True, (c, c // self.groups, 9), -0.5, 0.5)]  # 3 x 3, reshaped
            elif op == "narrow":  # start in [0, e / 2], length in [1, e - e / 2]: inside the axis
                wanted += [("o", False, (), 0, e // 2), ("n", False, (), 1, e - e // 2)]
            elif op == "sdpa_mask":  # [T, T], T = C
                wanted += [("m", True, (c, c), -2.0, 2.0)]

    def pick(self):
        # recent nodes more often (depth), any earlier node sometimes (sharing)
        n = len(self.nodes)
        while True:
            k = self.rng.randrange(max(0, n - 3), n) if self.rng.random() < 0.6 else self.rng.randrange(n)
            # a concat's or stack's extents are not the graph's: only reduced (emitted with its reduction)
            if not getattr(self.nodes[k], "odd", False):
                return k

    def constant(self):
        v = self.rng.choice(CONSTANTS)
        return Node("const", [], (), v, v, "tg::lit<%s>" % cpp_num(v))

    def try_op(self):
        rng = self.rng
        kinds, weights = ["unary", "binary", "mask", "where", "reduce"], [8, 8, 1, 1, 2]
        if self.gid >= FIRST_MODEL:  # ops/norm.hpp, ops/index.hpp's concat and stack
            kinds, weights = kinds + ["norm", "concat"], weights + [8, 4]
        kind = rng.choices(kinds, weights)[0]
        a = self.nodes[self.pick()]
        ai = self.nodes.index(a)
        if kind == "norm":
            return self.try_norm(a, ai)
        if kind == "concat":
            return self.try_concat(a, ai)
        if kind == "unary":
            new = self.gid >= FIRST_NEW and rng.random() < 0.6
            # activations in turn (each graph starts elsewhere), so that every one is drawn
            op = ACTIVATIONS[(self.gid + self.activations_drawn) % len(ACTIVATIONS)] if new else rng.choice(UNARY)
            c = rng.choice([0.5, 1.5, 2.5, -0.5, -1.0, 3.0]) if op == "powc" else None
            if op in ACTIVATION_PARAMS:
                c = rng.choice(ACTIVATION_PARAMS[op])
            self.activations_drawn += new
            if op == "log1p":
                a = log1p_operand(self.nodes, a, rng)
                ai = self.nodes.index(a)
            bounds = interval(op, a, c=c)
            if bounds is None:
                return False
            if op in ACTIVATIONS:
                text, line = activation_call(op, a.text, ai, c)
            elif op == "neg":
                text, line = "-%s" % a.text, "neg %d" % ai
            elif op == "powc":
                text, line = "tg::pow(%s, tg::lit<%s>)" % (a.text, cpp_num(c)), "powc %d %s" % (ai, repr(c))
            else:
                text, line = "%s(%s)" % (CPP_UNARY[op], a.text), "%s %d" % (op, ai)
            n0 = len(self.nodes)
            self.emit(op, [ai], a.shape, bounds, text, line)
            if len(self.nodes) > n0:  # strictly monotonic without saturation within the bounds
                self.nodes[-1].varies = a.varies and op in VARYING_UNARY
            return True
        if kind == "reduce":
            if a.shape == ():
                return False
            op = self.pick_reduce(a)
            bounds = interval(op, a)
            self.emit(op, [ai], (), bounds, "%s(%s)" % (CPP_UNARY[op], a.text), "%s %d" % (op, ai))
            return True
        if kind == "where":
            x, y = self.nodes[self.pick()], self.nodes[self.pick()]
            cond = rng.choice(MASKS)
            v, w = self.nodes[self.pick()], self.nodes[self.pick()]
            shape = broadcast(broadcast(broadcast(x.shape, y.shape), v.shape), w.shape)
            bounds = hull((v.lo, v.hi), (w.lo, w.hi))
            ids = [self.nodes.index(n) for n in (x, y, v, w)]
            text = "tg::where(%s(%s, %s), %s, %s)" % (CPP_BINFN[cond], x.text, y.text, v.text, w.text)
            self.emit("where", ids, shape, bounds, text, "where_%s %d %d %d %d" % (cond, *ids))
            return True
        # binary or mask: the second operand is sometimes a constant (on either side)
        use_const = rng.random() < 0.25
        b = self.constant() if use_const else self.nodes[self.pick()]
        op = rng.choice(MASKS) if kind == "mask" else rng.choice(BINARY)
        swap = use_const and rng.random() < 0.4 and op not in ("pow",)
        left, right = (b, a) if swap else (a, b)
        bounds = interval(op, left, right)
        if bounds is None:
            return False
        def ref(n):
            return "c%s" % repr(n.lo) if n.op == "const" else str(self.nodes.index(n))
        shape = broadcast(left.shape, right.shape)
        if op in CPP_BINOP:
            text = "(%s %s %s)" % (left.text, CPP_BINOP[op], right.text)
        else:
            text = "%s(%s, %s)" % (CPP_BINFN[op], left.text, right.text)
        if kind == "mask":  # a 0/1 mask as a factor: no gradient through it
            other = self.nodes[self.pick()]
            shape = broadcast(shape, other.shape)
            text = "(%s * %s)" % (text, other.text)
            oi = self.nodes.index(other)
            self.emit("mask", [], shape, hull((0.0, 0.0), (min(0.0, other.lo), max(0.0, other.hi))), text,
                      "mask_%s %s %s %d" % (op, ref(left), ref(right), oi))
            return True
        n0 = len(self.nodes)
        self.emit(op, [], shape, bounds, text, "%s %s %s" % (op, ref(left), ref(right)))
        if len(self.nodes) > n0 and op in ("add", "sub"):  # one varying operand plus a constant row
            lv, rv = getattr(left, "varies", False), getattr(right, "varies", False)
            self.nodes[-1].varies = lv != rv and shape == (lv and left or right).shape
        return True

    def try_norm(self, a, ai):
        """layer_norm or rms_norm of node a (index ai), then a sine of it (a model node); also
        drawn by generate_autocast.py. Over the last axis, which must be the graph's last extent
        (the weights') and must vary along it: rms_norm and layer_norm are scale invariant, so over
        a constant row (a broadcast, a where that picked one operand) the gradient is an eps-sized
        difference of O(1) terms (graph 2201 in float)."""
        rng = self.rng
        if a.shape == () or a.shape[-1] != self.full[-1] or not a.varies:
            return False
        op = rng.choice(["layer_norm", "rms_norm"])
        last = a.shape[-1]
        n = MAX_DYN if isinstance(last, str) else last
        if op == "layer_norm":
            bound = 1.5 * math.sqrt(n) + 1.0
            text = "tg::layer_norm(%s, g, h)" % a.text
            line = "layer_norm %d %d %d" % (ai, self.gain, self.shift)
        else:
            bound = 1.5 * math.sqrt(n)
            text = "tg::rms_norm<1, 1e-06>(%s, g)" % a.text
            line = "rms_norm %d %d" % (ai, self.gain)
        n0 = len(self.nodes)
        self.emit(op, [ai], a.shape, (-bound, bound), text, line)
        if len(self.nodes) == n0:
            return False
        self.nodes[-1].varies = True
        # used only through a sine: a linear function of a layer_norm that is constant along
        # its axis (a sum, a mean) has a gradient that is exactly 0 in exact arithmetic and
        # rounding noise in float
        self.nodes[-1].odd = True
        k = len(self.nodes) - 1
        self.emit("sin", [k], a.shape, (-1.0, 1.0), "tg::sin(%s)" % self.nodes[k].text, "sin %d" % k)
        self.model_nodes.append(len(self.nodes) - 1)
        return True

    def try_concat(self, a, ai, others=None):
        """concat<0> of three nodes of a's shape (index ai), or stack<1> of two; sometimes an
        activation of it; then a reduction (a model node). The other operands are drawn from
        `others` (default: every node of a's shape). Also drawn by generate_autocast.py."""
        rng = self.rng
        if a.shape == ():
            return False
        same = others or [n for n in self.nodes if n.shape == a.shape and not getattr(n, "odd", False)]
        b, c = rng.choice(same), rng.choice(same)
        bi, ci = self.nodes.index(b), self.nodes.index(c)
        before = len(self.nodes)
        bounds = hull((a.lo, a.hi), (b.lo, b.hi), (c.lo, c.hi))
        if rng.random() < 0.5:
            self.emit("concat", [ai, bi, ci], a.shape, bounds, "tg::concat<0>(%s, %s, %s)" % (a.text, b.text, c.text),
                      "cat0 %d %d %d" % (ai, bi, ci))
            grow = 3
        else:
            self.emit("stack", [ai, bi], a.shape, hull((a.lo, a.hi), (b.lo, b.hi)),
                      "tg::stack<1>(%s, %s)" % (a.text, b.text), "stack1 %d %d" % (ai, bi))
            grow = 2
        if len(self.nodes) == before:
            return False
        self.reduce_last(grow)
        return True

    def reduce_last(self, grow=1):
        """The last node has other extents than the graph's (a concat, a strided result): it is
        odd; sometimes an activation of it, then a reduction (a model node). A concat's bounds
        count grow times the elements of its operands' shape."""
        rng = self.rng
        self.nodes[-1].odd = True
        if rng.random() < 0.5:
            x = self.nodes[-1]
            op = ACTIVATIONS[(self.gid + self.activations_drawn) % len(ACTIVATIONS)]
            self.activations_drawn += 1
            cc = rng.choice(ACTIVATION_PARAMS[op]) if op in ACTIVATION_PARAMS else None
            ab = interval(op, x, c=cc)
            if ab is not None:
                xi = len(self.nodes) - 1
                text, line = activation_call(op, x.text, xi, cc)
                n0 = len(self.nodes)
                self.emit(op, [xi], x.shape, ab, text, line)
                if len(self.nodes) > n0:
                    self.nodes[-1].odd = True
        x = self.nodes[-1]
        op = rng.choice(REDUCE)
        lo, hi = interval(op, x)
        if op == "sum":
            lo, hi = min(lo, grow * lo), max(hi, grow * hi)
        elif op == "lse":
            hi += math.log(grow)
        self.emit(op, [], (), (lo, hi), "%s(%s)" % (CPP_UNARY[op], x.text), "%s %d" % (op, len(self.nodes) - 1),
                  force=True)
        self.model_nodes.append(len(self.nodes) - 1)

    def full_operands(self, varies=False, bound=1e4):
        """Nodes of the graph's [N, C, L] (not odd), varying along L if asked, within +-bound."""
        full = tuple(self.full)
        return [k for k, n in enumerate(self.nodes) if n.shape == full and not getattr(n, "odd", False)
                and (n.varies or not varies) and max(abs(n.lo), abs(n.hi)) <= bound]

    def draw_full(self, varies=False, bound=1e4):
        """One of full_operands, drawn: (its index, the node, its largest |bound|), or None."""
        cands = self.full_operands(varies=varies, bound=bound)
        if not cands:
            return None
        a = self.rng.choice(cands)
        x = self.nodes[a]
        return a, x, max(abs(x.lo), abs(x.hi))

    def as_2d(self, ki):
        """Node ki ([N, C, L]) reshaped to [N, C, H, W] (an odd node); its index."""
        n, c, _ = self.full
        h, w = self.hw
        x = self.nodes[ki]
        nt = "tg::dyn" if isinstance(n, str) else str(n)
        self.emit("reshape", [ki], (n, c, h, w), (x.lo, x.hi), "tg::reshape<tg::shape<%s, %d, %d, %d>>(%s)" % (nt, c, h, w, x.text),
                  "reshape4 %d %d %d %d %d" % (ki, -1 if isinstance(n, str) else n, c, h, w), force=True, refs=[1])
        self.nodes[-1].odd = True
        return len(self.nodes) - 1

    def as_1d(self, ki):
        """Node ki ([N, C, H, W]) reshaped back to [N, C, L]; its index."""
        n, c, l = self.full
        x = self.nodes[ki]
        nt = "tg::dyn" if isinstance(n, str) else str(n)
        self.emit("reshape", [ki], tuple(self.full), (x.lo, x.hi), "tg::reshape<tg::shape<%s, %d, %d>>(%s)" % (nt, c, l, x.text),
                  "reshape3 %d %d %d %d" % (ki, -1 if isinstance(n, str) else n, c, l), force=True, refs=[1])
        return len(self.nodes) - 1

    def try_conv(self, op):
        """One of CONV_OPS over nodes of the graph's [N, C, L]; the result reaches the loss (a
        model node). False where no operand fits."""
        if self.gid >= FIRST_CONV2:
            return self.try_conv2(op)
        rng = self.rng
        n, c, l = self.full
        leaf = self.conv_leaf
        before = len(self.nodes)
        if op == "sdpa":  # T = C, d = L; q and k bounded so that the scores are
            qk, vs = self.full_operands(bound=3.0), self.full_operands()
            if not qk or not vs:
                return False
            q, k, v = rng.choice(qk), rng.choice(qk), rng.choice(vs)
            causal = rng.random() < 0.5
            x = self.nodes[v]
            self.emit(op, [q, k, v], tuple(self.full), (min(x.lo, 0.0), max(x.hi, 0.0)),
                      "tg::scaled_dot_product_attention(%s, %s, %s%s)" % (self.nodes[q].text, self.nodes[k].text, x.text,
                                                                        ", tg::causal" if causal else ""),
                      "sdpa %d %d %d %d" % (q, k, v, causal), refs=[1, 2, 3])
        elif op == "embedding":
            tables = [k for k, x in enumerate(self.nodes) if x.shape == (c, l) and not getattr(x, "odd", False)]
            t = rng.choice(tables)
            pad = rng.choice([-1, rng.randrange(c)])
            x = self.nodes[t]
            self.emit(op, [t], tuple(self.full), (x.lo, x.hi),
                      "tg::embedding%s(k, %s)" % ("" if pad < 0 else "<%d>" % pad, x.text),
                      "embedding %d %d %d" % (leaf["k"], t, pad), refs=[1, 2])
        elif op == "dropout":
            cands = [k for k, x in enumerate(self.nodes) if x.shape != () and not getattr(x, "odd", False)]
            a = rng.choice(cands)
            x = self.nodes[a]
            pr = rng.choice([0.25, 0.5])
            self.emit(op, [a], x.shape, (min(0.0, x.lo / (1 - pr)), max(0.0, x.hi / (1 - pr))),
                      "tg::dropout<%s>(%s, r)" % (cpp_num(pr), x.text), "dropout %d %d %s" % (a, leaf["r"], repr(pr)),
                      refs=[1, 2])
        else:
            drawn = self.draw_full(varies=op == "batch_norm", bound=1e3)
            if drawn is None:
                return False
            a, x, m = drawn
            if op == "conv1d":
                p = (self.k1 - 1) // 2
                b = c * self.k1 * 0.5 * m + 0.5
                self.emit(op, [a], tuple(self.full), (-b, b), "tg::conv1d<1, %d>(%s, u, s)" % (p, x.text),
                          "conv1d %d %d %d 1 %d" % (a, leaf["u"], leaf["s"], p), refs=[1, 2, 3])
            elif op in ("conv2d", "conv2d_s2"):
                stride = 2 if op == "conv2d_s2" else 1
                x4 = self.as_2d(a)
                self.emit("reshape", [leaf["v"]], (c, c, 3, 3), (-0.5, 0.5), "tg::reshape<tg::shape<%d, %d, 3, 3>>(v)" % (c, c),
                          "reshape4 %d %d %d 3 3" % (leaf["v"], c, c), force=True, refs=[1])
                self.nodes[-1].odd = True
                w4 = len(self.nodes) - 1
                h, w = self.hw
                out = (n, c, (h - 1) // stride + 1, (w - 1) // stride + 1)
                b = c * 9 * 0.5 * m
                self.emit("conv2d", [x4, w4], out, (-b, b), "tg::conv2d<%d, 1>(%s, %s)" % (stride, self.nodes[x4].text, self.nodes[w4].text),
                          "conv2d %d %d %d 1" % (x4, w4, stride), refs=[1, 2])
                if len(self.nodes) == w4 + 1:
                    return False
                if stride == 2:
                    self.reduce_last()
                    return True
                self.as_1d(len(self.nodes) - 1)
            elif op in ("max_pool", "avg_pool", "max_pool_s2"):
                x4 = self.as_2d(a)
                h, w = self.hw
                if op == "max_pool_s2":
                    self.emit(op, [x4], (n, c, h // 2, w // 2), (x.lo, x.hi), "tg::max_pool2d<2>(%s)" % self.nodes[x4].text,
                              "max_pool2d %d 2 2 0" % x4, refs=[1])
                    self.reduce_last()
                    return True
                fn = "max_pool2d" if op == "max_pool" else "avg_pool2d"
                bounds = (x.lo, x.hi) if op == "max_pool" else (min(x.lo, 0.0), max(x.hi, 0.0))
                self.emit(op, [x4], (n, c, h, w), bounds, "tg::%s<3, 1, 1>(%s)" % (fn, self.nodes[x4].text),
                          "%s %d 3 1 1" % (fn, x4), refs=[1], force=True)
                self.nodes[-1].odd = True
                self.as_1d(len(self.nodes) - 1)
            elif op == "batch_norm":
                # as try_norm: through a sine (the normalised values of a channel sum to 0)
                count = (MAX_DYN if isinstance(n, str) else n) * l
                b = 1.5 * math.sqrt(count) + 1.0
                self.emit(op, [a], tuple(self.full), (-b, b), "tg::batch_norm(%s, p, q)" % x.text,
                          "batch_norm %d %d %d" % (a, leaf["p"], leaf["q"]), refs=[1, 2, 3])
                if len(self.nodes) == before:
                    return False
                self.nodes[-1].odd = True
                k = len(self.nodes) - 1
                self.emit("sin", [k], tuple(self.full), (-1.0, 1.0), "tg::sin(%s)" % self.nodes[k].text, "sin %d" % k)
            elif op == "index_select":
                self.emit(op, [a], tuple(self.full), (x.lo, x.hi), "tg::index_select<1>(%s, i)" % x.text,
                          "index_select %d 1 %d" % (a, leaf["i"]), refs=[1, 3])
            elif op == "gather":
                self.emit(op, [a], tuple(self.full), (x.lo, x.hi), "tg::gather<2>(%s, j)" % x.text,
                          "gather %d 2 %d" % (a, leaf["j"]), refs=[1, 3])
            else:
                raise ValueError(op)
        if len(self.nodes) == before:
            return False
        self.model_nodes.append(len(self.nodes) - 1)
        return True

    def try_conv2(self, op):
        """One of CONV_OPS2 (graphs FIRST_CONV2..), as try_conv."""
        rng = self.rng
        n, c, l = self.full
        leaf = self.conv_leaf
        before = len(self.nodes)
        if op == "sdpa_mask":  # T = C, d = L: the float mask, a custom scale, or the composite
            qk, vs = self.full_operands(bound=3.0), self.full_operands()
            if not qk or not vs:
                return False
            q, k, v = rng.choice(qk), rng.choice(qk), rng.choice(vs)
            form = rng.choice(["mask", "mask", "math"])
            scale = rng.choice([0.0, 0.0, 0.25, 0.75])  # 0: 1 / sqrt(d)
            x = self.nodes[v]
            targs = "<%s>" % cpp_num(scale) if scale else ""
            if form == "mask":
                causal, extra, refs = False, ", m", [1, 2, 3, 6]
                line_tail = " %s %d" % (repr(scale), leaf["m"])
            else:
                causal = rng.random() < 0.5
                extra, refs, line_tail = (", tg::causal" if causal else "") + ", tg::attention_math", [1, 2, 3], " " + repr(scale)
            self.emit("sdpa", [q, k, v], tuple(self.full), (min(x.lo, 0.0), max(x.hi, 0.0)),
                      "tg::scaled_dot_product_attention%s(%s, %s, %s%s)" % (targs, self.nodes[q].text, self.nodes[k].text,
                                                                          x.text, extra),
                      "sdpa %d %d %d %d%s" % (q, k, v, causal, line_tail), refs=refs)
        elif op == "argmax":  # gather<axis>(x, argmax(y, axes<axis>, keepdim)): the extreme's x
            cands = self.full_operands()
            if not cands:
                return False
            a, y = rng.choice(cands), rng.choice(cands)
            axis = rng.choice([1, 2])
            fn = rng.choice(["argmax", "argmin"])
            self.emit(fn, [y], (), (0, 0), "tg::%s(%s, tg::axes<%d>, tg::keepdim)" % (fn, self.nodes[y].text, axis),
                      "%s %d %d" % (fn, y, axis), force=True, refs=[1])
            ki = len(self.nodes) - 1
            self.nodes[ki].odd = True
            self.ids.add(ki)  # not a value: the loss does not reduce it
            x = self.nodes[a]
            shape = tuple(1 if j == axis else e for j, e in enumerate(self.full))
            self.emit("gather", [a, ki], shape, (x.lo, x.hi), "tg::gather<%d>(%s, %s)" % (axis, x.text, self.nodes[ki].text),
                      "gather %d %d %d" % (a, axis, ki), force=True, refs=[1, 3])
            self.reduce_last()
            return True
        elif op == "narrow":  # along narrow_axis, start o and length n: the result is reduced
            drawn = self.draw_full()
            if drawn is None:
                return False
            a, x, _ = drawn
            axis = self.narrow_axis
            shape = tuple("dn" if j == axis else e for j, e in enumerate(self.full))
            self.emit(op, [a], shape, (x.lo, x.hi), "tg::narrow<%d>(%s, o, n)" % (axis, x.text),
                      "narrow %d %d %d %d" % (a, axis, leaf["o"], leaf["n"]), force=True, refs=[1, 3, 4])
            self.reduce_last()
            return True
        else:
            drawn = self.draw_full(bound=1e3)
            if drawn is None:
                return False
            a, x, m = drawn
            if op == "conv1d_dil":
                p = self.k1 - 1
                b = c * self.k1 * 0.5 * m + 0.5
                self.emit("conv1d", [a], tuple(self.full), (-b, b), "tg::conv1d<1, %d, 2>(%s, u, s)" % (p, x.text),
                          "conv1d %d %d %d 1 %d 2 1" % (a, leaf["u"], leaf["s"], p), refs=[1, 2, 3])
            elif op == "conv2d_groups":
                x4 = self.as_2d(a)
                cg, g, d = c // self.groups, self.groups, self.dilation
                self.emit("reshape", [leaf["v"]], (c, cg, 3, 3), (-0.5, 0.5), "tg::reshape<tg::shape<%d, %d, 3, 3>>(v)" % (c, cg),
                          "reshape4 %d %d %d 3 3" % (leaf["v"], c, cg), force=True, refs=[1])
                self.nodes[-1].odd = True
                w4 = len(self.nodes) - 1
                b = cg * 9 * 0.5 * m
                self.emit("conv2d", [x4, w4], (n, c) + tuple(self.hw), (-b, b),
                          "tg::conv2d<1, %d, %d, %d>(%s, %s)" % (d, d, g, self.nodes[x4].text, self.nodes[w4].text),
                          "conv2d %d %d 1 %d %d %d" % (x4, w4, d, d, g), refs=[1, 2])
                if len(self.nodes) == w4 + 1:
                    return False
                self.as_1d(len(self.nodes) - 1)
            elif op == "adaptive_pool":  # to the input's extents, or to others (then reduced)
                x4 = self.as_2d(a)
                h, w = self.hw
                oh, ow = rng.choice([(h, w), (1, 1), (2, 2), (h + 1, max(1, w - 1)), (max(1, h - 1), w + 2)])
                self.emit(op, [x4], (n, c, oh, ow), (x.lo, x.hi), "tg::adaptive_avg_pool2d<%d, %d>(%s)" % (oh, ow, self.nodes[x4].text),
                          "adaptive_avg_pool2d %d %d %d" % (x4, oh, ow), refs=[1], force=True)
                if (oh, ow) != (h, w):
                    self.reduce_last()
                    return True
                self.nodes[-1].odd = True
                self.as_1d(len(self.nodes) - 1)
            else:
                raise ValueError(op)
        if len(self.nodes) == before:
            return False
        self.model_nodes.append(len(self.nodes) - 1)
        return True

    def prod_chance(self):
        """How often pick_reduce takes prod where its bounds allow: graphs FIRST_PROD.. half the time."""
        return 0.5 if self.gid >= FIRST_PROD else 0.0

    def pick_reduce(self, x):
        """A reduction of x: one of REDUCE, or prod (prod_chance)."""
        op = self.rng.choice(REDUCE)
        chance = self.prod_chance()
        if chance > 0 and (chance >= 1 or self.rng.random() < chance) and interval("prod", x) is not None:
            op = "prod"
        return op

    def emit(self, op, args, shape, bounds, text, line, force=False, refs=None):
        lo, hi = bounds
        if max(abs(lo), abs(hi)) > 1e4 and not force:
            return
        name = "e%d" % len(self.nodes)
        self.lines.append("constexpr auto %s = %s;" % (name, text))
        self.add(op, args, shape, lo, hi, name, line, refs)

    def make(self):
        self.make_leaves()
        target = self.rng.randint(3, 9)
        tries = 0
        for op in getattr(self, "conv_ops", []):  # each drawn, after a few other ops
            for _ in range(self.rng.randint(0, 2)):
                self.try_op()
            for _ in range(30):
                if self.try_conv(op):
                    break
            else:
                raise RuntimeError("graph %d: no operand for %s" % (self.gid, op))
        while len(self.nodes) - len(self.leaves) < target and tries < 200:
            tries += 1
            self.try_op()
        # a scalar loss: reduce the last node, sometimes plus a reduction of another one
        last = self.nodes[-1]
        parts = []
        for n in [last] + ([self.nodes[self.rng.randrange(len(self.nodes))]] if self.rng.random() < 0.5 else []):
            if self.nodes.index(n) in self.ids:  # not a value
                continue
            if n.shape == () and n.op != "detach":  # a detached root: see docs/reliability.md, bug 7
                parts.append(n)
                continue
            op = self.pick_reduce(n)
            self.emit(op, [], (), interval(op, n), "%s(%s)" % (CPP_UNARY[op], n.text),
                      "%s %d" % (op, self.nodes.index(n)), force=True)
            parts.append(self.nodes[-1])
        if len(parts) == 2:
            a, b = parts
            self.emit("add", [], (), interval("add", a, b), "(%s + %s)" % (a.text, b.text),
                      "add %d %d" % (self.nodes.index(a), self.nodes.index(b)), force=True)
        if self.gid >= FIRST_MODEL:  # every norm and concat/stack drawn reaches the loss (no draws: same graphs 0-87)
            for k in self.model_nodes:
                n, total = self.nodes[k], self.nodes[-1]
                if n.shape != ():
                    self.emit("mean", [], (), interval("mean", n), "tg::mean(%s)" % n.text, "mean %d" % k, force=True)
                    n = self.nodes[-1]
                self.emit("add", [], (), interval("add", total, n), "(%s + %s)" % (total.text, n.text),
                          "add %d %d" % (self.nodes.index(total), self.nodes.index(n)), force=True)
        self.loss = self.nodes[-1].text

    def prune(self):
        """Drops nodes the loss does not reach (dead C++ variables would not compile with
        -Werror) and renumbers the program."""
        refs = []
        for line, pos in zip(self.program, self.ref_pos):
            tok = line.split()
            if pos is None:
                pos = [j for j, t in enumerate(tok) if j > 0 and t.lstrip("-").isdigit()]
            refs.append([] if tok[0] == "leaf" else [int(tok[j]) for j in pos])
        keep = {len(self.nodes) - 1}
        for k in range(len(self.nodes) - 1, -1, -1):
            if k in keep:
                keep.update(refs[k])
        self.used_leaves = {k for k in keep if k < len(self.leaves)}
        keep |= set(range(len(self.leaves)))  # every leaf is bound, used or not
        new_id = {old: new for new, old in enumerate(sorted(keep))}
        program, lines = [], []
        for k in sorted(keep):
            tok = self.program[k].split()
            pos = self.ref_pos[k]
            if pos is None:
                pos = [j for j, t in enumerate(tok) if j > 0 and t.lstrip("-").isdigit()]
            if tok[0] != "leaf":
                tok = [str(new_id[int(t)]) if j in pos else t for j, t in enumerate(tok)]
            program.append(" ".join(tok))
            lines.append(self.lines[k])
        self.program, self.lines = program, lines

    def cpp(self):
        gid = self.gid if self.gid < FIRST_MODEL else MODEL_ID + self.gid - FIRST_MODEL  # the registered id
        self.prune()
        params = [l[0] for l in self.leaves if l[1]]
        # Bind what the call reads: the leaves the loss uses, and the params (a gradient of an
        # unused param is zeros of its shape). An unused input is not bound (bug 6).
        binds, fwd_binds, id_vectors = [], [], []
        for i, (name, param, shape, _, _) in enumerate(self.leaves):
            ext = ", ".join("ext[%d][%d]" % (i, a) for a in range(len(shape)))
            text = "tg::bind(%s, in[%d], {%s})" % (name, i, ext)
            if i in self.ids and i in self.used_leaves:  # std::int64_t ids: alive until backward
                id_vectors.append("    const auto %s_ids = ids_of(in[%d]);" % (name, i))
                text = "tg::bind(%s, %s_ids, {%s})" % (name, name, ext)
            if i in self.used_leaves or param:
                binds.append(text)
            if i in self.used_leaves:
                fwd_binds.append(text)
        grads = []
        k = 0
        for name, param, *_ in self.leaves:
            if param:
                grads.append("tg::grad_into(%s, grad[%d])" % (name, k))
                k += 1
        # forward + backward as well (more instantiations); backward takes a dynamic param's
        # extents from the forward pass, which only binds the leaves the loss reads
        split = gid % 3 == 0 and all(i in self.used_leaves or not p or all(not isinstance(e, str) for e in shp)
                                     for i, (_, p, shp, _, _) in enumerate(self.leaves))
        body = []
        for k, l in enumerate(self.lines):  # unused leaves are declared (the program numbers them) only
            unused = k < len(self.leaves) and k not in self.used_leaves and not self.leaves[k][1]
            body.append("    " + ("[[maybe_unused]] " if unused else "") + l)
        body.append("    constexpr auto step = tg::compile(%s, tg::wrt(%s));" % (self.loss, ", ".join(params)))
        if split:
            body.append("    if (split) {")
            body.append("        auto ctx = step.forward(%s);" % ", ".join(fwd_binds))
            body.append("        step.backward(ctx, %s);" % ", ".join(grads))
            body.append("        return ctx.value();")
            body.append("    }")
        else:
            body.append("    (void)split;")
        body = id_vectors + body
        if "ext[" not in "".join(binds):
            body.insert(0, "    (void)ext;")
        if "in[" not in "".join(binds + id_vectors):
            body.insert(0, "    (void)in;")
        body.append("    return step.value_and_grad(%s, %s);" % (", ".join(binds), ", ".join(grads)))
        fn = ["template <class T>",
              "T graph_%d(const tensors<T>& in, const extents& ext, tensors<T>& grad, bool split) {" % gid]
        fn += body + ["}"]
        text = "\n".join(self.lines + ["constexpr auto loss = %s;" % self.loss])
        leaves = []
        for i, (name, param, shape, lo, hi) in enumerate(self.leaves):
            ext = ", ".join(str(-1 - int(e[1:])) if isinstance(e, str) else str(e) for e in shape)
            leaves.append('{"%s", %s, %d, {%s}, %s, %s%s}' % (name, "true" if param else "false", len(shape), ext,
                                                               cpp_num(lo), cpp_num(hi), ", true" if i in self.ids else ""))
        # One dtype a graph (CI time: each instantiation is a whole step, 3-7 s of g++): even
        # generator indices double, odd float, so that every band of graphs is checked in both,
        # and every op but the few that pruning leaves in one or two graphs (docs/reliability.md);
        # graph_def's other pointer is null.
        f64 = "&graph_%d<double>" % gid if self.gid % 2 == 0 else "nullptr"
        f32 = "&graph_%d<float>" % gid if self.gid % 2 == 1 else "nullptr"
        reg = ("    r.push_back({%d, %d, %s,\n                %s,\n                %s,\n                {%s},\n"
               "                %s, %s});"
               % (gid, self.vars, "true" if split else "false", c_string(text), c_string("\n".join(self.program)),
                  ", ".join(leaves), f64, f32))
        return "\n".join(fn), reg


def c_string(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def main():
    out = pathlib.Path(__file__).resolve().parent / "generated"
    out.mkdir(exist_ok=True)
    graphs = [Graph(g, random.Random(SEED * 1000 + g)) for g in range(GRAPHS)]
    for u in range(UNITS):
        mine = [g for g in graphs if g.gid % UNITS == u]
        fns, regs = zip(*(g.cpp() for g in mine))
        src = ["// Generated by tests/differential/generate.py: do not edit.",
               "#include \"graph_registry.hpp\"",
               "",
               "namespace tg = typegrad;",
               "",
               "namespace typegrad_differential {",
               "namespace {",
               ""]
        src += [f + "\n" for f in fns]
        src += ["const bool registered = [] {",
                "    auto& r = registry();"]
        src += list(regs)
        src += ["    return true;", "}();", "", "}  // namespace", "}  // namespace typegrad_differential", ""]
        (out / ("graphs_%d.cpp" % u)).write_text("\n".join(src))
    print("wrote %d graphs in %d units to %s" % (GRAPHS, UNITS, out))


if __name__ == "__main__":
    main()
