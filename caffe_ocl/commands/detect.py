"""`caffe_ocl detect`: run an SSD-style detection net (DetectionOutput) or a
py-faster-rcnn test net (Proposal + ROIPooling; preprocessing and NMS as its
im_detect, caffe_ocl/detection.py) on images; for each IMAGE write OUT/<stem>.json (boxes, labels, scores) and
OUT/<stem>.png (the image with the boxes drawn).

Images are read as BGR, resized to the net input, channels reordered by
--channel_swap, then (x - mean) * scale (Caffe's DataTransformer order, and
cv2.dnn.blobFromImage's). --labels: one name per line, or an SSD labelmap.
"""
import logging
import os

import cv2
import numpy as np

from .. import detection
from ..data.datum import read_image_file
from ..errors import FlagError
from ..net import TEST, Net
from ..proto import blobproto_to_array, read_blobproto
from ._common import GPU, UNTRUSTED, apply_untrusted, require_hdf5_for, use_device
from .flags import Arg, Flag, Spec

SUMMARY = ("detect objects with an SSD-style or Faster R-CNN net: per image a .json and a .png "
           "with the boxes")

SPEC = Spec(
    "caffe_ocl detect", SUMMARY,
    flags=[Flag("model", str, "", "deploy prototxt: SSD-style (DetectionOutput) or a "
                "py-faster-rcnn test net (Proposal + ROIPooling) (required)",
                check="file"),
           Flag("weights", str, "", "its .caffemodel (required)", check="file"),
           Flag("mean_value", str, "", "per-channel mean subtracted (after --channel_swap)",
                metavar="B,G,R"),
           Flag("mean_file", str, "", "mean image .binaryproto subtracted instead",
                check="file"),
           Flag("scale", float, 1.0, "factor applied after the mean"),
           Flag("channel_swap", str, "", "channel order fed to the net, e.g. 2,1,0 for RGB "
                "(default: BGR as read)", metavar="2,1,0"),
           Flag("labels", str, "", "label names: one per line, or an SSD labelmap prototxt",
                check="file"),
           Flag("threshold", float, 0.5, "lowest score kept"),
           Flag("nms", float, 0.3, "Faster R-CNN nets: per-class NMS IoU threshold"),
           Flag("output_dir", str, ".", "folder for <stem>.json and <stem>.png",
                metavar="DIR"),
           GPU, UNTRUSTED],
    args=[Arg("IMAGE", "image files", many=True, check="file")],
    example="caffe_ocl detect --model deploy.prototxt --weights ssd.caffemodel "
            "--mean_value 104,117,123 --labels labelmap_voc.prototxt --output_dir out "
            "dog.jpg",
    details="Images are read as BGR, resized to the net input, channels reordered by "
            "--channel_swap, then (x - mean) * scale (Caffe's DataTransformer order, and "
            "cv2.dnn.blobFromImage's).")


def _numbers(text, flag, kind):
    try:
        return [kind(v) for v in text.split(",")]
    except ValueError:
        raise FlagError(f"--{flag} expects comma-separated numbers, got {text!r}") from None


def main(argv):
    opts = SPEC.parse(argv)
    apply_untrusted(opts)
    if not opts.model or not opts.weights:
        raise FlagError("--model and --weights are required (caffe_ocl detect --help)")
    mean = swap = labels = None
    if opts.mean_value:
        mean = np.array(_numbers(opts.mean_value, "mean_value", float), np.float32)
    swap = _numbers(opts.channel_swap, "channel_swap", int) if opts.channel_swap else None
    require_hdf5_for([opts.weights], "caffe_ocl detect")
    logging.getLogger("caffe_ocl").setLevel(logging.WARNING)
    if opts.mean_file:
        mean = blobproto_to_array(read_blobproto(opts.mean_file))[0]
    if opts.labels:
        labels = detection.read_labels(opts.labels)
    use_device(opts.gpu)
    net = Net(opts.model, opts.weights, TEST)
    out = opts.output_dir
    os.makedirs(out, exist_ok=True)
    for path in opts.args:
        im = read_image_file(path, cv2.IMREAD_COLOR)
        dets = detection.detect(net, im, mean, opts.scale, swap, opts.threshold, labels,
                                nms=opts.nms)
        stem = os.path.join(out, os.path.splitext(os.path.basename(path))[0])
        detection.to_json(stem + ".json", dets, path, [im.shape[1], im.shape[0]])
        cv2.imwrite(stem + ".png", detection.draw(im, dets))
        print(f"{path}: {len(dets)} detection(s) -> {stem}.json, {stem}.png")
        for d in dets:
            print(f"  {d['score']:.3f}  {d['name']}  "
                  + " ".join(f"{v:.1f}" for v in d["box"]))
    return 0
