"""The execution plan a Net runs: its forward and backward as steps.

The passes (fold.py at TEST, train.py and eltwise.py at TRAIN) look at the
net's public graph once, when the net is built, and return *groups*: a few
layers run as one (``layers``: their indices, ``first``, ``last``,
``describe()``; ``run()`` for a fused forward, ``backward()`` for a fused
backward; ``fuses_forward`` / ``fuses_backward`` say which, default both).
``build`` turns them into an ``ExecutionPlan``:

- ``forward_steps``: in layer order, each step one layer or one group
  (covering consecutive layers, run at its first layer);
- ``backward_steps``: in backward order, each step one layer or one group
  (run at its last layer; a group's other layers have no step of their
  own; a backward group may leave layers between its members to their own
  steps, e.g. a Split and the convolution reading one of its tops, or a
  projection shortcut between a block's Scale and its Eltwise in
  train.NewTopResidualTail; a group that thereby writes a diff earlier in
  the backward than the unfused layer would lists it in ``diff_touches``
  for the diff memory plan, memory.py).

A forward or backward over a range of layers (pycaffe's ``start=``/
``end=``) runs a group fused only when the range covers all of it; a group
partly outside falls back to its layers one by one (Caffe's values either
way). ``forward_schedule(start, end)`` / ``backward_schedule(start, end)``
resolve that once per range: a tuple of ``(layer index, action)`` where
the action is ``LAYER`` (the layer's own pass), ``SKIP`` (nothing: covered
by a group, or a layer without backward) or an object to ``run()`` there (a
group at its first layer; a layer of a cut group whose group says how to
run it alone, ``run_member``). Net's loops only walk that tuple.

A group with ``forward_through`` (a layer index after its last) runs
fused only in ranges that reach that layer too (concat.py: a unit writing
into a Concat's top must not change it in a range that stops before the
Concat). One with ``forward_from`` (a layer index before its first) runs
fused only in ranges that start there or earlier (matmul_operands.py: a
GEMM reading an operand's source past views that layers before the group
compute).

``diff_shares``: ``(top, bottom)`` pairs whose diffs the diff memory plan
(memory.py) must put in one buffer (train.SplitConvBackward).
"""
from collections import namedtuple

from ..proto import caffe_pb2
from . import fold, train

LAYER = "layer"
SKIP = "skip"

Step = namedtuple("Step", "layers group")   # group None: the one layer runs alone

_CACHE_MAX = 64


class _Member:
    """A layer of a group that a forward range cuts, run through the group
    (``run_member``: e.g. compute a blob the group left pending first)."""
    __slots__ = ("group", "li")

    def __init__(self, group, li):
        self.group, self.li = group, li

    def run(self):
        self.group.run_member(self.li)


class _BackwardMember:
    """A layer of a TRAIN group that a backward range cuts, run through the
    group (``backward_member``: e.g. compute a blob the group's forward
    left pending, which the layer's own backward reads)."""
    __slots__ = ("group", "li")

    def __init__(self, group, li):
        self.group, self.li = group, li

    def backward(self):
        self.group.backward_member(self.li)


class ExecutionPlan:
    """Steps of one net's forward and backward. ``fold_groups``: the TEST
    folding's groups (their forward only; backward through values they do
    not compute is refused, ``check_backward``); ``train_groups``: the TRAIN
    fusions (forward and/or backward)."""

    def __init__(self, graph, fold_groups=(), train_groups=()):
        self.graph = graph
        self.fold_groups = list(fold_groups)
        self.train_groups = list(train_groups)
        self.diff_shares = [c.diff_share for c in self.train_groups
                            if getattr(c, "diff_share", None) is not None]
        n = len(graph.layers)
        fwd = [c for c in self.fold_groups + self.train_groups
               if getattr(c, "fuses_forward", True)]
        bwd = [c for c in self.train_groups if getattr(c, "fuses_backward", True)]
        # a layer may be in one group fusing its forward and another fusing
        # its backward; within a direction a later group wins (as before)
        self._fwd_of = {li: c for c in fwd for li in c.layers}
        self._bwd_of = {li: c for c in bwd for li in c.layers}
        self.forward_steps = []
        li = 0
        while li < n:
            c = self._fwd_of.get(li)
            if c is not None and c.first == li:
                self.forward_steps.append(Step(tuple(c.layers), c))
                li = c.last + 1
            else:
                self.forward_steps.append(Step((li,), None))
                li += 1
        self.backward_steps = []
        for li in range(n - 1, -1, -1):
            c = self._bwd_of.get(li)
            if c is None:
                self.backward_steps.append(Step((li,), None))
            elif c.last == li:
                self.backward_steps.append(Step(tuple(c.layers), c))
        self._fwd_cache, self._bwd_cache = {}, {}

    @property
    def groups(self):
        return self.fold_groups + self.train_groups

    def __bool__(self):
        return bool(self.fold_groups or self.train_groups)

    def describe(self):
        """One line per fused group: what runs as one."""
        return [c.describe() for c in self.groups]

    def without_folding(self):
        """The same plan less the TEST folding (``net.unfold()``); blobs the
        folding left to be computed on read are computed now."""
        for c in self.fold_groups:
            if hasattr(c, "before_backward"):
                c.before_backward()
            if hasattr(c, "unplan"):        # memory the plan shares (concat_chain.py)
                c.unplan()
        return ExecutionPlan(self.graph, (), self.train_groups)

    def check_backward(self):
        """Before a backward: groups that left a blob to be computed on read
        compute it; NetError if a group lost values backward needs."""
        if self.fold_groups:
            for c in self.fold_groups:
                if hasattr(c, "before_backward"):
                    c.before_backward()
            fold.check_backward(self.fold_groups)

    # ---- schedules ---------------------------------------------------------------
    def forward_schedule(self, start, end):
        """((layer index, action), ...) for a forward over layers start..end."""
        key = (start, end)
        sched = self._fwd_cache.get(key)
        if sched is None:
            out = []
            for li in range(start, end + 1):
                c = self._fwd_of.get(li)
                if c is None:
                    out.append((li, LAYER))
                elif start > min(c.first, getattr(c, "forward_from", c.first)) \
                        or end < max(c.last, getattr(c, "forward_through", -1)):
                    # the range cuts the group (or stops before the layer whose
                    # output it writes into: a Concat's slice, concat.py; or
                    # starts after a layer whose input it reads past:
                    # matmul_operands.py)
                    out.append((li, _Member(c, li) if hasattr(c, "run_member") else LAYER))
                else:
                    out.append((li, c if li == c.first else SKIP))
            sched = self._remember(self._fwd_cache, key, tuple(out))
        return sched

    def backward_schedule(self, start, end):
        """((layer index, action), ...) for a backward over layers start,
        start - 1, ..., end."""
        key = (start, end)
        sched = self._bwd_cache.get(key)
        if sched is None:
            need = self.graph.layer_need_backward
            out = []
            for li in range(start, end - 1, -1):
                c = self._bwd_of.get(li)
                if c is None or start < c.last or end > c.first:
                    if c is not None and need[li] and hasattr(c, "backward_member"):
                        out.append((li, _BackwardMember(c, li)))
                    else:
                        out.append((li, LAYER if need[li] else SKIP))
                else:
                    out.append((li, c if li == c.last else SKIP))
            sched = self._remember(self._bwd_cache, key, tuple(out))
        return sched

    @staticmethod
    def _remember(cache, key, value):
        if len(cache) >= _CACHE_MAX:
            cache.clear()
        cache[key] = value
        return value


def build(net, fold_option=None):
    """The execution plan of ``net`` (its ``graph`` built): the TEST folding
    when ``fold.fold_enabled`` says so, else at TRAIN the training fusions,
    else every layer on its own."""
    graph = net.graph
    if fold.fold_enabled(fold_option, graph.phase, graph.param):
        return ExecutionPlan(graph, fold_groups=fold.find_groups(net))
    if graph.phase == caffe_pb2.TRAIN:
        return ExecutionPlan(graph, train_groups=train.find_groups(net))
    return ExecutionPlan(graph)
