"""Deprecated entry point: the dispatcher is ``caffe_ocl.commands.main``.

Kept so that a ``caffe_ocl`` script installed before the move (its entry
point was ``caffe_ocl.cli:main``) keeps working until the package is
reinstalled; pyproject.toml now names ``caffe_ocl.commands:main``.
"""
import sys

from .commands import main  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
