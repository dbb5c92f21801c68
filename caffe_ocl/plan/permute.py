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
from .concat import SliceRun, concat_axis
from .elide import producer_ok
from .patterns import PendingTops, consumers, one_in_one_out, writers

log = logging.getLogger("caffe_ocl")


def upload_ints(dev, held, values):
    """(entries, device buffer) holding the int32 ``values``: ``held``'s
    buffer reused when it has as many entries (tables rewritten after a
    weight or shape change, not reallocated), else a new one."""
    values = np.ascontiguousarray(values, dtype=np.int32)
    if held is None or held[0] != values.size:
        held = (values.size, dev.alloc(4 * max(values.size, 1)))
    dev.upload(held[1], values)
    return held


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


# layer types a gather may stand for: a permutation matrix as a 1x1
# convolution or InnerProduct (converters' shuffles), and the forks'
# ShuffleChannel (farmingyard/ShuffleNet; a fixed permutation)
GATHER_TYPES = ("Convolution", "InnerProduct", "ShuffleChannel")


def shuffle_permutation(channels, group):
    """ShuffleChannel's gather: output channel j * group + i is input
    channel i * (channels / group) + j."""
    o = np.arange(channels)
    return ((o % group) * (channels // group) + o // group).astype(np.int32)


def _match(g, li):
    layer = g.layers[li]
    if layer.type == "ShuffleChannel":
        return one_in_one_out(g, li) and g.tops[li][0] is not g.bottoms[li][0]
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
        self._shuffle = None          # ShuffleChannel: (channels, group) of ``perm``
        self._key = None
        self.fwd = []

    @property
    def gathers(self):
        """Whether the weight (as last checked) is a permutation."""
        return self.perm is not None

    def describe(self):
        name = self.net.graph.layer_names[self.li]
        if self.layer.type == "ShuffleChannel":
            return f"{name} (a channel gather)"
        return f"{name} (a channel gather while its weight is a permutation)"

    def _check_weights(self):
        layer = self.layer
        if layer.type == "ShuffleChannel":     # no weight: the permutation of its group
            shuffle = (layer.dims[1], layer.group)
            if shuffle != self._shuffle:
                self._set_perm(shuffle_permutation(*shuffle))
                self._shuffle = shuffle
            return
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
        self._set_perm(permutation_of(w, bias))

    def _set_perm(self, perm):
        """The permutation (or None: the layer runs itself), on the device."""
        layer = self.layer
        was = self.perm is not None
        self.perm = perm
        self._key = None
        if perm is not None:
            self._perm_buf = upload_ints(layer.device, self._perm_buf, perm)
        if was != (perm is not None):
            log.info("%s runs as %s", self.net.graph.layer_names[self.li],
                     "a channel gather" if perm is not None else "itself (no permutation)")

    def _dims(self):
        layer = self.layer
        if layer.type == "ShuffleChannel":
            return layer.dims
        if layer.type == "InnerProduct":
            return layer.M, layer.K, 1
        geom = layer.geom
        return geom.num, geom.channels, geom.height * geom.width

    def inputs(self):
        """The blobs the gather reads."""
        return [self.x]

    def inputs_to_device(self):
        """The gather's inputs computed (another group may have left them
        to be read) and on the device."""
        for b in self.inputs():
            b.compute_pending()
            b.data_mem.to_device()

    def run(self):
        layer, g = self.layer, self.net.graph
        self._check_weights()
        if self.perm is None:
            layer.forward(g.bottoms[self.li], g.tops[self.li])
            return
        x, y = self.x, self.y
        self.inputs_to_device()
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
            if li not in taken and g.layer_types[li] in GATHER_TYPES
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
        when = "" if self.layer.type == "ShuffleChannel" else " while the weight is a permutation"
        return (f"{names[self.ci]} -> {names[self.li]} (one channel gather from the "
                f"Concat's inputs{when})")

    def inputs(self):
        return self.sources

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
        """gather_channels_multi's table (``gather_table``) on the device."""
        self._table = upload_ints(self.layer.device, self._table,
                                  gather_table(self.perm, [ch for _, ch in layout]))
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
        self.inputs_to_device()
        y = self.y
        key = (self.net.layers[self.ci].reshape_count, layer.reshape_count,
               tuple(buf for buf, _ in layout), y.data_buffer(), self._perm_buf[1])
        if key != self._key:
            n, c, h, w = self.x.shape
            table = self._table_buffer(layout)
            self.fwd = [shape_ops.gather_channels_multi(layer.device, n, c, h * w, table,
                                                        layout, [(y.data_buffer(), c)])]
            self._key = key
        q = layer.device.queue
        for launch in self.fwd:
            launch.run(q)
        y.data_mem.device_written()
        self._mark_pending()


def gather_table(perm, channels, rows=None):
    """gather_channels_multi's table (int32, 4 entries a row) for a
    gather ``y[:, c] = cat[:, perm[c]]`` where ``cat`` concatenates
    sources of ``channels`` channels: row r stores channel ``rows[r, 0]``
    of ``y`` as channel ``rows[r, 2]`` of destination ``rows[r, 1]``;
    ``rows`` None: y itself, the one destination, channel for channel."""
    perm = np.asarray(perm)
    if rows is None:
        c = np.arange(len(perm))
        rows = np.stack([c, np.zeros_like(c), c], axis=1)
    starts = np.cumsum([0] + list(channels))
    want = perm[rows[:, 0]]
    src = np.searchsorted(starts, want, side="right") - 1
    return np.stack([src, want - starts[src], rows[:, 1], rows[:, 2]],
                    axis=1).astype(np.int32).ravel()


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
        if li in taken or g.layer_types[li] not in GATHER_TYPES \
                or not _match(g, li):
            continue
        ci = match_concat(g, li, outputs)
        if ci is not None and ci not in taken:
            out.append(ConcatGather(net, ci, li))
    return out


class GatherSlices(PendingTops):
    """A channel gather (``ConcatGather`` or ``PermutationGather``) whose
    top only the Slices right after it read (ShuffleNet v2's channel
    shuffle -> channel split, which onnx2caffe writes as two Slice layers
    with a Silence for each unused half): while the weight is a
    permutation, the one gather launch writes every Slice top itself
    (``gather_table``'s destinations), so the Slices' copy launch goes.
    The gather's top (and a Concat's top before it) is not written but
    computed when read, by the gather group's own run. Where the shapes
    do not line up (Slices not along the channels of images, more than
    GATHER_SOURCES_MAX tops) or the weight is no permutation, the gather
    and the Slices run as before. ``CAFFE_OCL_GATHER_SLICES=0`` turns it
    off."""
    traceable = True          # its run replays from a recorded pass (plan/trace.py)
    fuses_backward = False
    loses_values = False

    def __init__(self, net, gather, slice_layers, views, slice_group=None):
        g = net.graph
        self.net, self.gather = net, gather
        self.slice_group = slice_group      # a SliceRun among the layers, if any
        self.slice_layers = list(slice_layers)
        self.slices = [li for li in self.slice_layers if g.layer_types[li] == "Slice"]
        self.layers = list(gather.layers) + self.slice_layers
        self.first, self.last = gather.first, self.slice_layers[-1]
        self.y = gather.y
        # the gather's top, the Split tops sharing its data, the Concat's top
        pending = list(views) + ([gather.x] if isinstance(gather, ConcatGather) else [])
        self._init_pending(pending, [])
        self._key, self._perm = None, None
        self._table = None            # (entries, device int buffer)
        self.fwd = []

    def describe(self):
        names = self.net.graph.layer_names
        return (f"{self.gather.describe()}, written into the tops of "
                f"{' + '.join(names[li] for li in self.slices)}")

    # ---- the groups as they would run --------------------------------------
    def _compute(self):
        """The gather's top and the Concat's, by the gather group's own run
        and what it leaves to be computed (a read computes one blob: both
        must be there)."""
        self._unmark_pending()
        self.gather.run()
        if isinstance(self.gather, ConcatGather):
            self.gather._compute_pending()

    def _run_apart(self):
        g, net = self.net.graph, self.net
        self._unmark_pending()
        self.gather.run()
        sr = self.slice_group
        for li in self.slice_layers:
            if sr is not None and li == sr.first:
                sr.run()
            elif sr is None or li not in sr.layers:
                net.layers[li].forward(g.bottoms[li], g.tops[li])

    def run_member(self, li):
        """Layer ``li``'s own forward in a range that cuts the group."""
        self._compute_pending()
        if li in self.gather.layers and hasattr(self.gather, "run_member"):
            self.gather.run_member(li)
            return
        g = self.net.graph
        self.net.layers[li].forward(g.bottoms[li], g.tops[li])

    def before_backward(self):
        self._compute_pending()
        if hasattr(self.gather, "before_backward"):
            self.gather.before_backward()

    # ---- the fused pass ----------------------------------------------------
    def _sources(self):
        """(images, channels, values a channel, [(buffer, channels)]) of the
        gather's input(s), or None where they do not line up."""
        gr = self.gather
        if isinstance(gr, ConcatGather):
            layout = gr._sources_layout()
            if layout is None:
                return None
            n, c, h, w = gr.x.shape
            return n, c, h * w, layout
        outer, c, s = gr._dims()
        return outer, c, s, [(gr.x.data_buffer(), c)]

    def _destinations(self, n, c, s):
        """([(top buffer, channels)], rows (channel of the gather's top,
        destination, its channel)) of the Slices' tops, or None where a
        Slice does not cut the images' channels or there are too many."""
        net, g = self.net, self.net.graph
        dests, rows = [], []
        for li in self.slices:
            layout = net.layers[li].layout
            if layout is None or layout[0] != n or layout[1] != c * s:
                return None
            for t, (cols, off) in zip(g.tops[li], layout[2]):
                if cols % s or off % s:
                    return None
                k = cols // s
                rows += [(off // s + j, len(dests), j) for j in range(k)]
                dests.append((t.data_buffer(), k))
        if not 1 <= len(dests) <= shape_ops.GATHER_SOURCES_MAX:
            return None
        return dests, np.array(rows, np.int64).reshape(-1, 3)

    def run(self):
        net, g = self.net, self.net.graph
        for li in self.layers[1:]:      # the net's loop reshaped the first layer only
            net.layers[li].reshape_if_needed(g.bottoms[li], g.tops[li])
        gr = self.gather
        gr._check_weights()
        src = None if gr.perm is None else self._sources()
        dst = None if src is None or src[0] * src[1] * src[2] == 0 \
            else self._destinations(*src[:3])
        if dst is None:
            self._run_apart()
            return
        n, c, s, layout = src
        dests, rows = dst
        gr.inputs_to_device()
        key = (tuple(net.layers[li].reshape_count for li in self.layers),
               tuple(buf for buf, _ in layout), tuple(buf for buf, _ in dests))
        if key != self._key or self._perm is not gr.perm:
            dev = gr.layer.device
            self._table = upload_ints(dev, self._table,
                                      gather_table(gr.perm, [ch for _, ch in layout], rows))
            self.fwd = [shape_ops.gather_channels_multi(dev, n, len(rows), s, self._table[1],
                                                        layout, dests)]
            self._key, self._perm = key, gr.perm
        q = gr.layer.device.queue
        for launch in self.fwd:
            launch.run(q)
        for li in self.slices:
            for t in g.tops[li]:
                t.data_mem.device_written()
        self._mark_pending()


def _slice_run(g, li, y, outputs):
    """(layers, views of ``y``) when the layers from ``li`` on are Split
    (of ``y`` or one of its Split tops), Slice and Silence layers, ending
    at a Slice, and every reader of ``y`` and of those Split tops is a
    Slice or Split among them; else None."""
    views, run = [y], []
    while li < len(g.layers) and g.layer_types[li] in ("Split", "Slice", "Silence"):
        bots = g.bottoms[li]
        if g.layer_types[li] == "Split":
            if len(bots) != 1 or not any(bots[0] is v for v in views):
                break
            views += list(g.tops[li])
        run.append(li)
        li += 1
    while run and g.layer_types[run[-1]] != "Slice":
        run.pop()
    members = set(run)
    for v in views:
        if v.name in outputs:
            return None
        for lj, k in consumers(g, v):
            if lj not in members or k != 0 or g.layer_types[lj] == "Silence":
                return None
    slices = [lj for lj in run if g.layer_types[lj] == "Slice"]
    if not slices or any(len(g.tops[lj]) < 2 or any(t is v for t in g.tops[lj] for v in views)
                         for lj in slices):
        return None
    return run, views


def gathers_into_slices(net, groups):
    """``groups`` with each channel gather group whose top only Slice
    layers right after it read (directly or through a Split; Silence
    layers between them) merged with those layers (and a SliceRun group
    of them, if any) into a GatherSlices."""
    if not config.get("GATHER_SLICES"):
        return groups
    g = net.graph
    outputs = set(g.outputs)
    of = {li: gr for gr in groups for li in gr.layers}
    merged, out = set(), []
    for gr in groups:
        if not isinstance(gr, PermutationGather):
            continue
        found = _slice_run(g, gr.last + 1, gr.y, outputs)
        if found is None:
            continue
        run, views = found
        others = {id(of[lj]) for lj in run if lj in of}
        slice_group = None
        if others:
            slice_group = next(of[lj] for lj in run if lj in of)
            if len(others) != 1 or not isinstance(slice_group, SliceRun) \
                    or not set(slice_group.layers) <= set(run):
                continue
            merged.add(id(slice_group))
        merged.add(id(gr))
        out.append(GatherSlices(net, gr, run, views, slice_group))
    return [c for c in groups if id(c) not in merged] + out
