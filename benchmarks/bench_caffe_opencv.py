"""Published Caffe deploy prototxts on the CPU: caffe_ocl against OpenCV's
DNN module (its Caffe importer, CPU backend), same weights, same input, in
the same process, rounds interleaved (this machine's speed drifts between
minutes); ratio = OpenCV ms / caffe_ocl ms (>= 1: caffe_ocl ahead).
``--target opencl``: OpenCV's own OpenCL kernels instead of its CPU
backend (on a GPU machine, the other OpenCL engine on the same GPU).

    python3 benchmarks/bench_caffe_opencv.py NET.prototxt [...] [--weights W.caffemodel]
        [--batch 1] [--size H,W] [--rounds 9] [--runs 5] [--ab SETTING[,SETTING]]

Without --weights each net gets seeded random weights (scaled by fan-in,
BatchNorm variances positive, its scale factor 1), written to a temporary .caffemodel that
OpenCV reads. ``--ab``: a caffe_ocl net built with those settings off
(``base``) is timed in the same rounds, paired ratio base / ours. The
first input blob is fed; every output compared by name (largest difference
relative to the output's largest value).
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from caffe_ocl import config  # noqa: E402
from caffe_ocl.net import Net, TEST  # noqa: E402
from caffe_ocl.plan.patterns import writers  # noqa: E402


def _as_ours(ours, ref):
    """OpenCV's output ``ref`` in the shape of ours. A DetectionOutput top
    (rows of 7): OpenCV always returns keep_top_k rows, the unused ones
    zeros, where Caffe (and caffe_ocl) return only the detections kept --
    its all-zero rows are dropped first (OpenCV's res10 SSD face detector:
    200 rows against 90)."""
    if ref.size != ours.size and ref.shape[-1] == 7 and ours.shape[-1] == 7:
        rows = ref.reshape(-1, 7)
        ref = rows[np.abs(rows).sum(axis=1) > 0]
    return ref.reshape(ours.shape)


def _random_weights(net, seed=1):
    """Seeded weights scaled by fan-in (std 1 / sqrt(fan-in)), other
    parameters std 0.3: activations keep their size through deep nets, so
    softmax outputs are not one-hot and the comparison with OpenCV means
    something (a fixed std saturated every classifier: errors of exactly 0)."""
    rng = np.random.default_rng(seed)
    for name, blobs in net.params.items():
        values = [rng.normal(0, 1.0 / np.sqrt(np.prod(b.shape[1:])) if len(b.shape) > 1
                             else 0.3, b.shape) for b in blobs]
        if net.layer_dict[name].type == "BatchNorm" and len(blobs) == 3:
            values[1] = np.abs(values[1]) + 0.5         # variance
            values[2] = np.ones(blobs[2].shape)         # scale factor
        for b, v in zip(blobs, values):
            b.data[...] = v


def _build(proto, weights, batch, settings, size=None):
    with config.override(**settings):
        net = Net(proto, TEST, weights=weights)
    name = net.inputs[0]
    shape = (batch,) + tuple(net.blobs[name].shape[1:])
    if size:
        shape = shape[:-len(size)] + tuple(size)
    if net.blobs[name].shape != shape:
        net.blobs[name].reshape(*shape)
        net.reshape()
    return net


def _time_ours(net, runs):
    q = net.layers[0].device.queue
    last = len(net.layers) - 1
    net.forward_from_to(0, last)
    q.finish()
    t0 = time.perf_counter()
    for _ in range(runs):
        net.forward_from_to(0, last)
    q.finish()
    return (time.perf_counter() - t0) / runs * 1e3


def _time_cv(cv_net, x, runs, names):
    cv_net.setInput(x)
    cv_net.forward(names)
    t0 = time.perf_counter()
    for _ in range(runs):
        cv_net.setInput(x)
        cv_net.forward(names)
    return (time.perf_counter() - t0) / runs * 1e3


def _opencv_output_names(net, blobs, cv_layers):
    """OpenCV's forward() takes layer names: each output blob's last writer
    (LightCNN's "softmax" writes "prob") where OpenCV has a layer of that
    name, else the blob's name (OpenCV names some one-layer nets' layers
    after their tops)."""
    names = []
    for blob in blobs:
        found = writers(net.graph, net.blobs[blob])
        last = net.graph.layer_names[found[-1]] if found else None
        names.append(last if last in cv_layers else blob)
    return names


def run_one(proto, args):
    import cv2
    settings_off = {s: False for s in args.ab.split(",") if s} if args.ab else None
    with tempfile.TemporaryDirectory() as tmp:
        weights = args.weights
        ours = _build(proto, weights, args.batch, {}, args.size)
        if weights is None:
            _random_weights(ours)
            weights = os.path.join(tmp, "w.caffemodel")
            ours.save(weights)
            ours = _build(proto, weights, args.batch, {}, args.size)
        base = (_build(proto, weights, args.batch, settings_off, args.size)
                if settings_off else None)
        cv_net = cv2.dnn.readNetFromCaffe(proto, weights)
    cv_net.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
    cv_net.setPreferableTarget(cv2.dnn.DNN_TARGET_OPENCL if args.target == "opencl"
                               else cv2.dnn.DNN_TARGET_CPU)
    name = ours.inputs[0]
    x = np.random.default_rng(2).normal(0, 1, ours.blobs[name].shape).astype(np.float32)
    nets = {"ours": ours} if base is None else {"ours": ours, "base": base}
    # every output of the net, by name (MTCNN's nets have two or three;
    # OpenCV's forward() alone computes only its last layer's)
    outputs = list(ours.outputs)
    outs = {}
    for k, n in nets.items():
        out = n.forward(**{name: x})
        outs[k] = [out[o].copy() for o in outputs]
    cv_names = _opencv_output_names(ours, outputs, set(cv_net.getLayerNames()))
    cv_net.setInput(x)
    refs = cv_net.forward(cv_names)
    err = max(float(np.abs(o - _as_ours(o, r)).max() / max(float(np.abs(r).max()), 1e-30))
              for o, r in zip(outs["ours"], refs))
    times = {k: [] for k in list(nets) + ["opencv"]}
    order = list(nets) + ["opencv"]
    for r in range(args.rounds):
        for k in (order if r % 2 == 0 else order[::-1]):
            times[k].append(_time_cv(cv_net, x, args.runs, cv_names) if k == "opencv"
                            else _time_ours(nets[k], args.runs))
    med = {k: statistics.median(v) for k, v in times.items()}
    row = {"net": os.path.basename(proto), "input": "x".join(map(str, x.shape)), "ours_ms": med["ours"],
           "opencv_ms": med["opencv"], "rel_err": err,
           "opencv/ours": statistics.median(a / b for a, b in zip(times["opencv"],
                                                                  times["ours"]))}
    if base is not None:
        row["base_ms"] = med["base"]
        row["base/ours"] = statistics.median(a / b for a, b in zip(times["base"],
                                                                   times["ours"]))
    return row


def net_arguments(doc):
    """An argument parser with the prototxts, --batch and --size (H,W of
    the input instead of the prototxt's), as the prototxt scripts share
    them (ab_prototxt.py, profile_prototxt_kernels.py)."""
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prototxt", nargs="+")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--size", type=lambda v: tuple(int(d) for d in v.split(",")),
                    help="H,W of the input instead of the prototxt's (fully convolutional "
                         "nets such as MTCNN's P-Net run on each scale of an image pyramid)")
    return ap


def main(argv=None):
    ap = net_arguments(__doc__)
    ap.add_argument("--weights", help="a .caffemodel for the (one) net; default random")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--target", choices=("cpu", "opencl"), default="cpu",
                    help="OpenCV's DNN target: its CPU backend, or its OpenCL kernels on "
                         "OpenCV's default OpenCL device (a GPU beside ours)")
    ap.add_argument("--ab", default="", help="settings turned off for a base net, comma-separated")
    args = ap.parse_args(argv)
    if args.weights and len(args.prototxt) != 1:
        ap.error("--weights goes with one prototxt")
    import cv2
    if not hasattr(cv2.dnn, "readNetFromCaffe"):
        sys.exit(f"OpenCV {cv2.__version__} has no Caffe importer (OpenCV 5 dropped it); "
                 "this benchmark needs OpenCV 4 (pip install 'opencv-python-headless<5')")
    cv2.setNumThreads(max(os.cpu_count() or 1, 1))
    if args.target == "opencl":
        cv2.ocl.setUseOpenCL(True)
        if not cv2.ocl.haveOpenCL():
            sys.exit("OpenCV sees no OpenCL device (--target opencl)")
        print(f"# OpenCV OpenCL device: {cv2.ocl.Device.getDefault().name()}")
    rows = [run_one(p, args) for p in args.prototxt]
    head = "| net | input | caffe_ocl ms | OpenCV ms | OpenCV/ours (paired) |"
    sep = "|---|---|---|---|---|"
    if args.ab:
        head += f" base ({args.ab} off) ms | base/ours (paired) |"
        sep += "---|---|"
    print(head + " rel. err |")
    print(sep + "---|")
    def num(v):
        # two decimals, or two significant digits below 0.1 (a tiny net's
        # 0.004 ratio under load must not print as 0.00)
        return f"{v:.2f}" if abs(v) >= 0.1 else f"{v:.2g}"
    for r in rows:
        line = (f"| {r['net']} | {r['input']} | {num(r['ours_ms'])} | {num(r['opencv_ms'])} "
                f"| {num(r['opencv/ours'])} |")
        if args.ab:
            line += f" {num(r['base_ms'])} | {num(r['base/ours'])} |"
        print(line + f" {r['rel_err']:.1e} |")


if __name__ == "__main__":
    main()
