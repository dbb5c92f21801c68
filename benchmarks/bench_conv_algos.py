"""Each pass of a convolution (forward, backward-data, backward-weight) by
implicit GEMM and, for 3x3, by Winograd, in FP32 and (NVIDIA) TF32, on
ResNet-50 / VGG-16 layer shapes: ms and TFLOP/s (GFLOP/s on CPUs; the
direct-convolution count, so Winograd's figure is an effective rate). Guides the GPU kernel
work of issue 7; the numbers in BENCHMARKS.md come from it.

    python3 benchmarks/bench_conv_algos.py [--runs 10] [--batch 64]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from caffe_ocl.device import get_device  # noqa: E402
from caffe_ocl.ops import conv as conv_ops  # noqa: E402
from caffe_ocl.ops import gemm as gemm_ops  # noqa: E402
from common import conv_pass, random_buffers, time_launches  # noqa: E402

SHAPES = [  # name, (c, h, w, co, k, pad)
    ("r50 1x1 64->256 56", (64, 56, 56, 256, 1, 0)),
    ("r50 1x1 256->64 56", (256, 56, 56, 64, 1, 0)),
    ("r50 3x3 64 56", (64, 56, 56, 64, 3, 1)),
    ("r50 3x3 128 28", (128, 28, 28, 128, 3, 1)),
    ("r50 3x3 256 14", (256, 14, 14, 256, 3, 1)),
    ("r50 1x1 1024->256 14", (1024, 14, 14, 256, 1, 0)),
    ("vgg 3x3 64 224", (64, 224, 224, 64, 3, 1)),
    ("vgg 3x3 256 56", (256, 56, 56, 256, 3, 1)),
    ("vgg 3x3 512 28", (512, 28, 28, 512, 3, 1)),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--batch", type=int, default=64)
    a = ap.parse_args()
    dev = get_device()
    buf = random_buffers(dev)
    tf32s = [False, True] if dev.is_nvidia else [False]
    scale, unit = (1e9, "GFLOP/s") if dev.is_cpu else (1e12, "TFLOP/s")
    print(f"device: {dev.name}")
    print("| shape | pass | algo | " + " | ".join(
        f"{'TF32' if t else 'FP32'} ms | {'TF32' if t else 'FP32'} {unit}" for t in tf32s) + " |")
    print("|---|---|---|" + "---|---|" * len(tf32s))
    for name, (c, h, w, co, k, pad) in SHAPES:
        g = conv_ops.ConvGeometry(a.batch, c, h, w, co, k, k, pad, pad, 1, 1, 1, 1, 1)
        flops = 2 * g.num * g.out_channels * g.out_spatial * g.col_rows
        x, wt = buf(g.num * c * h * w), buf(co * g.col_rows)
        y, dw = buf(g.num * co * g.out_spatial), buf(co * g.col_rows)
        dx = buf(g.num * c * h * w)
        algos = ["im2col" if dev.is_cpu else "igemm"] + (["winograd"] if k == 3 else [])
        for algo in algos:
            col = conv_ops.workspace_floats(dev, g, algo)
            col = dev.alloc(4 * col) if col else None
            for what in ("fwd", "bwd_data", "bwd_weight"):
                row = []
                for tf in tf32s:
                    gemm_ops.set_allow_tf32(tf)
                    ls = conv_pass(dev, g, what, x, wt, y, dx, dw, col, algo)
                    t = time_launches(dev, ls, 1, a.runs) / 1e3
                    row += [f"{t * 1e3:.3f}", f"{flops / t / scale:.1f}"]
                print(f"| {name} | {what} | {algo} | " + " | ".join(row) + " |", flush=True)
    gemm_ops.set_allow_tf32(False)


if __name__ == "__main__":
    main()
