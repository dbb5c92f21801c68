"""Fully-connected products C = X W^T on a CPU driver, one launch alone, by
how the weights are read: as stored (NT: each block of rows packs them,
gathering W^T column by column), transposed once (NN), packed once into the
GEMM's panels (packed: ops.gemm.pack_b_panels, what a TEST net's
InnerProduct uses from CPU_PACKED_FC_MIN_M rows, ops.gemm_splitk.
keeps_weights_packed) and, for at most 32 rows, the small-M kernel. Best of
--rounds means of --runs passes, the variants interleaved round by round;
also checks that the packed product equals the NT one bit for bit.

    python3 benchmarks/bench_fc_packed.py
    python3 benchmarks/bench_fc_packed.py --shapes 197x768x192,16x384x768 --rounds 7

A shape is MxNxK: M rows (tokens x batch), N outputs, K inputs.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from caffe_ocl.device import get_device  # noqa: E402
from caffe_ocl.ops import gemm as gemm_ops  # noqa: E402
from caffe_ocl.ops import gemm_splitk  # noqa: E402
from caffe_ocl.ops import ssd as ssd_ops  # noqa: E402
from common import random_buffers, time_launches  # noqa: E402

# DeiT-Tiny's MLP (197 tokens), LeViT's stages (49 and 16 tokens), an LSTM-
# like 32-row product, classifiers at batch 1, 16 and 64 (AlexNet's fc6)
SHAPES = ("197x768x192,197x192x768,49x512x256,49x256x512,16x768x384,16x384x768,"
          "32x1024x256,1x1000x2048,8x1000x1280,16x1000x2048,64x1000x4096,64x4096x9216")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    dev = get_device()
    if not dev.is_cpu:
        print("bench_fc_packed.py: a CPU driver's kernels (this device is not a CPU)")
        return 1
    buf = random_buffers(dev)
    print(f"# {dev.name}; us per product (GFLOP/s); ratios: NT time / variant time")
    print("| M x N x K | NT | NN | packed | small-M | NT / packed | small-M / packed |")
    print("|---|---|---|---|---|---|---|")
    for spec in args.shapes.split(","):
        m, n, k = (int(v) for v in spec.split("x"))
        x, w, c, c2 = buf(m * k), buf(n * k), buf(m * n), buf(m * n)
        wt = dev.alloc(4 * n * k)
        packed = dev.alloc(4 * gemm_ops.packed_b_floats(dev, n, k))
        for ln in (ssd_ops.transpose(dev, 1, n, k, w, wt),
                   gemm_ops.pack_b_panels(dev, n, k, w, packed)):
            ln.run(dev.queue)
        variants = {"NT": [gemm_ops.gemm(dev, m, n, k, x, w, c, trans_b=True)],
                    "NN": [gemm_ops.gemm(dev, m, n, k, x, wt, c)],
                    "packed": [gemm_ops.gemm(dev, m, n, k, x, packed, c2, packed_b=True)]}
        if m <= gemm_splitk.SMALL_M_MAX:
            variants["small-M"] = [gemm_splitk.small_m(dev, m, n, k, x, w, c)]
        for name in ("NT", "packed"):
            for ln in variants[name]:
                ln.run(dev.queue)
        a, b = np.empty(m * n, np.float32), np.empty(m * n, np.float32)
        dev.download(a, c)
        dev.download(b, c2)
        if not np.array_equal(a, b):
            print(f"{spec}: the packed product differs from the NT one")
            return 1
        best = {name: float("inf") for name in variants}
        for _ in range(args.rounds):
            for name, ln in variants.items():
                best[name] = min(best[name], time_launches(dev, ln, warmup=2, runs=args.runs))
        flop = 2.0 * m * n * k

        def cell(name):
            if name not in best:
                return "-"
            return f"{best[name] * 1e3:.1f} ({flop / best[name] / 1e6:.0f})"
        ratio_small = f"{best['small-M'] / best['packed']:.2f}" if "small-M" in best else "-"
        print(f"| {spec} | {cell('NT')} | {cell('NN')} | {cell('packed')} | {cell('small-M')} "
              f"| {best['NT'] / best['packed']:.2f} | {ratio_small} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
