"""Host cost of one kernel enqueue, by way of calling OpenCL (issue #27 item 3).

At batch 1 the H200 forward waits on the host: ~13 us per launch through
pyopencl's ``enqueue_nd_range_kernel``. This times N enqueues of one tiny
kernel (one work-group) through
  pyopencl   -- cl.enqueue_nd_range_kernel (returns a wrapped event)
  ctypes+ev  -- clEnqueueNDRangeKernel via ctypes, event returned and released
  ctypes     -- clEnqueueNDRangeKernel via ctypes, no event (NULL)
with the queue drained before and after; prints us per enqueue and the
ratio to pyopencl measured in the same run.

    python3 benchmarks/bench_enqueue.py [--n 2000] [--rounds 5]
"""
import argparse
import ctypes
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402
import pyopencl as cl  # noqa: E402

from caffe_ocl import cl_enqueue, device as devmod  # noqa: E402


SRC = """
__kernel void tiny(__global float *x, int n) {
    int i = get_global_id(0);
    if (i < n) x[i] = x[i] * 0.5f + 1.0f;
}
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    dev = devmod.get_device()
    ctx, q = dev.context, dev.queue
    prg = cl.Program(ctx, SRC).build()
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * 256)
    k = prg.tiny
    k.set_args(buf, np.int32(256))
    fast = cl_enqueue.direct_enqueue_fn()
    print(f"device: {dev.name}; direct enqueue: {fast is not None}")
    gs, ls = (64,), (64,)

    def t_pyopencl():
        for _ in range(args.n):
            cl.enqueue_nd_range_kernel(q, k, gs, ls)

    lib = cl_enqueue.opencl_library()
    enq = lib.clEnqueueNDRangeKernel
    enq.restype = ctypes.c_int32
    enq.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p,
                    ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p,
                    ctypes.c_void_p]
    rel = lib.clReleaseEvent
    rel.argtypes = [ctypes.c_void_p]
    qp, kp = q.int_ptr, k.int_ptr
    g = (ctypes.c_size_t * 1)(64)
    l_ = (ctypes.c_size_t * 1)(64)

    def t_ctypes_ev():
        ev = ctypes.c_void_p()
        ref = ctypes.byref(ev)
        for _ in range(args.n):
            enq(qp, kp, 1, None, g, l_, 0, None, ref)
            rel(ev)

    def t_ctypes():
        for _ in range(args.n):
            enq(qp, kp, 1, None, g, l_, 0, None, None)

    launch = devmod.Launch(k, gs, ls, name="tiny")

    def t_launch():
        for _ in range(args.n):
            launch.run(q)

    ways = [("pyopencl", t_pyopencl), ("ctypes+ev", t_ctypes_ev), ("ctypes", t_ctypes),
            ("Launch.run", t_launch)]
    best = {}
    for _ in range(args.rounds):
        for name, fn in ways:
            q.finish()
            t0 = time.perf_counter()
            fn()
            t1 = time.perf_counter()
            q.finish()
            t2 = time.perf_counter()
            us = (t1 - t0) / args.n * 1e6
            best.setdefault(name, []).append((us, (t2 - t0) / args.n * 1e6))
    base = min(b[0] for b in best["pyopencl"])
    print(f"| way | enqueue us (best of {args.rounds}) | incl. drain us | pyopencl/way |")
    print("|---|---|---|---|")
    for name, _ in ways:
        e = min(b[0] for b in best[name])
        d = min(b[1] for b in best[name])
        print(f"| {name} | {e:.2f} | {d:.2f} | {base / e:.2f} |")


if __name__ == "__main__":
    main()
