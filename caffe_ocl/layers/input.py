"""Layers that make blobs from nothing: Input, DummyData."""
from ..proto import caffe_pb2
from . import fillers
from .base import Layer, register


def _legacy_shapes(layer, p, ntop):
    """DummyData's shape fields: `shape` or legacy num/channels/height/width,
    each given once (shared) or once per top."""
    if len(p.shape):
        if len(p.num) or len(p.channels) or len(p.height) or len(p.width):
            raise layer.error("give either shape or num/channels/height/width, not both")
        shapes = [tuple(s.dim) for s in p.shape]
    else:
        cols = [list(p.num), list(p.channels), list(p.height), list(p.width)]
        n = max(len(c) for c in cols)
        if any(len(c) not in (1, n) for c in cols) or n == 0:
            raise layer.error("num, channels, height and width must each be given "
                              "once or once per top")
        shapes = [tuple(c[i] if len(c) > 1 else c[0] for c in cols) for i in range(n)]
    if len(shapes) not in (1, ntop):
        raise layer.error(f"{len(shapes)} shapes given for {ntop} tops")
    return shapes * ntop if len(shapes) == 1 else shapes


@register("Input")
class InputLayer(Layer):
    exact_num_bottom = 0
    min_top = 1
    has_backward = False
    traceable = True        # its forward does nothing (plan/trace.py)

    def layer_setup(self, bottom, top):
        shapes = [tuple(s.dim) for s in self.param.input_param.shape]
        if len(shapes) not in (0, 1, len(top)):
            raise self.error(f"input_param has {len(shapes)} shapes for {len(top)} tops; "
                             "give one shape, or one per top")
        for i, t in enumerate(top):
            if shapes:
                t.reshape(shapes[0] if len(shapes) == 1 else shapes[i])

    def reshape(self, bottom, top):
        pass   # the user reshapes inputs; nothing to compute

    def forward(self, bottom, top):
        pass   # the tops hold whatever the user wrote; leave their sync state alone


@register("DummyData")
class DummyDataLayer(Layer):
    exact_num_bottom = 0
    min_top = 1
    has_backward = False

    def layer_setup(self, bottom, top):
        p = self.param.dummy_data_param
        shapes = _legacy_shapes(self, p, len(top))
        fl = list(p.data_filler)
        if len(fl) not in (0, 1, len(top)):
            raise self.error(f"{len(fl)} data_fillers for {len(top)} tops")
        if not fl:
            f = caffe_pb2.FillerParameter()
            f.type = "constant"
            f.value = 0
            fl = [f]
        self.fillers = fl * len(top) if len(fl) == 1 else fl
        # Caffe refills non-constant fillers on every forward
        self.refill = [f.type != "constant" for f in self.fillers]
        for t, s, f in zip(top, shapes, self.fillers):
            t.reshape(s)
            fillers.fill(t, f, f"layer {self.name!r} data_filler")

    def reshape(self, bottom, top):
        pass

    @property
    def traceable(self):
        """With constant fillers only (filled once, at setup) the forward
        does nothing: a forward trace replays around it (plan/trace.py).
        onnx2caffe's zero padding blobs were live steps breaking the
        replayed segments of NFNet, CoaT, EfficientViT and LeViT."""
        return not any(self.refill)

    def forward(self, bottom, top):
        for t, f, r in zip(top, self.fillers, self.refill):
            if r:
                fillers.fill(t, f, f"layer {self.name!r} data_filler")
