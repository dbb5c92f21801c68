"""TEST-phase rewrite: Concat in place.

A Concat along channels (axis 1) or images (axis 0) of 4-D blobs copies
each input into its slice of the top: one more pass over every input
(GoogLeNet's inception outputs, DenseNet's growing concats, SSD heads).
Here the convolution that computes an input writes it straight into its
slice of the Concat's top (``ops.conv.forward``'s ``y_off`` /
``y_channels``: its images lie ``C_total * H * W`` floats apart), and the
Concat copies only the inputs nobody wrote in place.

Which inputs (``find``): an input blob ``c`` of a Concat (two or more
distinct bottoms, a top that no other layer writes in place) whose unit
is

- a folded chain (chain.Chain: Convolution <- BatchNorm/Scale/activation
  in place), ``c`` its top;
- a Convolution -> activation pair writing a new top (elide.py), ``c``
  the activation's top;
- a lone 2-D Convolution (one bottom, one top) in no other group;

where the convolution's forward can write a slice (``ops.conv.
writes_slices``: the im2col / 1x1-GEMM paths, the implicit-GEMM
kernels and Winograd; depthwise, matrix-vector and grouped kernels
cannot, those inputs are copied as before), ``c`` is
read by the Concat alone (besides the unit's in-place layers), is no net
output and appears once among the Concat's bottoms.

Every blob still reads Caffe's value: ``c`` is not written; it is computed
when read (``Blob.compute_on_read``) by copying its slice out of the
Concat's top, or, when the top changed since (an in-place write from the
host), by running the unit again into ``c``. A forward range that cuts a
unit, or stops before its Concat (``forward_through``: the Concat's top
must keep its value then), runs the unit's layers one by one into ``c``
(the Concat then copies it);
the Concat copies any input whose slice is not fresh (shapes changed since
the plan was built: the first forward after a reshape writes ``c`` itself).
Before a backward (or ``net.unfold()``) the pending inputs are computed,
so backward runs layer by layer on Caffe's values (the Concat's backward
splits the top diff as before). ``CAFFE_OCL_FOLD=0`` (with the folding) or
``CAFFE_OCL_CONCAT_IN_PLACE=0`` turn it off.

Growing concats (``copy_groups``, TEST and TRAIN): a Concat whose first
``m`` >= 2 bottoms are an earlier Concat's bottoms (the same blobs or
Split tops of them, the same order and axis; torchvision's DenseNet
concatenates every feature so far in each dense layer) copies that
earlier top as one block plus its other inputs: one launch instead of one
per eight inputs. The earlier Concat notes, after each run, its top's and
bottoms' memory versions and its reshape count; the block is used only
while they are unchanged (no host write, no forward range that skipped
it after a change, no reshape since), else every input is copied.
``CAFFE_OCL_CONCAT_PREFIX=0`` turns it off.

Copies run up to eight inputs per launch (the layer's ``copies``,
ops.shape.multi_copy); consecutive Slices of one blob (Silence layers
between them: onnx2caffe's form of ONNX Split/Slice pairs) copy all their
tops together (SliceRun).
"""
import logging

from .. import config
from ..ops import conv as conv_ops
from ..ops import pointwise
from ..ops import shape as shape_ops
from .concat_chain import ConcatChain
from .elide import producer_ok
from .patterns import concat_axis, consumers, one_in_one_out, writers

log = logging.getLogger("caffe_ocl")


class SliceTarget:
    """Input ``k`` of the Concat at layer ``ci``, written by ``unit``
    (an object with ``run_plain()``: its forward into the blob itself)."""

    def __init__(self, net, ci, k, unit, pending=None):
        g = net.graph
        self.net, self.ci, self.k, self.unit = net, ci, k, unit
        self.top = g.tops[ci][0]
        self.blob = g.bottoms[ci][k]
        # the blobs left to be computed on read: the input, or, through a
        # Split (a growing chain's input read by every later Concat,
        # concat_chain.py), the Split's bottom and all its tops
        self.pending = list(pending) if pending else [self.blob]
        self.member = None          # the Concat's group where it is in a chain (concat_chain.py)
        self.axis = concat_axis(net.layers[ci], g.bottoms[ci][0])
        self._reader = self._read          # one bound method: compared by identity
        self._top_version = None
        self._conv = net.layers[unit.layers[0]]     # the convolution writing the slice
        self._slices_ok = (None, False)             # (its reshape_count, writes_slices)

    def _conv_writes_slices(self):
        """Whether the writing convolution's algorithm at its current shape
        writes into a slice (ops.conv.writes_slices). The plan asked at the
        shapes it was built for; a reshape can change the algorithm (a
        bigger batch took Winograd, which then wrote only whole blobs:
        GoogLeNet's 5x5 branches on a CPU going from batch 1 to 4 raised
        "cannot write into a slice").
        Asked again once per reshape of the convolution."""
        count = self._conv.reshape_count
        if self._slices_ok[0] != count:
            self._slices_ok = (count, conv_ops.writes_slices(self._conv.device,
                                                             self._conv.geom))
        return self._slices_ok[1]

    def layout(self):
        """(top buffer, y_off, y_channels) of the blob's slice for the
        current shapes, or None when they do not agree (mid-reshape) or
        the convolution's algorithm at these shapes writes only whole
        blobs (then it writes its own top and the Concat copies it)."""
        bots, top, ax = self.net.graph.bottoms[self.ci], self.top, self.axis
        if top.num_axes != 4 or not self._conv_writes_slices():
            return None
        if self.member is not None:     # a reshape it cannot keep: the top's own buffer first
            self.member.chain.check(self.member)
        total = 0
        for b in bots:
            if b.num_axes != 4 or any(b.shape[j] != top.shape[j] for j in range(4) if j != ax):
                return None
            total += b.shape[ax]
        if total != top.shape[ax] or top.count == 0:
            return None
        before = sum(b.shape[ax] for b in bots[:self.k])
        _, C, H, W = top.shape
        return top.data_buffer(), before * (H * W if ax == 1 else C * H * W), C

    # ---- state of the slice --------------------------------------------------
    def written(self):
        """The unit wrote the blob's value into its slice (not the blob)."""
        for b in self.pending:
            b.compute_on_read = self._reader
        self._top_version = self.top.data_mem.version

    def release(self):
        """The unit writes the blob itself (its value is no longer pending)."""
        for b in self.pending:
            if b.compute_on_read is self._reader:
                b.compute_on_read = None

    def fresh(self):
        """The slice holds the blob's current value, the blob is pending."""
        return (self.blob.compute_on_read is self._reader
                and self.top.data_mem.version == self._top_version)

    def trace_state(self):
        """(plan/trace.py) A function that, after a replayed pass, sets the
        state this pass left (the top's version at the last ``written()``,
        as an offset from the top's version at the pass's end: a replay
        moves versions as the pass did); called with False, forgets it."""
        if self._top_version is None:
            return None
        mem = self.top.data_mem
        off = mem.version - self._top_version

        def restore(valid=True):
            self._top_version = mem.version - off if valid else None
        return restore

    def _read(self):
        """Compute the pending blob: its slice copied out of the top, or,
        when the top changed since, the unit run again into the blob."""
        self.release()          # one read computes every blob sharing the value
        if self.top.data_mem.version != self._top_version:
            self.unit.run_plain()
            return
        layout = self.layout()
        b, dev = self.blob, self.top.data_mem.device
        outer = b.shape[0] if self.axis == 1 else 1
        cols = b.count // outer
        ld_top = self.top.count // outer
        pointwise.copy2d(dev, outer, cols, layout[0], layout[1], ld_top,
                         b.data_buffer(), 0, cols).run(dev.queue)
        b.data_mem.device_written()


class ConvUnit:
    """A lone Convolution writing its top into a Concat's slice (a group
    of one layer; ``run_plain`` its own forward)."""
    traceable = True          # its run replays from a recorded pass (plan/trace.py)
    fuses_backward = False
    loses_values = False

    def __init__(self, net, li):
        self.net, self.li = net, li
        self.layers = [li]
        self.first = self.last = li
        self.layer = net.layers[li]
        self.out_blob = net.graph.tops[li][0]
        self.slice_target = None
        self._key = None
        self.fwd = []

    def describe(self):
        return f"{self.net.graph.layer_names[self.li]} (into its Concat slice)"

    def run_plain(self):
        g = self.net.graph
        self.layer.forward(g.bottoms[self.li], g.tops[self.li])

    def run_member(self, li):
        """The convolution alone (a range that stops before the Concat)."""
        self.out_blob.compute_pending()
        self.run_plain()

    def run(self):
        layout = self.slice_target.layout()
        if layout is None:
            self.slice_target.release()
            self.run_plain()
            return
        conv, x = self.layer, self.net.graph.bottoms[self.li][0]
        x.data_mem.to_device()
        for p in conv.blobs:            # the user may have written them on the host
            p.data_mem.to_device()
        params = tuple(p.data_buffer() for p in conv.blobs)
        key = (conv.reshape_count, x.data_buffer(), params, layout)
        if key != self._key:
            y, y_off, y_channels = layout
            bias = params[1] if conv.bias_term else None
            self.fwd = conv_ops.forward(conv.device, conv.geom, x.data_buffer(), params[0], y,
                                        conv.col, bias, y_off=y_off, y_channels=y_channels,
                                        weight_version=conv.weight_version())
            if x.count == 0:
                self.fwd = []
            self._key = key
        q = conv.device.queue
        for launch in self.fwd:
            launch.run(q)
        self.slice_target.written()

    def before_backward(self):
        self.out_blob.compute_pending()


class ConcatInPlace:
    """The Concat at layer ``ci``: copies only the inputs whose slice is
    not fresh (``targets``: {bottom index: SliceTarget}); with a ``source``
    (an earlier Concat group whose bottoms are this one's first ``m``),
    the source's top as one block in place of those ``m`` inputs while it
    still holds their concatenation. The copies run several inputs per
    launch (ops.shape.multi_copy). Notes, after each run, the versions of
    its top and bottoms (``holds_inputs``: a later Concat's source)."""
    traceable = True          # its run replays from a recorded pass (plan/trace.py)
    fuses_backward = False
    loses_values = False

    def __init__(self, net, ci, targets, source=None, m=0):
        self.net, self.ci, self.targets = net, ci, targets
        self.source, self.m = source, m
        self.layers = [ci]
        self.first = self.last = ci
        self.layer = net.layers[ci]
        self.bottoms = net.graph.bottoms[ci]
        self.top = net.graph.tops[ci][0]
        self.fwd = []               # the launches of the last run
        self._launches, self._shapes = {}, None
        self._noted = None
        self._block = (None, None)
        self.axis = concat_axis(self.layer, self.bottoms[0])
        # concat_chain.py: the chain whose buffer the top shares, the
        # member before this one (its top is this top's start), how many
        # of the first inputs that is, and whether that input is the
        # earlier top itself (Caffe's form) rather than its inputs
        self.chain = self.chain_prev = None
        self.chain_prefix, self.chain_whole = 0, False
        self.chain_epoch = None         # blob.LAYOUT's epoch at the last check of the layout
        self.chain_pass = None          # the chain's pass this group last ran in (not shared yet)

    def describe(self):
        g = self.net.graph
        parts = []
        if self.targets:
            names = [g.bottoms[self.ci][k].name for k in sorted(self.targets)]
            parts.append(f"in place <- {', '.join(names)}")
        if self.chain_prev is not None and self.chain.alive:
            parts.append(f"after {self.chain_prev.top.name} in its buffer")
        if self.source is not None:
            parts.append(f"{self.source.top.name} as one block for its first {self.m} inputs")
        return f"{g.layer_names[self.ci]} {'; '.join(parts)}"

    def holds_top(self, succ):
        """(concat_chain.py) The top, current on the device, holds what
        chain member ``succ`` takes as its first inputs. Caffe's form
        (``succ`` reads this top itself): always -- only this Concat writes
        it on the device, and an upload from the host dissolves the chain
        (its Split's forward moves its version: not compared).
        torchvision's form (``succ`` reads the same inputs): while they and
        the top are unchanged since this group's run."""
        return succ.chain_whole or self.holds_inputs(self.top.shape)

    def holds_inputs(self, shape):
        """The top (of ``shape``) still holds the concatenation of the
        bottoms' current values: nothing wrote the top or a bottom since
        this group's last run (their memories' versions), nothing reshaped
        this layer since. The bottoms here are a later Concat's too, so
        none is one a plan computes on read."""
        noted = self._noted
        if noted is None:
            return False
        top_mem, top_version, reshapes, mems, versions = noted
        mem = self.top.data_mem
        # a reshape keeps the memories (and their versions) when it shrinks
        if mem is not top_mem or mem.version != top_version or self.top.shape != shape or \
                self.layer.reshape_count != reshapes:
            return False
        now = [b.data_mem for b in self.bottoms]
        return now == mems and [m.version for m in now] == versions

    def _block_shape(self):
        """The shape of the source's top that holds this Concat's first
        ``m`` inputs at their current shapes."""
        if self._block[0] != self.layer.reshape_count:
            bots, ax = self.bottoms, concat_axis(self.layer, self.bottoms[0])
            shape = list(bots[0].shape)
            shape[ax] = sum(b.shape[ax] for b in bots[:self.m])
            self._block = (self.layer.reshape_count, tuple(shape))
        return self._block[1]

    def _copies(self, copy, block):
        """Launches copying bottoms ``copy`` (indices, none of the first
        ``m`` with ``block``: the source's top in their place). Built per
        set of copies, for the current shapes: a bottom's buffer changes
        only with its shape, which reshapes this layer."""
        layer, bots = self.layer, self.bottoms
        shapes = (layer.reshape_count, self.top.data_buffer(),
                  self.source.top.data_buffer() if block else None)
        if shapes != self._shapes:
            self._launches.clear()
            self._shapes = shapes
        got = self._launches.get((copy, block))
        if got is None:
            _, _, cols = layer.layout
            pieces = []
            if block:
                pieces.append((self.source.top.data_buffer(),
                               sum(c for c, _ in cols[:self.m]), 0, 0))
            pieces += [(bots[k].data_buffer(), cols[k][0], 0, cols[k][1]) for k in copy]
            got = self._launches[(copy, block)] = layer.copies(pieces, self.top.data_buffer())
        return got

    def run(self):
        bottoms = self.bottoms
        if self.layer.layout is None:           # one bottom: the top is a view of it
            self.layer.forward(bottoms, [self.top])
            self._note()
            return
        start = 0
        if self.chain is not None:
            if self.chain_prev is not None and self.chain.prefix_in_place(self):
                start = self.chain_prefix       # the earlier top is this one's start
            else:
                self.chain.check(self)          # dissolved: every input copied below
        fresh = [k for k, t in self.targets.items() if t.fresh()] if self.targets else ()
        block = not start and self.source is not None and \
            self.source.holds_inputs(self._block_shape())
        first = start or (self.m if block else 0)
        copy = tuple(k for k in range(first, len(bottoms)) if k not in fresh)
        for k in copy:
            b = bottoms[k]
            if b.compute_on_read is not None:
                b.compute_pending()
            b.data_mem.to_device()
        if block:
            self.source.top.data_mem.to_device()
        self.fwd = self._copies(copy, block)
        q = self.layer.device.queue
        for launch in self.fwd:
            launch.run(q)
        self.top.data_mem.device_written()
        for k in fresh:
            self.targets[k].written()        # still fresh at the top's new version
        self._note()
        if self.chain is not None and self.chain.pending:
            self.chain.ran(self)

    def run_member(self, li):
        """The Concat alone (a forward range that stops inside its chain,
        concat_chain.py): the chain dissolved first, its inputs computed."""
        if self.chain is not None:      # the top keeps the buffer its launches bind
            self.chain.dissolve(keep=self.top.data_mem)
        for b in self.bottoms:
            if b.compute_on_read is not None:
                b.compute_pending()
        self.layer.forward(self.bottoms, [self.top])
        self._note()

    def unplan(self):
        """(execution.py, ``net.unfold()``) The Concat runs as a layer from
        now on: its chain's tops on buffers of their own."""
        if self.chain is not None:
            self.chain.dissolve()

    def _note(self):
        mems = [b.data_mem for b in self.bottoms]       # compared by identity
        self._noted = (self.top.data_mem, self.top.data_mem.version, self.layer.reshape_count,
                       mems, [m.version for m in mems])

    def trace_state(self):
        """(plan/trace.py) A function that, after a replayed pass, sets the
        state this pass left (its slice targets', and the versions
        ``holds_inputs`` compares, as offsets from the versions at the
        pass's end); called with False, forgets it."""
        parts = [f for f in (t.trace_state() for t in self.targets.values()) if f is not None]
        noted = self._noted
        if noted is not None:
            top_mem, top_version, reshapes, mems, versions = noted
            top_off = top_mem.version - top_version
            offs = [m.version - v for m, v in zip(mems, versions)]

            def restore_noted(valid=True):
                self._noted = (top_mem, top_mem.version - top_off, reshapes, mems,
                               [m.version - o for m, o in zip(mems, offs)]) if valid else None
            parts.append(restore_noted)

        def restore(valid=True):
            for f in parts:
                f(valid)
        return restore

    def before_backward(self):
        for t in self.targets.values():
            t.blob.compute_pending()


class SliceRun:
    """Consecutive Slice layers (Silence layers between them) reading the
    same data (Split tops of one blob; ONNX's Split or Slice pairs as
    onnx2caffe writes them, e.g. ShuffleNet v2's channel split): every top
    of them in one set of launches (ops.shape.multi_copy) instead of one
    per Slice. Falls back to the layers one by one when their bottoms'
    buffers or row layouts differ (shapes changed)."""
    traceable = True          # its run replays from a recorded pass (plan/trace.py)
    fuses_backward = False
    loses_values = False

    def __init__(self, net, layers):
        self.net, self.layers = net, list(layers)
        self.first, self.last = self.layers[0], self.layers[-1]
        g = net.graph
        self.slices = [li for li in self.layers if g.layers[li].type == "Slice"]
        self.fwd, self._key = [], None

    def describe(self):
        names = self.net.graph.layer_names
        return f"{' + '.join(names[li] for li in self.slices)} in one copy"

    def _plan(self):
        """The launches for the current shapes, or None (run one by one)."""
        net, g = self.net, self.net.graph
        key = tuple(net.layers[li].reshape_count for li in self.slices)
        if key == self._key:
            return self.fwd
        self._key, self.fwd = key, None
        first = net.layers[self.slices[0]]
        if first.layout is None:
            return None
        x = g.bottoms[self.slices[0]][0].data_buffer()
        outer, ld, _ = first.layout
        pieces = []
        for li in self.slices:
            layer = net.layers[li]
            if layer.layout is None or layer.layout[:2] != (outer, ld) or \
                    g.bottoms[li][0].data_buffer() is not x:
                return None
            pieces += [(t.data_buffer(), c, 0, d) for t, (c, d) in zip(g.tops[li], layer.layout[2])]
        self.fwd = shape_ops.multi_copy(first.device, outer, x, 0, ld, pieces, gather=False)
        return self.fwd

    def run(self):
        net, g = self.net, self.net.graph
        for li in self.layers[1:]:          # the net's loop reshaped the first
            net.layers[li].reshape_if_needed(g.bottoms[li], g.tops[li])
        launches = self._plan()
        if launches is None:
            for li in self.layers:
                net.layers[li].forward(g.bottoms[li], g.tops[li])
            return
        g.bottoms[self.first][0].data_mem.to_device()     # every Slice's: one memory
        q = net.layers[self.first].device.queue
        for launch in launches:
            launch.run(q)
        for li in self.slices:
            for t in g.tops[li]:
                t.data_mem.device_written()


def slice_runs(net, taken):
    """[SliceRun] of the runs of two or more Slice layers reading one
    blob's data (directly or through Split tops), with only Silence layers
    between them; ``CAFFE_OCL_CONCAT_PREFIX=0`` turns them off too."""
    if not config.get("CONCAT_PREFIX"):
        return []
    g = net.graph
    root = split_roots(g)
    out, run, run_root = [], [], None

    def flush():
        while run and g.layers[run[-1]].type != "Slice":
            run.pop()
        if sum(1 for li in run if g.layers[li].type == "Slice") >= 2:
            out.append(SliceRun(net, run))

    for li, layer in enumerate(g.layers):
        bots, tops = g.bottoms[li], g.tops[li]
        if li not in taken and layer.type == "Slice" and len(bots) == 1 and len(tops) >= 2 \
                and all(t is not bots[0] for t in tops):
            if run and root(bots[0]) == run_root:
                run.append(li)
            else:
                flush()
                run, run_root = [li], root(bots[0])
        elif run and li not in taken and layer.type == "Silence":
            run.append(li)
        else:
            flush()
            run = []
    flush()
    return out


def _unit_for(net, ci, k, groups, taken, later_reads=None):
    """(unit, pending blobs) for the unit that can write input ``k`` of the
    Concat at ``ci`` into its slice (a group of ``groups``, or a new
    ConvUnit), or None. With ``later_reads`` (a growing chain's member,
    concat_chain.py), the input may be a Split top of the unit's output
    whose other tops only later members read, within their first inputs
    (``later_reads(layer, bottom index)``): those take it in place."""
    g = net.graph
    c = g.bottoms[ci][k]
    x, pending = c, [c]
    found = writers(g, c)
    if later_reads is not None and len(found) == 1 and g.layers[found[0]].type == "Split" \
            and len(g.bottoms[found[0]]) == 1:
        si = found[0]
        x = g.bottoms[si][0]
        tops = list(g.tops[si])
        if any(t is x or writers(g, t) != [si] for t in tops):
            return None
        for t in tops:
            for lj, kk in consumers(g, t):
                if (lj, kk) != (ci, k) and not later_reads(lj, kk):
                    return None
        if si in taken or any(t.name in set(g.outputs) for t in tops):
            return None
        pending = [x] + tops
    unit = next((u for u in groups if getattr(u, "out_blob", None) is x
                 and hasattr(u, "slice_target")), None)
    if unit is None:
        found = writers(g, x)
        if len(found) != 1 or found[0] in taken:
            return None
        li = found[0]
        if not (g.layers[li].type == "Convolution" and producer_ok(g.layers[li])
                and one_in_one_out(g, li)) or g.bottoms[li][0] is x:
            return None
        unit = ConvUnit(net, li)
    layer = net.layers[unit.layers[0]]
    if layer.type != "Convolution" or unit.slice_target is not None:
        return None
    inside = set(unit.layers)
    if x is c:
        if any(lj not in inside and (lj, kk) != (ci, k) for lj, kk in consumers(g, c)):
            return None
    elif any(lj not in inside and g.layers[lj].type != "Split" for lj, _ in consumers(g, x)) \
            or len([lj for lj, _ in consumers(g, x) if lj not in inside]) != 1 \
            or x.name in set(g.outputs):
        return None
    if any(lj not in inside for lj in writers(g, x)):
        return None
    if not conv_ops.writes_slices(layer.device, layer.geom):
        return None
    return unit, pending


def split_roots(g):
    """root(blob) -> id of the blob whose data ``blob`` is (a Split's tops
    share their bottom's data)."""
    split_of = {}                   # id(top of a Split layer) -> the Split's bottom
    for li, layer in enumerate(g.layers):
        if layer.type == "Split" and len(g.bottoms[li]) == 1:
            split_of.update((id(t), g.bottoms[li][0]) for t in g.tops[li])

    def root(b):
        while id(b) in split_of:
            b = split_of[id(b)]
        return id(b)
    return root


def _prefix_sources(net, taken):
    """[(ci, pi, m)]: the Concat at ``pi`` < ``ci`` whose bottoms are the
    first ``m`` >= 2 bottoms of the Concat at ``ci`` (the same blobs or
    Split tops of them, the same order, the same axis; the longest such,
    then the latest), and whose top nobody else writes (torchvision's
    DenseNet: each layer's torch.cat of every feature so far)."""
    g = net.graph
    root = split_roots(g)
    cats = []
    for li, layer in enumerate(g.layers):
        if layer.type != "Concat" or li in taken or len(g.tops[li]) != 1:
            continue
        bots, top = g.bottoms[li], g.tops[li][0]
        if len(bots) < 2 or any(b is top for b in bots):
            continue
        cats.append((li, [root(b) for b in bots], concat_axis(net.layers[li], bots[0]),
                     writers(g, top) == [li]))
    out = []
    for j, (ci, ids, axis, _) in enumerate(cats):
        best = None
        for pi, pids, paxis, alone in cats[:j]:
            m = len(pids)
            if alone and paxis == axis and m <= len(ids) and ids[:m] == pids and \
                    (best is None or m >= best[1]):
                best = (pi, m)
        if best is not None:
            out.append((ci, *best))
    return out


def _chain_links(net, taken):
    """{ci: (pi, prefix, whole)}: the Concat at ``ci`` whose first
    ``prefix`` inputs the Concat at ``pi`` concatenates -- its inputs
    (torchvision's form, ``_prefix_sources``) or its top itself through
    Splits (Caffe's DenseNet form, ``whole``) -- along the same axis, 0 or
    1; both tops 4-D, no net output, written by no layer but their
    Concat (Splits of them aside). One later Concat per earlier one (the
    first): concat_chain.py shares their buffer."""
    g = net.graph
    root = split_roots(g)
    outputs = set(g.outputs)
    by_root = {}
    for li, layer in enumerate(g.layers):
        for t in g.tops[li]:
            by_root.setdefault(root(t), []).append((li, t))

    def candidate(li):
        layer = g.layers[li]
        if layer.type != "Concat" or li in taken or len(g.tops[li]) != 1:
            return False
        bots, top = g.bottoms[li], g.tops[li][0]
        if len(bots) < 2 or any(b is top for b in bots) or top.num_axes != 4 or \
                len({id(b) for b in bots}) != len(bots):
            return False
        if concat_axis(net.layers[li], bots[0]) not in (0, 1):
            return False
        for lj, t in by_root.get(root(top), ()):
            if t.name in outputs or (lj != li and g.layers[lj].type != "Split"):
                return False
        return True

    cats = [li for li in range(len(g.layers)) if candidate(li)]
    axis = {li: concat_axis(net.layers[li], g.bottoms[li][0]) for li in cats}
    top_root = {root(g.tops[li][0]): li for li in cats}
    links, has_next = {}, set()
    inputs_of = {ci: (pi, m) for ci, pi, m in _prefix_sources(net, taken)}
    for ci in cats:
        pi, prefix, whole = None, 0, False
        if ci in inputs_of and inputs_of[ci][0] in axis:
            pi, prefix = inputs_of[ci]
        else:
            pj = top_root.get(root(g.bottoms[ci][0]))
            if pj is not None and pj < ci:
                pi, prefix, whole = pj, 1, True
        if pi is None or pi in has_next or axis[pi] != axis[ci]:
            continue
        links[ci] = (pi, prefix, whole)
        has_next.add(pi)
    return links


def _chains(links):
    """[[ci, ...]]: the links' chains in layer order, two Concats or more."""
    nxt = {pi: ci for ci, (pi, _, _) in links.items()}
    out = []
    for head in sorted(nxt):
        if head in links:
            continue            # not a chain's first
        chain = [head]
        while chain[-1] in nxt:
            chain.append(nxt[chain[-1]])
        out.append(chain)
    return out


def _later_reads(member, links, sources, ci):
    """later_reads(layer, bottom index) for ``_unit_for``: a later member of
    the chain of the Concat at ``ci`` reading the blob within its first
    inputs (``member``: {layer: (chain number, position)}), or a Concat
    after the chain taking such a member's inputs first (``sources``:
    ``_prefix_sources`` as {layer: (earlier layer, m)}; its ConcatInPlace
    group copies the earlier top as a block, or computes the blob first)."""
    n, pos = member[ci]

    def later_reads(lj, kk):
        m = member.get(lj)
        if m is not None:
            return m[0] == n and m[1] > pos and kk < links[lj][1]
        if lj not in sources:
            return False
        pi, count = sources[lj]
        m = member.get(pi)
        return m is not None and m[0] == n and m[1] >= pos and kk < count
    return later_reads


def find(net, groups, taken):
    """[ConcatInPlace and new ConvUnit groups]; sets ``slice_target`` on the
    units of ``groups`` it uses. ``taken``: layer indices already in a group."""
    g = net.graph
    taken = set(taken)
    out, cats = [], {}
    links, chains, member, in_chain = {}, [], {}, set()
    if config.get("CONCAT_IN_PLACE") and config.get("CONCAT_SHARE"):
        links = _chain_links(net, taken)
        chains = _chains(links)
        in_chain = {ci for ch in chains for ci in ch}
        # new inputs written in place through their Split: only where the
        # chain shares its buffer from the start (a net built at one image).
        # One built at more shares after a whole pass at one image
        # (ConcatChain.ran), copying its new inputs (a blob left to be
        # computed from a slice would read another layout's floats after a
        # reshape without a forward)
        member = {ci: (n, pos) for n, ch in enumerate(chains) for pos, ci in enumerate(ch)
                  if ConcatChain.can_share(net, ch, links)}
        sources = {ci: (pi, m) for ci, pi, m in _prefix_sources(net, taken)}
    if config.get("CONCAT_IN_PLACE"):
        outputs = set(g.outputs)
        for ci, layer in enumerate(g.layers):
            if layer.type != "Concat" or ci in taken:
                continue
            bots, tops = g.bottoms[ci], g.tops[ci]
            if len(bots) < 2 or len(tops) != 1 or len({id(b) for b in bots}) != len(bots):
                continue
            top = tops[0]
            if any(b is top for b in bots) or writers(g, top) != [ci] or top.num_axes != 4:
                continue
            if concat_axis(net.layers[ci], bots[0]) not in (0, 1):
                continue
            later_reads = _later_reads(member, links, sources, ci) if ci in member else None
            targets = {}
            for k, c in enumerate(bots):
                if c.name in outputs:
                    continue
                found = _unit_for(net, ci, k, groups, taken, later_reads)
                if found is None:
                    continue
                unit, pending = found
                unit.slice_target = targets[k] = SliceTarget(net, ci, k, unit, pending)
                unit.forward_through = ci       # execution.py: fused only up to the Concat
                if isinstance(unit, ConvUnit):
                    out.append(unit)
                    taken.add(unit.li)
            if targets or ci in in_chain:
                cats[ci] = ConcatInPlace(net, ci, targets)
                taken.add(ci)
    groups_out = out + copy_groups(net, taken - set(cats), cats)
    for ch in chains:
        c = ConcatChain(net, [cats[ci] for ci in ch], links)
        if not c.attach():
            log.info("Concat chain %s: shared after a forward at one image", c.describe())
    return groups_out


def copy_groups(net, taken, cats=None):
    """The Concat groups (ConcatInPlace) of ``cats`` ({layer index: group},
    extended) and new ones in which a Concat copies an earlier Concat's top
    as one block (``source``) and that earlier Concat notes what it holds;
    the runs of Slices of one blob copied as one (SliceRun). TEST (find)
    and TRAIN (train.py): every blob keeps its value. Off with
    ``CAFFE_OCL_CONCAT_PREFIX=0``."""
    cats = dict(cats or {})
    if config.get("CONCAT_PREFIX"):
        for ci, pi, m in _prefix_sources(net, taken):
            for li in (pi, ci):
                if li not in cats:
                    cats[li] = ConcatInPlace(net, li, {})
            cats[ci].source, cats[ci].m = cats[pi], m
    return [cats[li] for li in sorted(cats)] + slice_runs(net, set(taken) | set(cats))
