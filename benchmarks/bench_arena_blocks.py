"""The parameter arena's two per-block kernels (kernels/solvers.cl
``solver_update_blocks``: SGD with momentum and L2 decay, ``fill_blocks``:
the gradients cleared) on an arena of ``--floats`` parameters, at several
work-group sizes per block (ops/solver.py block_lsize), interleaved; ms and
GB/s (counted as 16 bytes a parameter for the update: data, gradient and
history read, data and history written, less the second history; 4 for
the clear).

    python benchmarks/bench_arena_blocks.py [--floats 25000000] [--sizes 1,16,1,16] [--runs 10]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from caffe_ocl.device import get_device  # noqa: E402
from caffe_ocl.ops import solver as sops  # noqa: E402
from caffe_ocl.solvers.param_arena import BLOCK_FLOATS  # noqa: E402
from common import time_launches  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--floats", type=int, default=25_000_000)
    ap.add_argument("--sizes", default="1,16,1,16", help="work-items per block, in turn")
    ap.add_argument("--runs", type=int, default=10)
    a = ap.parse_args()
    dev = get_device()
    n = a.floats
    rows = [(s, min(BLOCK_FLOATS, n - s), 0) for s in range(0, n, BLOCK_FLOATS)]
    table = np.array(rows, np.int32).ravel()
    blocks = dev.alloc(table.nbytes)
    dev.upload(blocks, table)
    arrays = []
    for _ in range(4):          # data, diff, history, second history
        b = dev.alloc(4 * n)
        dev.upload(b, np.zeros(n, np.float32))
        arrays.append(b)
    one = dev.alloc(4)
    dev.upload(one, np.ones(1, np.float32))
    decay = dev.alloc(4)
    dev.upload(decay, np.full(1, 1e-4, np.float32))
    print(f"device: {dev.name}; {n} floats in {len(rows)} blocks")
    print("| work-items per block | update ms (GB/s) | clear ms (GB/s) |\n|---|---|---|")
    default = sops.block_lsize
    try:
        for ls in [int(v) for v in a.sizes.split(",")]:
            sops.block_lsize = lambda d, ls=ls: ls
            clear = sops.fill_blocks(dev, len(rows), blocks, arrays[1], 0.0)
            update = sops.update_blocks(dev, "SGD", len(rows), blocks, one, decay, *arrays, one,
                                        reg="L2", momentum=0.9)
            tu = time_launches(dev, [update], 2, a.runs)
            tc = time_launches(dev, [clear], 2, a.runs)
            print(f"| {ls} | {tu:.1f} ({16 * n / tu / 1e6:.1f}) | {tc:.1f} ({4 * n / tc / 1e6:.1f}) |",
                  flush=True)
    finally:
        sops.block_lsize = default


if __name__ == "__main__":
    main()
