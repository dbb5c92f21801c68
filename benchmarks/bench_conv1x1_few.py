"""Batch-1 1x1 convolutions of the converted zoo: the few-outputs kernel
(ops/conv1x1_few.py) against the implicit GEMM's launches (tiles, K split),
and cuDNN on the same shape where PyTorch sees a CUDA device. Forward only,
FP32, interleaved rounds; each time is the median of --rounds means of
--runs passes. Prints the kernel's rule (`applies`) per shape, so that a
loss can be traced to the rule or to the kernel; --variants times the
kernel with other walks of K (MAX_STEPS, loads in flight).

    python3 benchmarks/bench_conv1x1_few.py [--batch 1] [--runs 50] [--rounds 5]
        [--variants default,xb1,steps32,steps16+xb4]
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from caffe_ocl import config  # noqa: E402
from caffe_ocl.device import get_device  # noqa: E402
from caffe_ocl.ops import conv as conv_ops  # noqa: E402
from caffe_ocl.ops import conv1x1_few  # noqa: E402
from common import cudnn_conv_ms, random_buffers, time_launches  # noqa: E402

SHAPES = [  # (net, in channels, plane side, out channels)
    ("resnet50", 256, 14, 1024), ("resnet50", 1024, 14, 256), ("resnet50", 512, 28, 128),
    ("resnet50", 512, 7, 2048), ("resnet50", 2048, 7, 512),
    ("shufflenet_v2", 232, 7, 232), ("shufflenet_v2", 116, 14, 116),
    ("mobilenet_v2", 160, 7, 960), ("mobilenet_v2", 960, 7, 160), ("mobilenet_v2", 384, 14, 64),
    ("mobilenet_v3_small", 96, 7, 576), ("mobilenet_v3_small", 48, 14, 144),
    ("squeezenet1_1", 512, 13, 64), ("squeezenet1_1", 64, 13, 256),
    ("densenet121", 512, 7, 128), ("densenet121", 1024, 14, 128),
    ("googlenet", 832, 7, 384), ("regnet_y_400mf", 440, 7, 440),
]


def _variant(spec, build):
    """build() with conv1x1_few's MAX_STEPS / LOADS_IN_FLIGHT as ``spec``
    says (see --variants)."""
    saved = conv1x1_few.MAX_STEPS, conv1x1_few.LOADS_IN_FLIGHT
    try:
        for part in spec.split("+"):
            if part.startswith("steps"):
                conv1x1_few.MAX_STEPS = int(part[5:])
            elif part.startswith("xb"):
                conv1x1_few.LOADS_IN_FLIGHT = int(part[2:])
            elif part != "default":
                raise SystemExit(f"unknown variant {part!r}")
        return build()
    finally:
        conv1x1_few.MAX_STEPS, conv1x1_few.LOADS_IN_FLIGHT = saved


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--variants", default="default",
                    help="comma-separated: default, or steps<N> (MAX_STEPS) and/or "
                         "xb<N> (loads in flight) joined by '+', e.g. steps32+xb8")
    a = ap.parse_args()
    dev = get_device()
    buf = random_buffers(dev)
    print(f"device: {dev.name}; batch {a.batch}; FP32")
    variants = a.variants.split(",")
    print("| net | layer | rule | tiles us | " + " | ".join(f"few {v} us" for v in variants)
          + " | cuDNN us |")
    print("|---" * (5 + len(variants)) + "|")
    ratios = {v: [] for v in variants}
    with config.override(TF32=False):
        for net, c, h, co in SHAPES:
            g = conv_ops.ConvGeometry(a.batch, c, h, h, co, 1, 1)
            x, w, y = buf(a.batch * c * h * h), buf(co * c), buf(a.batch * co * h * h)
            with config.override(CONV_1X1_FEW=False):
                tiles = conv_ops.forward(dev, g, x, w, y, None)
            launches = {"tiles": tiles}
            for v in variants:
                launches[v] = [_variant(v, lambda: conv1x1_few.forward(dev, g, x, w, y))]
            times = {k: [] for k in launches}
            for _ in range(a.rounds):
                for k, ls in launches.items():
                    times[k].append(time_launches(dev, ls, 2, a.runs))
            med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
            for v in variants:
                ratios[v].append(med["tiles"] / med[v])
            ref = cudnn_conv_ms(a.batch, c, h, co, 1, 1, 1, a.runs) if dev.is_gpu else None
            print(f"| {net} | {c}->{co} @{h} | {conv1x1_few.applies(dev, g)} | "
                  f"{med['tiles']:.1f} ({'+'.join(ln.name for ln in tiles)}) | "
                  + " | ".join(f"{med[v]:.1f} ({med['tiles'] / med[v]:.2f})" for v in variants)
                  + f" | {'-' if ref is None else f'{1e3 * ref:.1f}'} |", flush=True)
    for v in variants:
        print(f"geomean tiles / few {v}: {statistics.geometric_mean(ratios[v]):.2f}")


if __name__ == "__main__":
    main()
