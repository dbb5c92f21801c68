"""Memory bandwidth of the training BatchNorm passes on a GPU, against plain
streaming kernels with the same reads and writes, same run.

For each ResNet-50 batch-64 shape: a copy-like kernel per traffic pattern
(one float4 per work-item), then our passes: the statistics' split
reduction (channel.cl chan_partial, shifted sums) with the work-group plan
in use (ops/channel.py partial_plan) and with split_chunks' plan (at least
8 groups per compute unit, the plan before 2026-11-30), the residual tail's
backward reduction (five streams) likewise, and the fused BatchNorm ->
Scale -> ReLU / residual-tail forward passes. TB/s counts each tensor read
or written once.

    python benchmarks/bench_channel_passes.py [--shapes 64x256x56x56,...]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import pyopencl as cl  # noqa: E402

from caffe_ocl.device import get_device  # noqa: E402
from caffe_ocl.ops import channel as ch_ops, normalization as norm_ops  # noqa: E402
from common import time_launches  # noqa: E402

SHAPES = "64x64x112x112,64x256x56x56,64x64x56x56,64x512x28x28,64x1024x14x14,64x2048x7x7"

STREAM_SRC = r"""
__kernel void r1w2(int n, __global const float4* x, __global float4* a, __global float4* b) {
    const int k = get_global_id(0);
    if (k < n) { const float4 v = x[k]; a[k] = v; b[k] = 2.0f * v; }
}
__kernel void r2w3(int n, __global float4* x, __global const float4* s, __global float4* a,
                   __global float4* y) {
    const int k = get_global_id(0);
    if (k < n) { const float4 v = x[k], w = s[k]; a[k] = v; x[k] = 2.0f * v; y[k] = v + w; }
}
__kernel void r3w2(int n, __global const float4* x, __global const float4* s,
                   __global const float4* t, __global float4* a, __global float4* y) {
    const int k = get_global_id(0);
    if (k < n) { const float4 v = x[k]; a[k] = v * t[k]; y[k] = v + s[k]; }
}
"""


class _Stream:
    """A bare launch of one of STREAM_SRC's kernels (time_launches runs it)."""

    def __init__(self, kernel, n4, args):
        self.kernel, self.gsize, self.lsize = kernel, (-(-n4 // 256) * 256,), (256,)
        kernel.set_args(np.int32(n4), *args)

    def run(self, queue):
        cl.enqueue_nd_range_kernel(queue, self.kernel, self.gsize, self.lsize)


def old_plan(dev, dim, m, tail=False):
    wg = ch_ops.reduce_wg(dev)
    return wg, ch_ops.split_chunks(dev, dim, m, wg)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--reps", type=int, default=20, help="launches per timed pass")
    a = ap.parse_args()
    dev = get_device()
    prg = cl.Program(dev.context, STREAM_SRC).build()
    kern = {name: cl.Kernel(prg, name) for name in ("r1w2", "r2w3", "r3w2")}
    rng = np.random.default_rng(0)
    print(f"device: {dev.name}\n")
    print("| shape (N x C x H x W) | pass | streams | ms | TB/s |\n|---|---|---|---|---|")
    for spec in a.shapes.split(","):
        O, C, H, W = (int(v) for v in spec.split("x"))
        I, n = H * W, O * C * H * W
        x, s, t, xn, y = (dev.alloc(4 * n) for _ in range(5))
        for b in (x, s, t):
            dev.upload(b, rng.standard_normal(n).astype(np.float32))
        mean, stdv, gamma, beta = (dev.alloc(4 * C) for _ in range(4))
        for b in (mean, stdv, gamma, beta):
            dev.upload(b, (rng.random(C) + 0.5).astype(np.float32))
        tail = (s, 1.0, t, 1.0, y, 0.0)
        rows = [("stream 1R2W", 3, [_Stream(kern["r1w2"], n // 4, [x, xn, y])]),
                ("stream 2R3W", 5, [_Stream(kern["r2w3"], n // 4, [x, s, xn, y])]),
                ("stream 3R2W", 5, [_Stream(kern["r3w2"], n // 4, [x, s, t, xn, y])])]
        saved = ch_ops.partial_plan
        for label, plan in (("", saved), (" (split_chunks plan)", old_plan)):
            ch_ops.partial_plan = plan
            try:
                rows += [
                    ("statistics chan_partial" + label, 1,
                     [ch_ops.channel_partials(dev, O, C, I, x, shifted=True)[0]]),
                    ("tail backward chan_partial" + label, 5,
                     [ch_ops.channel_partials(dev, O, C, I, x, xn, tail=tail)[0]])]
            finally:
                ch_ops.partial_plan = saved
        rows += [
            ("bn_scale_act_fwd (ReLU)", 3,
             [norm_ops.bn_scale_act_forward(dev, O, C, I, x, mean, stdv, gamma, beta, xn, y,
                                            act=("relu", 0.0))]),
            ("bn_scale_add_relu_fwd", 5,
             [norm_ops.residual_tail_forward(dev, O, C, I, x, mean, stdv, gamma, beta, xn, 1.0,
                                             s, 1.0, y, 0.0)])]
        for name, streams, launches in rows:
            ms = time_launches(dev, launches * a.reps, 2, 5) / a.reps
            print(f"| {spec} | {name} | {streams} | {ms:.4f} | "
                  f"{streams * 4 * n / (ms * 1e-3) / 1e12:.2f} |", flush=True)
        del x, s, t, xn, y, rows


if __name__ == "__main__":
    main()
