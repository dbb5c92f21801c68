"""Does holding the queue while the host enqueues make launches cheaper?
(issue #27 item 3: batch 1 on a GPU waits on the host).

On the H100 the batch-1 forwards of the mobile nets cost 9-15 us of host
time per launch (bench_zoo's ``enqueue_ms / launches``), more where the
kernels are short (ShuffleNet v2, MNASNet, MobileNet v3: 14-15 us) than
where they are longer (MobileNet v2: 9 us). One explanation: a driver
submits each launch to an idle device at once (a doorbell per launch) and
only batches while the device is busy. If so, a forward could enqueue its
launches behind a barrier on a user event and release them together.

Part 1 (always): N launches of a tiny kernel and of a ~10 us kernel,
host us per enqueue and ms until the queue drains, three ways:
  idle -- enqueued to an idle device (the ordinary forward)
  busy -- enqueued behind one long kernel (the device busy throughout)
  gate -- behind a barrier on a user event, released after the last one
Part 2 (``--onnx FILE ...``, converted with onnx2caffe at batch 1): the
whole forward replayed ordinarily against replayed behind such a gate
(plan/trace.py's segment replay, patched here only), interleaved rounds,
outputs compared bit for bit; prints ordinary/gated (> 1: the gate helps).

    python3 benchmarks/bench_enqueue_gate.py [--scale 1.0] [--onnx /tmp/zoo_onnx/*_b1_*.onnx]

``--scale`` shrinks the kernels' loops (0.001 on a CPU driver, where the
long kernel at 1.0 runs for seconds). Measured on PoCL (2 cores): part 1
gate 1.5 us against idle 4.3 us per enqueue, drained at the same time;
part 2 level (0.93-1.01 on four mobile nets, noise). Not yet run on a GPU.
"""
import argparse
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402
import pyopencl as cl  # noqa: E402

from caffe_ocl import cl_enqueue, device as devmod  # noqa: E402

SRC = """
__kernel void tiny(__global float* x) { x[get_global_id(0)] += 1.0f; }
__kernel void spin(__global float* x, int n) {
    float v = x[get_global_id(0)];
    for (int i = 0; i < n; ++i) v = v * 0.999f + 0.001f;
    x[get_global_id(0)] = v;
}
"""


def _launches(dev, prg, buf, fn, name, n, gsize, *args):
    out = []
    for _ in range(n):
        k = cl.Kernel(prg, name)
        k.set_args(buf, *args)
        out.append((k, cl_enqueue.DirectEnqueue(fn, k, (gsize,), (256,)) if fn else None))
    return out


def _enqueue_all(q, launches, gsize_first):
    for k, direct in launches:
        if direct is None or direct(q) != 0:
            cl.enqueue_nd_range_kernel(q, k, (gsize_first,), (256,))


def part1(dev, args):
    ctx, q = dev.context, dev.queue
    prg = cl.Program(ctx, SRC).build()
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 << 20)
    fn = cl_enqueue.direct_enqueue_fn()
    units = max(dev.cl_device.max_compute_units, 1)
    wide = 256 * units
    tiny = _launches(dev, prg, buf, fn, "tiny", args.n, 256)
    mid = _launches(dev, prg, buf, fn, "spin", args.n, wide, np.int32(int(3000 * args.scale)))
    (long_k, _), = _launches(dev, prg, buf, None, "spin", 1, wide,
                             np.int32(int(400000 * args.scale)))
    print(f"device: {dev.name}; direct enqueue: {fn is not None}; {args.n} launches")

    def one(launches, gsize, case):
        q.finish()
        if case == "busy":
            cl.enqueue_nd_range_kernel(q, long_k, (wide,), (256,))
        t0 = time.perf_counter()
        ue = None
        if case == "gate":
            ue = cl.UserEvent(ctx)
            cl.enqueue_barrier(q, wait_for=[ue])
        _enqueue_all(q, launches, gsize)
        t1 = time.perf_counter()
        if ue is not None:
            ue.set_status(cl.command_execution_status.COMPLETE)
        q.finish()
        t2 = time.perf_counter()
        return (t1 - t0) * 1e6 / len(launches), (t2 - t0) * 1e3

    print("| kernels | way | host us per enqueue | ms until drained |")
    print("|---|---|---|---|")
    for label, launches, gsize in (("tiny", tiny, 256), ("~10 us", mid, wide)):
        for case in ("idle", "busy", "gate"):
            res = [one(launches, gsize, case) for _ in range(args.rounds + 2)][2:]
            print(f"| {label} | {case} | {np.median([r[0] for r in res]):.2f} | "
                  f"{np.median([r[1] for r in res]):.3f} |", flush=True)


def _gated_replay(self, queue):
    """plan/trace.py _Segment.replay with its launches behind a gate (the
    uploads before it: a blocking upload into a held queue would wait
    forever)."""
    for m in self.reads:
        m.to_device()
    ue = cl.UserEvent(queue.context)
    cl.enqueue_barrier(queue, wait_for=[ue])
    try:
        for ln in self.launches:
            ln.run(queue)
    finally:
        ue.set_status(cl.command_execution_status.COMPLETE)
    for m, n in self.writes:
        m.device_written(n)
    for b, fn in self.marks:
        b.compute_on_read = fn


def part2(args):
    from caffe_ocl.net import Net
    from caffe_ocl.onnx import to_caffe
    from caffe_ocl.plan import trace
    from caffe_ocl.proto import caffe_pb2
    ordinary = trace._Segment.replay
    print("\n| net | launches | ordinary ms | gated ms | ordinary/gated (paired median) | same output |")
    print("|---|---|---|---|---|---|")
    for path in args.onnx:
        net = Net(to_caffe.convert(path, batch=1), caffe_pb2.TEST)
        blob = net.blobs[net.inputs[0]]
        x = np.random.default_rng(0).normal(0, 1, blob.shape).astype(np.float32)
        q = net.layers[0].device.queue

        def once():
            blob.data[...] = x
            net.forward()
            q.finish()

        outs, times = {}, {"ordinary": [], "gated": []}
        try:
            for way in ("ordinary", "gated"):
                trace._Segment.replay = _gated_replay if way == "gated" else ordinary
                for _ in range(4):
                    once()
                outs[way] = net.blobs[net.outputs[0]].data.copy()
            for r in range(args.rounds):
                for way in (("ordinary", "gated") if r % 2 == 0 else ("gated", "ordinary")):
                    trace._Segment.replay = _gated_replay if way == "gated" else ordinary
                    once()
                    t0 = time.perf_counter()
                    for _ in range(args.runs):
                        once()
                    times[way].append((time.perf_counter() - t0) / args.runs * 1e3)
        finally:
            trace._Segment.replay = ordinary
        tr = next(iter(net._tracer.active.values()), None) if net._tracer else None
        ratio = np.median([a / b for a, b in zip(times["ordinary"], times["gated"])])
        print(f"| {os.path.basename(path)} | {tr.launches if tr else '?'} | "
              f"{np.median(times['ordinary']):.3f} | {np.median(times['gated']):.3f} | "
              f"{ratio:.3f} | {np.array_equal(outs['ordinary'], outs['gated'])} |", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=75, help="launches per pass (ShuffleNet v2 b1: 75)")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--runs", type=int, default=20, help="forwards per round (part 2)")
    ap.add_argument("--scale", type=float, default=1.0, help="kernel loop scale (CPU: 0.001)")
    ap.add_argument("--onnx", nargs="*", default=[], help="part 2: batch-1 ONNX files")
    args = ap.parse_args()
    warnings.simplefilter("ignore", cl.CompilerWarning)
    part1(devmod.get_device(), args)
    if args.onnx:
        part2(args)


if __name__ == "__main__":
    main()
