"""The folded chain: a Convolution / InnerProduct with the BatchNorm /
Scale / activation after it folded into its weights and epilogue (see
fold.py for what is folded and how it runs).

``Chain``: every absorbed layer in place on the producer's top (Caffe's
ResNet pattern). ``NewTopChain``: some of them write a new top instead --
many published Caffe prototxts write BatchNorm's output to a new blob and
run Scale and the activation in place on that one (shicai/MobileNet-Caffe's
MobileNet v2: ``conv2_1/expand -> conv2_1/expand/bn``), converters write
every layer or the activation alone into a new top. The producer then
writes the chain's last blob from its epilogue (folded weights, the
activation), and the blobs before it -- the producer's own top, a blob
BatchNorm / Scale left before a new top -- are computed when read
(``Blob.compute_on_read``: the producer's and those layers' own forwards
run then), so every blob holds Caffe's value whenever read. Before,
these chains ran as the convolution and a BatchNorm pass of their own
(affine.py): a launch and a write and read of the producer's output more.
A blob before a new top must have no other reader (the chain's own
layers aside) and be no net output. ``CAFFE_OCL_FOLD_NEW_TOPS=0``: only
the in-place form.
"""
from .. import config
from ..blob import Blob
from ..ops import conv as conv_ops
from ..ops import prelu as prelu_ops
from ..ops import work_size
from .patterns import PendingTops, consumers, inference_act_of, producer_fuses


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
        # a PReLU as the activation (act ("prelu", C)): its slopes ride in
        # the bias buffer after the biases (b_fold, 2 x C floats)
        self.prelu = next((net.layers[j] for j in members if net.layers[j].type == "PReLU"),
                          None)
        self.params = list(self.producer.blobs)
        if bn is not None:
            self.params += bn.blobs
        if scale is not None:
            self.params += scale.blobs
        if self.prelu is not None:
            self.params += self.prelu.blobs
        self._mems = None                 # SyncedMemory objects the launches bind
        self._versions = None             # their versions at the last fold
        self._built_for = None            # producer.reshape_count at the last build
        self.fold_launches = []
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
        # dw_pointwise.py: the depthwise convolution (ops.conv1x1_few.DwInput)
        # whose output the producer computes as it reads its input, or None
        self.dw_input = None
        self._dw_built = None             # the dw_input the launches were built for

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
        nb = 2 * C if self.prelu is not None else C
        if self.affine and (self.w_fold is None or self.w_fold.count != w.count):
            self.w_fold = Blob(w.shape, name=f"{prod.name}.folded_weight", device=dev)
        if self.b_fold is None or self.b_fold.count != nb:
            self.b_fold = Blob((nb,), name=f"{prod.name}.folded_bias", device=dev)
        wbuf = w.data_buffer()
        has_bias = bool(prod.bias_term)
        bias = prod.blobs[1].data_buffer() if has_bias else wbuf
        self.fold_launches = []
        if self.prelu is not None:
            slope = self.prelu.blobs[0]
            g, l = work_size(dev, C)
            self.fold_launches.append(dev.launch(
                "fold.cl", "fold_prelu", g, l,
                [C, int(slope.count == 1), bias, slope.data_buffer(), self.b_fold.data_buffer()],
                dict(FOLD_BIAS=int(not self.affine), HAS_BIAS=int(has_bias))))
        if not self.affine:
            return
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
        self.fold_launches.insert(0, dev.launch(
            "fold.cl", "fold_affine", g, l,
            [w.count, C, inner, wbuf, bias, bm, bv, bs, eps, gamma, beta,
             self.w_fold.data_buffer(), self.b_fold.data_buffer()],
            dict(HAS_BIAS=int(has_bias), HAS_BN=int(self.bn is not None),
                 HAS_SCALE=int(self.scale is not None), HAS_SHIFT=int(has_shift))))

    @property
    def folds(self):
        """Whether parameters are folded on the device (BatchNorm / Scale
        into the weights and bias, a PReLU's slopes beside the bias)."""
        return self.affine or self.prelu is not None

    def weights(self):
        """(weight, bias or None): the buffers the producer computes with
        (the folded ones where BatchNorm / Scale fold; with a PReLU the
        bias buffer holds the biases, then the slopes), as of the last
        ``sync_params``."""
        prod = self.producer
        w = self.w_fold.data_buffer() if self.affine else prod.blobs[0].data_buffer()
        if self.folds:
            return w, self.b_fold.data_buffer()
        return w, prod.blobs[1].data_buffer() if prod.bias_term else None

    def sync_params(self):
        """Make the parameters current on the device and fold them again
        where any changed (a new memory: the fold and the launches are
        built again)."""
        for p in self.params:       # the user may have written them on the host
            p.data_mem.to_device()
        mems = [p.data_mem for p in self.params]
        if self._mems is None or any(a is not b for a, b in zip(mems, self._mems)):
            if self.folds:
                self._build_fold()
            self._mems, self._versions = mems, None
            self._built_for = None
        if self.folds:
            versions = [m.version for m in mems]
            if versions != self._versions:
                for launch in self.fold_launches:
                    launch.run(self.producer.device.queue)
                self._versions = versions

    def _build_forward(self):
        prod, dev = self.producer, self.producer.device
        bottom = self.net.graph.bottoms[self.p][0]
        top = self.out_blob
        w, b = self.weights()
        # the folded weights change when the fold runs again (its versions)
        version = prod.weight_version()
        if self.affine and version is not None:
            version = lambda: self._versions   # noqa: E731
        act, after = self.act, []
        if self.prelu is not None and prod.type == "Convolution" and self._layout is None \
                and not conv_ops.fuses_act(dev, prod.geom, act):
            # a reshape made Winograd the rule's choice (its output transform
            # has no PReLU): the convolution on its own (the bias buffer's
            # first C floats), then the PReLU's pass on the chain's blob
            n, C = top.count, prod.num_output
            act = None
            after = [prelu_ops.forward(dev, n, C, top.count_range(2),
                                       C if self.prelu.channel_shared else 1,
                                       top.data_buffer(), top.data_buffer(),
                                       self.prelu.blobs[0].data_buffer())]
        if prod.type == "InnerProduct":
            if self.residual_target is not None:   # the sum with a shortcut
                r, out, act = self.residual_target
                self.fwd = prod.forward_launches(bottom, out, w, b, act=act,
                                                 weight_version=version,
                                                 residual=r.data_buffer())
            else:
                self.fwd = prod.forward_launches(bottom, top, w, b, act=act,
                                                 weight_version=version)
        elif self._layout is not None:     # into a slice of a Concat's top
            y, y_off, y_channels = self._layout
            self.fwd = conv_ops.forward(dev, prod.geom, bottom.data_buffer(), w, y, prod.col,
                                        b, act=act, y_off=y_off, y_channels=y_channels,
                                        weight_version=version, dw_input=self.dw_input)
        elif self.residual_target is not None:     # the sum with a shortcut
            r, out, act = self.residual_target
            self.fwd = conv_ops.forward(dev, prod.geom, bottom.data_buffer(), w,
                                        out.data_buffer(), prod.col, b, act=act,
                                        weight_version=version, residual=r.data_buffer(),
                                        dw_input=self.dw_input)
        else:
            col = prod.col       # a device buffer or None (shared scratch)
            self.fwd = conv_ops.forward(dev, prod.geom, bottom.data_buffer(), w,
                                        top.data_buffer(), col, b, act=act,
                                        weight_version=version, dw_input=self.dw_input) + after
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
        for b in self.net.graph.bottoms[self.p]:
            b.data_mem.to_device()
        self.sync_params()
        if prod.reshape_count != self._built_for or self.dw_input != self._dw_built:
            self._build_forward()
            self._built_for, self._dw_built = prod.reshape_count, self.dw_input
        q = prod.device.queue
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
        self.out_blob.data_mem.device_written()


def foldable_producer(net, li):
    layer = net.layers[li]
    if len(net.graph.bottoms[li]) != 1 or len(net.graph.tops[li]) != 1:
        return False
    if layer.type == "Convolution":      # 2-D (ops/conv.py): N-D ones run ops/conv_nd.py
        return not getattr(layer, "reverse", False) and layer.spatial == 2
    return layer.type == "InnerProduct"


def channel_axis_ok(net, li):
    """BatchNorm/Scale act on axis 1: it must be the producer's output axis."""
    layer, top = net.layers[li], net.graph.tops[li][0]
    if layer.type == "InnerProduct":
        return top.num_axes == 2
    return layer.axis == 1


def bn_ok(layer, C):
    return layer.use_global_stats and layer.channels == C


def scale_axis(net, li):
    """The axis of producer ``li``'s top along which a Scale folds into its
    weights: a convolution's channel axis 1 (where channel_axis_ok), an
    InnerProduct's output features (its top's last axis: a transformer's
    layer scale after a projection, on tokens x features), else None."""
    layer, top = net.layers[li], net.graph.tops[li][0]
    if layer.type == "InnerProduct":
        return top.num_axes - 1
    return 1 if channel_axis_ok(net, li) else None


def scale_ok(layer, bottom, C, want_axis=1):
    if len(layer.blobs) < 1 or layer.blobs[0].shape != (C,):
        return False
    try:
        axis = bottom.canonical_axis(layer.param.scale_param.axis)
    except Exception:
        return False
    if axis != want_axis:
        return False
    return not layer.bias_term or layer.blobs[layer.bias_id].shape == (C,)


class NewTopChain(PendingTops, Chain):
    """A producer and the BatchNorm -> Scale -> activation after it, some
    of them writing new tops, folded as Chain folds one in place, writing
    the chain's last blob (``y``); ``pending``: the blobs before it, made
    by ``pending_layers``' own forwards when read."""

    def __init__(self, net, p, members, bn, scale, act, y, pending, pending_layers):
        Chain.__init__(self, net, p, members, bn, scale, act)
        self.y = y
        self.c = net.graph.tops[p][0]
        # BatchNorm or Scale in place: their backward reads what their
        # forward saves (the Scale's input copy), which the fold does not make
        g = net.graph
        self.loses_values = any(g.layer_types[li] in ("BatchNorm", "Scale")
                                and g.tops[li][0] is g.bottoms[li][0] for li in members)
        self._init_pending(pending, pending_layers)

    @property
    def out_blob(self):
        return self.y

    def describe(self):
        return Chain.describe(self) + " (new tops)"

    def run(self, plain=False):
        net, g = self.net, self.net.graph
        for li in self.members:         # the net's loop reshaped the producer only
            net.layers[li].reshape_if_needed(g.bottoms[li], g.tops[li])
        self._unmark_pending()
        Chain.run(self, plain)
        self._mark_pending()

    def run_member(self, li):
        """Layer ``li``'s own forward in a range that cuts the group."""
        if self.slice_target is not None:     # its value from the last forward first
            self.slice_target.blob.compute_pending()
        PendingTops.run_member(self, li)


def _takes_new_top(graph, j, blob, outputs, chain):
    """Whether layer ``j`` may continue a chain on ``blob`` by writing a new
    top: new tops folded (FOLD_NEW_TOPS), ``blob`` no net output and read
    by ``j`` alone (the ``chain``'s own layers aside)."""
    if not config.get("FOLD_NEW_TOPS") or blob.name in outputs:
        return False
    return [c for c in consumers(graph, blob) if c[0] not in chain] == [(j, 0)]


def prelu_ok(layer, C):
    """A PReLU the chain folds: the setting on (FUSE_PRELU), its slopes one
    per channel of the producer's C or one shared."""
    if layer.type != "PReLU" or not config.get("FUSE_PRELU") or len(layer.blobs) != 1:
        return False
    return layer.blobs[0].count == (1 if layer.channel_shared else C)


def find_chains(net):
    """[Chain or NewTopChain]: each foldable producer with the BatchNorm /
    Scale / activation layers right after it, in that order, each
    optional, in place on the chain's blob or (NewTopChain) writing a new
    one."""
    g = net.graph
    outputs = set(g.outputs)
    chains = []
    n = len(net.layers)
    li = 0
    while li < n:
        if not foldable_producer(net, li):
            li += 1
            continue
        prod = net.layers[li]
        blob = g.tops[li][0]
        C = prod.num_output
        axis_ok = channel_axis_ok(net, li)
        s_axis = scale_axis(net, li)
        members, bn, scale, act, stage = [], None, None, None, 0
        written = [li]                   # the layers that wrote ``blob``'s value
        pending, pending_layers = [], []
        j = li + 1
        while j < n:
            layer = net.layers[j]
            bots, tops = g.bottoms[j], g.tops[j]
            if not (len(bots) == 1 and len(tops) == 1 and bots[0] is blob):
                break
            new_top = tops[0] is not blob
            if new_top and (tops[0] is g.bottoms[li][0]
                            or not _takes_new_top(g, j, blob, outputs, [li] + members)):
                break
            if layer.type == "BatchNorm" and stage < 1 and axis_ok and bn_ok(layer, C):
                bn, stage = layer, 1
            elif layer.type == "Scale" and stage < 2 and s_axis is not None \
                    and scale_ok(layer, blob, C, s_axis):
                scale, stage = layer, 2
            elif stage < 3 and inference_act_of(layer) is not None \
                    and producer_fuses(prod, inference_act_of(layer)):
                act, stage = inference_act_of(layer), 3
            elif stage < 3 and axis_ok and prelu_ok(layer, C) \
                    and producer_fuses(prod, ("prelu", C)):
                act, stage = ("prelu", C), 3
            else:
                break
            members.append(j)
            if new_top:                 # blob's value so far: computed when read
                pending.append(blob)
                pending_layers += written
                written, blob = [j], tops[0]
            else:
                written.append(j)
            j += 1
        if members and pending and bn is None and scale is None \
                and (act is None or act[0] != "prelu"):
            # an activation alone into a new top: elide.py's producer ->
            # activation pair (the other rewrites know that form)
            li += 1
            continue
        if members and pending:
            chains.append(NewTopChain(net, li, members, bn, scale, act, blob, pending,
                                      pending_layers))
        elif members:
            chains.append(Chain(net, li, members, bn, scale, act))
        li = j
    return chains
