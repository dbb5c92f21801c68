"""TF32 convolution forwards on an NVIDIA GPU, same run: the implicit-GEMM
kernel (conv_igemm.cl, register-staged tiles: its gathers cannot be the
async loop's 16-byte copies) against the columns gathered into rows over
the batch (im2col.cl conv_rows) and the async loop's GEMM
(ops/conv.py gathered_forward_chunk, setting GEMM_GATHERED_CONV), on the
k x k layers of converted torchvision nets at batch 64; milliseconds,
TFLOP/s and the ratio igemm / gathered, with the largest difference
between the two outputs (relative to the output's largest value).

    python benchmarks/bench_gathered_conv.py [--batch 64] [--runs 10]

--one-by-one: 1 x 1 layers through the implicit GEMM (setting GEMM_1X1
off) against the folded GEMM on the images or on rows gathered at the
stride, whatever GEMM_1X1_MIN_K / ROWS_1X1_MIN_K say.

--backward-data: the strided k x k layers' backward-data, the implicit
GEMM's per-phase products (conv_bwd_data_phase) against dy gathered into
rows, the columns' gradient as the async loop's GEMM and col2im
(ops/conv.py gathered_backward_data_chunk, GATHERED_BWD_MIN_K lifted).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from caffe_ocl import config  # noqa: E402
from caffe_ocl.device import get_device  # noqa: E402
from caffe_ocl.ops import conv as conv_ops  # noqa: E402
from caffe_ocl.ops import gemm as gemm_ops  # noqa: E402
from common import random_buffers, time_launches  # noqa: E402

# (name, C, H, W, M, k, pad, stride): per image
SHAPES = [
    ("Wide-ResNet-50 layer2.0.conv2", 256, 56, 56, 256, 3, 1, 2),
    ("Wide-ResNet-50 layer3.0.conv2", 512, 28, 28, 512, 3, 1, 2),
    ("Wide-ResNet-50 layer4.0.conv2", 1024, 14, 14, 1024, 3, 1, 2),
    ("ResNet-50 layer2.0.conv2", 128, 56, 56, 128, 3, 1, 2),
    ("ResNet-50 layer3.0.conv2", 256, 28, 28, 256, 3, 1, 2),
    ("ResNet-50 layer4.0.conv2", 512, 14, 14, 512, 3, 1, 2),
    ("GoogLeNet 3a 3x3 (stride 1)", 96, 28, 28, 128, 3, 1, 1),
    ("VGG-16 conv5 3x3 (stride 1)", 512, 14, 14, 512, 3, 1, 1),
]

# more strided layers for --backward-data: ResNet-18's, MobileNet-style
# stems, a 5 x 5
BWD_MORE = [
    ("ResNet-18 layer2.0.conv1", 64, 56, 56, 128, 3, 1, 2),
    ("ResNet-18 layer4.0.conv1", 256, 14, 14, 512, 3, 1, 2),
    ("stem 3x3 stride 2 (32 -> 64)", 32, 112, 112, 64, 3, 1, 2),
    ("5x5 stride 2 (96 -> 192)", 96, 28, 28, 192, 5, 2, 2),
]

ONE_BY_ONE = [
    ("ResNet-50 / WRN layer1.0.downsample", 64, 56, 56, 256, 1, 0, 1),
    ("ResNet-50 layer1.0.conv1", 64, 56, 56, 64, 1, 0, 1),
    ("ResNet-50 / WRN layer2.0.downsample (stride 2)", 256, 56, 56, 512, 1, 0, 2),
    ("ResNet-50 / WRN layer3.0.downsample (stride 2)", 512, 28, 28, 1024, 1, 0, 2),
]


def run_shape(dev, buf, batch, runs, shape, variants, backward_data=False):
    name, C, H, W, M, k, pad, stride = shape
    g = conv_ops.ConvGeometry(batch, C, H, W, M, k, k, pad, pad, stride, stride)
    x, w = buf(batch * C * H * W), buf(M * C * k * k)
    ny = batch * M * g.out_h * g.out_w
    nout = batch * C * H * W if backward_data else ny
    dy = buf(ny) if backward_data else None
    times, outs, names = [], [], []
    for settings, attrs in variants:
        y = buf(nout)
        old = {a: getattr(conv_ops, a) for a in attrs}
        for a, v in attrs.items():
            setattr(conv_ops, a, v)
        try:
            with config.override(**settings):
                if backward_data:
                    launches = conv_ops.backward_data(dev, g, dy, w, y, None, algo="igemm")
                else:
                    launches = conv_ops.forward(dev, g, x, w, y, None, algo="igemm")
        finally:
            for a, v in old.items():
                setattr(conv_ops, a, v)
        times.append(time_launches(dev, launches, 2, runs))
        outs.append(np.empty(nout, np.float32))
        dev.download(outs[-1], y)
        names.append("+".join(dict.fromkeys(ln.name for ln in launches)))
    flop = 2.0 * ny * C * k * k
    diff = float(np.max(np.abs(outs[0] - outs[1])) / max(np.max(np.abs(outs[0])), 1e-30))
    cells = " | ".join(f"{t:.3f} ({flop / (t / 1e3) / 1e12:.0f})" for t in times)
    print(f"| {name} | {' / '.join(names)} | {cells} | {times[0] / times[1]:.2f} | "
          f"{diff:.1e} |", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--one-by-one", action="store_true",
                    help="1 x 1 layers: implicit GEMM against the folded GEMM (images or "
                         "gathered rows)")
    ap.add_argument("--backward-data", action="store_true",
                    help="strided k x k backward-data: per-phase implicit GEMM against the "
                         "columns' gradient GEMM + col2im")
    a = ap.parse_args()
    dev = get_device()
    if not (dev.is_gpu and getattr(dev, "is_nvidia", False)):
        sys.exit(f"bench_gathered_conv: the async TF32 loop needs an NVIDIA GPU ({dev.name})")
    gemm_ops.set_allow_tf32(True)
    buf = random_buffers(dev)
    print(f"device: {dev.name}, batch {a.batch}, TF32")
    print("| layer | launches | first ms (TFLOP/s) | second ms (TFLOP/s) | first/second | "
          "max diff |")
    print("|---|---|---|---|---|---|")
    if a.backward_data:
        variants = [(dict(GEMM_GATHERED_CONV=False), {}),
                    (dict(GEMM_GATHERED_CONV=True), {"GATHERED_BWD_MIN_K": 1})]
        shapes = [sh for sh in SHAPES if sh[-1] > 1] + BWD_MORE
    elif a.one_by_one:
        variants = [(dict(GEMM_1X1=False), {}),
                    ({}, {"GEMM_1X1_MIN_K": 1, "GEMM_1X1_MIN_K_WIDE": 1,
                          "GEMM_1X1_MIN_K_64_ROWS": 1, "ROWS_1X1_MIN_K": 1})]
        shapes = ONE_BY_ONE
    else:
        # the rule's output-channel floor lifted, so that every shape is timed both ways
        variants = [(dict(GEMM_GATHERED_CONV=False), {}),
                    (dict(GEMM_GATHERED_CONV=True), {"GATHERED_MIN_M": 1})]
        shapes = SHAPES
    for shape in shapes:
        run_shape(dev, buf, a.batch, a.runs, shape, variants, a.backward_data)
    gemm_ops.set_allow_tf32(False)


if __name__ == "__main__":
    main()
