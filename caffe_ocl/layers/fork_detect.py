"""Layers of the detection Caffe forks beyond SSD and Faster R-CNN (issue
#23): R-FCN's PSROIPooling (daijifeng001/caffe-rfcn) and the YOLO v2 ports'
Reorg (darknet's passthrough). Forward and backward follow each fork's
source; the numeric work is in kernels/fork_detect.cl (ops/fork_detect.py)."""
from ..errors import ShapeError
from ..ops import fork_detect as fd
from .base import Layer, register


def _require_4d(layer, blob):
    if blob.num_axes != 4:
        raise layer.error(f"bottom {blob.name!r} must have 4 axes (num, channels, height, "
                          f"width), got {blob.shape}", ShapeError)


@register("PSROIPooling")
class PSROIPoolingLayer(Layer):
    """R-FCN position-sensitive roi pooling: roi r's bin (ph, pw) of output
    channel c is the average of input channel (c * G + ph) * G + pw over
    that bin (G = group_size, output G x G, output_dim channels; the input
    must have output_dim * G * G channels). Rois are (batch, x1, y1, x2, y2)
    rows in input-image coordinates; no gradient for them (as the fork)."""
    exact_num_bottom = 2
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.psroi_pooling_param
        if p.output_dim <= 0 or p.group_size <= 0:
            raise self.error(f"psroi_pooling_param output_dim and group_size must be "
                             f"positive, got {p.output_dim}, {p.group_size}")
        self.dim, self.group, self.scale = p.output_dim, p.group_size, p.spatial_scale

    def reshape(self, bottom, top):
        x, rois = bottom
        _require_4d(self, x)
        if x.shape[1] != self.dim * self.group ** 2:
            raise self.error(f"bottom {x.name!r} {x.shape} must have output_dim * group_size^2 "
                             f"= {self.dim * self.group ** 2} channels, found {x.shape[1]}",
                             ShapeError)
        if rois.count % 5 or (rois.num_axes >= 2 and rois.count_range(1) != 5):
            raise self.error(f"rois bottom {rois.name!r} must hold rows of 5 (batch index, "
                             f"x1, y1, x2, y2), got shape {rois.shape}", ShapeError)
        self.R = rois.count // 5
        top[0].reshape((self.R, self.dim, self.group, self.group))
        self.fwd = fd.psroi_pool_forward(
            self.device, self.R, x.shape, self.dim, self.group, self.scale, x.data_buffer(),
            rois.data_buffer(), top[0].data_buffer()) if top[0].count else []

    def build_backward(self, bottom, top):
        x, rois = bottom
        if self.propagate_down[0] and x.count:
            self.bwd = fd.psroi_pool_backward(
                self.device, self.R, x.shape, self.dim, self.group, self.scale,
                top[0].diff_buffer(), rois.data_buffer(), x.diff_buffer())


@register("Reorg")
class ReorgLayer(Layer):
    """YOLO v2's passthrough as the Caffe ports (reorg_param stride,
    reverse): darknet's reorg_cpu with forward = reverse, so the default
    moves each stride x stride block into channels, (N, C, H, W) ->
    (N, C s^2, H/s, W/s), in darknet's (not space-to-depth's) order;
    reverse goes (N, C, H, W) -> (N, C/s^2, H s, W s). Backward is the
    inverse permutation."""
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.reorg_param
        if p.stride < 1:
            raise self.error(f"reorg_param stride must be positive, got {p.stride}")
        self.s, self.reverse = p.stride, p.reverse

    def reshape(self, bottom, top):
        b = bottom[0]
        _require_4d(self, b)
        n, c, h, w = b.shape
        s = self.s
        if self.reverse:
            if c % (s * s):
                raise self.error(f"reverse Reorg: channels of bottom {b.name!r} {b.shape} must "
                                 f"divide by stride^2 = {s * s}", ShapeError)
            top[0].reshape((n, c // (s * s), h * s, w * s))
        else:
            if h % s or w % s or c % (s * s):
                raise self.error(f"Reorg: height and width of bottom {b.name!r} {b.shape} must "
                                 f"divide by stride {s} and its channels by {s * s}", ShapeError)
            top[0].reshape((n, c * s * s, h // s, w // s))
        # reorg_cpu is always given the bottom's dims; its partner layout
        # (c/s^2, h s, w s) has the same count
        self.fwd = fd.reorg(self.device, b.shape, s, not self.reverse, b.data_buffer(),
                            top[0].data_buffer()) if b.count else []

    def build_backward(self, bottom, top):
        b = bottom[0]
        if self.propagate_down[0] and b.count:
            self.bwd = fd.reorg(self.device, b.shape, self.s, self.reverse, top[0].diff_buffer(),
                                b.diff_buffer())
