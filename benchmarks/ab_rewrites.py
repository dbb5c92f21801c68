"""A/B of one planning rewrite (issue #27) on converted torchvision nets:
the same converted net built twice in one process, the rewrite on and off
(a boolean CAFFE_OCL_* setting, e.g. CONCAT_IN_PLACE), outputs compared,
forward timed interleaved through ``net.forward()``.

    python benchmarks/ab_rewrites.py --setting CONCAT_IN_PLACE \\
        --nets googlenet,densenet121 [--batch 2] [--size 96] [--rounds 7]
        [--runs 5] [--export-dir DIR]

Prints per net: the groups the rewrite adds, the largest output difference,
the median ms on and off and the ratio off / on (> 1: the rewrite helps).
"""
import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import bench_zoo  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setting", required=True, help="boolean config name, e.g. CONCAT_IN_PLACE")
    ap.add_argument("--nets", default="googlenet,densenet121")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--size", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--export-dir", default=None)
    ap.add_argument("--order", choices=("on-off", "off-on", "on-on"), default="on-off",
                    help="which net is built (and timed in each round) first; on-on: an "
                    "A/A control, both nets with the rewrite")
    a = ap.parse_args(argv)
    from caffe_ocl import config
    from caffe_ocl.onnx import check, to_caffe
    export_dir = a.export_dir or tempfile.mkdtemp(prefix="ab_rewrites_")
    rng = np.random.default_rng(0)
    for name in a.nets.split(","):
        model = bench_zoo.build_model(name)
        path = bench_zoo.export_onnx(model, name, a.batch, a.size, export_dir)
        param = to_caffe.convert(path, batch=a.batch)
        x = rng.standard_normal((a.batch, 3, a.size, a.size)).astype(np.float32)
        nets, outs = {}, {}
        order = {"on-off": (("on", True), ("off", False)),
                 "off-on": (("off", False), ("on", True)),
                 "on-on": (("on", True), ("off", True))}[a.order]
        for key, on in order:
            with config.override(**{a.setting: on}):
                net = check.caffe_net(param)
                net.blobs[net.inputs[0]].data[...] = x
                # the first forward too: fused groups build their launches
                # then, and some settings are read there (CPU_PACKED_WEIGHTS)
                outs[key] = bench_zoo.ours_timer(net)()
            nets[key] = net
        added = sorted(set(nets["on"].plan.describe()) - set(nets["off"].plan.describe()))
        diff = float(np.abs(outs["on"] - outs["off"]).max())
        scale = float(np.abs(outs["off"]).max())
        med, _ = bench_zoo.interleave({k: bench_zoo.ours_timer(n) for k, n in nets.items()},
                                      a.rounds, a.warmup, a.runs)
        print(f"{name} b{a.batch} {a.size}px: {len(added)} groups added "
              f"({'; '.join(added[:4])}{' ...' if len(added) > 4 else ''}); "
              f"max |on - off| {diff:.2e} (max |out| {scale:.2e}); "
              f"{a.setting} on {med['on']:.1f} ms, off {med['off']:.1f} ms, "
              f"off/on {med['off'] / med['on']:.3f}", flush=True)


if __name__ == "__main__":
    main()
