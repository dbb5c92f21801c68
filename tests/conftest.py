import contextlib
import os
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


def child_env(*paths, root=ROOT, base=None, **extra):
    """The environment of a child Python process a test starts (a command,
    a benchmark script): a copy of ``base`` (default: this process's
    environment) whose PYTHONPATH is ``root`` (the checkout: its code, not
    an installed copy), then ``paths``, then the non-empty entries of
    ``base``'s PYTHONPATH (wheel folders a machine brings: pyopencl, lmdb;
    an empty entry would put the child's current folder on sys.path);
    ``extra`` variables are set last."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(root), *map(str, paths)]
        + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update(extra)
    return env


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


@pytest.fixture(autouse=True)
def _restore_device_selection():
    """A test that switches the process's OpenCL device (a command run with
    --gpu, set_mode_gpu/set_device) gives it back: with Oclgrind visible,
    `--gpu=all` once left every later test on the simulator."""
    from caffe_ocl import device
    saved = device.selection()
    yield
    now = device.selection()
    # a device made on first use under the same wishes is kept (a new one per
    # test would rebuild every program)
    if now[1:] != saved[1:] or (saved[0] is not None and now[0] is not saved[0]):
        device.restore_selection(saved)


@pytest.fixture
def settings():
    """``settings(TF32=True, ...)``: caffe_ocl.config overrides for this
    test, removed when it ends (the way tests switch kernel variants)."""
    from caffe_ocl import config
    with contextlib.ExitStack() as stack:
        yield lambda **values: stack.enter_context(config.override(**values))


def opencv_with_caffe_importer():
    """cv2, for tests that compare with OpenCV's Caffe importer; skips where
    it is absent (OpenCV 5 removed cv2.dnn.readNetFromCaffe: the [compare]
    extra brings an OpenCV 4, as CI installs)."""
    cv2 = pytest.importorskip("cv2")
    if not hasattr(getattr(cv2, "dnn", None), "readNetFromCaffe"):
        pytest.skip(f"OpenCV {cv2.__version__} has no Caffe importer (OpenCV 5 removed "
                    "it): pip install 'caffe_ocl[compare]' for these comparisons",
                    allow_module_level=True)
    return cv2


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
    # Choices a user stored with `caffe_ocl tune` would change which
    # algorithms the tests run: tests see the rules (test_tuning turns the
    # store back on where it tests it).
    os.environ["CAFFE_OCL_TUNED"] = "0"


class DeviceBuffers:
    """Raw device buffers for primitive-level tests (ops/*, no Blob)."""

    def __init__(self):
        from caffe_ocl.device import get_device
        self.dev = get_device()

    def buf(self, a):
        b = self.dev.alloc(max(a.size, 1) * 4)
        self.dev.upload(b, np.asarray(a, np.float32))
        return b

    def get(self, b, shape):
        out = np.empty(shape, np.float32)
        self.dev.download(out, b)
        return out

    def run(self, launches):
        for ln in launches:
            ln.run(self.dev.queue)


@pytest.fixture(scope="module")
def d():
    return DeviceBuffers()


@pytest.fixture
def gpu_kernels_unoptimized_on_cpu(d, monkeypatch):
    """On CPU drivers the GPU kernels that tests run there (gemm.cl, the
    implicit-GEMM conv_igemm.cl; emulated TF32 tilings among them) are
    built without LLVM's optimisations: a CPU in use never runs them, what
    is checked here is their indexing, tiling and fragment layout, and PoCL
    took 15-150 s to optimise each variant (1-3 s unoptimised), which kept
    most of them behind `-m slow`. The GPU runs them optimised. (The CPU
    weight-gradient path's splitk_reduce, in conv_igemm.cl, runs optimised
    in the net and solver tests.) Used by test_conv_algorithms and
    test_gemm_splitk (pytestmark)."""
    if d.dev.is_cpu:
        monkeypatch.setattr(d.dev, "unoptimized_sources",
                            frozenset({"gemm.cl", "conv_igemm.cl"}))


# pycaffe tests (tests/pycaffe): a tiny linear net with a gradient to every
# input, for forward, backward, forward_all and their misuse
LIN = """
force_backward: true
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 3 dim: 4 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y"
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 1 } } }
"""


@pytest.fixture
def lin_path(tmp_path):
    p = tmp_path / "lin.prototxt"
    p.write_text(LIN)
    return str(p)


@pytest.fixture
def lin(lin_path):
    import caffe
    return caffe.Net(lin_path, caffe.TEST)
