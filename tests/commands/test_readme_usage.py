"""README.md's "Using it" commands, run as shown from a fresh copy of the
repository (its git files only: no prepared data, no outputs of an earlier
run). The commands are read from README.md's fenced blocks marked
```sh readme-test (run in order) and ```sh readme-cifar10, so the README and
this test cannot drift.

Each command runs as ``python -m caffe_ocl ARGS`` with the copy as current
folder and first on PYTHONPATH (the copy's code, not an installed one);
CAFFE_OCL_CACHE stays the shared kernel cache (compiled kernels only). The
default run skips the commands that train (``train`` and ``test`` of its
snapshot, ~2-4 minutes on 2 cores): `-m slow` runs every command in order.
CIFAR-10 cannot be downloaded here: its ``wget`` line is replaced by a small
``cifar-10-binary.tar.gz`` in the real format (random images), the
``data cifar10`` line runs as shown, and its ``train`` line's net is built
and run on those databases by ``caffe_ocl time`` (4,000 iterations are not a
test)."""
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile

import numpy as np
import pytest

from conftest import ROOT, child_env

SLOW_COMMANDS = {"train", "test"}       # train, and the test of its snapshot


def readme_block(tag):
    """The command lines of README.md's ```sh <tag> block (comments dropped)."""
    text = (ROOT / "README.md").read_text()
    m = re.search(rf"^```sh {re.escape(tag)}\n(.*?)^```", text, re.S | re.M)
    assert m, f"README.md has no ```sh {tag} block"
    lines = []
    for line in m.group(1).splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            lines.append(line)
    return lines


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """A copy of the repository's git files (as a fresh clone has them)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    dst = tmp_path_factory.mktemp("clone")
    for f in files:
        src = ROOT / f
        if f and src.is_file():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / f)
    assert not (dst / "examples").exists()
    return dst


def run(clone, line, timeout=600):
    args = shlex.split(line)
    assert args[0] == "caffe_ocl", line
    env = child_env(root=clone)       # the clone's code, not the checkout's
    env.pop("CAFFE_OCL_MODELS", None)
    p = subprocess.run([sys.executable, "-m", "caffe_ocl", *args[1:]], cwd=clone, env=env,
                       capture_output=True, text=True, timeout=timeout)
    out = p.stdout + p.stderr
    assert p.returncode == 0, f"`{line}` exited {p.returncode}:\n{out[-3000:]}"
    return out


def check(clone, line, out):
    """What each README command must have done, beyond exiting 0."""
    args = shlex.split(line)
    cmd = args[1]
    if cmd == "data" and args[2] == "mnist":
        for db in ("mnist_train_lmdb", "mnist_test_lmdb"):
            assert (clone / "examples" / "mnist" / db / "data.mdb").is_file()
    elif cmd == "data" and args[2] == "cifar10":
        for f in ("cifar10_train_lmdb/data.mdb", "cifar10_test_lmdb/data.mdb",
                  "mean.binaryproto"):
            assert (clone / "examples" / "cifar10" / f).is_file()
    elif cmd == "train":
        assert "Optimization Done." in out
        assert (clone / "examples" / "mnist" / "lenet_iter_1000.caffemodel").is_file()
        assert not list(clone.glob("*_iter_*")), "snapshots in the clone's root"
    elif cmd == "test":
        acc = [float(v) for v in re.findall(r"\] accuracy = ([0-9.]+)", out)]
        assert acc and acc[-1] > 0.95, out[-2000:]
    elif cmd == "time":
        assert "Average Forward pass" in out and "Total Time" in out
    elif cmd == "classify":
        assert "dog" in out and "truck" in out
    elif cmd == "device_query":
        assert "chosen:" in out


def test_readme_usage_fast(clone):
    lines = readme_block("readme-test")
    assert lines[0] == "caffe_ocl data mnist"
    for line in lines:
        if shlex.split(line)[1] in SLOW_COMMANDS:
            continue
        check(clone, line, run(clone, line))
    # nothing the commands wrote is left for git to see
    status = subprocess.run(["git", "status", "--porcelain", "--ignored=no", "-uall"],
                            cwd=ROOT, capture_output=True, text=True).stdout
    assert "examples/" not in status


@pytest.mark.slow
def test_readme_usage_in_order(tmp_path_factory, clone):
    fresh = tmp_path_factory.mktemp("clone_slow")
    shutil.copytree(clone, fresh, dirs_exist_ok=True, ignore=shutil.ignore_patterns("examples"))
    for line in readme_block("readme-test"):
        check(fresh, line, run(fresh, line, timeout=1800))


def _fake_cifar_tar(path, rng, per_batch=30):
    with tarfile.open(path, "w:gz") as tar:
        for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
            rec = np.concatenate([rng.integers(0, 10, (per_batch, 1)),
                                  rng.integers(0, 256, (per_batch, 3072))], 1)
            buf = rec.astype(np.uint8).tobytes()
            info = tarfile.TarInfo(f"cifar-10-batches-bin/{name}")
            info.size = len(buf)
            tar.addfile(info, io.BytesIO(buf))


def test_readme_cifar10(clone, rng):
    lines = readme_block("readme-cifar10")
    wget, rest = lines[0], lines[1:]
    url = shlex.split(wget)[1]
    assert shlex.split(wget)[0] == "wget" and url.endswith("/cifar-10-binary.tar.gz")
    _fake_cifar_tar(clone / os.path.basename(url), rng)
    for line in rest:
        args = shlex.split(line)
        if args[1] == "train":
            from caffe_ocl.proto import read_solver_prototxt
            net = read_solver_prototxt(str(clone / args[args.index("--solver") + 1])).net
            line = f"caffe_ocl time --model {net} --iterations 1"
        check(clone, line, run(clone, line))


def test_using_it_lists_every_command_once():
    """README.md's "Using it": every command of `caffe_ocl --help` is shown
    in its code blocks, each command line once, and each command on one
    line only (train and data: one line per example they run)."""
    from caffe_ocl import commands
    text = (ROOT / "README.md").read_text()
    section = text[text.index("\n## Using it\n"):]
    section = section[:section.index("\n## ", 1)]
    lines = []
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", section, re.S | re.M):
        lines += [ln.split("#", 1)[0].strip() for ln in block.splitlines()
                  if ln.startswith("caffe_ocl ")]
    assert len(lines) == len(set(lines)), "a command line shown twice"
    shown = [shlex.split(ln)[1] for ln in lines]
    for name in commands.registry():
        assert name in shown, f"caffe_ocl {name} is not in README.md's Using it"
    twice = {n for n in shown if shown.count(n) > 1}
    assert twice <= {"train", "data"}, twice
    assert [ln for ln in lines if ln.startswith("caffe_ocl data ")] == [
        "caffe_ocl data mnist", "caffe_ocl data cifar10 --source cifar-10-binary.tar.gz"]
