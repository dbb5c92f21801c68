import os
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


@pytest.fixture(autouse=True)
def _restore_caffe_ocl_logger():
    """Commands under test install Caffe-style log handlers; undo that so one
    test's logging setup never hides another test's log records."""
    import logging
    lg = logging.getLogger("caffe_ocl")
    saved = (list(lg.handlers), lg.propagate, lg.level)
    yield
    lg.handlers[:] = saved[0]
    lg.propagate, lg.level = saved[1], saved[2]


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def shared_data():
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is not present")
    return SHARED_DATA


def pytest_configure(config):
    # Kernel binaries are cached per user; tests use the same cache as users.
    os.environ.setdefault("CAFFE_OCL_CACHE", str(Path.home() / ".cache" / "caffe_ocl"))
