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
from ..ops import pointwise
from .patterns import LayerPair, act_of


def find_chains(net, train):
    """[(eltwise index, activation index)] of ``net`` (``train``: ReLU only)."""
    chains = []
    for li in range(len(net.layers) - 1):
        layer, act = net.layers[li], net.layers[li + 1]
        if layer.type != "Eltwise" or layer.op != layer.SUM:
            continue
        bots, tops = net.graph.bottoms[li], net.graph.tops[li]
        if len(bots) != 2 or len(tops) != 1 or bots[0] is bots[1]:
            continue
        top = tops[0]
        if top is bots[0] or top is bots[1]:
            continue
        acts = ("ReLU",) if train else ("ReLU", "ReLU6", "Clip")
        abots, atops = net.graph.bottoms[li + 1], net.graph.tops[li + 1]
        if (act.type in acts and act_of(act) is not None and len(abots) == 1
                and len(atops) == 1 and abots[0] is top and atops[0] is top):
            chains.append((li, li + 1))
    return chains


class EltwiseActChain(LayerPair):
    """One Eltwise SUM + in-place activation; the ``ChainPlan`` interface
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
        self._fkey = self._bkey = None
        self.fwd = self.bwd = None
        self.diff_plan_seen = None      # keep_top_diff's cache

    def _keep_g(self):
        return keep_top_diff(self)

    def run(self):
        self.reshape_second()
        key = (self.eltwise.reshape_count, self.top.data_buffer(),
               tuple(b.data_buffer() for b in self.bottoms))
        if key != self._fkey:
            c0, c1 = self.eltwise.coeffs
            self.fwd = pointwise.sum2(self.eltwise.device, self.top.count, c0,
                                      self.bottoms[0].data_buffer(), c1,
                                      self.bottoms[1].data_buffer(), self.top.data_buffer(),
                                      self.act)
            self._fkey = key
        for b in self.bottoms:
            b.data_mem.to_device()
        self.fwd.run(self.eltwise.device.queue)
        self.top.data_mem.device_written()

    def backward(self):
        net, e = self.net, self.first
        if not net.graph.layer_need_backward[e]:
            return
        pd = net.graph.bottom_need_backward[e]
        keep = self._keep_g()
        dxs = [b.diff_buffer() if want else None for b, want in zip(self.bottoms, pd)]
        key = (self.eltwise.reshape_count, self.top.data_buffer(), self.top.diff_buffer(),
               tuple(dxs), keep)
        if key != self._bkey:
            c0, c1 = self.eltwise.coeffs
            self.bwd = pointwise.sum2_backward(self.eltwise.device, self.top.count,
                                               self.top.diff_buffer(), self.top.data_buffer(),
                                               c0, dxs[0], c1, dxs[1], self.act, keep)
            self._bkey = key
        self.top.diff_mem.to_device()
        self.top.data_mem.to_device()
        self.bwd.run(self.eltwise.device.queue)
        for b, want in zip(self.bottoms, pd):
            if want:
                b.diff_mem.device_written()
        if keep:
            self.top.diff_mem.device_written()


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
