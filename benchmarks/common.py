"""Shared helpers of the benchmark scripts: turn a train prototxt into one
fed by Input layers (random data, no disk I/O), and time things."""
import time

import numpy as np

from caffe_ocl.proto import caffe_pb2, read_net_prototxt


def with_inputs(prototxt, batch, data_shape, phase=caffe_pb2.TRAIN):
    """NetParameter of ``prototxt`` with its data layers replaced by Input
    layers ``data`` (batch x data_shape) and ``label`` (batch)."""
    src = read_net_prototxt(prototxt)
    out = caffe_pb2.NetParameter()
    out.name = src.name
    inp = out.layer.add()
    inp.name, inp.type = "input", "Input"
    inp.top.extend(["data", "label"])
    inp.input_param.shape.add().dim.extend([batch] + list(data_shape))
    inp.input_param.shape.add().dim.extend([batch])
    for lp in src.layer:
        if lp.type in ("Data", "ImageData", "Input", "MemoryData", "HDF5Data"):
            continue
        rules = list(lp.include)
        if rules and not any(r.phase == phase for r in rules if r.HasField("phase")):
            continue
        if lp.type == "Accuracy":
            continue
        nl = out.layer.add()
        nl.CopyFrom(lp)
        del nl.include[:]
    return out


def solver_for(net_param, base_lr=0.01, momentum=0.9, weight_decay=5e-4):
    sp = caffe_pb2.SolverParameter()
    sp.net_param.CopyFrom(net_param)
    sp.base_lr, sp.momentum, sp.weight_decay = base_lr, momentum, weight_decay
    sp.lr_policy = "fixed"
    sp.max_iter = 10 ** 9
    sp.display = 0
    sp.snapshot_after_train = False
    sp.random_seed = 1
    sp.type = "SGD"
    return sp


def fill_inputs(net, num_classes, rng=None):
    rng = rng or np.random.default_rng(0)
    d = net.blobs["data"]
    d.data[...] = rng.standard_normal(d.shape).astype(np.float32)
    net.blobs["label"].data[...] = rng.integers(0, num_classes, net.blobs["label"].shape)


def fresh_pool(dev):
    """Start a peak-memory count from an empty pool: drop what earlier runs
    left (held blocks, device-wide scratch kept for layers of nets that are
    gone), then zero ``dev.peak_bytes``. A Solver's net shares activation
    diffs (caffe_ocl/memory_plan.py) unless CAFFE_OCL_SHARE_DIFFS=0, so a
    training peak measured after this is the planned one."""
    import gc
    gc.collect()
    dev.drop_shared_scratch()
    gc.collect()
    dev.allocator.free_held()
    dev.peak_bytes = 0


def timed(fn, sync, warmup=3, runs=10):
    """Mean milliseconds of ``fn`` over ``runs`` calls after ``warmup``
    untimed ones, ``sync`` (e.g. the device's finish) before each clock read."""
    for _ in range(warmup):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(runs):
        fn()
    sync()
    return (time.perf_counter() - t0) / runs * 1e3


def cuda_ms(fn, runs=20, warmup=3):
    """Mean milliseconds of ``fn`` (PyTorch work on the current CUDA device)
    over ``runs`` calls after ``warmup``, timed by CUDA events."""
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(True), torch.cuda.Event(True)
    start.record()
    for _ in range(runs):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / runs


def cuda_torch():
    """The torch module where PyTorch is installed and sees a CUDA device,
    else None (the reference columns of the GPU benchmarks)."""
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def cudnn_conv_ms(n, c, h, co, k, stride, groups, runs, relu=False):
    """Best of three CUDA-event means (ms) of PyTorch + cuDNN's F.conv2d
    (FP32, bias, pad k // 2, optionally then ReLU) on an n x c x h x h
    input, or None without a CUDA device."""
    torch = cuda_torch()
    if torch is None:
        return None
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    x = torch.randn(n, c, h, h, device="cuda")
    w = torch.randn(co, c // groups, k, k, device="cuda")
    b = torch.randn(co, device="cuda")
    f = torch.nn.functional.conv2d

    def conv():
        y = f(x, w, b, stride, k // 2, 1, groups)
        return torch.relu(y) if relu else y
    return min(cuda_ms(conv, runs=runs) for _ in range(3))


def hold_queue(ctx, queue):
    """A user event that ``queue`` waits on (a barrier behind it): what is
    enqueued next runs only once ``release`` sets it -- the host's enqueues
    timed, or the device's run timed, without the other in the way."""
    import pyopencl as cl
    gate = cl.UserEvent(ctx)
    cl.enqueue_barrier(queue, wait_for=[gate])
    return gate


def release(gate):
    """Let a queue held by ``hold_queue`` run."""
    import pyopencl as cl
    gate.set_status(cl.command_execution_status.COMPLETE)


def time_launches(dev, launches, warmup=1, runs=10):
    """Mean milliseconds of one pass over a list of ``Launch`` objects."""
    def once():
        for ln in launches:
            ln.run(dev.queue)
    return timed(once, dev.finish, warmup, runs)


def random_buffers(dev, seed=0):
    """buf(n): a device buffer of n standard-normal float32 values (the
    kernel benchmarks' operands)."""
    import numpy as np
    rng = np.random.default_rng(seed)

    def buf(n):
        b = dev.alloc(4 * n)
        dev.upload(b, rng.standard_normal(n).astype(np.float32))
        return b
    return buf


def conv_pass(dev, g, what, x, w, y, dx, dw, col, algo=None):
    """The launches of one convolution pass ("fwd", "bwd_data" or
    "bwd_weight"; dy is read from y) of geometry g."""
    from caffe_ocl.ops import conv as conv_ops
    if what == "fwd":
        return conv_ops.forward(dev, g, x, w, y, col, algo=algo)
    if what == "bwd_data":
        return conv_ops.backward_data(dev, g, y, w, dx, col, algo=algo)
    return conv_ops.backward_weight(dev, g, x, y, dw, col, algo=algo)


def interleaved(timers, rounds):
    """A/B timing on a noisy machine: each of ``timers`` (name -> function
    returning milliseconds) in turn, ``rounds`` times; prints each one's
    median and samples, returns {name: median}."""
    import statistics
    times = {k: [] for k in timers}
    for _ in range(rounds):
        for k, fn in timers.items():
            times[k].append(fn())
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        print(f"{k}: median {med[k]:.1f} ms  ({' '.join(f'{x:.0f}' for x in v)})")
    return med
