"""Optional dependencies of the commands, checked before any work.

``require("onnx", extra="onnx", what="caffe_ocl onnx2caffe")`` raises
MissingDependency with one line naming the pip extra when the package is
not installed; ``require_program("dot", ...)`` does the same for a program
on PATH. Tests simulate a missing package by replacing :func:`available`
(or :func:`which`) in this module.
"""
import importlib.util
import shutil

from ..errors import MissingDependency

# pip extra -> what it installs (pyproject.toml's optional-dependencies)
EXTRAS = {"onnx": "onnx", "draw": "pydot", "hdf5": "h5py", "mpi": "mpi4py"}


def available(module):
    """Whether ``module`` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def which(program):
    return shutil.which(program)


def require(module, extra, what="this command", alternatives=(), pip=None):
    """MissingDependency unless ``module`` (or one of ``alternatives``) is
    installed; the message names ``pip install 'caffe_ocl[extra]'`` (or
    ``pip install <pip>`` for a package no extra carries)."""
    if available(module) or any(available(m) for m in alternatives):
        return
    how = f"pip install {pip}" if pip else f"pip install 'caffe_ocl[{extra}]'"
    raise MissingDependency(f"{what} needs the Python package {module!r}, which is not "
                            f"installed: {how}")


def require_program(program, hint, what="this command"):
    """MissingDependency unless ``program`` is on PATH."""
    if which(program) is None:
        raise MissingDependency(f"{what} needs the {program!r} program, which was not found "
                                f"on PATH: {hint}")
