"""TEST-phase rewrite: Swish/SiLU as ONNX-converted nets write it.

``x * sigmoid(x)`` arrives from ONNX (EfficientNet, MobileNet v3's SE
blocks, RegNet-Y) as three layers after the producer, the Split that Net
inserts because the producer's top has two readers:

    conv -> c;  Split c -> c0, c1;  Sigmoid c0 -> s;  Eltwise PROD (c1, s) -> y

(either Split top into the Sigmoid, the PROD's bottoms in either order).
The producer (a 2-D Convolution, depthwise ones included, or an
InnerProduct) writes ``y = c / (1 + exp(-c))`` straight from its epilogue
(ACT 3 of kernels/act.h): one pass over the output instead of four (the
producer's write, the Sigmoid's read and write, the product's two reads
and its write). ``c``, the Split's tops and ``s`` are computed when read
(``Blob.compute_on_read``: the producer, the Split and the Sigmoid run
then). A Winograd convolution keeps the layers (its output transform has
no swish).

What matches (``find``): the four layers consecutive in ``net.layers``,
the Split with two tops, ``c``, its Split's tops and ``s`` read by nothing
else and no net outputs, the PROD with two bottoms and no coefficients,
none of the layers in another group. A Caffe ``Swish`` layer (any beta)
after a producer is elide.py's and fold.py's (the same epilogue).

A forward range that cuts the group computes the pending blobs first and
then runs its layers one by one; before a backward the pending blobs are
computed (``before_backward``), so backward runs layer by layer on Caffe's
values. ``CAFFE_OCL_FOLD=0`` or ``CAFFE_OCL_FUSE_SWISH=0`` turn it off
(the latter also the Swish / Sigmoid epilogues of fold.py and elide.py).
"""
from .. import config
from ..ops import conv as conv_ops
from .elide import producer_ok
from .patterns import consumers, one_in_one_out

ACT = ("swish", 1.0)


def _match(g, li, outputs):
    """(split, sigmoid, prod) indices after producer ``li``, or None."""
    if li + 3 >= len(g.layers) or not producer_ok(g.layers[li]) or not one_in_one_out(g, li):
        return None
    sp, sg, pr = li + 1, li + 2, li + 3
    c = g.tops[li][0]
    if c is g.bottoms[li][0] or g.layer_types[sp] != "Split":
        return None
    if g.bottoms[sp] != (c,) or len(g.tops[sp]) != 2 or consumers(g, c) != [(sp, 0)]:
        return None
    c0, c1 = g.tops[sp]
    if g.layer_types[sg] != "Sigmoid" or not one_in_one_out(g, sg):
        return None
    if g.bottoms[sg][0] is c1:
        c0, c1 = c1, c0
    s = g.tops[sg][0]
    if g.bottoms[sg][0] is not c0 or s in (c0, c1):
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
    if consumers(g, c0) != [(sg, 0)] or consumers(g, s) != [(pr, g.bottoms[pr].index(s))] \
            or consumers(g, c1) != [(pr, g.bottoms[pr].index(c1))]:
        return None
    if any(b.name in outputs for b in (c, c0, c1, s)):
        return None
    layer = g.layers[li]
    if layer.type == "Convolution" and not conv_ops.fuses_act(layer.device, layer.geom, ACT):
        return None
    return sp, sg, pr


class SwishGroup:
    """Producer -> Split -> Sigmoid -> Eltwise PROD run as the producer
    with swish in its epilogue, writing the product's top."""
    fuses_backward = False
    loses_values = False          # the pending blobs are computed before a backward

    def __init__(self, net, li, sp, sg, pr):
        g = net.graph
        self.net = net
        self.layers = [li, sp, sg, pr]
        self.first, self.last = li, pr
        self.producer = net.layers[li]
        self.x = g.bottoms[li][0]
        self.y = g.tops[pr][0]
        # the blobs left to be computed on read: c, the Split's tops, s
        self.pending = [g.tops[li][0], *g.tops[sp], g.tops[sg][0]]
        self._reader = self._compute
        self._key = None
        self.fwd = []

    def describe(self):
        names = self.net.graph.layer_names
        return " -> ".join(names[i] for i in self.layers) + " (swish epilogue)"

    def _compute(self):
        """Run the producer, the Split and the Sigmoid into their tops."""
        for b in self.pending:
            if b.compute_on_read is self._reader:
                b.compute_on_read = None
        g = self.net.graph
        for li in self.layers[:3]:
            self.net.layers[li].forward(g.bottoms[li], g.tops[li])

    def _compute_pending(self):
        if any(b.compute_on_read is self._reader for b in self.pending):
            self._compute()

    def run_member(self, li):
        """Layer ``li``'s own forward in a range that cuts the group."""
        self._compute_pending()
        g = self.net.graph
        self.net.layers[li].forward(g.bottoms[li], g.tops[li])

    def before_backward(self):
        self._compute_pending()

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
                self.fwd = prod.forward_launches(self.x, self.y, w, b, act=ACT)
            else:
                self.fwd = conv_ops.forward(prod.device, prod.geom, self.x.data_buffer(), w,
                                            self.y.data_buffer(), prod.col, b, act=ACT)
            if self.x.count == 0 or self.y.count == 0:
                self.fwd = []
            self._key = key
        q = prod.device.queue
        for launch in self.fwd:
            launch.run(q)
        self.y.data_mem.device_written()
        for b in self.pending:
            b.compute_on_read = self._reader


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
        if m is not None and not any(i in taken for i in (li, *m)):
            out.append(SwishGroup(net, li, *m))
            li = m[-1] + 1
        else:
            li += 1
    return out
