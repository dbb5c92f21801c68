"""TEST-phase rewrite: per-row reductions and the element-wise layers
around them as one generated kernel (a LayerNorm written in Caffe layers).

ONNX's LayerNormalization, and the ReduceMean / Sub / Pow / ReduceMean /
Add / Sqrt / Div that PyTorch exports for it, convert to a dozen BVLC
layers (onnx/_layout.py): a mean (a ``Reduction`` over the last axes, or,
over the channel axis of an (N, C, H, W) blob, a 1x1 ``Convolution`` of
one output whose weights are all 1/C), ``Power``, ``Bias`` / ``Scale``
with the per-row statistic as their second bottom, ``Tile`` of it at
batch > 1, reshapes. Each is a pass over the tensor and a launch: 25
LayerNorms were 250 of DeiT-Tiny's 440 launches, and at batch 1 on a GPU
the host's enqueues were the forward's time.

The tensor x is seen as (O, C, S): a *row* is one (o, s), its C values
``S`` apart (S = 1: the last axes; S = H * W: the channel axis). A *group*
here is a run of consecutive layers (``net.layers`` order) each one of:

- a view: Reshape, Flatten, Split (the same values, the same flat order);
- a reducer of a full tensor to one value per row: ``Reduction`` (SUM,
  ASUM, SUMSQ, MEAN with its coeff; S = 1) or a bias-free 1x1
  ``Convolution`` with one output, no pad, stride 1, one group, its
  weights all equal (checked whenever they change: the value scales the
  sum; other weights run the layers one by one);
- an element-wise layer as plan/pointwise.py takes them (neurons with one
  launch of kernels/unary_op.h, Eltwise) on full tensors or on per-row
  values;
- ``Scale`` / ``Bias`` of a full tensor by an operand that broadcasts per
  row (a per-row value of the group), per channel or as one value (a
  learned blob), or element by element;
- ``Tile`` of a per-row value to the full tensor.

The blobs it computes are read by nothing outside it but the last layer's
top (a full tensor), no net output before the last, nothing in place, at
least one reducer and ``MIN_LAUNCHES`` layers that launch. The kernel
gives each row one work-item on CPU drivers: rows of at least
``ROW_LANES_MIN_C`` values along the last axes step through the row
``ROW_LANES`` neighbouring values at a time (an inner loop the compiler
makes a vector), other rows run 8 to a work-group as PoCL's vector lanes
(rows along the channel axis: ``RB`` neighbouring rows a work-item); on
GPUs, work-groups whose lanes stride along a row
and sum in local memory: one work-group along a row where S = 1, 32
neighbouring rows of 8 lanes each where S > 1 (an item per row left 3136
rows of 512 on 49 work-groups: MLP-Mixer's LayerNorms at batch 16, 115 us
each on an H100). Each reducer is a loop over the row computing the full
values it needs, the per-row values follow in registers, and a last loop
writes the top: three reads of x for a LayerNorm and one write, in one
launch.

The blobs before the last top are computed when read, by the layers' own
forwards (plan/patterns.PendingTops). Values: the layers' arithmetic
summed in another order (float32 rounding; tests/plan/test_row_reduce.py).
``CAFFE_OCL_FOLD=0`` or ``CAFFE_OCL_FUSE_ROW_REDUCE=0`` turn it off.
"""
from .. import config
from ..layers.neuron_ext import plain_elementwise
from ..ops import pointwise as pw_ops
from ..proto import caffe_pb2
from .patterns import PendingTops, readers_of
from .pointwise import build_generated, eltwise_expr, plain_eltwise

MIN_LAUNCHES = 4
# CPU drivers, rows along the last axes (S = 1) of a multiple of ROW_LANES
# values and at least ROW_LANES_MIN_C: a row a work-item, ROW_LANES
# neighbouring values a step. Shorter rows stay 8 rows a work-group as
# vector lanes: PVT v2's 3136 rows of 32 took 1.3-1.7x longer one row a
# work-item (PoCL's cost per work-group), its 784 of 64 ran level or
# faster, 196 of 160 and 49 of 256 1.5-2x faster, DeiT-Tiny's 197 of 192
# 2.3x (2-core EPYC Zen 3, PoCL 3.1, profiled in the net)
ROW_LANES = 8
ROW_LANES_MIN_C = 64
VIEWS = ("Reshape", "Flatten", "Split")
_R = caffe_pb2.ReductionParameter
_TERMS = {_R.SUM: "v", _R.ASUM: "fabs(v)", _R.SUMSQ: "v * v", _R.MEAN: "v"}


class _NoGroup(Exception):
    """The layers do not make a group (at these shapes)."""


def _conv_mean(layer, bottom, top):
    """Whether Convolution ``layer`` is a bias-free 1x1 with one output,
    no pad, stride 1, one group over a 4-D bottom: a weighted sum over
    the channel axis (a mean when the weights are 1/C: checked at run)."""
    p = layer.param.convolution_param
    w = layer.blobs[0] if layer.blobs else None
    return (len(layer.blobs) == 1 and bottom.num_axes == 4 and top.num_axes == 4
            and w is not None and tuple(w.shape) == (1, bottom.shape[1], 1, 1)
            and p.num_output == 1 and p.group == 1 and p.axis in (1, -3)
            and all(v == 0 for v in list(p.pad) + [p.pad_h, p.pad_w])
            and all(v == 1 for v in list(p.stride) + ([p.stride_h] if p.HasField("stride_h") else [])
                    + ([p.stride_w] if p.HasField("stride_w") else []))
            and tuple(top.shape) == (bottom.shape[0], 1) + tuple(bottom.shape[2:]))


def _operand_index(dims, n, geom):
    """How a Scale/Bias operand laid out by ``dims`` = (outer, dim, inner)
    over a full tensor of ``n`` values (layers/normalization._pattern) is
    indexed per element: "i" (element by element), "r" (per row), "c" (per
    channel), "0" (one value), or None (another broadcast)."""
    outer, dim, inner = dims
    O, C, S = geom
    if dim == 1:
        return "0"
    if inner == 1 and dim == n:
        return "i"
    if dim == O * S and ((S == 1 and inner == C) or (O == 1 and inner == 1)):
        return "r"
    if inner == S and dim == C:
        return "c"
    return None


class _Program:
    """The kernel of layers ``lis`` at the current shapes (raises _NoGroup
    where a layer cannot join, or, unless ``partial``, where the layers do
    not end in a full tensor after a reducer)."""

    def __init__(self, net, lis, wg, rb=1, partial=False, cv=1):
        self.net, self.g = net, net.graph
        self.inputs = []          # buffers' blobs, read in[k][index]
        self.input_index = []
        self.conv_weights = []    # (layer, arg name): a uniform weight, passed as a scalar
        self.full = {}            # name -> (expression, [deps])
        self.value = {}           # id(blob) -> ("full" | "row", name)
        self.body, self.ops = [], []
        self.geom = None
        self.reducers = 0
        self.wg = wg
        self.rb = rb              # rows per work-item (CPU drivers, S > 1: see source())
        self.cv = cv              # columns a step (CPU drivers, S = 1: see source())
        self.lis = list(lis)
        for k, li in enumerate(self.lis):
            self._layer(k, li)
        if partial:
            return
        if not self.complete():
            raise _NoGroup
        self.y = self.g.tops[self.lis[-1]][0]
        name = self._val(self.y)[1]
        self.body += self._loop([name], store=name)

    def complete(self):
        """Whether the layers end in a full tensor after a reducer (a group
        may end here; else only a per-row value or views so far)."""
        try:
            kind = self._val(self.g.tops[self.lis[-1]][0])[0]
        except _NoGroup:
            return False
        return kind == "full" and self.reducers > 0

    # ---- values --------------------------------------------------------------
    def _val(self, blob):
        """(kind, name) of ``blob``'s value: a value of the group, or a
        full tensor read from outside (through views: read where it lies)."""
        v = self.value.get(id(blob))
        if v is not None and v[0] != "outside":
            return v
        if self.geom is None:
            raise _NoGroup          # only views before the first reducer
        src = v[1] if v is not None else blob
        O, C, S = self.geom
        if src.count != O * C * S:
            raise _NoGroup
        return ("full", self._load(src, "i"))

    def _load(self, blob, index):
        """A full value ``in[k][index]`` read from a buffer (a blob from
        outside, a learned blob)."""
        for k, (b, ix) in enumerate(zip(self.inputs, self.input_index)):
            if b is blob and ix == index:
                return f"f_in{k}"
        k = len(self.inputs)
        self.inputs.append(blob)
        self.input_index.append(index)
        name = f"f_in{k}"
        ix = {"i": "i", "c": "c", "0": "0", "r": "r" if self.rb == 1 else "(r + j)"}[index]
        self.full[name] = (f"in{k}[{ix}]", [])
        return name

    def _def_full(self, name, expr, deps):
        self.full[name] = (expr, [d for d in deps if d in self.full])
        return ("full", name)

    def _loop(self, needed, tail=None, store=None):
        """A loop over the row's C values computing the full values
        ``needed`` (and what they read), then ``tail``; or, given ``store``
        (the value the top takes), the loop writing the top."""
        order, seen = [], set()

        def visit(n):
            if n in seen or n not in self.full:
                return
            seen.add(n)
            for d in self.full[n][1]:
                visit(d)
            order.append(n)
        for n in needed:
            visit(n)
        lines = [f"        const float {n} = {self.full[n][0]};" for n in order]
        if self.cv > 1 or self.rb > 1:
            # the inner loop over the lanes is the vector: CV neighbouring
            # columns of the row, or the block's RB rows side by side
            if self.cv > 1:
                lanes, outer = "CV", "    for (int c8 = 0; c8 < C; c8 += CV)"
                index = ["        const int c = c8 + j;", "        const size_t i = base + c;"]
            else:
                lanes, outer = "RB", "    for (int c = c0; c < cend; c += cstep)"
                index = ["        const size_t i = base + j + (size_t)c * S;"]
            inner = f"    for (int j = 0; j < {lanes}; ++j) {{"
            if store is None:
                return [outer, inner] + index + lines + [tail, "    }"]
            # the lanes' values computed, then stored: a store to y between
            # two lanes' loads kept the compiler from making the loads one
            # vector (y might alias an input)
            return ([outer + " {", f"    float out[{lanes}];", inner] + index + lines
                    + [f"        out[j] = {store};", "    }", inner] + index
                    + ["        y[i] = out[j];", "    }", "    }"])
        if store is not None:
            tail = f"        y[i] = {store};"
        return (["    for (int c = c0; c < cend; c += cstep) {",
                 "        const size_t i = base + (size_t)c * S;"] + lines + [tail, "    }"])

    def _row(self, name, expr):
        """Declare per-row value ``name`` = ``expr``; its reference."""
        if self.rb > 1:
            self.body.append(f"    float {name}[RB];")
            self.body.append(f"    for (int j = 0; j < RB; ++j) {name}[j] = {expr};")
            return f"{name}[j]"
        self.body.append(f"    const float {name} = {expr};")
        return name

    # ---- layers --------------------------------------------------------------
    def _layer(self, k, li):
        g, layer = self.g, self.net.layers[li]
        t, bottoms, tops = g.layer_types[li], g.bottoms[li], g.tops[li]
        if any(tp is b for tp in tops for b in bottoms):
            raise _NoGroup
        if t in VIEWS:
            if len(bottoms) != 1 or any(tp.count != bottoms[0].count for tp in tops):
                raise _NoGroup
            v = self.value.get(id(bottoms[0])) or ("outside", bottoms[0])
            for tp in tops:
                self.value[id(tp)] = v
            return
        if len(tops) != 1:
            raise _NoGroup
        top = tops[0]
        if t == "Reduction" or (t == "Convolution" and _conv_mean(layer, bottoms[0], top)):
            self._reducer(k, li, layer, t, bottoms[0], top)
            return
        args = [self._val(b) for b in bottoms]
        out = f"v{k}"
        kinds = {a[0] for a in args}
        names = [a[1] for a in args]
        deps = list(names)
        if plain_elementwise(layer) and len(bottoms) == 1:
            a, b, c = (float(v) for v in layer.op_params())
            self.ops.append((k, pw_ops.UNARY_OPS[layer.op]))
            expr = f"step{k}({names[0]}, {a!r}f, {b!r}f, {c!r}f)"
        elif plain_eltwise(layer) and len(bottoms) >= 2 and len(kinds) == 1:
            expr = eltwise_expr(layer, names)
        elif t in ("Scale", "Bias") and args[0][0] == "full":
            expr, loads = self._affine(layer, t, bottoms, args, names)
            deps += loads
        elif t == "Tile" and args[0][0] == "row":
            O, C, S = self.geom
            if layer.inner != S or layer.tiles != C or top.count != O * C * S:
                raise _NoGroup
            self.value[id(top)] = ("full", names[0])
            return
        else:
            raise _NoGroup
        if kinds == {"row"}:
            self.value[id(top)] = ("row", self._row(out, expr))
        else:
            self.value[id(top)] = self._def_full(out, expr, deps)

    def _affine(self, layer, t, bottoms, args, names):
        """Scale (x * s [+ b]) or Bias (x + b) of full ``x`` by a broadcast
        operand: bottom[1] (a value of the group) or the learned blob:
        (expression, [names of the learned blobs' loads])."""
        O, C, S = self.geom
        n = bottoms[0].count
        parts = []
        if len(bottoms) > 1:
            kind, name = args[1]
            ix = _operand_index(layer.dims, n, self.geom)
            if (kind, ix) not in (("row", "r"), ("full", "i")) and not (
                    kind == "row" and O * S == 1):
                raise _NoGroup
            parts.append(name)
        else:
            ix = _operand_index(layer.dims, n, self.geom)
            if ix is None:
                raise _NoGroup
            parts.append(self._load(layer.blobs[0], ix))
        x = names[0]
        if t == "Bias":
            return f"{x} + {parts[0]}", parts
        expr = f"{x} * {parts[0]}"
        if layer.bias_term:
            ix = _operand_index(layer.dims, n, self.geom)
            if ix is None:
                raise _NoGroup
            parts.append(self._load(layer.blobs[layer.bias_id], ix))
            expr = f"({expr}) + {parts[-1]}"
        return expr, parts

    def _reducer(self, k, li, layer, t, x, top):
        if t == "Reduction":
            geom = (layer.num, layer.dim, 1)
            term = _TERMS[layer.op]
            scale = f"{float(layer.coeff)!r}f"
        else:
            N, C, H, W = x.shape
            geom = (N, C, H * W)
            term = "v"
            scale = f"w{k}"
            self.conv_weights.append((layer, scale))
        if self.geom is None:
            if geom[1] <= 1:
                raise _NoGroup
            self.geom = geom
        elif geom != self.geom:
            raise _NoGroup
        kind, name = self._val(x)
        if kind != "full":
            raise _NoGroup
        acc = f"acc{k}"
        if self.rb > 1:
            self.body.append(f"    float {acc}[RB] = {{0.0f}};")
            ref = f"{acc}[j]"
        elif self.cv > 1:
            self.body.append(f"    float {acc}[CV] = {{0.0f}};")
            ref = f"{acc}[j]"
        else:
            self.body.append(f"    float {acc} = 0.0f;")
            ref = acc
        self.body += self._loop([name], f"        {{ const float v = {name}; {ref} += {term}; }}")
        if self.wg:
            self.body.append(f"    {acc} = wg_sum({acc}, red);")
        if self.cv > 1:     # the lanes' partial sums, pairwise
            self.body.append(f"    const float {acc}s = sum_lanes({acc});")
            ref = f"{acc}s"
        self.value[id(top)] = ("row", self._row(f"r{k}", f"{ref} * {scale}"))
        self.reducers += 1

    # ---- source --------------------------------------------------------------
    def source(self):
        head = ['#include "common.h"', '#include "act.h"']
        for k, op in self.ops:
            head += [f"#define OP {op}", f"#define fwd_op step{k}", '#include "unary_op.h"',
                     "#undef fwd_op", "#undef OP"]
        params = "".join(f"__global const float* in{k}, " for k in range(len(self.inputs)))
        scalars = "".join(f", float {name}" for _, name in self.conv_weights)
        if self.wg:
            # RR_SX rows a work-group (neighbouring s), RR_LC lanes along
            # each row's C; lid = lane * RR_SX + row within the group
            head += ["inline float wg_sum(float v, __local float* red) {",
                     "    const int lid = get_local_id(0);",
                     "    red[lid] = v;",
                     "    barrier(CLK_LOCAL_MEM_FENCE);",
                     "    for (int h = RR_LC / 2; h > 0; h >>= 1) {",
                     "        if (lid < h * RR_SX) red[lid] += red[lid + h * RR_SX];",
                     "        barrier(CLK_LOCAL_MEM_FENCE);",
                     "    }",
                     "    const float t = red[lid % RR_SX];",
                     "    barrier(CLK_LOCAL_MEM_FENCE);",
                     "    return t;",
                     "}"]
            start = ["    __local float red[RR_SX * RR_LC];",
                     "    const int lid = get_local_id(0);",
                     "    const int r = get_group_id(0) * RR_SX + lid % RR_SX;",
                     "    const int c0 = lid / RR_SX, cstep = RR_LC;",
                     "    const int cend = r < rows ? C : 0;   /* all reach the barriers */",
                     "    {"]
        elif self.cv > 1:
            # a row a work-item, its values CV at a time (C a multiple of
            # CV), each loop's inner loop over them (a vector: PoCL's
            # one-item-a-row version ran a work-group of 8 rows as lanes
            # reading values C apart, 65 us for each of DeiT-Tiny's
            # 197 x 192 LayerNorms on a 2-core EPYC); accumulators per
            # lane, summed pairwise after the loop
            head += [f"#define CV {self.cv}",
                     "inline float sum_lanes(const float* a) {",
                     "    float t[CV];",
                     "    for (int j = 0; j < CV; ++j) t[j] = a[j];",
                     "    for (int h = CV / 2; h > 0; h >>= 1)",
                     "        for (int j = 0; j < h; ++j) t[j] += t[j + h];",
                     "    return t[0];",
                     "}"]
            start = ["    const int r = min((int)get_global_id(0), rows - 1);",
                     "    {"]
        elif self.rb > 1:
            # RB rows side by side (S a multiple of RB) a work-item, each
            # loop's inner loop over them (a vector: PoCL's one-item-a-row
            # version read C values S apart per item, 7 GB/s on gMLP's
            # 196-position LayerNorms); items past the last block redo it
            start = [f"#define RB {self.rb}",
                     "    const int nb = rows / RB;",
                     "    const int r = min((int)get_global_id(0), nb - 1) * RB;",
                     "    const int c0 = 0, cstep = 1, cend = C;",
                     "    {"]
        else:
            # the items past the last row redo it (the same values written
            # twice): no branch around the body
            start = ["    const int r = min((int)get_global_id(0), rows - 1);",
                     "    const int c0 = 0, cstep = 1, cend = C;",
                     "    {"]
        src = "\n".join(head + [
            f"__kernel void row_reduce(int rows, int C, int S, {params}__global float* y{scalars}) {{"
        ] + start + [
            "    const int o = r / S, s = r - o * S;",
            "    const size_t base = (size_t)o * C * S + s;"] + self.body + ["    }", "}", ""])
        return src.replace("inff", "INFINITY").replace("nanf", "NAN")


class RowReduceGroup(PendingTops):
    """Layers ``layers`` (a group, see the module doc) run as one kernel
    writing the last layer's top."""
    traceable = True          # its run replays from a recorded pass (plan/trace.py)
    fuses_backward = False
    loses_values = False      # the pending blobs are computed before a backward
    # work-groups sharing rows (GPUs' kernel): None = on GPUs; tests force
    # it on any device
    work_groups = None

    def __init__(self, net, lis):
        g = net.graph
        self.net = net
        self.layers = list(lis)
        self.first, self.last = self.layers[0], self.layers[-1]
        self._init_pending([t for lj in self.layers[:-1] for t in g.tops[lj]],
                           self.layers[:-1])
        self._key = None
        self.fwd = None
        self.program = None
        self._failed = set()     # sources a driver refused

    def describe(self):
        names = self.net.graph.layer_names
        return (" -> ".join(names[i] for i in self.layers)
                + " (per-row reductions in one kernel)")

    def _launch(self, dev):
        """The launch for the current shapes and weights, or None: the
        layers then run one by one."""
        wg = bool(dev.is_gpu) if self.work_groups is None else self.work_groups
        try:
            prog = _Program(self.net, self.layers, wg=wg)
            S = prog.geom[2]
            rb = 1 if wg or S == 1 else next((b for b in (8, 4) if S % b == 0), 1)
            if rb > 1:
                prog = _Program(self.net, self.layers, wg=False, rb=rb)
            elif not wg and S == 1 and prog.geom[1] % ROW_LANES == 0 \
                    and prog.geom[1] >= ROW_LANES_MIN_C:
                prog = _Program(self.net, self.layers, wg=False, cv=ROW_LANES)
        except _NoGroup:
            return None
        O, C, S = prog.geom
        weights = []
        for layer, _ in prog.conv_weights:
            # read once per change of the weights (a read-only view: the
            # parameter's version stays, so the forward trace replays)
            w = layer.blobs[0].host_data().ravel()
            if not (w == w[0]).all():
                return None
            weights.append(float(w[0]))
        src = prog.source()
        if src in self._failed:
            return None
        rows = O * S
        if S == 1:      # a row's values side by side: a work-group along it
            sx, lc = 1, 32
            while lc < 256 and lc * 2 <= C:
                lc *= 2
        else:           # rows side by side: 32 of them, 8 lanes down C
            sx, lc = 32, 8
        defines = {"RR_SX": sx, "RR_LC": lc} if wg else {}
        name = build_generated(dev, src, self.describe(), defines)
        if name is None:
            self._failed.add(src)
            return None
        if wg:
            gs, lsz = (-(-rows // sx) * sx * lc,), (sx * lc,)
        else:
            # a row per work-item, PoCL running a group of 8 as vector lanes
            # (DeiT-Tiny's 25 LayerNorms on 2 cores: groups of 1-32 within
            # 10%); RB rows a work-item alone (gMLP's LayerNorms 3.6 ms in
            # groups of 8, 3.0 alone); GPUs neighbouring rows in a warp
            L = 64 if dev.is_gpu else (8 if prog.rb == 1 and prog.cv == 1 else 1)
            items = rows // prog.rb
            gs, lsz = (-(-items // L) * L,), (L,)
        args = [rows, C, S] + [b.data_buffer() for b in prog.inputs] + [prog.y.data_buffer()] \
            + weights
        self.program = prog
        return dev.launch(name, "row_reduce", gs, lsz, args, defines)

    def run(self):
        g, net = self.net.graph, self.net
        self._reshape_members()
        blobs = [b for li in self.layers for b in list(g.bottoms[li]) + list(g.tops[li])]
        params = [p for li in self.layers for p in net.layers[li].blobs]
        # the 1x1 mean's weight is a scalar of the launch: its version too
        key = (tuple(tuple(b.shape) for b in blobs),
               tuple(b.data_buffer() for b in blobs + params),
               tuple(p.data_mem.version for li in self.layers
                     if g.layer_types[li] == "Convolution" for p in net.layers[li].blobs))
        if key != self._key:
            dev = net.layers[self.first].device
            self.fwd = None if blobs[-1].count == 0 else self._launch(dev)
            self._key = key
        if self.fwd is None:
            self._run_own_forwards()
            return
        prog = self.program
        for b in prog.inputs:
            b.data_mem.to_device()
        self.fwd.run(net.layers[self.first].device.queue)
        prog.y.data_mem.device_written()
        self._mark_pending()


def _group_at(net, li, taken, outputs, readers):
    """The longest group starting at layer ``li`` (list of indices) or None."""
    g = net.graph
    best = None
    lis = []
    for lj in range(li, len(g.layers)):
        if lj in taken:
            break
        lis.append(lj)
        try:
            prog = _Program(net, lis, wg=False, partial=True)
        except _NoGroup:
            break               # a layer that cannot join ends the walk
        if not prog.complete():
            continue            # views, or a per-row value on its way
        inside = set(lis)
        made = [t for lk in lis[:-1] for t in g.tops[lk]]
        closed = all(t.name not in outputs and all(c in inside for c in readers.get(id(t), ()))
                     for t in made)
        launches = sum(1 for lk in lis if g.layer_types[lk] not in VIEWS)
        if closed and launches >= MIN_LAUNCHES:
            best = list(lis)
    return best


def find(net, taken=()):
    """[RowReduceGroup] of ``net`` (TEST plan), none with a layer in ``taken``."""
    if not config.get("FUSE_ROW_REDUCE"):
        return []
    g = net.graph
    outputs = set(g.outputs)
    readers = readers_of(g)
    candidates = {"Reduction", "Convolution", "Reshape", "Flatten", "Split"}
    out, li = [], 0
    while li < len(g.layers):
        lis = None
        if g.layer_types[li] in candidates and li not in taken:
            lis = _group_at(net, li, taken, outputs, readers)
        if lis:
            out.append(RowReduceGroup(net, lis))
            li = lis[-1] + 1
        else:
            li += 1
    return out
