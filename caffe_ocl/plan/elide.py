"""TEST-phase rewrite: a producer followed by an activation that writes a
new top, the form ONNX exports and many model-zoo prototxts have:

    conv (with bias) -> "c";  ReLU "c" -> "r"   (not in place)

fold.py only folds activations that run in place on the producer's top.
Here the producer (a 2-D Convolution, not Deconvolution, or an
InnerProduct; one bottom, one top) writes the activation's output ``r``
straight from its GEMM epilogue (bias and activation applied there), one
pass over the output instead of three (the producer's write, the
activation's read and write). Its own top ``c`` is not computed: it is
computed when it is read (``Blob.compute_on_read``: ``net.blobs["c"].data``,
``host_data()``, ``forward(blobs=["c"])`` run the producer's own forward
then), so every blob holds Caffe's value when read.

The same for an Eltwise SUM of two blobs followed by an activation
writing a new top (``find_eltwise_pairs``; ONNX's Add -> Relu at a ResNet
block's end): one pass writes act(c0 * b0 + c1 * b1) into the
activation's top, the sum's top is computed when read.

What matches (``find_pairs``): the producer's top is read by the
activation only (no Split: a second reader would need it) and is no net
output; the activation (ReLU with any negative_slope, ReLU6, Clip; after a
producer also Sigmoid and Swish, where its epilogue applies them) has one
bottom and one top, a new blob; neither layer is in another group.

A forward range that cuts the pair (pycaffe ``start=``/``end=``) runs the
layers one by one: the activation alone first computes ``c`` if it is
pending. Before a backward the pending ``c`` is computed, so backward runs
layer by layer on Caffe's values (``before_backward``). ``CAFFE_OCL_FOLD=0``
/ ``fold=False`` turn this off with the folding.
"""
from ..ops import conv as conv_ops
from ..ops import pointwise
from .patterns import (LayerPair, act_of, consumers, inference_act_of, one_in_one_out,
                       producer_fuses)

_ACTS = ("ReLU", "ReLU6", "Clip")
# after a producer also these (its GEMM / depthwise epilogue applies them)
_PRODUCER_ACTS = _ACTS + ("Sigmoid", "Swish")


def producer_ok(layer):
    if layer.type == "Convolution":      # 2-D (ops/conv.py): N-D ones run ops/conv_nd.py
        return not layer.reverse and layer.spatial == 2
    return layer.type == "InnerProduct"


def find_pairs(net, taken=()):
    """[(producer index, activation index)]."""
    g = net.graph
    outputs = set(g.outputs)
    out = []
    for li in range(len(g.layers) - 1):
        j = li + 1
        if li in taken or j in taken or not producer_ok(g.layers[li]):
            continue
        if not (one_in_one_out(g, li) and one_in_one_out(g, j)):
            continue
        c, act = g.tops[li][0], g.layers[j]
        if c is g.bottoms[li][0] or c.name in outputs:
            continue
        if act.type not in _PRODUCER_ACTS or inference_act_of(act) is None \
                or not producer_fuses(g.layers[li], inference_act_of(act)):
            continue
        if g.bottoms[j][0] is not c or g.tops[j][0] is c:
            continue
        if consumers(g, c) != [(j, 0)]:
            continue
        out.append((li, j))
    return out


class PendingPair(LayerPair):
    """Two layers whose first one's top ``c`` is left to be computed on read
    (by the first layer's own forward); the group interface of
    execution.py plus ``run_member`` (a range cutting the pair) and
    ``before_backward``. Subclasses give ``run``."""
    traceable = True          # its run replays from a recorded pass (plan/trace.py)
    fuses_backward = False
    loses_values = False          # the pending top is computed before a backward

    def __init__(self, net, first, second):
        super().__init__(net, first, second)
        g = net.graph
        self.c = g.tops[first][0]
        self.r = g.tops[second][0]
        self._key = None
        self.fwd = []
        # concat.py: where the pair writes ``r`` instead (a slice of a
        # Concat's top), or None
        self.slice_target = None
        # dw_pointwise.py: the depthwise convolution (ops.conv1x1_few.DwInput)
        # whose output the producer computes as it reads its input, or None
        self.dw_input = None

    @property
    def out_blob(self):
        return self.r

    def _compute_c(self):
        g = self.net.graph
        self.net.layers[self.first].forward(g.bottoms[self.first], g.tops[self.first])

    def run_member(self, li):
        """Layer ``li``'s own forward in a range that cuts the pair."""
        g, layer = self.net.graph, self.net.layers[li]
        if self.slice_target is not None:     # its value from the last forward first
            self.slice_target.blob.compute_pending()
        if li == self.first:
            self.c.compute_on_read = None     # computed now
        else:
            self.c.compute_pending()
        layer.forward(g.bottoms[li], g.tops[li])

    def before_backward(self):
        self.c.compute_pending()


class ProducerActPair(PendingPair):
    """Producer -> activation into a new top, run as the producer's GEMM
    with the activation in its epilogue, writing the activation's top."""

    def __init__(self, net, p, a):
        super().__init__(net, p, a)
        self.act = inference_act_of(net.layers[a])
        self.producer = net.layers[p]
        self.x = net.graph.bottoms[p][0]

    def _build(self, params, layout):
        prod = self.producer
        w = params[0]
        b = params[1] if prod.bias_term else None
        if prod.type == "InnerProduct":
            self.fwd = prod.forward_launches(self.x, self.r, w, b, act=self.act,
                                             weight_version=prod.weight_version())
        elif layout is not None:        # into a slice of a Concat's top
            y, y_off, y_channels = layout
            self.fwd = conv_ops.forward(prod.device, prod.geom, self.x.data_buffer(), w, y,
                                        prod.col, b, act=self.act, y_off=y_off,
                                        y_channels=y_channels,
                                        weight_version=prod.weight_version(),
                                        dw_input=self.dw_input)
        else:
            self.fwd = conv_ops.forward(prod.device, prod.geom, self.x.data_buffer(), w,
                                        self.r.data_buffer(), prod.col, b, act=self.act,
                                        weight_version=prod.weight_version(),
                                        dw_input=self.dw_input)
        if self.x.count == 0 or self.r.count == 0:
            self.fwd = []

    def run_plain(self):
        """The pair's forward into ``r`` itself (a slice target's fallback)."""
        self.run(plain=True)

    def run(self, plain=False):
        self.reshape_second()           # the activation's top takes the new shape
        prod = self.producer
        target = self.slice_target
        layout = None if plain or target is None else target.layout()
        self.x.data_mem.to_device()
        for p in prod.blobs:            # the user may have written them on the host
            p.data_mem.to_device()
        params = tuple(p.data_buffer() for p in prod.blobs)
        key = (prod.reshape_count, self.x.data_buffer(), self.r.data_buffer(), params, layout,
               self.dw_input)
        if key != self._key:
            self._build(params, layout)
            self._key = key
        q = prod.device.queue
        for launch in self.fwd:
            launch.run(q)
        if layout is not None:
            target.written()
        else:
            if target is not None:
                target.release()
            self.r.data_mem.device_written()
        self.c.compute_on_read = self._compute_c


def find_eltwise_pairs(net, taken=()):
    """[(eltwise index, activation index)]: an Eltwise SUM of two distinct
    bottoms into a new top read only by a ReLU/ReLU6/Clip writing a new
    top (a ResNet block's end as ONNX exports it: Add -> Relu)."""
    g = net.graph
    out = []
    for li in range(len(g.layers) - 1):
        j = li + 1
        layer = g.layers[li]
        if li in taken or j in taken or layer.type != "Eltwise" or layer.op != layer.SUM:
            continue
        bots, tops = g.bottoms[li], g.tops[li]
        if len(bots) != 2 or len(tops) != 1 or bots[0] is bots[1] \
                or any(b is tops[0] for b in bots) or not one_in_one_out(g, j):
            continue
        s, act = tops[0], g.layers[j]
        if act.type not in _ACTS or act_of(act) is None:
            continue
        if g.bottoms[j][0] is not s or g.tops[j][0] is s or consumers(g, s) != [(j, 0)]:
            continue
        out.append((li, j))
    return out


class EltwiseActPair(PendingPair):
    """Eltwise SUM -> activation into a new top: one pass writing
    act(c0 * b0 + c1 * b1) into the activation's top; the sum's top is
    computed when read."""

    def __init__(self, net, e, a):
        super().__init__(net, e, a)
        self.eltwise = net.layers[e]
        self.bottoms = net.graph.bottoms[e]

    def run(self):
        self.reshape_second()
        elt = self.eltwise
        key = (elt.reshape_count, self.r.data_buffer(),
               tuple(b.data_buffer() for b in self.bottoms))
        if key != self._key:
            c0, c1 = elt.coeffs
            self.fwd = pointwise.sum2(elt.device, self.r.count, c0,
                                      self.bottoms[0].data_buffer(), c1,
                                      self.bottoms[1].data_buffer(), self.r.data_buffer(),
                                      self.act)
            self._key = key
        for b in self.bottoms:
            b.data_mem.to_device()
        self.fwd.run(elt.device.queue)
        self.r.data_mem.device_written()
        self.c.compute_on_read = self._compute_c


def pairs_of(net, taken=()):
    pairs = [ProducerActPair(net, p, a) for p, a in find_pairs(net, taken)]
    taken = set(taken) | {li for c in pairs for li in c.layers}
    return pairs + [EltwiseActPair(net, e, a) for e, a in find_eltwise_pairs(net, taken)]
