"""The SSD fork's layers (weiliu89/caffe, branch ssd): Normalize, Permute,
PriorBox and DetectionOutput, with the fields OpenCV 4 adds to them.

Semantics are the fork's (normalize_layer.cpp, permute_layer.cpp,
prior_box_layer.cpp, detection_output_layer.cu, util/bbox_util.cpp); the
numeric work runs in kernels/ssd.cl. Where the fork leaves an order
unspecified (``std::sort`` of equal scores) the lower prior index, then the
lower label, comes first.
"""
import logging
import math

import numpy as np

from ..errors import LayerError, ShapeError
from ..ops import pointwise
from ..ops import ssd as ssd_ops
from . import fillers
from .base import Layer, register

log = logging.getLogger("caffe_ocl")

FLT_MAX = float(np.finfo(np.float32).max)


def int_buffer(dev, values):
    """A device buffer holding ``values`` as int32 (index tables)."""
    arr = np.ascontiguousarray(values, dtype=np.int32)
    buf = dev.alloc(max(arr.nbytes, 4))
    if arr.size:
        dev.upload(buf, arr)
    return buf


def _float_buffer(dev, values):
    arr = np.ascontiguousarray(values, dtype=np.float32)
    buf = dev.alloc(max(arr.nbytes, 4))
    if arr.size:
        dev.upload(buf, arr)
    return buf


def _no_inplace(layer, bottom, top):
    if bottom[0] is top[0]:
        raise layer.error("does not allow in-place computation")


# ----------------------------------------------------------------------------
# Normalize
# ----------------------------------------------------------------------------

@register("Normalize")
class NormalizeLayer(Layer):
    """y = x / ||x|| * scale: the L2 norm over C*H*W of each item
    (across_spatial) or over C at each position, with ``eps`` added to the
    sum of squares; scale is one learned value (channel_shared) or one per
    channel (blobs[0]). Backward is the exact gradient; the fork's differs
    from it for a per-channel scale that is not uniform (kernels/ssd.cl)."""
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.norm_param
        self.across = p.across_spatial
        self.shared = p.channel_shared
        self.eps = p.eps
        b = bottom[0]
        if b.num_axes < 2:
            raise self.error(f"bottom {b.name!r} must have at least 2 axes, got {b.shape}",
                             ShapeError)
        channels = b.shape[1]
        if not self.blobs:
            blob = self.new_param_blob(() if self.shared else (channels,), 0)
            if p.HasField("scale_filler"):
                fillers.fill(blob, p.scale_filler, f"layer {self.name!r} scale_filler")
            else:
                pointwise.fill(self.device, blob.data_mem.buffer(), blob.count, 1.0)
                blob.data_mem.device_written()
            self.blobs = [blob]
        want = 1 if self.shared else channels
        if self.blobs[0].count != want:
            raise self.error(f"scale blob has {self.blobs[0].count} values, the "
                             f"{'shared' if self.shared else 'per-channel'} scale needs "
                             f"{want} (channels {channels})", ShapeError)

    def reshape(self, bottom, top):
        _no_inplace(self, bottom, top)
        b = bottom[0]
        if b.num_axes < 2:
            raise self.error(f"bottom {b.name!r} must have at least 2 axes, got {b.shape}",
                             ShapeError)
        top[0].reshape(b.shape)
        self.num, self.channels = b.shape[0], b.shape[1]
        self.spatial = b.count_range(2) if b.num_axes > 2 else 1
        want = 1 if self.shared else self.channels
        if self.blobs[0].count != want:
            raise self.error(f"scale blob has {self.blobs[0].count} values for "
                             f"{self.channels} channels", ShapeError)
        n, c, s, dev = self.num, self.channels, self.spatial, self.device
        self.ss = dev.alloc(4 * max(n * s, 1))
        self.norm = dev.alloc(4 * max(n * s, 1))
        self.dot = dev.alloc(4 * max(n * s, 1))
        if not b.count:
            self.fwd = []
            return
        scale = self.blobs[0].data_buffer()
        self.fwd = [
            ssd_ops.norm_sumsq(dev, n, c, s, self.eps, not self.across, b.data_buffer(), self.ss),
            ssd_ops.norm_finish(dev, n, s, self.eps, self.across, self.ss, self.norm),
            ssd_ops.norm_forward(dev, n, c, s, self.across, self.shared, b.data_buffer(),
                                 self.norm, scale, top[0].data_buffer()),
        ]

    def build_backward(self, bottom, top):
        b = bottom[0]
        if not b.count:
            return
        n, c, s, dev = self.num, self.channels, self.spatial, self.device
        scale = self.blobs[0].data_buffer()
        if self.param_propagate_down[0]:
            self.bwd.append(ssd_ops.norm_scale_grad(
                dev, n, c, s, self.shared, top[0].data_buffer(), top[0].diff_buffer(),
                scale, self.blobs[0].diff_buffer()))
        if self.propagate_down[0]:
            self.bwd += ssd_ops.norm_dot(dev, n, c, s, self.across, self.shared,
                                         b.data_buffer(), top[0].diff_buffer(), scale, self.dot)
            self.bwd.append(ssd_ops.norm_backward(
                dev, n, c, s, self.across, self.shared, b.data_buffer(), top[0].diff_buffer(),
                self.norm, self.dot, scale, b.diff_buffer()))


# ----------------------------------------------------------------------------
# Permute
# ----------------------------------------------------------------------------

@register("Permute")
class PermuteLayer(Layer):
    """top = bottom with its axes reordered: ``order`` names the new axes'
    old indices; axes it leaves out follow in their old order."""
    exact_num_bottom = 1
    exact_num_top = 1

    def _orders(self, nax):
        orders = []
        for o in self.param.permute_param.order:
            if o >= nax:
                raise self.error(f"order {o} is out of range for a {nax}-axis bottom",
                                 ShapeError)
            if o in orders:
                raise self.error(f"order has {o} twice: {list(self.param.permute_param.order)}")
            orders.append(int(o))
        return orders + [i for i in range(nax) if i not in orders]

    def reshape(self, bottom, top):
        _no_inplace(self, bottom, top)
        b = bottom[0]
        nax = b.num_axes
        self.orders = orders = self._orders(nax)
        shape = tuple(b.shape[o] for o in orders)
        top[0].reshape(shape)
        self.nax = nax
        # an order that swaps two runs of axes is a batched transpose
        # (ops/ssd.py transpose_shape), its inverse one too; any other one,
        # a row of the output at a time (CPU drivers and GPUs: their own
        # kernels; other devices the per-float permute)
        fast = (self.device.is_cpu or self.device.is_gpu) and b.count
        self.transpose = ssd_ops.transpose_shape(b.shape, orders) if fast else None
        self.rows = (ssd_ops.row_plan(b.shape, orders)
                     if fast and self.transpose is None else None)
        self._transpose = ssd_ops.transpose if self.device.is_cpu else ssd_ops.transpose_gpu
        self._by_rows = ssd_ops.permute_rows if self.device.is_cpu else ssd_ops.permute_runs
        if self.transpose is None:
            self.geom = int_buffer(self.device, ssd_ops.permute_geom(
                b.shape, orders, self.rows[2] if self.rows is not None else None))
        if self.transpose is not None:
            outer, rows, cols = self.transpose
            self.fwd = [self._transpose(self.device, outer, rows, cols, b.data_buffer(),
                                        top[0].data_buffer())]
        elif self.rows is not None:
            self.fwd = [self._by_rows(self.device, self.rows, b.count, self.geom,
                                      b.data_buffer(), top[0].data_buffer())]
        else:
            self.fwd = [ssd_ops.permute(self.device, b.count, nax, self.geom, b.data_buffer(),
                                        top[0].data_buffer())] if b.count else []

    def build_backward(self, bottom, top):
        if self.propagate_down[0] and bottom[0].count:
            if self.transpose is not None:
                outer, rows, cols = self.transpose
                self.bwd = [self._transpose(self.device, outer, cols, rows,
                                            top[0].diff_buffer(), bottom[0].diff_buffer())]
                return
            if self.rows is not None:
                self.bwd = [self._by_rows(self.device, self.rows, bottom[0].count,
                                          self.geom, top[0].diff_buffer(),
                                          bottom[0].diff_buffer(), forward=False)]
                return
            self.bwd = [ssd_ops.permute(self.device, bottom[0].count, self.nax, self.geom,
                                        top[0].diff_buffer(), bottom[0].diff_buffer(),
                                        forward=False)]


# ----------------------------------------------------------------------------
# PriorBox
# ----------------------------------------------------------------------------

def prior_box_sizes(p):
    """(box sizes [(width, height)], offsets [(x, y)]) of a PriorBoxParameter,
    in the fork's order: per min_size its square box, the sqrt(min*max) box,
    then one per aspect ratio (!= 1; flipped ones after each). The fork takes
    min_size and max_size as int. OpenCV's width/height give the boxes
    directly and offset_w/offset_h several centres per cell."""
    if len(p.width) or len(p.height):
        if len(p.width) != len(p.height) or not len(p.width):
            raise LayerError(f"width ({len(p.width)} values) and height "
                             f"({len(p.height)} values) must be given in pairs")
        if len(p.min_size):
            raise LayerError("give either min_size or width/height, not both")
        boxes = [(float(w), float(h)) for w, h in zip(p.width, p.height)]
    else:
        if not len(p.min_size):
            raise LayerError("must provide min_size (or width and height)")
        if any(m <= 0 for m in p.min_size):
            raise LayerError(f"min_size must be positive, got {list(p.min_size)}")
        ars = [1.0]
        for ar in p.aspect_ratio:
            if any(abs(ar - a) < 1e-6 for a in ars):
                continue
            ars.append(float(ar))
            if p.flip:
                ars.append(1.0 / ar)
        if len(p.max_size) and len(p.max_size) != len(p.min_size):
            raise LayerError(f"max_size needs one value per min_size ({len(p.min_size)}), "
                             f"got {len(p.max_size)}")
        boxes = []
        for s, m in enumerate(p.min_size):
            mi = int(m)
            boxes.append((float(mi), float(mi)))
            if len(p.max_size):
                if p.max_size[s] <= m:
                    raise LayerError(f"max_size {p.max_size[s]} must be greater than "
                                     f"min_size {m}")
                side = math.sqrt(mi * int(p.max_size[s]))
                boxes.append((side, side))
            for ar in ars:
                if abs(ar - 1.0) < 1e-6:
                    continue
                boxes.append((mi * math.sqrt(ar), mi / math.sqrt(ar)))
    if len(p.offset_h) or len(p.offset_w):
        if len(p.offset_h) != len(p.offset_w):
            raise LayerError(f"offset_h ({len(p.offset_h)} values) and offset_w "
                             f"({len(p.offset_w)} values) must be given in pairs")
        offsets = [(float(x), float(y)) for x, y in zip(p.offset_w, p.offset_h)]
    else:
        offsets = [(float(p.offset), float(p.offset))]
    return boxes, offsets


@register("PriorBox")
class PriorBoxLayer(Layer):
    """Prior (default) boxes of a feature map: top [1, 2, H*W*num_priors*4],
    the normalized corners then the variances, as the fork."""
    exact_num_bottom = 2
    exact_num_top = 1
    has_backward = False

    def layer_setup(self, bottom, top):
        p = self.param.prior_box_param
        try:
            self.boxes, self.offsets = prior_box_sizes(p)
        except LayerError as e:
            raise self.error(str(e)) from None
        var = list(p.variance)
        if len(var) > 1 and len(var) != 4:
            raise self.error(f"variance takes 1 or 4 values, got {len(var)}")
        if any(v <= 0 for v in var):
            raise self.error(f"variance must be positive, got {var}")
        self.var = var or [0.1]
        if p.HasField("img_h") or p.HasField("img_w"):
            if p.HasField("img_size"):
                raise self.error("either img_size or img_h/img_w should be specified; not both")
            if p.img_h <= 0 or p.img_w <= 0:
                raise self.error("img_h and img_w must both be larger than 0")
            self.img = (p.img_h, p.img_w)
        elif p.HasField("img_size"):
            if p.img_size <= 0:
                raise self.error("img_size should be larger than 0")
            self.img = (p.img_size, p.img_size)
        else:
            self.img = (0, 0)
        if p.HasField("step_h") or p.HasField("step_w"):
            if p.HasField("step"):
                raise self.error("either step or step_h/step_w should be specified; not both")
            if p.step_h <= 0 or p.step_w <= 0:
                raise self.error("step_h and step_w must both be larger than 0")
            self.step = (p.step_h, p.step_w)
        elif p.HasField("step"):
            if p.step <= 0:
                raise self.error("step should be larger than 0")
            self.step = (p.step, p.step)
        else:
            self.step = (0.0, 0.0)
        self.clip = p.clip
        dev = self.device
        self.box_buf = _float_buffer(dev, np.array(self.boxes, np.float32).ravel())
        self.off_buf = _float_buffer(dev, np.array(self.offsets, np.float32).ravel())
        self.var_buf = _float_buffer(dev, self.var)
        self.has_backward = False

    @property
    def num_priors(self):
        return len(self.boxes) * len(self.offsets)

    def reshape(self, bottom, top):
        f, im = bottom
        if f.num_axes < 2 or im.num_axes < 2:
            raise self.error(f"bottoms need height and width axes: {f.shape}, {im.shape}",
                             ShapeError)
        lh, lw = (f.shape[2], f.shape[3]) if f.num_axes >= 4 else (1, 1)
        if f.num_axes == 3:
            lh, lw = 1, f.shape[2]
        ih, iw = (im.shape[-2], im.shape[-1]) if im.num_axes >= 4 else (1, 1)
        img_h, img_w = self.img if self.img[0] and self.img[1] else (ih, iw)
        if self.step[0] and self.step[1]:
            step_h, step_w = self.step
        else:
            step_h = np.float32(img_h) / np.float32(lh)
            step_w = np.float32(img_w) / np.float32(lw)
        dim = lh * lw * self.num_priors * 4
        if dim <= 0:
            raise self.error(f"feature map {f.shape} gives no priors", ShapeError)
        top[0].reshape((1, 2, dim))
        self.fwd = [ssd_ops.prior_box(self.device, lh, lw, len(self.boxes), len(self.offsets),
                                      float(img_w), float(img_h), float(step_w), float(step_h),
                                      self.clip, len(self.var), self.box_buf, self.off_buf,
                                      self.var_buf, top[0].data_buffer())]

    def build_backward(self, bottom, top):
        self.bwd = []


# ----------------------------------------------------------------------------
# DetectionOutput
# ----------------------------------------------------------------------------

CORNER, CENTER_SIZE, CORNER_SIZE = 1, 2, 3


@register("DetectionOutput")
class DetectionOutputLayer(Layer):
    """Decode the predicted offsets against the priors, keep per class the
    boxes over confidence_threshold through NMS (top_k, nms_threshold, eta),
    then at most keep_top_k per image. Top [1, 1, rows, 7]:
    [image_id, label, score, xmin, ymin, xmax, ymax]; with no detection in
    the whole batch one row per image [image_id, -1, ...], as the fork.

    The number of rows depends on the values: each forward reads the
    per-image counts (``num`` ints) back to the host to shape the top."""
    exact_num_bottom = 3
    exact_num_top = 1
    has_backward = False

    def layer_setup(self, bottom, top):
        p = self.param.detection_output_param
        if not p.HasField("num_classes"):
            raise self.error("detection_output_param.num_classes must be given")
        self.ncls = p.num_classes
        self.share = p.share_location
        self.nlc = 1 if self.share else self.ncls
        self.background = p.background_label_id
        self.code_type = p.code_type
        if self.code_type not in (CORNER, CENTER_SIZE, CORNER_SIZE):
            raise self.error(f"unknown code_type {self.code_type}")
        self.var_in_target = p.variance_encoded_in_target
        self.keep_top_k = p.keep_top_k
        self.conf_thresh = p.confidence_threshold if p.HasField("confidence_threshold") \
            else -FLT_MAX
        nms = p.nms_param
        self.nms_thresh = nms.nms_threshold
        if self.nms_thresh < 0:
            raise self.error(f"nms_threshold must be non negative, got {self.nms_thresh}")
        self.eta = nms.eta
        if not 0 < self.eta <= 1:
            raise self.error(f"eta must be in (0, 1], got {self.eta}")
        self.top_k = nms.top_k if nms.HasField("top_k") else -1
        self.normalized = p.normalized_bbox
        self.clip = p.clip
        if p.save_output_param.output_directory:
            # the fork's test-time result files (VOC/COCO/ILSVRC formats,
            # read through label_map_file / name_size_file): not written
            log.warning("layer %r: detection_output_param.save_output_param is not "
                        "implemented; no result files are written to %r (the detections "
                        "are in the top blob)", self.name,
                        p.save_output_param.output_directory)

    def reshape(self, bottom, top):
        loc, conf, prior = bottom
        if prior.num_axes < 3 or prior.shape[-2] != 2 or prior.shape[-1] % 4:
            raise self.error(f"prior bottom {prior.name!r} must be [1, 2, num_priors*4], got "
                             f"{prior.shape}", ShapeError)
        self.np = npri = prior.shape[-1] // 4
        num = loc.shape[0] if loc.num_axes else 1
        self.num = num
        if loc.count != num * npri * self.nlc * 4:
            raise self.error(f"loc bottom {loc.name!r} {loc.shape} must hold num x "
                             f"num_priors ({npri}) x {self.nlc} x 4 = "
                             f"{num * npri * self.nlc * 4} values", ShapeError)
        if conf.count != num * npri * self.ncls:
            raise self.error(f"conf bottom {conf.name!r} {conf.shape} must hold num x "
                             f"num_priors ({npri}) x num_classes ({self.ncls}) = "
                             f"{num * npri * self.ncls} values", ShapeError)
        per_class = npri if self.top_k < 0 else min(self.top_k, npri)
        rows = num * self.ncls * per_class
        if self.keep_top_k > -1:
            rows = min(rows, num * self.keep_top_k)
        top[0].reshape((1, 1, max(rows, num, 1), 7))     # the capacity any forward needs
        top[0].reshape((1, 1, 1, 7))
        dev = self.device
        pairs = num * self.ncls
        self.bbox = dev.alloc(4 * max(loc.count, 1))
        self.cand = dev.alloc(4 * max(pairs * npri, 1))
        self.keep = dev.alloc(4 * max(pairs * npri, 1))
        self.sel = dev.alloc(4 * max(pairs * npri, 1))
        self.nkeep = dev.alloc(4 * max(pairs, 1))
        self.count = dev.alloc(4 * max(num, 1))
        self.best = dev.alloc(4 * max(num * self.keep_top_k, 1))
        self.fwd = [
            ssd_ops.detout_decode(dev, loc.count, self.code_type, self.var_in_target, npri,
                                  self.nlc, self.share, self.background, self.clip,
                                  loc.data_buffer(), prior.data_buffer(), self.bbox),
            ssd_ops.detout_nms(dev, num, npri, self.ncls, self.nlc, self.share,
                               self.background, self.conf_thresh, self.nms_thresh, self.eta,
                               self.top_k, self.normalized, conf.data_buffer(), self.bbox,
                               self.cand, self.keep, self.nkeep),
            ssd_ops.detout_keep_top_k(dev, num, npri, self.ncls, self.keep_top_k,
                                      conf.data_buffer(), self.keep, self.nkeep, self.sel,
                                      self.count, self.best),
        ]
        self.write = ssd_ops.detout_write(dev, num, npri, self.ncls, self.nlc, self.share,
                                          conf.data_buffer(), self.bbox, self.keep,
                                          self.nkeep, self.sel, self.count,
                                          top[0].data_buffer())
        self.counts = np.zeros(num, np.int32)

    def forward_impl(self, bottom, top):
        super().forward_impl(bottom, top)
        self.device.download(self.counts, self.count)      # documented host read
        total = int(self.counts.sum())
        top[0].reshape((1, 1, total if total else self.num, 7))
        self.write.set_arg(5, int(total == 0))
        self.write.run(self.device.queue)

    def build_backward(self, bottom, top):
        self.bwd = []
