"""Interleaved A/B of single convolution forwards (inference: weights packed
once, bias + ReLU) under two or more values of one setting, read when the
launches are built (e.g. CPU_CHANVEC_TILE8, CPU_CHANVEC_KBLOCK,
CPU_CHANVEC), or of one ops module's rule constant (a dotted name:
conv.CHANVEC_LOCAL_PAD, depthwise.SRC). Each shape's variants run in turn, --rounds times, so the
load of a shared, noisy machine hits them alike; prints per shape the
median of each variant's --runs-pass means and each variant's time / the
first's (and the same ratio of the fastest rounds).

    python3 benchmarks/ab_cpu_layer.py --setting CPU_CHANVEC_TILE8 --values 0,1 \\
        --shapes 512x7x7:512:3,1024x14x14:256:1 [--batch 1] [--rounds 15]

A shape is CxHxW:OUT:K[:STRIDE[:PAD[:GROUPS[:DILATION]]]] (PAD defaults to K // 2). Written
for issue #27's CPU batch-1 work (BENCHMARKS.md, twenty-first session).
--ort: also ONNX Runtime (Conv + Relu, --threads intra-op threads) on the
same layer, in the same rounds (this machine's speed drifts by 1.5x over
minutes, so only interleaved comparisons hold).
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from caffe_ocl.device import get_device  # noqa: E402
from caffe_ocl.ops import conv as conv_ops  # noqa: E402
from common import random_buffers, time_launches  # noqa: E402


def parse_shape(text, batch):
    chw, co, k, *rest = text.split(":")
    c, h, w = (int(v) for v in chw.split("x"))
    k = int(k)
    stride = int(rest[0]) if rest else 1
    pad = int(rest[1]) if len(rest) > 1 else k // 2
    groups = int(rest[2]) if len(rest) > 2 else 1
    dil = int(rest[3]) if len(rest) > 3 else 1
    return conv_ops.ConvGeometry(batch, c, h, w, int(co), k, k, pad, pad, stride, stride,
                                 dil, dil, groups)


def build(dev, g, buf, setting, value):
    """The forward's launches with ``setting`` = ``value`` (and the kernels
    they use, names joined). A dotted ``setting`` is a rule constant of
    caffe_ocl.ops.<module> instead (``conv.CHANVEC_LOCAL_PAD``, or
    ``depthwise.SRC`` with a kernel file's name: a copy of an older
    kernels/depthwise.cl against the current one), as bench_zoo's --ab."""
    from bench_zoo import config_override
    with config_override([f"{setting}={value}"]):
        x = buf(g.num * g.channels * g.height * g.width)
        w = buf(g.out_channels * g.col_rows)
        b = buf(g.out_channels)
        y = buf(g.num * g.out_channels * g.out_spatial)
        col = buf(max(conv_ops.workspace_floats(dev, g, "im2col"), 1))
        launches = conv_ops.forward(dev, g, x, w, y, col, bias=b, act=("relu", 0.0),
                                    weight_version=lambda: 1)
    return launches, "+".join(ln.name for ln in launches)


def ort_runner(g, threads):
    """A callable running ONNX Runtime's Conv + Relu of ``g`` once."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal(
        (g.out_channels, g.channels // g.groups, g.kh, g.kw)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(g.out_channels).astype(np.float32), "b")
    conv = helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[g.kh, g.kw],
                            strides=[g.sh, g.sw], pads=[g.ph, g.pw, g.ph, g.pw],
                            group=g.groups)
    graph = helper.make_graph(
        [conv, helper.make_node("Relu", ["c"], ["y"])], "layer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                       [g.num, g.channels, g.height, g.width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, b])
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString(),
        so, providers=["CPUExecutionProvider"])
    x = rng.standard_normal((g.num, g.channels, g.height, g.width)).astype(np.float32)
    return lambda: sess.run(None, {"x": x})


# seconds of pause before each timer when ONNX Runtime is in the round
SETTLE_S = 0.2


def time_calls(fn, runs):
    """Mean milliseconds of ``runs`` calls of fn."""
    t0 = time.perf_counter()
    for _ in range(runs):
        fn()
    return (time.perf_counter() - t0) / runs * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--setting", required=True)
    ap.add_argument("--values", required=True, help="comma-separated, the first is the base")
    ap.add_argument("--shapes", required=True, help="comma-separated CxHxW:OUT:K[:S[:P[:G[:D]]]]")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--runs", type=int, default=30, help="passes per timing")
    ap.add_argument("--const", action="append", default=[],
                    help="NAME=INT: set an ops/conv.py rule constant first (all variants)")
    ap.add_argument("--ort", action="store_true",
                    help="also ONNX Runtime on each layer, interleaved (column ORT)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="ONNX Runtime's intra-op threads (--ort)")
    a = ap.parse_args()
    for item in a.const:
        name, val = item.split("=")
        assert hasattr(conv_ops, name), name
        setattr(conv_ops, name, int(val))
    dev = get_device()
    if not dev.is_cpu:
        sys.exit(f"{dev.name}: not a CPU driver")
    buf = random_buffers(dev)
    values = a.values.split(",")
    for text in a.shapes.split(","):
        g = parse_shape(text, a.batch)
        variants = {v: build(dev, g, buf, a.setting, v) for v in values}
        for v, (launches, names) in variants.items():
            time_launches(dev, launches, warmup=2, runs=1)     # build, pack, warm
        times = {v: [] for v in values}
        run_ort = ort_runner(g, a.threads) if a.ort else None
        if run_ort:
            time_calls(run_ort, 3)
            times["ORT"] = []
        timers = {v: (lambda ln=launches: time_launches(dev, ln, warmup=0, runs=a.runs))
                  for v, (launches, _n) in variants.items()}
        if run_ort:
            timers["ORT"] = lambda: time_calls(run_ort, a.runs)
        names = list(timers)
        for r in range(a.rounds):
            # the order rotates, and with ONNX Runtime in the round each timer
            # starts after a pause: its pool threads spin on after a run and
            # took the 2-core CPU from whatever ran next (bench_zoo.interleave)
            for k in names[r % len(names):] + names[:r % len(names)]:
                if run_ort:
                    time.sleep(SETTLE_S)
                times[k].append(timers[k]())
        med = {v: statistics.median(t) for v, t in times.items()}
        low = {v: min(t) for v, t in times.items()}
        base, bmin = med[values[0]], low[values[0]]
        cols = "  ".join(f"{a.setting}={v}: {med[v]:.3f} ms ({variants[v][1].split('+')[-1]})"
                         f" x{med[v] / base:.2f} (min x{low[v] / bmin:.2f})" for v in values)
        if run_ort:
            cols += (f"  ORT: {med['ORT']:.3f} ms, ORT/first x{med['ORT'] / base:.2f}"
                     f" (min x{low['ORT'] / bmin:.2f})")
        print(f"{text} b{a.batch}: {cols}", flush=True)


if __name__ == "__main__":
    main()
