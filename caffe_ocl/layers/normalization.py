"""Normalization layers: BatchNorm, MVN, Scale, Bias.

BatchNorm keeps Caffe's three blobs (running mean sum, running variance
sum, moving-average scale factor) and never learns them: its ParamSpecs get
lr_mult 0 as in Caffe, and backward writes no parameter gradient. Scale and
Bias broadcast a blob (learned, or a second bottom) over Caffe's
"outer x dim x inner" pattern of bottom[0]."""
from ..blob import Blob
from ..errors import ShapeError
from ..ops import channel as chan_ops
from ..ops import normalization as norm_ops
from ..ops import pointwise
from ..proto import caffe_pb2
from . import fillers
from .base import Layer, register


@register("BatchNorm")
class BatchNormLayer(Layer):
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.batch_norm_param
        self.maf = p.moving_average_fraction
        self.use_global_stats = (p.use_global_stats if p.HasField("use_global_stats")
                                 else self.phase == caffe_pb2.TEST)
        self.eps = p.eps
        b = bottom[0]
        if b.num_axes < 1:
            raise self.error(f"bottom {b.name!r} has shape {b.shape}; BatchNorm needs at "
                             "least 1 axis (num[, channels, ...])", ShapeError)
        self.channels = 1 if b.num_axes == 1 else b.shape[1]
        if self.channels < 1:
            raise self.error(f"bottom {b.name!r} {b.shape} has no channels", ShapeError)
        shapes = [(self.channels,), (self.channels,), (1,)]
        self.blobs = [self.new_param_blob(s, i) for i, s in enumerate(shapes)]
        for blob in self.blobs:
            pointwise.fill(self.device, blob.data_buffer(), blob.count, 0.0)
            blob.data_mem.device_written()
        # Caffe: the statistics are not parameters; mask them with lr_mult 0.
        for i in range(3):
            if len(self.param.param) == i:
                self.param.param.add().lr_mult = 0.0
            elif self.param.param[i].lr_mult != 0:
                raise self.error(f"param {i} has lr_mult {self.param.param[i].lr_mult}: "
                                 "cannot configure batch normalization statistics as "
                                 "layer parameters (lr_mult must be 0)")
        self.param_propagate_down = [False] * 3

    def reshape(self, bottom, top):
        b = bottom[0]
        if b.num_axes < 1:
            raise self.error(f"bottom {b.name!r} has shape {b.shape}; needs at least 1 axis",
                             ShapeError)
        c = 1 if b.num_axes == 1 else b.shape[1]
        if c != self.channels:
            raise self.error(f"bottom {b.name!r} {b.shape} has {c} channels, the "
                             f"statistics blobs have {self.channels}", ShapeError)
        top[0].reshape(b.shape)
        num = b.shape[0]
        self.dims = (num, c, b.count // max(num * c, 1))
        dev = self.device
        self.mean = Blob((c,), name=f"{self.name}.mean", device=dev)
        self.stdv = Blob((c,), name=f"{self.name}.std", device=dev)
        if self.use_global_stats:
            self.x_norm = None
        elif getattr(self, "x_norm", None) is None:
            self.x_norm = Blob(b.shape, name=f"{self.name}.x_norm", device=dev)
        else:   # keep the blob: an in-place Scale may read it (plan/memory.py bn_for_scale)
            self.x_norm.reshape(b.shape)
        O, C, I = self.dims
        x, y = b.data_buffer(), top[0].data_buffer()
        mean, std = self.mean.data_buffer(), self.stdv.data_buffer()
        run = [blob.data_buffer() for blob in self.blobs]
        if b.count == 0:
            self.fwd = []
            return
        if self.use_global_stats:
            self.fwd = [norm_ops.bn_global_stats(dev, C, *run, mean, std, self.eps),
                        norm_ops.normalize(dev, O, C, I, x, mean, std, y)]
        else:
            self.fwd = [*norm_ops.bn_train_stats(dev, O, C, I, x, mean, std, self.eps,
                                                 *run, self.maf),
                        norm_ops.normalize(dev, O, C, I, x, mean, std, y,
                                           xnorm=self.x_norm.data_buffer())]

    def forward_impl(self, bottom, top):
        super().forward_impl(bottom, top)
        if not self.use_global_stats:
            for blob in self.blobs:      # moving averages were updated on the device
                blob.data_mem.device_written()

    def build_backward(self, bottom, top):
        # No parameter gradients ever (the statistics are not learned).
        if not self.propagate_down[0] or bottom[0].count == 0:
            return
        O, C, I = self.dims
        dy, dx = top[0].diff_buffer(), bottom[0].diff_buffer()
        std = self.stdv.data_buffer()
        if self.use_global_stats:
            self.bwd = [norm_ops.channel_div(self.device, O, C, I, dy, std, dx)]
        else:
            self.bwd = norm_ops.bn_backward(self.device, O, C, I, dy,
                                            self.x_norm.data_buffer(), std, dx)


@register("MVN")
class MVNLayer(Layer):
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.mvn_param
        self.normalize_variance = p.normalize_variance
        self.across_channels = p.across_channels
        self.eps = p.eps

    def reshape(self, bottom, top):
        b = bottom[0]
        need = 1 if self.across_channels else 2
        if b.num_axes < need:
            raise self.error(f"bottom {b.name!r} has shape {b.shape}; MVN needs at least "
                             f"{need} axes (num{', channels' if need == 2 else ''}, ...)",
                             ShapeError)
        top[0].reshape(b.shape)
        rows = b.shape[0] if self.across_channels else b.shape[0] * b.shape[1]
        dim = b.count // rows if rows else 0
        self.dims = (rows, dim)
        dev = self.device
        self.mean = Blob((max(rows, 1),), name=f"{self.name}.mean", device=dev)
        self.stdv = Blob((max(rows, 1),), name=f"{self.name}.std", device=dev)
        if b.count == 0:
            self.fwd = []
            return
        mean, std = self.mean.data_buffer(), self.stdv.data_buffer()
        self.fwd = [norm_ops.mvn_stats(dev, rows, dim, b.data_buffer(), mean, std, self.eps),
                    norm_ops.normalize(dev, 1, rows, dim, b.data_buffer(), mean, std,
                                       top[0].data_buffer(),
                                       use_std=self.normalize_variance)]

    def build_backward(self, bottom, top):
        if not self.propagate_down[0] or bottom[0].count == 0:
            return
        rows, dim = self.dims
        self.bwd = [norm_ops.normalize_backward(
            self.device, 1, rows, dim, top[0].diff_buffer(), top[0].data_buffer(),
            self.stdv.data_buffer(), bottom[0].diff_buffer(),
            use_std=self.normalize_variance)]


# ---- Scale / Bias -----------------------------------------------------------

def _param_shape(layer, bottom0, axis, num_axes, what):
    """Shape of a learned scale/bias blob: bottom0's axes [axis, axis+num_axes)."""
    axis = layer.canonical_axis(bottom0, axis)
    if num_axes < -1:
        raise layer.error(f"num_axes must be non-negative, or -1 to extend to the end "
                          f"of bottom[0]; got {num_axes}")
    if num_axes >= 0 and bottom0.num_axes < axis + num_axes:
        raise layer.error(f"{what} blob's shape extends past bottom[0]'s shape "
                          f"{bottom0.shape} when applied starting with axis {axis} "
                          f"(num_axes {num_axes})", ShapeError)
    end = bottom0.num_axes if num_axes == -1 else axis + num_axes
    return bottom0.shape[axis:end]


def _pattern(layer, bottom0, other, axis, what):
    """(outer, dim, inner) of bottom0 for a broadcast blob ``other``, as
    Caffe's Scale/Bias Reshape (a scalar uses axis 0)."""
    axis = 0 if other.num_axes == 0 else layer.canonical_axis(bottom0, axis)
    k = other.num_axes
    if bottom0.num_axes < axis + k or bottom0.shape[axis:axis + k] != other.shape:
        raise layer.error(
            f"{what} {other.name!r} of shape {other.shape} does not match bottom[0] "
            f"{bottom0.name!r} {bottom0.shape} at axes [{axis}, {axis + k}) "
            f"(found {bottom0.shape[axis:axis + k]})", ShapeError)
    return (bottom0.count_range(0, axis), other.count,
            bottom0.count_range(axis + k))


@register("Bias")
class BiasLayer(Layer):
    min_bottom = 1
    max_bottom = 2
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.bias_param
        if len(bottom) == 1:
            shape = _param_shape(self, bottom[0], p.axis, p.num_axes, "bias")
            self.blobs = [self.new_param_blob(shape, 0)]
            fillers.fill(self.blobs[0], p.filler, f"layer {self.name!r} filler")

    def reshape(self, bottom, top):
        bias = bottom[1] if len(bottom) > 1 else self.blobs[0]
        self.dims = _pattern(self, bottom[0], bias, self.param.bias_param.axis,
                             "bias (bottom[1])" if len(bottom) > 1 else "bias blob")
        self.in_place = bottom[0] is top[0]
        top[0].reshape(bottom[0].shape)
        n = bottom[0].count
        self.fwd = [chan_ops.affine(self.device, *self.dims, bottom[0].data_buffer(),
                                    top[0].data_buffer(), bias=bias.data_buffer())] if n else []

    def build_backward(self, bottom, top):
        dev, n = self.device, bottom[0].count
        if n == 0:
            return
        dy = top[0].diff_buffer()
        if self.propagate_down[0] and not self.in_place:
            self.bwd.append(pointwise.copy(dev, n, dy, bottom[0].diff_buffer()))
        param = len(bottom) == 1
        if (param and self.param_propagate_down[0]) or (not param and self.propagate_down[1]):
            target = self.blobs[0] if param else bottom[1]
            self.bwd.extend(chan_ops.channel_sum(dev, *self.dims, dy, target.diff_buffer(),
                                                 accumulate=param))


@register("Scale")
class ScaleLayer(Layer):
    min_bottom = 1
    max_bottom = 2
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.scale_param
        self.blobs = []
        if len(bottom) == 1:
            shape = _param_shape(self, bottom[0], p.axis, p.num_axes, "scale")
            self.blobs.append(self.new_param_blob(shape, 0))
            if p.HasField("filler"):
                filler = p.filler
            else:   # default: identity
                filler = caffe_pb2.FillerParameter(type="constant", value=1.0)
            fillers.fill(self.blobs[0], filler, f"layer {self.name!r} filler")
        self.bias_term = p.bias_term
        if self.bias_term:
            # Caffe builds an inner Bias layer with the same axis, and num_axes
            # of bottom[1] when the scale is a bottom.
            nax = bottom[1].num_axes if len(bottom) > 1 else p.num_axes
            shape = _param_shape(self, bottom[0], p.axis, nax, "bias")
            self.bias_id = len(self.blobs)
            self.blobs.append(self.new_param_blob(shape, self.bias_id))
            fillers.fill(self.blobs[-1], p.bias_filler, f"layer {self.name!r} bias_filler")

    def reshape(self, bottom, top):
        p = self.param.scale_param
        two = len(bottom) > 1
        scale = bottom[1] if two else self.blobs[0]
        self.dims = _pattern(self, bottom[0], scale, p.axis,
                             "scale (bottom[1])" if two else "scale blob")
        if self.bias_term:
            bdims = _pattern(self, bottom[0], self.blobs[self.bias_id], p.axis, "bias blob")
            if bdims != self.dims:
                raise self.error(f"bias blob {self.blobs[self.bias_id].shape} does not "
                                 f"broadcast like the scale {scale.shape}", ShapeError)
        self.in_place = bottom[0] is top[0]
        top[0].reshape(bottom[0].shape)
        dev, n = self.device, bottom[0].count
        src = getattr(self, "_input_copy_of", None)
        shared = (self.in_place and src is not None and src.x_norm is not None
                  and src.x_norm.shape == bottom[0].shape)
        if shared:          # BatchNorm's x_norm already holds our input
            self.temp = src.x_norm
        else:
            self.temp = Blob(bottom[0].shape, name=f"{self.name}.temp", device=dev) \
                if self.in_place else None
        self.fwd = []
        if n == 0:
            return
        x = bottom[0].data_buffer()
        if self.in_place and not shared:   # keep x for the scale gradient
            self.fwd.append(pointwise.copy(dev, n, x, self.temp.data_buffer()))
        bias = self.blobs[self.bias_id].data_buffer() if self.bias_term else None
        self.fwd.append(chan_ops.affine(dev, *self.dims, x, top[0].data_buffer(),
                                        scale=scale.data_buffer(), bias=bias))

    def use_input_copy(self, batch_norm):
        """Read the input for the scale gradient from ``batch_norm.x_norm``
        instead of copying it (call before setup). The Net does this when this
        in-place Scale directly follows a training BatchNorm on the same blob,
        whose output is x_norm bit for bit: caffe_ocl/plan/memory.py
        bn_for_scale."""
        self._input_copy_of = batch_norm

    def build_backward(self, bottom, top):
        dev, n = self.device, bottom[0].count
        if n == 0:
            return
        dy = top[0].diff_buffer()
        two = len(bottom) > 1
        scale = bottom[1] if two else self.blobs[0]
        # order matters in place: dy is dx, so gradients that read dy come first.
        # The bias (sum dy) and scale (sum dy*x) gradients share one pass.
        want_bias = self.bias_term and self.param_propagate_down[self.bias_id]
        want_scale = (two and self.propagate_down[1]) or \
            (not two and self.param_propagate_down[0])
        if want_bias or want_scale:
            x = self.temp.data_buffer() if self.in_place else bottom[0].data_buffer()
            self.bwd.extend(chan_ops.channel_sums(
                dev, *self.dims, dy, x if want_scale else None,
                out1=self.blobs[self.bias_id].diff_buffer() if want_bias else None,
                out2=scale.diff_buffer() if want_scale else None,
                acc1=True, acc2=not two))
        if self.propagate_down[0]:
            self.bwd.append(chan_ops.affine(dev, *self.dims, dy, bottom[0].diff_buffer(),
                                            scale=scale.data_buffer()))
