"""Layer base class and the registry of layer types.

Caffe's lifecycle, kept on purpose so Caffe users recognise it:
``setup`` = check blob counts -> ``layer_setup`` (read params, create
parameter blobs) -> ``reshape`` (shape tops, build launch plans) ->
set loss weights. ``forward``/``backward`` only enqueue the plans that
``reshape`` built; they never allocate, build programs or read the device.

A subclass usually overrides ``layer_setup`` and ``reshape`` and, in
``reshape``, fills ``self.fwd`` with ``Launch`` objects from
``caffe_ocl.ops``. Backward plans are built lazily, on the first backward
after a reshape, by ``build_backward`` (it reads ``self.propagate_down`` and
``self.param_propagate_down``), so inference never compiles backward
kernels. Layers whose work is not a fixed list of launches override
``forward_impl``/``backward_impl`` instead.
"""
import difflib

from .. import config
from ..blob import LAYOUT, Blob
from ..device import get_device
from ..errors import LayerError, NetError, ShapeError
from ..ops import pointwise
from ..ops import winograd as wino_ops
from ..proto import caffe_pb2
from ..proto import forks

_REGISTRY = {}


def register(*type_names):
    """Class decorator: ``@register("Convolution")``."""
    def deco(cls):
        for t in type_names:
            if t in _REGISTRY and _REGISTRY[t] is not cls:
                raise RuntimeError(f"layer type {t!r} registered twice")
            _REGISTRY[t] = cls
        if cls.type is None:
            cls.type = type_names[0]
        return cls
    return deco


def is_registered(type_name):
    return type_name in _REGISTRY


def layer_type_list():
    """Every registered type (the package's __init__ imports every family
    before anything can call this)."""
    return sorted(_REGISTRY)


def create_layer(param, phase):
    cls = _REGISTRY.get(param.type)
    if cls is None or getattr(cls, "user_class", True) is None:   # unregistered custom type
        fork = forks.fork_of_type(param.type)
        if fork:
            raise NetError(f"layer {param.name!r}: unknown layer type {param.type!r}, from "
                           f"{fork}, which caffe_ocl does not implement; supply one with "
                           f"caffe_ocl.register_layer({param.type!r}, YourLayerClass)")
        close = difflib.get_close_matches(param.type, list(_REGISTRY), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise NetError(f"layer {param.name!r}: unknown layer type {param.type!r}{hint} "
                       f"(known types: caffe_ocl.layer_type_list(); other types: "
                       f"caffe_ocl.register_layer({param.type!r}, YourLayerClass))")
    if cls.untrusted_refusal and config.get("UNTRUSTED"):
        raise NetError(f"layer {param.name!r} ({param.type}): refused for an untrusted "
                       f"model: this layer {cls.untrusted_refusal} (CAFFE_OCL_UNTRUSTED / "
                       "caffe_ocl.set_untrusted)")
    return cls(param, phase)


class Layer:
    type = None
    # what the layer does beyond computing (runs user code, writes files):
    # set for the layers an untrusted model may not use (config UNTRUSTED)
    untrusted_refusal = None
    # Blob-count declarations, as Caffe's ExactNumBottomBlobs() and friends.
    exact_num_bottom = None
    min_bottom = None
    max_bottom = None
    exact_num_top = None
    min_top = None
    max_top = None
    equal_num_bottom_top = False
    # (bottom list, blob.LAYOUT.epoch) of the last reshape_if_needed
    _checked = None
    # what else a layer's backward computes, when a fusion asks
    # (plan/train.py ReLUConvBackward and SplitConvBackward set a
    # Convolution's); part of the key its backward launches are built for
    bwd_variant = None
    # True when the layer can compute a gradient for bottom i (Caffe's
    # AllowForceBackward).
    allow_force_backward = True
    # True for layers whose outputs do not depend on bottoms' values in a
    # differentiable way (Data layers, Accuracy, ArgMax, ...).
    has_backward = True
    # True where reshape builds a lighter forward once ``propagate_down`` /
    # ``need_backward`` say no backward will run (the Net reshapes such
    # layers again after setting them): MAX pooling then writes no argmax
    # mask, an in-place PReLU (or ELU, AbsVal, ...) keeps no copy of its input.
    forward_reads_propagate_down = False

    def __init__(self, param, phase=None):
        self.param = param
        self.name = param.name
        self.phase = caffe_pb2.TEST if phase is None else phase
        self.device = get_device()
        self.blobs = []          # learnable parameters, Blob objects
        self.fwd = []            # Launch list built in reshape
        self.bwd = []
        self.loss_weights = []   # one per top
        self.param_propagate_down = []
        self.propagate_down = None   # set by Net before backward plans are built
        # whether the Net will run this layer's backward at all (Caffe's
        # layer_need_backward: False in a deploy net without a loss or
        # force_backward); set by Net after its backward pass, True until then
        self.need_backward = True
        self._bwd_key = None
        self._reshapes = 0

    # ---- helpers for subclasses -------------------------------------------
    def error(self, msg, cls=LayerError):
        return cls(f"layer {self.name!r} ({self.type}): {msg}")

    def weight_version(self):
        """For launches that keep a derived copy of the weights (the first
        parameter blob: a convolution's or fully-connected layer's packed
        panels, ops.conv.OnChange): at TEST a function
        returning the weight blob's memory and its version (the copy is
        rewritten when they differ); at TRAIN None (the weights change at
        every step)."""
        if self.phase != caffe_pb2.TEST:
            return None
        mem = self.blobs[0].data_mem
        return lambda: (mem, mem.version)

    def new_param_blob(self, shape, index):
        b = Blob(shape, name=f"{self.name}.blobs[{index}]", device=self.device)
        return b

    # ---- lifecycle -----------------------------------------------------------
    def check_blob_counts(self, bottom, top):
        nb, nt = len(bottom), len(top)

        def fail(what, want, got):
            raise self.error(f"takes {want} {what} blob(s), got {got}", NetError)
        if self.exact_num_bottom is not None and nb != self.exact_num_bottom:
            fail("bottom", self.exact_num_bottom, nb)
        if self.min_bottom is not None and nb < self.min_bottom:
            fail("bottom", f"at least {self.min_bottom}", nb)
        if self.max_bottom is not None and nb > self.max_bottom:
            fail("bottom", f"at most {self.max_bottom}", nb)
        if self.exact_num_top is not None and nt != self.exact_num_top:
            fail("top", self.exact_num_top, nt)
        if self.min_top is not None and nt < self.min_top:
            fail("top", f"at least {self.min_top}", nt)
        if self.max_top is not None and nt > self.max_top:
            fail("top", f"at most {self.max_top}", nt)
        if self.equal_num_bottom_top and nb != nt:
            raise self.error(f"needs as many tops as bottoms ({nb} vs {nt})", NetError)

    def setup(self, bottom, top):
        self.check_blob_counts(bottom, top)
        self.layer_setup(bottom, top)
        if len(self.param_propagate_down) != len(self.blobs):
            self.param_propagate_down = [True] * len(self.blobs)
        if self.propagate_down is None:
            self.propagate_down = [False] * len(bottom)
        with self.builds():
            self.reshape(bottom, top)
        self.set_loss_weights(top)
        self._shapes = [b.shape for b in bottom]
        self._reshapes = 1
        self._checked = None

    def layer_setup(self, bottom, top):
        pass

    def reshape(self, bottom, top):
        raise NotImplementedError(f"{type(self).__name__}.reshape")

    def reshape_if_needed(self, bottom, top):
        # the same bottoms as at the last check, and no blob's shape (nor
        # the memory behind one) changed since (blob.LAYOUT): nothing to
        # compare -- at batch 1 on a GPU the host's walk over the layers
        # is what the device waits for
        c = self._checked
        if c is not None and c[0] is bottom and c[1] == LAYOUT.epoch:
            return False
        shapes = [b.shape for b in bottom]
        changed = shapes != self._shapes
        if changed:
            with self.builds():
                self.reshape(bottom, top)
            self._shapes = shapes
            self._reshapes += 1
            self._fill_loss_diffs(top)
        self._checked = (bottom, LAYOUT.epoch)
        return changed

    @property
    def reshape_count(self):
        """How many times the launch plans were (re)built: a fused group
        compares it with the count it built its own launches for."""
        return self._reshapes

    def forget_backward_plan(self):
        """The backward launches bound buffers that changed (a diff memory
        plan gave a blob another diff): rebuild them at the next backward."""
        self._bwd_key = None

    def rebuild_at_next_reshape(self):
        """A blob's buffer changed, not its shape (plan/concat_chain.py):
        the next ``reshape_if_needed`` (the net's walk reaches this layer
        with its bottoms' shapes settled) builds the launch plans again,
        the backward's at its next run."""
        self._shapes = None
        self._checked = None
        self._bwd_key = None

    def rebind(self, bottom, top):
        """Rebuild the launch plans after a parameter blob changed storage
        (shared weights): same shapes, new buffers to bind."""
        with self.builds():
            self.reshape(bottom, top)
        self._reshapes += 1

    def builds(self):
        """The context this layer builds its launches in: a TRAIN layer's
        forwards may take another Winograd tile (ops/winograd.py
        train_forwards)."""
        return wino_ops.train_forwards(self.phase == caffe_pb2.TRAIN)

    def set_loss_weights(self, top):
        lw = list(self.param.loss_weight)
        if lw:
            if len(lw) != len(top):
                raise self.error(f"loss_weight must be given once per top "
                                 f"({len(top)}), got {len(lw)}", NetError)
            self.loss_weights = lw
        else:
            self.loss_weights = [self.default_loss_weight(i) for i in range(len(top))]
        self._fill_loss_diffs(top)

    def _fill_loss_diffs(self, top):
        """Caffe seeds backward by storing each loss weight in its top's diff."""
        for t, w in zip(top, self.loss_weights):
            if w:
                pointwise.fill(t.diff_mem.device, t.diff_buffer(), t.count, w)
                t.diff_mem.device_written()

    def default_loss_weight(self, top_index):
        """Caffe: loss layers weigh their first top by 1, others 0."""
        return 0.0

    # ---- run -------------------------------------------------------------------
    def forward(self, bottom, top):
        for b in bottom:
            b.data_mem.to_device()
        for p in self.blobs:     # the user may have written weights on the host
            p.data_mem.to_device()
        self.forward_impl(bottom, top)
        for t in top:
            t.data_mem.device_written()

    def forward_impl(self, bottom, top):
        q = self.device.queue
        for launch in self.fwd:
            launch.run(q)

    def build_backward(self, bottom, top):
        """Fill ``self.bwd`` for the current shapes and propagate flags."""
        if self.has_backward:
            raise NotImplementedError(f"{self.type} layer: backward not implemented")
        self.bwd = []

    def backward(self, top, propagate_down, bottom):
        propagate_down = list(propagate_down)
        key = (self._reshapes, tuple(propagate_down), tuple(self.param_propagate_down),
               self.bwd_variant)
        if key != self._bwd_key:
            self.propagate_down = propagate_down
            self.bwd = []
            self.build_backward(bottom, top)
            self._bwd_key = key
        for t in top:
            t.diff_mem.to_device()
        for b in bottom:
            b.data_mem.to_device()
        for p, pp in zip(self.blobs, self.param_propagate_down):
            p.data_mem.to_device()
            if pp:
                p.diff_mem.to_device()
        self.backward_impl(top, propagate_down, bottom)
        for b, pd in zip(bottom, propagate_down):
            if pd:
                b.diff_mem.device_written()
        for p, pp in zip(self.blobs, self.param_propagate_down):
            if pp:
                p.diff_mem.device_written()

    def backward_impl(self, top, propagate_down, bottom):
        q = self.device.queue
        for launch in self.bwd:
            launch.run(q)

    # ---- shape checks shared by many layers ------------------------------------
    def canonical_axis(self, blob, axis, what="axis"):
        """``blob.canonical_axis(axis)``, failing with this layer's name."""
        try:
            return blob.canonical_axis(axis)
        except ShapeError:
            raise self.error(f"{what} {axis} out of range for bottom {blob.name!r} of "
                             f"shape {blob.shape}", ShapeError) from None

    def require_same_shape(self, a, b, what="bottoms"):
        if a.shape != b.shape:
            raise self.error(f"{what} must have the same shape: {a.name!r} {a.shape} "
                             f"vs {b.name!r} {b.shape}", ShapeError)

    def __repr__(self):
        return f"<{type(self).__name__} {self.name!r}>"
