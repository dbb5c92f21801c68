"""Kernel launches per forward of converted torchvision nets (issue #27
item 3), counted exactly: every command ``Launch.run`` / upload / download
enqueues during one ``net.forward_from_to`` over the whole net (after a
warm-up forward) is recorded through ``caffe_ocl.device.record_events``.
Optionally (``--runs``) times the host work per forward (bench_zoo.host_cost:
the layer walk and every enqueue, the queue drained before and after; the
best of ``--rounds``) and the forward (``net.forward()``, median round),
interleaved with a net built with ``--ab``'s settings as the base.

    python benchmarks/count_launches.py [--nets a,b] [--batch 1] [--size 64]
        [--export-dir DIR] [--runs N] [--rounds R] [--ab NAME=V,...]

The nets are built, exported and converted as benchmarks/bench_zoo.py does
(seeded weights, opset 13); torch and torchvision must be installed.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_zoo  # noqa: E402

NETS = "densenet121,googlenet,shufflenet_v2_x1_0,efficientnet_b0"


def count(net):
    """(commands enqueued by one forward, of them kernel launches)."""
    from caffe_ocl import device
    n = len(net.layers) - 1
    net.forward_from_to(0, n)
    sink = []
    with device.record_events(sink):
        net.forward_from_to(0, n)
    net.layers[0].device.queue.finish()
    kernels = sum(1 for ev in sink if "NDRANGE" in _kind(ev))
    return len(sink), kernels


def _kind(ev):
    import pyopencl as cl
    try:
        return cl.command_type.to_string(ev.command_type)
    except Exception:  # noqa: BLE001 -- an event without a type string
        return ""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nets", default=NETS)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--export-dir", default=os.path.join(tempfile.gettempdir(), "zoo_onnx"))
    ap.add_argument("--runs", type=int, default=0, help="timed forwards per round (0: none)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ab", default="", help="NAME=VALUE,... settings of the base net")
    args = ap.parse_args(argv)
    os.makedirs(args.export_dir, exist_ok=True)
    from caffe_ocl.onnx import to_caffe
    ab = [p for p in args.ab.split(",") if p]
    print("| net | commands | kernel launches | base launches | host enqueue ms | forward ms "
          "| base ms |")
    print("|---|---|---|---|---|---|---|")
    for name in args.nets.split(","):
        model = bench_zoo.build_model(name)
        path = bench_zoo.export_onnx(model, name, args.batch, args.size, args.export_dir)
        net_param = to_caffe.convert(path, batch=args.batch)
        x = np.random.default_rng(2).standard_normal(
            (args.batch, 3, args.size, args.size)).astype(np.float32)
        net = bench_zoo.make_net(net_param, x, False)
        cmds, kernels = count(net)
        base = None
        if ab:
            with bench_zoo.config_override(ab):
                base = bench_zoo.make_net(net_param, x, False)
            base_kernels = count(base)[1]
        ms = base_ms = host = ""
        if args.runs:
            host = f"{min(bench_zoo.host_cost(net, args.runs)[0] for _ in range(args.rounds)):.2f}"
            timers = {"ours": bench_zoo.ours_timer(net)}
            if base is not None:
                timers["base"] = bench_zoo.ours_timer(base)
            got = {k: [] for k in timers}
            for _ in range(args.rounds):
                for k, fn in timers.items():
                    got[k].append(bench_zoo.mean_ms(fn, 1, args.runs))
            ms = f"{statistics.median(got['ours']):.2f}"
            if base is not None:
                base_ms = f"{statistics.median(got['base']):.2f}"
        print(f"| {name} | {cmds} | {kernels} | {base_kernels if ab else ''} | {host} | {ms} "
              f"| {base_ms} |",
              flush=True)
    return 0


if __name__ == "__main__":
    t0 = time.time()
    rc = main()
    print(f"({time.time() - t0:.0f} s)", file=sys.stderr)
    sys.exit(rc)
