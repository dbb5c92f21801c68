"""Vision layers: Convolution, Deconvolution, Pooling, LRN."""
import math

from .. import config
from ..blob import Blob
from ..errors import LayerError, ShapeError
from ..ops import conv as conv_ops
from ..ops import conv_nd
from ..ops import lrn as lrn_ops
from ..ops import pointwise
from ..ops import pool as pool_ops
from ..proto import caffe_pb2
from . import fillers
from .base import Layer, register


def _per_axis(layer, repeated, h, w, has_h, default, what):
    """Caffe's kernel_size/pad/stride/dilation: one value, one per spatial
    axis, or the explicit _h/_w fields."""
    if has_h:
        if len(repeated):
            raise layer.error(f"either {what} or {what}_h/_w should be given, not both")
        return (h, w)
    if len(repeated) == 0:
        if default is None:
            raise layer.error(f"{what} is required")
        return (default, default)
    if len(repeated) == 1:
        return (repeated[0], repeated[0])
    if len(repeated) == 2:
        return (repeated[0], repeated[1])
    raise layer.error(f"{what} has {len(repeated)} values; 2-D convolution takes 1 or 2")


def _per_axis_nd(layer, repeated, n, default, what):
    """Caffe's N-D kernel_size/pad/stride/dilation: none (the default), one
    value for every axis, or one per axis."""
    if len(repeated) == 0:
        if default is None:
            raise layer.error(f"{what} is required")
        return (default,) * n
    if len(repeated) == 1:
        return (repeated[0],) * n
    if len(repeated) == n:
        return tuple(repeated)
    raise layer.error(f"{what} has {len(repeated)} values; {n}-D convolution takes 1 or {n}")


def read_conv_geometry(layer, p, bottom, what, nd=False):
    """Set ``layer.axis``, ``spatial`` (the number of spatial axes),
    ``kernel``, ``pad``, ``stride``, ``dilation`` (one value per spatial
    axis) from a ConvolutionParameter, with Caffe's checks; shared by
    Convolution, Deconvolution (``nd``: any number of spatial axes, as
    Caffe's) and Im2col (2-D only)."""
    layer.axis = layer.canonical_axis(bottom, p.axis)
    spatial = bottom.num_axes - layer.axis - 1
    layer.spatial = spatial
    if spatial != 2 and not (nd and spatial >= 1):
        need = "at least 1 spatial axis" if nd else "2 spatial axes (2-D only)"
        raise layer.error(f"{what} needs {need}; bottom {bottom.name!r} "
                          f"{bottom.shape} has {spatial} spatial axes after axis "
                          f"{layer.axis}", ShapeError)
    if spatial != 2:
        if any(p.HasField(f) for f in ("kernel_h", "kernel_w", "pad_h", "pad_w",
                                        "stride_h", "stride_w")):
            raise layer.error("kernel_h/_w, pad_h/_w and stride_h/_w can only be used for "
                              f"2-D convolution; this one has {spatial} spatial axes")
        layer.kernel = _per_axis_nd(layer, p.kernel_size, spatial, None, "kernel_size")
        layer.pad = _per_axis_nd(layer, p.pad, spatial, 0, "pad")
        layer.stride = _per_axis_nd(layer, p.stride, spatial, 1, "stride")
        layer.dilation = _per_axis_nd(layer, p.dilation, spatial, 1, "dilation")
        if min(layer.kernel) <= 0 or min(layer.stride) <= 0 or min(layer.dilation) <= 0:
            raise layer.error(f"kernel {layer.kernel}, stride {layer.stride} and dilation "
                              f"{layer.dilation} must be positive")
        return
    layer.kernel = _per_axis(layer, p.kernel_size, p.kernel_h, p.kernel_w,
                             p.HasField("kernel_h") or p.HasField("kernel_w"), None,
                             "kernel_size")
    layer.pad = _per_axis(layer, p.pad, p.pad_h, p.pad_w,
                          p.HasField("pad_h") or p.HasField("pad_w"), 0, "pad")
    layer.stride = _per_axis(layer, p.stride, p.stride_h, p.stride_w,
                             p.HasField("stride_h") or p.HasField("stride_w"), 1, "stride")
    layer.dilation = _per_axis(layer, p.dilation, 0, 0, False, 1, "dilation")
    if min(layer.kernel) <= 0 or min(layer.stride) <= 0 or min(layer.dilation) <= 0:
        raise layer.error(f"kernel {layer.kernel}, stride {layer.stride} and dilation "
                          f"{layer.dilation} must be positive")


class BaseConvolution(Layer):
    exact_num_bottom = None
    min_bottom = 1
    min_top = 1
    equal_num_bottom_top = True
    reverse = False   # Deconvolution: the bottom is the column side

    def layer_setup(self, bottom, top):
        p = self.param.convolution_param
        read_conv_geometry(self, p, bottom[0], "convolution", nd=True)
        self.num_output = p.num_output
        self.group = p.group
        self.channels = bottom[0].shape[self.axis]
        if self.num_output <= 0:
            raise self.error("num_output must be positive")
        if self.channels % self.group or self.num_output % self.group:
            raise self.error(f"channels ({self.channels}) and num_output "
                             f"({self.num_output}) must be multiples of group ({self.group})",
                             ShapeError)
        self.bias_term = p.bias_term
        if self.reverse:
            wshape = (self.channels, self.num_output // self.group) + self.kernel
        else:
            wshape = (self.num_output, self.channels // self.group) + self.kernel
        self.blobs = [self.new_param_blob(wshape, 0)]
        fillers.fill(self.blobs[0], p.weight_filler, f"layer {self.name!r} weight_filler")
        if self.bias_term:
            self.blobs.append(self.new_param_blob((self.num_output,), 1))
            fillers.fill(self.blobs[1], p.bias_filler, f"layer {self.name!r} bias_filler")

    def _geometry(self, shape):
        if self.spatial != 2:
            return self._nd_geometry(shape)
        n = int(math.prod(shape[:self.axis]))
        c, h, w = shape[self.axis:]
        if c != self.channels:
            raise self.error(f"bottom has {c} channels, the weights expect {self.channels}",
                             ShapeError)
        if self.reverse:
            # image side = top (channels num_output), column side = bottom
            kh, kw = self.kernel
            (ph, pw), (sh, sw), (dh, dw) = self.pad, self.stride, self.dilation
            oh = sh * (h - 1) + (dh * (kh - 1) + 1) - 2 * ph
            ow = sw * (w - 1) + (dw * (kw - 1) + 1) - 2 * pw
            g = conv_ops.ConvGeometry(n, self.num_output, oh, ow, self.channels, kh, kw,
                                      ph, pw, sh, sw, dh, dw, self.group)
            return g, (g.channels, oh, ow)
        g = conv_ops.ConvGeometry(n, c, h, w, self.num_output, *self.kernel, *self.pad,
                                  *self.stride, *self.dilation, self.group)
        if g.out_h <= 0 or g.out_w <= 0:
            raise self.error(f"kernel {self.kernel} (dilation {self.dilation}) does not fit "
                             f"input {h}x{w} with pad {self.pad}", ShapeError)
        return g, (self.num_output, g.out_h, g.out_w)

    def _nd_geometry(self, shape):
        """1-D, 3-D, ... (ops/conv_nd.py), with Caffe's output sizes."""
        n = int(math.prod(shape[:self.axis]))
        c, spatial = shape[self.axis], tuple(shape[self.axis + 1:])
        if c != self.channels:
            raise self.error(f"bottom has {c} channels, the weights expect {self.channels}",
                             ShapeError)
        params = (self.kernel, self.pad, self.stride, self.dilation)
        if self.reverse:     # image side = top
            image = tuple(s * (i - 1) + (d * (k - 1) + 1) - 2 * p
                          for i, k, p, s, d in zip(spatial, *params))
            g = conv_nd.NdGeometry(n, self.num_output, image, self.channels, *params,
                                   self.group)
            outer = (self.num_output,) + image
        else:
            g = conv_nd.NdGeometry(n, c, spatial, self.num_output, *params, self.group)
            outer = (self.num_output,) + g.out_shape
        if min(g.out_shape + g.shape) <= 0:
            raise self.error(f"kernel {self.kernel} (dilation {self.dilation}) does not fit "
                             f"input {'x'.join(map(str, spatial))} with pad {self.pad}",
                             ShapeError)
        return g, outer

    def reshape(self, bottom, top):
        shape0 = bottom[0].shape
        for b in bottom[1:]:
            if b.shape != shape0:
                raise self.error(f"all bottoms must have the same shape: {b.name!r} "
                                 f"{b.shape} vs {shape0}", ShapeError)
        self.geom, out = self._geometry(shape0)
        for t in top:
            t.reshape(shape0[:self.axis] + out)
        if self.spatial != 2:
            return self._reshape_nd(bottom, top)
        cf = conv_ops.workspace_floats(self.device, self.geom)
        # the column workspace holds nothing between launches: one per device
        self.col = self.device.shared_scratch(cf) if cf else None
        colbuf = self.col
        w = self.blobs[0].data_buffer()
        bias = self.blobs[1].data_buffer() if self.bias_term else None
        self.fwd = []
        for b, t in zip(bottom, top):
            if self.reverse:
                self.fwd += conv_ops.backward_data(self.device, self.geom, b.data_buffer(), w,
                                                   t.data_buffer(), colbuf)
                if bias is not None:
                    n, c = self.geom.num, self.num_output
                    self.fwd.append(pointwise.add_bias(
                        self.device, n, c, self.geom.height * self.geom.width,
                        t.data_buffer(), t.data_buffer(), bias))
            else:
                self.fwd += conv_ops.forward(self.device, self.geom, b.data_buffer(), w,
                                             t.data_buffer(), colbuf, bias,
                                             weight_version=self.weight_version())

    def _reshape_nd(self, bottom, top):
        g, dev = self.geom, self.device
        self.geo = conv_nd.geometry_buffer(dev, g)
        self.col = dev.shared_scratch(g.col_floats())
        w = self.blobs[0].data_buffer()
        bias = self.blobs[1].data_buffer() if self.bias_term else None
        self.fwd = []
        for b, t in zip(bottom, top):
            if self.reverse:
                self.fwd += conv_nd.backward_data(dev, g, self.geo, b.data_buffer(), w,
                                                  t.data_buffer(), self.col)
                if bias is not None:
                    self.fwd.append(pointwise.add_bias(dev, g.num, self.num_output,
                                                       g.in_spatial, t.data_buffer(),
                                                       t.data_buffer(), bias))
            else:
                self.fwd += conv_nd.forward(dev, g, self.geo, b.data_buffer(), w,
                                            t.data_buffer(), self.col, bias)

    def _build_backward_nd(self, bottom, top):
        g, dev, w = self.geom, self.device, self.blobs[0]
        for b, t in zip(bottom, top):
            if self.bias_term and self.param_propagate_down[1]:
                side = g.in_spatial if self.reverse else g.out_spatial
                self.bwd += conv_ops.bias_grad(dev, g.num, self.num_output, side,
                                               t.diff_buffer(), self.blobs[1].diff_buffer())
            if self.param_propagate_down[0]:
                # dW = sum of dy(columns) * im2col(x(image))^T; for a
                # Deconvolution the image side is its top (the gradient) and
                # the column side its bottom (the values)
                if self.reverse:
                    x, dy = t.diff_buffer(), b.data_buffer()
                else:
                    x, dy = b.data_buffer(), t.diff_buffer()
                self.bwd += conv_nd.backward_weight(dev, g, self.geo, x, dy, w.diff_buffer(),
                                                    self.col)
            if self.propagate_down[bottom.index(b)]:
                if self.reverse:
                    self.bwd += conv_nd.forward(dev, g, self.geo, t.diff_buffer(),
                                                w.data_buffer(), b.diff_buffer(), self.col)
                else:
                    self.bwd += conv_nd.backward_data(dev, g, self.geo, t.diff_buffer(),
                                                      w.data_buffer(), b.diff_buffer(),
                                                      self.col)

    def build_backward(self, bottom, top):
        if self.spatial != 2:
            return self._build_backward_nd(bottom, top)
        g, dev = self.geom, self.device
        w = self.blobs[0]
        colbuf = self.col
        for b, t in zip(bottom, top):
            if self.bias_term and self.param_propagate_down[1]:
                side = (g.height * g.width) if self.reverse else g.out_spatial
                self.bwd += conv_ops.bias_grad(dev, g.num, self.num_output, side,
                                               t.diff_buffer(), self.blobs[1].diff_buffer())
            if self.reverse:
                # dW: image side is the top (dy), column side is the bottom (x)
                if self.param_propagate_down[0]:
                    self.bwd += conv_ops.backward_weight(dev, g, t.diff_buffer(),
                                                         b.data_buffer(), w.diff_buffer(),
                                                         colbuf)
                if self.propagate_down[bottom.index(b)]:
                    self.bwd += conv_ops.forward(dev, g, t.diff_buffer(), w.data_buffer(),
                                                 b.diff_buffer(), colbuf)
            else:
                if self.param_propagate_down[0]:
                    self.bwd += conv_ops.backward_weight(dev, g, b.data_buffer(),
                                                         t.diff_buffer(), w.diff_buffer(),
                                                         colbuf)
                if self.propagate_down[bottom.index(b)]:
                    # bwd_variant, set by a fusion (plan/train.py): ("gate",
                    # blob, slope) of an in-place ReLU before this layer,
                    # whose backward the data gradient then includes
                    # (ReLUConvBackward); ("accumulate", blob): the data
                    # gradient is added to blob's diff instead of written
                    # to the bottom's (SplitConvBackward)
                    v = self.bwd_variant or (None,)
                    dx = v[1].diff_buffer() if v[0] == "accumulate" else b.diff_buffer()
                    self.bwd += conv_ops.backward_data(
                        dev, g, t.diff_buffer(), w.data_buffer(), dx, colbuf,
                        accumulate=v[0] == "accumulate",
                        gate=(v[1].data_buffer(), v[2]) if v[0] == "gate" else None)


@register("Convolution")
class ConvolutionLayer(BaseConvolution):
    pass


@register("Deconvolution")
class DeconvolutionLayer(BaseConvolution):
    reverse = True


# MAX pooling in nets that run no backward through it writes no argmax
# (setting SKIP_UNREAD_MASK; benchmarks/ab_cpu_infer.py --config-a
# SKIP_UNREAD_MASK=0 turns it back on to compare)


@register("Pooling")
class PoolingLayer(Layer):
    exact_num_bottom = 1
    min_top = 1
    max_top = 2

    MAX, AVE, STOCHASTIC = 0, 1, 2
    forward_reads_propagate_down = True     # no argmax mask without a backward

    def layer_setup(self, bottom, top):
        p = self.param.pooling_param
        self.method = p.pool
        self.global_pooling = p.global_pooling
        if self.global_pooling:
            if p.HasField("kernel_size") or p.HasField("kernel_h") or p.HasField("kernel_w"):
                raise self.error("with global_pooling the kernel size cannot be given")
            self.kernel = None
        elif p.HasField("kernel_h") or p.HasField("kernel_w"):
            if p.HasField("kernel_size"):
                raise self.error("either kernel_size or kernel_h/_w should be given, not both")
            self.kernel = (p.kernel_h, p.kernel_w)
        elif p.HasField("kernel_size"):
            self.kernel = (p.kernel_size, p.kernel_size)
        else:
            raise self.error("kernel_size (or kernel_h and kernel_w) is required")
        if p.HasField("pad_h") or p.HasField("pad_w"):
            self.pad = (p.pad_h, p.pad_w)
        else:
            self.pad = (p.pad, p.pad)
        if p.HasField("stride_h") or p.HasField("stride_w"):
            self.stride = (p.stride_h, p.stride_w)
        else:
            self.stride = (p.stride, p.stride)
        if self.kernel is not None and min(self.kernel) <= 0:
            raise self.error(f"kernel size must be positive, got {self.kernel}")
        if min(self.stride) <= 0:
            raise self.error(f"stride must be positive, got {self.stride}")
        if self.global_pooling and (self.pad != (0, 0) or self.stride != (1, 1)):
            raise self.error("with global_pooling, pad must be 0 and stride 1")
        if self.pad != (0, 0) and self.method not in (self.MAX, self.AVE):
            raise self.error("padding is implemented only for MAX and AVE pooling")
        if len(top) == 2 and self.method != self.MAX:
            raise self.error("a second top (the argmax mask) needs pool: MAX")
        self.round_ceil = True
        if hasattr(p, "round_mode") and p.HasField("round_mode"):
            self.round_ceil = p.round_mode == 0   # CEIL = 0, FLOOR = 1
        if p.HasField("ceil_mode"):       # the forks' spelling (OpenCV, DenseNet ports)
            if p.HasField("round_mode") and p.ceil_mode != self.round_ceil:
                raise self.error(f"ceil_mode: {str(p.ceil_mode).lower()} contradicts "
                                 f"round_mode: {'CEIL' if self.round_ceil else 'FLOOR'}; "
                                 "give one of them")
            self.round_ceil = p.ceil_mode
        if self.method == self.STOCHASTIC and self.phase == caffe_pb2.TRAIN:
            raise self.error("STOCHASTIC pooling is implemented for the TEST phase only",
                             LayerError)
        if self.method not in (self.MAX, self.AVE, self.STOCHASTIC):
            raise self.error(f"unknown pooling method {self.method}")

    def reshape(self, bottom, top):
        if bottom[0].num_axes != 4:
            raise self.error(f"input must have 4 axes, got {bottom[0].shape}", ShapeError)
        n, c, h, w = bottom[0].shape
        if self.global_pooling:
            self.kernel = (h, w)
        (kh, kw), (ph, pw), (sh, sw) = self.kernel, self.pad, self.stride
        if ph >= kh or pw >= kw:
            raise self.error(f"pad {self.pad} must be smaller than kernel {self.kernel}")
        rnd = math.ceil if self.round_ceil else math.floor
        ho = int(rnd((h + 2 * ph - kh) / sh)) + 1
        wo = int(rnd((w + 2 * pw - kw) / sw)) + 1
        if ph or pw:
            # Caffe: the last window must start inside the (padded) image
            if (ho - 1) * sh >= h + ph:
                ho -= 1
            if (wo - 1) * sw >= w + pw:
                wo -= 1
        if ho <= 0 or wo <= 0:
            raise self.error(f"kernel {self.kernel} does not fit input {h}x{w}", ShapeError)
        self.out_hw = (ho, wo)
        top[0].reshape((n, c, ho, wo))
        dev, x, y = self.device, bottom[0].data_buffer(), top[0].data_buffer()
        shape = (n, c, h, w)
        if self.method == self.MAX:
            if len(top) == 2:
                top[1].reshape((n, c, ho, wo))
                self.mask = top[1]
            elif (config.get("SKIP_UNREAD_MASK") and self.propagate_down is not None
                  and not any(self.propagate_down)):
                # the Net runs no backward here (a deploy net: nothing below a
                # loss, no force_backward), so Caffe's internal argmax would
                # be written and never read
                self.mask = None
            else:
                self.mask = Blob((n, c, ho, wo), name=f"{self.name}.mask", device=dev)
            self.fwd = [pool_ops.max_forward(dev, shape, self.out_hw, self.kernel,
                                             self.stride, self.pad, x, y,
                                             None if self.mask is None
                                             else self.mask.data_buffer())]
        elif self.method == self.AVE:
            self.fwd = [pool_ops.ave_forward(dev, shape, self.out_hw, self.kernel,
                                             self.stride, self.pad, x, y)]
        else:
            self.fwd = [pool_ops.stochastic_test_forward(dev, shape, self.out_hw,
                                                         self.kernel, self.stride, x, y)]

    def build_backward(self, bottom, top):
        if not self.propagate_down[0]:
            return
        dev, shape = self.device, bottom[0].shape
        dy, dx = top[0].diff_buffer(), bottom[0].diff_buffer()
        if self.method == self.MAX:
            self.bwd = [pool_ops.max_backward(dev, shape, self.out_hw, self.kernel,
                                              self.stride, self.pad, dy,
                                              self.mask.data_buffer(), dx)]
        elif self.method == self.AVE:
            self.bwd = [pool_ops.ave_backward(dev, shape, self.out_hw, self.kernel,
                                              self.stride, self.pad, dy, dx)]
        else:
            raise self.error("STOCHASTIC pooling has no backward at TEST")


@register("LRN")
class LRNLayer(Layer):
    exact_num_bottom = 1
    exact_num_top = 1
    ACROSS_CHANNELS, WITHIN_CHANNEL = 0, 1

    def layer_setup(self, bottom, top):
        p = self.param.lrn_param
        self.size = p.local_size
        if self.size % 2 == 0 or self.size <= 0:
            raise self.error(f"local_size must be odd and positive, got {self.size}")
        self.alpha, self.beta, self.k = p.alpha, p.beta, p.k
        self.region = p.norm_region

    def reshape(self, bottom, top):
        if bottom[0].num_axes != 4:
            raise self.error(f"input must have 4 axes, got {bottom[0].shape}", ShapeError)
        n, c, h, w = bottom[0].shape
        top[0].reshape(bottom[0].shape)
        self.scale = Blob(bottom[0].shape, name=f"{self.name}.scale", device=self.device)
        x, y, s = bottom[0].data_buffer(), top[0].data_buffer(), self.scale.data_buffer()
        if self.region == self.ACROSS_CHANNELS:
            self.fwd = [lrn_ops.across_forward(self.device, n, c, h * w, self.size,
                                               self.alpha, self.beta, self.k, x, s, y)]
        else:
            self.fwd = [lrn_ops.within_forward(self.device, n * c, h, w, self.size,
                                               self.alpha, self.beta, x, s, y)]

    def build_backward(self, bottom, top):
        if not self.propagate_down[0]:
            return
        n, c, h, w = bottom[0].shape
        args = (bottom[0].data_buffer(), top[0].data_buffer(), self.scale.data_buffer(),
                top[0].diff_buffer(), bottom[0].diff_buffer())
        if self.region == self.ACROSS_CHANNELS:
            self.bwd = [lrn_ops.across_backward(self.device, n, c, h * w, self.size,
                                                self.alpha, self.beta, *args)]
        else:
            self.bwd = [lrn_ops.within_backward(self.device, n * c, h, w, self.size,
                                                self.alpha, self.beta, *args)]
