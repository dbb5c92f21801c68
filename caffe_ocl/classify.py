"""`caffe_ocl classify`: classify images with a Caffe model.

With no arguments it runs the shipped, Caffe-trained CIFAR-10 quick model
(legacy V1 caffemodel) on its three example images.

    caffe_ocl classify [--model deploy.prototxt --weights w.caffemodel]
                       [--mean_file mean.binaryproto | --mean_value B,G,R]
                       [--labels labels.txt] [--scale S] [--top_k K] IMAGE...

Images are read as BGR and fed 0..255 minus the mean, as Caffe's C++
classification example does; they are resized to the net's input size.
"""
import logging

import numpy as np

from .errors import DataError, require_file
from .flags import parse_flags
from .paths import models_dir

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog",
                   "horse", "ship", "truck"]


def classify(model, weights, images, mean=None, scale=1.0, labels=None, top_k=3):
    """Return [(image, [(label, prob), ...])] for each image path."""
    import cv2
    from .net import Net, TEST
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


def classify_main(argv):
    flags, images = parse_flags(argv, {"model": str, "weights": str, "mean_file": str,
                                       "mean_value": str, "labels": str, "scale": float,
                                       "top_k": int, "gpu": str},
                                defaults={"scale": 1.0, "top_k": 3}, program="caffe_ocl classify")
    logging.getLogger("caffe_ocl").setLevel(logging.WARNING)
    mean, labels = None, None
    if "model" not in flags:
        d = models_dir() / "cifar10_quick"
        flags["model"] = str(d / "cifar10_quick.prototxt")
        flags.setdefault("weights", str(d / "cifar10_quick_iter_5000.caffemodel"))
        if not images:
            images = [str(d / f) for f in ("cat10.png", "dog10.png", "truck10.png")]
        if "mean_file" not in flags and "mean_value" not in flags:
            flags["mean_value"] = "113.9,123.0,125.3"
        labels = CIFAR10_CLASSES
        print(f"Classifying with the shipped CIFAR-10 quick model (Caffe-trained, V1 format): "
              f"{flags['model']}")
    if "mean_file" in flags:
        from .proto import read_blob_array
        mean = read_blob_array(flags["mean_file"])[0]
    elif "mean_value" in flags:
        mean = np.array([float(v) for v in flags["mean_value"].split(",")],
                        np.float32).reshape(-1, 1, 1)
    if "labels" in flags:
        with open(require_file(flags["labels"], "labels file")) as f:
            labels = [line.strip() for line in f if line.strip()]
    if "gpu" in flags:
        from .device import set_device, set_mode_gpu
        set_mode_gpu()
        if flags["gpu"] != "all":
            set_device(int(flags["gpu"].split(",")[0]))
    if not images:
        print("caffe_ocl classify: no images given")
        return 2
    from .device import get_device
    dev = get_device()
    print(f"Device: {dev.name} ({dev.info['platform_name']}; {dev.reason})")
    for path, top in classify(flags["model"], flags.get("weights"), images, mean,
                              flags["scale"], labels, flags["top_k"]):
        print(f"{path}:")
        for lab, p in top:
            print(f"  {p:.4f}  {lab}")
    return 0
