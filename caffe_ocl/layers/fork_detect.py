"""Layers of the detection Caffe forks beyond SSD and Faster R-CNN (issue
#23): R-FCN's PSROIPooling (daijifeng001/caffe-rfcn), the YOLO v2 ports'
Reorg (darknet's passthrough) and eric612/MobileNet-YOLO's
YoloDetectionOutput / Yolov3DetectionOutput. Forward and backward follow
each fork's source; the numeric work is in kernels/fork_detect.cl
(ops/fork_detect.py)."""
import numpy as np

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


class _YoloOutputBase(Layer):
    """Shared part of eric612/MobileNet-YOLO's detection outputs: candidates
    decoded per bottom on the device (``yolo_decode``), then one pool over
    all bottoms and images sorted by score (ties: the fork's push order) and
    suppressed class-agnostically (IoU >= nms_threshold), as the fork's
    ApplyNms. Top [1, 1, kept, 7] rows [0, label + 1, score, xmin, ymin,
    xmax, ymax] in sorted order (image id 0 for every row, as the fork;
    coordinates relative to the image, not clipped); nothing kept: one row
    [i, -1, ...] per image. Each forward reads the kept count back to the
    host to shape the top. No backward (the fork has none)."""
    has_backward = False
    exact_num_top = 1
    min_bottom = 1
    version = 0

    def decode_plan(self, bottom):
        """[(bottom, anchors (bw, bh) per anchor, div (x, y, w, h), per-candidate
        count)] for each bottom."""
        raise NotImplementedError

    def reshape(self, bottom, top):
        for b in bottom:
            _require_4d(self, b)
            if b.shape[1] != self.num * (5 + self.ncls):
                raise self.error(f"bottom {b.name!r} {b.shape} must have num_box x (5 + "
                                 f"num_classes) = {self.num * (5 + self.ncls)} channels",
                                 ShapeError)
            if b.shape[0] != bottom[0].shape[0]:
                raise self.error(f"bottoms {bottom[0].name!r} and {b.name!r} differ in "
                                 "batch size", ShapeError)
        dev = self.device
        per = self.ncls if self.version == 3 else 1
        images = bottom[0].shape[0]
        sizes = [images * b.shape[2] * b.shape[3] * self.num * per for b in bottom]
        total = sum(sizes)
        self.total, self.images = total, images
        self.score = dev.alloc(4 * max(total, 1))
        self.label = dev.alloc(4 * max(total, 1))
        self.box = dev.alloc(16 * max(total, 1))
        self.cand = dev.alloc(4 * max(total, 1))
        self.keep = dev.alloc(4 * max(total, 1))
        self.nkeep = dev.alloc(4)
        self._anchor_bufs = []
        self.fwd = []
        base = 0
        for b, (anchors, div), size in zip(bottom, self.decode_plan(bottom), sizes):
            buf = dev.alloc(4 * len(anchors))
            dev.upload(buf, np.asarray(anchors, np.float32))
            self._anchor_bufs.append(buf)
            if size:
                self.fwd.append(fd.yolo_decode(
                    dev, self.version, images, b.shape[2] * b.shape[3], b.shape[3], self.num,
                    self.ncls, div, self.conf_thresh, base, b.data_buffer(), buf, self.score,
                    self.label, self.box))
            base += size
        self.fwd.append(fd.yolo_nms(dev, total, self.nms_thresh, self.score, self.label,
                                    self.box, self.cand, self.keep, self.nkeep))
        rows = max(total, images, 1)
        top[0].reshape((1, 1, rows, 7))                 # the capacity any forward needs
        self.write = fd.yolo_write(dev, rows, 0, self.keep, self.score, self.label, self.box,
                                   top[0].data_buffer())
        top[0].reshape((1, 1, 1, 7))
        self._count = np.zeros(1, np.int32)

    def forward_impl(self, bottom, top):
        super().forward_impl(bottom, top)
        self.device.download(self._count, self.nkeep)       # documented host read
        kept = int(self._count[0])
        rows = kept if kept else self.images
        top[0].reshape((1, 1, rows, 7))
        self.write.set_arg(0, rows)
        self.write.set_arg(1, int(kept == 0))
        self.write.run(self.device.queue)

    def build_backward(self, bottom, top):
        self.bwd = []


@register("Yolov3DetectionOutput")
class Yolov3DetectionOutputLayer(_YoloOutputBase):
    """eric612/MobileNet-YOLO's YOLO v3 output (yolov3_detection_output_layer.cpp):
    bottom t (one per mask group, ``mask_group_num`` of them) of W x H holds
    ``num_box`` anchors of 5 + num_classes channels; anchor n of bottom t is
    ``mask[n + t * len(mask) / mask_group_num]``, its size ``biases[2m],
    biases[2m + 1]`` over the net size W * anchors_scale[t] x H *
    anchors_scale[t]. Every class whose sigmoid(class) * sigmoid(objectness)
    is over ``confidence_threshold`` is a candidate. ``gaussian_box`` (the
    Gaussian YOLO variant) is not implemented."""
    version = 3

    def layer_setup(self, bottom, top):
        p = self.param.yolov3_detection_output_param
        if not p.HasField("num_classes"):
            raise self.error("yolov3_detection_output_param.num_classes must be given")
        if p.gaussian_box:
            raise self.error("yolov3_detection_output_param.gaussian_box (Gaussian YOLO) is "
                             "not implemented")
        self.ncls, self.num = p.num_classes, p.num_box
        self.conf_thresh, self.nms_thresh = p.confidence_threshold, p.nms_threshold
        self.biases = list(p.biases)
        groups = p.mask_group_num
        if groups < 1 or len(bottom) != groups:
            raise self.error(f"mask_group_num ({groups}) must equal the number of bottoms "
                             f"({len(bottom)})")
        if len(p.anchors_scale) < groups:
            raise self.error(f"anchors_scale needs one value per bottom ({groups}), got "
                             f"{len(p.anchors_scale)}")
        per = len(p.mask) // groups
        self.masks = []
        for t in range(groups):
            idx = [t * per + n for n in range(self.num)]
            if idx and idx[-1] >= len(p.mask):
                raise self.error(f"mask has {len(p.mask)} values; bottom {t} needs mask["
                                 f"{idx[-1]}] (num_box {self.num}, {per} per group)")
            m = [p.mask[i] for i in idx]
            if any(2 * a + 1 >= len(self.biases) for a in m):
                raise self.error(f"mask {m} of bottom {t} indexes past the {len(self.biases)} "
                                 "biases")
            self.masks.append(m)
        self.scales = list(p.anchors_scale)

    def decode_plan(self, bottom):
        plan = []
        for t, b in enumerate(bottom):
            h, w = b.shape[2], b.shape[3]
            anchors = [v for a in self.masks[t] for v in (self.biases[2 * a],
                                                           self.biases[2 * a + 1])]
            plan.append((anchors, (w, h, w * self.scales[t], h * self.scales[t])))
        return plan


@register("YoloDetectionOutput")
class YoloDetectionOutputLayer(_YoloOutputBase):
    """eric612/MobileNet-YOLO's YOLO v2 output (yolo_detection_output_layer.cpp):
    one or two bottoms of side x side, ``num_box`` anchors of 5 + num_classes
    channels each, anchor sizes ``biases[2n], biases[2n + 1]`` in cells; per
    anchor the best class of a softmax, score sigmoid(objectness) times its
    probability, a candidate when >= ``confidence_threshold``. The fork
    takes the bottom's width as the side of both axes, so bottoms must be
    square."""
    version = 2
    min_bottom = 1
    max_bottom = 2

    def layer_setup(self, bottom, top):
        p = self.param.yolo_detection_output_param
        if not p.HasField("num_classes"):
            raise self.error("yolo_detection_output_param.num_classes must be given")
        self.ncls, self.num = p.num_classes, p.num_box
        self.conf_thresh, self.nms_thresh = p.confidence_threshold, p.nms_threshold
        self.biases = list(p.biases)
        if len(self.biases) < 2 * self.num:
            raise self.error(f"biases must hold 2 x num_box = {2 * self.num} values, got "
                             f"{len(self.biases)}")

    def decode_plan(self, bottom):
        plan = []
        for b in bottom:
            if b.shape[2] != b.shape[3]:
                raise self.error(f"bottom {b.name!r} {b.shape} must be square (the fork uses "
                                 "its width as the side of both axes)", ShapeError)
            side = b.shape[3]
            plan.append((self.biases[:2 * self.num], (side, side, side, side)))
        return plan
