"""Where shipped files live, from a checkout and from an installed wheel.

``models_dir()``: the ``models/`` folder (nets and solvers). In a source
checkout it is ``<root>/models`` next to the ``caffe_ocl`` package; an
installed wheel carries it as ``caffe_ocl/models``. ``$CAFFE_OCL_MODELS``
overrides both.
"""
import os

from ..errors import FileNotFound

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def models_dir():
    cands = []
    env = os.environ.get("CAFFE_OCL_MODELS")
    if env:
        cands.append(env)
    cands += [os.path.join(PACKAGE_DIR, "models"),
              os.path.join(os.path.dirname(PACKAGE_DIR), "models")]
    for c in cands:
        if os.path.isdir(os.path.join(c, "lenet")):
            return c
    raise FileNotFound("the shipped models/ folder was not found (looked in "
                       + ", ".join(cands) + "); set CAFFE_OCL_MODELS to its path")


def mnist_dir():
    """The embedded MNIST IDX files (see data/mnist/README.md)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "mnist")
