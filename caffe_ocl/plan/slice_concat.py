"""TEST-phase rewrite: a Concat of Slices of one blob along the same axis
as one gather.

``torch.roll`` (Swin's shifted windows) exports as two Slices and a Concat
per axis; onnx2caffe writes a Slice layer per piece (its other top to a
Silence) and a Concat: three launches and two passes over the tensor per
axis, 52 of Swin-T's launches. Any reordering or repetition of one blob's
runs along an axis is one gather: ``y[o][c][k] = x[o][idx[c]][k]``
(ops/shape.gather_axis_rows).

A *group* here is a run of consecutive layers (``net.layers`` order)
ending at a ``Concat`` whose every bottom is a top of a ``Slice`` of the
same blob (or of Split tops of it) along the Concat's axis, made by the
Slices in the run, each read only by the Concat; the run's other layers are those Slices and
``Silence`` layers taking their other tops. The Slices' tops are computed
when read, by their own forwards (plan/patterns.PendingTops). Values: the
same floats copied. ``CAFFE_OCL_FOLD=0`` or
``CAFFE_OCL_FUSE_SLICE_CONCAT=0`` turn it off.
"""
import numpy as np

from .. import config
from ..layers.ssd import int_buffer
from ..ops import shape as shape_ops
from .concat import split_roots
from .patterns import PendingTops, concat_axis, readers_of


class SliceConcat(PendingTops):
    """Layers ``layers`` (a group, see the module doc) run as one gather
    from the Slices' bottom into the Concat's top."""
    traceable = True          # its run replays from a recorded pass (plan/trace.py)
    fuses_backward = False
    loses_values = False      # the pending blobs are computed before a backward

    def __init__(self, net, lis, slices):
        g = net.graph
        self.net = net
        self.layers = list(lis)
        self.first, self.last = self.layers[0], self.layers[-1]
        self.slices = slices                      # layer indices of the Slices
        self.x = g.bottoms[slices[0]][0]
        self.y = g.tops[self.last][0]
        self._init_pending([t for lj in slices for t in g.tops[lj]], slices)
        self._key = None
        self.fwd = None

    def describe(self):
        names = self.net.graph.layer_names
        return " -> ".join(names[i] for i in self.layers) + " (one gather)"

    def _index(self):
        """idx[c] per output position along the axis, or None where the
        shapes do not agree (the layers then run one by one)."""
        g, net = self.net.graph, self.net
        cat = net.layers[self.last]
        ax = concat_axis(cat, g.bottoms[self.last][0])
        start = {}
        for lj in self.slices:
            layer = net.layers[lj]
            if getattr(layer, "axis", None) != ax:
                return None
            off = 0
            for t, size in zip(g.tops[lj], layer.sizes):
                start[id(t)] = (off, size)
                off += size
        idx = []
        for b in g.bottoms[self.last]:
            off, size = start[id(b)]
            idx.extend(range(off, off + size))
        return ax, idx

    def run(self):
        net = self.net
        self._reshape_members()
        key = (tuple(self.x.shape), tuple(self.y.shape), self.x.data_buffer(),
               self.y.data_buffer())
        if key != self._key:
            self.fwd = None
            found = self._index() if self.y.count else None
            if found is not None:
                ax, idx = found
                dev = net.layers[self.last].device
                self._idx = int_buffer(dev, np.asarray(idx, np.int32))
                self.fwd = shape_ops.gather_axis_rows(
                    dev, self.x.count_range(0, ax), len(idx), self.x.shape[ax],
                    self.x.count_range(ax + 1), self._idx, self.x.data_buffer(),
                    self.y.data_buffer())
            self._key = key
        if self.fwd is None:
            self._run_own_forwards()
            return
        self.x.data_mem.to_device()
        self.fwd.run(net.layers[self.last].device.queue)
        self.y.data_mem.device_written()
        self._mark_pending()


def find(net, taken=()):
    """[SliceConcat] of ``net`` (TEST plan), none with a layer in ``taken``."""
    if not config.get("FUSE_SLICE_CONCAT"):
        return []
    g = net.graph
    outputs = set(g.outputs)
    readers, maker = readers_of(g), {}
    for lj, tops in enumerate(g.tops):
        for t in tops:
            maker[id(t)] = lj
    root = split_roots(g)       # a Split's tops are its bottom's memory
    out = []
    for ci, t in enumerate(g.layer_types):
        if t != "Concat" or ci in taken or len(g.tops[ci]) != 1 or len(g.bottoms[ci]) < 2:
            continue
        bots = g.bottoms[ci]
        slices = sorted({maker.get(id(b), -1) for b in bots})
        if slices[0] < 0 or any(g.layer_types[s] != "Slice" or s in taken for s in slices):
            continue
        x = g.bottoms[slices[0]][0]
        if any(root(g.bottoms[s][0]) != root(x) for s in slices) or any(
                b.name in outputs or readers.get(id(b)) != [ci] for b in bots):
            continue
        # the run from the first Slice: those Slices, Silences of their
        # other tops, the Concat
        spare = {id(tp) for s in slices for tp in g.tops[s]} - {id(b) for b in bots}
        ok = True
        for lj in range(slices[0], ci):
            if lj in slices:
                continue
            if lj in taken or g.layer_types[lj] != "Silence" or any(
                    id(b) not in spare for b in g.bottoms[lj]):
                ok = False
                break
        if not ok or any(any(r not in range(slices[0], ci) or g.layer_types[r] != "Silence"
                             for r in readers.get(sid, ())) for sid in spare):
            continue
        if any(tp.name in outputs for s in slices for tp in g.tops[s]):
            continue
        grp = SliceConcat(net, list(range(slices[0], ci + 1)), slices)
        if grp._index() is None:
            continue
        out.append(grp)
    return out
