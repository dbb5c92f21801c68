"""TEST-phase rewrite: an SE block's squeeze as one launch (small
batches).

A squeeze-and-excitation block computes its gate from the block's input
``x`` in three steps, each its own launch at batch 1:

    global AVE Pooling x -> p;  product p -> h (+ activation);  product h -> g (+ gate activation)

(the products are 1x1 Convolutions on 1 x 1 planes, ONNX's form, or
InnerProducts, Caffe's SENet; the activations ReLU, SiLU, hard swish,
Sigmoid, hard sigmoid, in whatever form the other rewrites fuse into the
product: elide.py's pairs, swish.py's groups, fold.py's in-place chains).
On a GPU at batch 1 a forward waits on the host's enqueues (5-15 us each
on NVIDIA's OpenCL), so those three launches cost more than their work:
EfficientNet-B0 has 16 such blocks, RegNet-Y 16, MobileNet v3 8-9; on
a CPU driver (PoCL) each launch costs ~10-15 us besides its work. Here
one work-group per image pools, multiplies and applies both activations
(kernels/se_squeeze.cl) and writes ``g``; on CPU drivers a few work-items
an image, each pooling the whole image and computing the hidden units,
then its share of the gate (se_squeeze_cpu).

What matches (``find``, after the other rewrites made their groups): a
Pooling layer (AVE over whole planes, no padding; in no group) whose top
only the next step reads; that step a product (a lone Convolution 1x1 on
1 x 1 planes with one group, or InnerProduct on axis 1 not transposed, or
a group of the other rewrites around one, without BatchNorm/Scale folded
in and not writing into a Concat or a shortcut) whose output only the
next step reads, a second such product; the layers consecutive; none of
the blobs before ``g`` a net output. Only where the kernel applies at the
shapes the plan is made for, asked for one image (``ops.se_squeeze.applies``:
at most 4 images of at most 2^17 floats, ...).

Every blob still reads Caffe's value: the blobs before ``g`` are computed
when read, by running the steps (the layers and the other rewrites'
groups) as they would have run; ``g`` itself is the kernel's (the same
sums in another order: float32 rounding apart). At shapes where the
kernel does not apply (a reshape to a bigger batch) the steps run as
before. ``CAFFE_OCL_FUSE_SE_SQUEEZE=0`` turns it off.
"""
from .. import config
from ..ops import pool as pool_ops
from ..ops import se_squeeze as squeeze_ops
from .patterns import PendingTops, consumers, one_in_one_out


class _Stage:
    """One product step: ``step`` (a group of another rewrite, or the
    product layer's index), its ``producer`` layer, ``act``, input ``x``,
    output ``y`` and ``layers``."""
    __slots__ = ("step", "producer", "act", "x", "y", "layers")

    def __init__(self, step, producer, act, x, y, layers):
        self.step, self.producer, self.act = step, producer, act
        self.x, self.y, self.layers = x, y, layers


def _product_ok(layer, channels):
    """A product the kernel computes: reads ``channels`` values per image."""
    if layer.type == "InnerProduct":
        return layer.axis == 1 and not layer.transpose and layer.K == channels
    if layer.type != "Convolution":
        return False
    g = layer.geom
    return (g.is_1x1 and g.groups == 1 and (g.height, g.width) == (1, 1)
            and (g.dh, g.dw) == (1, 1) and g.channels == channels)


def _stage(net, li, by_first, taken):
    """The product step starting at layer ``li``, or None."""
    g = net.graph
    group = by_first.get(li)
    if group is not None:
        producer = getattr(group, "producer", None)
        if producer is None or producer is not net.layers[li] or not hasattr(group, "act") \
                or getattr(group, "affine", False) or getattr(group, "prelu", None) \
                or getattr(group, "slice_target", None) is not None \
                or getattr(group, "residual_target", None) is not None \
                or group.layers != list(range(li, group.last + 1)):
            return None
        return _Stage(group, producer, group.act, g.bottoms[li][0], g.tops[group.last][0],
                      list(group.layers))
    if li in taken or g.layer_types[li] not in ("Convolution", "InnerProduct") \
            or not one_in_one_out(g, li):
        return None
    return _Stage(li, net.layers[li], None, g.bottoms[li][0], g.tops[li][0], [li])


def _match(net, pi, by_first, taken, outputs):
    """[first stage, second stage] of a squeeze whose pooling is layer
    ``pi``, or None."""
    g = net.graph
    if pi in taken or g.layer_types[pi] != "Pooling" or not one_in_one_out(g, pi):
        return None
    pool = net.layers[pi]
    x, p = g.bottoms[pi][0], g.tops[pi][0]
    if pool.method != pool.AVE or x.num_axes != 4 or p is x \
            or not pool_ops.is_global(x.shape, pool.out_hw, pool.kernel, pool.pad):
        return None
    stages, blob, channels, nxt = [], p, x.shape[1], pi + 1
    for _ in range(2):
        # read by the next step alone (the layers before it are this
        # group's own: its in-place activations)
        if nxt >= len(g.layers) or blob.name in outputs \
                or consumers(g, blob, nxt) != [(nxt, 0)]:
            return None
        st = _stage(net, nxt, by_first, taken)
        if st is None or st.x is not blob or not _product_ok(st.producer, channels):
            return None
        stages.append(st)
        blob, channels, nxt = st.y, st.producer.num_output, st.layers[-1] + 1
    n, c, h, w = x.shape
    s1, s2 = stages
    # asked for one image: a deploy prototxt of batch 10 run at batch 1
    # takes the group then (``run`` asks again at each batch)
    if not squeeze_ops.applies(pool.device, 1, c, h * w, s1.producer.num_output,
                               s2.producer.num_output):
        return None
    return stages


class SESqueeze(PendingTops):
    """Global pooling -> product -> product (each with its activation) run
    as one launch writing the second product's output (the module doc)."""
    traceable = True          # its run replays from a recorded pass (plan/trace.py)
    fuses_backward = False

    def __init__(self, net, pi, stages):
        g = net.graph
        self.net = net
        self.pi = pi
        self.stages = stages
        self.layers = [pi] + [li for st in stages for li in st.layers]
        self.first, self.last = pi, self.layers[-1]
        self.x, self.y = g.bottoms[pi][0], stages[1].y
        self.groups = [st.step for st in stages if not isinstance(st.step, int)]
        self.loses_values = any(getattr(gr, "loses_values", True) for gr in self.groups)
        seen, pending = {id(self.y), id(self.x)}, []
        for li in self.layers:
            for t in g.tops[li]:
                if id(t) not in seen:
                    seen.add(id(t))
                    pending.append(t)
        # computed when read by the steps themselves (``_compute`` below)
        self._init_pending(pending, self.layers)
        self._key = None
        self.fwd = []

    def describe(self):
        names = self.net.graph.layer_names
        return " -> ".join(names[li] for li in self.layers) + " (SE squeeze in one launch)"

    # ---- the steps as they would run -------------------------------------
    def _run_steps(self):
        g, net = self.net.graph, self.net
        self.x.compute_pending()        # another group may have left it to be read
        net.layers[self.pi].forward(g.bottoms[self.pi], g.tops[self.pi])
        for st in self.stages:
            if isinstance(st.step, int):
                net.layers[st.step].forward(g.bottoms[st.step], g.tops[st.step])
            else:
                st.step.run()

    def _compute(self):
        """The blobs before the gate, by the steps as they would have run
        (the other rewrites' groups included)."""
        self._unmark_pending()
        self._run_steps()

    def run_member(self, li):
        """Layer ``li``'s own forward in a range that cuts the group."""
        self._compute_pending()
        for gr in self.groups:
            if li in gr.layers:
                gr.run_member(li)
                return
        g = self.net.graph
        self.net.layers[li].forward(g.bottoms[li], g.tops[li])

    def before_backward(self):
        self._compute_pending()
        for gr in self.groups:
            if hasattr(gr, "before_backward"):
                gr.before_backward()

    # ---- the fused pass ----------------------------------------------------
    def run(self):
        net, g = self.net, self.net.graph
        for li in self.layers[1:]:      # the net's loop reshaped the pooling only
            net.layers[li].reshape_if_needed(g.bottoms[li], g.tops[li])
        n, c, h, w = self.x.shape
        p1, p2 = (st.producer for st in self.stages)
        dev = p1.device
        if not squeeze_ops.applies(dev, n, c, h * w, p1.num_output, p2.num_output):
            self._unmark_pending()
            self._run_steps()
            return
        self.x.compute_pending()
        self.x.data_mem.to_device()
        for p in list(p1.blobs) + list(p2.blobs):   # the user may have written them
            p.data_mem.to_device()
        params = tuple(p.data_buffer() for p in list(p1.blobs) + list(p2.blobs))
        key = (self.x.shape, self.x.data_buffer(), self.y.data_buffer(), params)
        if key != self._key:
            b1 = p1.blobs[1].data_buffer() if p1.bias_term else None
            b2 = p2.blobs[1].data_buffer() if p2.bias_term else None
            self.fwd = [squeeze_ops.forward(
                dev, n, c, h * w, p1.num_output, p2.num_output, self.x.data_buffer(),
                p1.blobs[0].data_buffer(), b1, self.stages[0].act,
                p2.blobs[0].data_buffer(), b2, self.stages[1].act, self.y.data_buffer())]
            self._key = key
        q = dev.queue
        for launch in self.fwd:
            launch.run(q)
        self.y.data_mem.device_written()
        self._mark_pending()


def find(net, groups, taken=()):
    """[SESqueeze] of ``net`` (TEST plan); ``groups``: the other rewrites'
    groups, which a squeeze may take in (``SESqueeze.groups``: the caller
    drops those); ``taken``: the layers in them."""
    if not config.get("FUSE_SE_SQUEEZE"):
        return []
    g = net.graph
    outputs = set(g.outputs)
    by_first = {gr.first: gr for gr in groups}
    out, used = [], set()
    for pi in range(len(g.layers) - 2):
        if pi in used:
            continue
        stages = _match(net, pi, by_first, taken, outputs)
        if stages is None:
            continue
        sq = SESqueeze(net, pi, stages)
        used.update(sq.layers)
        out.append(sq)
    return out
