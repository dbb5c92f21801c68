"""Where the shipped files live, in a checkout and in an installed package.

``models_dir()``: the ``models/`` folder (nets, solvers, the CIFAR-10
weights). In a checkout it is ``<root>/models`` beside the package; an
installed wheel carries it as ``caffe_ocl/models``; ``$CAFFE_OCL_MODELS``
overrides both.
"""
from pathlib import Path

from . import config
from .errors import FileNotFound

PACKAGE_DIR = Path(__file__).resolve().parent


def models_dir():
    cands = []
    if config.get("MODELS"):
        cands.append(Path(config.get("MODELS")))
    cands += [PACKAGE_DIR / "models", PACKAGE_DIR.parent / "models"]
    for c in cands:
        if (c / "lenet").is_dir():
            return c
    raise FileNotFound("the shipped models/ folder was not found (looked in "
                       + ", ".join(map(str, cands)) + "); set CAFFE_OCL_MODELS to its path")
