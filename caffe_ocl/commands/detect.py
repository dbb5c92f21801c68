"""`caffe_ocl detect`: run an SSD-style detection net (DetectionOutput) on
images; for each IMAGE write OUT/<stem>.json (boxes, labels, scores) and
OUT/<stem>.png (the image with the boxes drawn).

    caffe_ocl detect --model deploy.prototxt --weights w.caffemodel
                     [--mean_value B,G,R | --mean_file mean.binaryproto]
                     [--scale S] [--channel_swap 2,1,0] [--labels labels.txt]
                     [--threshold T] [--output_dir OUT] [--gpu N] IMAGE...

Images are read as BGR, resized to the net input, channels reordered by
--channel_swap, then (x - mean) * scale (Caffe's DataTransformer order, and
cv2.dnn.blobFromImage's). --labels: one name per line, or an SSD labelmap.
"""
import logging
import os

import numpy as np

from .. import detection
from ..errors import DataError, require_file
from ..flags import parse_flags

SPEC = {"model": str, "weights": str, "mean_file": str, "mean_value": str, "scale": float,
        "channel_swap": str, "labels": str, "threshold": float, "output_dir": str, "gpu": str}
PROGRAM = "caffe_ocl detect"


def main(argv):
    flags, images = parse_flags(argv, SPEC, defaults={"scale": 1.0, "threshold": 0.5,
                                                      "output_dir": "."}, program=PROGRAM)
    logging.getLogger("caffe_ocl").setLevel(logging.WARNING)
    if "model" not in flags or "weights" not in flags:
        print(f"{PROGRAM}: --model and --weights are required")
        return 2
    if not images:
        print(f"{PROGRAM}: no images given")
        return 2
    import cv2
    from ..net import Net, TEST
    mean = None
    if "mean_file" in flags:
        from ..proto import blobproto_to_array, read_blobproto
        mean = blobproto_to_array(read_blobproto(flags["mean_file"]))[0]
    elif "mean_value" in flags:
        mean = np.array([float(v) for v in flags["mean_value"].split(",")], np.float32)
    swap = [int(v) for v in flags["channel_swap"].split(",")] if "channel_swap" in flags \
        else None
    labels = detection.read_labels(flags["labels"]) if "labels" in flags else None
    if "gpu" in flags:
        from ..device import set_device, set_mode_gpu
        set_mode_gpu()
        if flags["gpu"] != "all":
            set_device(int(flags["gpu"].split(",")[0]))
    net = Net(flags["model"], flags["weights"], TEST)
    out = flags["output_dir"]
    os.makedirs(out, exist_ok=True)
    for path in images:
        require_file(path, "image")
        im = cv2.imread(path, cv2.IMREAD_COLOR)
        if im is None:
            raise DataError(f"{path}: not an image OpenCV can decode")
        dets = detection.detect(net, im, mean, flags["scale"], swap, flags["threshold"], labels)
        stem = os.path.join(out, os.path.splitext(os.path.basename(path))[0])
        detection.to_json(stem + ".json", dets, path, [im.shape[1], im.shape[0]])
        cv2.imwrite(stem + ".png", detection.draw(im, dets))
        print(f"{path}: {len(dets)} detection(s) -> {stem}.json, {stem}.png")
        for d in dets:
            print(f"  {d['score']:.3f}  {d['name']}  "
                  + " ".join(f"{v:.1f}" for v in d["box"]))
    return 0
