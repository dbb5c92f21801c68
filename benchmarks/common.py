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
    dev.__dict__.pop("_layer_scratch", None)     # memory_plan.shared_scratch
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


def time_launches(dev, launches, warmup=1, runs=10):
    """Mean milliseconds of one pass over a list of ``Launch`` objects."""
    def once():
        for ln in launches:
            ln.run(dev.queue)
    return timed(once, dev.finish, warmup, runs)
