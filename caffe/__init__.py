"""``import caffe``: BVLC pycaffe's import name, served by caffe_ocl (the
way opencv-python installs ``cv2``).

Every pycaffe module is caffe_ocl's own module object under its pycaffe
name (``sys.modules`` aliases), so ``caffe.io``, ``caffe.draw``,
``caffe.net_spec``, ``caffe.coord_map``, ``caffe.classifier``,
``caffe.detector``, ``caffe.proto.caffe_pb2``, ``caffe.pycaffe`` and
``caffe._caffe`` are ``caffe_ocl.io`` ... ``caffe_ocl.pycaffe``: a script
that patches ``caffe.io.load_image`` patches caffe_ocl's.

As pycaffe does, importing it prints Caffe's log lines on stderr from
``GLOG_minloglevel`` on (set GLOG_minloglevel=2 before the import to keep
it quiet, or call ``caffe.init_log(level)``).

Which ``caffe`` is imported when BVLC's own pycaffe is also installed: the
first one on ``sys.path`` (BVLC's is usually found through PYTHONPATH, which
comes before site-packages, so BVLC's wins there); ``import caffe_ocl as
caffe`` always picks caffe_ocl.
"""
import importlib
import sys

from caffe_ocl import logs as _logs

# pycaffe module name -> caffe_ocl module
_MODULES = {
    "proto": "caffe_ocl.proto",
    "proto.caffe_pb2": "caffe_ocl.proto.caffe_pb2",
    "io": "caffe_ocl.io",
    "draw": "caffe_ocl.draw",
    "net_spec": "caffe_ocl.net_spec",
    "coord_map": "caffe_ocl.coord_map",
    "classifier": "caffe_ocl.classifier",
    "detector": "caffe_ocl.detector",
    "pycaffe": "caffe_ocl.pycaffe",
    "_caffe": "caffe_ocl.pycaffe",
}

for _short, _target in _MODULES.items():
    _mod = importlib.import_module(_target)
    sys.modules[f"{__name__}.{_short}"] = _mod
    if "." not in _short:
        globals()[_short] = _mod

# python/caffe/__init__.py's names
from caffe_ocl.pycaffe import (Net, SGDSolver, NesterovSolver, AdaGradSolver,  # noqa: E402,F401
                               RMSPropSolver, AdaDeltaSolver, AdamSolver, NCCL, Timer)
from caffe_ocl.pycaffe import (init_log, log, set_mode_cpu, set_mode_gpu,  # noqa: E402,F401
                               set_device, Layer, get_solver, layer_type_list,
                               set_random_seed, solver_count, set_solver_count,
                               solver_rank, set_solver_rank, set_multiprocess, has_nccl)
from caffe_ocl.pycaffe import __version__  # noqa: E402,F401
from caffe_ocl.proto.caffe_pb2 import TRAIN, TEST  # noqa: E402,F401
from caffe_ocl.classifier import Classifier  # noqa: E402,F401
from caffe_ocl.detector import Detector  # noqa: E402,F401
from caffe_ocl.net_spec import layers, params, NetSpec, to_proto  # noqa: E402,F401
# caffe_ocl additions, under the same names as in caffe_ocl
from caffe_ocl.pycaffe import Solver, Blob, set_deterministic  # noqa: E402,F401
from caffe_ocl import set_allow_tf32  # noqa: E402,F401

__all__ = ["Net", "SGDSolver", "NesterovSolver", "AdaGradSolver", "RMSPropSolver",
           "AdaDeltaSolver", "AdamSolver", "NCCL", "Timer", "init_log", "log", "set_mode_cpu",
           "set_mode_gpu", "set_device", "Layer", "get_solver", "layer_type_list",
           "set_random_seed", "solver_count", "set_solver_count", "solver_rank",
           "set_solver_rank", "set_multiprocess", "has_nccl", "__version__", "TRAIN", "TEST",
           "Classifier", "Detector", "io", "layers", "params", "NetSpec", "to_proto",
           "Solver", "Blob", "set_deterministic", "set_allow_tf32"]

_logs.init_pycaffe_log()
del _short, _target, _mod
