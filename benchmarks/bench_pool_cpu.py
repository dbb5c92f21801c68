"""Average pooling on a CPU driver: the band kernel (pooling.cl
ave_pool_fwd_band) against the plane kernel (ave_pool_fwd_cpu) on the
same input, interleaved; prints each one's median ms and their ratio.

    python3 benchmarks/bench_pool_cpu.py [--rounds 9] [--runs 20]

Shapes: Inception v3's 3x3/1 pad-1 poolings and DenseNet's 2x2/2
transitions at batch 1 (BENCHMARKS.md, twenty-eighth session)."""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from caffe_ocl.device import get_device  # noqa: E402
from caffe_ocl.ops import pool as pool_ops  # noqa: E402
from common import random_buffers, time_launches  # noqa: E402

# (shape, kernel, stride, pad)
CASES = [((1, 192, 35, 35), 3, 1, 1), ((1, 288, 35, 35), 3, 1, 1), ((1, 768, 17, 17), 3, 1, 1),
         ((1, 2048, 8, 8), 3, 1, 1), ((1, 128, 56, 56), 2, 2, 0), ((1, 512, 14, 14), 2, 2, 0)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--runs", type=int, default=20)
    a = ap.parse_args()
    dev = get_device()
    if not dev.is_cpu:
        sys.exit(f"{dev.name}: not a CPU driver")
    buf = random_buffers(dev)
    for shape, k, s, p in CASES:
        n, c, h, w = shape
        ho, wo = (h + 2 * p - k + s - 1) // s + 1, (w + 2 * p - k + s - 1) // s + 1
        x, y = buf(n * c * h * w), buf(n * c * ho * wo)
        launches = {impl: [pool_ops.ave_forward(dev, shape, (ho, wo), (k, k), (s, s), (p, p),
                                                x, y, impl=impl)]
                    for impl in ("window", "band")}
        for ls in launches.values():
            time_launches(dev, ls, warmup=2, runs=2)
        times = {impl: [] for impl in launches}
        for _ in range(a.rounds):
            for impl, ls in launches.items():
                times[impl].append(time_launches(dev, ls, warmup=0, runs=a.runs))
        med = {impl: statistics.median(t) for impl, t in times.items()}
        print(f"{c}x{h}x{w} {k}x{k}/{s} pad {p}: plane {med['window']:.3f} ms, "
              f"band {med['band']:.3f} ms, band/plane {med['band'] / med['window']:.2f}",
              flush=True)


if __name__ == "__main__":
    main()
