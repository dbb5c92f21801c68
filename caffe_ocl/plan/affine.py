"""TEST-phase rewrite: BatchNorm (global statistics) -> Scale -> activation
as one pass, whatever produced BatchNorm's input and whether BatchNorm
runs in place or writes a new top.

fold.py folds ``conv -> BatchNorm -> Scale -> ReLU`` when all of them run
in place on the producer's top. Many published Caffe prototxts (MobileNet
v2, DenseNet) write BatchNorm's output to a new blob (``conv1 ->
conv1/bn``) and run Scale and the activation in place on that one, or put
the chain after a layer that cannot take folded weights (Concat, Eltwise,
Pooling). Folding into the producer would lose the producer's top (a
visible blob: ``net.blobs["conv1"]`` must hold the raw convolution), so
here the chain runs as one element-wise pass after the producer: read x,
write y = act(gamma * (x - mean) / stdv + beta) (kernels/normalization.cl
``bn_scale_act_fwd``; mean/stdv from the running statistics, as BatchNorm
computes them each forward). Layer by layer that is a read and a write per
layer (BatchNorm, Scale, activation): 6 passes over the blob; fused 2.

What matches (``find_chains``): a ``BatchNorm`` with global statistics
(one bottom of >= 2 axes, channels on axis 1), directly followed by a
``Scale`` (per-channel parameters on axis 1, one bottom) and/or an
activation (ReLU / ReLU6 / Clip), each in place on the blob before it or
writing a new top (the form ONNX-converted nets have: ``bn -> b``,
``Scale b -> s``, ``ReLU s -> r``; DenseNet's layers after each Concat)
when that blob has no other reader and is no net output; at least two
layers; none already in another group. The pass writes the chain's last
blob; the blobs before it are computed when read (``Blob.compute_on_read``:
the chain's layers before the last blob's writer run then, as in
elide.py; before a backward and in forward ranges that cut the chain
too). Every blob holds after forward what the layers leave in it
(BatchNorm's bottom untouched, its top the activation's output when in
place), up to float rounding (gamma * xn + beta is one fma).

Backward through a chain with a Scale in place is refused as for folded
chains (the in-place Scale's saved input is not made; ``loses_values``);
``CAFFE_OCL_FOLD=0`` / ``fold=False`` turn this off with the folding
(``CAFFE_OCL_AFFINE_NEW_TOPS=0``: only the in-place form).
"""
from .. import config
from ..ops import normalization as norm_ops
from ..ops import pointwise
from .patterns import PendingTops, act_of, consumers, in_place_on, one_in_one_out

_ACTS = ("ReLU", "ReLU6", "Clip")


def _scale_ok(layer, blob, C):
    if layer.type != "Scale" or len(layer.blobs) < 1 or layer.blobs[0].shape != (C,):
        return False
    if blob.canonical_axis(layer.param.scale_param.axis) != 1:
        return False
    return not layer.bias_term or layer.blobs[layer.bias_id].shape == (C,)


def find_chains(net, taken=()):
    """[(bn index, scale index or None, activation index or None)]."""
    g = net.graph
    out, n = [], len(g.layers)
    for li in range(n - 1):
        bn = g.layers[li]
        if (li in taken or bn.type != "BatchNorm" or not bn.use_global_stats
                or not one_in_one_out(g, li)):
            continue
        x, y = g.bottoms[li][0], g.tops[li][0]
        if x.num_axes < 2 or bn.channels != x.shape[1]:
            continue
        C = bn.channels
        outputs = set(g.outputs)
        j, scale, act = li + 1, None, None
        if j < n and j not in taken and _scale_ok(g.layers[j], y, C):
            nxt = _follows(g, j, y, outputs, (li,))
            if nxt is not None:
                scale, j, y = j, j + 1, nxt
        if (j < n and j not in taken and g.layers[j].type in _ACTS
                and act_of(g.layers[j]) is not None
                and _follows(g, j, y, outputs, (li, scale)) is not None):
            act = j
        if scale is None and act is None:
            continue
        out.append((li, scale, act))
    return out


def _follows(graph, j, blob, outputs, chain):
    """The blob layer ``j`` leaves the chain's value in when it reads
    ``blob``: ``blob`` (in place), its new top when ``blob`` has no other
    reader (but the ``chain``'s layers before ``j``) and is no net output,
    else None."""
    if in_place_on(graph, j, blob):
        return blob
    if (not config.get("AFFINE_NEW_TOPS") or not one_in_one_out(graph, j)
            or graph.bottoms[j][0] is not blob):
        return None
    top = graph.tops[j][0]
    if blob.name in outputs or [c for c in consumers(graph, blob) if c[0] not in chain] \
            != [(j, 0)]:
        return None
    return top


class AffineActChain(PendingTops):
    """BatchNorm (global statistics) [-> Scale] [-> activation] as one
    pass; the group interface of execution.py (``layers``, ``first``,
    ``last``, ``run``, ``describe``). Forward only."""
    traceable = True          # its run replays from a recorded pass (plan/trace.py)
    fuses_backward = False

    def __init__(self, net, b, s, a):
        self.net = net
        self.layers = [b] + [i for i in (s, a) if i is not None]
        self.first, self.last = b, self.layers[-1]
        self.bn = net.layers[b]
        self.scale = net.layers[s] if s is not None else None
        self.act = act_of(net.layers[a]) if a is not None else None
        g = net.graph
        self.loses_values = s is not None and in_place_on(g, s, g.bottoms[s][0])
        self.x, self.y = g.bottoms[b][0], g.tops[self.last][0]
        # blobs before the last one (new tops): computed when read by the
        # layers that write them
        pending, pending_layers = [], []
        for li in self.layers:
            t = g.tops[li][0]
            if t is not self.y:
                pending_layers.append(li)
                if t not in pending:
                    pending.append(t)
        self._init_pending(pending, pending_layers)
        self._key = None
        self._stats_from = None     # BatchNorm blob versions the mean/std buffers hold
        self._unit = None           # (C, gamma = 1, beta = 0) buffers when absent
        self.fwd = []

    def describe(self):
        return " -> ".join(self.net.graph.layer_names[i] for i in self.layers)

    def _units(self, C):
        if self._unit is None or self._unit[0] != C:
            dev = self.bn.device
            ones, zeros = dev.alloc(4 * C), dev.alloc(4 * C)
            pointwise.fill(dev, ones, C, 1.0)
            pointwise.fill(dev, zeros, C, 0.0)
            self._unit = (C, ones, zeros)
        return self._unit[1], self._unit[2]

    def _params(self):
        return list(self.bn.blobs) + (list(self.scale.blobs) if self.scale else [])

    def _build(self):
        bn, dev = self.bn, self.bn.device
        O, C, I = bn.dims
        mean, std = bn.mean.data_buffer(), bn.stdv.data_buffer()
        run = [b.data_buffer() for b in bn.blobs]
        ones, zeros = self._units(C)
        sc = self.scale
        gamma = sc.blobs[0].data_buffer() if sc is not None else ones
        beta = sc.blobs[sc.bias_id].data_buffer() if sc is not None and sc.bias_term \
            else zeros
        y = self.y.data_buffer()
        self.fwd = [norm_ops.bn_global_stats(dev, C, *run, mean, std, bn.eps),
                    norm_ops.bn_scale_act_forward(dev, O, C, I, self.x.data_buffer(), mean,
                                                  std, gamma, beta, None, y, self.act)]
        if self.x.count == 0:
            self.fwd = []

    def run(self):
        net, g = self.net, self.net.graph
        for li in self.layers[1:]:      # the first was reshaped by the net's loop
            net.layers[li].reshape_if_needed(g.bottoms[li], g.tops[li])
        self.x.data_mem.to_device()
        params = self._params()
        for p in params:                # the user may have written them on the host
            p.data_mem.to_device()
        key = (self.bn.reshape_count, self.x.data_buffer(), self.y.data_buffer(),
               self.bn.mean.data_buffer(), tuple(p.data_buffer() for p in params))
        if key != self._key:
            self._build()
            self._key = key
            self._stats_from = None
        # the per-channel mean and 1/std (the first launch) depend only on
        # the BatchNorm's blobs: recomputed when one of them may have changed
        # (a host write, a training net's forward sharing them), not every
        # forward -- a launch less per chain (DenseNet-121 has 120 chains)
        stats_from = tuple(b.data_mem.version for b in self.bn.blobs)
        launches = self.fwd[1:] if self.fwd and stats_from == self._stats_from else self.fwd
        q = self.bn.device.queue
        for launch in launches:
            launch.run(q)
        self._stats_from = stats_from
        self.y.data_mem.device_written()
        self._mark_pending()


def chains_of(net, taken=()):
    return [AffineActChain(net, *t) for t in find_chains(net, taken)]
