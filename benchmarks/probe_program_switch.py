"""What a CPU OpenCL driver spends between two kernels of a queue, by
whether the next kernel is the same kernel object, another object of the
same program, or a kernel of another program (BENCHMARKS.md, thirty-fifth
session: on PoCL 3.1 switching programs is most of a MobileNet forward's
gaps). Every launch is enqueued before the first runs (the host's enqueue
out of the way); the gap is one kernel's profiled end to the next one's
start, median over --reps passes of --launches launches.

    python3 benchmarks/probe_program_switch.py [--device pthread] [--reps 8]
"""
import argparse
import statistics

import numpy as np
import pyopencl as cl

SRC = ("__kernel void k(__global float* a, int n) { int i = get_global_id(0); float s = %d; "
       "for (int j = 0; j < n; ++j) s += a[(i * 64 + j) %% 4096]; a[i] = s; }")


def median_gap_us(queue, kernels, launches, reps, work_items):
    gaps = []
    for _ in range(reps):
        queue.finish()
        evs = [cl.enqueue_nd_range_kernel(queue, kernels[i % len(kernels)], (work_items,), (1,))
               for i in range(launches)]
        queue.finish()
        gaps += [(b.profile.start - a.profile.end) * 1e-3 for a, b in zip(evs, evs[1:])]
    return statistics.median(gaps)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="",
                    help="part of the device name (default: the first CPU driver but Oclgrind)")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--launches", type=int, default=60)
    ap.add_argument("--work-items", type=int, default=8)
    ap.add_argument("--loop", type=int, default=20000, help="loads per work-item (kernel length)")
    args = ap.parse_args(argv)
    devs = [d for p in cl.get_platforms() for d in p.get_devices()
            if args.device.lower() in d.name.lower() and d.type & cl.device_type.CPU
            and (args.device or "Oclgrind" not in d.name)]     # a simulator's gaps mean nothing
    if not devs:
        ap.exit(2, "probe_program_switch.py: no CPU OpenCL driver found\n")
    ctx = cl.Context(devs[:1])
    q = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * 4096)
    progs = [cl.Program(ctx, SRC % i).build() for i in range(40)]
    one = cl.Kernel(progs[0], "k")
    cases = [("same kernel object", [one]),
             ("two objects of one program", [one, cl.Kernel(progs[0], "k")]),
             ("2 programs", [cl.Kernel(p, "k") for p in progs[1:3]]),
             ("8 programs", [cl.Kernel(p, "k") for p in progs[3:11]]),
             ("40 programs", [cl.Kernel(p, "k") for p in progs])]
    print(f"# {devs[0].name}: {args.launches} launches of {args.work_items} work-items")
    for name, kernels in cases:
        for k in kernels:
            k.set_args(buf, np.int32(args.loop))
        gap = median_gap_us(q, kernels, args.launches, args.reps, args.work_items)
        print(f"{name:28s} median gap {gap:6.1f} us")


if __name__ == "__main__":
    main()
