"""TEST-phase rewrite: a run of element-wise layers as one generated kernel.

A converted GELU is about fifteen element-wise layers (onnx/_erf.py), a
LayerNorm or a Mish written in Caffe's layers several more; each is a pass
over the whole tensor, so NFNet-F0 ran at half ONNX Runtime's speed on a
CPU. A *chain* here is a run of consecutive layers (``net.layers``
order), each one of:

- a neuron layer whose forward is its one element-wise launch
  (``UnaryNeuron`` with the plain reshape: ReLU, Sigmoid, TanH, AbsVal,
  ELU, BNLL, Power, Exp, Log, Clip, Threshold, Swish ...),
- an Eltwise (SUM with its coefficients, PROD, MAX) of same-shaped
  bottoms,
- a Split (its tops are its bottom's memory),

none in place, every blob of one element count, the blobs it computes read
by nothing outside it but the last layer's top, and no net output before
the last. It runs as one kernel written for it (``Device.generated_source``):
each step's value in a register, through kernels/unary_op.h's ``fwd_op``
(the same op code the layers run) or the Eltwise's sum, product or max,
and only the last top written. The blobs before it are computed when read
(``Blob.compute_on_read``: the layers' own forwards; pycaffe reads them
as after an ordinary forward). Values: the layers' own arithmetic, up to
the compiler contracting multiply-adds across steps (a few float32 steps;
tests/plan/test_pointwise_chain.py).

A chain needs at least ``MIN_STEPS`` computing layers (Splits do not
count) and at most ``MAX_INPUTS`` blobs from outside. ``CAFFE_OCL_FOLD=0``
or ``CAFFE_OCL_FUSE_POINTWISE=0`` turn it off.
"""
import logging

from .. import config
from ..errors import DeviceError
from ..layers.base import Layer
from ..layers.neuron_ext import plain_elementwise
from ..ops import pointwise as pw_ops
from ..ops import work_size
from .patterns import PendingTops, readers_of

log = logging.getLogger("caffe_ocl")

MIN_STEPS = 3
MAX_INPUTS = 8


def plain_eltwise(layer):
    """Whether ``layer`` is an Eltwise whose forward is its one launch (no
    coefficient blobs, no subclass forward): what a generated kernel may
    compute instead (here and plan/row_reduce.py)."""
    return layer.type == "Eltwise" and len(layer.blobs) == 0 and \
        type(layer).forward is Layer.forward and type(layer).forward_impl is Layer.forward_impl


def eltwise_expr(layer, args):
    """OpenCL expression of an Eltwise ``layer`` (plain_eltwise) over the
    expressions ``args`` of its bottoms: PROD, MAX, or SUM with its
    coefficients (here and plan/row_reduce.py)."""
    if layer.op == layer.PROD:
        return " * ".join(args)
    if layer.op == layer.MAX:
        expr = args[0]
        for x in args[1:]:
            expr = f"fmax({expr}, {x})"
        return expr
    return " + ".join(f"{float(cf)!r}f * {x}" for cf, x in zip(layer.coeffs, args))


def build_generated(dev, source, what, defines=None):
    """Kernel ``source`` written at run time (``Device.generated_source``)
    built on ``dev`` now: its name, or None where the driver refuses it --
    logged, and the group ``what`` then runs its layers one by one: a
    fusion must not cost a net that runs without it (here and
    plan/row_reduce.py)."""
    name = dev.generated_source(source)
    try:
        dev.program(name, defines) if defines else dev.program(name)
        return name
    except DeviceError as e:
        log.warning("%s: the generated kernel did not build on %s; its layers run one "
                    "by one (%s)", what, dev.name, str(e).splitlines()[0])
        return None


def _step(g, li):
    """'unary', 'eltwise', 'split' or None for layer ``li``."""
    layer = g.layers[li]
    tops, bottoms = g.tops[li], g.bottoms[li]
    if any(t is b for t in tops for b in bottoms):
        return None                     # in place
    if g.layer_types[li] == "Split":
        return "split" if len(bottoms) == 1 else None
    if len(tops) != 1:
        return None
    if plain_elementwise(layer) and len(bottoms) == 1:
        return "unary"
    if plain_eltwise(layer) and len(bottoms) >= 2:
        return "eltwise"
    return None


def _chain_at(g, li, taken, outputs, readers):
    """The longest chain (list of layer indices) starting at ``li``;
    ``readers``: blob id -> indices of the layers reading it."""
    lis = []
    count = None
    for lj in range(li, len(g.layers)):
        if lj in taken or _step(g, lj) is None:
            break
        blobs = list(g.bottoms[lj]) + list(g.tops[lj])
        if count is None:
            count = blobs[0].count
        if any(b.count != count for b in blobs):
            break
        lis.append(lj)
    # cut back to where only the last layer's top leaves the chain
    while lis:
        last = lis[-1]
        inside = set(lis)
        made = [t for lj in lis[:-1] for t in g.tops[lj]]
        ok = g.layer_types[last] != "Split" and all(
            t.name not in outputs and all(c in inside for c in readers.get(id(t), ()))
            for t in made)
        if ok and sum(_step(g, lj) != "split" for lj in lis) >= MIN_STEPS:
            return lis
        if ok:
            return None
        lis.pop()
    return None


def chain_code(net, lis):
    """(input blobs, header lines, body lines, result expression) of the
    chain ``lis``: each input blob is ``x<i>``, each step's value a
    register ``v<k>``."""
    g = net.graph
    value, inputs, lines, ops = {}, [], [], []

    def ref(b):
        v = value.get(id(b))
        if v is None:
            v = value[id(b)] = f"x{len(inputs)}"
            inputs.append(b)
        return v
    for k, lj in enumerate(lis):
        kind, layer = _step(g, lj), net.layers[lj]
        args = [ref(b) for b in g.bottoms[lj]]
        if kind == "split":
            for t in g.tops[lj]:
                value[id(t)] = args[0]
            continue
        out = f"v{k}"
        if kind == "unary":
            a, b, c = (float(v) for v in layer.op_params())
            ops.append((k, pw_ops.UNARY_OPS[layer.op]))
            expr = f"step{k}({args[0]}, {a!r}f, {b!r}f, {c!r}f)"
        else:
            expr = eltwise_expr(layer, args)
        lines.append(f"        const float {out} = {expr};")
        value[id(g.tops[lj][0])] = out
    head = ['#include "common.h"', '#include "act.h"']
    for k, op in ops:
        head += [f"#define OP {op}", f"#define fwd_op step{k}", '#include "unary_op.h"',
                 "#undef fwd_op", "#undef OP"]
    # (a parameter's repr 'inf' / 'nan' written as a float literal)
    lines = [ln.replace("inff", "INFINITY").replace("nanf", "NAN") for ln in lines]
    return inputs, head, lines, value[id(g.tops[lis[-1]][0])]


class PointwiseChain(PendingTops):
    """Layers ``layers`` (a chain, see the module doc) run as one kernel
    writing the last layer's top."""
    traceable = True          # its run replays from a recorded pass (plan/trace.py)
    fuses_backward = False
    loses_values = False      # the pending blobs are computed before a backward

    def __init__(self, net, lis):
        g = net.graph
        self.net = net
        self.layers = list(lis)
        self.first, self.last = self.layers[0], self.layers[-1]
        self.y = g.tops[self.last][0]
        self._init_pending([t for lj in self.layers[:-1] for t in g.tops[lj]],
                           self.layers[:-1])
        self.inputs, self.source = self._program(g)
        self._key = None
        self.fwd = []
        self._failed = False    # the driver refused the generated program

    def _program(self, g):
        """(input blobs, kernel source) of the chain."""
        inputs, head, lines, result = chain_code(self.net, self.layers)
        self.code = (head, lines, result)       # (ProductChain's epilogue reuses them)
        params = ", ".join(f"__global const float* in{i}" for i in range(len(inputs)))
        loads = [f"        const float x{i} = in{i}[i];" for i in range(len(inputs))]
        src = "\n".join(head + [
            f"__kernel void pointwise_chain(int n, {params}, __global float* y) {{",
            "    GLOBAL_LOOP(i, n) {"] + loads + lines + [
            f"        y[i] = {result};", "    }", "}", ""])
        return inputs, src

    def _built(self, dev):
        """The generated program's name on ``dev``, built now; None where a
        driver refused it (``build_generated``)."""
        if self._failed:
            return None
        name = build_generated(dev, self.source, self.describe())
        self._failed = name is None
        return name

    def describe(self):
        names = self.net.graph.layer_names
        return " -> ".join(names[i] for i in self.layers) + " (one element-wise kernel)"

    def run(self):
        net = self.net
        self._reshape_members()
        for b in self.inputs:
            b.data_mem.to_device()
        n = self.y.count
        bufs = tuple(b.data_buffer() for b in self.inputs)
        key = (n, bufs, self.y.data_buffer())
        if key != self._key:
            dev = net.layers[self.first].device
            # reshaped apart, or not built: the layers one by one
            name = None if any(b.count != n for b in self.inputs) or n == 0 \
                else self._built(dev)
            if name is None:
                self.fwd = None
            else:
                gs, ls = work_size(dev, n)
                self.fwd = [dev.launch(name, "pointwise_chain", gs, ls,
                                       [n, *bufs, self.y.data_buffer()])]
            self._key = key
        if self.fwd is None:
            self._run_own_forwards()
            return
        q = net.layers[self.first].device.queue
        for launch in self.fwd:
            launch.run(q)
        self.y.data_mem.device_written()
        self._mark_pending()


# GPUs: the chain in the epilogue pays while the product is under one wave
# of 128 x 128 tiles (H100, bench_product_chain.py: 197 x 768 1.06x, 16 x
# 768 1.16x; 3136 x 768, 150 tiles on 132 units, 0.83x: the chain's
# registers in the GEMM kernel cost more than its own pass)
GPU_EPILOGUE_TILE = 128


def epilogue_pays(dev, M, N):
    """Whether an M x N product computes a chain in its epilogue on ``dev``
    (CPU drivers: always, 1.02-1.14x up to 3136 rows) rather than the
    chain running as its own kernel after it."""
    if not getattr(dev, "is_gpu", False):
        return True
    tiles = -(-M // GPU_EPILOGUE_TILE) * -(-N // GPU_EPILOGUE_TILE)
    return tiles < max(int(dev.compute_units), 1)


class ProductChain(PendingTops):
    """An InnerProduct and the chain reading its top (a transformer MLP's
    fc1 -> GELU) as the product's launches, the chain computed in the
    GEMM's epilogue (ops.gemm act ``("chain", code)``: act.h ACT 8) as it
    writes the chain's last top -- where that pays (``epilogue_pays``);
    else the product, then the chain as its own kernel (``tail``)."""
    traceable = True
    fuses_backward = False
    loses_values = False

    def __init__(self, net, ip, tail):
        g = net.graph
        self.net = net
        self.ip = ip
        self.tail = tail            # the chain as its own kernel (PointwiseChain)
        self.layers = [ip] + list(tail.layers)
        self.first, self.last = ip, self.layers[-1]
        self.x, self.y = g.bottoms[ip][0], g.tops[self.last][0]
        self._init_pending([t for lj in self.layers[:-1] for t in g.tops[lj]],
                           self.layers[:-1])
        head, lines, result = tail.code
        code = "\n".join(head + ["inline float gen_act(float x0) {"] + lines
                         + [f"    return {result};", "}"])
        self.act = ("chain", code)
        self._key = None
        self.fwd = None
        self._fused = True

    def describe(self):
        names = self.net.graph.layer_names
        return " -> ".join(names[i] for i in self.layers) + " (the chain in the product's epilogue)"

    def _compute_pending(self):
        super()._compute_pending()
        self.tail._compute_pending()        # what the chain's own kernel left pending

    def _build(self, ip, params):
        if self.y.count != self.net.graph.tops[self.ip][0].count or not self.y.count:
            return None
        try:
            return ip.forward_launches(self.x, self.y, params[0],
                                       params[1] if ip.bias_term else None, act=self.act,
                                       weight_version=ip.weight_version())
        except DeviceError as e:
            log.warning("%s: the product with the chain in its epilogue did not build on %s; "
                        "its layers run one by one (%s)", self.describe(), ip.device.name,
                        str(e).splitlines()[0])
            return None

    def run(self):
        self._reshape_members()
        ip = self.net.layers[self.ip]
        self.x.compute_pending()
        self.x.data_mem.to_device()
        for p in ip.blobs:              # the user may have written them on the host
            p.data_mem.to_device()
        params = tuple(p.data_buffer() for p in ip.blobs)
        key = (ip.reshape_count, tuple(self.y.shape), self.x.data_buffer(),
               self.y.data_buffer(), params)
        if key != self._key:
            self._fused = epilogue_pays(ip.device, ip.M, ip.num_output)
            self.fwd = self._build(ip, params) if self._fused else None
            self._key = key
        if not self._fused:         # the product, then the chain's own kernel
            self._unmark_pending()
            g = self.net.graph
            ip.forward(g.bottoms[self.ip], g.tops[self.ip])
            self.tail.run()
            return
        if self.fwd is None:
            self._run_own_forwards()
            return
        q = ip.device.queue
        for launch in self.fwd:
            launch.run(q)
        self.y.data_mem.device_written()
        self._mark_pending()


def _product_before(net, chain, taken, outputs, readers):
    """The index of an InnerProduct right before ``chain`` (a
    PointwiseChain) whose top is the chain's one input and read by nothing
    else, or None."""
    g = net.graph
    ip = chain.first - 1
    if ip < 0 or ip in taken or g.layer_types[ip] != "InnerProduct" \
            or not config.get("FUSE_PRODUCT_CHAIN"):
        return None
    layer = net.layers[ip]
    bots, tops = g.bottoms[ip], g.tops[ip]
    if len(bots) != 1 or len(tops) != 1 or tops[0] is bots[0] or tops[0].name in outputs \
            or not hasattr(layer, "forward_launches"):
        return None
    inside = set(chain.layers)
    if any(r not in inside for r in readers.get(id(tops[0]), ())):
        return None
    return ip if len(chain.inputs) == 1 and chain.inputs[0] is tops[0] else None


def find(net, taken=()):
    """[PointwiseChain / ProductChain] of ``net`` (TEST plan), none with a
    layer in ``taken``."""
    if not config.get("FUSE_POINTWISE"):
        return []
    g = net.graph
    outputs = set(g.outputs)
    readers = readers_of(g)
    out, li = [], 0
    while li < len(g.layers):
        lis = _chain_at(g, li, taken, outputs, readers)
        if lis:
            chain = PointwiseChain(net, lis)
            ip = _product_before(net, chain, taken, outputs, readers)
            out.append(chain if ip is None else ProductChain(net, ip, chain))
            li = lis[-1] + 1
        else:
            li += 1
    return out
