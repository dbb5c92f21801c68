"""Batch-1 convolution forwards of small planes (the layers of the mobile
zoo nets and ResNet-18 at batch 1, issue #27): ms per pass, back to back
(enqueue and kernels overlapped, as in a net's forward), under several
kernel settings (ops/conv.py forward_tiles: CONV_SMALL_TILES, 64 x 64
tiles of 4 x 4 results per work-item; forward_splitk: the K split and
CONV_SPLITK_MIN_KTILES), and PyTorch + cuDNN's F.conv2d on the same shape
when a CUDA device is there (timed by CUDA events over back-to-back calls:
PyTorch's own per-call cost included). The best of --rounds means of
--runs passes each.

    python3 benchmarks/bench_conv_small.py [--runs 200] [--rounds 3]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from caffe_ocl import config  # noqa: E402
from caffe_ocl.device import get_device  # noqa: E402
from caffe_ocl.ops import conv as conv_ops  # noqa: E402
from common import cudnn_conv_ms, random_buffers, time_launches  # noqa: E402

# (name, C, H, CO, k, stride, groups) at batch 1, pad k // 2
SHAPES = [
    ("resnet18 3x3 64 56x56", 64, 56, 64, 3, 1, 1),
    ("resnet18 3x3 64->128 s2", 64, 56, 128, 3, 2, 1),
    ("resnet18 1x1 64->128 s2", 64, 56, 128, 1, 2, 1),
    ("resnet18 3x3 128 28x28", 128, 28, 128, 3, 1, 1),
    ("resnet18 3x3 128->256 s2", 128, 28, 256, 3, 2, 1),
    ("resnet18 1x1 128->256 s2", 128, 28, 256, 1, 2, 1),
    ("resnet18 3x3 256 14x14", 256, 14, 256, 3, 1, 1),
    ("resnet18 3x3 256->512 s2", 256, 14, 512, 3, 2, 1),
    ("resnet18 1x1 256->512 s2", 256, 14, 512, 1, 2, 1),
    ("resnet18 3x3 512 7x7", 512, 7, 512, 3, 1, 1),
    ("effnet 1x1 192->1152 7x7", 192, 7, 1152, 1, 1, 1),
    ("effnet 1x1 1152->320 7x7", 1152, 7, 320, 1, 1, 1),
    ("effnet 1x1 112->672 14x14", 112, 14, 672, 1, 1, 1),
    ("effnet 1x1 672->112 14x14", 672, 14, 112, 1, 1, 1),
    ("mbv2 1x1 160->960 7x7", 160, 7, 960, 1, 1, 1),
    ("mbv2 1x1 960->160 7x7", 960, 7, 160, 1, 1, 1),
    ("mbv2 1x1 320->1280 7x7", 320, 7, 1280, 1, 1, 1),
    ("mbv2 1x1 96->576 14x14", 96, 14, 576, 1, 1, 1),
    ("shufflenet 1x1 232 7x7", 232, 7, 232, 1, 1, 1),
    ("shufflenet 1x1 116 14x14", 116, 14, 116, 1, 1, 1),
    ("regnet 1x1 440 7x7", 440, 7, 440, 1, 1, 1),
    ("regnet 3x3 440/55 7x7", 440, 7, 440, 3, 1, 55),
]

CONFIGS = [  # name, settings
    ("usual tiles", dict(CONV_SMALL_TILES=False)),
    ("small tiles", dict(CONV_SMALL_TILES=True)),
    ("small tiles, no split", dict(CONV_SMALL_TILES=True, CONV_SPLITK=False)),
    ("small tiles, min 2", dict(CONV_SMALL_TILES=True, CONV_SPLITK_MIN_KTILES=2)),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default="", help="layers whose name contains this")
    ap.add_argument("--configs", default="", help="comma-separated indices into CONFIGS")
    args = ap.parse_args()
    dev = get_device()
    buf = random_buffers(dev)
    print(f"# {dev.name}, {dev.compute_units} compute units; ms per pass, best of "
          f"{args.rounds} x {args.runs} back-to-back passes")
    configs = ([CONFIGS[int(i)] for i in args.configs.split(",")] if args.configs
               else CONFIGS)
    print("| layer | " + " | ".join(f"{n} ms (launches, slices)" for n, _ in configs)
          + " | cuDNN ms |")
    print("|---|" + "---|" * (len(configs) + 1))
    for name, c, h, co, k, stride, groups in SHAPES:
        if args.only not in name:
            continue
        g = conv_ops.ConvGeometry(1, c, h, h, co, k, k, k // 2, k // 2, stride, stride,
                                  1, 1, groups)
        x, w, b = buf(c * h * h), buf(co * c // groups * k * k), buf(co)
        y = buf(co * g.out_h * g.out_w)
        cells = []
        for _, settings in configs:
            with config.override(**settings):
                nsplit = conv_ops.forward_splitk(dev, g)[0]
                launches = conv_ops.forward(dev, g, x, w, y, None, bias=b, act=("relu", 0.0),
                                            algo="igemm")
                ms = min(time_launches(dev, launches, warmup=5, runs=args.runs)
                         for _ in range(args.rounds))
            cells.append(f"{ms:.4f} ({len(launches)}, {nsplit})")
        ref = cudnn_conv_ms(1, c, h, co, k, stride, groups, args.runs)
        print(f"| {name} | " + " | ".join(cells) + f" | {ref:.4f} |" if ref is not None
              else f"| {name} | " + " | ".join(cells) + " | - |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
