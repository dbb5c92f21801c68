"""Where a converted zoo net's forward spends its device time, kernel by
kernel (issue #27: batch 1 on GPUs). Builds the nets as bench_zoo.py does,
then enqueues every step's launches (a layer's or a fused group's ``fwd``
list) with profiling events, ``--iters`` times, and prints per net the
device time summed over kernels, the forward's wall time through
``net.forward()``, the host time of enqueueing alone, the time the device
takes for a forward already enqueued behind a gate (``gated_ms``: kernels
and the gaps between them, no host in the way), and the costliest
kernels (layer, kernel, global size, us).

    CAFFE_OCL_PROFILE=1 python benchmarks/profile_zoo_kernels.py --nets resnet18 --batch 1
    ... --torch    # also PyTorch eager's kernels for the same net (torch.profiler, GPU)
    ... --hot      # also each launch run back to back: in-net against hot-cache time

Steps whose run() does more than enqueue their ``fwd`` list are timed as
their list only (the totals say how far that is from the real forward).
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import bench_zoo  # noqa: E402
from common import hold_queue, release  # noqa: E402


def step_launches(net):
    """[(label, launch)] of one forward, in order: the launches a replayed
    forward enqueues where the net's whole forward is one recorded trace
    (plan/trace.py; without the BatchNorm statistics a chain recomputes
    only after its blobs changed), else the steps' ``fwd`` lists without
    the launches that run only when a weight changed (ops.conv.OnChange:
    the CPU's packed copies of convolution weights)."""
    from caffe_ocl.ops.conv import OnChange
    from caffe_ocl.plan import execution
    out = []
    names = net.graph.layer_names
    for li, action in net.plan.forward_schedule(0, len(net.layers) - 1):
        if action is execution.SKIP:
            continue
        src = net.layers[li] if action is execution.LAYER else action
        fwd = getattr(src, "fwd", None) or ()
        for ln in (fwd if isinstance(fwd, (list, tuple)) else [fwd]):
            if not isinstance(ln, OnChange):
                out.append((names[li], ln))
    trace = bench_zoo.whole_forward_trace(net)
    if trace is not None:
        label = {id(ln): lab for lab, ln in out}
        out = [(label.get(id(ln), "?"), ln) for e in trace.entries for ln in e.launches
               if not isinstance(ln, OnChange)]
    return out


def profile(net, iters):
    import pyopencl as cl
    q = net.layers[0].device.queue
    launches = step_launches(net)
    for _, ln in launches:
        if ln.kernel is None:       # programs build at a launch's first run
            ln.bind()
    per = {}
    for _ in range(iters):
        q.finish()
        evs = [(lab, ln, cl.enqueue_nd_range_kernel(q, ln.kernel, ln.gsize, ln.lsize))
               for lab, ln in launches]
        q.finish()
        for i, (lab, ln, ev) in enumerate(evs):
            us = (ev.profile.end - ev.profile.start) * 1e-3
            per.setdefault(i, (lab, ln, []))[2].append(us)
    rows = [(statistics.median(v), lab, ln) for lab, ln, v in per.values()]
    return rows


def hot_us(dev, rows, repeats=12):
    """Per row of ``profile`` (same order): the median us of its launch run
    ``repeats`` times back to back (the first third dropped), its inputs
    and outputs then in cache and the device's threads awake -- against
    the in-net time it says how much of a kernel's time in the forward is
    the kernel itself and how much the memory and scheduling state the
    forward leaves it (issue #27, the CPU's gap to ONNX Runtime)."""
    import pyopencl as cl
    q = dev.queue
    out = []
    for _, _, ln in rows:
        q.finish()
        evs = [cl.enqueue_nd_range_kernel(q, ln.kernel, ln.gsize, ln.lsize)
               for _ in range(repeats)]
        q.finish()
        out.append(statistics.median((e.profile.end - e.profile.start) * 1e-3
                                     for e in evs[repeats // 3:]))
    return out


def gated_ms(net, iters):
    """Median ms from releasing a queue that already holds one forward's
    launches (all enqueued behind a barrier on a user event) to its end:
    the GPU's own time for the forward, the gaps between kernels included
    and no host enqueue in the way -- what a recorded command list could
    at best approach. Against ``forward`` it says whether a batch-1
    forward waits on the host or on the device's kernels and gaps."""
    dev = net.layers[0].device
    q = dev.queue
    launches = [ln for _, ln in step_launches(net)]
    times = []
    for _ in range(iters):
        q.finish()
        gate = hold_queue(dev.context, q)
        for ln in launches:
            ln.run(q)
        t0 = time.perf_counter()
        release(gate)
        q.finish()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def gated_gaps_us(net, iters):
    """Median over passes of (the sum, the median) of the gaps in us from one
    kernel's end to the next one's start, the forward's launches released
    at once behind a user event (profiling events: the driver's own time
    between kernels, the host's enqueues out of the way)."""
    import pyopencl as cl
    dev = net.layers[0].device
    q = dev.queue
    launches = [ln for _, ln in step_launches(net)]
    sums, meds = [], []
    for _ in range(iters):
        q.finish()
        gate = hold_queue(dev.context, q)
        evs = [cl.enqueue_nd_range_kernel(q, ln.kernel, ln.gsize, ln.lsize) for ln in launches]
        release(gate)
        q.finish()
        gaps = [(b.profile.start - a.profile.end) * 1e-3 for a, b in zip(evs, evs[1:])]
        if gaps:
            sums.append(sum(gaps))
            meds.append(statistics.median(gaps))
    return (statistics.median(sums), statistics.median(meds)) if sums else (0.0, 0.0)


def torch_profile(model, x, tf32, top):
    """PyTorch eager's own kernels for the same forward (cuDNN, cuBLAS and
    its elementwise kernels), from torch.profiler, summed per kernel name:
    the reference that a net's slow launches are set against."""
    import torch
    from torch.profiler import ProfilerActivity, profile as tprofile
    bench_zoo.set_torch_tf32(tf32)
    torch.backends.cudnn.benchmark = True
    model = model.cuda().eval()
    x = torch.from_numpy(x).cuda()
    with torch.no_grad():
        for _ in range(5):
            model(x)
        torch.cuda.synchronize()
        iters = 5
        with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                model(x)
            torch.cuda.synchronize()
    rows = [(e.device_time_total / iters, e.count // iters, e.key)
            for e in prof.key_averages() if e.device_time_total > 0]
    total = sum(r[0] for r in rows)
    print(f"torch eager kernels {total / 1e3:.3f} ms ({sum(r[1] for r in rows)} launches)")
    for us, n, key in sorted(rows, reverse=True)[:top]:
        print(f"  {us:8.1f} us  x{n:<3d} {key[:90]}")


def host_split(net, runs=20):
    """(ms of the full layer walk, ms of enqueueing the same launches from a
    flat list, ms of as many enqueues of one tiny kernel): how much of the
    host cost is the walk and how much the enqueue calls themselves."""
    q = net.layers[0].device.queue
    flat = [ln for _, ln in step_launches(net)]
    walk, _ = bench_zoo.host_cost(net, runs)
    tiny = flat[0]
    for ln in flat:
        if ln.gsize and ln.gsize[0] * (ln.gsize[1] if len(ln.gsize) > 1 else 1) <= 256:
            tiny = ln
            break

    def loop(seq):
        total = 0.0
        for _ in range(runs):
            q.finish()
            t0 = time.perf_counter()
            for ln in seq:
                ln.run(q)
            total += time.perf_counter() - t0
            q.finish()
        return total / runs * 1e3
    return walk, loop(flat), loop([tiny] * len(flat)), len(flat)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nets", default="resnet18,alexnet,vgg16")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--hot", action="store_true",
                    help="also time each launch run back to back (hot caches, threads awake)")
    ap.add_argument("--cpu", action="store_true", help="CPU device (a check of the script)")
    ap.add_argument("--export-dir", help="reuse/keep the exported ONNX files here")
    ap.add_argument("--host-only", action="store_true",
                    help="no kernel profile (run without CAFFE_OCL_PROFILE): only how the "
                         "host cost splits between the layer walk and the enqueues")
    ap.add_argument("--torch", action="store_true",
                    help="also PyTorch eager's kernels for the same net (GPU)")
    ap.add_argument("--opset", type=int, default=13,
                    help="ONNX opset of the export (14: attention)")
    ap.add_argument("--extension-layers", action="store_true",
                    help="convert with caffe_ocl's extension layers (MatMul, Permute)")
    args = ap.parse_args()
    import tempfile

    import caffe_ocl
    from caffe_ocl.onnx import to_caffe
    caffe_ocl.set_mode_cpu() if args.cpu else caffe_ocl.set_mode_gpu()
    dev = caffe_ocl.get_device()
    ext = dev.cl_device.extensions.split()
    print(f"# {dev.name}: {len(ext)} extensions; command buffers: "
          f"{[e for e in ext if 'command_buffer' in e] or 'none'}")
    print("# " + " ".join(ext))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = args.export_dir or tmp
        os.makedirs(tmp, exist_ok=True)
        for name in args.nets.split(","):
            model = bench_zoo.build_model(name)
            path = bench_zoo.export_onnx(model, name, args.batch, 224, tmp, opset=args.opset)
            x = np.random.default_rng(0).standard_normal(
                (args.batch, 3, 224, 224)).astype(np.float32)
            net = bench_zoo.make_net(
                to_caffe.convert(path, batch=args.batch,
                                 extension_layers=args.extension_layers), x, args.tf32)
            fwd = bench_zoo.ours_timer(net)
            wall = bench_zoo.mean_ms(fwd, 3, 20)
            if args.host_only:
                walk, flat, tiny, n = host_split(net)
                print(f"## {name} b{args.batch}: forward {wall:.3f} ms; host: layer walk "
                      f"{walk:.3f} ms, the same {n} launches from a flat list {flat:.3f} ms, "
                      f"{n} enqueues of one tiny kernel {tiny:.3f} ms")
                continue
            host, n = bench_zoo.host_cost(net, 20)
            rows = profile(net, args.iters)
            dev_ms = sum(r[0] for r in rows) / 1e3
            gated = gated_ms(net, args.iters)
            gap_sum, gap_med = gated_gaps_us(net, args.iters)
            print(f"\n## {name} b{args.batch}: forward {wall:.3f} ms, kernels {dev_ms:.3f} ms "
                  f"({len(rows)} launches), host enqueue {host:.3f} ms, "
                  f"gated queue {gated:.3f} ms (gaps between kernels {gap_sum / 1e3:.3f} ms, "
                  f"median {gap_med:.1f} us)")
            by_kernel = {}
            for us, lab, ln in rows:
                t, c = by_kernel.get(ln.name, (0.0, 0))
                by_kernel[ln.name] = (t + us, c + 1)
            print("by kernel (ms, launches): " + ", ".join(
                f"{k} {v[0] / 1e3:.3f}/{v[1]}"
                for k, v in sorted(by_kernel.items(), key=lambda e: -e[1][0])))
            hot = hot_us(net.layers[0].device, rows) if args.hot else None
            if hot:
                print(f"kernels run back to back (--hot): {sum(hot) / 1e3:.3f} ms, in-net / "
                      f"hot {dev_ms * 1e3 / max(sum(hot), 1e-9):.2f}")
            order = sorted(range(len(rows)), key=lambda i: -rows[i][0])[:args.top]
            for i in order:
                us, lab, ln = rows[i]
                extra = f" hot {hot[i]:7.1f} us" if hot else ""
                print(f"  {us:8.1f} us{extra}  {lab:28s} {ln.name:22s} g{ln.gsize} l{ln.lsize}")
            del net, fwd
            if args.torch:
                torch_profile(model, x, args.tf32, args.top)
    return 0


if __name__ == "__main__":
    t0 = time.time()
    rc = main()
    print(f"# {time.time() - t0:.0f} s")
    sys.exit(rc)
