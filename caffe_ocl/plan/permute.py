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
from .concat import concat_axis
from .elide import producer_ok
from .patterns import PendingTops, consumers, one_in_one_out, writers

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


class ConcatGather(PendingTops, PermutationGather):
    """A Concat along channels whose top only a permutation layer reads
    (ShuffleNet's concat -> channel shuffle), run while the weight is a
    permutation as one gather from the Concat's inputs: ``y[:, c]`` is
    channel ``perm[c]`` of the concatenation, read from the input holding
    it (kernels/shape.cl ``gather_channels_multi``), so the Concat's top is
    not written. It is computed when read (``Blob.compute_on_read``) by
    the Concat's own forward from its inputs, which nothing writes after
    the Concat (``match_concat``); a forward range cutting the group and a
    backward compute it first (patterns.PendingTops). Otherwise (not a
    permutation, shapes that do not line up) both layers run as
    themselves. ``CAFFE_OCL_CONCAT_GATHER=0`` turns it off."""

    def __init__(self, net, ci, li):
        PermutationGather.__init__(self, net, li)
        self.ci = ci
        self.layers = [ci, li]
        self.first = ci
        self.sources = list(net.graph.bottoms[ci])
        self._init_pending([self.x], [ci])
        self._table = None            # (entries, device int buffer)

    def describe(self):
        names = self.net.graph.layer_names
        return (f"{names[self.ci]} -> {names[self.li]} (one channel gather from the "
                "Concat's inputs while the weight is a permutation)")

    def _sources_layout(self):
        """[(buffer, channels)] of the inputs when they and the Concat's top
        line up along channels for the current shapes, else None."""
        x = self.x
        if x.num_axes != 4 or x.count == 0:
            return None
        n, c, h, w = x.shape
        out = []
        for b in self.sources:
            if b.num_axes != 4 or b.shape[0] != n or tuple(b.shape[2:]) != (h, w):
                return None
            out.append((b.data_buffer(), b.shape[1]))
        return out if sum(ch for _, ch in out) == c else None

    def _table_buffer(self, layout):
        """The (source, channel) of each output channel, on the device."""
        starts = np.cumsum([0] + [ch for _, ch in layout])
        src = np.searchsorted(starts, self.perm, side="right") - 1
        table = np.stack([src, self.perm - starts[src]], axis=1).astype(np.int32).ravel()
        dev = self.layer.device
        if self._table is None or self._table[0] != table.size:
            self._table = (table.size, dev.alloc(4 * table.size))
        dev.upload(self._table[1], table)
        return self._table[1]

    def _run_layers(self):
        self._unmark_pending()
        g, net = self.net.graph, self.net
        net.layers[self.ci].forward(g.bottoms[self.ci], g.tops[self.ci])
        self.layer.forward(g.bottoms[self.li], g.tops[self.li])

    def run(self):
        g, layer = self.net.graph, self.layer
        # the net's loop reshaped the Concat (the group's first layer) only
        layer.reshape_if_needed(g.bottoms[self.li], g.tops[self.li])
        self._check_weights()
        layout = None if self.perm is None else self._sources_layout()
        if layout is None:
            self._run_layers()
            return
        for b in self.sources:
            b.compute_pending()
            b.data_mem.to_device()
        y = self.y
        key = (self.net.layers[self.ci].reshape_count, layer.reshape_count,
               tuple(buf for buf, _ in layout), y.data_buffer(), self._perm_buf[1])
        if key != self._key:
            n, c, h, w = self.x.shape
            table = self._table_buffer(layout)
            self.fwd = [shape_ops.gather_channels_multi(layer.device, n, c, h * w, table,
                                                        layout, y.data_buffer())]
            self._key = key
        q = layer.device.queue
        for launch in self.fwd:
            launch.run(q)
        y.data_mem.device_written()
        self._mark_pending()


def match_concat(g, li, outputs):
    """Index of the Concat whose top the candidate layer ``li`` alone reads,
    directly before it, along channels, with 2 to GATHER_SOURCES_MAX
    distinct 4-D inputs that no layer writes after it; else None."""
    ci = li - 1
    x = g.bottoms[li][0]
    if ci < 0 or g.layer_types[ci] != "Concat" or len(g.tops[ci]) != 1 \
            or g.tops[ci][0] is not x or x.name in outputs:
        return None
    bots = g.bottoms[ci]
    if not 2 <= len(bots) <= shape_ops.GATHER_SOURCES_MAX \
            or len({id(b) for b in bots}) != len(bots) or any(b is x for b in bots):
        return None
    if any(b.num_axes != 4 for b in bots) or x.num_axes != 4 \
            or concat_axis(g.layers[ci], bots[0]) != 1:
        return None
    if writers(g, x) != [ci] or consumers(g, x) != [(li, 0)]:
        return None
    if any(writers(g, b, ci) for b in bots):
        return None
    return ci


def concat_gathers(net, taken=()):
    """[ConcatGather] of ``net`` (TEST plan): candidate permutation layers
    (as ``find``) reading a Concat's top (``match_concat``), neither layer
    in a group of ``taken``. Found before the Concats in place (concat.py),
    which would otherwise write this Concat's top."""
    if not (config.get("PERMUTE_GATHER") and config.get("CONCAT_GATHER")):
        return []
    g = net.graph
    outputs = set(g.outputs)
    out = []
    for li in range(len(g.layers)):
        if li in taken or g.layer_types[li] not in ("Convolution", "InnerProduct") \
                or not _match(g, li):
            continue
        ci = match_concat(g, li, outputs)
        if ci is not None and ci not in taken:
            out.append(ConcatGather(net, ci, li))
    return out
