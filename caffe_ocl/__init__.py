"""caffe_ocl: Caffe-compatible deep learning whose every computation runs
in OpenCL kernels. ``import caffe_ocl as caffe`` gives pycaffe's API."""
from . import startup as _startup
_startup.guard()     # a Ctrl-C while the command starts: one line, status 130

import logging as _logging  # noqa: E402

__version__ = "0.1.0"

_logging.getLogger("caffe_ocl").addHandler(_logging.NullHandler())

from .errors import (CaffeOclError, ParseError, ShapeError, NetError,  # noqa: E402,F401
                     LayerError, DeviceError, DataError, SolverError, FileNotFound,
                     FileWriteError)
from . import config  # noqa: E402,F401
from . import logs as _logs  # noqa: E402
from .ops import random as _random_ops  # noqa: E402
from .device import set_mode_cpu, set_mode_gpu, set_device, get_device  # noqa: E402,F401
from .proto import caffe_pb2  # noqa: E402,F401
from . import proto  # noqa: E402,F401
from .blob import Blob  # noqa: E402,F401
from .layers import layer_type_list  # noqa: E402,F401
from .layers.python_layer import PythonLayerBase as Layer  # noqa: E402,F401  (pycaffe's caffe.Layer)
from .net import Net, TRAIN, TEST  # noqa: E402,F401
from .layers.custom import register_layer, unregister_layer  # noqa: E402,F401


# pycaffe's net_spec names. `caffe.layers` is the NetSpec layer factory (L),
# as in pycaffe; the layer implementations stay importable as the module
# caffe_ocl.layers (sys.modules) for internal use.
from . import layers as _layer_impls  # noqa: E402,F401
from .net_spec import layers, params, NetSpec, to_proto  # noqa: E402,F401
from . import io  # noqa: E402,F401


def set_allow_tf32(flag=True):
    """Like PyTorch's allow_tf32: let convolutions and matrix products built
    from now on use TF32 tensor cores on NVIDIA GPUs (default off: strict
    FP32; env CAFFE_OCL_TF32=1 turns it on at start): the setting TF32."""
    config.set("TF32", bool(flag))


def set_random_seed(seed):
    """Seed the device random generator (fillers, Dropout, ...)."""
    _random_ops.set_random_seed(seed)


def set_untrusted(flag=True):
    """Treat the models loaded from now on as untrusted (default: trusted, as
    Caffe): nets with a Python layer (runs code) or an HDF5Output layer
    (writes a file) are refused with a NetError naming the layer. Same as
    CAFFE_OCL_UNTRUSTED=1."""
    config.set("UNTRUSTED", bool(flag))


def init_log(level=None, stderr=True):
    """pycaffe's init_log: Caffe-style (glog) log lines on stderr from glog
    severity ``level`` on (0 INFO .. 3 FATAL; default GLOG_minloglevel, else
    0); a Python logging level (>= 10) is accepted as such."""
    _logs.init_log(_logs.python_level(level))


def __getattr__(name):
    # Lazily imported pycaffe modules (keep `import caffe_ocl` light).
    import importlib
    lazy = {"draw": ".draw", "net_spec": ".net_spec",
            "coord_map": ".coord_map", "solvers": ".solvers"}
    if name in lazy:
        return importlib.import_module(lazy[name], __name__)
    if name in ("Classifier",):
        return getattr(importlib.import_module(".classifier", __name__), name)
    if name in ("Detector",):
        return getattr(importlib.import_module(".detector", __name__), name)
    if name in _PYCAFFE_NAMES:
        return getattr(importlib.import_module(".pycaffe", __name__), name)
    if name in ("SGDSolver", "NesterovSolver", "AdaGradSolver", "RMSPropSolver",
                "AdaDeltaSolver", "AdamSolver", "get_solver"):
        return getattr(importlib.import_module(".solvers", __name__), name)
    raise AttributeError(f"module 'caffe_ocl' has no attribute {name!r}")


# names of BVLC's _caffe module found in caffe_ocl/pycaffe.py (looked up lazily)
_PYCAFFE_NAMES = ("Timer", "NCCL", "log", "has_nccl", "solver_count", "set_solver_count",
                  "solver_rank", "set_solver_rank", "set_multiprocess", "set_deterministic",
                  "Solver", "LayerParameter", "SolverParameter", "BlobVec", "RawBlobVec",
                  "LayerVec", "StringVec", "IntVec", "DtypeVec", "NetVec", "BoolVec")
