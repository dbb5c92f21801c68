"""Classify images with a Caffe model: the library side of `caffe_ocl
classify` (caffe_ocl/commands/classify.py).

Images are read as BGR and fed 0..255 minus the mean, as Caffe's C++
classification example does; they are resized to the net's input size.
"""
import cv2
import numpy as np

from .errors import DataError, require_file
from .net import TEST, Net

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog",
                   "horse", "ship", "truck"]


def classify(model, weights, images, mean=None, scale=1.0, labels=None, top_k=3):
    """Return [(image, [(label, prob), ...])] for each image path."""
    net = Net(model, weights, TEST)
    inp = net.inputs[0]
    n, c, h, w = net.blobs[inp].shape
    out_name = net.outputs[0]
    results = []
    for path in images:
        require_file(path, "image")
        im = cv2.imread(str(path), cv2.IMREAD_COLOR if c == 3 else cv2.IMREAD_GRAYSCALE)
        if im is None:
            raise DataError(f"{path}: not an image OpenCV can decode")
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
