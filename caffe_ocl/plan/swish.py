"""TEST-phase rewrite: Swish/SiLU, hard swish and hard sigmoid as
ONNX-converted nets write them, in the producer's epilogue.

``x * sigmoid(x)`` arrives from ONNX (EfficientNet, RegNet-Y's SE blocks)
as three layers after the producer, the Split that Net inserts because the
producer's top has two readers:

    conv -> c;  Split c -> c0, c1;  Sigmoid c0 -> s;  Eltwise PROD (c1, s) -> y

(either Split top into the gate, the PROD's bottoms in either order);
``x * hardsigmoid(x)`` (MobileNet v3's HardSwish) the same with the gate
``Power c0 -> m`` (power 1, scale a, shift b), ``Clip m -> s`` (0 .. 1);
MobileNet v3's SE gate a producer -> Power -> Clip (hard sigmoid).
The producer (a 2-D Convolution, depthwise ones included, or an
InnerProduct) writes the last layer's top straight from its epilogue
(ACT 3, 5, 6 of kernels/act.h): one pass over the output instead of four
to six. The blobs before it (``c``, the Split's tops, the gate's blobs) are
computed when read (``Blob.compute_on_read``: those layers run then). A
Winograd convolution keeps its layers (its output transform has none of
these activations).

What matches (``find``): the layers consecutive in ``net.layers``, the
Split with two tops, every blob before the last read by nothing but the
next layer of the group and no net output, the PROD with two bottoms and
no coefficients, none of the layers in another group. A Caffe ``Swish``
layer (any beta) or ``Sigmoid`` after a producer is elide.py's and
fold.py's (the same epilogue).

A forward range that cuts the group computes the pending blobs first and
then runs its layers one by one; before a backward the pending blobs are
computed (``before_backward``), so backward runs layer by layer on Caffe's
values. ``CAFFE_OCL_FOLD=0`` or ``CAFFE_OCL_FUSE_SWISH=0`` turn it off
(the latter also the Swish / Sigmoid epilogues of fold.py and elide.py).
"""
from .. import config
from ..ops import conv as conv_ops
from .elide import producer_ok
from .patterns import PendingTops, consumers, one_in_one_out

ACT = ("swish", 1.0)


def _hard_sigmoid(g, li, x):
    """(a, b, clip index) when layers li, li + 1 are ONNX's HardSigmoid as
    onnx2caffe writes it (Power with power 1, scale a, shift b into a new
    top, then Clip to [0, 1] into a new top) reading ``x``, else None."""
    if li + 1 >= len(g.layers) or g.layer_types[li] != "Power" or g.layer_types[li + 1] != "Clip":
        return None
    if not (one_in_one_out(g, li) and one_in_one_out(g, li + 1)) or g.bottoms[li][0] is not x:
        return None
    pw, clip = g.layers[li].param.power_param, g.layers[li + 1].param.clip_param
    mid = g.tops[li][0]
    if pw.power != 1.0 or (clip.min, clip.max) != (0.0, 1.0) or mid is x:
        return None
    if g.bottoms[li + 1][0] is not mid or g.tops[li + 1][0] in (mid, x) \
            or consumers(g, mid) != [(li + 1, 0)]:
        return None
    return float(pw.scale), float(pw.shift), li + 1


def _gate(g, j, x):
    """(act of x * gate(x), last gate layer) when the layers from ``j``
    compute gate(x) from ``x``: Sigmoid (-> swish) or HardSigmoid (-> hard
    swish), else None."""
    if g.layer_types[j] == "Sigmoid" and one_in_one_out(g, j) and g.bottoms[j][0] is x \
            and g.tops[j][0] is not x:
        return ACT, j
    hs = _hard_sigmoid(g, j, x)
    if hs is not None:
        return ("hardswish", hs[0], hs[1]), hs[2]
    return None


def _producer_fits(g, li, act):
    layer = g.layers[li]
    return layer.type != "Convolution" or conv_ops.fuses_act(layer.device, layer.geom, act)


def _match_product(g, li, outputs):
    """(act, layers after the producer) of producer -> Split -> gate ->
    Eltwise PROD (x * gate(x)) from layer ``li``, or None."""
    if li + 3 >= len(g.layers) or not producer_ok(g.layers[li]) or not one_in_one_out(g, li):
        return None
    sp = li + 1
    c = g.tops[li][0]
    if c is g.bottoms[li][0] or g.layer_types[sp] != "Split":
        return None
    if g.bottoms[sp] != (c,) or len(g.tops[sp]) != 2 or consumers(g, c) != [(sp, 0)]:
        return None
    c0, c1 = g.tops[sp]
    if g.bottoms[sp + 1][0] is c1:
        c0, c1 = c1, c0
    found = _gate(g, sp + 1, c0)
    if found is None:
        return None
    act, last_gate = found
    s = g.tops[last_gate][0]
    pr = last_gate + 1
    if pr >= len(g.layers) or s in (c0, c1):
        return None
    prod = g.layers[pr]
    if prod.type != "Eltwise" or prod.op != prod.PROD or len(g.tops[pr]) != 1 \
            or len(prod.param.eltwise_param.coeff):
        return None
    if set(map(id, g.bottoms[pr])) != {id(c1), id(s)} or len(g.bottoms[pr]) != 2:
        return None
    y = g.tops[pr][0]
    if y in (c, c0, c1, s):
        return None
    if consumers(g, c0) != [(sp + 1, 0)] or consumers(g, s) != [(pr, g.bottoms[pr].index(s))] \
            or consumers(g, c1) != [(pr, g.bottoms[pr].index(c1))]:
        return None
    if any(b.name in outputs for b in (c, c0, c1, s)) or not _producer_fits(g, li, act):
        return None
    return act, list(range(sp, pr + 1))


def _match_hard_sigmoid(g, li, outputs):
    """(act, layers after the producer) of producer -> HardSigmoid (the SE
    gate of MobileNet v3 as onnx2caffe writes it) from layer ``li``."""
    if li + 2 >= len(g.layers) or not producer_ok(g.layers[li]) or not one_in_one_out(g, li):
        return None
    c = g.tops[li][0]
    if c is g.bottoms[li][0] or c.name in outputs or consumers(g, c) != [(li + 1, 0)]:
        return None
    hs = _hard_sigmoid(g, li + 1, c)
    if hs is None or g.tops[li + 1][0].name in outputs:
        return None
    act = ("hardsigmoid", hs[0], hs[1])
    return (act, [li + 1, li + 2]) if _producer_fits(g, li, act) else None


def _match(g, li, outputs):
    return _match_product(g, li, outputs) or _match_hard_sigmoid(g, li, outputs)


class SwishGroup(PendingTops):
    """A producer and the layers after it that compute act(its output)
    (``act``: swish, hard swish, hard sigmoid), run as the producer with
    ``act`` in its epilogue writing the last layer's top."""
    traceable = True          # its run replays from a recorded pass (plan/trace.py)
    fuses_backward = False
    loses_values = False          # the pending blobs are computed before a backward

    def __init__(self, net, li, act, rest):
        g = net.graph
        self.net = net
        self.act = act
        self.layers = [li] + list(rest)
        self.first, self.last = li, self.layers[-1]
        self.producer = net.layers[li]
        self.x = g.bottoms[li][0]
        self.y = g.tops[self.last][0]
        # the blobs left to be computed on read: every top before the last
        self._init_pending([t for lj in self.layers[:-1] for t in g.tops[lj]], self.layers[:-1])
        self._key = None
        self.fwd = []

    def describe(self):
        names = self.net.graph.layer_names
        return " -> ".join(names[i] for i in self.layers) + f" ({self.act[0]} epilogue)"

    def run(self):
        g, net = self.net.graph, self.net
        for li in self.layers[1:]:      # the net's loop reshaped the producer
            net.layers[li].reshape_if_needed(g.bottoms[li], g.tops[li])
        prod = self.producer
        self.x.data_mem.to_device()
        for p in prod.blobs:            # the user may have written them on the host
            p.data_mem.to_device()
        params = tuple(p.data_buffer() for p in prod.blobs)
        key = (prod.reshape_count, self.x.data_buffer(), self.y.data_buffer(), params)
        if key != self._key:
            w, b = params[0], (params[1] if prod.bias_term else None)
            if prod.type == "InnerProduct":
                self.fwd = prod.forward_launches(self.x, self.y, w, b, act=self.act,
                                                 weight_version=prod.weight_version())
            else:
                self.fwd = conv_ops.forward(prod.device, prod.geom, self.x.data_buffer(), w,
                                            self.y.data_buffer(), prod.col, b, act=self.act,
                                            weight_version=prod.weight_version())
            if self.x.count == 0 or self.y.count == 0:
                self.fwd = []
            self._key = key
        q = prod.device.queue
        for launch in self.fwd:
            launch.run(q)
        self.y.data_mem.device_written()
        self._mark_pending()


def find(net, taken=()):
    """[SwishGroup] of ``net`` (TEST plan), none in ``taken``."""
    if not config.get("FUSE_SWISH"):
        return []
    g = net.graph
    outputs = set(g.outputs)
    out = []
    li = 0
    while li < len(g.layers):
        m = _match(g, li, outputs)
        if m is not None and not any(i in taken for i in [li] + m[1]):
            out.append(SwishGroup(net, li, *m))
            li = m[1][-1] + 1
        else:
            li += 1
    return out
