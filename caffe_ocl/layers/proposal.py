"""Faster R-CNN's region proposal layer, built in (OpenCV 4's ``Proposal``
type, ``proposal_param``), computing py-faster-rcnn's
``rpn/proposal_layer.py`` on the device (kernels/proposal.cl, NMS included).

The same layer runs a ``type: "Python"`` layer naming
``module: "rpn.proposal_layer" layer: "ProposalLayer"`` when that module
cannot be imported (layers/python_layer.py): its ``param_str``
(``'feat_stride': 16``, optionally ``'scales': [...]``) is read as a
literal, never executed, and the phase picks py-faster-rcnn's
TEST (6000 / 300) or TRAIN (12000 / 2000) pre/post-NMS counts.
"""
import ast
import re

import numpy as np

from ..errors import ShapeError
from ..ops import proposal as prop_ops
from ..proto import caffe_pb2
from .base import Layer, register

# py-faster-rcnn's fast_rcnn/config.py RPN settings, by phase
PY_FASTER_RCNN_CFG = {
    caffe_pb2.TEST: dict(pre_nms_topn=6000, post_nms_topn=300, nms_thresh=0.7, min_size=16),
    caffe_pb2.TRAIN: dict(pre_nms_topn=12000, post_nms_topn=2000, nms_thresh=0.7, min_size=16),
}
PYTHON_FALLBACK = ("rpn.proposal_layer", "ProposalLayer")


def generate_anchors(base_size=16, ratios=(0.5, 1, 2), scales=(8, 16, 32)):
    """py-faster-rcnn's rpn/generate_anchors.py: (len(ratios) * len(scales), 4)
    boxes (x1, y1, x2, y2) around the base box's centre (a setup-time table)."""
    def whctrs(a):
        w, h = a[2] - a[0] + 1, a[3] - a[1] + 1
        return w, h, a[0] + 0.5 * (w - 1), a[1] + 0.5 * (h - 1)

    def mk(ws, hs, xc, yc):
        ws, hs = ws[:, None], hs[:, None]
        return np.hstack((xc - 0.5 * (ws - 1), yc - 0.5 * (hs - 1),
                          xc + 0.5 * (ws - 1), yc + 0.5 * (hs - 1)))

    ratios, scales = np.asarray(ratios, np.float64), np.asarray(scales, np.float64)
    base = np.array([1, 1, base_size, base_size], np.float64) - 1
    w, h, xc, yc = whctrs(base)
    ws = np.round(np.sqrt(w * h / ratios))
    ratio_anchors = mk(ws, np.round(ws * ratios), xc, yc)
    out = []
    for a in ratio_anchors:
        w, h, xc, yc = whctrs(a)
        out.append(mk(w * scales, h * scales, xc, yc))
    return np.vstack(out)


def parse_param_str(text):
    """The YAML mapping of a py-faster-rcnn param_str (``'feat_stride': 16``,
    with or without braces or key quotes) as a dict, by literal parsing only."""
    s = text.strip()
    if not s:
        return {}
    if not s.startswith("{"):
        s = "{" + s + "}"
    s = re.sub(r"([{,]\s*)([A-Za-z_]\w*)\s*:", r"\1'\2':", s)   # bare YAML keys
    try:
        out = ast.literal_eval(s)
    except (ValueError, SyntaxError) as e:
        raise ValueError(f"cannot read param_str {text!r} as a mapping of literals: {e}") \
            from None
    if not isinstance(out, dict):
        raise ValueError(f"param_str {text!r} is not a mapping")
    return out


@register("Proposal")
class ProposalLayer(Layer):
    """Bottoms: rpn_cls_prob_reshape (1, 2A, H, W), rpn_bbox_pred (1, 4A, H, W),
    im_info (height, width, scale). Tops: rois (R, 5) rows (0, x1, y1, x2,
    y2) and optionally their scores (R, 1); R depends on the values, so
    each forward reads the kept count back to the host to shape the tops."""
    exact_num_bottom = 3
    min_top = 1
    max_top = 2
    has_backward = False
    allow_force_backward = False

    def layer_setup(self, bottom, top):
        if self.param.type == "Python":
            try:
                d = parse_param_str(self.param.python_param.param_str)
            except ValueError as e:
                raise self.error(str(e)) from None
            cfg = PY_FASTER_RCNN_CFG[self.phase]
            self.stride = float(d.get("feat_stride", 16))
            base, ratios = 16, (0.5, 1, 2)
            scales = tuple(d.get("scales", (8, 16, 32)))
            self.pre_n, self.post_n = cfg["pre_nms_topn"], cfg["post_nms_topn"]
            self.nms_thresh, self.min_size = cfg["nms_thresh"], cfg["min_size"]
        else:
            p = self.param.proposal_param
            self.stride, base = float(p.feat_stride), p.base_size
            ratios = tuple(p.ratio) or (0.5, 1, 2)
            scales = tuple(p.scale) or (8, 16, 32)
            self.pre_n, self.post_n = p.pre_nms_topn, p.post_nms_topn
            self.nms_thresh, self.min_size = p.nms_thresh, p.min_size
        if self.stride <= 0:
            raise self.error(f"feat_stride must be positive, got {self.stride}")
        anchors = generate_anchors(base, ratios, scales).astype(np.float32)
        self.A = len(anchors)
        self.anchors = self.device.alloc(anchors.nbytes)
        self.device.upload(self.anchors, anchors)
        self.counts = np.zeros(1, np.int32)

    def reshape(self, bottom, top):
        cls, deltas, info = bottom
        if cls.num_axes != 4 or cls.shape[0] != 1 or cls.shape[1] != 2 * self.A:
            raise self.error(f"bottom {cls.name!r} {cls.shape} must be (1, {2 * self.A}, H, W): "
                             f"one image, background and foreground scores of {self.A} "
                             "anchors", ShapeError)
        h, w = cls.shape[2:]
        if deltas.shape != (1, 4 * self.A, h, w):
            raise self.error(f"bottom {deltas.name!r} {deltas.shape} must be "
                             f"(1, {4 * self.A}, {h}, {w})", ShapeError)
        if info.count < 3:
            raise self.error(f"bottom {info.name!r} {info.shape} must hold (height, width, "
                             "scale)", ShapeError)
        n = self.A * h * w
        self.pre_cap = max(1, min(n, self.pre_n) if self.pre_n > 0 else n)
        self.post_cap = min(self.pre_cap, self.post_n) if self.post_n > 0 else self.pre_cap
        top[0].reshape((self.post_cap, 5))
        scores = top[1] if len(top) > 1 else None
        if scores is not None:
            scores.reshape((self.post_cap, 1))
            sbuf = scores.data_buffer()
        else:
            self.score_buf = self.device.alloc(4 * self.post_cap)
            sbuf = self.score_buf
        self.scratch = {k: self.device.alloc(v)
                        for k, v in prop_ops.scratch_sizes(n, self.pre_cap).items()}
        self.count = self.device.alloc(4)
        self.fwd = prop_ops.proposals(
            self.device, n, self.A, (h, w), self.stride, self.min_size, self.pre_cap,
            self.post_cap, self.nms_thresh, cls.data_buffer(), deltas.data_buffer(),
            info.data_buffer(), self.anchors, self.scratch, top[0].data_buffer(), sbuf,
            self.count)

    def forward_impl(self, bottom, top):
        super().forward_impl(bottom, top)
        self.device.download(self.counts, self.count)      # documented host read
        kept = int(self.counts[0])
        top[0].reshape((kept, 5))
        if len(top) > 1:
            top[1].reshape((kept, 1))
