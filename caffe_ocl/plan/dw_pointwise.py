"""TEST-phase rewrite: a depthwise convolution and the 1x1 convolution that
reads it as one launch, the 1x1 kernel computing the depthwise output
where it loads its input.

Every mobile net's block has ``depthwise k x k (-> BatchNorm -> Scale ->
activation) -> 1x1 convolution`` (MobileNet v1/v2, MNASNet, ShuffleNet v2's
branches, MobileNet v3 and EfficientNet blocks without an SE branch between
them). At batch 1 on a GPU both layers are a few microseconds of work on a
7 x 7 to 28 x 28 plane, and a forward waits on its launches (the host's
enqueue and the device's gap between kernels, ~6-13 us each on NVIDIA's
driver): the depthwise layer's launch costs more than its sums. Where the
few-outputs 1x1 kernel runs the 1x1 layer (ops/conv1x1_few.py: GPUs, a
few tiles of output), it computes each depthwise output it reads from the
depthwise layer's input instead (its taps, bias and activation; kernel
define DWP), so the pair is one launch and the depthwise output is never
written. Each block of MB output channels computes the depthwise outputs
again: the rule (``ops.conv.takes_dw_input``) bounds that work.

What matches (``wrap``): a 2-D Convolution with one channel a group (alone,
the producer of a folded chain -- chain.Chain, Caffe's conv -> BatchNorm ->
Scale -> ReLU in place -- or of a producer -> activation pair writing a new
top, elide.py: ONNX's form) whose output only the next group's 1x1
Convolution reads and is no net output; that 1x1 convolution alone, a
folded chain's producer, a producer -> activation pair's, or a
ConvResidual's (the shortcut added in its epilogue; not with an SE gate),
not writing into a Concat's slice. The two groups must cover consecutive
layers.

Every blob still reads Caffe's value: the depthwise output (and the pair's
pre-activation top) is computed when read, by the depthwise side's own run.
A range cutting the group computes it first; so does a backward. At shapes
where the rule no longer holds (a larger batch) the two sides run one after
the other as without the rewrite. ``CAFFE_OCL_FUSE_DW_POINTWISE=0`` turns
it off.
"""
from .. import config
from ..ops import conv as conv_ops
from ..ops.conv1x1_few import DwInput
from . import residual
from .chain import Chain
from .elide import ProducerActPair, producer_ok
from .patterns import consumers, one_in_one_out


def _is_depthwise(layer):
    if layer.type != "Convolution" or not producer_ok(layer):
        return False
    g = layer.geom
    return g.groups > 1 and g.groups == g.channels == g.out_channels


def _is_pointwise(layer):
    if layer.type != "Convolution" or not producer_ok(layer):
        return False
    g = layer.geom
    return g.groups == 1 and g.is_1x1 and (g.dh, g.dw) == (1, 1)


def _dw_side(net, li, owner):
    """(group or None, output blob) of a depthwise convolution at ``li``
    that this rewrite can take, or None."""
    g = net.graph
    group = owner.get(li)
    if group is None:
        top = g.tops[li][0]
        return (None, top) if top is not g.bottoms[li][0] else None
    if isinstance(group, Chain) and group.p == li and group.slice_target is None \
            and group.residual_target is None and group.prelu is None:
        return group, group.out_blob
    if type(group) is ProducerActPair and group.first == li and group.slice_target is None:
        return group, group.r
    return None


def _pw_side(net, li, owner):
    """The group (or None: the layer alone) of a 1x1 convolution at ``li``
    that this rewrite can take, or False."""
    group = owner.get(li)
    if group is None:
        return None
    if getattr(group, "forward_through", None) is not None \
            or getattr(group, "slice_target", None) is not None:
        return False            # writes into a Concat's top (concat.py)
    if isinstance(group, Chain) and group.p == li and group.residual_target is None:
        return group
    if type(group) is ProducerActPair and group.first == li:
        return group
    if type(group) is residual.ConvResidual and group.ci == li and group.scale is None:
        return group
    return False


class DwPointwise:
    """A depthwise convolution's side (a layer or a group) and the 1x1
    convolution's side reading it, run as the 1x1 kernel computing the
    depthwise output as it loads it."""
    traceable = True          # its run replays from a recorded pass (plan/trace.py)
    fuses_backward = False

    def __init__(self, net, dwi, dw_group, t, pwi, pw_group):
        self.net = net
        self.dwi, self.pwi = dwi, pwi
        self.dw_group, self.pw_group = dw_group, pw_group
        self.dw_layers = list(dw_group.layers) if dw_group is not None else [dwi]
        self.pw_layers = list(pw_group.layers) if pw_group is not None else [pwi]
        self.layers = self.dw_layers + self.pw_layers
        self.first, self.last = self.layers[0], self.layers[-1]
        self.dw, self.pw = net.layers[dwi], net.layers[pwi]
        self.x = net.graph.bottoms[dwi][0]
        self.t = t                          # the depthwise output the 1x1 layer reads
        # as fold.check_backward reads its groups (a folded chain loses values)
        self.loses_values = any(getattr(gr, "loses_values", True)
                                for gr in (dw_group, pw_group) if gr is not None)
        self._reader = self._compute        # one bound method: compared by identity
        self._fused = None                  # (reshape counts, whether the kernel takes it)
        self._key = None                    # a lone 1x1 layer's launches were built for
        self.fwd = []

    def describe(self):
        names = self.net.graph.layer_names
        return (" -> ".join(names[li] for li in self.layers)
                + " (the depthwise output computed by the 1x1 kernel)")

    # ---- the depthwise side ------------------------------------------------
    def _run_dw(self):
        if self.dw_group is not None:
            self.dw_group.run()
        else:
            g = self.net.graph
            self.dw.forward(g.bottoms[self.dwi], g.tops[self.dwi])

    def _compute(self):
        """The depthwise output, by the depthwise side's own run."""
        if self.t.compute_on_read is self._reader:
            self.t.compute_on_read = None
        self._run_dw()

    def _compute_pending(self):
        if self.t.compute_on_read is self._reader:
            self._compute()

    def _dw_input(self):
        """DwInput of the depthwise side as it runs now (a folded chain's
        weights folded again first where its parameters changed)."""
        grp, layer = self.dw_group, self.dw
        if isinstance(grp, Chain):
            grp.sync_params()
            w, b = grp.weights()
            act = grp.act
        else:
            for p in layer.blobs:           # the user may have written them on the host
                p.data_mem.to_device()
            w = layer.blobs[0].data_buffer()
            b = layer.blobs[1].data_buffer() if layer.bias_term else None
            act = grp.act if grp is not None else None
        return DwInput(layer.geom, self.x.data_buffer(), w, b, act)

    # ---- the 1x1 side --------------------------------------------------------
    def _set_dw_input(self, dw):
        grp = self.pw_group
        if grp is None:
            return
        grp.dw_input = dw
        chain = getattr(grp, "chain", None)      # a ConvResidual's folded chain
        if chain is not None:
            chain.dw_input = dw

    def _run_pw(self, dw):
        if self.pw_group is not None:
            self.pw_group.run()
            return
        g, pw = self.net.graph, self.pw
        top = g.tops[self.pwi][0]
        if dw is None:
            pw.forward(g.bottoms[self.pwi], g.tops[self.pwi])
            return
        for p in pw.blobs:
            p.data_mem.to_device()
        params = tuple(p.data_buffer() for p in pw.blobs)
        key = (pw.reshape_count, top.data_buffer(), params, dw)
        if key != self._key:
            self.fwd = conv_ops.forward(pw.device, pw.geom, self.t.data_buffer(), params[0],
                                        top.data_buffer(), pw.col,
                                        params[1] if pw.bias_term else None,
                                        weight_version=pw.weight_version(), dw_input=dw)
            if top.count == 0:
                self.fwd = []
            self._key = key
        q = pw.device.queue
        for launch in self.fwd:
            launch.run(q)
        top.data_mem.device_written()

    # ---- running ---------------------------------------------------------------
    def _fuses(self):
        """Whether the 1x1 kernel computes the depthwise output at the
        current shapes (the rules asked again only after a reshape)."""
        counts = (self.dw.reshape_count, self.pw.reshape_count)
        if self._fused is None or self._fused[0] != counts:
            self._fused = (counts, conv_ops.takes_dw_input(self.pw.device, self.pw.geom,
                                                            self.dw.geom))
        return self._fused[1]

    def run(self):
        net, g = self.net, self.net.graph
        for li in self.layers[1:]:      # the net's loop reshaped the first only
            net.layers[li].reshape_if_needed(g.bottoms[li], g.tops[li])
        if self.t.compute_on_read is self._reader:
            self.t.compute_on_read = None       # this pass computes it or leaves it pending
        if not self._fuses():
            self._set_dw_input(None)
            self._run_dw()
            self._run_pw(None)
            return
        self.x.compute_pending()
        self.x.data_mem.to_device()
        dw = self._dw_input()
        self._set_dw_input(dw)
        self._run_pw(dw)
        self.t.compute_on_read = self._reader
        # the blobs the depthwise side leaves pending when it runs, pending too
        grp = self.dw_group
        if type(grp) is ProducerActPair:                # its pre-activation top
            grp.c.compute_on_read = grp._compute_c
        elif hasattr(grp, "_mark_pending"):            # chain.NewTopChain's
            grp._mark_pending()

    def run_member(self, li):
        """Layer ``li``'s own forward in a range that cuts the group."""
        self._compute_pending()
        grp = self.dw_group if li in self.dw_layers else self.pw_group
        if grp is not None and hasattr(grp, "run_member"):
            grp.run_member(li)
        else:
            g = self.net.graph
            self.net.layers[li].forward(g.bottoms[li], g.tops[li])

    def before_backward(self):
        self._compute_pending()
        for grp in (self.dw_group, self.pw_group):
            if grp is not None and hasattr(grp, "before_backward"):
                grp.before_backward()


def wrap(net, groups):
    """``groups`` (the TEST plan's) with each depthwise side and the 1x1
    side reading it replaced by one DwPointwise, where the 1x1 kernel
    takes the depthwise output at the net's shapes."""
    if not config.get("FUSE_DW_POINTWISE"):
        return groups
    g = net.graph
    outputs = set(g.outputs)
    owner = {li: gr for gr in groups for li in gr.layers}
    out, replaced = [], set()
    for dwi, layer in enumerate(net.layers):
        if not _is_depthwise(layer) or not one_in_one_out(g, dwi):
            continue
        side = _dw_side(net, dwi, owner)
        if side is None:
            continue
        dw_group, t = side
        members = dw_group.layers if dw_group is not None else [dwi]
        pwi = members[-1] + 1
        # readers of t besides the depthwise side's own in-place layers
        readers = [(lj, k) for lj, k in consumers(g, t) if lj not in members]
        if t.name in outputs or readers != [(pwi, 0)] or pwi >= len(g.layers):
            continue
        pw = net.layers[pwi]
        if not (_is_pointwise(pw) and one_in_one_out(g, pwi)) or g.bottoms[pwi][0] is not t:
            continue
        pw_group = _pw_side(net, pwi, owner)
        if pw_group is False or (pw_group is not None and pw_group.first != pwi):
            continue
        if id(dw_group) in replaced or id(pw_group) in replaced:
            continue
        if not conv_ops.takes_dw_input(pw.device, pw.geom, layer.geom):
            continue
        out.append(DwPointwise(net, dwi, dw_group, t, pwi, pw_group))
        replaced.update(id(gr) for gr in (dw_group, pw_group) if gr is not None)
    return [gr for gr in groups if id(gr) not in replaced] + out
