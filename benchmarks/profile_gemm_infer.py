"""profile_gemm_shapes.py for CPU inference: one TEST forward pass of a
bench_cpu_infer.py net with each GEMM launch named by shape (M x N x K,
images folded, block) and its GFLOP/s, the heaviest first.

    python3 benchmarks/profile_gemm_infer.py [--net mobilenet_v2] [--top 30]
"""
import argparse
import collections
import os
import sys

os.environ["CAFFE_OCL_PROFILE"] = "1"     # before the device is created

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from caffe_ocl import device as device_mod  # noqa: E402
from ab_cpu_infer import build  # noqa: E402
from bench_cpu_infer import NETS  # noqa: E402
from profile_gemm_shapes import _labels, install  # noqa: E402
from profile_kernels import Recorder  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--net", default="mobilenet_v2", choices=sorted(NETS))
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    install()
    rec = Recorder()
    net = build(NETS[a.net], {}, [])
    launches = {}
    orig = device_mod.Launch.run
    wrapped = device_mod.Launch.run

    def run(launch, queue):
        ev = wrapped(launch, queue)
        if rec.events is not None:
            launches[len(rec.events) - 1] = _labels.get(id(launch), (launch.name, 0.0))
        return ev
    device_mod.Launch.run = run
    last = len(net.layers) - 1
    wall, recs = rec.measure(lambda: net._forward_range(0, last), net.device, a.iters)
    device_mod.Launch.run = orig
    agg = collections.OrderedDict()
    for i, (_, _, ms) in enumerate(recs):
        label, flop = launches.get(i, ("?", 0.0))
        e = agg.setdefault(label, [0.0, 0, flop])
        e[0] += ms
        e[1] += 1
    total = sum(v[0] for v in agg.values())
    print(f"{a.net} batch {NETS[a.net]['batch']}: wall {wall:.1f} ms/pass, kernels {total:.1f} ms")
    print("| launch | ms/pass | per pass | GFLOP/s |\n|---|---|---|---|")
    for label, (ms, c, flop) in sorted(agg.items(), key=lambda kv: -kv[1][0])[:a.top]:
        per = max(c // a.iters, 1)
        rate = f"{flop * per / (ms * 1e6):.0f}" if flop else ""
        print(f"| {label} | {ms:.2f} | {per} | {rate} |")


if __name__ == "__main__":
    main()
