"""Object detection with SSD-style nets (a DetectionOutput layer whose rows
are [image_id, label, score, xmin, ymin, xmax, ymax], normalized corners):
``detect(net, image, ...)`` preprocesses one image as Caffe's and OpenCV's
examples do, runs the net and returns the boxes in the image's pixels.

Preprocessing: the image (H x W x C, BGR as cv2.imread gives it) is resized
to the net input, its channels reordered by ``channel_swap``, then
``(x - mean) * scale`` as Caffe's DataTransformer (and cv2.dnn.blobFromImage).
"""
import json
import re

import numpy as np

from .errors import DataError, NetError, require_file


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


def detect(net, image, mean=None, scale=1.0, channel_swap=None, threshold=0.0, labels=None):
    """Detections of one image (an array, BGR, or a path) as a list of dicts:
    label (int), name, score, box [xmin, ymin, xmax, ymax] in the image's
    pixels (clipped to it) and box_normalized (the net's values)."""
    import cv2
    if not isinstance(image, np.ndarray):
        path = str(image)
        require_file(path, "image")
        image = cv2.imread(path, cv2.IMREAD_COLOR)
        if image is None:
            raise DataError(f"{path}: not an image OpenCV can decode")
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


def read_labels(path):
    """Label names: one per line, or an SSD labelmap prototxt
    (item { name label display_name }) indexed by label."""
    with open(require_file(path, "labels file")) as f:
        text = f.read()
    if "item" in text and "label:" in text:
        out = {}
        for body in re.findall(r"item\s*\{([^}]*)\}", text):
            lab = re.search(r"\blabel\s*:\s*(-?\d+)", body)
            name = (re.search(r"display_name\s*:\s*\"([^\"]*)\"", body)
                    or re.search(r"\bname\s*:\s*\"([^\"]*)\"", body))
            if lab and name:
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
