"""TEST-phase rewrite: an SE block's channel scale folded into the 1x1
convolution that reads it.

A squeeze-and-excitation block ends with a per-channel scale of its input
by the gate, ``s[n, c] = x[n, c] * g[n, c]`` (Caffe's ``Scale`` with the
gate as its second bottom: what onnx2caffe writes for the broadcast Mul of
torchvision's EfficientNet, MobileNet v3 and RegNet-Y -- axis 0 with a
(N, C) gate, or axis 1 with a (C,) gate at batch 1), and in these nets a
1x1 convolution reads ``s`` next (the projection). As ``W (g * x) = (W
diag(g)) x``, the convolution runs on ``x`` with the weights scaled by the
gate (Co x C floats, kernels/fold.cl ``scale_weight_columns``): the
Scale's pass over the block's largest blob (a read of ``x``, a write and a
read of ``s``) is gone. ``s`` is computed when read (the Scale's own
forward runs then), so it holds Caffe's value whenever looked at.

Only where one gate serves every image (batch 1, the deployment case, or a
gate shared by the batch): with one gate per image of several the layers
run one by one (per-image weights and a batched GEMM measured 1.5-2x
slower than the Scale's pass on the CPU: the images no longer fold into
one GEMM).

What matches (``find``): a Scale with two bottoms (``x`` 4-D, a gate with
one value per image and channel or per channel), no bias, writing a new
top read only by the next layer, a 2-D Convolution with one group, a 1x1
kernel, stride 1, no padding, one bottom and one top; neither in another
group. A forward range that cuts the pair computes the pending ``s`` and
runs the layers one by one; before a backward the pending ``s`` is
computed.

GPUs, where the few-outputs 1x1 kernel runs the convolution
(``ops.conv.takes_gate``: batch-1 projections of MobileNet v3,
EfficientNet, RegNet-Y): that kernel scales the block of weights it loads
by the gate itself (one gate per image or one for all), so the pair is one
launch instead of two, which is what counts where a batch-1 forward waits
on the host's enqueues. CPU drivers, where a channel-vector kernel runs
the projection (``ops.conv.chanvec_takes_gate``: 1x1 layers on planes of
up to 196 pixels -- the 14 x 14 and 7 x 7 projections of MobileNet v3,
EfficientNet, RegNet-Y): each work-item copies its panel of weights
scaled by the gate into local memory once, and the Scale's pass and
launch are gone (per layer 0.70-0.99 of their time with the Scale). On by
default (``CAFFE_OCL_SE_GATED_1X1``); a projection that also adds a
residual shortcut is taken the same way by plan/residual.py.

Elsewhere, the weights scaled by a separate launch: off by default
(``CAFFE_OCL_FUSE_SE_SCALE=1`` turns it on, with the folding): on the
CPU (Intel's runtime, converted RegNet-Y and EfficientNet-B0 at batch 1)
each fused pair timed alone ran faster than the Scale and the convolution
(0.10-0.21 ms against 0.32-0.41 ms), yet a whole forward ran slower (17
ms against 11 ms, RegNet-Y, one net per process). The weight-scaling
kernel is the cost (left out, the forward took 10.9 ms): ~0.5 ms a launch
inside a forward, 0.03-0.12 ms timed alone; not understood yet. On GPUs
the gated kernel above makes it moot where it runs.
"""
from .. import config
from ..ops import conv as conv_ops
from ..ops import work_size
from .elide import producer_ok
from .patterns import consumers, one_in_one_out


def gate_stride(x, gate):
    """The gate's floats per image (ops.conv.forward ``gate_stride``): 0
    where one gate serves every image."""
    return 0 if gate.count == x.shape[1] else x.shape[1]


def gated(conv):
    """Whether ``conv``'s kernel at its current shapes applies the gate
    itself (ops.conv.takes_gate)."""
    return conv_ops.takes_gate(conv.device, conv.geom)


def match(g, li, outputs):
    """Whether the Scale at ``li`` and the 1x1 Convolution after it form
    an SE channel scale and its projection (the module doc)."""
    if li + 1 >= len(g.layers) or g.layer_types[li] != "Scale" or g.layer_types[li + 1] \
            != "Convolution":
        return False
    scale, conv = g.layers[li], g.layers[li + 1]
    bots, tops = g.bottoms[li], g.tops[li]
    if len(bots) != 2 or len(tops) != 1 or scale.bias_term:
        return False
    x, gate, s = bots[0], bots[1], tops[0]
    if x.num_axes != 4 or s in (x, gate) or s.name in outputs:
        return False
    # one value per (image, channel) or per channel: the Scale's (outer,
    # scale, inner) split puts the planes in ``inner``
    outer, dim, inner = scale.dims
    if inner != x.shape[2] * x.shape[3] or outer * dim != x.shape[0] * x.shape[1]:
        return False
    if not (producer_ok(conv) and one_in_one_out(g, li + 1)) or g.bottoms[li + 1][0] is not s:
        return False
    if g.tops[li + 1][0] is s or consumers(g, s) != [(li + 1, 0)]:
        return False
    geom = conv.geom
    return geom.groups == 1 and geom.is_1x1 and (geom.dh, geom.dw) == (1, 1)


class SEScaleConv:
    """Scale(x, gate) -> 1x1 Convolution run as the convolution on ``x``
    with its weights scaled by the gate (by the convolution's own kernel
    where ``gated``, else by a launch of their own)."""
    traceable = True          # its run replays from a recorded pass (plan/trace.py)
    fuses_backward = False
    loses_values = False          # the pending top is computed before a backward

    def __init__(self, net, li):
        g = net.graph
        self.net = net
        self.layers = [li, li + 1]
        self.first, self.last = li, li + 1
        self.conv = net.layers[li + 1]
        self.x, self.gate = g.bottoms[li]
        self.s = g.tops[li][0]
        self.y = g.tops[li + 1][0]
        self._reader = self._compute
        # the weights scaled by a launch of their own where the kernel takes
        # no gate (FUSE_SE_SCALE, read when the plan is made)
        self.scale_weights = bool(config.get("FUSE_SE_SCALE"))
        self._key = None
        self._gated = None              # (conv's reshape_count, whether its kernel takes the gate)
        self._wbuf = None
        self.fwd = []

    def describe(self):
        names = self.net.graph.layer_names
        return f"{names[self.first]} -> {names[self.last]} (channel scale in the weights)"

    def _compute(self):
        if self.s.compute_on_read is self._reader:
            self.s.compute_on_read = None
        g = self.net.graph
        self.net.layers[self.first].forward(g.bottoms[self.first], g.tops[self.first])

    def _compute_pending(self):
        if self.s.compute_on_read is self._reader:
            self._compute()

    def run_member(self, li):
        """Layer ``li``'s own forward in a range that cuts the pair."""
        self._compute_pending()
        g = self.net.graph
        self.net.layers[li].forward(g.bottoms[li], g.tops[li])

    def before_backward(self):
        self._compute_pending()

    def _build(self, params):
        conv, dev = self.conv, self.conv.device
        M, K = conv.num_output, self.x.shape[1]
        total = M * K
        if self._wbuf is None or self._wbuf[0] < total:
            self._wbuf = (total, dev.alloc(4 * max(total, 1)))
        wbuf = self._wbuf[1]
        gs, ls = work_size(dev, total)
        bias = params[1] if conv.bias_term else None
        self.fwd = [dev.launch("fold.cl", "scale_weight_columns", gs, ls,
                               [total, total, K, params[0], self.gate.data_buffer(), wbuf])]
        self.fwd += conv_ops.forward(dev, conv.geom, self.x.data_buffer(), wbuf,
                                     self.y.data_buffer(), conv.col, bias)
        if self.x.count == 0:
            self.fwd = []

    def _build_gated(self, params):
        conv = self.conv
        bias = params[1] if conv.bias_term else None
        self.fwd = conv_ops.forward(conv.device, conv.geom, self.x.data_buffer(), params[0],
                                    self.y.data_buffer(), conv.col, bias,
                                    weight_version=conv.weight_version(),
                                    gate=self.gate.data_buffer(),
                                    gate_stride=gate_stride(self.x, self.gate))
        if self.x.count == 0:
            self.fwd = []

    def run(self):
        g, net = self.net.graph, self.net
        net.layers[self.last].reshape_if_needed(g.bottoms[self.last], g.tops[self.last])
        if self._gated is None or self._gated[0] != self.conv.reshape_count:
            # the algorithm rules, asked again only after a reshape
            self._gated = (self.conv.reshape_count, gated(self.conv))
        by_gate = self._gated[1]
        if not by_gate and (self.gate.count != self.x.shape[1] or not self.scale_weights):
            # no kernel taking the gate here, and weights scaled by their
            # own launch off or one gate per image of several (one weight
            # set per image measured slower than the Scale's pass): the
            # layers one by one
            self._compute_pending()
            self.s.compute_on_read = None
            for li in self.layers:
                net.layers[li].reshape_if_needed(g.bottoms[li], g.tops[li])
                net.layers[li].forward(g.bottoms[li], g.tops[li])
            return
        conv = self.conv
        for b in (self.x, self.gate):
            b.data_mem.to_device()
        for p in conv.blobs:            # the user may have written them on the host
            p.data_mem.to_device()
        params = tuple(p.data_buffer() for p in conv.blobs)
        key = (conv.reshape_count, by_gate, self.x.shape, self.gate.shape,
               self.x.data_buffer(), self.gate.data_buffer(), self.y.data_buffer(), params)
        if key != self._key:
            (self._build_gated if by_gate else self._build)(params)
            self._key = key
        q = conv.device.queue
        for launch in self.fwd:
            launch.run(q)
        self.y.data_mem.device_written()
        self.s.compute_on_read = self._reader


def find(net, taken=()):
    """[SEScaleConv] of ``net`` (TEST plan), none in ``taken``: every
    match with FUSE_SE_SCALE, else those whose convolution applies the
    gate itself (``gated``, SE_GATED_1X1)."""
    weights = config.get("FUSE_SE_SCALE")
    if not (weights or config.get("SE_GATED_1X1")):
        return []
    g = net.graph
    outputs = set(g.outputs)
    return [SEScaleConv(net, li) for li in range(len(g.layers) - 1)
            if li not in taken and li + 1 not in taken and match(g, li, outputs)
            and (weights or gated(net.layers[li + 1]))]
