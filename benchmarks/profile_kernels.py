"""Where a real training step (or inference pass) spends its device time,
by kernel: every launch of the step is timed by OpenCL profiling events
(a queue with CL_QUEUE_PROFILING_ENABLE, CAFFE_OCL_PROFILE=1), so fused
chains, memory-plan sharing and algorithm choices are those of
``solver.step`` itself (profile_layers.py times layers one by one,
unfused). Also prints the step's wall time: wall minus the kernels' sum is
time the device sat idle (host overhead, transfers, gaps).

    python3 benchmarks/profile_kernels.py --nets resnet50 --batch 64 [--infer]
"""
import argparse
import collections
import os
import sys
import time

os.environ["CAFFE_OCL_PROFILE"] = "1"     # before the device is created

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyopencl as cl  # noqa: E402

import caffe_ocl  # noqa: E402
from caffe_ocl import device as device_mod  # noqa: E402
from bench_cpu_infer import NETS as CPU_NETS, deploy_net  # noqa: E402
from bench_train_small import NETS as SMALL_NETS  # noqa: E402
from common import fill_inputs, solver_for, with_inputs  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Recorder:
    """Wraps Launch.run to keep (launch, event) while measuring."""

    def __init__(self):
        self.events = None
        rec = self

        def run(launch, queue):
            ev = cl.enqueue_nd_range_kernel(queue, launch.kernel, launch.gsize, launch.lsize)
            if rec.events is not None:
                rec.events.append((launch, ev))
            return ev
        device_mod.Launch.run = run

    def measure(self, fn, dev, iters):
        fn()
        dev.finish()
        self.events = []
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        dev.finish()
        wall = (time.perf_counter() - t0) / iters * 1e3
        evs, self.events = self.events, None
        return wall, [(ln, (e.profile.end - e.profile.start) * 1e-6 / iters) for ln, e in evs]


def report(title, wall, recs, top):
    by_name = collections.defaultdict(lambda: [0.0, 0])
    by_shape = collections.defaultdict(lambda: [0.0, 0])
    for ln, ms in recs:
        for key, agg in ((ln.name, by_name), ((ln.name, ln.gsize), by_shape)):
            agg[key][0] += ms
            agg[key][1] += 1
    total = sum(v[0] for v in by_name.values())
    print(f"\n## {title}: wall {wall:.2f} ms, kernels {total:.2f} ms "
          f"({len(recs)} launches; idle {wall - total:.2f} ms)")
    print("| kernel | ms | % | launches |\n|---|---|---|---|")
    for n, (ms, c) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"| {n} | {ms:.2f} | {100 * ms / total:.1f} | {c} |")
    print("| kernel | global size | ms | launches |\n|---|---|---|---|")
    for (n, g), (ms, c) in sorted(by_shape.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"| {n} | {g} | {ms:.3f} | {c} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nets", default="resnet50")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--infer", action="store_true", help="deploy net forward instead")
    a = ap.parse_args()
    rec = Recorder()
    for name in a.nets.split(","):
        if a.infer:
            proto = (CPU_NETS[name]["proto"] if name in CPU_NETS
                     else os.path.join("models", name, "deploy.prototxt"))
            net = deploy_net(proto, a.batch)
            wall, recs = rec.measure(lambda: net._forward_range(0, len(net.layers) - 1),
                                     net.device, a.iters)
            report(f"{name} batch {a.batch} inference", wall, recs, a.top)
        else:
            if name in SMALL_NETS:       # LeNet, CIFAR-10 quick: their own input shape
                cfg = SMALL_NETS[name]
                param = with_inputs(os.path.join(ROOT, cfg["proto"]), a.batch, cfg["shape"])
            else:
                param = with_inputs(os.path.join(ROOT, "models", name, "train.prototxt"),
                                    a.batch, (3, 224, 224))
            solver = caffe_ocl.solvers.SGDSolver(solver_for(param))
            fill_inputs(solver.net, 10 if name in SMALL_NETS else 1000)
            wall, recs = rec.measure(lambda: solver.step(1), solver.net.device, a.iters)
            report(f"{name} batch {a.batch} training step", wall, recs, a.top)


if __name__ == "__main__":
    main()
