"""`caffe_ocl classify`: classify images with a Caffe model.

With no model it runs the shipped, Caffe-trained CIFAR-10 quick model
(legacy V1 caffemodel) on its three example images.
"""
import logging

import numpy as np

from ..classify import CIFAR10_CLASSES, classify, load_mean
from ..detection import read_labels
from ..device import get_device, parse_device_ids, set_device, set_mode_gpu
from ..errors import FlagError
from ..paths import models_dir
from .flags import Arg, Flag, Spec
from ._common import UNTRUSTED, apply_untrusted

SUMMARY = "classify images with a Caffe model (default: the shipped CIFAR-10 quick)"

SPEC = Spec(
    "caffe_ocl classify", SUMMARY,
    flags=[Flag("model", str, "", "deploy prototxt (default: the shipped CIFAR-10 quick)",
                check="file"),
           Flag("weights", str, "", "its .caffemodel", check="file"),
           Flag("mean_file", str, "", "mean image .binaryproto subtracted from each image",
                check="file"),
           Flag("mean_value", str, "", "per-channel mean B,G,R subtracted instead",
                metavar="B,G,R"),
           Flag("labels", str, "", "text file with one class name per line", check="file"),
           Flag("scale", float, 1.0, "factor applied after the mean"),
           Flag("top_k", int, 3, "classes printed per image"),
           Flag("gpu", str, "", "OpenCL device id (N; all: the default GPU)", metavar="ID"),
           UNTRUSTED],
    args=[Arg("IMAGE", "image files (default with the shipped model: its three examples)",
              optional=True, many=True, check="file")],
    example="caffe_ocl classify\n"
            "caffe_ocl classify --model deploy.prototxt --weights w.caffemodel "
            "--mean_value 104,117,123 --labels synset_words.txt cat.jpg",
    details="Images are read as BGR, resized to the net's input, fed 0..255 minus the mean, "
            "times --scale (Caffe's C++ classification example).")


def main(argv):
    opts = SPEC.parse(argv)
    apply_untrusted(opts)
    logging.getLogger("caffe_ocl").setLevel(logging.WARNING)
    model, weights, images = opts.model, opts.weights, list(opts.args)
    mean_value, labels = opts.mean_value, None
    if not model:
        d = models_dir() / "cifar10_quick"
        model = str(d / "cifar10_quick.prototxt")
        weights = weights or str(d / "cifar10_quick_iter_5000.caffemodel")
        if not images:
            images = [str(d / f) for f in ("cat10.png", "dog10.png", "truck10.png")]
        if not opts.mean_file and not mean_value:
            mean_value = "113.9,123.0,125.3"
        labels = CIFAR10_CLASSES
        print(f"Classifying with the shipped CIFAR-10 quick model (Caffe-trained, V1 format): "
              f"{model}")
    if not images:
        raise FlagError("no images given (caffe_ocl classify --help)")
    if opts.top_k < 1:
        raise FlagError(f"--top_k must be at least 1, got {opts.top_k}")
    if not np.isfinite(opts.scale):
        raise FlagError(f"--scale must be a finite number, got {opts.scale}")
    mean = None
    if opts.mean_file:
        mean = load_mean(opts.mean_file)
    elif mean_value:
        try:
            mean = np.array([float(v) for v in mean_value.split(",")],
                            np.float32).reshape(-1, 1, 1)
        except ValueError:
            raise FlagError(f"--mean_value expects numbers B,G,R, got {mean_value!r}") from None
        if not np.all(np.isfinite(mean)):
            raise FlagError(f"--mean_value expects finite numbers, got {mean_value!r}")
    if opts.labels:
        labels = read_labels(opts.labels)
    if opts.gpu:
        set_mode_gpu()
        if opts.gpu != "all":
            set_device(parse_device_ids(opts.gpu)[0])
    dev = get_device()
    print(f"Device: {dev.name} ({dev.info['platform_name']}; {dev.reason})")
    source = opts.mean_file or f"--mean_value {mean_value}"
    for path, top in classify(model, weights or None, images, mean, opts.scale, labels,
                              opts.top_k, mean_source=source):
        print(f"{path}:")
        for lab, p in top:
            print(f"  {p:.4f}  {lab}")
    return 0
