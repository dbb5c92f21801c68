"""TEST-phase rewrite: a convolution (or a fully-connected layer: a
transformer block's attention projection and MLP output) whose output an
Eltwise SUM adds to a shortcut, run as the product with the shortcut added
in its epilogue.

A residual block ends with ``y = act(conv(x) + r)``: ONNX's Add (-> Relu)
after the block's last convolution (every converted ResNet, MobileNet v2/v3,
EfficientNet, MnasNet, RegNet block), Caffe's Eltwise SUM after a
Convolution. Layer by layer that is the convolution's write of ``c``, then
a pass reading ``c`` and ``r`` and writing the sum (with the activation,
eltwise.py / elide.py): one launch and two passes over the block's output
more than needed. Here the convolution's GEMM reads ``r`` where it stores
its result and writes ``act(conv + bias + r)`` straight into the sum's
blob (``ops.conv.forward(residual=...)``; kernels gemm_cpu.cl, gemm.cl,
conv_igemm.cl, splitk.cl). The sum is made after the product as the
Eltwise would (``c + r`` rounded once, then the activation), so the values
are the layers' own bit for bit.

What matches (``find``): a 2-D Convolution or an InnerProduct (one
bottom, one top, not in place, in no other group; an InnerProduct where
its product is one GEMM launch: not the small-M kernels of batches of up
to 8-32 rows, nor a split of K), or a folded chain of a convolution
(chain.Chain: the
convolution with BatchNorm / Scale in place, no activation; Caffe's
ResNets), directly followed by an Eltwise SUM of two
distinct blobs, one of them the convolution's top ``c`` and both
coefficients 1; ``c`` is read by the Eltwise alone and is no net output;
optionally followed by an activation (ReLU, ReLU6, Clip) in place on the
sum or writing a new top that alone reads the sum. The convolution's
algorithm must take a residual (``ops.conv.writes_residual``: the GEMM
and implicit-GEMM paths; not Winograd, depthwise, the direct first-layer
kernel or the matrix-vector kernel; ``ops.conv.residual_pays``):
otherwise the layers keep their other groups.

Every blob still reads Caffe's value: ``c`` (and the sum's own top when an
activation writes a new one) is computed when read, by the layers' own
forwards (patterns.PendingTops); a forward range cutting the group and a
backward compute them first. A shortcut of another shape (a reshape since
the net was planned) runs the convolution and then one summing pass.
``CAFFE_OCL_FUSE_RESIDUAL=0`` turns it off.

An SE block's channel Scale just before the convolution (se.py's match:
Scale(x, gate) -> 1x1 projection -> + shortcut, MobileNet v3's and
EfficientNet's blocks) joins the group where the convolution's kernel
applies the gate itself (``ops.conv.takes_gate``, GPUs at small batches):
the three or four layers are then one launch. The Scale's top is computed
when read, like ``c``; at shapes where the kernel does not take the gate
the Scale runs first, then the group as without it.
"""
from .. import config
from ..ops import conv as conv_ops
from ..ops import pointwise
from . import se
from .elide import producer_ok
from .patterns import PendingTops, consumers, inference_act_of, one_in_one_out

_ACTS = ("ReLU", "ReLU6", "Clip")


def _act_after(g, ai, z, outputs):
    """(activation, writes a new top) of layer ``ai`` acting on the sum
    ``z``, or None."""
    if ai >= len(g.layers) or g.layer_types[ai] not in _ACTS or not one_in_one_out(g, ai):
        return None
    act = inference_act_of(g.layers[ai])
    if act is None or g.bottoms[ai][0] is not z:
        return None
    top = g.tops[ai][0]
    if top is z:
        return act, False
    if z.name in outputs or consumers(g, z) != [(ai, 0)]:
        return None
    return act, True


def residual_pays(prod):
    """Whether the group should add the shortcut in ``prod``'s epilogue at
    its present shapes: a convolution by ops.conv.residual_pays, a
    fully-connected layer where its product is one GEMM launch (not a
    small-M kernel or a split of K)."""
    if prod.type == "InnerProduct":
        return prod.takes_residual()
    return conv_ops.residual_pays(prod.device, prod.geom)


def match(net, ci, ei, outputs, taken=(), members=(), c=None):
    """(activation index or None, act, new top) of a residual group of
    convolution ``ci`` (alone or with the chain up to ``ei`` - 1) and the
    Eltwise at ``ei``, or None. ``members``: the chain's layers (readers of
    the convolution's top besides the Eltwise); ``c``: the blob the chain
    leaves its value in (chain.NewTopChain's new top), by default
    the convolution's top."""
    g = net.graph
    if ei >= len(g.layers) or ei in taken:
        return None
    conv, elt = g.layers[ci], g.layers[ei]
    if g.layer_types[ci] not in ("Convolution", "InnerProduct") or not producer_ok(conv) \
            or not one_in_one_out(g, ci):
        return None
    c = g.tops[ci][0] if c is None else c
    if c is g.bottoms[ci][0] or c.name in outputs:
        return None
    if g.layer_types[ei] != "Eltwise" or elt.op != elt.SUM or list(elt.coeffs) != [1.0, 1.0]:
        return None
    bots, tops = g.bottoms[ei], g.tops[ei]
    if len(bots) != 2 or len(tops) != 1 or bots[0] is bots[1] or c not in bots:
        return None
    z = tops[0]
    readers = [(lj, k) for lj, k in consumers(g, c) if lj not in members]
    if z in bots or readers != [(ei, bots.index(c))]:
        return None
    r = bots[1] if bots[0] is c else bots[0]
    if r.shape != c.shape or not residual_pays(net.layers[ci]):
        return None
    found = _act_after(g, ei + 1, z, outputs) if ei + 1 not in taken else None
    if found is None:
        return None, None, False
    return ei + 1, found[0], found[1]


class ConvResidual(PendingTops):
    """Convolution -> Eltwise SUM with a shortcut (-> activation), run as
    the convolution adding the shortcut in its epilogue."""
    traceable = True          # its run replays from a recorded pass (plan/trace.py)
    fuses_backward = False
    # the pending blobs are computed before a backward (see also __init__)

    def __init__(self, net, ci, ei, ai, act, new_top, chain=None, scale=None):
        g = net.graph
        self.net = net
        self.ci, self.ei = ci, ei
        self.chain = chain              # chain.Chain of the convolution, or None
        self.scale = scale              # the SE Scale's index before a lone convolution, or None
        producer = chain.layers if chain is not None else [ci]
        self.layers = ([scale] if scale is not None else []) + producer + [ei] \
            + ([ai] if ai is not None else [])
        self.first, self.last = self.layers[0], self.layers[-1]
        self.conv = net.layers[ci]
        # c: the blob the Eltwise reads (a chain writing a new top leaves
        # its value there, not in the convolution's top)
        self.x = g.bottoms[ci][0]
        self.c = chain.out_blob if chain is not None else g.tops[ci][0]
        if scale is not None:           # the convolution reads s = x * gate
            self.s = self.x
            self.x, self.gate = g.bottoms[scale]
        bots = g.bottoms[ei]
        self.r = bots[1] if bots[0] is self.c else bots[0]
        self.z = g.tops[ei][0]
        self.act = act
        self.out = g.tops[ai][0] if ai is not None else self.z
        # an in-place Clip / ReLU6 gates its backward by a copy of its input
        # (layers/neuron_ext.py) that the fused pass does not make
        self.loses_values = ai is not None and not new_top and act[0] != "relu"
        pending, layers = [self.c], list(producer)
        if scale is not None:
            pending.insert(0, self.s)
            layers.insert(0, scale)
        if new_top:                    # the sum itself, before the activation
            pending.append(self.z)
            layers.append(ei)
        self._init_pending(pending, layers)
        # dw_pointwise.py: the depthwise convolution (ops.conv1x1_few.DwInput)
        # whose output the convolution computes as it reads its input, or
        # None (with a chain: the chain's own, set beside this one)
        self.dw_input = None
        self._key = None                # what the launches (or the chain's target) were built for
        self._fused = None              # (shapes decided for, whether to fuse, by the gate)
        self.fwd = []

    def describe(self):
        names = self.net.graph.layer_names
        what = "product" if self.conv.type == "InnerProduct" else "convolution"
        return " -> ".join(names[li] for li in self.layers) + " (shortcut added in the " \
            f"{what}'s epilogue" + (", the channel scale by its kernel)"
                                        if self.scale is not None else ")")

    def _build(self, params, fused, by_gate):
        conv, dev = self.conv, self.conv.device
        w = params[0]
        b = params[1] if conv.bias_term else None
        out = self.out.data_buffer()
        gate = {}
        if by_gate:         # reads x, scaled by the gate as its kernel loads weights
            x = self.x.data_buffer()
            gate = dict(gate=self.gate.data_buffer(),
                        gate_stride=se.gate_stride(self.x, self.gate))
        else:               # reads the convolution's own bottom (s, once the Scale ran)
            x = self.s.data_buffer() if self.scale is not None else self.x.data_buffer()
        if conv.type == "InnerProduct":
            if fused:
                self.fwd = conv.forward_launches(self.x, self.out, w, b, act=self.act,
                                                 weight_version=conv.weight_version(),
                                                 residual=self.r.data_buffer())
            else:
                self.fwd = conv.forward_launches(self.x, self.c, w, b,
                                                 weight_version=conv.weight_version())
                self.fwd.append(self._summing_pass())
        elif fused:
            self.fwd = conv_ops.forward(dev, conv.geom, x, w, out, conv.col, b, act=self.act,
                                        weight_version=conv.weight_version(),
                                        residual=self.r.data_buffer(), dw_input=self.dw_input,
                                        **gate)
        else:       # the convolution into c, then one summing pass
            self.fwd = conv_ops.forward(dev, conv.geom, x, w, self.c.data_buffer(), conv.col, b,
                                        weight_version=conv.weight_version(),
                                        dw_input=self.dw_input, **gate)
            self.fwd.append(self._summing_pass())
        if self.x.count == 0 or self.out.count == 0:
            self.fwd = []

    def _summing_pass(self):
        """The launch the Eltwise (-> activation) would make: out = act(c + r)."""
        return pointwise.sum2(self.conv.device, self.out.count, 1.0, self.c.data_buffer(), 1.0,
                              self.r.data_buffer(), self.out.data_buffer(), self.act)

    def _run_chain(self, fused):
        """The folded chain's forward: into the sum with the shortcut
        (``fused``), or into its own top and then the summing pass."""
        chain = self.chain
        target = (self.r, self.out, self.act) if fused else None
        key = (target, self.c.data_buffer(), self.r.data_buffer(), self.out.data_buffer())
        if key != self._key:
            chain.residual_target = target
            chain._built_for = None         # its launches rebuilt for the new target
            self.fwd = [] if fused else [self._summing_pass()]
            self._key = key
        chain.run()
        if not fused:
            for launch in self.fwd:
                launch.run(self.conv.device.queue)
            self.out.data_mem.device_written()

    def _fuses(self):
        """(whether this pass adds the shortcut in the epilogue, whether the
        convolution's kernel applies the SE gate), decided again only when
        the shapes change (``residual_pays`` and ``se.gated`` ask the
        algorithm rules: not a per-pass cost)."""
        shapes = (self.conv.reshape_count, self.r.shape, self.c.shape)
        if self._fused is None or self._fused[0] != shapes:
            fused = self.r.shape == self.c.shape and residual_pays(self.conv)
            by_gate = self.scale is not None and se.gated(self.conv)
            self._fused = (shapes, fused, by_gate)
        return self._fused[1:]

    def run(self):
        net, g = self.net, self.net.graph
        for li in self.layers[1:]:     # the net's loop reshaped the first only
            net.layers[li].reshape_if_needed(g.bottoms[li], g.tops[li])
        conv = self.conv
        fused, by_gate = self._fuses()
        inputs = (self.x, self.r) + ((self.gate,) if self.scale is not None else ())
        for b in inputs:
            b.compute_pending()
            b.data_mem.to_device()
        if self.scale is not None and not by_gate:
            # the kernel at these shapes takes no gate: the Scale's own pass first
            self._unmark_pending()
            net.layers[self.scale].forward(g.bottoms[self.scale], g.tops[self.scale])
        if self.chain is not None:
            self._run_chain(fused)
            self._finish(fused, by_gate)
            return
        for p in conv.blobs:            # the user may have written them on the host
            p.data_mem.to_device()
        params = tuple(p.data_buffer() for p in conv.blobs)
        key = (conv.reshape_count, net.layers[self.ei].reshape_count, fused, by_gate,
               self.x.data_buffer(), self.r.data_buffer(), self.c.data_buffer(),
               self.out.data_buffer(), params,
               (self.gate.shape, self.gate.data_buffer()) if by_gate else None, self.dw_input)
        if key != self._key:
            self._build(params, fused, by_gate)
            self._key = key
        q = conv.device.queue
        for launch in self.fwd:
            launch.run(q)
        if not fused:
            self.c.data_mem.device_written()
        self.out.data_mem.device_written()
        self._finish(fused, by_gate)

    def _finish(self, fused, by_gate=False):
        """Mark what the pass left to be computed on read."""
        self._unmark_pending()
        if fused:
            self._mark_pending()
            if self.scale is not None and not by_gate:
                self.s.compute_on_read = None      # the Scale wrote it
        else:
            if by_gate:     # s was never written (recomputing it redoes c too: rare)
                self.s.compute_on_read = self._reader
            if self.z is not self.out:  # c written; the sum before the activation is not
                self.z.compute_on_read = self._reader


def find(net, chains=(), taken=()):
    """[ConvResidual] of ``net`` (TEST plan): lone convolutions (in no group
    of ``taken``) and the folded ``chains`` of one without an activation;
    the caller drops the chains the groups took (``group.chain``)."""
    if not config.get("FUSE_RESIDUAL"):
        return []
    g = net.graph
    outputs = set(g.outputs)
    by_first = {c.first: c for c in chains
                if c.act is None and g.layer_types[c.first] in ("Convolution", "InnerProduct")}
    out, used = [], set(taken)
    for ci in range(len(g.layers) - 1):
        chain = by_first.get(ci)
        if chain is None and ci in used:
            continue
        ei = (chain.last if chain is not None else ci) + 1
        found = match(net, ci, ei, outputs, used,
                      chain.members if chain is not None else (),
                      chain.out_blob if chain is not None else None)
        if found is None:
            continue
        si = ci - 1         # an SE channel scale the convolution's kernel can apply
        scale = si if (chain is None and si >= 0 and si not in used
                       and g.layer_types[ci] == "Convolution"
                       and se.match(g, si, outputs) and se.gated(net.layers[ci])) else None
        group = ConvResidual(net, ci, ei, *found, chain=chain, scale=scale)
        used.update(group.layers)
        out.append(group)
    return out
