"""`caffe_ocl time`: forward/backward times per execution-plan step (Caffe's
`caffe time` lines; caffe_ocl/timing.py measures)."""
import logging
import time

from .. import device
from ..errors import FlagError
from ..net import TEST, TRAIN, Net
from ..timing import time_net
from ._common import (GPU, LEVEL, STAGE, UNTRUSTED, apply_untrusted, require_hdf5_for, start_log,
                      use_device)
from .flags import Flag, Spec

COMMAND = "time"
SUMMARY = "time forward/backward per layer (Caffe's caffe time)"

log = logging.getLogger("caffe_ocl")

SPEC = Spec(
    "caffe_ocl time", SUMMARY,
    flags=[Flag("model", str, "", "the net prototxt (required)", check="file"),
           Flag("weights", str, "", "weights to load first (optional)", check="files"),
           Flag("iterations", int, 50, "forward-backward passes to time"),
           Flag("phase", str, "TRAIN", "the net's phase: TRAIN or TEST"),
           Flag("forward_only", bool, False, "time the forward pass only"),
           Flag("warmup", int, 2, "untimed passes first (programs, launch lists, buffers)"),
           Flag("host", bool, False, "also print each step's host enqueue time"),
           GPU, LEVEL, STAGE, UNTRUSTED],
    example="caffe_ocl time --model models/cifar10_quick/cifar10_quick.prototxt "
            "--iterations 20",
    details="Times each step of the net's execution plan (a layer, or a fused group "
            "shown as 'a+b+c (fused)') from OpenCL profiling events, without draining the "
            "queue between steps; 'Average Forward pass' is a whole net.forward() as a user "
            "calls it, and the lines after it split it into the per-step device times, "
            "device work outside the steps and the unattributed rest (host enqueue, gaps).")


def main(argv):
    opts = SPEC.parse(argv)
    apply_untrusted(opts)
    if not opts.model:
        raise FlagError("time needs --model NET.prototxt")
    phase = opts.phase.upper()
    if phase not in ("TRAIN", "TEST"):
        raise FlagError(f"--phase must be TRAIN or TEST, got {opts.phase!r}")
    if opts.iterations < 1:
        raise FlagError("--iterations must be at least 1")
    if opts.warmup < 0:
        raise FlagError("--warmup must be at least 0")
    require_hdf5_for([opts.weights], "caffe_ocl time")
    start_log()
    dev = use_device(opts.gpu)
    t0 = time.perf_counter()
    net = Net(opts.model, TRAIN if phase == "TRAIN" else TEST, weights=opts.weights or None,
              level=opts.level, stages=[s for s in opts.stage.split(",") if s])
    log.info("Net built in %.3f s", time.perf_counter() - t0)
    time_net(net, opts.iterations, backward=not opts.forward_only, out=log.info,
             warmup=opts.warmup, host=opts.host)
    # programs are built at a launch's first run (the warm-up passes), so
    # the count is only complete here
    st = dev.build_stats
    where = (f"PoCL's cache {device.pocl_cache_dir()}" if dev.driver_caches_source
             else dev.cache_dir if dev.binary_cache else "no disk cache")
    log.info("OpenCL programs: %d compiled from source, %d loaded from the disk cache "
             "(binaries kept in %s), %.3f s", st["built"], st["cached"], where, st["seconds"])
    return 0
