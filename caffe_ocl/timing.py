"""`caffe_ocl time` and `caffe_ocl device_query`, as Caffe's tools.

`time` builds the model (TRAIN phase by default, as Caffe), runs forward
and backward ``--iterations`` times and prints per-layer averages. Each
layer is timed with the device queue drained before and after it, so the
per-layer times add up to the total; the synchronisation makes the total a
little slower than an untimed pass (see BENCHMARKS.md for untimed runs).
"""
import logging
import time

from .flags import parse_flags

log = logging.getLogger("caffe_ocl")


def time_net(net, iterations, backward=True, out=print):
    dev = net.device
    layers = net.layers
    names = net.graph.layer_names
    fwd = [0.0] * len(layers)
    bwd = [0.0] * len(layers)
    # warm-up, layer by layer as timed below (not the net's fused paths, so
    # that every layer's own launches are built and compiled before timing)
    for li, layer in enumerate(layers):
        layer.reshape_if_needed(net.graph.bottoms[li], net.graph.tops[li])
        layer.forward(net.graph.bottoms[li], net.graph.tops[li])
    if backward:
        for li in range(len(layers) - 1, -1, -1):
            if net.graph.layer_need_backward[li]:
                layers[li].backward(net.graph.tops[li], net.graph.bottom_need_backward[li],
                                    net.graph.bottoms[li])
    dev.finish()
    out("*** Benchmark begins ***")
    out(f"Testing for {iterations} iterations.")
    total_start = time.perf_counter()
    fwd_total = bwd_total = 0.0
    for it in range(iterations):
        t_iter = time.perf_counter()
        t0 = time.perf_counter()
        for li, layer in enumerate(layers):
            s = time.perf_counter()
            bottoms, tops = net.graph.bottoms[li], net.graph.tops[li]
            layer.reshape_if_needed(bottoms, tops)
            layer.forward(bottoms, tops)
            dev.finish()
            fwd[li] += time.perf_counter() - s
        fwd_total += time.perf_counter() - t0
        t0 = time.perf_counter()
        if backward:
            for li in range(len(layers) - 1, -1, -1):
                s = time.perf_counter()
                if net.graph.layer_need_backward[li]:
                    layers[li].backward(net.graph.tops[li], net.graph.bottom_need_backward[li],
                                        net.graph.bottoms[li])
                    dev.finish()
                bwd[li] += time.perf_counter() - s
        bwd_total += time.perf_counter() - t0
        out(f"Iteration: {it + 1} forward-backward time: "
            f"{(time.perf_counter() - t_iter) * 1000:.3f} ms.")
    total = time.perf_counter() - total_start
    out("Average time per layer: ")
    width = max((len(n) for n in names), default=4)
    for li, n in enumerate(names):
        out(f"{n:>{width}}\tforward: {fwd[li] / iterations * 1000:.4f} ms.")
        out(f"{n:>{width}}\tbackward: {bwd[li] / iterations * 1000:.4f} ms.")
    out(f"Average Forward pass: {fwd_total / iterations * 1000:.4f} ms.")
    out(f"Average Backward pass: {bwd_total / iterations * 1000:.4f} ms.")
    out(f"Average Forward-Backward: {(fwd_total + bwd_total) / iterations * 1000:.4f} ms.")
    out(f"Total Time: {total * 1000:.4f} ms.")
    out("*** Benchmark ends ***")
    return dict(forward=fwd, backward=bwd, forward_total=fwd_total / iterations,
                backward_total=bwd_total / iterations)


def device_from_flags(flags):
    """The device a tool's ``--gpu N`` asks for (Caffe's flag: the first of
    a list; ``all``: the default GPU), logged as Caffe logs it."""
    from .device import get_device, set_device, set_mode_gpu
    if "gpu" in flags:
        set_mode_gpu()
        if flags["gpu"] != "all":
            set_device(int(flags["gpu"].split(",")[0]))
    dev = get_device()
    log.info("Use OpenCL device %s (%s)", dev.name, dev.reason)
    return dev


def time_main(argv):
    from .logs import init_log
    from .net import Net, TRAIN, TEST
    flags, rest = parse_flags(argv, {"model": str, "iterations": int, "gpu": str,
                                     "phase": str, "level": int, "stage": str,
                                     "forward_only": bool, "weights": str},
                              defaults={"iterations": 50, "phase": "TRAIN", "level": 0},
                              program="caffe_ocl time")
    if "model" not in flags:
        from .errors import CaffeOclError
        raise CaffeOclError("time needs --model NET.prototxt")
    init_log()
    dev = device_from_flags(flags)
    stages = flags["stage"].split(",") if flags.get("stage") else ()
    t0 = time.perf_counter()
    net = Net(flags["model"], TRAIN if flags["phase"].upper() == "TRAIN" else TEST,
              weights=flags.get("weights"), level=flags["level"], stages=stages)
    st = dev.build_stats
    log.info("Net built in %.3f s; OpenCL programs: %d compiled, %d from the disk cache "
             "(%s), %.3f s", time.perf_counter() - t0, st["built"], st["cached"], dev.cache_dir,
             st["seconds"])
    time_net(net, flags["iterations"], backward=not flags.get("forward_only", False),
             out=log.info)
    return 0


def device_query_main(argv):
    from .device import describe_devices
    print(describe_devices())
    return 0
