"""`caffe_ocl compute_image_mean`: mean image of an LMDB as .binaryproto."""
import logging

import numpy as np

from ..data.tools import compute_image_mean
from ..proto import write_binary
from ._common import start_log
from .flags import Arg, Flag, Spec

SUMMARY = "mean image of an LMDB as .binaryproto (Caffe's compute_image_mean)"

log = logging.getLogger("caffe_ocl")

SPEC = Spec(
    "caffe_ocl compute_image_mean", SUMMARY,
    flags=[Flag("backend", str, "lmdb", "the backend of the input (lmdb only)")],
    args=[Arg("INPUT_DB", "LMDB of Datum records", check="dir"),
          Arg("OUTPUT_FILE", "the mean .binaryproto to write", optional=True)],
    example="caffe_ocl compute_image_mean train_lmdb mean.binaryproto",
    details="Also logs each channel's mean value.")


def main(argv):
    opts = SPEC.parse(argv)
    start_log()
    blob = compute_image_mean(opts.args[0], opts.backend)
    if len(opts.args) == 2:
        log.info("Write to %s", opts.args[1])
        write_binary(blob, opts.args[1])
    c, dim = blob.channels, blob.height * blob.width
    data = np.asarray(blob.data, np.float64).reshape(c, dim)
    log.info("Number of channels: %d", c)
    for i in range(c):
        log.info("mean_value channel [%d]: %g", i, data[i].sum() / dim)
    return 0
