"""Pieces several commands share (not a command: the name starts with _)."""
import logging

from .. import config
from ..device import get_device, parse_device_ids, set_device, set_mode_gpu
from ..logs import init_log
from .deps import require
from .flags import Flag

log = logging.getLogger("caffe_ocl")

GPU = Flag("gpu", str, "", "OpenCL device id (Caffe's --gpu: the first of N,M,...; "
           "all: the first device)", metavar="ID")
LEVEL = Flag("level", int, 0, "the net state's level (NetStateRule)")
STAGE = Flag("stage", str, "", "the net state's stages, comma-separated (NetStateRule)",
             metavar="A,B")
UNTRUSTED = Flag("untrusted", bool, False,
                 "treat the model as untrusted: refuse Python layers and layers that write "
                 "files (HDF5Output); as CAFFE_OCL_UNTRUSTED=1 or caffe_ocl.set_untrusted()")
HDF5_SUFFIXES = (".h5", ".hdf5")


def apply_untrusted(opts):
    """--untrusted: the setting UNTRUSTED on for this run (never turns an
    UNTRUSTED=1 of the environment off)."""
    if opts.untrusted:
        config.set("UNTRUSTED", True)


def start_log():
    """Caffe-style log lines on the current stderr."""
    init_log()


def require_hdf5_for(paths, what):
    """h5py is needed when any of ``paths`` (comma-separated lists
    allowed) is an HDF5 file."""
    for p in paths:
        for one in (p or "").split(","):
            if one.strip().lower().endswith(HDF5_SUFFIXES):
                require("h5py", "hdf5", f"{what} (HDF5 file {one.strip()})")
                return


def use_device(gpu):
    """The device ``--gpu`` asks for (Caffe's flag: the first of a list;
    ``all``: the default GPU; empty: the default device), logged as Caffe
    logs it."""
    if gpu:
        set_mode_gpu()
        if gpu != "all":
            set_device(parse_device_ids(gpu)[0])
    dev = get_device()
    log.info("Use OpenCL device %s (%s)", dev.name, dev.reason)
    return dev
