"""Layers of the segmentation, mobile and Faster R-CNN Caffe forks (issue #23):
ShuffleChannel (farmingyard/ShuffleNet), Axpy (hujie-frank/SENet), BN
(alexgkendall/caffe-segnet, TimoSaemann/caffe-enet), Interp
(hszhao/PSPNet, DeepLab v2), Upsample (alexgkendall/caffe-segnet's
max-unpooling with a mask bottom; the YOLO ports' nearest-neighbour one),
ROIPooling (rbgirshick/caffe-fast-rcnn) and the MobileNet forks' depthwise
convolution types. Forward and backward follow each fork's source; the
numeric work is in kernels/fork_vision.cl (ops/fork_vision.py)."""
import ast

from ..blob import Blob
from ..errors import ShapeError
from ..ops import channel as channel_ops
from ..ops import fork_vision as fv
from ..ops import normalization as norm_ops
from ..ops import pointwise
from ..ops import random as rnd
from ..proto import caffe_pb2
from . import fillers
from .base import Layer, register
from .vision import ConvolutionLayer


def _require_4d(layer, blob, what="bottom"):
    if blob.num_axes != 4:
        raise layer.error(f"{what} {blob.name!r} must have 4 axes (num, channels, height, "
                          f"width), got {blob.shape}", ShapeError)


@register("DepthwiseConvolution", "ConvolutionDepthwise")
class DepthwiseConvolutionLayer(ConvolutionLayer):
    """yonghenglh6/DepthwiseConvolution's ``DepthwiseConvolution`` and the
    MobileNet ports' ``ConvolutionDepthwise``: a Convolution with the same
    parameters (``group`` = channels = num_output takes the direct
    depthwise kernels of ops/depthwise.py). It is a Convolution layer for
    the planning passes (``type`` stays "Convolution": ReLU/BN fusion apply)."""


@register("ShuffleChannel")
class ShuffleChannelLayer(Layer):
    """Channel shuffle: the channels seen as (group, C/group) are transposed
    to (C/group, group)."""
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        self.group = self.param.shuffle_channel_param.group
        if self.group < 1:
            raise self.error(f"group must be positive, got {self.group}")

    def reshape(self, bottom, top):
        b = bottom[0]
        if b.num_axes < 2:
            raise self.error(f"bottom {b.name!r} {b.shape} needs a channel axis", ShapeError)
        c = b.shape[1]
        if c % self.group:
            raise self.error(f"channels {c} of bottom {b.name!r} are not divisible by "
                             f"group {self.group}", ShapeError)
        self.dims = (b.shape[0], c, b.count_range(2))
        top[0].reshape(b.shape)
        n, c, sp = self.dims
        self.fwd = fv.shuffle_channel(self.device, n, c, self.group, sp, b.data_buffer(),
                                      top[0].data_buffer()) if b.count else []

    def build_backward(self, bottom, top):
        if self.propagate_down[0] and bottom[0].count:
            n, c, sp = self.dims
            self.bwd = fv.shuffle_channel(self.device, n, c, c // self.group, sp,
                                          top[0].diff_buffer(), bottom[0].diff_buffer())


@register("Axpy")
class AxpyLayer(Layer):
    """top = a * x + y: bottoms a (N, C, 1, 1), x and y (N, C, H, W)."""
    exact_num_bottom = 3
    exact_num_top = 1

    def reshape(self, bottom, top):
        a, x, y = bottom
        if x.shape != y.shape or x.num_axes < 2:
            raise self.error(f"bottoms x {x.name!r} {x.shape} and y {y.name!r} {y.shape} "
                             "must have the same shape (N, C, ...)", ShapeError)
        if a.count != x.shape[0] * x.shape[1] or a.shape[:2] != x.shape[:2]:
            raise self.error(f"bottom a {a.name!r} {a.shape} must be (N, C, 1, 1) for x "
                             f"{x.shape}", ShapeError)
        self.planes, self.spatial = x.shape[0] * x.shape[1], x.count_range(2)
        top[0].reshape(x.shape)
        self.fwd = fv.axpy_forward(self.device, self.planes, self.spatial, a.data_buffer(),
                                   x.data_buffer(), y.data_buffer(),
                                   top[0].data_buffer()) if x.count else []

    def build_backward(self, bottom, top):
        a, x, y = bottom
        if not x.count:
            return
        dev, dt = self.device, top[0].diff_buffer()
        if self.propagate_down[0]:
            self.bwd += fv.axpy_backward_a(dev, self.planes, self.spatial, x.data_buffer(),
                                           dt, a.diff_buffer())
        if self.propagate_down[1]:
            self.bwd += fv.axpy_backward_x(dev, self.planes, self.spatial, a.data_buffer(),
                                           dt, x.diff_buffer())
        if self.propagate_down[2]:
            self.bwd.append(pointwise.copy(dev, y.count, dt, y.diff_buffer()))


@register("Interp")
class InterpLayer(Layer):
    """PSPNet / DeepLab v2 bilinear resize (corners aligned). Output size from
    zoom_factor, shrink_factor, both, height + width, or a second bottom's
    spatial size (the fork's order); pad_beg/pad_end (<= 0) crop the input."""
    min_bottom = 1
    max_bottom = 2
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.interp_param
        self.pad_beg, self.pad_end = p.pad_beg, p.pad_end
        if self.pad_beg > 0 or self.pad_end > 0:
            raise self.error(f"only non-positive padding (cropping) is supported, got pad_beg "
                             f"{self.pad_beg}, pad_end {self.pad_end}")

    def _out_size(self, bottom, he, we):
        p = self.param.interp_param
        if len(bottom) > 1:
            if (p.HasField("shrink_factor") or p.HasField("zoom_factor") or p.HasField("height")
                    or p.HasField("width")):
                raise self.error("a second bottom cannot be combined with shrink_factor, "
                                 "zoom_factor, height or width (ambiguous)")
            _require_4d(self, bottom[1])
            return bottom[1].shape[2], bottom[1].shape[3]
        shrink, zoom = p.HasField("shrink_factor"), p.HasField("zoom_factor")
        if shrink and p.shrink_factor < 1:
            raise self.error(f"shrink_factor must be positive, got {p.shrink_factor}")
        if zoom and p.zoom_factor < 1:
            raise self.error(f"zoom_factor must be positive, got {p.zoom_factor}")
        if shrink:
            he, we = (he - 1) // p.shrink_factor + 1, (we - 1) // p.shrink_factor + 1
        if zoom:
            z = p.zoom_factor
            return he + (he - 1) * (z - 1), we + (we - 1) * (z - 1)
        if shrink:
            return he, we
        if p.HasField("height") and p.HasField("width"):
            return p.height, p.width
        raise self.error("output size unspecified: give zoom_factor, shrink_factor, height "
                         "and width, or a second bottom")

    def reshape(self, bottom, top):
        b = bottom[0]
        _require_4d(self, b)
        n, c, h, w = b.shape
        he, we = h + self.pad_beg + self.pad_end, w + self.pad_beg + self.pad_end
        if he <= 0 or we <= 0:
            raise self.error(f"input {h}x{w} cropped by pad_beg {self.pad_beg}, pad_end "
                             f"{self.pad_end} is empty", ShapeError)
        ho, wo = self._out_size(bottom, he, we)
        if ho <= 0 or wo <= 0:
            raise self.error(f"output size {ho}x{wo} must be positive", ShapeError)
        top[0].reshape((n, c, ho, wo))
        self.geo = (n * c, (-self.pad_beg, -self.pad_beg), (h, w), (he, we), (ho, wo))
        self.fwd = fv.interp_forward(self.device, *self.geo, b.data_buffer(),
                                     top[0].data_buffer()) if b.count else []

    def build_backward(self, bottom, top):
        if self.propagate_down[0] and bottom[0].count:
            self.bwd = fv.interp_backward(self.device, *self.geo, bottom[0].diff_buffer(),
                                          top[0].diff_buffer())


@register("Upsample")
class UpsampleLayer(Layer):
    """Two bottoms (SegNet): max-unpooling, top[mask[i]] = bottom[i] per plane,
    with the mask of a MAX Pooling's second top; output size upsample_h/_w,
    or bottom size * scale (scale_h/_w) less pad_out_h/_w. One bottom (the
    YOLO ports): nearest-neighbour upsampling by ``scale``."""
    min_bottom = 1
    max_bottom = 2
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.upsample_param
        self.explicit = p.HasField("upsample_h") or p.HasField("upsample_w")
        if self.explicit and not (p.HasField("upsample_h") and p.HasField("upsample_w")):
            raise self.error("upsample_h and upsample_w must be given together")
        if p.HasField("scale_h") != p.HasField("scale_w"):
            raise self.error("scale_h and scale_w must be given together")
        if p.HasField("scale_h") and p.HasField("scale"):
            raise self.error("either scale or scale_h/scale_w should be given, not both")
        if p.HasField("scale_h"):
            self.scale = (p.scale_h, p.scale_w)
        else:
            self.scale = (p.scale, p.scale)
        self.pad_out = (int(p.pad_out_h), int(p.pad_out_w))
        if (p.pad_out_h and self.scale[0] != 2) or (p.pad_out_w and self.scale[1] != 2):
            raise self.error("pad_out_h / pad_out_w work only with a scale of 2")
        if len(bottom) == 1:
            if self.explicit or p.HasField("scale_h") or self.scale[0] < 1:
                raise self.error("with one bottom (nearest-neighbour upsampling) give only a "
                                 "positive scale (no upsample_h/_w, scale_h/_w)")
        elif min(self.scale) < 1:
            raise self.error(f"scale must be positive, got {self.scale}")

    def reshape(self, bottom, top):
        b = bottom[0]
        _require_4d(self, b)
        n, c, h, w = b.shape
        dev = self.device
        if len(bottom) == 1:
            s = self.scale[0]
            top[0].reshape((n, c, h * s, w * s))
            self.fwd = fv.upsample_nearest_forward(dev, n * c, h, w, s, b.data_buffer(),
                                                   top[0].data_buffer()) if b.count else []
            return
        if bottom[1].shape != b.shape:
            raise self.error(f"mask bottom {bottom[1].name!r} {bottom[1].shape} must have the "
                             f"shape of bottom {b.name!r} {b.shape}", ShapeError)
        if self.explicit:
            p = self.param.upsample_param
            ho, wo = p.upsample_h, p.upsample_w
        else:
            ho = h * self.scale[0] - self.pad_out[0]
            wo = w * self.scale[1] - self.pad_out[1]
        if ho <= 0 or wo <= 0:
            raise self.error(f"output size {ho}x{wo} must be positive", ShapeError)
        top[0].reshape((n, c, ho, wo))
        self.sizes = (n * c, h * w, ho * wo)
        self.fwd = fv.unpool_forward(dev, *self.sizes, b.data_buffer(), bottom[1].data_buffer(),
                                     top[0].data_buffer()) if b.count else []

    def build_backward(self, bottom, top):
        b = bottom[0]
        if not self.propagate_down[0] or not b.count:
            return
        if len(bottom) == 1:
            n, c, h, w = b.shape
            self.bwd = fv.upsample_nearest_backward(self.device, n * c, h, w, self.scale[0],
                                                    top[0].diff_buffer(), b.diff_buffer())
        else:
            self.bwd = fv.unpool_backward(self.device, *self.sizes, top[0].diff_buffer(),
                                          bottom[1].data_buffer(), b.diff_buffer())


@register("ROIPooling")
class ROIPoolingLayer(Layer):
    """Fast/Faster R-CNN max pooling of each roi (batch, x1, y1, x2, y2 in
    input-image coordinates, scaled by spatial_scale and rounded) into
    pooled_h x pooled_w bins; backward through the argmax of each bin."""
    exact_num_bottom = 2
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.roi_pooling_param
        if p.pooled_h <= 0 or p.pooled_w <= 0:
            raise self.error(f"pooled_h and pooled_w must be positive, got {p.pooled_h}, "
                             f"{p.pooled_w}")
        self.pooled = (p.pooled_h, p.pooled_w)
        self.scale = p.spatial_scale

    def reshape(self, bottom, top):
        x, rois = bottom
        _require_4d(self, x)
        if rois.count % 5 or (rois.num_axes >= 2 and rois.count_range(1) != 5):
            raise self.error(f"rois bottom {rois.name!r} must hold rows of 5 (batch index, "
                             f"x1, y1, x2, y2), got shape {rois.shape}", ShapeError)
        self.R = rois.count // 5
        top[0].reshape((self.R, x.shape[1]) + self.pooled)
        self.argmax = self.device.alloc(4 * max(top[0].count, 1))
        self.fwd = fv.roi_pool_forward(self.device, self.R, x.shape, self.pooled, self.scale,
                                       x.data_buffer(), rois.data_buffer(),
                                       top[0].data_buffer(), self.argmax) if top[0].count else []

    def build_backward(self, bottom, top):
        # as the fork: no gradient for the roi coordinates (bottom[1])
        x, rois = bottom
        if self.propagate_down[0] and x.count:
            self.bwd = fv.roi_pool_backward(self.device, self.R, x.shape, self.pooled,
                                            self.scale, top[0].diff_buffer(), self.argmax,
                                            rois.data_buffer(), x.diff_buffer())


@register("BN")
class BNLayer(Layer):
    """SegNet's / ENet's BN (bn_param): blobs scale and shift, each
    (1, C, 1, 1). bn_mode LEARN (the fork's default, in every phase):
    y = scale * (x - mean) / sqrt(var + 1e-9) + shift with the batch's
    per-channel mean and (biased) variance; INFERENCE (what the forks'
    compute_bn_statistics.py writes into deploy nets, with the statistics
    folded into scale and shift): y = scale * x + shift. Parameter
    gradients accumulate (Caffe's convention; the fork overwrites them).

    PSPNet's / DeepLab's BN (hszhao/PSPNet, yjxiong/caffe), chosen when
    bn_param names any of its fields (slope_filler, bias_filler, momentum,
    eps, frozen, engine): blobs slope, bias, moving mean, moving variance;
    in TEST or with ``frozen: true`` y = (x - mean) (var + eps)^-1/2 slope +
    bias, backward dx = dy slope (var + eps)^-1/2 (frozen: no parameter
    gradients, as the fork; TEST: slope and bias gradients too). Training
    with batch statistics (TRAIN, not frozen) is not implemented."""
    exact_num_bottom = 1
    exact_num_top = 1
    EPS = 1e-9     # the fork's var_eps_
    PSPNET_FIELDS = ("slope_filler", "bias_filler", "momentum", "eps", "frozen", "engine")

    def layer_setup(self, bottom, top):
        _require_4d(self, bottom[0])
        p = self.param.bn_param
        self.pspnet = any(p.HasField(f) for f in self.PSPNET_FIELDS)
        if self.pspnet:
            self._setup_pspnet(bottom, p)
            return
        self.learn = p.bn_mode == caffe_pb2.BNParameter.LEARN
        c = bottom[0].shape[1]
        if not self.blobs:
            self.blobs = [self.new_param_blob((1, c, 1, 1), 0),
                          self.new_param_blob((1, c, 1, 1), 1)]
            fillers.fill(self.blobs[0], p.scale_filler, f"layer {self.name!r} scale_filler")
            fillers.fill(self.blobs[1], p.shift_filler, f"layer {self.name!r} shift_filler")

    def _setup_pspnet(self, bottom, p):
        self.frozen, self.eps = p.frozen, p.eps
        if self.phase == caffe_pb2.TRAIN and not self.frozen:
            raise self.error("PSPNet's BN trained with batch statistics (TRAIN without "
                             "bn_param { frozen: true }) is not implemented")
        c = bottom[0].shape[1]
        if not self.blobs:
            self.blobs = [self.new_param_blob((1, c, 1, 1), i) for i in range(4)]
            fillers.fill(self.blobs[0], p.slope_filler, f"layer {self.name!r} slope_filler")
            fillers.fill(self.blobs[1], p.bias_filler, f"layer {self.name!r} bias_filler")
            pointwise.fill(self.device, self.blobs[3].data_buffer(), c,
                           1.0 if self.frozen else 0.0)
            self.blobs[3].data_mem.device_written()
        if len(self.blobs) != 4:
            raise self.error(f"PSPNet's BN has 4 blobs (slope, bias, mean, variance), got "
                             f"{len(self.blobs)}")

    def reshape(self, bottom, top):
        b = bottom[0]
        _require_4d(self, b)
        n, c, h, w = b.shape
        for i, blob in enumerate(self.blobs):
            if blob.count != c:
                raise self.error(f"blobs[{i}] {blob.shape} must hold one value per channel "
                                 f"of bottom {b.name!r} {b.shape}", ShapeError)
        self.dims = (n, c, h * w)
        top[0].reshape(b.shape)
        dev, (O, C, I) = self.device, self.dims
        scale, shift = self.blobs[0].data_buffer(), self.blobs[1].data_buffer()
        if not b.count:
            self.fwd = []
            return
        if self.pspnet:
            self.xnorm = dev.alloc(4 * b.count)
            self.fwd = fv.bn_global_forward(dev, O, C, I, self.eps, b.data_buffer(), scale, shift,
                                            self.blobs[2].data_buffer(),
                                            self.blobs[3].data_buffer(), self.xnorm,
                                            top[0].data_buffer())
            return
        if not self.learn:
            self.fwd = [channel_ops.affine(dev, O, C, I, b.data_buffer(), top[0].data_buffer(),
                                           scale, shift)]
            return
        self.mean, self.stdv = dev.alloc(4 * C), dev.alloc(4 * C)
        self.xnorm = dev.alloc(4 * b.count)
        # bn_train_stats also keeps BatchNorm's moving averages: scratch here
        self.running = [dev.alloc(4 * C), dev.alloc(4 * C), dev.alloc(4)]
        self.fwd = norm_ops.bn_train_stats(dev, O, C, I, b.data_buffer(), self.mean, self.stdv,
                                           self.EPS, *self.running, 0.0)
        self.fwd.append(norm_ops.bn_scale_act_forward(dev, O, C, I, b.data_buffer(), self.mean,
                                                      self.stdv, scale, shift, self.xnorm,
                                                      top[0].data_buffer()))

    def build_backward(self, bottom, top):
        b = bottom[0]
        if not b.count:
            return
        dev, (O, C, I) = self.device, self.dims
        dy = top[0].diff_buffer()
        scale, shift = self.blobs[0].data_buffer(), self.blobs[1].data_buffer()
        dscale, dshift = self.blobs[0].diff_buffer(), self.blobs[1].diff_buffer()
        if self.pspnet:     # parameter gradients first: dx may overwrite dy (in place)
            if not self.frozen and self.param_propagate_down[0]:
                self.bwd += channel_ops.channel_sum(dev, O, C, I, dy, dscale, b=self.xnorm,
                                                    accumulate=True)
            if not self.frozen and self.param_propagate_down[1]:
                self.bwd += channel_ops.channel_sum(dev, O, C, I, dy, dshift, accumulate=True)
            if self.propagate_down[0]:
                self.bwd += fv.bn_global_backward(dev, O, C, I, self.eps, dy, scale,
                                                  self.blobs[3].data_buffer(), b.diff_buffer())
            return
        if self.learn:
            if self.propagate_down[0] or any(self.param_propagate_down):
                # dscale += sum dy*xnorm, dshift += sum dy and dx, in one plan
                self.bwd = norm_ops.bn_scale_act_backward(dev, O, C, I, dy, self.xnorm, scale,
                                                          shift, self.stdv, b.diff_buffer(),
                                                          dscale, dshift)
            return
        if self.param_propagate_down[0]:
            self.bwd += channel_ops.channel_sum(dev, O, C, I, dy, dscale, b=b.data_buffer(),
                                                accumulate=True)
        if self.param_propagate_down[1]:
            self.bwd += channel_ops.channel_sum(dev, O, C, I, dy, dshift, accumulate=True)
        if self.propagate_down[0]:
            self.bwd.append(channel_ops.affine(dev, O, C, I, dy, b.diff_buffer(), scale))


# ENet's Python layer (TimoSaemann/ENet prototxts/enet_deploy.prototxt): run
# by SpatialDropoutLayer when that module is not importable
SPATIAL_DROPOUT = ("spatial_dropout", "SpatialDropoutLayer")


class SpatialDropoutLayer(Layer):
    """ENet's ``spatial_dropout.SpatialDropoutLayer`` (a Python layer of
    TimoSaemann/caffe-enet), for a ``type: "Python"`` layer naming it:
    ``param_str`` ``{'phase': 'TRAIN' | 'TEST', 'p': ...}`` (read as
    literals, never executed). As that module: with ``'phase': 'TRAIN'``
    every (image, channel) plane is kept with probability 1 - p and scaled by
    1/(1-p); otherwise the whole input is multiplied by 1/(1-p) (the module
    scales at TEST too). The ``phase`` of ``param_str`` decides, not the net's.
    Backward: the same mask and scale."""
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        text = self.param.python_param.param_str
        try:
            conf = ast.literal_eval(text) if text.strip() else {}
        except (ValueError, SyntaxError) as e:
            raise self.error(f"spatial_dropout param_str {text!r} is not a Python literal "
                             f"dict: {e}") from e
        if not isinstance(conf, dict) or "p" not in conf:
            raise self.error(f"spatial_dropout param_str {text!r} must be a dict with 'p' "
                             "(and 'phase')")
        try:
            self.p = float(conf["p"])
        except (TypeError, ValueError) as e:
            raise self.error(f"spatial_dropout 'p' {conf['p']!r} is not a number") from e
        if not 0.0 < self.p < 1.0:
            raise self.error(f"spatial_dropout 'p' must be between 0 and 1, got {self.p}")
        self.scale = 1.0 / (1.0 - self.p)
        self.train = conf.get("phase", "TEST") == "TRAIN"

    def reshape(self, bottom, top):
        b = bottom[0]
        if b.num_axes < 2:
            raise self.error(f"bottom {b.name!r} {b.shape} needs a channel axis", ShapeError)
        top[0].reshape(b.shape)
        n = b.count
        if not n:
            self.fwd = []
            return
        if self.train:
            self.mask = Blob(b.shape, name=f"{self.name}.mask", device=self.device)
            self._drop = fv.spatial_dropout_forward(
                self.device, n, b.count_range(2), b.data_buffer(), top[0].data_buffer(),
                self.mask.data_buffer(), self.p, self.scale)
            self.fwd = [self._drop]
        else:
            self.fwd = [pointwise.unary(self.device, "scale", n, b.data_buffer(),
                                        top[0].data_buffer(), self.scale, 0.0)]

    def forward_impl(self, bottom, top):
        if self.train and self.fwd:
            seed, stream = rnd.next_stream()
            self._drop.set_arg(7, seed)
            self._drop.set_arg(8, stream)
        super().forward_impl(bottom, top)

    def build_backward(self, bottom, top):
        n = bottom[0].count
        if not self.propagate_down[0] or not n:
            return
        dy, dx = top[0].diff_buffer(), bottom[0].diff_buffer()
        if self.train:
            self.bwd = [fv.dropout_backward(self.device, n, dy, self.mask.data_buffer(), dx,
                                            self.scale)]
        else:
            self.bwd = [pointwise.unary(self.device, "scale", n, dy, dx, self.scale, 0.0)]
