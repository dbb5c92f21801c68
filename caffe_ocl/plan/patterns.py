"""Pattern helpers shared by the planning passes (fold, eltwise, train).

Every function reads a Net's public graph (``net.graph``, a
``caffe_ocl.net.NetGraph``): layer indices, bottom/top ``Blob`` objects
(the same object where a layer runs in place), which layers and bottoms
need backward. Nothing here touches a Net's private state.
"""
from .. import config
from ..ops import conv as conv_ops


def act_of(layer):
    """The activation a fused kernel applies for ``layer`` in its epilogue:
    ``("relu", negative_slope)``, ``("clip", lo, hi)`` (Clip, ReLU6), or None
    when ``layer`` is no such activation."""
    if layer.type == "ReLU":
        return ("relu", float(layer.param.relu_param.negative_slope))
    if layer.type in ("Clip", "ReLU6"):
        lo, hi, _ = layer.op_params()
        return ("clip", float(lo), float(hi))
    return None


def inference_act_of(layer):
    """``act_of`` plus the activations that only the TEST plan fuses into
    an epilogue (fold.py, elide.py, swish.py): Swish ``("swish", beta)``
    and Sigmoid ``("sigmoid",)``; the TRAIN fusions keep to ``act_of``."""
    a = act_of(layer)
    if a is not None or not config.get("FUSE_SWISH"):
        return a
    if layer.type == "Swish":
        return ("swish", float(layer.param.swish_param.beta))
    if layer.type == "Sigmoid":
        return ("sigmoid",)
    return None


def producer_fuses(layer, act):
    """Whether the producer ``layer`` (a 2-D Convolution or an
    InnerProduct) applies ``act`` in its epilogue."""
    if layer.type != "Convolution":
        return True
    return conv_ops.fuses_act(layer.device, layer.geom, act)


def in_place_on(graph, li, blob):
    """Layer ``li`` has one bottom and one top, both ``blob`` (in place)."""
    bots, tops = graph.bottoms[li], graph.tops[li]
    return len(bots) == 1 and len(tops) == 1 and bots[0] is blob and tops[0] is blob


def one_in_one_out(graph, li):
    return len(graph.bottoms[li]) == 1 and len(graph.tops[li]) == 1


def in_place_run(graph, li, blob):
    """Indices of the layers directly after ``li`` that each run in place on
    ``blob`` (the in-place chain on a blob, e.g. BatchNorm -> Scale -> ReLU
    after a convolution): ``[li + 1, li + 2, ...]`` up to the first that
    does not."""
    out, j = [], li + 1
    while j < len(graph.layers) and in_place_on(graph, j, blob):
        out.append(j)
        j += 1
    return out


def concat_axis(layer, bottom0):
    """The Concat's axis (concat_dim or axis, canonical)."""
    p = layer.param.concat_param
    if p.HasField("concat_dim"):
        return int(p.concat_dim)
    return bottom0.canonical_axis(p.axis)


def readers_of(graph):
    """blob id -> [indices of the layers reading it], in one scan of the
    graph (NFNet-F0: 1372 layers; ``consumers`` per blob is quadratic)."""
    readers = {}
    for lj, bottoms in enumerate(graph.bottoms):
        for b in bottoms:
            readers.setdefault(id(b), []).append(lj)
    return readers


def consumers(graph, blob, start=0):
    """[(layer index, bottom index)] of the layers from ``start`` on that
    read ``blob`` (in place ones included)."""
    return [(lj, k) for lj in range(start, len(graph.layers))
            for k, x in enumerate(graph.bottoms[lj]) if x is blob]


def writers(graph, blob, start=0):
    """Indices of the layers from ``start`` on that write ``blob`` (its
    producer and the layers in place on it)."""
    return [lj for lj in range(start, len(graph.layers))
            if any(t is blob for t in graph.tops[lj])]


def producer(graph, blob):
    """Index of the layer that creates ``blob`` (the first writer), or None."""
    found = writers(graph, blob)
    return found[0] if found else None


class PendingTops:
    """Mixin of a group that writes only its last layer's top and leaves
    the blobs before it (``pending``) to be computed when read, by the
    ``pending_layers``' own forwards (affine.py, swish.py): ``run_member``
    (a range cutting the group) and ``before_backward`` compute them first.
    ``_init_pending`` in the constructor, ``_mark_pending`` at the end of
    the group's ``run``."""

    def _init_pending(self, pending, pending_layers):
        self.pending = pending
        self.pending_layers = pending_layers
        self._reader = self._compute        # one bound method: compared by identity

    def _unmark_pending(self):
        """The pending blobs are being computed: no longer computed on read."""
        for b in self.pending:
            if b.compute_on_read is self._reader:
                b.compute_on_read = None

    def _compute(self):
        """The pending blobs, by their layers' own forwards."""
        self._unmark_pending()
        g = self.net.graph
        for li in self.pending_layers:
            self.net.layers[li].forward(g.bottoms[li], g.tops[li])

    def _compute_pending(self):
        if any(b.compute_on_read is self._reader for b in self.pending):
            self._compute()

    def _mark_pending(self):
        for b in self.pending:
            b.compute_on_read = self._reader

    def _reshape_members(self):
        """Reshape the group's layers after the first (the net's loop
        reshaped that one before running the group)."""
        g = self.net.graph
        for li in self.layers[1:]:
            self.net.layers[li].reshape_if_needed(g.bottoms[li], g.tops[li])

    def _run_own_forwards(self):
        """Every layer by its own forward (the fused launch could not be
        built at these shapes): the pending blobs computed right here."""
        self._unmark_pending()
        g = self.net.graph
        for li in self.layers:
            self.net.layers[li].forward(g.bottoms[li], g.tops[li])

    def run_member(self, li):
        """Layer ``li``'s own forward in a range that cuts the group."""
        self._compute_pending()
        g = self.net.graph
        self.net.layers[li].forward(g.bottoms[li], g.tops[li])

    def before_backward(self):
        self._compute_pending()


class LayerPair:
    """Two layers run as one group, the second usually an activation in
    place on the first's top (eltwise.py, train.py): ``layers`` (indices),
    ``first``, ``last``, ``describe()``; subclasses add ``run()`` (the
    fused forward) and/or ``backward()``."""

    def __init__(self, net, first, second):
        self.net = net
        self.layers = [first, second]
        self.first, self.last = first, second
        self.act = act_of(net.layers[second])

    def describe(self):
        return " -> ".join(self.net.graph.layer_names[i] for i in self.layers)

    def reshape_second(self):
        """The net's loop reshapes a layer before running it, so the group,
        run at its first layer, reshapes its second itself."""
        li, g = self.last, self.net.graph
        self.net.layers[li].reshape_if_needed(g.bottoms[li], g.tops[li])
