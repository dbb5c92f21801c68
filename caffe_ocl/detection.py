"""Object detection with SSD-style nets (a DetectionOutput layer whose rows
are [image_id, label, score, xmin, ymin, xmax, ymax], normalized corners)
and Faster R-CNN nets (py-faster-rcnn's test nets: inputs data + im_info, a
Proposal layer or the rpn.proposal_layer Python layer, ROI pooling, outputs
cls_prob and bbox_pred): ``detect(net, image, ...)`` preprocesses one image
as Caffe's and OpenCV's examples (SSD) or py-faster-rcnn's im_detect (Faster
R-CNN) do, runs the net and returns the boxes in the image's pixels.
``net_kind(net)`` says which of the two a net is, from its layer types.

Preprocessing: the image (H x W x C, BGR as cv2.imread gives it) is resized
to the net input, its channels reordered by ``channel_swap``, then
``(x - mean) * scale`` as Caffe's DataTransformer (and cv2.dnn.blobFromImage).
"""
import json
import re

import numpy as np

from .data.datum import read_image_file
from .device import get_device
from .errors import DataError, NetError, require_file
from .ops import frcnn_detect
from .proto import read_file_bytes

SSD, FASTER_RCNN = "ssd", "faster_rcnn"
# py-faster-rcnn's fast_rcnn/config.py: PIXEL_MEANS (BGR), TEST.SCALES,
# TEST.MAX_SIZE, TEST.NMS; its demo's CONF_THRESH is 0.8, test_net's 0.05
FRCNN_PIXEL_MEANS = (102.9801, 115.9465, 122.7717)
# a labelmap's largest label (the names list is indexed by label)
MAX_LABELS = 1 << 20
FRCNN_SCALE, FRCNN_MAX_SIZE, FRCNN_NMS = 600, 1000, 0.3
_ROI_POOLS = ("ROIPooling", "PSROIPooling")


def _is_proposal(layer):
    if layer.type == "Proposal":
        return True
    return layer.type == "Python" and layer.param.python_param.module == "rpn.proposal_layer"


def net_kind(net):
    """SSD (a DetectionOutput layer) or FASTER_RCNN (a Proposal layer or
    py-faster-rcnn's rpn.proposal_layer Python layer, and ROI pooling)."""
    types = [layer.type for layer in net.layers]
    if "DetectionOutput" in types:
        return SSD
    if any(_is_proposal(layer) for layer in net.layers) and any(t in _ROI_POOLS for t in types):
        return FASTER_RCNN
    raise NetError(f"net {net.name!r} has no DetectionOutput layer (SSD-style nets) and no "
                   "Proposal layer (or py-faster-rcnn's rpn.proposal_layer Python layer) with "
                   "ROIPooling (Faster R-CNN): `detect` runs those two kinds of net")


def detection_output_blob(net):
    """Name of the net's DetectionOutput top (the last one)."""
    for name, layer in reversed(list(net.layer_dict.items())):
        if layer.type == "DetectionOutput":
            return net.top_names[name][0]
    raise NetError(f"net {net.name!r} has no DetectionOutput layer: `detect` runs SSD-style "
                   "detection nets")


def preprocess(image, shape, mean=None, scale=1.0, channel_swap=None):
    """(C, H, W) float32 input for a net input of ``shape`` (N, C, H, W)."""
    import cv2
    _, c, h, w = shape
    im = np.asarray(image)
    if im.ndim == 2:
        im = im[:, :, None]
    if im.shape[2] != c:
        if c == 1:
            im = cv2.cvtColor(im, cv2.COLOR_BGR2GRAY)[:, :, None]
        elif im.shape[2] == 1 and c == 3:
            im = np.repeat(im, 3, axis=2)
        else:
            raise DataError(f"image has {im.shape[2]} channels, the net takes {c}")
    if im.shape[:2] != (h, w):
        im = cv2.resize(im, (w, h), interpolation=cv2.INTER_LINEAR).reshape(h, w, -1)
    x = im.astype(np.float32).transpose(2, 0, 1)
    if channel_swap is not None:
        x = x[list(channel_swap)]
    if mean is not None:
        mean = np.asarray(mean, np.float32)
        if mean.ndim == 1:
            mean = mean.reshape(-1, 1, 1)
        elif mean.ndim == 3 and mean.shape[1:] != (h, w):
            mean = mean.mean(axis=(1, 2)).reshape(-1, 1, 1)    # a mean image: its pixel mean
        x = x - mean
    return x * scale


def detect(net, image, mean=None, scale=1.0, channel_swap=None, threshold=0.0, labels=None,
           nms=FRCNN_NMS, target_size=FRCNN_SCALE, max_size=FRCNN_MAX_SIZE):
    """Detections of one image (an array, BGR, or a path) as a list of dicts:
    label (int), name, score, box [xmin, ymin, xmax, ymax] in the image's
    pixels (clipped to it) and, for SSD nets, box_normalized (the net's
    values). Faster R-CNN nets (``net_kind``): the image minus ``mean``
    (default py-faster-rcnn's PIXEL_MEANS) is resized so that its shorter
    side is ``target_size`` (its longer at most ``max_size``), the net is
    reshaped to it, and per class the boxes scoring above ``threshold`` go
    through NMS at ``nms``; ``scale`` multiplies after the mean."""
    import cv2
    if not isinstance(image, np.ndarray):
        image = read_image_file(str(image), cv2.IMREAD_COLOR)
    if net_kind(net) == FASTER_RCNN:
        return _detect_frcnn(net, image, mean, scale, channel_swap, threshold, labels, nms,
                             target_size, max_size)
    out_name = detection_output_blob(net)
    inp = net.inputs[0]
    shape = net.blobs[inp].shape
    batch = np.zeros(shape, np.float32)
    batch[0] = preprocess(image, shape, mean, scale, channel_swap)
    rows = net.forward(**{inp: batch})[out_name].reshape(-1, 7)
    H, W = image.shape[:2]
    found = []
    for img_id, label, score, x0, y0, x1, y1 in rows.tolist():
        if int(img_id) != 0 or label < 0 or score < threshold:
            continue
        lab = int(label)
        box = [min(max(x0 * W, 0.0), W), min(max(y0 * H, 0.0), H),
               min(max(x1 * W, 0.0), W), min(max(y1 * H, 0.0), H)]
        found.append({"label": lab,
                      "name": labels[lab] if labels and 0 <= lab < len(labels) else str(lab),
                      "score": float(score), "box": [float(v) for v in box],
                      "box_normalized": [float(x0), float(y0), float(x1), float(y1)]})
    return found


def frcnn_blob(image, mean=None, scale=1.0, channel_swap=None, target_size=FRCNN_SCALE,
               max_size=FRCNN_MAX_SIZE):
    """py-faster-rcnn's _get_image_blob for one scale: ((1, C, h, w) blob,
    im_scale)."""
    import cv2
    im = np.asarray(image, np.float32)
    if im.ndim == 2:
        im = im[:, :, None]
    m = np.asarray(FRCNN_PIXEL_MEANS if mean is None else mean, np.float32)
    if m.ndim == 3:              # a (C, H, W) mean image: its pixel mean
        m = m.mean(axis=(1, 2))
    im = im - m.reshape(1, 1, -1)
    lo, hi = min(im.shape[:2]), max(im.shape[:2])
    im_scale = float(target_size) / float(lo)
    if np.round(im_scale * hi) > max_size:
        im_scale = float(max_size) / float(hi)
    im = cv2.resize(im, None, None, fx=im_scale, fy=im_scale, interpolation=cv2.INTER_LINEAR)
    if im.ndim == 2:
        im = im[:, :, None]
    x = im.transpose(2, 0, 1)
    if channel_swap is not None:
        x = x[list(channel_swap)]
    return (x * scale)[None].astype(np.float32), im_scale


def _frcnn_blobs(net):
    """(data input, im_info input, rois blob, cls_prob blob, bbox_pred blob
    or None) of a Faster R-CNN test net."""
    ins = net.inputs
    info = "im_info" if "im_info" in ins else None
    data = "data" if "data" in ins else next((n for n in ins if n != info), None)
    if info is None or data is None:
        raise NetError(f"net {net.name!r}: a Faster R-CNN test net needs inputs data and "
                       f"im_info, found {ins}")
    rois = next(net.top_names[name][0] for name, layer in net.layer_dict.items()
                if _is_proposal(layer))
    outs = net.outputs
    cls = "cls_prob" if "cls_prob" in outs else None
    bbox = "bbox_pred" if "bbox_pred" in outs else None
    if cls is None:
        raise NetError(f"net {net.name!r}: a Faster R-CNN test net needs an output cls_prob, "
                       f"found {outs}")
    return data, info, rois, cls, bbox


def _detect_frcnn(net, image, mean, scale, channel_swap, threshold, labels, nms, target_size,
                  max_size):
    data, info, rois_name, cls_name, bbox_name = _frcnn_blobs(net)
    blob, im_scale = frcnn_blob(image, mean, scale, channel_swap, target_size, max_size)
    net.blobs[data].reshape(*blob.shape)
    net.blobs[info].reshape(1, 3)
    net.reshape()
    im_info = np.array([[blob.shape[2], blob.shape[3], im_scale]], np.float32)
    out = net.forward(**{data: blob, info: im_info})
    rois = np.ascontiguousarray(net.blobs[rois_name].data, np.float32).reshape(-1, 5)
    scores = np.ascontiguousarray(out[cls_name], np.float32)
    R = rois.shape[0]
    scores = scores.reshape(R, -1)
    K = scores.shape[1]
    deltas = None
    if bbox_name is not None:
        deltas = np.ascontiguousarray(out[bbox_name], np.float32).reshape(R, -1)
        if deltas.shape[1] != 4 * K:
            raise NetError(f"net {net.name!r}: {bbox_name} has {deltas.shape[1]} values per roi, "
                           f"expected 4 x {K} classes")
    if R == 0:
        return []
    dev = get_device()
    bufs = []
    for host in (rois, deltas, scores):
        if host is None:
            bufs.append(None)
            continue
        buf = dev.alloc(host.nbytes)
        dev.upload(buf, host)
        bufs.append(buf)
    per_class = frcnn_detect.detect_post(dev, R, K, bufs[0], bufs[1], bufs[2], im_scale,
                                         image.shape[:2], threshold, nms)
    found = []
    for lab, (_, sc, boxes) in enumerate(per_class):
        for s, box in zip(sc.tolist(), boxes.tolist()):
            found.append({"label": lab,
                          "name": labels[lab] if labels and 0 <= lab < len(labels) else str(lab),
                          "score": float(s), "box": [float(v) for v in box]})
    return found


def read_labels(path):
    """Label names: one per line, or an SSD labelmap prototxt
    (item { name label display_name }) indexed by label."""
    raw = read_file_bytes(require_file(path, "labels file"), "labels file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: labels file is not UTF-8 text (byte {e.start})") from None
    if "item" in text and "label:" in text:
        out = {}
        for body in re.findall(r"item\s*\{([^}]*)\}", text):
            lab = re.search(r"\blabel\s*:\s*(-?\d+)", body)
            name = (re.search(r"display_name\s*:\s*\"([^\"]*)\"", body)
                    or re.search(r"\bname\s*:\s*\"([^\"]*)\"", body))
            if lab and name:
                if not 0 <= int(lab.group(1)) < MAX_LABELS:
                    raise DataError(f"{path}: label {lab.group(1)} is out of range "
                                    f"(0 to {MAX_LABELS - 1})")
                out[int(lab.group(1))] = name.group(1)
        return [out.get(i, str(i)) for i in range(max(out) + 1)] if out else []
    return [line.strip() for line in text.splitlines() if line.strip()]


def draw(image, detections):
    """A copy of ``image`` with the boxes, names and scores drawn."""
    import cv2
    im = image.copy()
    for d in detections:
        x0, y0, x1, y1 = (int(round(v)) for v in d["box"])
        color = tuple(int(c) for c in np.random.default_rng(d["label"]).integers(64, 256, 3))
        cv2.rectangle(im, (x0, y0), (x1, y1), color, 2)
        cv2.putText(im, f"{d['name']} {d['score']:.2f}", (x0, max(y0 - 4, 10)),
                    cv2.FONT_HERSHEY_SIMPLEX, 0.5, color, 1, cv2.LINE_AA)
    return im


def to_json(path, detections, image_path=None, size=None):
    with open(path, "w") as f:
        json.dump({"image": image_path, "size": size, "detections": detections}, f, indent=1)
