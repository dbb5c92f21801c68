"""First-layer convolutions on a CPU driver (few input channels, issue #27
item 4): the direct kernel (kernels/conv_direct.cl) against the GEMM path
it replaces (CAFFE_OCL_CPU_DIRECT_CONV=0: zero-padded copy + gemm_cpu.cl),
ms per forward, the best of --rounds interleaved rounds of --runs each.

    python3 benchmarks/bench_conv_direct.py [--rounds 15] [--runs 10]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from caffe_ocl import config  # noqa: E402
from caffe_ocl.device import get_device  # noqa: E402
from caffe_ocl.ops import conv as conv_ops  # noqa: E402
from common import random_buffers, time_launches  # noqa: E402

G = conv_ops.ConvGeometry
# (name, geometry, activation): the zoo nets' first layers
LAYERS = [
    ("mobilenet_v3 3->16 s2", G(1, 3, 224, 224, 16, 3, 3, 1, 1, 2, 2),
     ("hardswish", 1.0 / 6, 0.5)),
    ("shufflenet 3->24 s2", G(1, 3, 224, 224, 24, 3, 3, 1, 1, 2, 2), ("relu", 0.0)),
    ("efficientnet 3->32 s2 swish", G(1, 3, 224, 224, 32, 3, 3, 1, 1, 2, 2), ("swish", 1.0)),
    ("mobilenet_v2 3->32 s2 relu6", G(1, 3, 224, 224, 32, 3, 3, 1, 1, 2, 2), ("clip", 0.0, 6.0)),
    ("vgg 3->64 s1", G(1, 3, 224, 224, 64, 3, 3, 1, 1), ("relu", 0.0)),
    ("mobilenet_v2 b16", G(16, 3, 224, 224, 32, 3, 3, 1, 1, 2, 2), ("clip", 0.0, 6.0)),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    dev = get_device()
    buf = random_buffers(dev)
    print(f"# {dev.name}; ms per forward, best of {args.rounds} interleaved rounds")
    print("| layer | direct ms | GEMM ms | GEMM / direct |")
    print("|---|---|---|---|")
    for name, g, act in LAYERS:
        x, w, b = buf(g.num * g.channels * g.height * g.width), buf(g.out_channels * g.col_rows), \
            buf(g.out_channels)
        y = buf(g.num * g.out_channels * g.out_spatial)
        col = buf(g.num * g.channels * (g.height + 2 * g.ph) * (g.width + 2 * g.pw))
        launches = {}
        for direct in (True, False):
            with config.override(CPU_DIRECT_CONV=direct):
                launches[direct] = conv_ops.forward(dev, g, x, w, y, col, bias=b, act=act)
        best = {True: float("inf"), False: float("inf")}
        for _ in range(args.rounds):
            for direct in (True, False):
                best[direct] = min(best[direct],
                                   time_launches(dev, launches[direct], runs=args.runs))
        print(f"| {name} | {best[True]:.3f} | {best[False]:.3f} | {best[False] / best[True]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
