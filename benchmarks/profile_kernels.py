"""Where a real training step (or inference pass) spends its device time,
by kernel: every launch of the step is timed by OpenCL profiling events
(a queue with CL_QUEUE_PROFILING_ENABLE, CAFFE_OCL_PROFILE=1), so fused
chains, memory-plan sharing and algorithm choices are those of
``solver.step`` itself (profile_layers.py times layers one by one,
unfused). Also prints the step's wall time: wall minus the kernels' sum is
time the device sat idle (host overhead, transfers, gaps).

    python3 benchmarks/profile_kernels.py --nets resnet50 --batch 64 [--infer] [--by-layer]
    python3 benchmarks/profile_kernels.py --zoo resnet50 --batch 64 [--tf32] [--torch]

``--zoo`` profiles the training step of converted torchvision nets instead
(bench_zoo_train.py's TRAIN net: exported with BatchNorm kept, converted,
a SoftmaxWithLoss appended; torch/torchvision needed); ``--torch`` then
also lists PyTorch's kernels for the same training step (torch.profiler,
GPU only) by kernel name, for a side-by-side comparison.

``--by-layer`` also charges each launch to the layer the net was running
(forward or backward; a fused chain's launches go to its first layer) and
prints per-layer times, with each Convolution's shape and TFLOP/s (the
direct-convolution count); ``--json F`` writes those rows to F (for a
per-layer comparison against another framework).
"""
import argparse
import collections
import json
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

    def __init__(self, by_layer=False):
        self.events = None
        self.by_layer = by_layer
        rec = self

        def run(launch, queue):
            if launch.kernel is None:       # programs build at a launch's first run
                launch.bind()
            ev = cl.enqueue_nd_range_kernel(queue, launch.kernel, launch.gsize, launch.lsize)
            if rec.events is not None:
                rec.events.append((launch, ev, rec.where() if rec.by_layer else None))
            return ev
        device_mod.Launch.run = run

    @staticmethod
    def where():
        """("F" or "B", layer index) of the net loop that enqueued the
        current launch (None outside one: the solver's update)."""
        f = sys._getframe(2)
        while f is not None:
            name = f.f_code.co_name
            if name in ("forward_from_to", "backward_from_to") and "li" in f.f_locals:
                return ("F" if name == "forward_from_to" else "B", f.f_locals["li"])
            f = f.f_back
        return None

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
        self.where_ms = collections.defaultdict(float)
        for ln, e, w in evs:
            self.where_ms[w] += (e.profile.end - e.profile.start) * 1e-6 / iters
        return wall, [(ln, (e.profile.end - e.profile.start) * 1e-6 / iters) for ln, e, _ in evs]


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


def conv_row(layer):
    """Shape fields and FLOPs of a Convolution layer's forward (None for
    other layers)."""
    g = getattr(layer, "geom", None)
    if layer.type != "Convolution" or g is None:
        return None
    flops = 2 * g.num * g.out_channels * g.out_spatial * g.col_rows // g.groups
    return dict(num=g.num, c=g.channels, h=g.height, w=g.width, co=g.out_channels,
                kh=g.kh, kw=g.kw, sh=g.sh, sw=g.sw, ph=g.ph, pw=g.pw, groups=g.groups,
                ho=g.out_h, flops=flops)


def report_layers(net, where_ms, json_path=None):
    """Per-layer forward / backward ms, sorted by their sum; convolutions
    with their shape and TFLOP/s (forward: 1x the forward FLOPs, backward:
    2x, data and weight)."""
    rows = []
    for li, layer in enumerate(net.layers):
        f, b = where_ms.get(("F", li), 0.0), where_ms.get(("B", li), 0.0)
        if f == 0.0 and b == 0.0:
            continue
        rows.append(dict(name=net.graph.layer_names[li], type=layer.type, fwd_ms=f, bwd_ms=b,
                         conv=conv_row(layer)))
    other = where_ms.get(None, 0.0)
    print("\n| layer | type | fwd ms | bwd ms | shape (C,H,W -> Co, k/s/p) | fwd TFLOP/s | "
          "bwd TFLOP/s |\n|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: -(r["fwd_ms"] + r["bwd_ms"])):
        c, shape, tf, tb = r["conv"], "", "", ""
        if c:
            shape = (f"{c['c']},{c['h']},{c['w']} -> {c['co']}, {c['kh']}x{c['kw']}/"
                     f"{c['sh']}/{c['ph']}" + (f" g{c['groups']}" if c["groups"] > 1 else ""))
            tf = f"{c['flops'] / r['fwd_ms'] * 1e-9:.1f}" if r["fwd_ms"] else ""
            tb = f"{2 * c['flops'] / r['bwd_ms'] * 1e-9:.1f}" if r["bwd_ms"] else ""
        print(f"| {r['name']} | {r['type']} | {r['fwd_ms']:.3f} | {r['bwd_ms']:.3f} | "
              f"{shape} | {tf} | {tb} |")
    by_type = collections.defaultdict(lambda: [0.0, 0.0])
    for r in rows:
        by_type[r["type"]][0] += r["fwd_ms"]
        by_type[r["type"]][1] += r["bwd_ms"]
    print("\n| layer type | fwd ms | bwd ms |\n|---|---|---|")
    for t, (f, b) in sorted(by_type.items(), key=lambda kv: -sum(kv[1])):
        print(f"| {t} | {f:.2f} | {b:.2f} |")
    print(f"| (outside the net: solver update) | {other:.2f} | |")
    if json_path:
        with open(json_path, "w") as fh:
            json.dump(rows, fh, indent=1)


def profile_zoo_train(name, a, rec):
    """The training step of converted torchvision net ``name`` (as
    bench_zoo_train.py builds and checks it), by kernel; with ``a.torch``
    PyTorch's step too."""
    import tempfile
    import numpy as np
    import bench_zoo
    import bench_zoo_train
    from caffe_ocl import config
    model = bench_zoo.build_model(name, 0)
    model.eval()
    args = argparse.Namespace(size=a.size)
    with tempfile.TemporaryDirectory() as tmp:
        _, weights = bench_zoo.export_and_convert(model, name, a.batch, args, tmp, {}, ["fp32"],
                                                  print, keep_bn=True)
    if weights is None:
        return
    rng = np.random.default_rng(2)
    x = rng.standard_normal((a.batch, 3, a.size, a.size)).astype(np.float32)
    y = rng.integers(0, 1000, a.batch).astype(np.float32)
    with config.override(TF32=a.tf32):
        caffe_ocl.set_allow_tf32(a.tf32)
        solver = bench_zoo_train.make_solver(weights, weights)
        solver.net.blobs["data"].data[...] = x
        solver.net.blobs["label"].data[...] = y
        wall, recs = rec.measure(lambda: solver.step(1), solver.net.device, a.iters)
    report(f"{name} (converted) batch {a.batch} {'TF32' if a.tf32 else 'FP32'} training step",
           wall, recs, a.top)
    if rec.by_layer:
        report_layers(solver.net, rec.where_ms, a.json)
    if a.torch:
        profile_torch_train(model, x, y, a)


def profile_torch_train(model, x, y, a):
    """PyTorch's kernels for one training step of ``model`` (CUDA), by name."""
    import torch
    from torch.profiler import ProfilerActivity, profile as tprofile
    import bench_zoo
    import bench_zoo_train
    bench_zoo.set_torch_tf32(a.tf32)
    tdev = torch.device("cuda")
    model.to(tdev)
    bench_zoo_train.torch_train_mode(model)
    step = bench_zoo_train.torch_timer(model, x, y, tdev)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(a.iters):
            step()
        torch.cuda.synchronize()
    by_name = collections.defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            by_name[e.name][0] += e.device_time / 1e3 / a.iters
            by_name[e.name][1] += 1
    total = sum(v[0] for v in by_name.values())
    print(f"\n## PyTorch training step: kernels {total:.2f} ms")
    print("| kernel | ms | % | launches/step |\n|---|---|---|---|")
    for n, (ms, c) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:a.top]:
        print(f"| {n[:90]} | {ms:.2f} | {100 * ms / total:.1f} | {c / a.iters:.0f} |")
    model.to("cpu")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nets", default="resnet50")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--infer", action="store_true", help="deploy net forward instead")
    ap.add_argument("--by-layer", action="store_true", help="also per-layer times")
    ap.add_argument("--json", help="with --by-layer: write the per-layer rows here")
    ap.add_argument("--zoo", help="converted torchvision nets (comma list) instead of --nets")
    ap.add_argument("--size", type=int, default=224, help="--zoo: input size")
    ap.add_argument("--tf32", action="store_true", help="--zoo: TF32 on both sides")
    ap.add_argument("--torch", action="store_true", help="--zoo: PyTorch's kernels too (GPU)")
    a = ap.parse_args()
    rec = Recorder(by_layer=a.by_layer or bool(a.json))
    if a.zoo:
        for name in a.zoo.split(","):
            profile_zoo_train(name, a, rec)
        return
    for name in a.nets.split(","):
        if a.infer:
            proto = (CPU_NETS[name]["proto"] if name in CPU_NETS
                     else os.path.join("models", name, "deploy.prototxt"))
            net = deploy_net(proto, a.batch)
            wall, recs = rec.measure(lambda: net.forward_from_to(0, len(net.layers) - 1),
                                     net.device, a.iters)
            report(f"{name} batch {a.batch} inference", wall, recs, a.top)
            if rec.by_layer:
                report_layers(net, rec.where_ms, a.json)
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
            if rec.by_layer:
                report_layers(solver.net, rec.where_ms, a.json)


if __name__ == "__main__":
    main()
