"""Eltwise SUM -> in-place activation, run as one kernel (TEST and TRAIN).

A ResNet block ends with ``Eltwise`` (SUM of the branch and the shortcut)
into a new blob, then ``ReLU`` in place on it. Layer by layer that is 5
passes over the block's output forward (the sum as two axpby passes, the
ReLU reading and writing it again) and 7 backward (ReLU's backward, then a
copy of the gradient per bottom); fused it is 3 and 4-5. ResNet-50 at
batch 64 moves ~1.4 GB per pass at its block outputs.

What is fused (``find_chains``): an ``Eltwise`` with operation SUM and
exactly two distinct bottoms whose top is neither bottom, directly followed
by a ``ReLU`` in place on that top (at TEST also ``ReLU6`` / ``Clip``: their
in-place backward gates by a saved copy of the input, see
layers/neuron_ext.py, which the fused forward does not make). Anything else
(PROD, MAX, three bottoms, an Eltwise in place) runs layer by layer.

At TRAIN the ReLU may also write a new top y (``t -> y``: ONNX's form,
onnx2caffe writes it) when nothing but the ReLU reads the sum t, t is no
net output, and no later layer writes y or the Eltwise's bottoms: then the
fused forward writes y only and t is computed when read (the Eltwise's own
forward, ``Blob.compute_on_read``); the backward gates by y (y > 0 exactly
where t > 0, so Caffe's gate by the ReLU's input is the same) and leaves g
in t's diff, y's diff untouched. ``CAFFE_OCL_NEW_TOP_TAILS=0`` turns this
form off (with train.NewTopResidualTail).

Semantics, as unfused: forward top = act(c0 * b0 + c1 * b1) (the Eltwise
coefficients). Backward: the ReLU's gradient gate is computed from its
output, which is what Caffe's in-place ReLU does (its backward reads the
bottom, which in place is the top); the bottoms' diffs get
c_i * g; the top's diff holds g afterwards, as after the unfused in-place
activation -- except in a net whose activation diffs are shared
(memory.DiffPlan, a Solver's net by default), where an intermediate
diff is not meaningful after backward and writing it would be a wasted
pass.

The chains join the TEST folding (fold.py) and the TRAIN fusions
(train.py); the execution plan (execution.py) runs a chain fused when a
forward or backward range covers it whole; ``CAFFE_OCL_FOLD=0`` /
``CAFFE_OCL_FUSE_TRAIN=0`` turn them off with the rest.
"""
from .. import config
from ..ops import pointwise
from .patterns import LayerPair, PendingTops, act_of, consumers, writers


def find_chains(net, train):
    """[(eltwise index, activation index)] of ``net`` (``train``: ReLU only,
    in place or writing a new top, see the module doc)."""
    chains = []
    g = net.graph
    for li in range(len(net.layers) - 1):
        layer, act = net.layers[li], net.layers[li + 1]
        if layer.type != "Eltwise" or layer.op != layer.SUM:
            continue
        bots, tops = g.bottoms[li], g.tops[li]
        if len(bots) != 2 or len(tops) != 1 or bots[0] is bots[1]:
            continue
        top = tops[0]
        if top is bots[0] or top is bots[1]:
            continue
        acts = ("ReLU",) if train else ("ReLU", "ReLU6", "Clip")
        abots, atops = g.bottoms[li + 1], g.tops[li + 1]
        if not (act.type in acts and act_of(act) is not None and len(abots) == 1
                and len(atops) == 1 and abots[0] is top):
            continue
        if atops[0] is top or (train and config.get("NEW_TOP_TAILS")
                               and new_top_ok(g, li, atops[0])):
            chains.append((li, li + 1))
    return chains


def new_top_ok(graph, e, y):
    """Eltwise ``e`` -> ReLU ``e + 1`` writing the new top ``y`` can leave
    the sum t pending: only the ReLU reads t, t is no net output, and no
    layer after the ReLU writes y (the backward's gate) or the Eltwise's
    bottoms (t's recomputation)."""
    t = graph.tops[e][0]
    if y is t or any(y is b for b in graph.bottoms[e]) or t.name in graph.outputs:
        return False
    if [lj for lj, _ in consumers(graph, t)] != [e + 1]:
        return False
    return not any(writers(graph, b, e + 2) for b in list(graph.bottoms[e]) + [y])


class EltwiseActChain(PendingTops, LayerPair):
    """One Eltwise SUM + activation (in place on the sum, or at TRAIN a
    ReLU writing a new top, the sum then pending); the ``ChainPlan`` interface
    (layers, first, last, run) plus ``backward``. ``loses_values``: with a
    ReLU every blob holds what the unfused layers would leave in it, so a
    TEST net folding only such chains can still run backward layer by
    layer; a Clip's saved input (its backward's gate) is not made."""
    traceable = True          # its run replays from a recorded pass (plan/trace.py)

    def __init__(self, net, e, a):
        super().__init__(net, e, a)
        self.eltwise = net.layers[e]
        self.loses_values = self.act[0] != "relu"
        self.bottoms = net.graph.bottoms[e]
        self.top = net.graph.tops[e][0]
        # the activation's output: the top itself in place, else a new blob
        # (train only) and the sum is computed when read
        self.out = net.graph.tops[a][0]
        self._init_pending([self.top] if self.out is not self.top else [], [e])
        self._fkey = self._bkey = None
        self.fwd = self.bwd = None
        self.diff_plan_seen = None      # keep_top_diff's cache

    def _keep_g(self):
        return keep_top_diff(self)

    def run(self):
        self.reshape_second()
        key = (self.eltwise.reshape_count, self.out.data_buffer(),
               tuple(b.data_buffer() for b in self.bottoms))
        if key != self._fkey:
            c0, c1 = self.eltwise.coeffs
            self.fwd = pointwise.sum2(self.eltwise.device, self.top.count, c0,
                                      self.bottoms[0].data_buffer(), c1,
                                      self.bottoms[1].data_buffer(), self.out.data_buffer(),
                                      self.act)
            self._fkey = key
        for b in self.bottoms:
            b.data_mem.to_device()
        self.fwd.run(self.eltwise.device.queue)
        self.out.data_mem.device_written()
        self._mark_pending()

    def backward(self):
        net, e = self.net, self.first
        if not net.graph.layer_need_backward[e]:
            return
        pd = net.graph.bottom_need_backward[e]
        keep = self._keep_g()
        dxs = [b.diff_buffer() if want else None for b, want in zip(self.bottoms, pd)]
        key = (self.eltwise.reshape_count, self.out.data_buffer(), self.out.diff_buffer(),
               self.top.diff_buffer(), tuple(dxs), keep)
        if key != self._bkey:
            c0, c1 = self.eltwise.coeffs
            self.bwd = pointwise.sum2_backward(self.eltwise.device, self.top.count,
                                               self.out.diff_buffer(), self.out.data_buffer(),
                                               c0, dxs[0], c1, dxs[1], self.act, keep,
                                               g_out=self.top.diff_buffer())
            self._bkey = key
        self.out.diff_mem.to_device()
        self.out.data_mem.to_device()
        self.bwd.run(self.eltwise.device.queue)
        for b, want in zip(self.bottoms, pd):
            if want:
                b.diff_mem.device_written()
        if keep:
            self.top.diff_mem.device_written()

    def backward_member(self, li):
        """Layer ``li``'s own backward in a range that cuts the chain (the
        ReLU's reads the sum, which may be pending)."""
        self._compute_pending()
        g = self.net.graph
        self.net.layers[li].backward(g.tops[li], g.bottom_need_backward[li], g.bottoms[li])


def keep_top_diff(chain):
    """Whether a fused chain's backward should leave g in its ``top``'s diff
    (as the unfused in-place activation does): not where the diff memory
    plan shares that diff (its value after backward is not meaningful).
    Cached in the chain's ``diff_plan_seen`` (the plan's key, whether it
    shares the top's diff) until the plan plans again."""
    plan = chain.net.memory_plan
    if plan is None:
        return True
    key = (id(plan), plan.version)  # the plan's groups change when it plans again
    seen = chain.diff_plan_seen
    if seen is None or seen[0] != key:
        seen = chain.diff_plan_seen = (
            key, any(b is chain.top for g in plan.groups for b in g.blobs))
    return not seen[1]


def chains_of(net, train):
    return [EltwiseActChain(net, e, a) for e, a in find_chains(net, train)]
