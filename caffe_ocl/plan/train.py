"""TRAIN-phase fusion: BatchNorm -> Scale (-> activation) on one blob;
also Convolution -> ReLU forwards (``ConvReLUChain``), Eltwise SUM ->
ReLU (eltwise.py), and the backward of an in-place ReLU inside the
backward of the layer after it: a MAX Pooling (``ReLUMaxPoolBackward``)
or a Convolution whose backward-data runs Winograd (``ReLUConvBackward``).
A layer may be in one chain that fuses its forward and another that fuses
its backward (``fuses_forward`` / ``fuses_backward``).

Caffe's ResNets and MobileNets run, in place on a convolution's top,
``BatchNorm`` (batch statistics) -> ``Scale`` (learned gamma, beta) ->
``ReLU`` (or ``ReLU6``/``Clip``, or nothing before an Eltwise). Run layer by
layer that is ~8 passes over the activation forward and ~12 backward; fused
it is 3 forward (statistics; then x_norm and the output in one pass) and 4
backward (one split reduction giving dgamma, dbeta and BatchNorm's two
sums at once; then dx in one pass). On an H200 these layers were a third of a
ResNet-50 training step.

What is fused (``find_chains``): a BatchNorm computing batch statistics, in
place, directly followed by an in-place Scale on the same blob (one bottom,
per-channel parameters on axis 1, learned: lr_mult > 0), optionally followed
by an in-place ReLU / ReLU6 / Clip on that blob; every member and
BatchNorm's bottom need backward. Anything else runs layer by layer.

Semantics: the blob holds, after forward, the activation's output and
after backward BatchNorm's input gradient, as unfused (up to float
rounding: gamma * (g - ...) / stdv is one expression instead of three
layers); Scale's gamma/beta gradients accumulate, BatchNorm's moving
averages update, BatchNorm's ``x_norm`` is kept. The activation's gradient
gate is computed from its input (recomputed from x_norm), which is Caffe's
rule for an activation that is not in place and equals its in-place ReLU.

Running: the execution plan (execution.py) runs a chain's forward fused
when the range covers all of it (at its first layer) and its backward fused
when the range covers the whole chain (at its last layer); a range cutting
a chain runs its layers one by one, which gives the same values. Code calling ``layer.forward`` /
``layer.backward`` itself (``caffe_ocl time``) gets the unfused layers.
``CAFFE_OCL_FUSE_TRAIN=0`` turns the fusion off.
"""
import logging

from .. import config
from . import concat as concat_plan
from . import eltwise as fusion_eltwise
from .patterns import LayerPair, PendingTops, act_of, consumers, in_place_on, one_in_one_out
from ..ops import channel as channel_ops
from ..ops import conv as conv_ops
from ..ops import normalization as norm_ops
from ..ops import pointwise
from ..ops import pool as pool_ops

log = logging.getLogger("caffe_ocl")

ENV = "CAFFE_OCL_FUSE_TRAIN"
_ACTS = ("ReLU", "ReLU6", "Clip")


def enabled():
    return config.get("FUSE_TRAIN")



def _scale_ok(net, li, blob, bottom=None):
    """The Scale at ``li`` is per-channel on axis 1, learned, and in place
    on ``blob`` (or, with ``bottom``, reads ``bottom`` and writes ``blob``)."""
    sc = net.layers[li]
    g = net.graph
    if bottom is None:
        placed = in_place_on(g, li, blob)
    else:
        placed = (len(g.bottoms[li]) == 1 and len(g.tops[li]) == 1
                  and g.bottoms[li][0] is bottom and g.tops[li][0] is blob)
    if sc.type != "Scale" or not placed or not sc.blobs:
        return False
    C = blob.shape[1] if blob.num_axes > 1 else 1
    if sc.blobs[0].shape != (C,) or sc.dims[1] != C:
        return False
    if blob.canonical_axis(sc.param.scale_param.axis) != 1:
        return False
    if sc.bias_term and sc.blobs[sc.bias_id].shape != (C,):
        return False
    return all(sc.param_propagate_down)


def find_chains(net):
    """[(bn index, scale index, activation index or None)] of ``net``."""
    chains, li, n = [], 0, len(net.layers)
    while li < n - 1:
        bn = net.layers[li]
        blob = net.graph.tops[li][0] if net.graph.tops[li] else None
        if (bn.type == "BatchNorm" and not bn.use_global_stats and blob is not None
                and blob.num_axes >= 2 and in_place_on(net.graph, li, blob)
                and getattr(bn, "x_norm", None) is not None
                and _scale_ok(net, li + 1, blob)
                and net.graph.layer_need_backward[li] and net.graph.layer_need_backward[li + 1]
                and net.graph.bottom_need_backward[li][0]):
            act = None
            if (li + 2 < n and net.layers[li + 2].type in _ACTS
                    and in_place_on(net.graph, li + 2, blob) and net.graph.layer_need_backward[li + 2]
                    and act_of(net.layers[li + 2]) is not None):
                act = li + 2
            chains.append((li, li + 1, act))
            li += 3 if act is not None else 2
        else:
            li += 1
    return chains


class TrainChain:
    def __init__(self, net, b, s, a):
        self.net = net
        self.layers = [b, s] + ([a] if a is not None else [])
        self.first, self.last = b, self.layers[-1]
        self.bn, self.scale = net.layers[b], net.layers[s]
        self.act = act_of(net.layers[a]) if a is not None else None
        self.blob = net.graph.tops[b][0]
        # the chain reads x and writes y: both the blob in Caffe's in-place
        # form; NewTopTrainChain (ONNX's form) sets them apart
        self.x = self.y = self.blob
        self._key = None
        self._zero_beta = None
        self.fwd, self.bwd = [], []

    def describe(self):
        return " -> ".join(self.net.graph.layer_names[i] for i in self.layers)

    def _build(self):
        """Launches bound to the current shapes and buffers (the diff memory
        plan may hand the blob another diff buffer after a reshape)."""
        dev = self.bn.device
        O, C, I = self.bn.dims
        x, dx = self.x.data_buffer(), self.x.diff_buffer()
        y, dy = self.y.data_buffer(), self.y.diff_buffer()
        stats, gamma, beta, dbeta, mean, std, xnorm = self._operands()
        self.fwd = stats + [
            norm_ops.bn_scale_act_forward(dev, O, C, I, x, mean, std, gamma.data_buffer(),
                                          beta, xnorm, y, self.act, snap=self._snapshot())]
        self.bwd = norm_ops.bn_scale_act_backward(dev, O, C, I, dy, xnorm, gamma.data_buffer(),
                                                  beta, std, dx, gamma.diff_buffer(), dbeta,
                                                  self.act)
        if self.x.count == 0:
            self.fwd, self.bwd = [], []

    def _snapshot(self):
        """(gamma copy, beta copy) buffers the forward fills, or None."""
        return None

    def _operands(self):
        """(the batch statistics' launches, gamma blob, beta, its diff or
        None, mean, stdv, x_norm buffers) of the BatchNorm/Scale pair."""
        bn = self.bn
        O, C, I = bn.dims
        mean, std = bn.mean.data_buffer(), bn.stdv.data_buffer()
        run = [b.data_buffer() for b in bn.blobs]
        stats = norm_ops.bn_train_stats(bn.device, O, C, I, self.x.data_buffer(), mean, std,
                                        bn.eps, *run, bn.maf)
        return (stats,) + self._params()

    def _params(self):
        """(gamma blob, beta, its diff or None, mean, stdv, x_norm buffers)."""
        bn = self.bn
        return (self.scale.blobs[0],) + self._beta() + (
            bn.mean.data_buffer(), bn.stdv.data_buffer(), bn.x_norm.data_buffer())

    def _beta(self):
        """(beta buffer, its diff buffer or None): the Scale's bias, or a
        zero beta and no gradient for a Scale without one."""
        sc, C = self.scale, self.bn.dims[1]
        if sc.bias_term:
            return sc.blobs[sc.bias_id].data_buffer(), sc.blobs[sc.bias_id].diff_buffer()
        if self._zero_beta is None or self._zero_beta[0] != C:
            buf = self.bn.device.alloc(4 * C)
            pointwise.fill(self.bn.device, buf, C, 0.0)
            self._zero_beta = (C, buf)
        return self._zero_beta[1], None

    def _build_key(self):
        """What the launches were built for: shapes and buffers."""
        return (self.bn.reshape_count, self.x.data_buffer(), self.x.diff_buffer(),
                self.y.data_buffer(), self.y.diff_buffer(),
                tuple(p.data_buffer() for p in self.scale.blobs),
                tuple(p.diff_buffer() for p in self.scale.blobs))

    def _ensure_built(self):
        key = self._build_key()
        if key != self._key:
            self._build()
            self._key = key

    def run(self):
        """The fused forward."""
        net = self.net
        for li in self.layers[1:]:      # the first was reshaped by the net's loop
            net.layers[li].reshape_if_needed(net.graph.bottoms[li], net.graph.tops[li])
        self._ensure_built()
        self.x.data_mem.to_device()
        for p in self.bn.blobs + self.scale.blobs:
            p.data_mem.to_device()
        q = self.bn.device.queue
        for launch in self.fwd:
            launch.run(q)
        self.y.data_mem.device_written()
        self.bn.x_norm.data_mem.device_written()
        for p in self.bn.blobs:          # moving averages
            p.data_mem.device_written()

    def backward(self):
        self._ensure_built()
        self.y.diff_mem.to_device()
        for p in self.scale.blobs:
            p.data_mem.to_device()
            p.diff_mem.to_device()
        q = self.bn.device.queue
        for launch in self.bwd:
            launch.run(q)
        self.x.diff_mem.device_written()
        for p in self.scale.blobs:
            p.diff_mem.device_written()


def find_new_top_chains(net, taken=()):
    """[(bn, scale, activation or None)]: ONNX's form of the chains above
    (onnx2caffe writes it): BatchNorm (batch statistics) x -> t1, Scale
    t1 -> t2, optionally ReLU/ReLU6/Clip t2 -> t3, each a new top; every
    blob before the chain's last top read only by the next member and not
    a net output; every member and BatchNorm's bottom need backward. No
    layer of ``taken``."""
    g, n = net.graph, len(net.layers)
    outputs = set(g.outputs)
    out, li = [], 0
    while li < n - 1:
        found = _new_top_chain(net, li, taken, outputs)
        if found is None:
            li += 1
            continue
        out.append(found)
        li = (found[2] if found[2] is not None else found[1]) + 1
    return out


def _new_top_chain(net, li, taken, outputs):
    g, n = net.graph, len(net.layers)
    bn, s = net.layers[li], li + 1
    if (li in taken or s in taken or bn.type != "BatchNorm" or bn.use_global_stats
            or not one_in_one_out(g, li) or g.bottoms[li][0] is g.tops[li][0]
            or getattr(bn, "x_norm", None) is None or g.tops[li][0].num_axes < 2
            or not one_in_one_out(g, s) or g.bottoms[s][0] is not g.tops[li][0]):
        return None
    t1, t2 = g.tops[li][0], g.tops[s][0]
    # members in place on the chain's last top would leave its diff as the
    # gradient of their input (Caffe's in-place backward); the fused
    # backward leaves it alone: new tops only
    if t2 is t1 or not (_scale_ok(net, s, t2, bottom=t1) and g.layer_need_backward[li]
            and g.layer_need_backward[s] and g.bottom_need_backward[li][0]):
        return None
    a = s + 1
    act = a if (a < n and a not in taken and net.layers[a].type in _ACTS
                and one_in_one_out(g, a) and g.bottoms[a][0] is t2 and g.tops[a][0] is not t2
                and act_of(net.layers[a]) is not None and g.layer_need_backward[a]) else None
    members = [s] + ([act] if act is not None else [])
    y = g.tops[members[-1]][0]
    for t in {id(t1): t1, id(t2): t2}.values():
        if t is y:
            continue
        # a blob the chain leaves pending: read by its members only
        if t.name in outputs or any(lj not in members for lj, _ in consumers(g, t)):
            return None
    return (li, s, act)


class NewTopTrainChain(PendingTops, TrainChain):
    """A chain of ``find_new_top_chains``: the same fused passes, reading
    BatchNorm's bottom and writing the last member's top. The blobs in
    between (BatchNorm's and Scale's tops where they are new blobs) are
    computed when read, with this forward's values: BatchNorm's top is its
    x_norm, the Scale's top gamma * x_norm + beta with the gamma and beta
    the forward used (copied by the forward pass itself: a solver's update
    changes them before a script reads the blob). Their diffs are not
    computed (as with a Solver net's shared diffs, plan/memory.py); every
    other blob and every parameter gradient is the unfused one."""

    def __init__(self, net, b, s, a):
        super().__init__(net, b, s, a)
        g = net.graph
        self.x = g.bottoms[b][0]
        self.y = g.tops[self.last][0]
        self.t1, self.t2 = g.tops[b][0], g.tops[s][0]
        # computed by _compute below, not by the layers' own forwards (a
        # TRAIN BatchNorm's would update its running statistics again)
        self._init_pending([t for t in (self.t1, self.t2) if t is not self.y], [])
        self._snap = None

    def _snapshot(self):
        C = self.bn.dims[1]
        if self._snap is None or self._snap[0] != C:
            dev = self.bn.device
            self._snap = (C, dev.alloc(4 * C), dev.alloc(4 * C))
        return self._snap[1:]

    def _compute(self):
        """The pending blobs of the last forward (see the class doc)."""
        self._unmark_pending()
        bn, dev = self.bn, self.bn.device
        O, C, I = bn.dims
        q = dev.queue
        if self.t1 is not self.y:
            pointwise.copy(dev, self.t1.count, bn.x_norm.data_buffer(),
                           self.t1.data_buffer()).run(q)
            self.t1.data_mem.device_written()
        if self.t2 is not self.y:
            gsnap, bsnap = self._snap[1:]
            channel_ops.affine(dev, O, C, I, bn.x_norm.data_buffer(), self.t2.data_buffer(),
                               scale=gsnap, bias=bsnap).run(q)
            self.t2.data_mem.device_written()

    def run(self):
        super().run()
        self._mark_pending()

    def backward_member(self, li):
        """Layer ``li``'s own backward in a range that cuts the chain (the
        Scale's reads its input, which may be pending)."""
        self._compute_pending()
        g = self.net.graph
        self.net.layers[li].backward(g.tops[li], g.bottom_need_backward[li], g.bottoms[li])


def find_residual_tails(net, bn_chains):
    """[(bn, scale, eltwise, relu)]: a BatchNorm -> Scale chain of
    ``bn_chains`` without activation, directly followed by an Eltwise SUM
    of its blob and one other (a new top), then a ReLU in place on that top;
    no later layer reads the blob, all three need backward into it. The end
    of a ResNet block (its branch's last BatchNorm/Scale, the sum with the
    shortcut, the block's ReLU)."""
    out, n = [], len(net.layers)
    for b, s, a in bn_chains:
        e, r = s + 1, s + 2
        if a is not None or r >= n:
            continue
        blob, elt = net.graph.tops[b][0], net.layers[e]
        bots, tops = net.graph.bottoms[e], net.graph.tops[e]
        if (elt.type != "Eltwise" or elt.op != elt.SUM or len(bots) != 2 or len(tops) != 1
                or bots[0] is bots[1] or not any(x is blob for x in bots)
                or any(x is tops[0] for x in bots)):
            continue
        if (net.layers[r].type != "ReLU" or act_of(net.layers[r]) is None
                or not in_place_on(net.graph, r, tops[0])):
            continue
        ti = 0 if bots[0] is blob else 1
        if not (net.graph.layer_need_backward[e] and net.graph.layer_need_backward[r]
                and net.graph.bottom_need_backward[e][ti] and net.graph.bottom_need_backward[r][0]):
            continue
        if any(x is blob for lj in range(r, n) for x in net.graph.bottoms[lj]):
            continue
        out.append((b, s, e, r))
    return out


class ResidualTailChain(TrainChain):
    """BatchNorm -> Scale (in place on a convolution's output x) -> Eltwise
    SUM with the shortcut s -> in-place ReLU, as one chain. Forward: the
    statistics pass, then one pass writing x_norm and y = relu(c_t * t +
    c_s * s), t = gamma * x_norm + beta, written back into x (unfused: t
    is read back by the sum with s, the sum written, then read and
    written by the ReLU). Backward: one split reduction that gates the
    sum's gradient by y, writes the shortcut's gradient c_s * g and sums
    BatchNorm/Scale's per-channel terms of c_t * g; then dx in one pass
    reading g back from the shortcut's gradient. ResNet-50 at batch 64:
    ~1.4 GB per pass over its block outputs.

    Every blob holds its unfused value (x the Scale's output t, y.diff the
    ReLU's input gradient), except y's diff where the diff memory plan
    shares it (a Solver's net; as fusion_eltwise's chains)."""

    def __init__(self, net, b, s, e, r):
        super().__init__(net, b, s, None)
        self.layers = [b, s, e, r]
        self.last = r
        self.eltwise = net.layers[e]
        self.slope = act_of(net.layers[r])[1]
        bots = net.graph.bottoms[e]
        self.ti = 0 if bots[0] is self.blob else 1
        self.short = bots[1 - self.ti]
        self.top = net.graph.tops[e][0]
        self.diff_plan_seen = None      # eltwise.keep_top_diff's cache

    def _build(self):
        net, blob, dev = self.net, self.blob, self.bn.device
        e = self.layers[2]
        O, C, I = self.bn.dims
        x = blob.data_buffer()
        c = self.eltwise.coeffs
        c_t, c_s = c[self.ti], c[1 - self.ti]
        stats, gamma, beta, dbeta, mean, std, xnorm = self._operands()
        self.fwd = stats + [
            norm_ops.residual_tail_forward(dev, O, C, I, x, mean, std, gamma.data_buffer(), beta,
                                           xnorm, c_t, self.short.data_buffer(), c_s,
                                           self.top.data_buffer(), self.slope)]
        want_ds = net.graph.bottom_need_backward[e][1 - self.ti]
        self.bwd = norm_ops.residual_tail_backward(
            dev, O, C, I, self.top.diff_buffer(), self.top.data_buffer(), xnorm,
            gamma.data_buffer(), beta, std, blob.diff_buffer(), gamma.diff_buffer(), dbeta,
            c_t, self.short.diff_buffer() if want_ds else None, c_s, self.slope,
            fusion_eltwise.keep_top_diff(self))
        if blob.count == 0:
            self.fwd, self.bwd = [], []

    def _build_key(self):
        return super()._build_key() + (
            self.eltwise.reshape_count, self.short.data_buffer(), self.short.diff_buffer(),
            self.top.data_buffer(), self.top.diff_buffer(), fusion_eltwise.keep_top_diff(self))

    def run(self):
        self.short.data_mem.to_device()
        super().run()
        self.top.data_mem.device_written()

    def backward(self):
        self.top.diff_mem.to_device()
        self.top.data_mem.to_device()
        super().backward()
        if self.net.graph.bottom_need_backward[self.layers[2]][1 - self.ti]:
            self.short.diff_mem.device_written()
        if fusion_eltwise.keep_top_diff(self):
            self.top.diff_mem.device_written()


def find_new_top_residual_tails(net, new_top_chains, eltwise_chains):
    """[(bn, scale, eltwise, relu)]: ONNX's form of a ResNet block's end: a
    chain of ``find_new_top_chains`` without activation whose last top t2
    only an Eltwise SUM reads, that Eltwise and its ReLU a pair of
    ``eltwise_chains`` ((eltwise, relu) index pairs: the ReLU in place on
    the sum or writing a new top); t2 no net output; the layers may have
    others between them (the projection shortcut of a block's first unit,
    which ONNX export puts after the branch); all need backward into the
    chain."""
    g = net.graph
    pairs = dict(eltwise_chains)
    out = []
    for b, s, a in new_top_chains:
        if a is not None:
            continue
        t2 = g.tops[s][0]
        readers = consumers(g, t2)
        if len(readers) != 1 or t2.name in g.outputs:
            continue
        e, k = readers[0]
        r = pairs.pop(e, None)          # one chain per Eltwise (a projection
        if r is None:                   # shortcut's chain would match it too)
            continue
        if not (g.layer_need_backward[e] and g.layer_need_backward[r]
                and g.bottom_need_backward[e][k]):
            pairs[e] = r
            continue
        out.append((b, s, e, r))
    return out


class NewTopResidualTail(NewTopTrainChain):
    """A ``find_new_top_residual_tails`` block end. Backward as one
    (``residual_tail_backward``: one split reduction that gates the ReLU's
    gradient by its output, writes the shortcut's gradient and sums
    BatchNorm/Scale's per-channel terms; then BatchNorm's input gradient in
    one pass), where layer by layer it is the ReLU's backward, a copy per
    Eltwise bottom, then the chain's (7 passes over the block's output
    against 12).

    Forward: where the four layers are consecutive (an identity shortcut),
    one pass after the statistics writes x_norm and the ReLU's output
    (``residual_tail_forward``), BatchNorm's and Scale's tops and the sum
    computed when read (as NewTopTrainChain's, the sum by the Eltwise's
    own forward); 5 passes over the block's output against 7 with the
    chain and the Eltwise/ReLU pair apart. Otherwise (``forward_groups``:
    a projection shortcut between the Scale and the Eltwise, as ONNX export
    orders a stage's first unit) the chain (``NewTopTrainChain``) and the
    pair (``eltwise.EltwiseActChain``) run their forwards fused on their
    own and their backwards are this group's (``fuses_backward`` False on
    them).

    Values: BatchNorm's bottom and the shortcut get their unfused
    gradients, the sum's diff g (where the diff memory plan does not share
    it); BatchNorm's and Scale's tops get no diff (as NewTopTrainChain).
    The backward runs at the ReLU, before the backward of layers between
    the Eltwise and the Scale: it writes the diffs of BatchNorm's bottom
    and of the shortcut there, which the diff memory plan is told
    (``diff_touches``)."""

    def __init__(self, net, b, s, e, r, forward_groups=()):
        super().__init__(net, b, s, None)
        g = net.graph
        self.layers = [b, s, e, r]
        self.last = r
        self.eltwise = net.layers[e]
        self.slope = act_of(net.layers[r])[1]
        bots = g.bottoms[e]
        self.ti = 0 if bots[0] is self.t2 else 1
        self.short = bots[1 - self.ti]
        self.top = g.tops[e][0]           # the sum (keep_top_diff looks at it)
        self.y = g.tops[r][0]             # the ReLU's output (the sum itself in place)
        self.forward_groups = tuple(forward_groups)
        self.fuses_forward = not self.forward_groups
        pending = [self.t1, self.t2] + ([self.top] if self.top is not self.y else [])
        self._init_pending(pending if self.fuses_forward else [], [])
        self.want_ds = g.bottom_need_backward[e][1 - self.ti]
        self.diff_touches = [(self.x, True)] + ([(self.short, True)] if self.want_ds else [])
        self.diff_plan_seen = None      # eltwise.keep_top_diff's cache

    def _build(self):
        dev = self.bn.device
        O, C, I = self.bn.dims
        c = self.eltwise.coeffs
        c_t, c_s = c[self.ti], c[1 - self.ti]
        stats, gamma, beta, dbeta, mean, std, xnorm = self._operands()
        self.fwd = []
        if self.fuses_forward:
            self.fwd = stats + [norm_ops.residual_tail_forward(
                dev, O, C, I, self.x.data_buffer(), mean, std, gamma.data_buffer(), beta,
                xnorm, c_t, self.short.data_buffer(), c_s, self.y.data_buffer(), self.slope,
                write_t=False, snap=self._snapshot())]
        self.bwd = norm_ops.residual_tail_backward(
            dev, O, C, I, self.y.diff_buffer(), self.y.data_buffer(), xnorm,
            gamma.data_buffer(), beta, std, self.x.diff_buffer(), gamma.diff_buffer(), dbeta,
            c_t, self.short.diff_buffer() if self.want_ds else None, c_s,
            self.slope, fusion_eltwise.keep_top_diff(self), g_out=self.top.diff_buffer())
        if self.x.count == 0:
            self.fwd, self.bwd = [], []

    def _build_key(self):
        return super()._build_key() + (
            self.eltwise.reshape_count, self.short.data_buffer(), self.short.diff_buffer(),
            self.top.diff_buffer(), fusion_eltwise.keep_top_diff(self))

    def _compute(self):
        """BatchNorm's and Scale's tops (NewTopTrainChain's), then the sum
        by the Eltwise's own forward from them and the shortcut."""
        super()._compute()
        if self.top is not self.y:
            e, g = self.layers[2], self.net.graph
            self.net.layers[e].forward(g.bottoms[e], g.tops[e])

    def run(self):
        self.short.data_mem.to_device()
        super().run()

    def backward(self):
        self.y.data_mem.to_device()
        super().backward()
        if self.want_ds:
            self.short.diff_mem.device_written()
        if fusion_eltwise.keep_top_diff(self):
            self.top.diff_mem.device_written()

    def backward_member(self, li):
        """Layer ``li``'s own backward in a range that cuts the group: the
        blobs left pending (read by the Scale's and the ReLU's backward) are
        computed first."""
        for grp in (self,) + self.forward_groups:
            grp._compute_pending()
        g = self.net.graph
        self.net.layers[li].backward(g.tops[li], g.bottom_need_backward[li], g.bottoms[li])


def find_conv_relu(net):
    """[(convolution index, ReLU index)]: a Convolution (not
    Deconvolution; one bottom, one top) directly followed by a ReLU in
    place on its top. VGG and AlexNet's pattern."""
    out = []
    for li in range(len(net.layers) - 1):
        conv, act = net.layers[li], net.layers[li + 1]
        if (conv.type == "Convolution" and not conv.reverse and conv.spatial == 2
                and act.type == "ReLU"
                and len(net.graph.bottoms[li]) == 1 and len(net.graph.tops[li]) == 1
                and net.graph.tops[li][0] is not net.graph.bottoms[li][0]
                and in_place_on(net.graph, li + 1, net.graph.tops[li][0])):
            out.append((li, li + 1))
    return out


class ConvReLUChain(LayerPair):
    """Convolution -> in-place ReLU: the forward applies the ReLU in the
    convolution's epilogue (the ReLU pass read and wrote the whole
    activation again: 2.4 ms of VGG-16's batch-64 step on an H200). Backward
    is not fused (``fuses_backward``): every blob already holds its unfused
    value (in place, the top is the ReLU's output, whose gate the ReLU's
    backward reads), so the layers' own backward runs."""
    fuses_backward = False

    def __init__(self, net, c, a):
        super().__init__(net, c, a)
        self.conv = net.layers[c]
        self._key = None
        self.fwd = []

    def run(self):
        net, conv = self.net, self.conv
        self.reshape_second()
        x, y = net.graph.bottoms[self.first][0], net.graph.tops[self.first][0]
        params = tuple(p.data_buffer() for p in conv.blobs)
        key = (conv.reshape_count, x.data_buffer(), y.data_buffer(), params)
        if key != self._key:
            bias = params[1] if conv.bias_term else None
            self.fwd = conv_ops.forward(conv.device, conv.geom, x.data_buffer(), params[0],
                                        y.data_buffer(), conv.col, bias, act=self.act)
            if x.count == 0 or y.count == 0:
                self.fwd = []
            self._key = key
        x.data_mem.to_device()
        for p in conv.blobs:
            p.data_mem.to_device()
        q = conv.device.queue
        for launch in self.fwd:
            launch.run(q)
        y.data_mem.device_written()


def _relu_into_next(net, li, taken):
    """Layer ``li`` is a ReLU in place on a blob that the next layer reads as
    its one bottom (one top), both layers needing backward into that blob,
    neither in a chain in ``taken`` (indices of chains fusing backward)."""
    if li in taken or li + 1 in taken or net.layers[li].type != "ReLU":
        return False
    if len(net.graph.tops[li]) != 1 or not in_place_on(net.graph, li, net.graph.tops[li][0]):
        return False
    if (len(net.graph.bottoms[li + 1]) != 1 or len(net.graph.tops[li + 1]) != 1
            or net.graph.bottoms[li + 1][0] is not net.graph.tops[li][0]):
        return False
    return bool(net.graph.layer_need_backward[li] and net.graph.bottom_need_backward[li][0]
                and net.graph.layer_need_backward[li + 1] and net.graph.bottom_need_backward[li + 1][0])


def find_relu_maxpool(net, taken=()):
    """[(ReLU index, Pooling index)]: ``_relu_into_next`` with a MAX Pooling
    (no mask top) whose output no later layer changes in place (the fused
    backward reads it). VGG's and AlexNet's pattern."""
    out = []
    for li in range(len(net.layers) - 1):
        pool = net.layers[li + 1]
        if (pool.type != "Pooling" or pool.method != pool.MAX
                or not _relu_into_next(net, li, taken)):
            continue
        top = net.graph.tops[li + 1][0]
        if any(top is t for lj in range(li + 2, len(net.layers)) for t in net.graph.tops[lj]):
            continue
        out.append((li, li + 1))
    return out


class ReLUMaxPoolBackward(LayerPair):
    """In-place ReLU -> MAX Pooling: the pooling's backward also applies the
    ReLU's gradient gate (kernels/pooling.cl GATE): only a window's chosen
    input gets gradient, and its ReLU output is the window's pooled value,
    so the gate reads the pooling's (smaller) output and the ReLU's pass
    over its whole blob goes (VGG-16 batch 64: that blob is 64 x 64 x 224 x
    224 at pool1). Forward is not fused: the layers run as they are. After
    backward the blob's diff holds the ReLU's input gradient, as unfused."""
    fuses_forward = False

    def __init__(self, net, r, p):
        super().__init__(net, r, p)
        self.act = act_of(net.layers[r])          # ("relu", negative_slope)
        self.pool = net.layers[p]
        self._key = None
        self.bwd = None

    def backward(self):
        net, pool = self.net, self.pool
        blob, top = net.graph.bottoms[self.last][0], net.graph.tops[self.last][0]
        key = (pool.reshape_count, top.data_buffer(), top.diff_buffer(), blob.diff_buffer(),
               pool.mask.data_buffer())
        if key != self._key:
            self.bwd = pool_ops.max_backward(
                pool.device, blob.shape, pool.out_hw, pool.kernel, pool.stride, pool.pad,
                top.diff_buffer(), pool.mask.data_buffer(), blob.diff_buffer(),
                gate=(top.data_buffer(), self.act[1]))
            self._key = key
        top.diff_mem.to_device()
        top.data_mem.to_device()          # (the mask lives on the device only, as for
        self.bwd.run(pool.device.queue)   # the pooling's own backward)
        blob.diff_mem.device_written()


def find_relu_conv(net, taken=()):
    """[(ReLU index, Convolution index)]: ``_relu_into_next`` with a
    Convolution (not Deconvolution). VGG's pattern between its pooling
    stages. Whether the convolution's backward-data can apply the gate
    (Winograd) is decided per call."""
    return [(li, li + 1) for li in range(len(net.layers) - 1)
            if net.layers[li + 1].type == "Convolution" and net.layers[li + 1].spatial == 2
            and _relu_into_next(net, li, taken)]


class ReLUConvBackward(LayerPair):
    """In-place ReLU -> Convolution: the convolution's backward-data
    applies the ReLU's gradient gate in its last pass (Winograd's output
    transform reads the ReLU's output, ops/winograd.py ``gate``), so the
    ReLU's own pass over the blob (read output and gradient, write the
    gradient) goes. Where the convolution's backward-data does not take a
    gate (not Winograd), the two layers run their own backward. Forward is
    not fused."""
    fuses_forward = False

    def __init__(self, net, r, c):
        super().__init__(net, r, c)
        self.act = act_of(net.layers[r])          # ("relu", negative_slope)
        self.conv = net.layers[c]

    def backward(self):
        net, conv, r, c = self.net, self.conv, self.first, self.last
        if conv_ops.gates_backward_data(conv.device, conv.geom):
            _layer_backward(net, c, ("gate", net.graph.bottoms[c][0], self.act[1]))
            return
        _layer_backward(net, c)
        _layer_backward(net, r)


def find_split_convs(net, taken=()):
    """[(split index, convolution index, the convolution's top of the split,
    the other top)]: a Split with two tops, each read by one later layer
    only, the earlier reader a Convolution (not Deconvolution; one bottom,
    not in a chain of ``taken``) and both passing a gradient into their
    top. ResNet's pattern at every block input (the shortcut and the
    branch's first convolution)."""
    out = []
    for si, layer in enumerate(net.layers):
        tops = net.graph.tops[si]
        if layer.type != "Split" or len(tops) != 2 or not net.graph.layer_need_backward[si] \
                or not net.graph.bottom_need_backward[si][0]:
            continue
        readers = []
        for t in tops:
            r = consumers(net.graph, t, si + 1)
            readers.append(r[0] if len(r) == 1 else None)
        if None in readers:
            continue
        a = 0 if readers[0][0] < readers[1][0] else 1
        (ja, _), (jb, kb) = readers[a], readers[1 - a]
        conv = net.layers[ja]
        if (conv.type != "Convolution" or conv.reverse or conv.spatial != 2 or ja in taken
                or len(net.graph.bottoms[ja]) != 1 or not net.graph.layer_need_backward[ja]
                or not net.graph.bottom_need_backward[ja][0]
                or not net.graph.layer_need_backward[jb] or not net.graph.bottom_need_backward[jb][kb]):
            continue
        out.append((si, ja, tops[a], tops[1 - a]))
    return out


class SplitConvBackward:
    """A Split's backward (the sum of its two tops' gradients into its
    bottom) done by the backward-data of the convolution reading one top:
    the other top's diff is the bottom's (the diff memory plan shares them,
    plan/memory.py DiffPlan), so the layer that runs backward first writes the
    bottom's gradient there and the convolution adds its data gradient to
    it (its GEMM epilogue reads and adds C instead of a separate pass
    reading both tops and writing the bottom: 1.3 ms of ResNet-50's
    batch-64 step on an H200). Where the two diffs are not shared (no plan:
    a pycaffe Net keeps every diff) the layers run their own backward.
    Forward is not fused."""
    fuses_forward = False

    def __init__(self, net, si, ja, top_a, top_b):
        self.net = net
        self.layers = [si, ja]
        self.first, self.last = si, ja
        self.split = net.layers[si]
        self.top_a, self.top_b = top_a, top_b
        self.bottom = net.graph.bottoms[si][0]
        # the execution plan hands these to the diff memory plan (memory.py)
        self.diff_share = (top_b, self.bottom)

    describe = LayerPair.describe

    def backward(self):
        net, si, ja = self.net, self.first, self.last
        if self.top_b.diff_mem is not self.bottom.diff_mem:
            _layer_backward(net, ja)
            _layer_backward(net, si)
            return
        self.bottom.diff_mem.to_device()
        _layer_backward(net, ja, ("accumulate", self.bottom))
        self.bottom.diff_mem.device_written()


def _layer_backward(net, li, variant=None):
    """Layer ``li``'s own backward, with ``variant`` as its bwd_variant for
    this call (what a fusion asks its backward to compute as well)."""
    layer = net.layers[li]
    layer.bwd_variant = variant
    try:
        layer.backward(net.graph.tops[li], net.graph.bottom_need_backward[li], net.graph.bottoms[li])
    finally:
        layer.bwd_variant = None


def find_groups(net):
    """The groups of a TRAIN net (``fuses_forward`` / ``fuses_backward``
    say which pass each fuses); [] when the fusion is turned off."""
    if not enabled():
        return []
    bn_chains = find_chains(net)
    tails = find_residual_tails(net, bn_chains)
    in_tails = {li for t in tails for li in t}
    new_top = [NewTopTrainChain(net, *t) for t in find_new_top_chains(
        net, {li for t in bn_chains for li in t if li is not None})]
    elt = [c for c in fusion_eltwise.chains_of(net, train=True) if c.first not in in_tails]
    new_tails = []
    if config.get("NEW_TOP_TAILS"):
        chain_at = {c.first: c for c in new_top}
        elt_at = {c.first: c for c in elt}
        for b, s, e, r in find_new_top_residual_tails(
                net, [(c.first, c.layers[1], None) for c in new_top if c.act is None],
                [(c.first, c.last) for c in elt]):
            fwd = (chain_at[b], elt_at[e])
            if r == b + 3:              # consecutive: one forward too
                new_top.remove(fwd[0])
                elt.remove(fwd[1])
                fwd = ()
            for grp in fwd:             # their backward is the tail's
                grp.fuses_backward = False
            new_tails.append(NewTopResidualTail(net, b, s, e, r, fwd))
    kinds = [("residual block tails (BatchNorm/Scale/Eltwise/ReLU)",
              [ResidualTailChain(net, *t) for t in tails]),
             ("BatchNorm/Scale/activation chains",
              [TrainChain(net, *t) for t in bn_chains if t[0] not in in_tails]),
             ("BatchNorm/Scale/activation chains writing new tops", new_top),
             ("Eltwise/activation chains", elt),
             ("residual block tails writing new tops", new_tails)]
    taken = {li for _, found in kinds for c in found for li in c.layers}
    pools = [ReLUMaxPoolBackward(net, *t) for t in find_relu_maxpool(net, taken)]
    taken |= {li for c in pools for li in c.layers}
    relu_convs = [ReLUConvBackward(net, *t) for t in find_relu_conv(net, taken)]
    taken |= {li for c in relu_convs for li in c.layers}
    kinds += [("Convolution/ReLU forwards",
               [ConvReLUChain(net, *t) for t in find_conv_relu(net)]),
              ("ReLU/max-pooling backwards", pools),
              ("ReLU/convolution backwards", relu_convs),
              ("Split/convolution backwards",
               [SplitConvBackward(net, *t) for t in find_split_convs(net, taken)]),
              ("Concat/Slice copies as one (forward)", concat_plan.copy_groups(net, taken))]
    chains = []
    for what, found in kinds:
        if found:
            log.info("Fused %d %s for training (%s%s)", len(found), what, found[0].describe(),
                     " ..." if len(found) > 1 else "")
        chains += found
    return chains
