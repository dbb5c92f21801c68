"""TEST-phase layer folding: BatchNorm/Scale into the producer's weights,
activations into the producer's GEMM epilogue.

What is folded
--------------
A chain is a producer -- ``Convolution`` (not Deconvolution, one bottom and
one top) or ``InnerProduct`` -- followed *immediately* in ``net.layers`` by
layers that are all in place on the producer's top blob, in this order,
each optional:

  ``BatchNorm`` with global statistics (``use_global_stats``, the TEST
  default) -> ``Scale`` (a learned per-channel scale on axis 1, with or
  without bias) -> ``ReLU`` (any ``negative_slope``) / ``Clip`` / ``ReLU6`` /
  ``Swish`` / ``Sigmoid`` (the last two not on Winograd convolutions).

That is Caffe's ResNet pattern ``conv -> bn -> scale -> relu`` on one blob.
BatchNorm/Scale fold only when the producer's channel axis is axis 1 (an
InnerProduct top must be 2-D). Anything else is left alone: a BatchNorm
that is not in place (its bottom is a visible blob), a producer top that
another layer also reads (Net inserts a Split, which is not in place), a
Scale with two bottoms, BatchNorm computing batch statistics, ...
Because every absorbed layer is in place, the only user-visible blob of the
chain is the producer's top, and after ``forward`` it holds the same value
as without folding (up to float rounding: the folded weights are
``W * gamma / std`` instead of applying the three steps one after another).

How it runs
-----------
The absorbed layers stay in ``net.layers`` with their parameters
(``net.params`` is unchanged); their forward is skipped. The producer runs
one GEMM per (chunk of) images with folded weights/bias and the activation
in the epilogue. The folded weight/bias buffers are computed ON THE DEVICE
by ``kernels/fold.cl`` from the current parameter blobs, and recomputed
before a forward whenever any of them changed (``SyncedMemory.version``:
``copy_from``, writes to ``net.params[...].data``, solver updates of shared
weights, a BatchNorm of a TRAIN net sharing its statistics) or was
replaced by another storage (``share_data``). A reshape of the producer
rebuilds the fused launches.

``Net.forward(start=, end=)`` over only part of a chain runs those layers
unfolded, exactly as Caffe would. Code that calls ``layer.forward`` itself
(``caffe_ocl time``'s per-layer loop) also gets the unfolded layers.

Backward
--------
Not supported through a folded net: the absorbed layers' intermediate
values are never computed. ``Net.backward`` raises ``NetError``; build the
net with ``fold=False`` (or set ``CAFFE_OCL_FOLD=0``), or call
``net.unfold()`` and run ``forward`` again first.
``Net(..., fold=None)`` (the default) folds at TEST only, and not when the
net says ``force_backward: true``.
"""
import logging

from .. import config
from ..blob import Blob
from ..errors import NetError
from ..ops import conv as conv_ops
from ..ops import work_size
from ..proto import caffe_pb2
from . import affine, concat, eltwise, elide, permute, residual, se, se_squeeze, siblings, swish
from .patterns import act_of, inference_act_of, producer_fuses

log = logging.getLogger("caffe_ocl")

ENV = "CAFFE_OCL_FOLD"


def fold_enabled(fold, phase, net_param=None):
    """Net's ``fold`` option: None = on at TEST (unless force_backward),
    off at TRAIN; False = off; True = on. ``CAFFE_OCL_FOLD=0`` turns it off
    whatever the option says."""
    if not config.get("FOLD"):
        return False
    if fold is None:
        return phase == caffe_pb2.TEST and not (net_param is not None
                                                and net_param.force_backward)
    return bool(fold)



class Chain:
    """One producer plus the in-place layers folded into it."""
    traceable = True          # its run replays from a recorded pass (plan/trace.py)

    def __init__(self, net, p, members, bn, scale, act):
        self.net = net
        self.p = p
        self.members = members            # absorbed layer indices (consecutive)
        self.layers = [p] + members
        self.first, self.last = p, members[-1]
        self.producer = net.layers[p]
        self.bn, self.scale, self.act = bn, scale, act
        self.affine = bn is not None or scale is not None
        self.params = list(self.producer.blobs)
        if bn is not None:
            self.params += bn.blobs
        if scale is not None:
            self.params += scale.blobs
        self._mems = None                 # SyncedMemory objects the launches bind
        self._versions = None             # their versions at the last fold
        self._built_for = None            # producer.reshape_count at the last build
        self.fold_launch = None
        self.w_fold = self.b_fold = None
        self.fwd = []
        # concat.py: where the chain writes its top instead (a slice of a
        # Concat's top), or None
        self.slice_target = None
        self._layout = None               # the slice layout the launches write
        # residual.py: (shortcut blob, output blob, activation) when the
        # chain adds an Eltwise's shortcut and writes the sum instead of its
        # top, or None
        self.residual_target = None

    @property
    def out_blob(self):
        return self.net.graph.tops[self.p][0]

    def describe(self):
        names = [self.net.graph.layer_names[i] for i in self.members]
        return f"{self.net.graph.layer_names[self.p]} <- {', '.join(names)}"

    # ---- building ----------------------------------------------------------
    def _build_fold(self):
        prod, dev = self.producer, self.producer.device
        w = prod.blobs[0]
        C = prod.num_output
        if prod.type == "InnerProduct":
            inner = 1 if prod.transpose else prod.K
        else:
            inner = w.count // C
        if self.w_fold is None or self.w_fold.count != w.count:
            self.w_fold = Blob(w.shape, name=f"{prod.name}.folded_weight", device=dev)
            self.b_fold = Blob((C,), name=f"{prod.name}.folded_bias", device=dev)
        wbuf = w.data_buffer()
        has_bias = bool(prod.bias_term)
        bias = prod.blobs[1].data_buffer() if has_bias else wbuf
        if self.bn is not None:
            bm, bv, bs = (b.data_buffer() for b in self.bn.blobs)
            eps = float(self.bn.eps)
        else:
            bm = bv = bs = wbuf
            eps = 0.0
        has_shift = self.scale is not None and self.scale.bias_term
        if self.scale is not None:
            gamma = self.scale.blobs[0].data_buffer()
            beta = self.scale.blobs[self.scale.bias_id].data_buffer() if has_shift else wbuf
        else:
            gamma = beta = wbuf
        g, l = work_size(dev, w.count + C)
        self.fold_launch = dev.launch(
            "fold.cl", "fold_affine", g, l,
            [w.count, C, inner, wbuf, bias, bm, bv, bs, eps, gamma, beta,
             self.w_fold.data_buffer(), self.b_fold.data_buffer()],
            dict(HAS_BIAS=int(has_bias), HAS_BN=int(self.bn is not None),
                 HAS_SCALE=int(self.scale is not None), HAS_SHIFT=int(has_shift)))

    def _build_forward(self):
        prod, dev = self.producer, self.producer.device
        bottom = self.net.graph.bottoms[self.p][0]
        top = self.net.graph.tops[self.p][0]
        if self.affine:
            w, b = self.w_fold.data_buffer(), self.b_fold.data_buffer()
        else:
            w = prod.blobs[0].data_buffer()
            b = prod.blobs[1].data_buffer() if prod.bias_term else None
        # the folded weights change when the fold runs again (its versions)
        version = None if prod.type == "InnerProduct" else prod.weight_version()
        if self.affine and version is not None:
            version = lambda: self._versions   # noqa: E731
        if prod.type == "InnerProduct":
            self.fwd = prod.forward_launches(bottom, top, w, b, act=self.act)
        elif self._layout is not None:     # into a slice of a Concat's top
            y, y_off, y_channels = self._layout
            self.fwd = conv_ops.forward(dev, prod.geom, bottom.data_buffer(), w, y, prod.col,
                                        b, act=self.act, y_off=y_off, y_channels=y_channels,
                                        weight_version=version)
        elif self.residual_target is not None:     # the sum with a shortcut
            r, out, act = self.residual_target
            self.fwd = conv_ops.forward(dev, prod.geom, bottom.data_buffer(), w,
                                        out.data_buffer(), prod.col, b, act=act,
                                        weight_version=version, residual=r.data_buffer())
        else:
            col = prod.col       # a device buffer or None (shared scratch)
            self.fwd = conv_ops.forward(dev, prod.geom, bottom.data_buffer(), w,
                                        top.data_buffer(), col, b, act=self.act,
                                        weight_version=version)
        if bottom.count == 0 or top.count == 0:
            self.fwd = []

    # ---- running -------------------------------------------------------------
    def run_member(self, li):
        """Layer ``li``'s own forward in a range that cuts the chain."""
        if self.slice_target is not None:     # its value from the last forward first
            self.slice_target.blob.compute_pending()
        g = self.net.graph
        self.net.layers[li].forward(g.bottoms[li], g.tops[li])

    def run_plain(self):
        """The chain's forward into its own top (a slice target's fallback)."""
        self.run(plain=True)

    def run(self, plain=False):
        prod = self.producer
        layout = None if plain or self.slice_target is None else self.slice_target.layout()
        if layout != self._layout:
            self._layout, self._built_for = layout, None
        bottoms, tops = self.net.graph.bottoms[self.p], self.net.graph.tops[self.p]
        for b in bottoms:
            b.data_mem.to_device()
        for p in self.params:       # the user may have written them on the host
            p.data_mem.to_device()
        mems = [p.data_mem for p in self.params]
        rebound = self._mems is None or any(a is not b for a, b in zip(mems, self._mems))
        if rebound:
            if self.affine:
                self._build_fold()
            self._mems, self._versions = mems, None
        if rebound or prod.reshape_count != self._built_for:
            self._build_forward()
            self._built_for = prod.reshape_count
        q = prod.device.queue
        if self.affine:
            versions = [m.version for m in mems]
            if versions != self._versions:
                self.fold_launch.run(q)
                self._versions = versions
        for launch in self.fwd:
            launch.run(q)
        if layout is not None:
            self.slice_target.written()
            return
        if self.slice_target is not None:
            self.slice_target.release()
        if self.residual_target is not None:
            self.residual_target[1].data_mem.device_written()
            return
        for t in tops:
            t.data_mem.device_written()


def _producer_ok(net, li):
    layer = net.layers[li]
    if len(net.graph.bottoms[li]) != 1 or len(net.graph.tops[li]) != 1:
        return False
    if layer.type == "Convolution":      # 2-D (ops/conv.py): N-D ones run ops/conv_nd.py
        return not getattr(layer, "reverse", False) and layer.spatial == 2
    return layer.type == "InnerProduct"


def _channel_axis_ok(net, li):
    """BatchNorm/Scale act on axis 1: it must be the producer's output axis."""
    layer, top = net.layers[li], net.graph.tops[li][0]
    if layer.type == "InnerProduct":
        return top.num_axes == 2
    return layer.axis == 1


def _bn_ok(layer, C):
    return layer.use_global_stats and layer.channels == C


def _scale_ok(layer, bottom, C):
    if len(layer.blobs) < 1 or layer.blobs[0].shape != (C,):
        return False
    try:
        axis = bottom.canonical_axis(layer.param.scale_param.axis)
    except Exception:
        return False
    if axis != 1:
        return False
    return not layer.bias_term or layer.blobs[layer.bias_id].shape == (C,)


def find_chains(net):
    chains = []
    n = len(net.layers)
    li = 0
    while li < n:
        if not _producer_ok(net, li):
            li += 1
            continue
        prod = net.layers[li]
        blob = net.graph.tops[li][0]
        C = prod.num_output
        axis_ok = _channel_axis_ok(net, li)
        members, bn, scale, act, stage = [], None, None, None, 0
        j = li + 1
        while j < n:
            layer = net.layers[j]
            bots, tops = net.graph.bottoms[j], net.graph.tops[j]
            if not (len(bots) == 1 and len(tops) == 1 and bots[0] is blob
                    and tops[0] is blob):
                break
            if layer.type == "BatchNorm" and stage < 1 and axis_ok and _bn_ok(layer, C):
                bn, stage = layer, 1
            elif layer.type == "Scale" and stage < 2 and axis_ok \
                    and _scale_ok(layer, blob, C):
                scale, stage = layer, 2
            elif stage < 3 and inference_act_of(layer) is not None \
                    and producer_fuses(prod, inference_act_of(layer)):
                act, stage = inference_act_of(layer), 3
            else:
                break
            members.append(j)
            j += 1
        if members:
            chains.append(Chain(net, li, members, bn, scale, act))
        li = j
    return chains


def find_groups(net):
    """The groups the TEST folding runs fused: the folded chains, the
    convolutions adding an Eltwise's shortcut in their epilogue
    (residual.py), the Eltwise SUM -> activation pairs (eltwise.py) and the BatchNorm -> Scale
    -> activation chains that cannot fold into a producer (affine.py), the
    producer -> activation pairs writing a new top (elide.py), ONNX's
    Sigmoid * x after a producer (swish.py), SE channel scales folded into
    the 1x1 convolution after them (se.py), a Concat whose top only a
    permutation layer reads, as one gather from its inputs (permute.py),
    the Concats whose inputs their convolutions write in place
    (concat.py), the other convolutions whose weight may be a permutation
    matrix (permute.py: a channel gather while it is), and an SE block's
    pooling and two products as one launch (se_squeeze.py, taking in
    the groups of its products), and a channel gather with the Slices
    right after it reading its top (permute.py: one launch writing their
    tops)."""
    chains = find_chains(net)
    taken = {li for c in chains for li in c.layers}
    sums = residual.find(net, chains, taken)
    absorbed = {id(s.chain) for s in sums if s.chain is not None}
    chains = [c for c in chains if id(c) not in absorbed] + sums
    sibs = siblings.find(net, chains, {li for c in chains for li in c.layers})
    inner = {id(gr) for s in sibs for gr in s.groups}
    chains = [c for c in chains if id(c) not in inner] + sibs
    taken = {li for c in chains for li in c.layers}
    chains += [c for c in eltwise.chains_of(net, train=False) if not taken.intersection(c.layers)]
    taken = {li for c in chains for li in c.layers}
    chains += affine.chains_of(net, taken)
    taken = {li for c in chains for li in c.layers}
    chains += elide.pairs_of(net, taken)
    taken = {li for c in chains for li in c.layers}
    chains += swish.find(net, taken)
    taken = {li for c in chains for li in c.layers}
    chains += se.find(net, taken)
    taken = {li for c in chains for li in c.layers}
    chains += permute.concat_gathers(net, taken)
    taken = {li for c in chains for li in c.layers}
    chains += concat.find(net, chains, taken)
    taken = {li for c in chains for li in c.layers}
    chains += permute.find(net, taken)
    taken = {li for c in chains for li in c.layers}
    squeezes = se_squeeze.find(net, chains, taken)
    inner = {id(gr) for sq in squeezes for gr in sq.groups}
    chains = [c for c in chains if id(c) not in inner] + squeezes
    chains = permute.gathers_into_slices(net, chains)
    for c in chains:
        log.info("Folding %s", c.describe())
    return chains


def check_backward(groups):
    """Raise NetError when a backward would run through folded ``groups``
    whose intermediate values were never computed."""
    lost = [c for c in groups if getattr(c, "loses_values", True)]
    if not lost:
        return      # only Eltwise -> activation chains: every blob holds its value
    raise NetError(
        "backward through a folded net is not supported (BatchNorm/Scale/activation "
        f"layers were folded into their producers: {lost[0].describe()}"
        f"{' ...' if len(lost) > 1 else ''}); build the net with fold=False "
        "(or set CAFFE_OCL_FOLD=0), or call net.unfold() (or "
        "caffe_ocl.plan.fold.unfold(net)) and run forward again before backward")


def unfold(net):
    """Turn folding off for ``net``: every layer runs again on its own."""
    net.unfold()
