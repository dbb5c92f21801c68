"""TEST-phase rewrite: an SE block's channel scale folded into the 1x1
convolution that reads it.

A squeeze-and-excitation block ends with a per-image, per-channel scale of
its input, ``s[n, c] = x[n, c] * g[n, c]`` (Caffe's ``Scale`` with axis 0
and the gate as its second bottom: what onnx2caffe writes for the
broadcast Mul of torchvision's EfficientNet, MobileNet v3 and RegNet-Y),
and in these nets a 1x1 convolution reads ``s`` next (the projection). As
``W (g_n * x_n) = (W diag(g_n)) x_n``, the convolution runs on ``x`` with
per-image weights ``W diag(g_n)`` (N x Co x C floats, a small kernel:
kernels/fold.cl ``scale_weight_columns``) and one batched GEMM: the
Scale's pass over the block's largest blob (a read of ``x``, a write and
a read of ``s``) is gone. ``s`` is computed when read (the Scale's own
forward runs then), so it holds Caffe's value whenever looked at.

What matches (``find``): a Scale with two bottoms (``x`` 4-D, the gate
``g`` shaped (N, C)), axis 0, no bias, writing a new top read only by the
next layer, a 2-D Convolution with one group, a 1x1 kernel, stride 1, no
padding, one bottom and one top; neither in another group. A forward range
that cuts the pair computes the pending ``s`` and runs the layers one by
one; before a backward the pending ``s`` is computed. ``CAFFE_OCL_FOLD=0``
or ``CAFFE_OCL_FUSE_SE_SCALE=0`` turn it off.
"""
from .. import config
from ..ops import gemm as gemm_ops
from ..ops import work_size
from .elide import producer_ok
from .patterns import consumers, one_in_one_out


def _match(g, li, outputs):
    if li + 1 >= len(g.layers) or g.layer_types[li] != "Scale" or g.layer_types[li + 1] \
            != "Convolution":
        return False
    scale, conv = g.layers[li], g.layers[li + 1]
    bots, tops = g.bottoms[li], g.tops[li]
    if len(bots) != 2 or len(tops) != 1 or scale.bias_term:
        return False
    x, gate, s = bots[0], bots[1], tops[0]
    if x.num_axes != 4 or gate.shape != x.shape[:2] or s in (x, gate) or s.name in outputs:
        return False
    if x.canonical_axis(scale.param.scale_param.axis) != 0:
        return False
    if not (producer_ok(conv) and one_in_one_out(g, li + 1)) or g.bottoms[li + 1][0] is not s:
        return False
    if g.tops[li + 1][0] is s or consumers(g, s) != [(li + 1, 0)]:
        return False
    geom = conv.geom
    return geom.groups == 1 and geom.is_1x1 and (geom.dh, geom.dw) == (1, 1)


class SEScaleConv:
    """Scale(x, gate) -> 1x1 Convolution run as the convolution on ``x``
    with per-image weights scaled by the gate."""
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
        self._key = None
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
        N, K, H, W = self.x.shape
        M, hw = conv.num_output, H * W
        total = N * M * K
        if self._wbuf is None or self._wbuf[0] < total:
            self._wbuf = (total, dev.alloc(4 * max(total, 1)))
        wbuf = self._wbuf[1]
        gs, ls = work_size(dev, total)
        bias = params[1] if conv.bias_term else None
        self.fwd = [dev.launch("fold.cl", "scale_weight_columns", gs, ls,
                               [total, M * K, K, params[0], self.gate.data_buffer(), wbuf]),
                    gemm_ops.gemm(dev, M, hw, K, wbuf, self.x.data_buffer(),
                                  self.y.data_buffer(), batch=N, stride_a=(M * K, 0),
                                  stride_b=(K * hw, 0), stride_c=(M * hw, 0), bias=bias,
                                  bias_axis=0)]
        if self.x.count == 0:
            self.fwd = []

    def run(self):
        g, net = self.net.graph, self.net
        net.layers[self.last].reshape_if_needed(g.bottoms[self.last], g.tops[self.last])
        conv = self.conv
        for b in (self.x, self.gate):
            b.data_mem.to_device()
        for p in conv.blobs:            # the user may have written them on the host
            p.data_mem.to_device()
        params = tuple(p.data_buffer() for p in conv.blobs)
        key = (conv.reshape_count, self.x.shape, self.x.data_buffer(), self.gate.data_buffer(),
               self.y.data_buffer(), params)
        if key != self._key:
            self._build(params)
            self._key = key
        q = conv.device.queue
        for launch in self.fwd:
            launch.run(q)
        self.y.data_mem.device_written()
        self.s.compute_on_read = self._reader


def find(net, taken=()):
    """[SEScaleConv] of ``net`` (TEST plan), none in ``taken``."""
    if not config.get("FUSE_SE_SCALE"):
        return []
    g = net.graph
    outputs = set(g.outputs)
    return [SEScaleConv(net, li) for li in range(len(g.layers) - 1)
            if li not in taken and li + 1 not in taken and _match(g, li, outputs)]
