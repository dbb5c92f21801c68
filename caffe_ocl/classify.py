"""Classify images with a Caffe model: the library side of `caffe_ocl
classify` (caffe_ocl/commands/classify.py).

Images are read as BGR and fed 0..255 minus the mean, as Caffe's C++
classification example does; they are resized to the net's input size.
"""
import cv2
import numpy as np

from .data.datum import read_image_file
from .errors import DataError, ShapeError
from .net import TEST, Net
from .proto import read_blob_array

def load_mean(path):
    """A mean .binaryproto as (C, H, W) float32 for classify's --mean_file."""
    arr = read_blob_array(path)
    if arr.ndim == 4 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != 3:
        raise ShapeError(f"{path}: mean blob has shape {list(arr.shape)}; expected 1 x C x H x "
                         "W or C x H x W")
    if not np.all(np.isfinite(arr)):
        raise DataError(f"{path}: mean blob holds NaN or infinite values")
    return arr


def _check_mean(mean, c, h, w, where):
    """The mean must broadcast to one (C, H, W) image: C or 1 channels, the
    input's H x W or 1 x 1."""
    m = np.asarray(mean, np.float32)
    if m.ndim == 1:
        m = m.reshape(-1, 1, 1)
    ok = (m.ndim == 3 and m.shape[0] in (1, c) and m.shape[1:] in ((1, 1), (h, w)))
    if not ok:
        raise ShapeError(f"{where}: the mean has shape {list(m.shape)}; the net's input "
                         f"is {c} x {h} x {w} (a mean needs {c} or 1 channels and {h} x {w} "
                         "or 1 x 1 pixels)")
    return m

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog",
                   "horse", "ship", "truck"]


def classify(model, weights, images, mean=None, scale=1.0, labels=None, top_k=3,
             mean_source="the mean"):
    """Return [(image, [(label, prob), ...])] for each image path.
    ``mean_source`` (the mean file, or the flag) names the mean in errors."""
    net = Net(model, weights, TEST)
    if not net.inputs or not net.outputs:
        raise ShapeError(f"{model}: classify needs a net with an input and an output blob")
    inp = net.inputs[0]
    shape = tuple(net.blobs[inp].shape)
    if len(shape) != 4 or shape[1] not in (1, 3) or min(shape) < 1:
        raise ShapeError(f"{model}: classify needs an input blob N x C x H x W with 1 or 3 "
                         f"channels; {inp!r} has shape {list(shape)}")
    n, c, h, w = shape
    if mean is not None:
        mean = _check_mean(mean, c, h, w, mean_source)
    out_name = net.outputs[0]
    results = []
    for path in images:
        im = read_image_file(path, cv2.IMREAD_COLOR if c == 3 else cv2.IMREAD_GRAYSCALE)
        if im.shape[:2] != (h, w):
            im = cv2.resize(im, (w, h), interpolation=cv2.INTER_LINEAR)
        x = im.astype(np.float32).reshape(h, w, c).transpose(2, 0, 1)
        if mean is not None:
            x = x - mean
        x = x * scale
        batch = np.zeros((n, c, h, w), np.float32)
        batch[0] = x
        prob = net.forward(**{inp: batch})[out_name][0].ravel()
        order = np.argsort(-prob)[:top_k]
        results.append((path, [(labels[i] if labels and i < len(labels) else str(i),
                                float(prob[i])) for i in order]))
    return results
