"""Converted torchvision zoo (issue #27): torchvision classification nets with
seeded random weights and random BatchNorm statistics (eval mode), exported
to ONNX (opset 13, ``dynamo=False``, static batch), converted with
``caffe_ocl.onnx.to_caffe.convert``, checked against PyTorch's output, then
timed through the public ``net.forward()`` (input set once through
``net.blobs[...].data``; every forward returns its outputs as host arrays,
so each timed pass ends with the device synchronised).

A --nets name torchvision.models lacks is looked up in
torchvision.models.segmentation (fcn_resnet50, deeplabv3_resnet50,
deeplabv3_mobilenet_v3_large, lraspp_mobilenet_v3_large: no auxiliary
head, the "out" logits; their upsamplings convert to Deconvolutions).
A name ``timm:NAME`` is ``timm.create_model(NAME)`` (random weights; timm is
not a dependency: ``pip install timm`` for these held-out architectures).

    python benchmarks/bench_zoo.py [--device gpu|cpu] [--nets a,b,...]
        [--batches 1,16,64] [--precisions fp32,tf32] [--runs 10] [--warmup 3]
        [--rounds 5] [--size 224] [--json OUT.json] [--export-dir DIR]
        [--tol 1e-3] [--tol-tf32 5e-2] [--threads N] [--ab NAME=V,...]
    python benchmarks/bench_zoo.py --smoke      # one tiny net, CPU, one round
    python benchmarks/bench_zoo.py --report A.json B.json ...   # one table

References, timed in the same run, interleaved (each round times caffe_ocl
and then every reference, ``--runs`` passes each after ``--warmup``; the
table gives each one's median round):
- ``--device gpu``: PyTorch eager (cudnn.benchmark=True) and PyTorch
  replaying a captured CUDA graph (torch.cuda.CUDAGraph), FP32 (TF32 off in
  both frameworks) and TF32 (``caffe_ocl.set_allow_tf32(True)``, PyTorch's
  torch.backends.cuda.matmul / cudnn allow_tf32 on). Every reference pass
  copies its output to the host, as ``net.forward()`` does. PyTorch runs
  in a child process (``--reference-process child``, the default), or in
  a child per net that times it first and has exited before caffe_ocl is
  timed (``apart``: no CUDA process alive beside ours; not interleaved),
  or in this process (``same``).
- ``--device cpu``: ONNX Runtime (CPUExecutionProvider, intra_op_num_threads
  = the number of cores, or ``--threads``) on the same ONNX file.

``--ab NAME=VALUE,...`` also times, interleaved, a caffe_ocl net built
with those settings (config.py; ``module.CONST=VALUE``: a rule constant of
caffe_ocl.ops.<module>) as the reference "base": base/ours is the
speedup of the current settings over them. After the table, the host work
per forward (the layer walk and kernel enqueues, device drained) against
the forward's time.

Ratio columns are reference time / caffe_ocl time (>= 1: caffe_ocl ahead);
below each ratio column the geometric mean and the worst net. Check
columns: largest |caffe_ocl - PyTorch| and that divided by max |PyTorch|
(FP32 against strict FP32 PyTorch; TF32 against PyTorch with TF32); where
that is above 1e-4, also each framework's relative distance from the same
model run in float64. A net passes when it is within the tolerance of
PyTorch, or no further from float64 than twice PyTorch's own distance
(random-weight MobileNet v3 / RegNetY logits are ill-conditioned: PyTorch's
float32 output is itself 3e-4 from the float64 one).
A net that fails to export, convert, or run, or whose relative error is
above the tolerance, is listed with the reason; the run goes on with the
next net. ``--json`` writes every record (rewritten after each net, so a run
cut short still leaves what it measured).
"""
import argparse
import contextlib
import gc
import json
import math
import os
import statistics
import sys
import tempfile
import time
import traceback
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

NETS = ["resnet18", "resnet50", "resnext50_32x4d", "wide_resnet50_2", "vgg16", "googlenet",
        "densenet121", "mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large",
        "efficientnet_b0", "shufflenet_v2_x1_0", "squeezenet1_1", "regnet_y_400mf",
        "mnasnet1_0", "alexnet"]
SMOKE_NET = "tiny"


def log(msg):
    print(msg, flush=True)


# --------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------

def tiny_model():
    """The --smoke net: conv-BN-ReLU, a depthwise conv, a residual add, an
    SE-like gate, global pooling and a Linear (a few layers, 16x16 input)."""
    import torch
    import torch.nn as nn

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8),
                                      nn.ReLU())
            self.dw = nn.Sequential(nn.Conv2d(8, 8, 3, 1, 1, groups=8, bias=False),
                                    nn.BatchNorm2d(8), nn.ReLU6())
            self.gate = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(8, 8, 1), nn.Sigmoid())
            self.fc = nn.Linear(8, 10)

        def forward(self, x):
            x = self.stem(x)
            x = x + self.dw(x)
            x = x * self.gate(x)
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))
    return Tiny()


def _segmentation_out(model):
    """A torchvision segmentation model returning its "out" tensor (the
    models return a dict, which ONNX export and the checks do not take)."""
    import torch

    class Out(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(x)["out"]
    return Out()


def build_model(name, seed=0):
    """torchvision model ``name`` (no pretrained weights, nothing downloaded)
    in eval mode with seeded weights that keep activations O(1) (He fan-in
    for convolutions, 1/sqrt(fan-in) for Linear) and seeded random BatchNorm
    running statistics and affine parameters."""
    import torch
    import torch.nn as nn
    torch.manual_seed(seed)
    if name == SMOKE_NET:
        model = tiny_model()
    else:
        import torchvision
        kw = {}
        if name == "googlenet":
            kw = dict(aux_logits=False, init_weights=False)
        elif name.startswith("inception"):
            kw = dict(aux_logits=False, init_weights=False)
        if name.startswith("timm:"):    # held-out architectures (pip install timm)
            import timm
            model = timm.create_model(name[5:], pretrained=False)
        elif hasattr(torchvision.models, name):
            model = getattr(torchvision.models, name)(weights=None, **kw)
        else:       # torchvision.models.segmentation: the per-pixel logits
            model = _segmentation_out(getattr(torchvision.models.segmentation, name)(
                weights=None, weights_backbone=None, aux_loss=False))
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                fan_in = m.weight[0].numel()
                gain = 2.0 if isinstance(m, nn.Conv2d) else 1.0
                m.weight.copy_(torch.randn(m.weight.shape, generator=g)
                               * math.sqrt(gain / fan_in))
                if m.bias is not None:
                    m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
            elif isinstance(m, nn.BatchNorm2d):
                c = m.num_features
                m.running_mean.copy_(torch.randn(c, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(c, generator=g) + 0.5)
                if m.weight is not None:
                    m.weight.copy_(torch.rand(c, generator=g) + 0.5)
                    m.bias.copy_(torch.randn(c, generator=g) * 0.1)
    return model.eval()


def export_onnx(model, name, batch, size, export_dir, keep_bn=False, opset=13):
    """Path of ``name`` exported at ``batch`` x 3 x size x size (opset 13
    unless given: attention exports from 14, static shapes); an existing
    file in ``export_dir`` is reused.
    ``keep_bn``: without constant folding, so that BatchNorm is not folded
    into the convolution before it (training nets, bench_zoo_train.py)."""
    import torch
    path = os.path.join(export_dir,
                        f"{name}_b{batch}_s{size}_op{opset}{'_bn' if keep_bn else ''}.onnx")
    if os.path.exists(path) and os.path.getsize(path) > 0:
        return path
    # on the model's device (a GPU run has moved it there after the first batch)
    x = torch.zeros(batch, 3, size, size, device=next(model.parameters()).device)
    tmp = path + ".part"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the TorchScript exporter's deprecation notice
        torch.onnx.export(model, (x,), tmp, opset_version=opset, dynamo=False,
                          input_names=["data"], output_names=["logits"],
                          do_constant_folding=not keep_bn)
    os.replace(tmp, path)
    return path


# --------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------

def mean_ms(fn, warmup, runs):
    """Mean milliseconds of ``fn`` (which returns only when its work is done)
    over ``runs`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    t0 = time.perf_counter()
    for _ in range(runs):
        fn()
    return (time.perf_counter() - t0) / runs * 1e3


# pause between two timers of a round: ONNX Runtime's pool threads spin for
# a while after a run (its default), and on 2 cores they took the CPU from
# whatever ran next (the timer after "ort" measured up to 1.5x slower)
SETTLE_S = 0.2


def interleave(timers, rounds, warmup, runs, settle=SETTLE_S):
    """{name: median over ``rounds`` of its mean ms}; each round times every
    timer in turn, so a slow spell of the machine falls on all of them. The
    order rotates from round to round (no timer always runs right after the
    same other one) and each timer starts after a ``settle`` s pause: on the
    2-core CPU the timer run right after ONNX Runtime read 23-30% slower
    than the same net timed after it (an A/A run, both nets caffe_ocl's;
    ORT's worker threads spin on after a run), which the fixed order
    (caffe_ocl first, ORT last) put on caffe_ocl in every round."""
    samples = {k: [] for k in timers}
    names = list(timers)
    for r in range(rounds):
        for k in names[r % len(names):] + names[:r % len(names)]:
            if settle:
                time.sleep(settle)
            samples[k].append(time_ms(timers[k], warmup if r == 0 else max(1, warmup // 3),
                                      runs))
    return {k: statistics.median(v) for k, v in samples.items()}, samples


def time_ms(timer, warmup, runs):
    """mean_ms of a local timer (a function), or of a timer that times
    itself elsewhere (an object with ``mean_ms``: TorchReference's timers,
    which run in the reference's own process)."""
    if hasattr(timer, "mean_ms"):
        return timer.mean_ms(warmup, runs)
    return mean_ms(timer, warmup, runs)


def ours_timer(net):
    out = net.outputs[0]

    def fn():
        return net.forward()[out]
    return fn


@contextlib.contextmanager
def config_override(pairs):
    """config.override of ``--ab``'s NAME=VALUE pairs; a dotted NAME
    (``gemm_splitk.MIN_CHUNK_FP32=512``) sets that rule constant of
    caffe_ocl.ops.<module> (or of caffe_ocl.<module>: ``plan.row_reduce.ROW_LANES=1``)
    instead (a number, or a string where the constant
    is one: ``depthwise.SRC=depthwise_old.cl`` builds that layer kind from
    another kernel file), for as long as the base net
    is built and first run (its launches keep what they were built with)."""
    import importlib

    from caffe_ocl import config
    settings, consts = {}, []
    for name, value in (p.split("=", 1) for p in pairs):
        if "." in name:
            mod, attr = name.rsplit(".", 1)
            try:
                module = importlib.import_module(f"caffe_ocl.ops.{mod}")
            except ModuleNotFoundError:
                module = importlib.import_module(f"caffe_ocl.{mod}")
            if not hasattr(module, attr):
                raise SystemExit(f"{name}: {module.__name__} has no {attr}")
            consts.append((module, attr, getattr(module, attr)))
            old = consts[-1][2]
            setattr(module, attr, value if isinstance(old, str) else type(old)(float(value)))
        else:
            settings[name] = value
    try:
        with config.override(**settings):
            yield
    finally:
        for module, attr, old in consts:
            setattr(module, attr, old)


def host_cost(net, runs):
    """(ms of host work per forward: the Python walk over the layers and
    every kernel enqueue, without waiting for the device; launches per
    forward: those of its recorded trace where one replays the whole
    forward, else the ``fwd`` lists of the layers and fused groups that
    run).
    The queue is drained before and after each pass, so the device's own
    time is not in it."""
    from caffe_ocl.ops.conv import OnChange
    from caffe_ocl.plan import execution
    q = net.layers[0].device.queue
    n = 0
    for li, action in net.plan.forward_schedule(0, len(net.layers) - 1):
        if action is not execution.SKIP:
            src = net.layers[li] if action is execution.LAYER else action
            fwd = getattr(src, "fwd", None) or ()
            fwd = fwd if isinstance(fwd, (list, tuple)) else [fwd]
            # not the CPU's packed weight copies, which run when weights change
            n += sum(1 for ln in fwd if not isinstance(ln, OnChange))
    total = 0.0
    for _ in range(max(runs, 1)):
        q.finish()
        t0 = time.perf_counter()
        net.forward_from_to(0, len(net.layers) - 1)
        total += time.perf_counter() - t0
        q.finish()
    # a forward replayed from one recorded trace enqueues what was recorded
    # (a BatchNorm chain's statistics launch only after its blobs changed)
    trace = whole_forward_trace(net)
    if trace is not None:
        n = trace.launches
    return round(total / max(runs, 1) * 1e3, 4), n


def whole_forward_trace(net):
    """The recorded trace (plan/trace.py) that replays ``net``'s whole
    forward with no live step between its segments, or None."""
    trace = _active_trace(net)
    if trace is not None and all(hasattr(e, "launches") for e in trace.entries):
        return trace
    return None


def _active_trace(net):
    """The recorded trace replaying ``net``'s whole forward, or None."""
    tracer = getattr(net, "_tracer", None)
    return tracer.active.get((0, len(net.layers) - 1)) if tracer else None


def trace_state(net):
    """How the steady forward runs: "replayed" (one recorded trace, no live
    step), "N live" (a trace with N steps run live between its segments),
    or "not replayed" (recorded again every pass: something the trace
    depends on moves each forward, and the host walks every layer)."""
    trace = _active_trace(net)
    if trace is None:
        return "not replayed"
    live = sum(1 for e in trace.entries if not hasattr(e, "launches"))
    return f"{live} live" if live else "replayed"


def torch_eager_timer(model, x):
    import torch

    def fn():
        with torch.no_grad():
            return model(x).cpu()
    return fn


def torch_graph_timer(model, x):
    """Replay of a CUDA graph captured from the model (static input/output),
    output copied to the host."""
    import torch
    static_x = x.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(3):
            model(static_x)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        static_y = model(static_x)

    def fn():
        graph.replay()
        return static_y.cpu()
    fn.graph = graph
    return fn


# --------------------------------------------------------------------------
# PyTorch in a process of its own (GPU runs)
# --------------------------------------------------------------------------
#
# A process in which PyTorch has run CUDA work enqueues OpenCL kernels more
# slowly: on the H200 (driver 580.159) caffe_ocl's batch-1 forwards took
# 1.5-1.6x longer, all of it host enqueue time, once PyTorch had run the
# same nets in that process (benchmarks/bench_zoo.py --reference-process
# same shows it). A caffe_ocl user's process has no CUDA context at work,
# and a PyTorch user's no OpenCL one, so by default each framework runs in
# its own process: the references are timed by a child that the rounds
# still interleave with caffe_ocl (one side idles while the other is timed).

def _reference_worker(conn, seed, device):
    """The child's loop: requests from TorchReference, answers on ``conn``."""
    import torch
    torch.backends.cudnn.benchmark = True
    tdev = torch.device(device)
    state = {}
    while True:
        msg = conn.recv()
        op = msg[0]
        try:
            if op == "quit":
                break
            if op == "load":
                _, name, x, tf32 = msg
                state.clear()
                torch.cuda.empty_cache()
                if tdev.type == "cuda":
                    set_torch_tf32(tf32)
                model = build_model(name, seed).to(tdev)
                xt = torch.from_numpy(x).to(tdev)
                with torch.no_grad():
                    ref = model(xt).float().cpu().numpy()
                ref64 = exact_reference(model, x, tdev)
                state["eager"] = torch_eager_timer(model, xt)
                graph_error = None
                try:
                    state["graph"] = torch_graph_timer(model, xt)
                except Exception as e:  # noqa: BLE001 -- reported in the record
                    graph_error = f"{type(e).__name__}: {e}"
                conn.send(("ok", (ref, ref64, graph_error)))
            elif op == "time":
                _, which, warmup, runs = msg
                conn.send(("ok", mean_ms(state[which], warmup, runs)))
            else:
                conn.send(("error", f"unknown request {op!r}"))
        except Exception as e:  # noqa: BLE001 -- passed back to the parent
            conn.send(("error", f"{type(e).__name__}: {e}"))


class TorchReference:
    """PyTorch eager and CUDA-graph timers of one model, run by a child
    process (see the note above ``_reference_worker``)."""

    def __init__(self, seed, device="cuda"):
        import multiprocessing as mp
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_reference_worker, args=(child, seed, device),
                                daemon=True)
        self.proc.start()
        child.close()

    def _ask(self, *msg):
        try:
            self.conn.send(msg)
            status, value = self.conn.recv()
        except (EOFError, OSError) as e:
            raise RuntimeError(f"PyTorch reference process ended (exit code "
                               f"{self.proc.exitcode}): {e}") from None
        if status != "ok":
            raise RuntimeError(f"PyTorch reference process: {value}")
        return value

    def load(self, name, x, tf32):
        """(float32 output, float64 output, graph capture error or None) of
        ``name`` on ``x``; its timers are then "eager" and "graph"."""
        return self._ask("load", name, x, tf32)

    def timer(self, which):
        ref = self

        class _Remote:
            def mean_ms(self, warmup, runs):
                return ref._ask("time", which, warmup, runs)
        return _Remote()

    def close(self):
        try:
            self.conn.send(("quit",))
        except OSError:
            pass
        self.proc.join(30)


def time_reference_apart(name, x, tf32, args):
    """(float32 output, float64 output, graph capture error, {timer: median
    ms}, {timer: samples}) of PyTorch on ``name``, timed by a child process
    of its own that has ended when this returns (``--reference-process
    apart``)."""
    ref_proc = TorchReference(args.seed)
    try:
        ref, ref64, graph_error = ref_proc.load(name, x, tf32)
        timers = {"eager": ref_proc.timer("eager")}
        if graph_error is None:
            timers["graph"] = ref_proc.timer("graph")
        med, samples = interleave(timers, args.rounds, args.warmup, args.runs)
    finally:
        ref_proc.close()
    return ref, ref64, graph_error, med, samples


def ort_timer(path, x, threads):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    feed = {sess.get_inputs()[0].name: x}

    def fn():
        return sess.run(None, feed)[0]
    return fn


def set_torch_tf32(flag):
    import torch
    torch.backends.cuda.matmul.allow_tf32 = flag
    torch.backends.cudnn.allow_tf32 = flag


# --------------------------------------------------------------------------
# one net
# --------------------------------------------------------------------------

def errors(got, ref):
    got = np.asarray(got, np.float64).reshape(ref.shape)
    ref = np.asarray(ref, np.float64)
    err = float(np.max(np.abs(got - ref)))
    scale = float(np.max(np.abs(ref))) or 1.0
    return err, err / scale


def exact_reference(model, x, tdev):
    """The model's output computed in float64 (the same weights, on the same
    torch device; the model is put back to float32 afterwards)."""
    import torch
    with torch.no_grad():
        out = model.double()(torch.from_numpy(x).double().to(tdev)).cpu().numpy()
    model.float()
    return out


def check_ok(rec, tol):
    """Whether caffe_ocl's output passes: within ``tol`` (relative to the
    largest |logit|) of PyTorch at the same precision, or -- for nets whose
    random-weight logits are ill-conditioned (MobileNet v3, RegNetY: logits
    of 1e3-1e4 from cancelling sums) -- no further from the float64 result
    than twice PyTorch's own distance from it (then PyTorch's float32
    output is itself that far from the exact one, and a difference between
    the two frameworks says nothing about either)."""
    if rec["err_rel"] <= tol:
        return True
    return rec["err64_rel"] <= max(tol, 2.0 * rec["ref_err64_rel"])


def make_net(net_param, x, tf32):
    import caffe_ocl
    from caffe_ocl.onnx import check
    caffe_ocl.set_allow_tf32(tf32)
    # the converter's deploy net + copy_from of its weights (Net(NetParameter)
    # does not take the weight blobs that the layers carry)
    net = check.caffe_net(net_param)
    net.blobs[net.inputs[0]].data[...] = x
    return net


def build_or_report(name, args, precisions, emit):
    """The seeded model ``name``, or None after a "build failed" record for
    each batch and precision (the net's other records never come)."""
    try:
        return build_model(name, args.seed)
    except Exception as e:  # noqa: BLE001 -- reported in the table
        for b in args.batches:
            for p in precisions:
                emit(dict(net=name, batch=b, precision=p, status="build failed",
                          error=f"{type(e).__name__}: {e}"))
        return None


def export_and_convert(model, name, batch, args, export_dir, base, precisions, emit,
                       keep_bn=False):
    """``model`` exported at ``batch`` (export_onnx) and converted: (the
    ONNX file's path, the NetParameter), ``base`` given export_s and
    convert_s; or (None, None) after a record of the step that failed for
    each precision."""
    from caffe_ocl.onnx import to_caffe
    step = "export failed"
    try:
        t0 = time.time()
        path = export_onnx(model, name, batch, args.size, export_dir, keep_bn=keep_bn,
                           opset=getattr(args, "opset", 13))
        t_export = time.time() - t0
        step = "convert failed"
        t0 = time.time()
        net_param = to_caffe.convert(path, batch=batch,
                                     extension_layers=getattr(args, "extension_layers", False))
        t_convert = time.time() - t0
    except Exception as e:  # noqa: BLE001
        for p in precisions:
            emit(dict(base, precision=p, status=step, error=f"{type(e).__name__}: {e}"))
        return None, None
    base.update(export_s=round(t_export, 2), convert_s=round(t_convert, 2))
    return path, net_param


def run_one(name, args, export_dir, records, emit):
    """Every (batch, precision) record of net ``name``; a failure at a step
    is recorded with its reason and ends only that net (or that batch)."""
    import torch
    gpu = args.device == "gpu"
    tdev = torch.device("cuda" if gpu else "cpu")
    precisions = args.precisions if gpu else ["fp32"]
    t_net = time.time()
    model = build_or_report(name, args, precisions, emit)
    if model is None:
        return
    for batch in args.batches:
        base = dict(net=name, batch=batch, device=args.device, size=args.size)
        rng = np.random.default_rng(args.seed + 2)
        x = rng.standard_normal((batch, 3, args.size, args.size)).astype(np.float32)
        path, net_param = export_and_convert(model, name, batch, args, export_dir, base,
                                             precisions, emit)
        if net_param is None:
            continue
        base["layers"] = len(net_param.layer)
        child = gpu and args.reference_process in ("child", "apart")
        apart = gpu and args.reference_process == "apart"
        if gpu:
            base["torch_process"] = args.reference_process
        if not child:
            mdl = model.to(tdev)
            xt = torch.from_numpy(x).to(tdev)
        ref64 = None          # the float64 output, once per batch
        for prec in precisions:
            rec = dict(base, precision=prec)
            tf32 = prec == "tf32"
            net, timers = None, {}
            ref_med, ref_samples = {}, {}
            try:
                graph_error = None
                if apart:
                    # PyTorch timed first, in a child that ends before
                    # caffe_ocl is timed: no PyTorch process alive then
                    ref, ref64, graph_error, ref_med, ref_samples = \
                        time_reference_apart(name, x, tf32, args)
                elif child:
                    ref, ref64, graph_error = args.torch_ref.load(name, x, tf32)
                else:
                    if gpu:
                        set_torch_tf32(tf32)
                    with torch.no_grad():
                        ref = mdl(xt).float().cpu().numpy()
                    if ref64 is None:
                        ref64 = exact_reference(model, x, tdev)
                t0 = time.time()
                net = make_net(net_param, x, tf32)
                got = net.forward()[net.outputs[0]]
                rec["setup_s"] = round(time.time() - t0, 2)
                rec["err_abs"], rec["err_rel"] = errors(got, ref)
                rec["err64_rel"] = errors(got, ref64)[1]
                rec["ref_err64_rel"] = errors(ref, ref64)[1]
                tol = args.tol_tf32 if tf32 else args.tol
                rec["status"] = "ok" if check_ok(rec, tol) else "MISMATCH"
                timers = {"ours": ours_timer(net)}
                if args.ab:
                    with config_override(args.ab):
                        base_net = make_net(net_param, x, tf32)
                        got_b = base_net.forward()[base_net.outputs[0]]
                    rec["base_err_rel"] = errors(got_b, ref)[1]
                    timers["base"] = ours_timer(base_net)
                    del base_net
                if apart:
                    if graph_error is not None:
                        rec["graph_error"] = graph_error
                elif child:
                    timers["eager"] = args.torch_ref.timer("eager")
                    if graph_error is None:
                        timers["graph"] = args.torch_ref.timer("graph")
                    else:
                        rec["graph_error"] = graph_error
                elif gpu:
                    timers["eager"] = torch_eager_timer(mdl, xt)
                    try:
                        timers["graph"] = torch_graph_timer(mdl, xt)
                    except Exception as e:  # noqa: BLE001
                        rec["graph_error"] = f"{type(e).__name__}: {e}"
                else:
                    timers["ort"] = ort_timer(path, x, args.threads)
                med, samples = interleave(timers, args.rounds, args.warmup, args.runs)
                med.update(ref_med)
                samples.update(ref_samples)
                for k, v in med.items():
                    rec[f"{k}_ms"] = v
                    rec[f"{k}_samples"] = [round(s, 4) for s in samples[k]]
                rec["enqueue_ms"], rec["launches"] = host_cost(net, args.runs)
                rec["replayed"] = trace_state(net)
            except Exception as e:  # noqa: BLE001
                rec["status"] = "run failed"
                rec["error"] = f"{type(e).__name__}: {e}"
                if args.verbose:
                    traceback.print_exc()
            finally:
                timers.clear()      # their closures hold the net and the CUDA graph
                del net
                gc.collect()
                if gpu:
                    import caffe_ocl
                    # the buffer pool keeps a freed net's blocks for the next;
                    # give them back so the PyTorch reference process can
                    # allocate (H100: ViT-B's reference ran out of memory
                    # with 77.6 GB held by this process after three nets)
                    caffe_ocl.get_device().allocator.free_held()
                if gpu and not child:
                    torch.cuda.empty_cache()
            emit(rec)
        del net_param
        gc.collect()
        if args.export_dir is None and os.path.exists(path):
            os.remove(path)      # a private temp dir: keep the disk small
    log(f"# {name}: done in {time.time() - t_net:.0f} s")


# --------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------

def geomean(v):
    return math.exp(sum(math.log(a) for a in v) / len(v)) if v else float("nan")


def fmt(v, nd=2):
    if v is None:
        return ""
    if isinstance(v, float):
        if v != v:
            return ""
        return f"{v:.{nd}f}" if abs(v) >= 0.01 or v == 0 else f"{v:.1e}"
    return str(v)


def table(records, device, refs):
    """Markdown: one table per precision; per batch our ms, each reference's
    ms and ratio; a check column; geometric mean and worst net per ratio."""
    lines = []
    by = {}
    for r in records:
        by.setdefault(r.get("precision", "fp32"), []).append(r)
    for prec, recs in by.items():
        nets = list(dict.fromkeys(r["net"] for r in recs))
        batches = sorted({r["batch"] for r in recs})
        cols = []
        for b in batches:
            cols.append((b, "ours", "ms"))
            for ref in refs:
                cols.append((b, ref, "ms"))
            for ref in refs:
                cols.append((b, ref, "ratio"))
        head = ["net"] + [f"b{b} {'caffe_ocl' if k == 'ours' else k} ms" if kind == "ms"
                          else f"b{b} {k}/ours" for b, k, kind in cols] + ["check (max abs / rel)"]
        lines.append(f"\n### {device.upper()} {prec.upper()}\n")
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        ratios = {c: [] for c in cols if c[2] == "ratio"}
        for n in nets:
            row, checks = [n], []
            for b, k, kind in cols:
                r = next((r for r in recs if r["net"] == n and r["batch"] == b), None)
                if r is None:
                    row.append("")
                    continue
                if kind == "ms":
                    row.append(fmt(r.get(f"{k}_ms")))
                else:
                    o, t = r.get("ours_ms"), r.get(f"{k}_ms")
                    if o and t and r.get("status") == "ok":
                        ratios[(b, k, kind)].append((t / o, n))
                        row.append(fmt(t / o))
                    elif o and t:
                        row.append(f"({fmt(t / o)})")
                    else:
                        row.append("")
            for r in recs:
                if r["net"] != n:
                    continue
                if "err_abs" in r:
                    s = f"b{r['batch']} {r['err_abs']:.1e}/{r['err_rel']:.1e}"
                    if "err64_rel" in r and r["err_rel"] > 1e-4:
                        s += f" (vs float64: ours {r['err64_rel']:.1e}, torch {r['ref_err64_rel']:.1e})"
                    if r.get("status") != "ok":
                        s += f" {r['status']}"
                    if r.get("error"):
                        s += f" {r['error'][:80]}"
                    checks.append(s)
                elif r.get("error"):
                    checks.append(f"b{r['batch']} {r.get('status')}: {r['error'][:120]}")
            row.append("; ".join(dict.fromkeys(checks)).replace("|", "/").replace("\n", " "))
            lines.append("| " + " | ".join(row) + " |")
        gm = ["**geomean**"] + [""] * len(cols) + [""]
        worst = ["**worst**"] + [""] * len(cols) + [""]
        for i, c in enumerate(cols):
            if c in ratios and ratios[c]:
                gm[i + 1] = f"**{geomean([a for a, _ in ratios[c]]):.2f}**"
                a, n = min(ratios[c])
                worst[i + 1] = f"{a:.2f} {n}"
        lines.append("| " + " | ".join(gm) + " |")
        lines.append("| " + " | ".join(worst) + " |")
    lines.append("\nratio = reference ms / caffe_ocl ms (>= 1: caffe_ocl ahead); a ratio in "
                 "parentheses is of a net whose check failed (left out of geomean/worst).")
    return "\n".join(lines)


def host_table(records):
    """Markdown: host work per forward (host_cost) against the forward's
    time, per net, batch and precision."""
    rows = [r for r in records if "enqueue_ms" in r and r.get("ours_ms")]
    if not rows:
        return ""
    lines = ["\n| net | batch | precision | launches | host enqueue ms | forward ms | host share "
             "| trace |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['net']} | {r['batch']} | {r.get('precision', '')} | "
                     f"{r['launches']} | {r['enqueue_ms']:.2f} | {r['ours_ms']:.2f} | "
                     f"{r['enqueue_ms'] / r['ours_ms']:.2f} | {r.get('replayed', '')} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------

def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nets", default=",".join(NETS))
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--precisions", default="fp32,tf32",
                    help="gpu only; the CPU runs fp32")
    ap.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    ap.add_argument("--runs", type=int, default=10, help="timed passes per round")
    ap.add_argument("--warmup", type=int, default=3,
                    help="untimed passes before round 1 (with the net's own check forward, "
                         "3 keeps a TEST net's recording passes and its first shared-"
                         "activation pass, which runs twice, out of the timing)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median)")
    ap.add_argument("--size", type=int, default=224, help="input height = width")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tol", type=float, default=1e-3, help="FP32 max relative error")
    ap.add_argument("--tol-tf32", type=float, default=5e-2, help="TF32 max relative error")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="ONNX Runtime intra_op_num_threads (default: the cores)")
    ap.add_argument("--json", help="write every record here (after each net)")
    ap.add_argument("--export-dir", help="keep/reuse the exported ONNX files here")
    ap.add_argument("--opset", type=int, default=13,
                    help="ONNX opset of the export (14: attention, scaled_dot_product_attention)")
    ap.add_argument("--extension-layers", action="store_true",
                    help="convert with caffe_ocl's MatMul and the SSD fork's Permute where no "
                         "BVLC layer does (attention: onnx2caffe --extension_layers)")
    ap.add_argument("--smoke", action="store_true",
                    help="one tiny net, CPU, batch 1, 16x16, one short round")
    ap.add_argument("--report", nargs="+", metavar="JSON",
                    help="measure nothing: print the table of these --json files together "
                         "(e.g. the GPU runs split over several commands)")
    ap.add_argument("--ab", default="",
                    help="NAME=VALUE[,NAME=VALUE]: also time a caffe_ocl net built with "
                         "these settings (config.py names) as 'base', interleaved with the "
                         "others (a before/after in one run)")
    ap.add_argument("--reference-process", choices=("child", "apart", "same"),
                    default="child",
                    help="gpu: run PyTorch in a child process (default; the rounds still "
                         "interleave), in a child per net and precision that times PyTorch "
                         "first and has ended before caffe_ocl is timed ('apart': no PyTorch "
                         "process alive then; not interleaved), or in this one ('same': "
                         "PyTorch's CUDA work then slows caffe_ocl's OpenCL enqueues, see "
                         "TorchReference)")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    if args.smoke:
        args.nets, args.device, args.batches = SMOKE_NET, "cpu", "1"
        args.size, args.runs, args.warmup, args.rounds = 16, 2, 1, 1
    args.ab = [p.strip() for p in args.ab.split(",") if p.strip()]
    args.nets = [n.strip() for n in args.nets.split(",") if n.strip()]
    args.batches = [int(b) for b in str(args.batches).split(",") if b.strip()]
    args.precisions = [p.strip().lower() for p in args.precisions.split(",") if p.strip()]
    bad = set(args.precisions) - {"fp32", "tf32"}
    if bad:
        ap.error(f"--precisions: unknown {sorted(bad)} (fp32, tf32)")
    return args


def read_reports(paths):
    """The records of several --json files, each file's run printed first."""
    records = []
    for p in paths:
        with open(p) as f:
            data = json.load(f)
        print(f"# {p}: {data.get('date')} {data.get('device')} ({data.get('platform')}), "
              f"torch {data.get('torch')}, args {' '.join(data.get('argv', []))}")
        records += data["records"]
    return records


def start_device(device, who):
    """caffe_ocl on ``device`` ("gpu": needs PyTorch with CUDA; cudnn.benchmark
    on) and PyTorch on every core: (the caffe_ocl device, its platform's
    name, the torch module). ``who``: the script, for the error."""
    import caffe_ocl
    import torch
    if device == "gpu":
        if not torch.cuda.is_available():
            sys.exit(f"{who}: --device gpu needs PyTorch with CUDA (use --device cpu)")
        torch.backends.cudnn.benchmark = True
        caffe_ocl.set_mode_gpu()
    else:
        caffe_ocl.set_mode_cpu()
    torch.set_num_threads(os.cpu_count())
    dev = caffe_ocl.get_device()
    platform = dev.info.get("platform_name", "") if hasattr(dev, "info") else ""
    return dev, platform, torch


def record_emitter(records, dev, platform, torch, json_path, describe):
    """``emit(rec)``: append the record, log ``describe(rec)``, and rewrite
    ``json_path`` (if any) with every record so far and the run's facts (a
    run cut short keeps what it measured)."""
    meta = dict(device=dev.name, platform=platform, torch=torch.__version__,
                argv=sys.argv[1:], date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                cpu_count=os.cpu_count())

    def emit(rec):
        records.append(rec)
        log(describe(rec))
        if json_path:
            with open(json_path + ".part", "w") as f:
                json.dump(dict(meta, records=records), f, indent=1)
            os.replace(json_path + ".part", json_path)
    return emit


def run_each_net(args, prefix, run, emit):
    """``run(name, export_dir)`` for each of ``args.nets``, the exports in
    ``args.export_dir`` or a temporary folder; a net that raises is emitted
    as a failed record and the others go on."""
    tmp = None
    export_dir = args.export_dir
    if export_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix=prefix)
        export_dir = tmp.name
    os.makedirs(export_dir, exist_ok=True)
    try:
        for name in args.nets:
            try:
                run(name, export_dir)
            except Exception as e:  # noqa: BLE001 -- one net's failure ends only that net
                emit(dict(net=name, batch=args.batches[0], precision=args.precisions[0],
                          status="failed", error=f"{type(e).__name__}: {e}"))
    finally:
        if tmp is not None:
            tmp.cleanup()


def report_files(paths):
    """The tables of several --json files (records of one device together)."""
    by_dev = {}
    for r in read_reports(paths):
        by_dev.setdefault(r.get("device", "gpu"), []).append(r)
    for dev, recs in by_dev.items():
        refs = ["eager", "graph"] if dev == "gpu" else ["ort"]
        refs += ["base"] if any("base_ms" in r for r in recs) else []
        print(table(recs, dev, refs), flush=True)
        print(host_table(recs), flush=True)


def main(argv=None):
    args = parse(argv)
    if args.report:
        report_files(args.report)
        return 0
    dev, platform, torch = start_device(args.device, "bench_zoo")
    refs = ["eager", "graph"] if args.device == "gpu" else ["ort"]
    refs += ["base"] if args.ab else []
    log(f"# device: {dev.name} ({platform}); torch {torch.__version__}; "
        f"nets {','.join(args.nets)}; batches {args.batches}; "
        f"{'precisions ' + ','.join(args.precisions) if args.device == 'gpu' else 'fp32'}; "
        f"rounds {args.rounds} x runs {args.runs} (warmup {args.warmup}); "
        f"{'ORT threads ' + str(args.threads) if args.device == 'cpu' else ''}")
    records = []

    def describe(rec):
        ms = " ".join(f"{k[:-3]} {rec[k]:.2f} ms" for k in rec if k.endswith("_ms"))
        err = (f" err {rec['err_abs']:.1e}/{rec['err_rel']:.1e}" if "err_abs" in rec else "")
        why = f" {rec['error'][:200]}" if rec.get("error") else ""
        return f"{rec['net']} b{rec['batch']} {rec.get('precision', '')}: " \
               f"{rec.get('status')}{err} {ms}{why}"

    emit = record_emitter(records, dev, platform, torch, args.json, describe)
    args.torch_ref = None
    if args.device == "gpu" and args.reference_process == "child":
        args.torch_ref = TorchReference(args.seed)
    try:
        run_each_net(args, "bench_zoo_",
                     lambda name, export_dir: run_one(name, args, export_dir, records, emit),
                     emit)
    finally:
        if args.torch_ref is not None:
            args.torch_ref.close()
    print(table(records, args.device, refs), flush=True)
    print(host_table(records), flush=True)
    bad = [r for r in records if r.get("status") != "ok"]
    return 1 if (args.smoke and bad) else 0


if __name__ == "__main__":
    sys.exit(main())
