"""Training step of a converted net with and without the TRAIN fusion of
BatchNorm -> Scale -> activation chains written with new tops (ONNX's
form, plan/train.py NewTopTrainChain), interleaved in one process.

    python3 benchmarks/ab_train_chains.py resnet18 --batch 8 --size 112 [--rounds 4]

Exports the torchvision net with its BatchNorm layers (bench_zoo.export_onnx
keep_bn), converts it, builds two SGD solvers (bench_zoo_train.make_solver):
one with the new-top chain finder switched off; prints the median ms per
``solver.step`` of each and the ratio."""
import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

import bench_zoo  # noqa: E402
import bench_zoo_train  # noqa: E402
from caffe_ocl.onnx import to_caffe  # noqa: E402
from caffe_ocl.plan import train  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("net")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--size", type=int, default=112)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=2, help="steps per timing")
    ap.add_argument("--export-dir", default=None)
    args = ap.parse_args()
    export_dir = args.export_dir or tempfile.mkdtemp()
    model = bench_zoo.build_model(args.net)
    path = bench_zoo.export_onnx(model, args.net, args.batch, args.size, export_dir,
                                 keep_bn=True)
    deploy, weights = to_caffe.split_weights(to_caffe.convert(path, batch=args.batch))
    finder = train.find_new_top_chains
    solvers = {}
    try:
        for fused in (False, True):
            train.find_new_top_chains = finder if fused else (lambda net, taken=(): [])
            solvers[fused] = bench_zoo_train.make_solver(deploy, weights)
    finally:
        train.find_new_top_chains = finder
    chains = sum(isinstance(c, train.NewTopTrainChain) for c in solvers[True].net.plan.groups)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, 3, args.size, args.size)).astype(np.float32)
    y = rng.integers(0, 1000, args.batch)
    for s in solvers.values():
        s.net.blobs[s.net.inputs[0]].data[...] = x
        s.net.blobs["label"].data[...] = y
        s.step(args.steps)
    ms = {False: [], True: []}
    for r in range(args.rounds):
        for fused in ((False, True) if r % 2 == 0 else (True, False)):
            s = solvers[fused]
            t0 = time.perf_counter()
            s.step(args.steps)
            float(s.net.blobs["loss"].data)          # waits for the device
            ms[fused].append((time.perf_counter() - t0) / args.steps * 1e3)
    a, b = statistics.median(ms[False]), statistics.median(ms[True])
    print(f"{args.net} batch {args.batch} {args.size}x{args.size}: {chains} new-top chains; "
          f"layer by layer {a:.1f} ms, fused {b:.1f} ms per step: {a / b:.2f}x")


if __name__ == "__main__":
    main()
