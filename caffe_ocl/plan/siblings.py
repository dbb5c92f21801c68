"""TEST-phase rewrite (GPUs, batch-1-size outputs): sibling convolutions
whose outputs make up a Concat run as one convolution writing the Concat's
top.

SqueezeNet's fire module ends in two convolutions reading the same blob,
a 1x1 and a 3x3 (pad 1), each with a ReLU, concatenated along channels
(BVLC/DeepScale's Caffe SqueezeNets, torchvision's as onnx2caffe writes
it). A 1x1 convolution is a 3x3 one (one more pad) whose other taps are
zero, so the siblings are one convolution of the larger kernel whose
output channels are theirs one after another: its weight holds each
sibling's taps at their offset in the larger window and zeros elsewhere,
its bias theirs (zero where a sibling has none), and its output is the
Concat's top. At batch 1 on a GPU a forward waits on the host's launches
(5-15 us each), and this saves one per extra sibling (SqueezeNet 1.1: 8 of
37); the zero taps cost multiply-adds, so it applies only where the
outputs are few (``applies``: GPUs, at most SIBLING_MAX_PIXELS output
pixels over the batch, at most SIBLING_MAX_WORK times the siblings'
multiply-adds). The plan takes the siblings where one image is within
the limit; at a batch past it each sibling's convolution (activation in
its epilogue) writes its own slice of the Concat's top, as the
Concat-in-place pass would run them (or, where an algorithm writes whole
blobs only, its own output, which the Concat then copies).

What matches (``find``): a Concat along channels (axis 1) of 2-4 blobs,
each the output of a 2-D Convolution (one group, no dilation, not
Deconvolution) alone or followed by one activation (ReLU, Clip/ReLU6; in
place, or into a new top only it reads; the same for every sibling), only
the Concat reading it; all convolutions read the same data (the same blob
or Split tops of one blob) with the same stride, and their windows line up
in one larger window with the same output size; the layers consecutive and
ending at the Concat; none of the blobs but the Concat's top a net output.
The siblings' own groups from the earlier passes (fold.py's chains of a
convolution with its in-place activation) are taken in.

Values: the Concat's top is the merged convolution's (each sibling's sum
with zero products added: the same values up to float32 rounding of the
summation order); the siblings' outputs are computed when read, by their
layers. The merged weight is rebuilt on the device when a sibling's
parameters change. ``CAFFE_OCL_SIBLING_CONVS=0`` turns it off.
"""
from .. import config
from ..ops import conv as conv_ops
from ..ops import pointwise
from .concat import concat_axis, split_roots
from .patterns import PendingTops, act_of, consumers, one_in_one_out, writers

# output pixels (over the batch) up to which the merged convolution runs:
# batch-1 planes of SqueezeNet (55 x 55 and down), where the GPU waits on
# launches rather than on multiply-adds
SIBLING_MAX_PIXELS = 4096
# the merged convolution's multiply-adds at most this many times the
# siblings' own (SqueezeNet's 1x1 + 3x3 of equal widths: 1.8)
SIBLING_MAX_WORK = 2.0


def merged_window(geoms):
    """(kh, kw, ph, pw, [(row offset, column offset) of each sibling's
    window in the merged one]) for siblings of geometries ``geoms`` (same
    input, same stride), or None where the windows do not line up in one
    window with the same output size."""
    g0 = geoms[0]
    if any(g.groups != 1 or (g.dh, g.dw) != (1, 1) or (g.sh, g.sw) != (g0.sh, g0.sw)
           or (g.out_h, g.out_w) != (g0.out_h, g0.out_w) for g in geoms):
        return None
    ph, pw = max(g.ph for g in geoms), max(g.pw for g in geoms)
    kh = max(g.kh + ph - g.ph for g in geoms)
    kw = max(g.kw + pw - g.pw for g in geoms)
    m = conv_ops.ConvGeometry(g0.num, g0.channels, g0.height, g0.width, 1, kh, kw, ph, pw,
                              g0.sh, g0.sw)
    if (m.out_h, m.out_w) != (g0.out_h, g0.out_w):
        return None
    return kh, kw, ph, pw, [(ph - g.ph, pw - g.pw) for g in geoms]


def applies(dev, geoms, window, images=None):
    """Whether the merged convolution runs (the module doc); ``images``:
    for that many images instead of the geometry's batch (the plan asks
    for one: a net built at batch 10 and run at batch 1 takes it then)."""
    if dev.is_cpu or window is None or not config.get("SIBLING_CONVS"):
        return False
    g0 = geoms[0]
    if (g0.num if images is None else images) * g0.out_h * g0.out_w > SIBLING_MAX_PIXELS:
        return False
    kh, kw = window[:2]
    own = sum(g.out_channels * g.kh * g.kw for g in geoms)
    merged = sum(g.out_channels for g in geoms) * kh * kw
    return merged <= SIBLING_MAX_WORK * own


class _Sibling:
    """One input of the Concat: its convolution ``conv`` (layer index),
    activation layer ``act_li`` (or None), ``act``, output ``out``."""
    __slots__ = ("conv", "act_li", "act", "out", "layers")

    def __init__(self, conv, act_li, act, out):
        self.conv, self.act_li, self.act, self.out = conv, act_li, act, out
        self.layers = [conv] + ([act_li] if act_li is not None else [])


def _sibling(g, blob, ci, outputs):
    """The _Sibling making Concat input ``blob``, or None."""
    ws = writers(g, blob)
    if not ws or blob.name in outputs:
        return None
    first = ws[0]
    layer = g.layers[first]
    if layer.type == "Convolution":
        if len(ws) == 1:
            conv, act_li = first, None
        elif len(ws) == 2 and ws[1] == first + 1 and one_in_one_out(g, ws[1]) \
                and g.bottoms[ws[1]][0] is blob:
            conv, act_li = first, ws[1]          # activation in place
        else:
            return None
    elif len(ws) == 1 and one_in_one_out(g, first) and act_of(layer) is not None:
        x = g.bottoms[first][0]                  # activation into a new top
        xw = writers(g, x)
        if len(xw) != 1 or xw[0] != first - 1 or x.name in outputs \
                or consumers(g, x) != [(first, 0)]:
            return None
        conv, act_li = xw[0], first
    else:
        return None
    c = g.layers[conv]
    if c.type != "Convolution" or c.reverse or c.spatial != 2 or not one_in_one_out(g, conv) \
            or g.tops[conv][0] is g.bottoms[conv][0]:
        return None
    act = act_of(g.layers[act_li]) if act_li is not None else None
    if act_li is not None and act is None:
        return None
    sib = _Sibling(conv, act_li, act, blob)
    k = next(i for i, b in enumerate(g.bottoms[ci]) if b is blob)
    if [r for r in consumers(g, blob) if r[0] not in sib.layers] != [(ci, k)]:
        return None                              # read by another layer too
    return sib


def _match(net, ci, taken_by, outputs, root):
    """[_Sibling] of the Concat at ``ci``, or None."""
    g = net.graph
    if g.layer_types[ci] != "Concat" or len(g.tops[ci]) != 1:
        return None
    bots = g.bottoms[ci]
    top = g.tops[ci][0]
    if not 2 <= len(bots) <= 4 or len({id(b) for b in bots}) != len(bots) \
            or any(b is top or b.num_axes != 4 for b in bots) \
            or concat_axis(g.layers[ci], bots[0]) != 1:
        return None
    sibs = [_sibling(g, b, ci, outputs) for b in bots]
    if any(s is None for s in sibs):
        return None
    xs = [g.bottoms[s.conv][0] for s in sibs]
    if len({root(x) for x in xs}) != 1 or len({s.act for s in sibs}) != 1:
        return None
    layers = sorted(li for s in sibs for li in s.layers) + [ci]
    if layers != list(range(layers[0], ci + 1)):
        return None
    # the earlier passes' groups among them: only a convolution's chain
    # with its own in-place activation is taken in
    for s in sibs:
        for li in s.layers:
            gr = taken_by.get(li)
            if gr is not None and (getattr(gr, "affine", True) or getattr(gr, "prelu", None)
                                   or gr.layers != s.layers):
                return None
    if ci in taken_by:
        return None
    geoms = [net.layers[s.conv].geom for s in sibs]
    if not applies(net.layers[sibs[0].conv].device, geoms, merged_window(geoms), images=1):
        return None
    return sibs


class SiblingConvs(PendingTops):
    """Sibling convolutions (+ activation) -> Concat as one convolution
    writing the Concat's top (the module doc)."""
    traceable = True          # its run replays from a recorded pass (plan/trace.py)
    fuses_backward = False
    loses_values = False

    def __init__(self, net, ci, sibs, groups):
        g = net.graph
        self.net, self.ci, self.sibs = net, ci, sibs
        self.groups = groups            # the taken-in chains (their run is not used)
        self.layers = sorted(li for s in sibs for li in s.layers) + [ci]
        self.first, self.last = self.layers[0], ci
        self.convs = [net.layers[s.conv] for s in sibs]
        self.x = g.bottoms[sibs[0].conv][0]
        self.y = g.tops[ci][0]
        pending = []
        for s in sibs:
            for li in s.layers:
                t = g.tops[li][0]
                if t not in pending:
                    pending.append(t)
        # computed when read by the siblings' own layers
        self._init_pending(pending, [li for s in sibs for li in s.layers])
        self._key, self._merged_from = None, None
        self._w = self._b = None        # (floats, buffer) of the merged parameters
        self.fwd, self.merge = [], []
        # how the last forward ran: "merged", "slices", "tops" (each its own
        # output, then the Concat), "layers" (one by one)
        self.mode = None

    def describe(self):
        names = self.net.graph.layer_names
        return (" + ".join(names[s.conv] for s in self.sibs)
                + f" -> {names[self.ci]} (one convolution writing the Concat)")

    def _run_layers(self):
        self.mode = "layers"
        self._unmark_pending()
        g, net = self.net.graph, self.net
        for li in self.layers:
            net.layers[li].forward(g.bottoms[li], g.tops[li])

    def _inputs_to_device(self):
        """The input computed (another group may have left it to be read)
        and on the device, with the siblings' parameters (the user may have
        written them on the host); returns those parameters."""
        self.x.compute_pending()
        self.x.data_mem.to_device()
        params = [p for c in self.convs for p in c.blobs]
        for p in params:
            p.data_mem.to_device()
        return params

    def _run_into_slices(self):
        """Past the merged convolution's limit (a bigger batch): each
        sibling's convolution with the activation in its epilogue writes
        its slice of the Concat's top, as the Concat-in-place pass would
        have it run (concat.py); where an algorithm at these shapes writes
        whole blobs only, each writes its own output (the activation's)
        and the Concat copies them."""
        dev = self.convs[0].device
        sliced = all(conv_ops.writes_slices(dev, c.geom) for c in self.convs)
        self.mode = "slices" if sliced else "tops"
        self._unmark_pending()
        params = self._inputs_to_device()
        key = (self.mode, tuple(c.reshape_count for c in self.convs), self.x.data_buffer(),
               self.y.data_buffer(), tuple(p.data_buffer() for p in params))
        if key != self._key:
            _, C, H, W = self.y.shape
            self.fwd, before = [], 0
            for s, conv in zip(self.sibs, self.convs):
                bias = conv.blobs[1].data_buffer() if conv.bias_term else None
                y, y_off, y_channels = (self.y, before * H * W, C) if sliced else (s.out, 0, None)
                self.fwd += conv_ops.forward(dev, conv.geom, self.x.data_buffer(),
                                             conv.blobs[0].data_buffer(), y.data_buffer(),
                                             conv.col, bias, act=s.act, y_off=y_off,
                                             y_channels=y_channels,
                                             weight_version=conv.weight_version())
                before += conv.num_output
            self.merge, self._key = [], key
        q = dev.queue
        for launch in self.fwd:
            launch.run(q)
        g = self.net.graph
        if sliced:
            self.y.data_mem.device_written()
            self._mark_pending()
            return
        for s in self.sibs:
            s.out.data_mem.device_written()
        self.net.layers[self.ci].forward(g.bottoms[self.ci], g.tops[self.ci])
        # a new-top activation's input was not written: computed when read
        for s in self.sibs:
            t = g.tops[s.conv][0]
            if t is not s.out:
                t.compute_on_read = self._reader

    def _alloc(self, slot, floats):
        have = getattr(self, slot)
        if have is None or have[0] != floats:
            have = (floats, self.convs[0].device.alloc(4 * max(floats, 1)))
            setattr(self, slot, have)
        return have[1]

    def _build(self, window):
        """The merged geometry's launches and the weight-merging ones."""
        dev = self.convs[0].device
        kh, kw, ph, pw, offsets = window
        g0 = self.convs[0].geom
        cout = sum(c.num_output for c in self.convs)
        C = g0.channels
        gm = conv_ops.ConvGeometry(g0.num, C, g0.height, g0.width, cout, kh, kw, ph, pw,
                                   g0.sh, g0.sw)
        taps = kh * kw
        w = self._alloc("_w", cout * C * taps)
        b = self._alloc("_b", cout)
        merge = [pointwise.fill_launch(dev, w, cout * C * taps, 0.0)]
        o = 0
        for conv, (oh, ow) in zip(self.convs, offsets):
            g = conv.geom
            src = conv.blobs[0].data_buffer()
            rows = g.out_channels * C
            for i in range(g.kh):       # row i of each (output, input) window
                merge.append(pointwise.copy2d(dev, rows, g.kw, src, i * g.kw, g.kh * g.kw,
                                              w, o * C * taps + (oh + i) * kw + ow, taps))
            if conv.bias_term:
                merge.append(pointwise.copy(dev, g.out_channels, conv.blobs[1].data_buffer(),
                                            b, 0, o))
            else:
                merge.append(pointwise.fill_launch(dev, b, g.out_channels, 0.0, off=o))
            o += g.out_channels
        cf = conv_ops.workspace_floats(dev, gm)
        col = dev.shared_scratch(cf) if cf else None
        self.merge = merge
        self.fwd = conv_ops.forward(dev, gm, self.x.data_buffer(), w, self.y.data_buffer(),
                                    col, b, act=self.sibs[0].act)

    def run(self):
        net, g = self.net, self.net.graph
        for li in self.layers[1:]:      # the net's loop reshaped the first layer only
            net.layers[li].reshape_if_needed(g.bottoms[li], g.tops[li])
        geoms = [c.geom for c in self.convs]
        window = merged_window(geoms)
        dev = self.convs[0].device
        if self.x.count == 0 or window is None:
            self._run_layers()
            return
        if not applies(dev, geoms, window):
            self._run_into_slices()
            return
        self.mode = "merged"
        params = self._inputs_to_device()
        key = (tuple(c.reshape_count for c in self.convs), self.x.data_buffer(),
               self.y.data_buffer(), tuple(p.data_buffer() for p in params))
        if key != self._key:
            self._build(window)
            self._key, self._merged_from = key, None
        merged_from = tuple((p.data_mem, p.data_mem.version) for p in params)
        q = dev.queue
        if merged_from != self._merged_from:    # a sibling's parameters changed
            for launch in self.merge:
                launch.run(q)
            self._merged_from = merged_from
        for launch in self.fwd:
            launch.run(q)
        self.y.data_mem.device_written()
        self._mark_pending()


def find(net, groups, taken=()):
    """[SiblingConvs] of ``net`` (TEST plan); ``groups``: the earlier
    passes' groups, which a match may take in (the caller drops
    ``SiblingConvs.groups``); ``taken``: the layers in them."""
    if not config.get("SIBLING_CONVS"):
        return []
    g = net.graph
    outputs = set(g.outputs)
    taken_by = {li: gr for gr in groups for li in gr.layers}
    root = split_roots(g)
    out = []
    for ci in range(len(g.layers)):
        if g.layer_types[ci] != "Concat" or ci in taken:
            continue
        sibs = _match(net, ci, taken_by, outputs, root)
        if sibs is None:
            continue
        inner = []
        for s in sibs:
            gr = taken_by.get(s.conv)
            if gr is not None and gr not in inner:
                inner.append(gr)
        out.append(SiblingConvs(net, ci, sibs, inner))
    return out
