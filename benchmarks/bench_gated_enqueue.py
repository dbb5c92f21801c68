"""Does enqueueing behind a gate (a user event) or from two threads make a
batch-1 forward's host cost smaller? (issue #27 item 3)

At batch 1 on NVIDIA's OpenCL a forward waits on the host: each
clEnqueueNDRangeKernel costs 5-15 us. ``profile_zoo_kernels.py``'s
"gated queue" showed that a queue holding a whole forward behind a user
event runs it at the kernels' own speed once released. This script asks
what the enqueue calls themselves cost when the queue is gated, and
whether two threads enqueueing into two queues go faster than one:

  tiny plain      N enqueues of a one-work-group kernel, queue running
  tiny gated      the same behind a barrier on a user event (time of the
                  enqueue calls; then release -> finish)
  tiny 2 threads  N/2 enqueues each from two threads into two queues
  net plain       one forward's launches from a flat list, as a replay does
  net gated       the same behind a gate: enqueue time + release -> finish
  net chunks C    gates every C launches, each released once the next chunk
                  is enqueued behind its own gate (device runs chunk i while
                  the host enqueues chunk i+1)

    python3 benchmarks/bench_gated_enqueue.py [--nets shufflenet_v2_x1_0,mobilenet_v2] [--cpu]
"""
import argparse
import os
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import pyopencl as cl  # noqa: E402

from common import hold_queue as gate, release  # noqa: E402

SRC = """
__kernel void tiny(__global float *x, int n) {
    int i = get_global_id(0);
    if (i < n) x[i] = x[i] * 0.5f + 1.0f;
}
"""


def _median_ms(fn, rounds):
    out = []
    for _ in range(rounds):
        out.append(fn())
    return statistics.median([o[0] for o in out]), statistics.median([o[1] for o in out])


def run_plain(q, seq, flush_every=None):
    """(enqueue ms, to-finish ms) of ``seq`` enqueued as it comes; with
    ``flush_every``, a clFlush after each that many launches."""
    step = flush_every or max(len(seq), 1)
    q.finish()
    t0 = time.perf_counter()
    for i in range(0, len(seq), step):
        for ln in seq[i:i + step]:
            ln.run(q)
        if flush_every:
            q.flush()
    t1 = time.perf_counter()
    q.finish()
    t2 = time.perf_counter()
    return (t1 - t0) * 1e3, (t2 - t0) * 1e3


def run_gated(ctx, q, seq):
    q.finish()
    t0 = time.perf_counter()
    g = gate(ctx, q)
    for ln in seq:
        ln.run(q)
    t1 = time.perf_counter()
    release(g)
    q.finish()
    t2 = time.perf_counter()
    return (t1 - t0) * 1e3, (t2 - t0) * 1e3


def run_chunked(ctx, q, seq, c):
    q.finish()
    t0 = time.perf_counter()
    prev = None
    for i in range(0, len(seq), c):
        g = gate(ctx, q)
        for ln in seq[i:i + c]:
            ln.run(q)
        if prev is not None:
            release(prev)
        prev = g
    t1 = time.perf_counter()
    release(prev)
    q.finish()
    t2 = time.perf_counter()
    return (t1 - t0) * 1e3, (t2 - t0) * 1e3


def tiny_tests(dev, n, rounds):
    from caffe_ocl import device as devmod
    ctx, q = dev.context, dev.queue
    prg = cl.Program(ctx, SRC).build()
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * 256)

    def launch():
        k = cl.Kernel(prg, "tiny")
        k.set_args(buf, np.int32(256))
        return devmod.Launch(k, (64,), (64,), name="tiny")
    seq = [launch() for _ in range(n)]
    for ln in seq[:2]:
        ln.run(q)
    q.finish()
    res = {}
    res["tiny plain"] = _median_ms(lambda: run_plain(q, seq), rounds)
    res["tiny gated"] = _median_ms(lambda: run_gated(ctx, q, seq), rounds)
    for c in (16, 64):
        res[f"tiny flush/{c}"] = _median_ms(lambda: run_plain(q, seq, flush_every=c), rounds)
    q2 = cl.CommandQueue(ctx)
    half = n // 2
    for ln in seq:
        ln.run(q2)
    q2.finish()

    def two_threads():
        q.finish()
        q2.finish()
        t = [0.0, 0.0]

        def work(qq, part, i):
            for ln in part:
                ln.run(qq)
            t[i] = time.perf_counter()
        t0 = time.perf_counter()
        th = threading.Thread(target=work, args=(q2, seq[half:], 1))
        th.start()
        work(q, seq[:half], 0)
        th.join()
        t1 = max(t)
        q.finish()
        q2.finish()
        return (t1 - t0) * 1e3, (time.perf_counter() - t0) * 1e3
    res["tiny 2 threads"] = _median_ms(two_threads, rounds)
    for k, (enq, tot) in res.items():
        print(f"{k:16s} n={n}: enqueue {enq:.3f} ms ({enq / n * 1e3:.2f} us/launch), "
              f"to finish {tot:.3f} ms")


def net_tests(name, batch, rounds, export_dir, tf32):
    import bench_zoo
    from profile_zoo_kernels import step_launches
    from caffe_ocl.onnx import to_caffe
    model = bench_zoo.build_model(name)
    path = bench_zoo.export_onnx(model, name, batch, 224, export_dir)
    x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)
    net = bench_zoo.make_net(to_caffe.convert(path, batch=batch), x, tf32)
    fwd = bench_zoo.ours_timer(net)
    wall = bench_zoo.mean_ms(fwd, 3, 20)
    dev = net.layers[0].device
    ctx, q = dev.context, dev.queue
    seq = [ln for _, ln in step_launches(net)]
    for ln in seq:
        ln.run(q)
    q.finish()
    n = len(seq)
    res = {"plain": _median_ms(lambda: run_plain(q, seq), rounds),
           "gated": _median_ms(lambda: run_gated(ctx, q, seq), rounds)}
    for c in (8, 16, 32):
        res[f"chunks {c}"] = _median_ms(lambda: run_chunked(ctx, q, seq, c), rounds)
        res[f"flush/{c}"] = _median_ms(lambda: run_plain(q, seq, flush_every=c), rounds)
    res["plain again"] = _median_ms(lambda: run_plain(q, seq), rounds)
    print(f"\n## {name} b{batch}: net.forward {wall:.3f} ms, {n} launches")
    for k, (enq, tot) in res.items():
        print(f"  {k:12s}: enqueue {enq:.3f} ms ({enq / n * 1e3:.2f} us/launch), "
              f"to finish {tot:.3f} ms")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nets", default="shufflenet_v2_x1_0,mobilenet_v2,resnet50")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--export-dir", default="/tmp/zx")
    args = ap.parse_args()
    import caffe_ocl
    caffe_ocl.set_mode_cpu() if args.cpu else caffe_ocl.set_mode_gpu()
    dev = caffe_ocl.get_device()
    print(f"# {dev.name}")
    os.makedirs(args.export_dir, exist_ok=True)
    tiny_tests(dev, args.n, args.rounds)
    for name in filter(None, args.nets.split(",")):
        net_tests(name, args.batch, args.rounds, args.export_dir, args.tf32)


if __name__ == "__main__":
    main()
