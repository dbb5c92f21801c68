"""`caffe_ocl tune`: time each convolution's algorithms here and store the fastest."""
import logging

from ..errors import FlagError
from ..net import TEST, TRAIN, Net
from ..ops import tuned
from ..tuning import net_conv_passes, net_products, tune_passes, tune_products
from ._common import GPU, LEVEL, STAGE, UNTRUSTED, apply_untrusted, start_log, use_device
from .flags import Flag, Spec

SUMMARY = ("time each convolution's algorithms (and on a GPU each fully-connected "
           "product's K split) on this device and store the fastest")

log = logging.getLogger("caffe_ocl")

SPEC = Spec(
    "caffe_ocl tune", SUMMARY,
    flags=[Flag("model", str, "", "the net prototxt (required)", check="file"),
           Flag("phase", str, "TRAIN", "TRAIN (forward and gradients) or TEST (forward)"),
           Flag("iterations", int, 5, "timing rounds per algorithm (the median decides)"),
           Flag("store", bool, True, "store the choices for nets built later"),
           GPU, LEVEL, STAGE, UNTRUSTED],
    example="caffe_ocl tune --model models/cifar10_quick/cifar10_quick.prototxt --phase TEST",
    details="Choices are stored per device, geometry, pass and TF32 setting under "
            "CAFFE_OCL_CACHE; nets built afterwards use them.")


def main(argv):
    opts = SPEC.parse(argv)
    apply_untrusted(opts)
    if not opts.model:
        raise FlagError("tune needs --model NET.prototxt")
    if opts.iterations < 1:
        raise FlagError("--iterations must be at least 1")
    phase = opts.phase.upper()
    if phase not in ("TRAIN", "TEST"):
        raise FlagError(f"--phase must be TRAIN or TEST, got {opts.phase!r}")
    start_log()
    dev = use_device(opts.gpu)
    if opts.store and tuned.store_path(dev) is None:
        raise FlagError("no cache directory to store the choices in (CAFFE_OCL_CACHE is "
                        "empty); set it, or pass --store=false")
    net = Net(opts.model, TRAIN if phase == "TRAIN" else TEST, level=opts.level,
              stages=[s for s in opts.stage.split(",") if s])
    items, products = net_conv_passes(net), net_products(net)
    if not items and not products:
        log.info("%s has no convolutions%s: nothing to tune", opts.model,
                 " and no fully-connected products the GEMM runs" if dev.is_gpu else "")
        return 0
    if items:
        tune_passes(dev, items, rounds=opts.iterations, store=opts.store, out=log.info,
                    training=phase == "TRAIN")
    if products:
        tune_products(dev, products, rounds=opts.iterations, store=opts.store, out=log.info)
    return 0
