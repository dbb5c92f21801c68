"""TF32 GEMM main loops on an NVIDIA GPU, same run: tile_mainloop.h
(register-staged tiles) against tile_mainloop_async.h (cp.async pipeline,
the default), on a big square GEMM in every transpose case and two
convolution-like shapes; milliseconds and TFLOP/s, ratio old / async.

    python benchmarks/bench_tf32_gemm.py [--runs 10]
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    a = ap.parse_args()
    dev = get_device()
    if not (dev.is_gpu and getattr(dev, "is_nvidia", False)):
        sys.exit("bench_tf32_gemm: TF32 tensor cores need an NVIDIA GPU "
                 f"(device: {dev.name})")
    gemm_ops.set_allow_tf32(True)
    buf = random_buffers(dev)
    print(f"device: {dev.name}")
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
