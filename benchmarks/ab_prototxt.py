"""A/B of one setting or rule constant on Caffe prototxts, on whatever
device caffe_ocl picks (the GPU machine has no OpenCV with a Caffe
importer, so bench_caffe_opencv.py's --ab cannot run there): the same net
built twice in one process with the same seeded random weights -- "ours"
as configured, "base" with a setting off or a caffe_ocl.ops constant
changed while its launches are built -- timed through ``net.forward``
in interleaved rounds; prints base / ours (paired median, >= 1: the
setting pays) and the largest difference between their outputs.

    python3 benchmarks/ab_prototxt.py --setting FUSE_PRELU NET.prototxt [...]
    python3 benchmarks/ab_prototxt.py --patch conv.FWD_SPLITK_WIDE_MIN_KTILES=1e9 NET ...
        [--batch N] [--size H,W] [--rounds 7] [--runs 20]
"""
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from bench_caffe_opencv import _build, _random_weights, _time_ours, net_arguments  # noqa: E402
from bench_zoo import config_override  # noqa: E402


def run_one(proto, args, tmp):
    ours = _build(proto, None, args.batch, {}, args.size)
    _random_weights(ours)
    weights = os.path.join(tmp, os.path.basename(proto) + ".caffemodel")
    ours.save(weights)
    ours = _build(proto, weights, args.batch, {}, args.size)
    name = ours.inputs[0]
    x = np.random.default_rng(2).normal(0, 1, ours.blobs[name].shape).astype(np.float32)
    if args.patch:
        with config_override([args.patch]):     # the launches are built at the first forward
            base = _build(proto, weights, args.batch, {}, args.size)
            out_base = base.forward(**{name: x})
    else:
        base = _build(proto, weights, args.batch, {args.setting: False}, args.size)
        out_base = base.forward(**{name: x})
    out = ours.forward(**{name: x})
    diff = max(float(np.abs(out[k] - out_base[k]).max()
                     / max(float(np.abs(out_base[k]).max()), 1e-30)) for k in out)
    times = {"ours": [], "base": []}
    for r in range(args.rounds):
        for k in (("ours", "base") if r % 2 == 0 else ("base", "ours")):
            times[k].append(_time_ours(ours if k == "ours" else base, args.runs))
    ratio = statistics.median(b / o for b, o in zip(times["base"], times["ours"]))
    return (f"| {os.path.basename(proto)} | {'x'.join(map(str, x.shape))} | "
            f"{statistics.median(times['ours']):.3f} | {statistics.median(times['base']):.3f} | "
            f"{ratio:.2f} | {diff:.1e} |")


def main(argv=None):
    ap = net_arguments(__doc__)
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--setting", help="a caffe_ocl setting turned off for the base net")
    what.add_argument("--patch", help="mod.ATTR=VALUE: a caffe_ocl.ops constant for the base net")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args(argv)
    base = f"{args.setting} off" if args.setting else args.patch
    print(f"| net | input | ours ms | base ({base}) ms | base/ours (paired) | output diff |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for proto in args.prototxt:
            print(run_one(proto, args, tmp), flush=True)


if __name__ == "__main__":
    main()
