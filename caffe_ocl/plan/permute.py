"""TEST-phase rewrite: a convolution or InnerProduct whose weight is a
permutation matrix runs as a channel gather.

A channel shuffle (ShuffleNet's Reshape -> Transpose -> Reshape) has no
BVLC layer, so converters write it as a bias-free 1x1 Convolution whose
weight is a 0/1 permutation matrix (``caffe_ocl onnx2caffe``, and the
Caffe model zoo ShuffleNets of other converters; an InnerProduct for 2-D
blobs). As a GEMM it costs C multiply-adds per output value (converted
ShuffleNet v2: 16 such convolutions, ~5.7 ms of a 14.5 ms forward on the
CPU); as a gather it is one copy: ``y[:, c] = x[:, perm[c]]``
(kernels/shape.cl ``gather_channels``, the source channel of each output
channel in an int buffer on the device).

What matches (``find``, from the graph): a 2-D Convolution (not
Deconvolution) with one bottom and one top (not in place), one group, a
1x1 kernel, stride 1, no padding and ``num_output`` equal to its input
channels; or an InnerProduct with one bottom and one top and ``num_output``
equal to its input size K (channels of the flattened axes); in no other
group (a convolution writing its top into a Concat's slice, concat.py,
stays a GEMM there: the pass runs after that one). Whether the weight
is a permutation is known only once the weights are loaded, so each forward checks the parameters' storage and
``SyncedMemory.version`` (as fold.py does for its folded weights) and,
when they changed (``copy_from``, a write to ``net.params[...].data``, a
solver update of a shared weight, ``share_data``), reads the weight back
to the host once and decides again (``permutation_of``): every entry
exactly 0 or 1, exactly one 1 in each row and each column, and no bias or
an all-zero bias. Otherwise the layer runs its own forward (a GEMM), so a
weight that stops being a permutation runs as a convolution again.

Values: the gather writes the layer's top in full and leaves every blob
as the layer would. On finite inputs the values are the GEMM's exactly
(``1 * x + 0 + ... + 0`` rounds to ``x``), except that the GEMM turns a
-0.0 input into +0.0 and spreads a NaN/Inf of any input channel to every
output channel (``0 * inf``), which the gather does not. Backward is not
touched (the layer's own; the top holds its value). Forward ranges always
cover the group (one layer). ``CAFFE_OCL_PERMUTE_GATHER=0`` (or the
folding off) turns it off.
"""
import logging

import numpy as np

from .. import config
from ..ops import shape as shape_ops
from .elide import producer_ok
from .patterns import one_in_one_out

log = logging.getLogger("caffe_ocl")


def permutation_of(weight, bias=None):
    """``perm`` (int32, one entry per output channel) when ``weight`` (a
    square matrix, row = output channel) is a permutation matrix, i.e.
    ``weight[c, perm[c]] == 1`` and every other entry is exactly 0, each
    column holding one 1, and ``bias`` is None or all zero; else None."""
    w = np.asarray(weight)
    if w.ndim != 2 or w.shape[0] != w.shape[1] or w.shape[0] == 0:
        return None
    if bias is not None and np.any(np.asarray(bias) != 0):
        return None
    ones = w == 1.0
    if not np.all(ones | (w == 0.0)):           # NaN fails both
        return None
    if not (np.all(ones.sum(axis=1) == 1) and np.all(ones.sum(axis=0) == 1)):
        return None
    return np.argmax(ones, axis=1).astype(np.int32)


def _match(g, li):
    layer = g.layers[li]
    if not (producer_ok(layer) and one_in_one_out(g, li)):
        return False
    x, y = g.bottoms[li][0], g.tops[li][0]
    if x is y or not layer.blobs:
        return False
    if layer.type == "InnerProduct":
        return layer.num_output == layer.K and layer.blobs[0].count == layer.K * layer.K
    geom = getattr(layer, "geom", None)
    return (geom is not None and geom.groups == 1 and geom.is_1x1
            and layer.num_output == geom.channels
            and layer.blobs[0].shape == (geom.channels, geom.channels, 1, 1))


class PermutationGather:
    """The layer at ``li``, run as ``y[:, c] = x[:, perm[c]]`` while its
    weight is a permutation matrix (``gathers``), else as itself."""
    traceable = True          # its run replays from a recorded pass (plan/trace.py)
    fuses_backward = False
    loses_values = False

    def __init__(self, net, li):
        g = net.graph
        self.net, self.li = net, li
        self.layers = [li]
        self.first = self.last = li
        self.layer = net.layers[li]
        self.x, self.y = g.bottoms[li][0], g.tops[li][0]
        self.perm = None              # host copy of the index buffer's contents
        self._perm_buf = None         # (channels, device int buffer)
        self._mems = None             # parameter memories at the last check
        self._versions = None
        self._key = None
        self.fwd = []

    @property
    def gathers(self):
        """Whether the weight (as last checked) is a permutation."""
        return self.perm is not None

    def describe(self):
        return (f"{self.net.graph.layer_names[self.li]} (a channel gather while its weight "
                "is a permutation)")

    def _check_weights(self):
        layer = self.layer
        mems = [p.data_mem for p in layer.blobs]
        versions = [m.version for m in mems]
        if (self._mems is not None and all(a is b for a, b in zip(mems, self._mems))
                and versions == self._versions):
            return
        self._mems, self._versions = mems, versions
        w = layer.blobs[0].host_data()          # planning work: once per weight change
        if layer.type == "InnerProduct":
            w = w.reshape(layer.K, layer.K) if layer.transpose else w.reshape(layer.K, -1)
            if layer.transpose:                 # stored (K, N): column c makes output c
                w = w.T
        else:
            w = w.reshape(w.shape[0], -1)
        bias = layer.blobs[1].host_data() if layer.bias_term and len(layer.blobs) > 1 else None
        perm = permutation_of(w, bias)
        was = self.perm is not None
        self.perm = perm
        self._key = None
        if perm is not None:
            dev = layer.device
            if self._perm_buf is None or self._perm_buf[0] != perm.size:
                self._perm_buf = (perm.size, dev.alloc(4 * perm.size))
            dev.upload(self._perm_buf[1], perm)
        if was != (perm is not None):
            log.info("%s runs as %s", self.net.graph.layer_names[self.li],
                     "a channel gather" if perm is not None else "itself (no permutation)")

    def _dims(self):
        layer = self.layer
        if layer.type == "InnerProduct":
            return layer.M, layer.K, 1
        geom = layer.geom
        return geom.num, geom.channels, geom.height * geom.width

    def run(self):
        layer, g = self.layer, self.net.graph
        self._check_weights()
        if self.perm is None:
            layer.forward(g.bottoms[self.li], g.tops[self.li])
            return
        x, y = self.x, self.y
        x.compute_pending()
        x.data_mem.to_device()
        key = (layer.reshape_count, x.data_buffer(), y.data_buffer(), self._perm_buf[1])
        if key != self._key:
            outer, C, S = self._dims()
            self.fwd = [shape_ops.gather_channels(layer.device, outer, C, S, self._perm_buf[1],
                                                  x.data_buffer(), y.data_buffer())]
            if x.count == 0:
                self.fwd = []
            self._key = key
        q = layer.device.queue
        for launch in self.fwd:
            launch.run(q)
        y.data_mem.device_written()


def find(net, taken=()):
    """[PermutationGather] of ``net`` (TEST plan): the candidate layers in
    no group of ``taken``; whether each gathers is decided at its forward."""
    if not config.get("PERMUTE_GATHER"):
        return []
    g = net.graph
    return [PermutationGather(net, li) for li in range(len(g.layers))
            if li not in taken and g.layer_types[li] in ("Convolution", "InnerProduct")
            and _match(g, li)]
