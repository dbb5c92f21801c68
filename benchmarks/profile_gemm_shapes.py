"""Per-launch profile of a CPU training step with each GEMM named by its
shape (M x N x K, transposes, images folded into N / K, blocks) and its
GFLOP/s, in launch order, so small or odd GEMM shapes that run far below
the CPU kernel's big-shape rate stand out (profile_kernels.py groups by
kernel name and global size only).

    python3 benchmarks/profile_gemm_shapes.py [--net cifar10_quick] [--batch 100]
"""
import argparse
import collections
import os
import sys

os.environ["CAFFE_OCL_PROFILE"] = "1"     # before the device is created

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from caffe_ocl import device as device_mod  # noqa: E402
from caffe_ocl.solvers import SGDSolver  # noqa: E402
from bench_train_small import NETS  # noqa: E402
from common import fill_inputs, solver_for, with_inputs  # noqa: E402
from profile_kernels import Recorder  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_labels = {}


def _describe(name, args, defines):
    """A label for a launch: GEMMs by shape, other kernels by name."""
    d = defines or {}
    if name == "gemm" and "BM_MAX" in d:
        M, N, K = args[:3]
        bm, bn, ns, _, _, ks = args[24:30]
        t = ("T" if d.get("TRANS_A") else "N") + ("T" if d.get("TRANS_B") else "N")
        fold = f" nsplit={ns}" if ns else (f" ksplit={ks}" if ks else "")
        return f"gemm {t} {M}x{N}x{K}{fold} blk {bm}x{bn}", 2.0 * M * N * K
    return name, 0.0


def install():
    orig = device_mod.Device.launch

    def launch(dev, filename, name, gsize, lsize, args, defines=None):
        lc = orig(dev, filename, name, gsize, lsize, args, defines)
        label, flop = _describe(name, args, defines)
        _labels[id(lc)] = (f"{label} g{tuple(lc.gsize)}", flop)
        return lc
    device_mod.Device.launch = launch


def labelled_profile(fn, dev, iters, unit, top=None):
    """Run ``fn`` ``iters`` times under OpenCL profiling (``install()``
    first) and print its launches by label, heaviest first: ms per
    ``unit`` (step, pass), launches per unit, GFLOP/s of the GEMMs."""
    wall, recs = Recorder().measure(fn, dev, iters)
    agg = collections.OrderedDict()
    for launch, ms in recs:
        label, flop = _labels.get(id(launch), (launch.name, 0.0))
        e = agg.setdefault(label, [0.0, 0, flop])
        e[0] += ms
        e[1] += 1
    total = sum(v[0] for v in agg.values())
    print(f"wall {wall:.1f} ms/{unit}, kernels {total:.1f} ms")
    print(f"| launch | ms/{unit} | per {unit} | GFLOP/s |\n|---|---|---|---|")
    for label, (ms, c, flop) in sorted(agg.items(), key=lambda kv: -kv[1][0])[:top]:
        per = max(c // iters, 1)
        rate = f"{flop * per / (ms * 1e6):.0f}" if flop else ""
        print(f"| {label} | {ms:.2f} | {per} | {rate} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--net", default="cifar10_quick")
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--iters", type=int, default=5)
    a = ap.parse_args()
    install()
    cfg = NETS[a.net]
    param = with_inputs(os.path.join(ROOT, cfg["proto"]), a.batch, cfg["shape"])
    solver = SGDSolver(solver_for(param))
    fill_inputs(solver.net, 10)
    labelled_profile(lambda: solver.step(1), solver.net.device, a.iters, "step")


if __name__ == "__main__":
    main()
