"""Two GPU convolution-forward choices measured layer by layer at batch
1, 16 and 64 (issue #27), ms per pass, back-to-back passes (best of
--rounds means of --runs):

- grouped: ResNeXt-50's and RegNet-Y-400MF's grouped 3 x 3 layers by the
  device's GEMM path (setting GROUPED_DIRECT off: the implicit GEMM on
  GPUs, im2col + GEMM on CPU drivers) and by the direct grouped
  kernel (ops/grouped.py), also where its channel rule leaves a layer to the
  implicit GEMM (32 per group: ``direct*``, the rule widened for the
  measurement), and cuDNN's F.conv2d on the same shape when PyTorch sees a
  CUDA device;
- row tiles: convolutions whose output channels leave a 128-row tile a
  quarter empty (AlexNet's and GoogLeNet's 192-channel layers) with 128-row
  tiles and with 64-row tiles (ops.conv.ROW_TILE_WASTE);
- residual: ResNet-50's convolutions that end a block (1 x 1, to 256..2048
  channels) followed by the shortcut sum and ReLU as two launches, and as
  one with the sum in the convolution's epilogue (plan/residual.py).

    python3 benchmarks/bench_conv_epilogues.py [--batches 1,16,64] [--only grouped]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from caffe_ocl import config  # noqa: E402
from caffe_ocl.device import get_device  # noqa: E402
from caffe_ocl.ops import conv as conv_ops  # noqa: E402
from caffe_ocl.ops import grouped as grouped_ops  # noqa: E402
from caffe_ocl.ops import pointwise  # noqa: E402
from common import cudnn_conv_ms, random_buffers, time_launches  # noqa: E402

# (name, C, H, CO, k, stride, groups), pad k // 2
GROUPED = [
    ("resnext l1 128/32 56", 128, 56, 128, 3, 1, 32),
    ("resnext l2 256/32 28", 256, 28, 256, 3, 1, 32),
    ("resnext l2 s2 256/32 56", 256, 56, 256, 3, 2, 32),
    ("resnext l3 512/32 14", 512, 14, 512, 3, 1, 32),
    ("resnext l4 1024/32 7", 1024, 7, 1024, 3, 1, 32),
    ("regnet 48/6 56", 48, 56, 48, 3, 1, 6),
    ("regnet 104/13 28", 104, 28, 104, 3, 1, 13),
    ("regnet 208/26 14", 208, 14, 208, 3, 1, 26),
    ("regnet 440/55 7", 440, 7, 440, 3, 1, 55),
]
# (name, C, H, CO): ResNet-50's block ends, 1 x 1 stride 1
RESIDUAL = [
    ("resnet50 l1 64->256 56", 64, 56, 256),
    ("resnet50 l2 128->512 28", 128, 28, 512),
    ("resnet50 l3 256->1024 14", 256, 14, 1024),
    ("resnet50 l4 512->2048 7", 512, 7, 2048),
]
# (name, C, H, CO, k, stride)
ROWS = [
    ("alexnet conv2 64->192 5x5 27", 64, 27, 192, 5, 1),
    ("googlenet conv2 64->192 3x3 56", 64, 56, 192, 3, 1),
    ("googlenet 3b 128->192 3x3 28", 128, 28, 192, 3, 1),
    ("inception 832->320 1x1 7", 832, 7, 320, 1, 1),
    ("googlenet 4e 160->320 3x3 14", 160, 14, 320, 3, 1),
]
RELU = ("relu", 0.0)


def best(dev, launches, args):
    return min(time_launches(dev, launches, warmup=3, runs=args.runs)
               for _ in range(args.rounds))


def grouped_rows(dev, buf, n, args):
    for name, c, h, co, k, stride, groups in GROUPED:
        g = conv_ops.ConvGeometry(n, c, h, h, co, k, k, k // 2, k // 2, stride, stride,
                                  1, 1, groups)
        x, w, b = buf(n * c * h * h), buf(co * c // groups * k * k), buf(co)
        y = buf(n * co * g.out_h * g.out_w)
        with config.override(GROUPED_DIRECT=False):
            cf = conv_ops.workspace_floats(dev, g)
            col = dev.alloc(4 * cf) if cf else None
            gemm = best(dev, conv_ops.forward(dev, g, x, w, y, col, bias=b, act=RELU), args)
        widened = not grouped_ops.applies(dev, g)
        saved = grouped_ops.MAX_GROUP_CHANNELS
        grouped_ops.MAX_GROUP_CHANNELS = max(saved, c // groups, co // groups)
        try:
            direct = best(dev, [grouped_ops.forward(dev, g, x, w, y, b, RELU)], args)
        finally:
            grouped_ops.MAX_GROUP_CHANNELS = saved
        ref = cudnn_conv_ms(n, c, h, co, k, stride, groups, args.runs, relu=True)
        print(f"| {name} | {n} | {gemm:.4f} | {direct:.4f}{'*' if widened else ''} | "
              f"{gemm / direct:.2f} | " + (f"{ref:.4f} |" if ref is not None else "- |"))


def row_tile_rows(dev, buf, n, args):
    saved = conv_ops.ROW_TILE_WASTE
    for name, c, h, co, k, stride in ROWS:
        g = conv_ops.ConvGeometry(n, c, h, h, co, k, k, k // 2, k // 2, stride, stride)
        x, w, b = buf(n * c * h * h), buf(co * c * k * k), buf(co)
        y = buf(n * co * g.out_h * g.out_w)
        cells = []
        try:
            for waste in (0.0, 1.0):
                conv_ops.ROW_TILE_WASTE = waste
                ln = conv_ops.forward(dev, g, x, w, y, None, bias=b, act=RELU, algo="igemm")
                cells.append((best(dev, ln, args), conv_ops.forward_tiles(dev, g)["TM"]))
        finally:
            conv_ops.ROW_TILE_WASTE = saved
        (t128, m1), (t64, m2) = cells
        print(f"| {name} | {n} | {t128:.4f} (TM {m1}) | {t64:.4f} (TM {m2}) | {t128 / t64:.2f} |")


def residual_rows(dev, buf, n, args):
    for name, c, h, co in RESIDUAL:
        g = conv_ops.ConvGeometry(n, c, h, h, co, 1, 1)
        size = n * co * h * h
        x, w, b = buf(n * c * h * h), buf(co * c), buf(co)
        r, y, z = buf(size), buf(size), buf(size)
        if not conv_ops.writes_residual(dev, g):
            print(f"| {name} | {n} | - | - | (no shortcut epilogue here) |")
            continue
        two = conv_ops.forward(dev, g, x, w, y, None, bias=b)
        two = two + [pointwise.sum2(dev, size, 1.0, y, 1.0, r, z, RELU)]
        one = conv_ops.forward(dev, g, x, w, z, None, bias=b, act=RELU, residual=r)
        t2, t1 = best(dev, two, args), best(dev, one, args)
        print(f"| {name} | {n} | {t2:.4f} | {t1:.4f} | {t2 / t1:.2f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--only", choices=("grouped", "rows", "residual"))
    args = ap.parse_args()
    dev = get_device()
    buf = random_buffers(dev)
    batches = [int(b) for b in args.batches.split(",")]
    print(f"# {dev.name}, {dev.compute_units} compute units; ms per pass, best of "
          f"{args.rounds} x {args.runs} back-to-back passes")
    if args.only in (None, "grouped"):
        print("\n| grouped layer | batch | implicit GEMM ms | direct ms | gemm/direct "
              "| cuDNN ms |\n|---|---|---|---|---|---|")
        for n in batches:
            grouped_rows(dev, buf, n, args)
    if args.only in (None, "rows"):
        print("\n| layer | batch | 128-row tiles ms | 64-row tiles ms | 128/64 |\n|---|---|---|---|---|")
        for n in batches:
            row_tile_rows(dev, buf, n, args)
    if args.only in (None, "residual"):
        print("\n| block end | batch | conv + sum ms | fused ms | two/one |\n|---|---|---|---|---|")
        for n in batches:
            residual_rows(dev, buf, n, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
