import os
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


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
