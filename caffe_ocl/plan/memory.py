"""Memory plans for a Net: which blobs may share device storage.

Caffe gives every blob its own data and its own diff. In training the
activation diffs are as big as the activations, yet each one is only needed
for a short stretch of the backward pass: a blob's diff is written by the
backward of the layer that consumes the blob and read, for the last time,
by the backward of the layer that produced it. Two diffs whose stretches do
not overlap can use one buffer (``DiffPlan``); for ResNet-50 this turns
"one diff per activation" into a few activation-sized buffers.

What stays private (its own diff, as in Caffe):
- parameter diffs (the solver reads them after backward) — never planned;
- net inputs and outputs (pycaffe ``backward()`` reads/writes them) and
  loss tops (their diff holds the loss weight, seeded at reshape);
- a diff whose first use in backward order is a *read*: nobody writes it
  (e.g. the consumer has ``propagate_down: false`` or runs no backward), so
  the reader relies on the zeros it was created with;
- diffs touched by Python layers (user code may accumulate into them).

A planned diff is an overwrite before its first read, so sharing gives
bitwise the same results. The catch is that after a step, intermediate
blob diffs hold whatever the last user of their buffer left: that is why
the plan is on by default only for nets built by a Solver
(``share_diffs_default``), and pycaffe ``Net`` keeps Caffe's behaviour
unless ``Net(..., share_diffs=True)`` / ``net.set_share_diffs(True)``.
``CAFFE_OCL_SHARE_DIFFS=0`` turns it off; ``debug_info`` (which prints
per-blob diffs) turns it off too.

Also here: ``bn_for_scale``, the in-place BatchNorm -> Scale pair's one
saved copy of the normalized input (see there).
"""
import logging

from .. import config
from ..blob import SyncedMemory

log = logging.getLogger("caffe_ocl")

ENV = "CAFFE_OCL_SHARE_DIFFS"


def share_diffs_default(solver_param=None, net_param=None):
    """Whether a Solver's train net shares activation diffs: yes unless
    CAFFE_OCL_SHARE_DIFFS=0 or debug_info (solver or net) asks for the
    per-blob diffs."""
    if not config.get("SHARE_DIFFS"):
        return False
    for p in (solver_param, net_param):
        if p is not None and p.debug_info:
            return False
    return True


def best_fit(free, caps, need):
    """The buffer for a user of ``need`` among the ``free`` indices of
    ``caps`` (buffer sizes): the smallest that fits, else the largest free
    one grown to ``need``, else a new one appended to ``caps``."""
    fits = [s for s in free if caps[s] >= need]
    if fits:
        return min(fits, key=lambda s: caps[s])
    if free:
        s = max(free, key=lambda s: caps[s])
        caps[s] = need
        return s
    caps.append(need)
    return len(caps) - 1


class _Group:
    """Blobs sharing one diff storage already (views: Flatten/Reshape, or a
    one-bottom Concat), with the layers whose backward touches it."""
    __slots__ = ("blobs", "lo", "hi", "private", "first_is_write")

    def __init__(self):
        self.blobs = []
        self.lo = self.hi = None
        self.private = False
        self.first_is_write = False

    @property
    def count(self):
        return max(b.count for b in self.blobs)

    def touch(self, li, write):
        if self.hi is None or li > self.hi:
            self.hi, self.first_is_write = li, write
        elif li == self.hi:
            self.first_is_write = self.first_is_write and write
        if self.lo is None or li < self.lo:
            self.lo = li


def diff_groups(net):
    """[_Group] of the net's non-parameter blobs, with their backward stretch
    [lo, hi] in layer indices (backward runs hi -> lo) and ``private`` set
    where sharing would change results."""
    graph = net.graph
    params = {id(b) for layer in graph.layers for b in layer.blobs}
    groups = {}

    def group(blob):
        g = groups.get(id(blob.diff_mem))
        if g is None:
            g = groups[id(blob.diff_mem)] = _Group()
        if all(b is not blob for b in g.blobs):
            g.blobs.append(blob)
        return g

    for blob in graph.blobs.values():
        if id(blob) not in params:
            group(blob)
    keep = set(graph.inputs) | set(graph.outputs)
    for li, layer in enumerate(graph.layers):
        tops, bottoms = graph.tops[li], graph.bottoms[li]
        python = layer.type == "Python"
        for t, w in zip(tops, layer.loss_weights):
            if w or python:
                group(t).private = True
        for b in bottoms:
            if python:
                group(b).private = True
        if not graph.layer_need_backward[li]:
            continue
        # Order matters within one layer: the tops are read (in place, the
        # same storage is then written), so a storage that is a top here is
        # not "first written" here.
        top_groups = {id(group(t)) for t in tops}
        for t in tops:
            group(t).touch(li, write=False)
        for b, need in zip(bottoms, graph.bottom_need_backward[li]):
            if need:
                g = group(b)
                g.touch(li, write=id(g) not in top_groups)
    # a fused backward that writes a diff at its last layer though the
    # unfused layer writing it comes later in the backward order (a group
    # with other layers between its members, train.NewTopResidualTail)
    plan = getattr(net, "plan", None)
    for c in (plan.train_groups if plan is not None else ()):
        if getattr(c, "fuses_backward", True):
            for blob, write in getattr(c, "diff_touches", ()):
                group(blob).touch(c.last, write)
    out = []
    for g in groups.values():
        if any(b.name in keep and graph.blobs.get(b.name) is b for b in g.blobs):
            g.private = True
        if g.hi is None:
            continue              # backward never touches it: never allocated
        if not g.first_is_write:
            g.private = True
        out.append(g)
    return out


class DiffPlan:
    """Activation diffs of ``net`` put into shared buffers by liveness in the
    backward order. ``planned_bytes``: the shared buffers; ``unplanned_bytes``:
    what the same diffs cost one buffer each (both computed, not measured)."""

    def __init__(self, net):
        self.net = net
        self.slots = []
        self.planned_bytes = self.unplanned_bytes = 0
        self.groups = []
        self.version = 0           # counts the plannings (fused groups cache on it)
        self._key = None
        self.apply()

    def _shape_key(self):
        return tuple(b.count for b in self.net.graph.blobs.values())

    def apply(self):
        net = self.net
        # a Split top whose gradient goes straight into the Split's bottom
        # (train.SplitConvBackward) shares the bottom's diff
        for top, bottom in net.plan.diff_shares:
            if top.count == bottom.count:
                top.use_diff_memory(bottom.diff_mem)
        groups = [g for g in diff_groups(net) if not g.private]
        # Interval colouring in backward order: at layer L, first give a
        # buffer to the diffs that start at L (hi == L), then release those
        # that end at L (lo == L). Best fit by size; a too-small free buffer
        # grows (its size is the largest of its users).
        starts, ends = {}, {}
        for g in groups:
            starts.setdefault(g.hi, []).append(g)
            ends.setdefault(g.lo, []).append(g)
        caps, free, assign = [], [], {}
        for li in range(len(net.layers) - 1, -1, -1):
            for g in sorted(starts.get(li, []), key=lambda g: -g.count):
                s = best_fit(free, caps, g.count)
                if s in free:
                    free.remove(s)
                assign[id(g)] = s
            for g in ends.get(li, []):
                free.append(assign[id(g)])
        dev = net.device
        self.slots = [SyncedMemory(c, dev) for c in caps]
        for g in groups:
            mem = self.slots[assign[id(g)]]
            for b in g.blobs:
                b.use_diff_memory(mem)
        self.groups = groups
        self.version += 1
        self.planned_bytes = 4 * sum(caps)
        self.unplanned_bytes = 4 * sum(g.count for g in groups)
        self._key = self._shape_key()
        for layer in net.layers:       # backward launches bound the old diffs
            layer.forget_backward_plan()
        log.info("Diff memory plan: %d activation diffs in %d shared buffers, "
                 "%.1f MiB instead of %.1f MiB", len(groups), len(caps),
                 self.planned_bytes / 2 ** 20, self.unplanned_bytes / 2 ** 20)

    def refresh(self):
        """Plan again after blob shapes changed (a reshaped blob whose diff
        no longer fits got a private one meanwhile, see Blob.reshape)."""
        if self._shape_key() != self._key:
            self.apply()


def remove_diff_plan(net):
    """Give every planned blob its own (zeroed) diff again."""
    plan = net.memory_plan
    if plan is None:
        return
    for g in plan.groups:
        mem = SyncedMemory(g.count, net.device)
        for b in g.blobs:
            b.use_diff_memory(mem)
    for top, _ in net.plan.diff_shares:
        top.use_diff_memory(SyncedMemory(top.count, net.device))
    for layer in net.layers:
        layer.forget_backward_plan()


# ---------------------------------------------------------------------------
# BatchNorm -> Scale in place: one saved copy of the normalized input
# ---------------------------------------------------------------------------

def bn_for_scale(layers, tops_of, li, bottoms, tops):
    """The BatchNorm layer whose saved x_norm the Scale layer ``li`` (about to
    be set up with ``bottoms``/``tops``) can read instead of keeping its own
    copy, or None.

    Caffe's ResNets run BatchNorm and then Scale in place on one blob.
    Training BatchNorm keeps x_norm for its backward; in-place Scale keeps a
    copy of its input for the scale gradient: the same numbers (BatchNorm's
    output is x_norm, written by the same kernel). Only when Scale directly
    follows BatchNorm and works in place on BatchNorm's top, so nothing can
    change the blob between BatchNorm's forward and Scale's, and x_norm is
    only rewritten by the next BatchNorm forward."""
    layer = layers[li]
    if li == 0 or layer.type != "Scale" or len(bottoms) != 1 or tops[0] is not bottoms[0]:
        return None
    bn = layers[li - 1]
    if bn.type != "BatchNorm" or getattr(bn, "x_norm", None) is None:
        return None
    if tops_of[li - 1][0] is not bottoms[0]:
        return None
    return bn


# ---------------------------------------------------------------------------
# Scratch shared by every layer on a device
# ---------------------------------------------------------------------------

def shared_scratch(dev, nfloats):
    """A device buffer of at least ``nfloats`` floats, shared by every layer on
    ``dev``: for workspaces that hold nothing between launches of one layer's
    forward or backward (convolution column buffers). Layers run one after
    another on the device's one in-order queue, so one buffer serves them all
    instead of one per layer (ResNet-50 on a CPU device: one 32 MiB buffer
    instead of 53). Sizes are rounded up to a power of two so that a few
    buffers cover every request; a bigger request adds a buffer (the smaller
    ones stay bound to the layers using them). Kept for old callers: the
    pool lives in the device (Device.shared_scratch)."""
    return dev.shared_scratch(nfloats)
