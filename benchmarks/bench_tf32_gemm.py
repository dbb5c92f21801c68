"""TF32 GEMM main loops on an NVIDIA GPU, same run: tile_mainloop.h
(register-staged tiles) against tile_mainloop_async.h (cp.async pipeline,
the default), on a big square GEMM in every transpose case and two
convolution-like shapes; milliseconds and TFLOP/s, ratio old / async.

    python benchmarks/bench_tf32_gemm.py [--runs 10]
    python benchmarks/bench_tf32_gemm.py --conv-shapes     # short-K products
    python benchmarks/bench_tf32_gemm.py --fc-layouts      # batch-64 classifiers

--conv-shapes: the products of converted nets' 1x1 and Winograd layers
at batch 64 (K 64-512, N up to 200704: Wide-ResNet-50's 1x1 at 56 x 56),
the async loop as planned against variants of it: 2 stages instead of
3 (more work-groups per compute unit), 64-row tiles with 3 or 4
stages, 8 warps of 64 x 32 results
instead of 4 of 64 x 64 (half the registers per work-item), the staged
tile stored one float per store instead of 16 bytes (GEMM_VSTORE4 off),
and tile_mainloop.h. (Stores straight from the registers, not staged:
1.9x slower, twentieth session.)
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from caffe_ocl import config  # noqa: E402
from caffe_ocl.device import get_device  # noqa: E402
from caffe_ocl.ops import gemm as gemm_ops  # noqa: E402
from common import random_buffers, time_launches  # noqa: E402

SHAPES = [(4096, 4096, 4096, ta, tb) for ta in (False, True) for tb in (False, True)] + [
    (256, 12544, 256, False, False),    # ResNet-50 1x1, 64 images of 14x14 folded
    (512, 3136, 512, False, False),     # a Winograd tile position of VGG's 512-channel layers
]


CONV_SHAPES = [  # M x N x K (no transposes)
    (256, 200704, 128),   # Wide-ResNet-50 layer1 conv3 1x1, 64 images of 56x56
    (128, 200704, 256),   # Wide-ResNet-50 layer1 conv1 1x1
    (256, 12544, 256),    # ResNet-50 1x1, 64 images of 14x14 folded
    (192, 6272, 64),      # one of the 36 GEMMs of AlexNet's 5x5 by Winograd (half the batch)
    (1024, 3136, 512),    # Wide-ResNet-50 layer4 1x1
]


# fully-connected products at batch 64 (M = batch, N outputs, K inputs):
# the weight as Caffe stores it (N x K, op(B) = W^T: rows of B read k-fast,
# 64 bytes of each row per 16-k stage) against the same product with the
# weight transposed (K x N: 512-byte runs of each row per stage)
FC_SHAPES = [(64, 4096, 9216), (64, 4096, 4096), (64, 1000, 4096), (64, 4096, 25088)]

_gpu_tiles = gemm_ops.gpu_tiles


def _rows64(dev, M, K=None):
    """gpu_tiles with 64-row tiles whatever M (a variant: smaller stages, so
    4 of them fit 48 KiB, and half the accumulators per work-item)."""
    return dict(_gpu_tiles(dev, M, K), TM=64)


def conv_shapes(dev, buf, runs):
    """--conv-shapes: the async loop against its variants (module docstring)."""
    variants = [
        ("async 3 stages", dict(), {}),
        ("async 2 stages", dict(), {"ASYNC_MAX_STAGES": 2}),
        ("async, 8 warps of 64 x 32", dict(), {"ASYNC_WN": 32}),
        ("async, 64-row tiles, 3 stages", dict(), {"gpu_tiles": _rows64}),
        ("async, 64-row tiles, 4 stages", dict(), {"gpu_tiles": _rows64, "ASYNC_MAX_STAGES": 4}),
        ("async, one float per store", dict(GEMM_VSTORE4=False), {}),
        ("register-staged", dict(TF32_ASYNC=False), {}),
    ]
    print("| M x N x K | " + " | ".join(f"{v[0]} ms (TFLOP/s)" for v in variants) + " |")
    print("|---|" + "---|" * len(variants))
    for M, N, K in CONV_SHAPES:
        A, B, C = buf(M * K), buf(K * N), buf(M * N)
        row = []
        for _, settings, attrs in variants:
            old = {k: getattr(gemm_ops, k) for k in attrs}
            for k, v in attrs.items():
                setattr(gemm_ops, k, v)
            try:
                with config.override(**settings):
                    ln = gemm_ops.gemm(dev, M, N, K, A, B, C)
                t = time_launches(dev, [ln], 2, runs)
            finally:
                for k, v in old.items():
                    setattr(gemm_ops, k, v)
            row.append(f"{t:.3f} ({2 * M * N * K / (t / 1e3) / 1e12:.0f})")
        print(f"| {M}x{N}x{K} | " + " | ".join(row) + " |", flush=True)


def fc_layouts(dev, buf, runs):
    """--fc-layouts: W^T read from Caffe's N x K weight against a K x N copy."""
    print("| M x N x K | W as stored (N x K) ms | transposed (K x N) ms | stored/transposed |")
    print("|---|---|---|---|")
    for M, N, K in FC_SHAPES:
        A, B, C = buf(M * K), buf(K * N), buf(M * N)
        t = [time_launches(dev, [gemm_ops.gemm(dev, M, N, K, A, B, C, trans_b=tb)], 2, runs)
             for tb in (True, False)]
        print(f"| {M}x{N}x{K} | {t[0]:.4f} | {t[1]:.4f} | {t[0] / t[1]:.2f} |", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--conv-shapes", action="store_true",
                    help="short-K convolution products against variants of the async loop")
    ap.add_argument("--fc-layouts", action="store_true",
                    help="batch-64 fully-connected products, the weight as stored and transposed")
    a = ap.parse_args()
    dev = get_device()
    if not (dev.is_gpu and getattr(dev, "is_nvidia", False)):
        sys.exit("bench_tf32_gemm: TF32 tensor cores need an NVIDIA GPU "
                 f"(device: {dev.name})")
    gemm_ops.set_allow_tf32(True)
    buf = random_buffers(dev)
    print(f"device: {dev.name}")
    if a.fc_layouts:
        fc_layouts(dev, buf, a.runs)
        gemm_ops.set_allow_tf32(False)
        return
    if a.conv_shapes:
        conv_shapes(dev, buf, a.runs)
        gemm_ops.set_allow_tf32(False)
        return
    print("| M x N x K | trans A, B | old ms | old TFLOP/s | async ms | async TFLOP/s | ratio |")
    print("|---|---|---|---|---|---|---|")
    for M, N, K, ta, tb in SHAPES:
        A, B, C = buf(M * K), buf(K * N), buf(M * N)
        t = {}
        for loop in (False, True):
            with config.override(TF32_ASYNC=loop):
                ln = gemm_ops.gemm(dev, M, N, K, A, B, C, trans_a=ta, trans_b=tb)
            t[loop] = time_launches(dev, [ln], 2, a.runs)
        tf = [2 * M * N * K / (t[x] / 1e3) / 1e12 for x in (False, True)]
        print(f"| {M}x{N}x{K} | {int(ta)}, {int(tb)} | {t[False]:.3f} | {tf[0]:.0f} | "
              f"{t[True]:.3f} | {tf[1]:.0f} | {t[False] / t[True]:.2f} |", flush=True)
    gemm_ops.set_allow_tf32(False)


if __name__ == "__main__":
    main()
