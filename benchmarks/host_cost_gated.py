"""Host cost of a converted net's batch-1 forward with no kernel running
meanwhile (issue #27: is a forward waiting on the host or on the device?).

For each net (torchvision, seeded weights, exported to ONNX and converted
as bench_zoo.py does): the median wall time of ``net.forward()``; the
median host time of the same forward with the queue held behind a user
event (every launch is enqueued, none runs until the event is released,
so the host's enqueues do not compete with kernels -- on a GPU driver
that submits each kernel to a running device, nor on a 2-core CPU for
the cores); then a cProfile of those held forwards, by own time (the
``cl_enqueue`` line is the driver's ``clEnqueueNDRangeKernel`` itself).

    python3 benchmarks/host_cost_gated.py --nets densenet121,mnasnet1_0 [--runs 50] [--export-dir DIR]

Runs on the default device (CAFFE_OCL_DEVICE picks another).
"""
import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import bench_zoo  # noqa: E402
from common import hold_queue, release  # noqa: E402


def held_forward(net, profiler=None):
    """Seconds of host time of one forward enqueued behind a user event
    (released, and the queue drained, after the clock stops)."""
    dev = net.layers[0].device
    q = dev.queue
    q.finish()
    gate = hold_queue(dev.context, q)
    if profiler is not None:
        profiler.enable()
    t0 = time.perf_counter()
    net.forward_from_to(0, len(net.layers) - 1)
    dt = time.perf_counter() - t0
    if profiler is not None:
        profiler.disable()
    release(gate)
    q.finish()
    return dt


def traced_launches(net):
    """Launches of the trace replaying the whole forward (0: none)."""
    trace = bench_zoo.whole_forward_trace(net)
    return trace.launches if trace is not None else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nets", default="densenet121,mnasnet1_0")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--export-dir", help="keep/reuse the exported ONNX files here")
    ap.add_argument("--top", type=int, default=10, help="cProfile lines")
    a = ap.parse_args()
    from caffe_ocl.onnx import to_caffe
    export_dir = a.export_dir or tempfile.mkdtemp(prefix="caffe_ocl_hostcost_")
    for name in a.nets.split(","):
        path = bench_zoo.export_onnx(bench_zoo.build_model(name), name, 1, 224, export_dir)
        x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
        net = bench_zoo.make_net(to_caffe.convert(path, batch=1), x, False)
        for _ in range(10):     # plans built, traces recorded
            net.forward()
        walls = []
        for _ in range(a.runs):
            t0 = time.perf_counter()
            net.forward()
            walls.append(time.perf_counter() - t0)
        held = [held_forward(net) for _ in range(a.runs)]
        print(f"{name}: forward {statistics.median(walls) * 1e3:.3f} ms, host with the queue "
              f"held {statistics.median(held) * 1e3:.3f} ms, replayed launches "
              f"{traced_launches(net)}")
        prof = cProfile.Profile()
        for _ in range(max(a.runs // 2, 1)):
            held_forward(net, prof)
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(a.top)
        print("\n".join(line for line in out.getvalue().splitlines() if line.strip()))


if __name__ == "__main__":
    main()
