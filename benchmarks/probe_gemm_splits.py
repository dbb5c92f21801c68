"""The GPU GEMM's K split on long fully-connected products, factor by
factor: ms of ``ops.gemm_splitk.gemm_launches`` (usual tiles, FP32) with
its own rule's split ("rule") and with the split forced to 1, 2, 3, 4 and 6
chunks, against cuBLAS (torch.matmul) on the same shape when PyTorch sees
a CUDA device. Best of 3 means of --runs passes.

    python3 benchmarks/probe_gemm_splits.py
    python3 benchmarks/probe_gemm_splits.py --shapes 3152x384x1536,784x768x3072

A shape is MxNxK (C = A B^T: M rows, N outputs, K inputs).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_gemm_tiles import torch_ms  # noqa: E402
from caffe_ocl.device import get_device  # noqa: E402
from caffe_ocl.ops import gemm as gemm_ops  # noqa: E402
from caffe_ocl.ops import gemm_splitk  # noqa: E402
from common import random_buffers, time_launches  # noqa: E402

# DeiT III-S at batch 16 (3152 tokens: fc2, fc1, qkv, proj), ViT-B b16's
# fc2, Swin-T b16's third-stage fc2, BERT-base (1024 tokens) and Swin-T
# b16's last stage fc2, DeiT-S b64's fc2
SHAPES = ("3152x384x1536,3152x1536x384,3152x1152x384,3152x384x384,3152x768x3072,"
          "3136x384x1536,1024x768x3072,784x768x3072,12608x384x1536")
FACTORS = (1, 2, 3, 4, 6)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    dev = get_device()
    gemm_ops.set_allow_tf32(False)
    buf = random_buffers(dev)
    print(f"# {dev.name}; FP32; ms per product; rule = gemm_launches' own split")
    print("| M x N x K | tiles | rule | " + " | ".join(f"x{f}" for f in FACTORS)
          + " | cuBLAS | best / rule |\n|---|---|---|" + "---|" * (len(FACTORS) + 2))
    for spec in args.shapes.split(","):
        m, n, k = (int(v) for v in spec.split("x"))
        a, b, c = buf(m * k), buf(n * k), buf(m * n)
        t = gemm_ops.gpu_tiles(dev, m)
        tiles = -(-m // t["TM"]) * -(-n // t["TN"])
        times = {}
        for f in (None,) + FACTORS:
            if f is not None and k % f:
                continue
            ln = gemm_splitk.gemm_launches(dev, m, n, k, a, b, c, trans_b=True, nsplit=f)
            times[f] = min(time_launches(dev, ln, warmup=3, runs=args.runs) for _ in range(3))
        ref = torch_ms(m, n, k, 1, True, args.runs)
        cells = [f"{times[f]:.4f}" if f in times else "-" for f in FACTORS]
        print(f"| {m}x{n}x{k} | {tiles} | {times[None]:.4f} | " + " | ".join(cells)
              + " | " + (f"{ref:.4f}" if ref is not None else "-")
              + f" | {min(times.values()) / times[None]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
