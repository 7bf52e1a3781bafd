#!/usr/bin/env python3
"""Writes tests/differential/generated/autocast_<k>.cpp: random typegrad graphs evaluated under
tg::autocast<tg::cpu_bf16>, for the differential test against LibTorch's CPU autocast (bf16)
(see docs/reliability.md). Rerun after changing this script and commit the result:

    python3 tests/differential/generate_autocast.py

Graphs are built around the ops whose dtype autocast decides: matmul of matrices and vectors
(transposed operands too), linear with and without bias (lower precision), mse_loss and
binary_cross_entropy_with_logits (fp32), and the promote ops of generate.py (elementwise math,
masks, where, reductions, log_sum_exp, softmax, log_softmax) mixing their f32 and bf16 results;
graphs FIRST_ACTIVATION.. also draw the activations and special functions (erf, log1p, expm1,
gelu in both forms, silu, softplus, leaky_relu, elu, clamp: their input's dtype on the CPU).
Graphs FIRST_MODEL.. also draw generate.py's model ops (its try_norm and try_concat): layer_norm
and rms_norm over the last extent M (static, 3 to 5; weight g and bias h of one dtype, f32 or
bf16; a norm is read through a sine), concat<0> and stack<1> (reduced), each of which reaches the
loss; under CPU autocast they promote over their operands (on no PyTorch CPU list; cat and stack
on its promote list). Half the norms read a bf16 node (a matmul's result has extent M last) and
half the concats mix dtypes, where the graph allows.
Graphs FIRST_INDEX.. also draw three of INDEX_OPS each, in turn (try_index): embedding of
std::int64_t ids k [n] into a table t [k, m] (padding index half the time), index_select<1> of an
[n, k] node by ids i [m], gather<1> of an [n, k] node by ids j [n, m] (k static: the ids' range),
and dropout<p> of any node (seed and offset in a std::int64_t input r); each keeps its operand's
dtype (on no PyTorch CPU autocast list), its result has the graph's extents and reaches the loss.
Graphs FIRST_CONV.. draw three of CONV_OPS each, in turn (try_conv), over views of the graph's
2-D nodes (kk static, 2 to 5, as in the index graphs): conv1d of a [kk, m] node as [1, kk, m] by a
weight u [kk, kk, k1] (padding (k1 - 1) / 2; a bias s [kk] half the time), squeezed back to
[kk, m]; conv2d of any 2-D node as [1, 1, H, W] by w [3, 3] (padding 1; stride 1 squeezed back,
stride 2 reduced); max_pool2d and avg_pool2d <3, 1, 1> of any 2-D node likewise; batch_norm of a
[kk, m] node as [1, kk, m] (channels kk, statistics over m; weight p and bias q [kk] of one
dtype), read through a sine as the norms. conv is lower precision (bf16 under CPU autocast), the
pools keep their input's dtype and batch_norm promotes over input, weight and bias.
Graphs FIRST_CONV2.. draw three of CONV2_OPS each, in turn, in place of CONV_OPS (try_conv2): the
rest of those ops' forms. conv1d of a [kk, m] node with dilation 2 (padding k1 - 1) and groups
(kk / G input channels a group: u [kk, kk / G, k1], a bias half the time), lower precision;
adaptive_avg_pool2d<OH, OW> of any 2-D node as [1, 1, H, W] (reduced; the input's dtype); narrow
of a node along an axis of extent kk, start o and length n std::int64_t inputs (reduced; the
input's dtype); gather of a 2-D node by the argmax or argmin (keepdim) of another node of its
shape along an axis (i64 ids; the gather keeps its operand's dtype; reduced).
Graphs FIRST_ATTENTION.. draw scaled_dot_product_attention (try_conv2's "sdpa") and one of
CONV2_OPS each: the fused op (q, k and v 2-D nodes of one dtype, within +-3: q [tq, d], k [tk, d],
v [tk, dv]; causal half the time), lower precision under CPU autocast (computed in f32, its output
and each operand's gradient rounded once); LibTorch 1.13 has no such op, so the program writes
it out (matmul, scale, masked softmax, matmul) and autocast lowers its matmuls.
Leaves are f32 or bf16 (ids: i64). Some matmuls of leaves sit in a nested disabled region (they run in f32,
their backward under the step's policy). Each graph is compiled with one backward policy,
autocast_registry.hpp's policy_of(id): the default (same_as_forward) for even ids,
backward_autocast::off for odd ones, so that each band of graphs holds both (compiling every graph
with both policies took a quarter more of the stage's longest compiles). The generated function reports, for
every node of the line program, the dtype typegrad gives it in the region, so that the harness
compares dtypes op by op against LibTorch's.
"""
import pathlib
import random

import generate as g

SEED = 20261124
GRAPHS = 130
FIRST_PROD = 40     # graphs from here on (ids FIRST_ID + 40..) also draw prod, a float op under autocast
FIRST_ACTIVATION = 52  # graphs from here on also draw the activations (generate.ACTIVATIONS), in turn
FIRST_MODEL = 76    # graphs from here on also draw layer_norm, rms_norm, concat<0> and stack<1> (generate.py's)
FIRST_INDEX = 88    # graphs from here on also draw INDEX_OPS (try_index), three a graph, in turn
INDEX_OPS = ["embedding", "index_select", "gather", "dropout"]
INDEX_OPS_PER_GRAPH = 3
FIRST_CONV = 100    # graphs from here on draw CONV_OPS (try_conv), three a graph, in turn (not INDEX_OPS)
CONV_OPS = ["conv1d", "conv2d", "max_pool", "avg_pool", "batch_norm", "conv2d_s2"]
CONV_OPS_PER_GRAPH = 3
FIRST_CONV2 = 112   # graphs from here on draw CONV2_OPS (try_conv2) instead of CONV_OPS
CONV2_OPS = ["conv1d_dg", "adaptive_pool", "narrow", "argmax"]
FIRST_ATTENTION = 124  # graphs from here on draw "sdpa" and one of CONV2_OPS (try_conv2)
FIRST_ID = 2000
UNITS = 4
LEAF_NAMES = "abcdef"
UNARY = ["neg", "exp", "log", "sqrt", "square", "sin", "cos", "tanh", "sigmoid", "relu", "abs", "powc"]
BINARY = ["add", "sub", "mul", "div", "maximum", "minimum"]
REDUCE = ["sum", "mean", "max", "min", "lse"]
DISABLED = "tg::autocast_disabled<tg::cpu>"


def cpp_dtype(dt):
    return {"f32": "float", "bf16": "tg::bf16", "i64": "std::int64_t"}[dt]


def compatible(*shapes):
    """Whether the shapes broadcast (right-aligned: equal extents, or one of them 1)."""
    r = max(len(x) for x in shapes)
    padded = [(1,) * (r - len(x)) + tuple(x) for x in shapes]
    for axis in zip(*padded):
        sizes = {e for e in axis if e != 1}
        if len(sizes) > 1:
            return False
    return True


def promote(a, b):
    """typegrad's promotion in the float family (f32 wins), ranks ignored."""
    return "f32" if "f32" in (a, b) else "bf16"


def ref_positions(line, pos=None):
    """The token positions of a program line that are node numbers: pos where the line says
    (generate.Graph.add's refs: lines holding integer parameters), else every integer after the op."""
    tok = line.split()
    first = 1 if tok[0] == "off" else 0
    if tok[first] == "leaf":
        return []
    return pos if pos is not None else [j for j, t in enumerate(tok) if j > first and t.lstrip("-").isdigit()]


def line_refs(line, pos=None):
    """The node ids a program line reads (not its constants)."""
    tok = line.split()
    return [int(tok[j]) for j in ref_positions(line, pos)]


class Graph(g.Graph):
    """A generate.Graph whose nodes also carry the dtype they have in a cpu/bf16 region, as
    typegrad decides it (the harness checks each against LibTorch)."""

    def prod_chance(self):
        """Graphs FIRST_PROD..FIRST_ACTIVATION take prod wherever its bounds allow (not the
        activation graphs: a product of many activations near 0 underflows f32, and its gradient
        then measures the subnormal range, not the activations)."""
        return 1.0 if FIRST_PROD <= self.gid - FIRST_ID < FIRST_ACTIVATION else 0.0

    def __init__(self, gid, rng):
        self.dtypes = []
        self.disabled_texts = set()
        self.activations_drawn = 0
        self.pending_dtype = None
        self.index_nodes = []  # INDEX_OPS' and CONV_OPS' results (graphs FIRST_INDEX..): each reaches the loss
        self.band_drawn = set()  # the INDEX_OPS and CONV_OPS drawn so far (try_op draws them too)
        super().__init__(gid, rng)

    def model(self):
        """Graphs FIRST_MODEL.. draw generate.py's norms, concat and stack (try_norm, try_concat)."""
        return self.gid - FIRST_ID >= FIRST_MODEL

    def index(self):
        """Graphs FIRST_INDEX..FIRST_CONV draw INDEX_OPS (try_index)."""
        return FIRST_INDEX <= self.gid - FIRST_ID < FIRST_CONV

    def conv(self):
        """Graphs FIRST_CONV.. draw CONV_OPS (try_conv)."""
        return self.gid - FIRST_ID >= FIRST_CONV

    def add(self, op, args, shape, lo, hi, text, program_line, refs=None):
        k = super().add(op, args, shape, lo, hi, text, program_line, refs)
        if self.pending_dtype is None:
            # generate.py's try_norm and try_concat set no dtype: the norms, cat0 and stack1
            # promote (ops/norm.hpp, ops/index.hpp), their sine, activation and reduction keep it
            first = program_line.split()[0]
            assert first in ("layer_norm", "rms_norm", "cat0", "stack1", "sin", "sum", "mean", "max", "min",
                             "lse") or first in g.ACTIVATIONS, program_line
            dts = [self.dtypes[j] for j in line_refs(program_line, self.ref_pos[-1])]
            self.pending_dtype = "f32" if "f32" in dts else "bf16"
        self.dtypes.append(self.pending_dtype)
        self.pending_dtype = None
        if self.model():
            self.nodes[-1].varies = self.varies(op, shape, program_line)
        return k

    def varies(self, op, shape, line):
        """Whether a new node surely varies along its last axis (generate.Node.varies: the norms
        read only such nodes): a leaf of the norms' extent there, a matrix product (random
        weights), a strictly monotonic unary op of such a node, one plus a constant row."""
        if not shape:
            return False
        if op == "leaf":
            return shape[-1] == self.full[-1]
        if op in ("matmul", "matmul_t", "linear", "linear_b"):
            return True
        ins = [self.nodes[j] for j in line_refs(line, self.ref_pos[-1])]
        if op in g.VARYING_UNARY:
            return ins[0].varies
        if op in ("add", "sub"):
            tok = line.split()[1:]
            lv, rv = [not t.startswith("c") and self.nodes[int(t)].varies for t in tok]
            return lv != rv and shape == self.nodes[int(tok[0] if lv else tok[1])].shape
        return False

    def make_leaves(self):
        rng = self.rng
        dims = [("d%d" % i) if rng.random() < 0.6 else rng.choice([2, 3, 4, 5]) for i in range(3)]
        if self.model() and (isinstance(dims[2], str) or dims[2] < 3):
            # the norms' axis is m: static and at least 3, as generate.py's (over 1 or 2 elements
            # their gradients are eps-sized differences of O(1) terms)
            dims[2] = rng.choice([3, 4, 5])
        if (self.index() or self.conv()) and (isinstance(dims[1], str) or dims[1] < 2):
            # the ids' range [0, k), the channels of conv1d and batch_norm: static, two at least
            dims[1] = rng.choice([2, 3, 4, 5])
        self.full = dims
        self.vars = sum(isinstance(d, str) for d in dims)
        # renumber the dynamic dims 0.. in order (the harness draws vars[k] for "dk")
        names, k = {}, 0
        for i, d in enumerate(dims):
            if isinstance(d, str):
                names[i] = "d%d" % k
                k += 1
        dims = [names.get(i, d) for i, d in enumerate(dims)]
        n, kk, m = dims
        shapes = [(n, kk), (kk, m), (m, kk), (m,), (kk,), (n, m), (n, kk), (kk,), (m,), (1, m)]
        count = rng.choice([3, 4, 4, 5, 6])
        picked = [shapes[0]] + rng.sample(shapes[1:], count - 1)
        if self.model() and (kk, m) not in picked and (m, kk) not in picked:
            picked[-1] = (kk, m)  # a weight whose product with a has the norms' extent last
        if self.conv() and (kk, m) not in picked:
            picked[-1] = (kk, m)  # an operand of conv1d and batch_norm
        for i, shape in enumerate(picked):
            param = i == 0 or rng.random() < 0.7
            dt = "bf16" if rng.random() < 0.25 else "f32"
            lo, hi = (0.25, 2.0) if rng.random() < 0.35 else (-2.0, 2.0)
            self.add_leaf(LEAF_NAMES[i], param, tuple(shape), lo, hi, dt)
        if self.model():
            # layer_norm's weight and bias and rms_norm's weight (generate.py's g and h), of one
            # dtype: bf16 with a bf16 input is the norm PyTorch runs in bf16; f32 with a bf16
            # input promotes in typegrad (LibTorch 1.13 has no mixed-dtype CPU layer_norm)
            dt = "bf16" if rng.random() < 0.5 else "f32"
            for name, lo, hi in (("g", 0.5, 1.5), ("h", -1.0, 1.0)):
                self.nodes[self.add_leaf(name, True, (m,), lo, hi, dt)].varies = True
            self.gain, self.shift = len(self.nodes) - 2, len(self.nodes) - 1
        if self.index():
            self.make_index_leaves(n, kk, m)
        if self.conv():
            self.make_conv_leaves(kk)

    def add_leaf(self, name, param, shape, lo, hi, dt):
        """A leaf (a param or an input of dtype dt): its declaration and program line; its node index."""
        i = len(self.leaves)
        self.leaves.append((name, param, shape, lo, hi, dt))
        ext = ", ".join("tg::dyn" if isinstance(e, str) else str(e) for e in shape)
        kind = "param" if param else "input"
        self.lines.append('constexpr auto %s = tg::%s<"%s", %s, tg::shape<%s>>;' % (name, kind, name, cpp_dtype(dt), ext))
        self.pending_dtype = dt
        self.add("leaf", [i], shape, lo, hi, name, "leaf %d %s" % (i, dt))
        return len(self.nodes) - 1

    def make_index_leaves(self, n, kk, m):
        """The leaves of the graph's INDEX_OPS: the table t (a param, f32 or bf16) and the ids
        (std::int64_t inputs in [0, kk), operands of their op only: odd)."""
        rng = self.rng
        k = self.gid - FIRST_ID - FIRST_INDEX
        self.index_ops = [INDEX_OPS[(INDEX_OPS_PER_GRAPH * k + j) % len(INDEX_OPS)] for j in range(INDEX_OPS_PER_GRAPH)]
        self.index_leaf = {}
        wanted = []
        for op in self.index_ops:
            if op == "embedding":
                wanted += [("t", True, (kk, m), -2.0, 2.0, "bf16" if rng.random() < 0.5 else "f32"),
                           ("k", False, (n,), 0, kk - 1, "i64")]
            elif op == "index_select":
                wanted += [("i", False, (m,), 0, kk - 1, "i64")]
            elif op == "gather":
                wanted += [("j", False, (n, m), 0, kk - 1, "i64")]
            elif op == "dropout":
                wanted += [("r", False, (2,), 0, 1000000, "i64")]  # {seed, offset}
        for name, param, shape, lo, hi, dt in wanted:
            self.index_leaf[name] = self.add_leaf(name, param, shape, lo, hi, dt)
            self.nodes[-1].odd = dt == "i64"

    def try_index(self, op):
        """One of INDEX_OPS; its result has the graph's extents and keeps its operand's dtype.
        False where no operand fits."""
        rng = self.rng
        n, kk, m = self.full
        leaf = self.index_leaf
        before = len(self.nodes)
        if op == "embedding":
            t = self.nodes[leaf["t"]]
            pad = rng.choice([-1, rng.randrange(kk)])
            self.pending_dtype = self.node_dtype(t)
            self.emit(op, [], (n, m), (t.lo, t.hi), "tg::embedding%s(k, t)" % ("" if pad < 0 else "<%d>" % pad),
                      "embedding %d %d %d" % (leaf["k"], leaf["t"], pad), refs=[1, 2])
        elif op == "dropout":
            cands = [k for k, x in enumerate(self.nodes) if x.shape != () and not getattr(x, "odd", False)]
            a = rng.choice(cands)
            x = self.nodes[a]
            pr = rng.choice([0.25, 0.5])
            self.pending_dtype = self.node_dtype(x)
            self.emit(op, [], x.shape, (min(0.0, x.lo / (1 - pr)), max(0.0, x.hi / (1 - pr))),
                      "tg::dropout<%s>(%s, r)" % (g.cpp_num(pr), x.text), "dropout %d %d %s" % (a, leaf["r"], repr(pr)),
                      refs=[1, 2])
        else:  # index_select<1> by i [m], gather<1> by j [n, m]: of an [n, kk] node
            cands = [k for k, x in enumerate(self.nodes) if x.shape == (n, kk) and not getattr(x, "odd", False)]
            if not cands:
                return False
            a = rng.choice(cands)
            x = self.nodes[a]
            ids = "i" if op == "index_select" else "j"
            self.pending_dtype = self.node_dtype(x)
            self.emit(op, [], (n, m), (x.lo, x.hi), "tg::%s<1>(%s, %s)" % (op, x.text, ids),
                      "%s %d 1 %d" % (op, a, leaf[ids]), refs=[1, 3])
        if len(self.nodes) == before:
            return False
        self.index_nodes.append(len(self.nodes) - 1)
        self.band_drawn.add(op)
        return True

    def make_conv_leaves(self, kk):
        """The leaves of the graph's CONV_OPS (params, operands of their op only: odd): conv1d's
        weight u [kk, kk, k1] and bias s [kk], conv2d's weight w [3, 3], batch_norm's weight p and
        bias q [kk] (one dtype)."""
        rng = self.rng
        if self.gid - FIRST_ID >= FIRST_CONV2:
            return self.make_conv2_leaves(kk)
        k = self.gid - FIRST_ID - FIRST_CONV
        self.conv_ops = [CONV_OPS[(CONV_OPS_PER_GRAPH * k + j) % len(CONV_OPS)] for j in range(CONV_OPS_PER_GRAPH)]
        self.k1 = rng.choice([1, 3, 5])  # conv1d's kernel (padding (k1 - 1) / 2 keeps m)
        self.conv_leaf = {}
        wanted = []
        for op in self.conv_ops:
            pick = lambda: "bf16" if rng.random() < 0.5 else "f32"
            if op == "conv1d":
                wanted += [("u", (kk, kk, self.k1), -0.5, 0.5, pick()), ("s", (kk,), -0.5, 0.5, pick())]
            elif op.startswith("conv2d") and "w" not in [w[0] for w in wanted]:
                wanted += [("w", (3, 3), -0.5, 0.5, pick())]
            elif op == "batch_norm":
                dt = pick()
                wanted += [("p", (kk,), 0.5, 1.5, dt), ("q", (kk,), -1.0, 1.0, dt)]
        for name, shape, lo, hi, dt in wanted:
            self.conv_leaf[name] = self.add_leaf(name, True, shape, lo, hi, dt)
            self.nodes[-1].odd = True

    def make_conv2_leaves(self, kk):
        """Graphs FIRST_CONV2..: the ops of CONV2_OPS this graph draws and their leaves: conv1d's
        weight u [kk, kk / G, k1] and bias s [kk] (params, f32 or bf16), narrow's start o and
        length n (std::int64_t inputs: the window lies inside an axis of extent kk)."""
        rng = self.rng
        k = self.gid - FIRST_ID - FIRST_CONV2
        self.conv_ops = [CONV2_OPS[(CONV_OPS_PER_GRAPH * k + j) % len(CONV2_OPS)] for j in range(CONV_OPS_PER_GRAPH)]
        if self.gid - FIRST_ID >= FIRST_ATTENTION:
            self.conv_ops = ["sdpa", CONV2_OPS[k % len(CONV2_OPS)]]
        self.k1 = rng.choice([3, 5])  # dilation 2, padding k1 - 1: m kept
        self.groups = rng.choice([d for d in (2, 3, 4, 5) if kk % d == 0])
        self.conv_leaf = {}
        for op in self.conv_ops:
            pick = lambda: "bf16" if rng.random() < 0.5 else "f32"
            if op == "conv1d_dg":
                for name, shape in (("u", (kk, kk // self.groups, self.k1)), ("s", (kk,))):
                    self.conv_leaf[name] = self.add_leaf(name, True, shape, -0.5, 0.5, pick())
                    self.nodes[-1].odd = True
            elif op == "narrow":
                for name, lo, hi in (("o", 0, kk // 2), ("n", 1, kk - kk // 2)):
                    self.conv_leaf[name] = self.add_leaf(name, False, (), lo, hi, "i64")
                    self.nodes[-1].odd = True

    def try_conv2(self, op):
        """One of CONV2_OPS (graphs FIRST_CONV2..), as try_conv."""
        rng = self.rng
        n, kk, m = self.full
        leaf = self.conv_leaf
        before = len(self.nodes)

        def operand(ok):
            """A node that is not odd, within +-1e3, whose shape passes ok, and its index; or None."""
            cands = [k for k, x in enumerate(self.nodes) if ok(x.shape) and not getattr(x, "odd", False)
                     and max(abs(x.lo), abs(x.hi)) <= 1e3]
            if not cands:
                return None
            a = rng.choice(cands)
            return a, self.nodes[a]

        if op == "conv1d_dg":
            picked = operand(lambda s: s == (kk, m))
            if picked is None:
                return False
            a, x = picked
            p, gr = self.k1 - 1, self.groups
            bias = rng.random() < 0.5
            b = kk // gr * self.k1 * 0.5 * max(abs(x.lo), abs(x.hi)) + (0.5 if bias else 0.0)
            self.pending_dtype = "bf16"
            conv = "tg::conv1d<1, %d, 2, %d>(tg::unsqueeze<0>(%s), u%s)" % (p, gr, x.text, ", s" if bias else "")
            if bias:
                self.emit("conv1d_b", [], (kk, m), (-b, b), "tg::squeeze<0>(%s)" % conv,
                          "conv1d_b %d %d %d %d 2 %d" % (a, leaf["u"], leaf["s"], p, gr), refs=[1, 2, 3])
            else:
                self.emit("conv1d", [], (kk, m), (-b, b), "tg::squeeze<0>(%s)" % conv,
                          "conv1d %d %d %d 2 %d" % (a, leaf["u"], p, gr), refs=[1, 2])
        elif op == "adaptive_pool":
            picked = operand(lambda s: len(s) == 2)
            if picked is None:
                return False
            a, x = picked
            oh, ow = rng.choice([(1, 1), (2, 2), (2, 3), (3, 1)])
            self.pending_dtype = self.node_dtype(x)
            self.emit("adaptive_avg_pool2d", [], (1, 1, oh, ow), (x.lo, x.hi),
                      "tg::adaptive_avg_pool2d<%d, %d>(tg::unsqueeze<0>(tg::unsqueeze<0>(%s)))" % (oh, ow, x.text),
                      "adaptive_avg_pool2d %d %d %d" % (a, oh, ow), refs=[1])
        elif op == "narrow":
            picked = operand(lambda s: kk in s)
            if picked is None:
                return False
            a, x = picked
            axis = rng.choice([j for j, e in enumerate(x.shape) if e == kk])
            self.pending_dtype = self.node_dtype(x)
            shape = tuple("dn" if j == axis else e for j, e in enumerate(x.shape))
            self.emit(op, [], shape, (x.lo, x.hi), "tg::narrow<%d>(%s, o, n)" % (axis, x.text),
                      "narrow %d %d %d %d" % (a, axis, leaf["o"], leaf["n"]), refs=[1, 3, 4])
        elif op == "sdpa":
            # the fused op: q, k and v of one dtype (typegrad fuses only those; the region then
            # casts all three), bounded so that the scores are
            picked = operand(lambda s: len(s) == 2)
            if picked is None:
                return False
            qi, q = picked
            q = self.nodes[qi]
            if max(abs(q.lo), abs(q.hi)) > 3.0:
                return False
            dt = self.dtypes[qi]
            same = [k for k, t in enumerate(self.nodes) if len(t.shape) == 2 and not getattr(t, "odd", False)
                    and self.dtypes[k] == dt and max(abs(t.lo), abs(t.hi)) <= 1e3]
            keys = [k for k in same if self.nodes[k].shape[1] == q.shape[1] and max(abs(self.nodes[k].lo), abs(self.nodes[k].hi)) <= 3.0]
            if not keys:
                return False
            ki = rng.choice(keys)
            values = [k for k in same if self.nodes[k].shape[0] == self.nodes[ki].shape[0]]
            vi = rng.choice(values)
            v = self.nodes[vi]
            causal = rng.random() < 0.5
            self.pending_dtype = "bf16"
            self.emit(op, [], (q.shape[0], v.shape[1]), (min(v.lo, 0.0), max(v.hi, 0.0)),
                      "tg::scaled_dot_product_attention(%s, %s, %s%s)" % (q.text, self.nodes[ki].text, v.text,
                                                                        ", tg::causal" if causal else ""),
                      "sdpa %d %d %d %d" % (qi, ki, vi, causal), refs=[1, 2, 3])
        elif op == "argmax":  # gather<axis>(x, argmax(y, axes<axis>, keepdim)), x and y of one 2-D shape
            picked = operand(lambda s: len(s) == 2)
            if picked is None:
                return False
            a, x = picked
            y = rng.choice([k for k, t in enumerate(self.nodes) if t.shape == x.shape and not getattr(t, "odd", False)
                            and self.dtypes[k] != "i64"])
            axis = rng.choice([0, 1])
            fn = rng.choice(["argmax", "argmin"])
            text = "tg::%s(%s, tg::axes<%d>, tg::keepdim)" % (fn, self.nodes[y].text, axis)
            ki = self.existing(text)
            if ki is None:
                self.pending_dtype = "i64"
                self.emit(fn, [], tuple(1 if j == axis else e for j, e in enumerate(x.shape)), (0, 0), text,
                          "%s %d %d" % (fn, y, axis), force=True, refs=[1])
                ki = len(self.nodes) - 1
                self.nodes[ki].odd = True
            self.pending_dtype = self.node_dtype(x)
            self.emit("gather", [], self.nodes[ki].shape, (x.lo, x.hi),
                      "tg::gather<%d>(%s, %s)" % (axis, x.text, self.nodes[ki].text),
                      "gather %d %d %d" % (a, axis, ki), refs=[1, 3])
        else:
            raise ValueError(op)
        if len(self.nodes) == before or self.dtypes[-1] == "i64":
            return False
        self.nodes[-1].odd = op not in ("conv1d_dg", "sdpa")  # the others are reduced (other extents)
        self.index_nodes.append(len(self.nodes) - 1)
        self.band_drawn.add(op)
        return True

    def try_conv(self, op):
        """One of CONV_OPS over a view of a 2-D node; its result (squeezed back to the node's
        shape, or reduced) reaches the loss. False where no operand fits."""
        if self.gid - FIRST_ID >= FIRST_CONV2:
            return self.try_conv2(op)
        rng = self.rng
        n, kk, m = self.full
        leaf = self.conv_leaf
        before = len(self.nodes)

        def operand(shape=None, varies=False):
            """A 2-D node (of `shape`, varying along its last axis if asked) and its index, or None."""
            cands = [k for k, x in enumerate(self.nodes) if len(x.shape) == 2 and (shape is None or x.shape == shape)
                     and not getattr(x, "odd", False) and (not varies or x.varies) and max(abs(x.lo), abs(x.hi)) <= 1e3]
            if not cands:
                return None
            a = rng.choice(cands)
            return a, self.nodes[a]

        four = "tg::unsqueeze<0>(tg::unsqueeze<0>(%s))"  # [H, W] as [1, 1, H, W]
        back = "tg::squeeze<0>(tg::squeeze<0>(%s))"
        if op == "conv1d":
            picked = operand((kk, m))
            if picked is None:
                return False
            a, x = picked
            p = (self.k1 - 1) // 2
            bias = rng.random() < 0.5
            b = kk * self.k1 * 0.5 * max(abs(x.lo), abs(x.hi)) + (0.5 if bias else 0.0)
            self.pending_dtype = "bf16"
            if bias:
                self.emit("conv1d_b", [], (kk, m), (-b, b), "tg::squeeze<0>(tg::conv1d<1, %d>(tg::unsqueeze<0>(%s), u, s))"
                          % (p, x.text), "conv1d_b %d %d %d %d" % (a, leaf["u"], leaf["s"], p), refs=[1, 2, 3])
            else:
                self.emit(op, [], (kk, m), (-b, b), "tg::squeeze<0>(tg::conv1d<1, %d>(tg::unsqueeze<0>(%s), u))"
                          % (p, x.text), "conv1d %d %d %d" % (a, leaf["u"], p), refs=[1, 2])
        elif op in ("conv2d", "conv2d_s2"):
            picked = operand()
            if picked is None:
                return False
            a, x = picked
            stride = 2 if op == "conv2d_s2" else 1
            b = 9 * 0.5 * max(abs(x.lo), abs(x.hi))
            conv = "tg::conv2d<%d, 1>(%s, %s)" % (stride, four % x.text, four % "w")
            self.pending_dtype = "bf16"
            # stride 2: [1, 1, (H - 1) / 2 + 1, (W - 1) / 2 + 1], reduced (odd)
            self.emit("conv2d", [], x.shape if stride == 1 else (1, 1, "h", "w"), (-b, b),
                      back % conv if stride == 1 else conv, "conv2d %d %d %d" % (a, leaf["w"], stride), refs=[1, 2])
            if stride == 2 and len(self.nodes) > before:
                self.nodes[-1].odd = True
        elif op in ("max_pool", "avg_pool"):
            picked = operand()
            if picked is None:
                return False
            a, x = picked
            fn = "max_pool2d" if op == "max_pool" else "avg_pool2d"
            bounds = (x.lo, x.hi) if op == "max_pool" else (min(x.lo, 0.0), max(x.hi, 0.0))
            self.pending_dtype = self.node_dtype(x)
            self.emit(fn, [], x.shape, bounds, back % ("tg::%s<3, 1, 1>(%s)" % (fn, four % x.text)), "%s %d" % (fn, a),
                      refs=[1])
        elif op == "batch_norm":
            # as the norms: over a row that varies (statistics over m), through a sine
            picked = operand((kk, m), varies=True)
            if picked is None:
                return False
            a, x = picked
            b = 1.5 * g.math.sqrt(m) + 1.0
            self.pending_dtype = promote(self.node_dtype(x), self.dtypes[leaf["p"]])
            self.emit(op, [], (kk, m), (-b, b), "tg::squeeze<0>(tg::batch_norm(tg::unsqueeze<0>(%s), p, q))" % x.text,
                      "batch_norm %d %d %d" % (a, leaf["p"], leaf["q"]), refs=[1, 2, 3])
            if len(self.nodes) == before:
                return False
            self.nodes[-1].odd = True
            k = len(self.nodes) - 1
            self.pending_dtype = self.dtypes[k]
            self.emit("sin", [k], (kk, m), (-1.0, 1.0), "tg::sin(%s)" % self.nodes[k].text, "sin %d" % k)
        else:
            raise ValueError(op)
        if len(self.nodes) == before:
            return False
        self.index_nodes.append(len(self.nodes) - 1)
        self.band_drawn.add(op)
        return True

    def node_dtype(self, n):
        return self.dtypes[self.nodes.index(n)]

    def draw_norm(self):
        """generate.py's try_norm (add() infers the dtypes), half the time of a bf16 input (a
        matmul's, mostly, as in a model; pick() finds few)."""
        rng = self.rng
        a = self.nodes[self.pick()]
        if rng.random() < 0.5:
            cands = [n for n in self.nodes if n.shape != () and n.shape[-1] == self.full[-1] and n.varies
                     and not getattr(n, "odd", False) and self.node_dtype(n) == "bf16"]
            a = rng.choice(cands) if cands else a
        return self.try_norm(a, self.nodes.index(a))

    def draw_concat(self):
        """generate.py's try_concat, half the time with the other operands of the other dtype
        (promotion), where there are some."""
        rng = self.rng
        a = self.nodes[self.pick()]
        other = [n for n in self.nodes if n.shape == a.shape and not getattr(n, "odd", False)
                 and self.node_dtype(n) != self.node_dtype(a)] if rng.random() < 0.5 else []
        return self.try_concat(a, self.nodes.index(a), other)

    def try_matmul(self, want_last=None):
        """A matmul or linear of random operands; with want_last, only one whose result has that
        last extent."""
        rng = self.rng
        a, b = self.nodes[self.pick()], self.nodes[rng.randrange(len(self.nodes))]
        if getattr(b, "odd", False):  # (generate.Graph.pick avoids them)
            return False
        if rng.random() < 0.5:
            a, b = b, a
        sa, sb = a.shape, b.shape
        if not sa or not sb:
            return False
        kind = rng.choice(["matmul", "matmul", "matmul_t", "linear", "linear_b"])
        if kind in ("linear", "linear_b"):
            # linear(x, W[, bias]): W is (out, in); the bias is a vector leaf or node of length out
            if len(sb) != 2 or sa[-1] != sb[1]:
                return False
            shape = sa[:-1] + (sb[0],)
            terms = [sa[-1]]
            bias = None
            if kind == "linear_b":
                cands = [x for x in self.nodes if x.shape == (sb[0],) and not getattr(x, "odd", False)]
                if not cands:
                    return False
                bias = rng.choice(cands)
        elif kind == "matmul_t":
            if len(sb) != 2 or sa[-1] != sb[1]:
                return False
            shape = sa[:-1] + (sb[0],)
        else:
            inner_b = sb[0] if len(sb) == 2 else sb[0]
            if sa[-1] != inner_b:
                return False
            shape = sa[:-1] + (sb[1:] if len(sb) == 2 else ())
        if want_last is not None and (not shape or shape[-1] != want_last):
            return False
        inner = sa[-1]
        n_in = g.MAX_DYN if isinstance(inner, str) else inner
        mag = max(abs(a.lo), abs(a.hi)) * max(abs(b.lo), abs(b.hi)) * n_in
        lo, hi = -mag, mag
        ai, bi = self.nodes.index(a), self.nodes.index(b)
        # (a disabled region runs the op in its inputs' dtype: LibTorch's mm then needs one dtype)
        disabled = (a.op == "leaf" and b.op == "leaf" and self.node_dtype(a) == self.node_dtype(b)
                    and rng.random() < 0.3)
        if kind == "matmul":
            text, line = "tg::matmul(%s, %s)" % (a.text, b.text), "matmul %d %d" % (ai, bi)
        elif kind == "matmul_t":
            text, line = "tg::matmul(%s, tg::transpose(%s))" % (a.text, b.text), "matmul_t %d %d" % (ai, bi)
        elif kind == "linear":
            text, line = "tg::linear(%s, %s)" % (a.text, b.text), "linear %d %d" % (ai, bi)
        else:
            ci = self.nodes.index(bias)
            text, line = "tg::linear(%s, %s, %s)" % (a.text, b.text, bias.text), "linear %d %d %d" % (ai, bi, ci)
            mb = max(abs(bias.lo), abs(bias.hi))
            lo, hi = lo - mb, hi + mb
            disabled = disabled and bias.op == "leaf" and self.node_dtype(bias) == self.node_dtype(a)
        if disabled:
            # A nested region over leaves only: a node shared with the outside would run under
            # the nested spec everywhere (one type), which eager PyTorch does not do.
            self.disabled_texts.add(text)
            text, line = "tg::autocast<%s>(%s)" % (DISABLED, text), "off " + line
            dt = self.node_dtype(a)
        elif text in self.disabled_texts:
            return False
        else:
            dt = "bf16"
        self.pending_dtype = dt
        self.emit(kind, [], shape, (lo, hi), text, line)
        return True

    def try_loss(self):
        rng = self.rng
        a = self.nodes[self.pick()]
        same = [x for x in self.nodes if x.shape == a.shape and x is not a and not getattr(x, "odd", False)]
        if not same:
            return False
        b = rng.choice(same)
        ai, bi = self.nodes.index(a), self.nodes.index(b)
        if rng.random() < 0.5:
            span = max(abs(a.lo), abs(a.hi), abs(b.lo), abs(b.hi))
            self.pending_dtype = "f32"
            self.emit("mse", [], (), (0.0, 4 * span * span), "tg::mse_loss(%s, %s)" % (a.text, b.text), "mse %d %d" % (ai, bi))
            return True
        if b.lo < 0 or b.hi > 1:  # targets: probabilities
            return False
        span = max(abs(a.lo), abs(a.hi))
        self.pending_dtype = "f32"
        self.emit("bce", [], (), (0.0, span + 1), "tg::binary_cross_entropy_with_logits(%s, %s)" % (a.text, b.text),
                  "bce %d %d" % (ai, bi))
        return True

    def try_softmax(self):
        a = self.nodes[self.pick()]
        if not a.shape:
            return False
        ai = self.nodes.index(a)
        self.pending_dtype = self.node_dtype(a)
        if self.rng.random() < 0.5:
            self.emit("softmax", [], a.shape, (0.0, 1.0), "tg::softmax(%s)" % a.text, "softmax %d" % ai)
        else:
            n = g.numel_bound(a.shape[-1:])
            span = (a.hi - a.lo) + g.math.log(n)
            self.emit("log_softmax", [], a.shape, (-span, 0.0), "tg::log_softmax(%s)" % a.text, "log_softmax %d" % ai)
        return True

    def try_op(self):
        rng = self.rng
        unary = 14 if self.gid - FIRST_ID >= FIRST_ACTIVATION else 6
        kinds, weights = ["matmul", "unary", "binary", "mask", "where", "reduce", "loss", "softmax"], [5, unary, 6, 1, 1, 2, 2, 1]
        if self.model():
            kinds, weights = kinds + ["norm", "concat"], weights + [3, 2]
        if self.index():  # more of the graph's INDEX_OPS, of computed nodes too
            kinds, weights = kinds + ["index"], weights + [2]
        if self.conv():  # more of the graph's CONV_OPS, of computed nodes too
            kinds, weights = kinds + ["conv"], weights + [2]
        kind = rng.choices(kinds, weights)[0]
        if kind == "index":
            return self.try_index(rng.choice(self.index_ops))
        if kind == "conv":
            return self.try_conv(rng.choice(self.conv_ops))
        if kind == "norm":
            return self.draw_norm()
        if kind == "concat":
            return self.draw_concat()
        if kind == "matmul":
            return self.try_matmul()
        if kind == "loss":
            return self.try_loss()
        if kind == "softmax":
            return self.try_softmax()
        # the promote ops: the parent's generator, with the dtype typegrad's promotion gives
        before = len(self.nodes)
        return self.try_promote_op(kind) and len(self.nodes) > before

    def try_promote_op(self, kind):
        rng = self.rng
        a = self.nodes[self.pick()]
        ai = self.nodes.index(a)
        if kind == "unary":
            new = self.gid - FIRST_ID >= FIRST_ACTIVATION and rng.random() < 0.6
            # activations in turn (each graph starts elsewhere), so that every one is drawn
            op = g.ACTIVATIONS[(self.gid + self.activations_drawn) % len(g.ACTIVATIONS)] if new else rng.choice(UNARY)
            c = rng.choice([0.5, 1.5, 2.5, -0.5, -1.0, 3.0]) if op == "powc" else None
            if op in g.ACTIVATION_PARAMS:
                c = rng.choice(g.ACTIVATION_PARAMS[op])
            self.activations_drawn += new
            if op == "log1p":
                # (conv graphs: not of the conv weights, operands of their op only)
                ok = [x for x in self.nodes if not getattr(x, "odd", False)] if self.conv() else self.nodes
                a = g.log1p_operand(ok, a, rng)
                ai = self.nodes.index(a)
            bounds = g.interval(op, a, c=c)
            if bounds is None:
                return False
            if op in g.ACTIVATIONS:
                text, line = g.activation_call(op, a.text, ai, c)
            elif op == "neg":
                text, line = "-%s" % a.text, "neg %d" % ai
            elif op == "powc":
                text, line = "tg::pow(%s, tg::lit<%s>)" % (a.text, g.cpp_num(c)), "powc %d %s" % (ai, repr(c))
            else:
                text, line = "%s(%s)" % (g.CPP_UNARY[op], a.text), "%s %d" % (op, ai)
            self.pending_dtype = self.node_dtype(a)
            self.emit(op, [ai], a.shape, bounds, text, line)
            return True
        if kind == "reduce":
            if a.shape == ():
                return False
            op = self.pick_reduce(a)
            self.pending_dtype = "f32" if op == "prod" else self.node_dtype(a)
            self.emit(op, [ai], (), g.interval(op, a), "%s(%s)" % (g.CPP_UNARY[op], a.text), "%s %d" % (op, ai))
            return True
        if kind == "where":
            x, y = self.nodes[self.pick()], self.nodes[self.pick()]
            cond = rng.choice(g.MASKS)
            v, w = self.nodes[self.pick()], self.nodes[self.pick()]
            if not compatible(x.shape, y.shape, v.shape, w.shape):
                return False
            shape = g.broadcast(g.broadcast(g.broadcast(x.shape, y.shape), v.shape), w.shape)
            if len(shape) > 2:
                return False
            ids = [self.nodes.index(n) for n in (x, y, v, w)]
            text = "tg::where(%s(%s, %s), %s, %s)" % (g.CPP_BINFN[cond], x.text, y.text, v.text, w.text)
            # the mask has its operands' dtype; where promotes mask and both values
            dt = promote(promote(self.node_dtype(x), self.node_dtype(y)), promote(self.node_dtype(v), self.node_dtype(w)))
            self.pending_dtype = dt
            self.emit("where", ids, shape, g.hull((v.lo, v.hi), (w.lo, w.hi)), text, "where_%s %d %d %d %d" % (cond, *ids))
            return True
        use_const = rng.random() < 0.25
        b = self.constant() if use_const else self.nodes[self.pick()]
        op = rng.choice(g.MASKS) if kind == "mask" else rng.choice(BINARY)
        swap = use_const and rng.random() < 0.4
        left, right = (b, a) if swap else (a, b)
        bounds = g.interval(op, left, right)
        if bounds is None:
            return False

        def ref(n):
            return "c%s" % repr(n.lo) if n.op == "const" else str(self.nodes.index(n))

        def dt_of(n):
            return None if n.op == "const" else self.node_dtype(n)

        if not compatible(left.shape, right.shape):
            return False
        shape = g.broadcast(left.shape, right.shape)
        if len(shape) > 2:
            return False
        dts = [d for d in (dt_of(left), dt_of(right)) if d]
        dt = dts[0] if len(dts) == 1 else promote(*dts)
        if op in g.CPP_BINOP:
            text = "(%s %s %s)" % (left.text, g.CPP_BINOP[op], right.text)
        else:
            text = "%s(%s, %s)" % (g.CPP_BINFN[op], left.text, right.text)
        if kind == "mask":
            other = self.nodes[self.pick()]
            if not compatible(shape, other.shape):
                return False
            shape = g.broadcast(shape, other.shape)
            if len(shape) > 2:
                return False
            text = "(%s * %s)" % (text, other.text)
            oi = self.nodes.index(other)
            self.pending_dtype = promote(dt, self.node_dtype(other))
            self.emit("mask", [], shape, g.hull((0.0, 0.0), (min(0.0, other.lo), max(0.0, other.hi))), text,
                      "mask_%s %s %s %d" % (op, ref(left), ref(right), oi))
            return True
        self.pending_dtype = dt
        self.emit(op, [], shape, bounds, text, "%s %s %s" % (op, ref(left), ref(right)))
        return True

    def make(self):
        self.make_leaves()
        target = self.rng.randint(3, 8) if not self.model() else self.rng.randint(4, 7)
        # every graph has a matmul (or linear) at least: the ops autocast lowers
        # (model graphs: one whose result a norm can read, as a transformer's projection)
        for want_last in ([self.full[-1]] if self.model() else []) + [None]:
            if any(self.try_matmul(want_last) for _ in range(100)):
                break
        for op in getattr(self, "index_ops", []):  # each drawn, after a few other ops
            for _ in range(self.rng.randint(0, 2)):
                self.try_op()
            if op not in self.band_drawn and not any(self.try_index(op) for _ in range(30)):
                raise RuntimeError("graph %d: no operand for %s" % (self.gid, op))
        for op in getattr(self, "conv_ops", []):  # each drawn, after a few other ops
            for _ in range(self.rng.randint(0, 2)):
                self.try_op()
            if op not in self.band_drawn and not any(self.try_conv(op) for _ in range(30)):
                raise RuntimeError("graph %d: no operand for %s" % (self.gid, op))
        tries = 0
        while len(self.nodes) - len(self.leaves) < target and tries < 300:
            tries += 1
            self.try_op()
        if self.model():  # a norm (its sine is the model node) and a concat or stack at least
            for norm, attempt in ((True, self.draw_norm), (False, self.draw_concat)):
                if not any((self.program[k].split()[0] == "sin") == norm for k in self.model_nodes):
                    any(attempt() for _ in range(100))
        last = self.nodes[-1]
        parts = []
        second = ([self.nodes[self.rng.randrange(len(self.leaves), len(self.nodes))]]
                  if self.rng.random() < 0.5 and len(self.nodes) > len(self.leaves) else [])
        if second and getattr(second[0], "odd", False):  # a norm or concat: read through its sine or reduction only
            second = []
        # the loss reads a matmul: if the last node does not, the loss adds the latest matmul
        matmuls = [k for k, n in enumerate(self.nodes) if n.op in ("matmul", "matmul_t", "linear", "linear_b")]
        if matmuls and not any(k in self.ancestors(len(self.nodes) - 1) for k in matmuls):
            second = [self.nodes[matmuls[-1]]]
        for n in [last] + second:
            if n.shape == () and n.op not in ("leaf",):
                parts.append(n)
                continue
            op = self.pick_reduce(n)
            k = self.existing("%s(%s)" % (g.CPP_UNARY[op], n.text)) if self.model() else None
            if k is not None:  # (see emit)
                parts.append(self.nodes[k])
                continue
            self.pending_dtype = "f32" if op == "prod" else self.node_dtype(n)
            self.emit(op, [], (), g.interval(op, n), "%s(%s)" % (g.CPP_UNARY[op], n.text),
                      "%s %d" % (op, self.nodes.index(n)), force=True)
            parts.append(self.nodes[-1])
        if len(parts) == 2:
            a, b = parts
            self.pending_dtype = promote(self.node_dtype(a), self.node_dtype(b))
            self.emit("add", [], (), g.interval("add", a, b), "(%s + %s)" % (a.text, b.text),
                      "add %d %d" % (self.nodes.index(a), self.nodes.index(b)), force=True)
        # every norm and concat/stack drawn reaches the loss (as generate.py's model graphs)
        for k in self.model_nodes + self.index_nodes:
            n, total = self.nodes[k], self.nodes[-1]
            if n.shape != () and self.existing("tg::mean(%s)" % n.text) is not None:  # (see emit)
                n = self.nodes[self.existing("tg::mean(%s)" % n.text)]
            elif n.shape != ():
                self.pending_dtype = self.node_dtype(n)
                self.emit("mean", [], (), g.interval("mean", n), "tg::mean(%s)" % n.text, "mean %d" % k, force=True)
                n = self.nodes[-1]
            self.pending_dtype = promote(self.node_dtype(total), self.node_dtype(n))
            self.emit("add", [], (), g.interval("add", total, n), "(%s + %s)" % (total.text, n.text),
                      "add %d %d" % (self.nodes.index(total), self.nodes.index(n)), force=True)
        self.loss = self.nodes[-1].text

    def ancestors(self, k):
        seen, todo = set(), [k]
        while todo:
            j = todo.pop()
            if j in seen:
                continue
            seen.add(j)
            todo += line_refs(self.program[j], self.ref_pos[j])
        return seen

    def existing(self, text):
        """The node whose expression is `text`, if there is one."""
        for k, l in enumerate(self.lines):
            if l.split(" = ", 1)[1] == text + ";":
                return k
        return None

    def emit(self, op, args, shape, bounds, text, line, force=False, refs=None):
        lo, hi = bounds
        # Model graphs: no expression twice. typegrad's is one node (a type), the program's two
        # LibTorch nodes, each sending its own rounded contribution in the semantic reference.
        dup = self.model() and self.existing(text) is not None
        assert not (dup and force), text
        if (max(abs(lo), abs(hi)) > 1e3 and not force) or dup:
            self.pending_dtype = None  # (add() infers the next one where it is not set)
            return
        name = "e%d" % len(self.nodes)
        self.lines.append("constexpr auto %s = %s;" % (name, text))
        self.add(op, args, shape, lo, hi, name, line, refs)

    def prune(self):
        reads = [line_refs(line, pos) for line, pos in zip(self.program, self.ref_pos)]
        keep = {len(self.nodes) - 1}
        for k in range(len(self.nodes) - 1, -1, -1):
            if k in keep:
                keep.update(reads[k])
        self.used_leaves = {k for k in keep if k < len(self.leaves)}
        keep |= set(range(len(self.leaves)))
        new_id = {old: new for new, old in enumerate(sorted(keep))}
        program, lines, dtypes = [], [], []
        for k in sorted(keep):
            tok = self.program[k].split()
            pos = ref_positions(self.program[k], self.ref_pos[k])
            tok = [str(new_id[int(t)]) if j in pos else t for j, t in enumerate(tok)]
            program.append(" ".join(tok))
            lines.append(self.lines[k])
            dtypes.append(self.dtypes[k])
        self.program, self.lines, self.dtypes = program, lines, dtypes
        self.kept = sorted(keep)

    def cpp(self):
        gid = self.gid
        self.prune()
        params = [l[0] for l in self.leaves if l[1]]
        binds = []
        convs = []
        for i, (name, param, shape, _, _, dt) in enumerate(self.leaves):
            ext = ", ".join("ext[%d][%d]" % (i, a) for a in range(len(shape)))
            if i in self.used_leaves or param:
                convs.append("    const auto in%d = %s(in[%d]);" % (i, "ids_of" if dt == "i64" else "narrow<%s>" % cpp_dtype(dt), i))
                binds.append("tg::bind(%s, in%d, {%s})" % (name, i, ext))
        grads, gbufs, gback = [], [], []
        k = 0
        for i, (name, param, shape, _, _, dt) in enumerate(self.leaves):
            if param:
                gbufs.append("    std::vector<%s> g%d(in[%d].size());" % (cpp_dtype(dt), k, i))
                grads.append("tg::grad_into(%s, g%d)" % (name, k))
                gback.append("    grad[%d] = widen(g%d);" % (k, k))
                k += 1
        body = []
        for j, l in enumerate(self.lines):
            unused = j < len(self.leaves) and j not in self.used_leaves and not self.leaves[j][1]
            body.append("    " + ("[[maybe_unused]] " if unused else "") + l)
        body.append("    constexpr auto loss = tg::autocast<tg::cpu_bf16>(%s);" % self.loss)
        # the dtype of every program node in the region, leaves included (a node of the region
        # is the same type as the region over that node alone: the rewrite is bottom-up)
        names = []
        for j, l in enumerate(self.lines):
            var = l.split("constexpr auto ")[1].split(" ")[0]
            names.append(var)
        dts = ", ".join("region_dtype(%s)" % v for v in names)
        body.append("    if (dtypes != nullptr) {")
        body.append("        *dtypes = {%s};" % dts)
        body.append("        return 0;")
        body.append("    }")
        body += convs
        body += gbufs
        call = "step.value_and_grad(%s, %s)" % (", ".join(binds), ", ".join(grads))
        body.append("    auto run = [&](const auto& step) { return double(%s); };" % call)
        body.append("    check_policy(%d, policy);" % gid)
        if gid % 2 == 0:  # policy_of(gid): same_as_forward
            body.append("    const double v = run(tg::compile(loss, tg::wrt(%s)));" % ", ".join(params))
        else:
            body.append("    const double v = run(tg::compile<tg::backward_autocast::off>(loss, tg::wrt(%s)));"
                        % ", ".join(params))
        body += gback
        body.append("    return v;")
        fn = ["double autocast_graph_%d(const tensors<double>& in, const extents& ext, tensors<double>& grad, int policy,"
              % gid,
              "                         std::vector<std::string_view>* dtypes) {"]
        if "ext[" not in call:
            body.insert(0, "    (void)ext;")
        fn += body + ["}"]
        text = "\n".join(self.lines + ["constexpr auto loss = tg::autocast<tg::cpu_bf16>(%s);" % self.loss])
        leaves = []
        for name, param, shape, lo, hi, dt in self.leaves:
            ext = ", ".join(str(-1 - int(e[1:])) if isinstance(e, str) else str(e) for e in shape)
            leaves.append('{"%s", %s, %d, {%s}, %s, %s%s}' % (name, "true" if param else "false", len(shape), ext,
                                                               g.cpp_num(lo), g.cpp_num(hi), ", true" if dt == "i64" else ""))
        reg = ("    r.push_back({%d, %d, %s,\n                %s,\n                {%s},\n"
               "                &autocast_graph_%d});"
               % (gid, self.vars, g.c_string(text), g.c_string("\n".join(self.program)), ", ".join(leaves), gid))
        return "\n".join(fn), reg


def main():
    out = pathlib.Path(__file__).resolve().parent / "generated"
    out.mkdir(exist_ok=True)
    graphs = [Graph(FIRST_ID + k, random.Random(SEED * 1000 + k)) for k in range(GRAPHS)]
    for u in range(UNITS):
        mine = [x for x in graphs if (x.gid - FIRST_ID) % UNITS == u]
        fns, regs = zip(*(x.cpp() for x in mine))
        src = ["// Generated by tests/differential/generate_autocast.py: do not edit.",
               "#include \"autocast_registry.hpp\"",
               "",
               "namespace tg = typegrad;",
               "",
               "namespace typegrad_differential {",
               "namespace {",
               ""]
        src += [f + "\n" for f in fns]
        src += ["const bool registered = [] {",
                "    auto& r = autocast_registry();"]
        src += list(regs)
        src += ["    return true;", "}();", "", "}  // namespace", "}  // namespace typegrad_differential", ""]
        (out / ("autocast_%d.cpp" % u)).write_text("\n".join(src))
    print("wrote %d autocast graphs in %d units to %s" % (GRAPHS, UNITS, out))


if __name__ == "__main__":
    main()
