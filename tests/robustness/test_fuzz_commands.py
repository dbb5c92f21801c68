"""Bad inputs through the real commands (`python -m caffe_ocl ...`, issue
#25): each run must exit 0, or exit 1 with its last stderr line the one
error line -- never a signal, a traceback, a hang past the timeout or
memory past RLIMIT_AS. A small seeded sample of mutated files plus the
inputs that broke before (special files, boundary numbers)."""
import os
import random
import resource
import stat
import subprocess
import sys

import pytest

import fuzzing
from conftest import child_env

CHILD_MEMORY = 6 << 30
TIMEOUT = 120


def _limit_child():
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))


def caffe_ocl(*args, cwd=None):
    env = child_env(CAFFE_OCL_MEMORY_LIMIT_MB="1024")
    p = subprocess.run([sys.executable, "-m", "caffe_ocl", *map(str, args)],
                       capture_output=True, text=True, timeout=TIMEOUT, env=env,
                       preexec_fn=_limit_child, cwd=cwd)
    return p


def assert_clean(p, want_error=None):
    """Exit 0, or exit 1 whose last stderr line is the error; no traceback."""
    assert p.returncode >= 0, f"killed by signal {-p.returncode}: {p.stderr[-800:]}"
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    assert p.returncode in (0, 1), (p.returncode, p.stderr[-800:])
    if want_error is True:
        assert p.returncode == 1, p.stderr[-800:]
    if p.returncode == 1:
        last = p.stderr.strip().splitlines()[-1]
        assert ": error: " in last, p.stderr[-800:]
        return last
    return ""


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    b = tmp_path_factory.mktemp("cmdfuzz") / "base"
    fuzzing.make_base(str(b))
    return b


def test_special_files_are_refused(base, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    net, model = base / "net.prototxt", base / "net.caffemodel"
    for args in [("test", "--model", net, "--weights", "/dev/zero", "--iterations", 1),
                 ("test", "--model", fifo, "--weights", model, "--iterations", 1),
                 ("test", "--model", net, "--weights", fifo, "--iterations", 1),
                 ("train", "--solver", fifo),
                 ("train", "--solver", "/dev/zero")]:
        last = assert_clean(caffe_ocl(*args), want_error=True)
        assert "regular file" in last and ("fifo" in last or "/dev/zero" in last), last
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def _write(path, text):
    path.write_text(text)
    return path


def test_boundary_values_give_one_line(base, tmp_path):
    net = fuzzing.NET
    model = base / "net.caffemodel"
    cases = {
        "pool_stride": net.replace("kernel_size: 2 stride: 2", "kernel_size: 2 stride: 4294967295"),
        "conv_kernel": net.replace("kernel_size: 3 stride: 1", "kernel_size: 2147483647 stride: 1"),
        "zero_out": net.replace("num_output: 4", "num_output: 0"),
        "huge_dims": net.replace("dim: 2 dim: 3", f"dim: {2**62 + 1} dim: 4"),
        "dims_2_32": net.replace("dim: 8 dim: 8", f"dim: {2**32} dim: {2**32}"),
        "twice": net.replace("num_output: 4", "num_output: 4 num_output: 5"),
    }
    for name, text in cases.items():
        p = _write(tmp_path / f"{name}.prototxt", text)
        last = assert_clean(caffe_ocl("test", "--model", p, "--weights", model,
                                      "--iterations", 1), want_error=True)
        assert f"{name}.prototxt" in last, (name, last)
    assert "twice.prototxt:5" in last   # file and line of the repeated field


def test_bad_snapshots_give_one_line(base, tmp_path):
    from caffe_ocl.proto import caffe_pb2, read_binary, write_binary
    solver = base / "solver.prototxt"
    st = read_binary(base / "snap.solverstate", caffe_pb2.SolverState())
    st.iter = -2**31
    write_binary(st, tmp_path / "neg.solverstate")
    for snap in (base / "net_v1.caffemodel", tmp_path / "neg.solverstate",
                 base / "net.caffemodel", base / "mean.binaryproto"):
        last = assert_clean(caffe_ocl("train", "--solver", solver, "--snapshot", snap),
                            want_error=True)
        assert snap.name in last, last
    text = solver.read_text().replace('snapshot_prefix: "', 'snapshot_prefix: "a\\000b')
    p = _write(tmp_path / "nul.prototxt", text)
    last = assert_clean(caffe_ocl("train", "--solver", p), want_error=True)
    assert "nul.prototxt" in last and "NUL" in last, last


@pytest.mark.parametrize("seed", [pytest.param(s, marks=pytest.mark.slow) if s >= 3 else s
                                  for s in range(40)])
def test_mutated_files_through_commands(seed, base, tmp_path):
    r = random.Random(f"cmd:{seed}")
    net = tmp_path / "net.prototxt"
    net.write_bytes(fuzzing.mutate_bytes(fuzzing.NET.encode(), r, text=True))
    model = tmp_path / "w.caffemodel"
    model.write_bytes(fuzzing.mutate_bytes((base / "net.caffemodel").read_bytes(), r))
    assert_clean(caffe_ocl("test", "--model", net, "--weights", base / "net.caffemodel",
                           "--iterations", 1))
    assert_clean(caffe_ocl("test", "--model", base / "net.prototxt", "--weights", model,
                           "--iterations", 1))
    # snapshots go to the test's folder (cwd), whatever the mutation did
    text = (base / "solver.prototxt").read_text().replace(str(base / "snap"), "snap")
    solver = tmp_path / "solver.prototxt"
    solver.write_bytes(fuzzing.mutate_bytes(text.encode(), r, text=True))
    if not _short_run(solver):
        pytest.skip("the mutation asks for a long training run")
    assert_clean(caffe_ocl("train", "--solver", solver, cwd=tmp_path))


def _short_run(path):
    from caffe_ocl.errors import CaffeOclError
    from caffe_ocl.proto import read_solver_prototxt
    try:
        p = read_solver_prototxt(path)
    except CaffeOclError:
        return True
    return p.max_iter <= 20 and p.iter_size <= 4 and all(t <= 4 for t in p.test_iter) \
        and "/" not in p.snapshot_prefix
