"""Shipped data files: the embedded MNIST digits (and models_dir, re-exported)."""
import os

from ..paths import models_dir  # noqa: F401  (one definition, in caffe_ocl/paths.py)


def mnist_dir():
    """The embedded MNIST IDX files (see data/mnist/README.md)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "mnist")
