"""GFLOP/s of the GEMM and implicit-GEMM convolution kernels on the chosen
device, FP32 and (NVIDIA) TF32, on a few big-net shapes.

    python benchmarks/bench_conv_gemm.py [--runs 20] [--batch 64]

On a CPU device (PoCL) the big GEMM is 1024^3 / 2048^3 instead of 4096^3,
and the convolutions pass the column workspace their algorithm needs;
there `--runs 3 --batch 16` keeps it under a minute or two:

    python benchmarks/bench_conv_gemm.py --runs 3 --batch 16
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

CONVS = [  # name, (n, c, h, w, co, kh, kw, ph, pw, sh, sw, dh, dw, groups)
    ("resnet 3x3 64 56x56", (64, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1)),
    ("resnet 1x1 256->64 56x56", (64, 256, 56, 56, 64, 1, 1, 0, 0, 1, 1, 1, 1, 1)),
    ("resnet 3x3 512 7x7", (64, 512, 7, 7, 512, 3, 3, 1, 1, 1, 1, 1, 1, 1)),
    ("vgg 3x3 256 56x56", (64, 256, 56, 56, 256, 3, 3, 1, 1, 1, 1, 1, 1, 1)),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--batch", type=int, default=64, help="images per convolution")
    a = ap.parse_args()
    dev = get_device()
    buf = random_buffers(dev)
    print(f"device: {dev.name}")
    scale, unit = (1e9, "GFLOP/s") if dev.is_cpu else (1e12, "TFLOP/s")
    print(f"| op | shape | FP32 ms | FP32 {unit} | TF32 ms | TF32 {unit} |")
    print("|---|---|---|---|---|---|")
    tf32s = [False, True] if dev.is_nvidia else [False]
    gemms = [(4096, 4096, 4096), (64, 4096, 9216)]
    if dev.is_cpu:
        gemms = [(1024, 1024, 1024), (2048, 2048, 2048), (64, 4096, 9216)]
    for M, N, K in gemms:
        A, B, C = buf(M * K), buf(K * N), buf(M * N)
        row = []
        for tf in tf32s:
            gemm_ops.set_allow_tf32(tf)
            t = time_launches(dev, [gemm_ops.gemm(dev, M, N, K, A, B, C)], 1, a.runs) / 1e3
            row += [f"{t * 1e3:.3f}", f"{2 * M * N * K / t / scale:.1f}"]
        print(f"| gemm | {M}x{N}x{K} | " + " | ".join(row) + " |", flush=True)
    for name, p in CONVS:
        g = conv_ops.ConvGeometry(a.batch, *p[1:])
        flops = 2 * g.num * g.out_channels * g.out_spatial * g.col_rows // g.groups
        x, w = buf(g.num * g.channels * g.height * g.width), buf(g.out_channels * g.col_rows // g.groups)
        y = buf(g.num * g.out_channels * g.out_spatial)
        dw, dx = buf(g.out_channels * g.col_rows // g.groups), buf(g.num * g.channels * g.height * g.width)
        ws = conv_ops.workspace_floats(dev, g)
        col = dev.alloc(4 * ws) if ws else None
        for what in ("fwd", "bwd_data", "bwd_weight"):
            row = []
            for tf in tf32s:
                gemm_ops.set_allow_tf32(tf)
                ls = conv_pass(dev, g, what, x, w, y, dx, dw, col)
                t = time_launches(dev, ls, 1, a.runs) / 1e3
                row += [f"{t * 1e3:.3f}", f"{flops / t / scale:.1f}"]
            print(f"| conv {what} | {name} | " + " | ".join(row) + " |", flush=True)
    gemm_ops.set_allow_tf32(False)


if __name__ == "__main__":
    main()
