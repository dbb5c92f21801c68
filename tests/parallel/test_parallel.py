"""Data-parallel training over MPI ranks (caffe_ocl.parallel): 2 ranks on
the CPU OpenCL device against one process with the combined batch, killed
ranks, nets that differ, missing mpi4py; record sharding and the backward
hooks in-process."""
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import caffe_ocl as caffe
from caffe_ocl import training
from caffe_ocl.data.datum import array_to_datum
from caffe_ocl.data.db import LMDBWriter
from caffe_ocl import ranks as pstate
from caffe_ocl.parallel.launch import find_mpiexec, launcher_env
from conftest import child_env

ROOT = Path(__file__).resolve().parents[2]

try:
    import mpi4py  # noqa: F401
    HAVE_MPI4PY = True
except ImportError:
    HAVE_MPI4PY = False
# the launcher caffe_ocl itself uses for --gpu a,b (CAFFE_OCL_MPIEXEC may name
# another one, with options, where the mpiexec beside Python does not match
# mpi4py's MPI, e.g. "mpirun --allow-run-as-root" on the GPU machine)
MPIEXEC_CMD = find_mpiexec() or [None]
MPIEXEC = MPIEXEC_CMD[0] and shutil.which(MPIEXEC_CMD[0])
needs_mpi = pytest.mark.skipif(not (HAVE_MPI4PY and MPIEXEC),
                               reason="needs mpi4py and mpiexec (pip install mpi4py mpich)")

N_REC, C, H, W, K = 37, 2, 3, 3, 3       # 37 records: the shards wrap unevenly

NET = """
name: "dp"
layer { name: "data" type: "Data" top: "x" top: "y"
  include { phase: TRAIN }
  data_param { source: "%(db)s" backend: LMDB batch_size: %(bs)d } }
layer { name: "data" type: "Data" top: "x" top: "y"
  include { phase: TEST }
  data_param { source: "%(db)s" backend: LMDB batch_size: 4 } }
layer { name: "ip1" type: "InnerProduct" bottom: "x" top: "h"
  inner_product_param { num_output: %(hidden)d weight_filler { type: "gaussian" std: 0.3 }
    bias_filler { type: "constant" value: 0.1 } } }
layer { name: "relu" type: "ReLU" bottom: "h" top: "h" }
layer { name: "ip2" type: "InnerProduct" bottom: "h" top: "z"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "z" bottom: "y" top: "loss" }
"""

SOLVER = """net: "%(net)s"
base_lr: 0.1
lr_policy: "step"
gamma: 0.5
stepsize: 4
momentum: 0.9
weight_decay: 0.001
max_iter: %(iters)d
display: 2
random_seed: 7
snapshot: %(snap)d
snapshot_prefix: "%(prefix)s"
%(extra)s
"""


def make_db(path, rng):
    with LMDBWriter(str(path)) as w:
        for i in range(N_REC):
            x = rng.normal(size=(C, H, W)).astype(np.float32)
            w.put(b"%08d" % i, array_to_datum(x, label=int(rng.integers(K))).SerializeToString())
    return path


def write_solver(d, name, bs, iters, snap=0, hidden=5, extra=""):
    net = d / f"{name}_net.prototxt"
    net.write_text(NET % dict(db=d / "db", bs=bs, hidden=hidden))
    s = d / f"{name}_solver.prototxt"
    s.write_text(SOLVER % dict(net=net, iters=iters, snap=snap, prefix=d / name, extra=extra))
    return s


def run_ranks(cmd, timeout=120, env=None, **kw):
    e = child_env(base=launcher_env(), PYTHONUNBUFFERED="1", **(env or {}))
    return subprocess.run(cmd, cwd=str(ROOT), env=e, capture_output=True, text=True,
                          timeout=timeout, **kw)


def weights_of(path):
    net = caffe.proto.read_net(str(path))
    return {l.name: [caffe.proto.blobproto_to_array(b) for b in l.blobs]
            for l in net.layer if len(l.blobs)}


@pytest.fixture
def workdir(tmp_path):
    make_db(tmp_path / "db", np.random.default_rng(3))
    return tmp_path


# --------------------------------------------------------------------------
# in-process: sharding and the backward hooks
# --------------------------------------------------------------------------

def _labels(solver_path, n_batches):
    s = caffe.get_solver(str(solver_path))
    out = []
    for _ in range(n_batches):
        s.net.forward()
        out.append(np.concatenate([s.net.blobs["x"].data.reshape(len(s.net.blobs["y"].data),
                                                                 -1)[:, :1],
                                   s.net.blobs["y"].data[:, None]], 1))
    for layer in s.net.layers:
        if hasattr(layer, "close"):
            layer.close()
    return out


def test_data_layer_shards_records_like_caffe(workdir):
    """Rank r of n reads records r, r+n, r+2n, ... (wrapping with the
    offset still counting, Caffe's DataLayer::Skip); together the ranks'
    batch k is the single process's batch k with n x batch_size."""
    single = _labels(write_solver(workdir, "one", 8, 1), 6)
    try:
        shards = []
        for r in range(2):
            pstate.solver_count, pstate.solver_rank = 2, r
            shards.append(_labels(write_solver(workdir, f"r{r}", 4, 1), 6))
    finally:
        pstate.solver_count, pstate.solver_rank = 1, 0
    for k in range(6):
        np.testing.assert_array_equal(shards[0][k], single[k][0::2])
        np.testing.assert_array_equal(shards[1][k], single[k][1::2])


def test_backward_hooks_see_every_layer_once_per_iteration(workdir):
    s = caffe.get_solver(str(write_solver(workdir, "h", 4, 2, extra="iter_size: 2")))
    seen = []
    s.on_backward_layer.append(seen.append)
    s.step(2)
    n = len(s.net.layers)
    assert seen == list(range(n - 1, -1, -1)) * 2     # last iter_size pass only


def test_missing_mpi4py_gives_install_hint(workdir, monkeypatch):
    from caffe_ocl import commands as cli
    from caffe_ocl.parallel import comm, launch
    monkeypatch.setattr(comm, "mpi_available", lambda: False)
    monkeypatch.setattr(launch, "mpi_available", lambda: False)
    monkeypatch.delenv("PMI_SIZE", raising=False)
    monkeypatch.delenv("OMPI_COMM_WORLD_SIZE", raising=False)
    s = write_solver(workdir, "m", 4, 1)
    import io
    import contextlib
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = cli.main(["train", f"--solver={s}", "--gpu=0,1"])
    assert rc == 1
    assert "pip install mpi4py mpich" in err.getvalue(), err.getvalue()
    # started by mpiexec with 2 ranks but without mpi4py
    monkeypatch.setenv("PMI_SIZE", "2")
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    with pytest.raises(comm.ParallelError, match="2 MPI ranks.*pip install mpi4py mpich"):
        training.train(str(s), progress=False)


# --------------------------------------------------------------------------
# 2 ranks through mpiexec
# --------------------------------------------------------------------------

def _train_ranks(workdir, n, iters, env):
    par = write_solver(workdir, f"par{n}", 4, iters)
    dump = workdir / f"dump{n}"
    dump.mkdir(exist_ok=True)
    p = run_ranks(MPIEXEC_CMD + ["-n", str(n), sys.executable, "-m", "caffe_ocl", "train",
                   f"--solver={par}"], env=dict(env, CAFFE_OCL_PARALLEL_DUMP=str(dump)))
    assert p.returncode == 0, p.stderr[-3000:]
    ranks = [weights_of(dump / f"rank{r}.caffemodel") for r in range(n)]
    for other in ranks[1:]:                              # bitwise identical on every rank
        for name in ranks[0]:
            for a, b in zip(ranks[0][name], other[name]):
                np.testing.assert_array_equal(a, b)
    return p, ranks[0], par


def _one_process(workdir, n, iters):
    s = training.train(str(write_solver(workdir, f"one{n}", 4 * n, iters)), progress=False)
    return {n_: [b.data.copy() for b in bl] for n_, bl in s.net.params.items()}


def _assert_close_and_moved(got, ref):
    moved = 0
    for name in got:
        for a, b in zip(got[name], ref[name]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
            moved += not np.allclose(a, 0.1)
    assert moved


# (reduction path, staging, bucket MB): 0 = one bucket per layer; 1e-4 MB = 26
# floats, which splits ip1's 90 weights over several buckets
PATHS = [("shm", "plain", "0"), ("shm", "hostptr", "1e-4"), ("mpi", "plain", "0"),
         ("mpi", "plain", "1e-4")]


@needs_mpi
@pytest.mark.parametrize("path,staging,bucket_mb", PATHS,
                         ids=["-".join(p) for p in PATHS])
def test_two_ranks_equal_one_process_with_double_batch(workdir, path, staging, bucket_mb):
    iters = 6
    p, r0, par = _train_ranks(workdir, 2, iters, {"CAFFE_OCL_REDUCE": path,
                                                  "CAFFE_OCL_STAGING": staging,
                                                  "CAFFE_OCL_BUCKET_MB": bucket_mb})
    assert "Data-parallel training: 2 ranks" in p.stderr
    assert f"reduction {path} (" in p.stderr
    if path == "shm":
        assert f"{staging} staging" in p.stderr
    m = re.search(r"(\d+) gradient buckets \((\w+)", p.stderr)
    # 4 learnable blobs in 2 layers: per layer -> 2 buckets of blobs; 26 floats ->
    # ranges of the parameter arena (113 floats plus alignment padding), at least 5
    if bucket_mb == "0":
        assert (int(m.group(1)), m.group(2)) == (2, "blobs"), m.group(0)
    else:
        assert int(m.group(1)) >= 5 and m.group(2) == "arena", m.group(0)
    assert "overlap" in p.stderr
    assert p.stderr.count("Optimization Done.") == 2     # rank 0 only (train + solve)
    snap = weights_of(workdir / f"par2_iter_{iters}.caffemodel")
    for name in r0:
        for a, b in zip(r0[name], snap[name]):
            np.testing.assert_array_equal(a, b)
    _assert_close_and_moved(r0, _one_process(workdir, 2, iters))
    # the solver state resumes the whole group; no file from rank 1
    assert not list(workdir.glob("par2_iter_*.tmp*"))


@needs_mpi
def test_three_ranks_shared_memory_equal_one_process(workdir):
    iters = 4
    p, r0, _ = _train_ranks(workdir, 3, iters, {"CAFFE_OCL_REDUCE": "shm",
                                                "CAFFE_OCL_BUCKET_MB": "0"})
    assert "Data-parallel training: 3 ranks" in p.stderr and "reduction shm" in p.stderr
    _assert_close_and_moved(r0, _one_process(workdir, 3, iters))


def test_sum_ranks_kernel_adds_in_rank_order():
    """The shm path's kernel: own values from the diff, the others from
    staging, summed 0..N-1 then x 1/N, exactly as float32 on the host."""
    from caffe_ocl.device import get_device
    from caffe_ocl.ops import allreduce
    import pyopencl as cl
    dev = get_device()
    rng = np.random.default_rng(0)
    n, total, off, nranks = 37, 50, 5, 3
    contrib = (rng.normal(size=(nranks, n)) * 10.0 ** rng.integers(-3, 4, (nranks, n))
               ).astype(np.float32)
    scale = np.float32(1) / np.float32(nranks)
    for me in range(nranks):
        diff = np.full(n + 3, 7.0, np.float32)
        diff[2:2 + n] = contrib[me]
        peers = np.zeros((nranks - 1, total), np.float32)
        for r in range(nranks):
            if r != me:
                peers[r if r < me else r - 1, off:off + n] = contrib[r]
        d_buf, p_buf = dev.alloc(diff.nbytes), dev.alloc(peers.nbytes)
        cl.enqueue_copy(dev.queue, d_buf, diff)
        cl.enqueue_copy(dev.queue, p_buf, peers)
        allreduce.sum_ranks(dev, n, d_buf, 2, p_buf, off, total, nranks, me,
                            scale).run(dev.queue)
        out = np.empty_like(diff)
        cl.enqueue_copy(dev.queue, out, d_buf, is_blocking=True)
        want = contrib[0]
        for r in range(1, nranks):
            want = (want + contrib[r]).astype(np.float32)
        np.testing.assert_array_equal(out[2:2 + n], (want * scale).astype(np.float32))
        np.testing.assert_array_equal(out[:2], 7.0)
        np.testing.assert_array_equal(out[2 + n:], 7.0)
    x = rng.normal(size=20).astype(np.float32)
    buf = dev.alloc(x.nbytes)
    cl.enqueue_copy(dev.queue, buf, x)
    allreduce.scale(dev, 10, buf, 0.5, off=4).run(dev.queue)
    out = np.empty_like(x)
    cl.enqueue_copy(dev.queue, out, buf, is_blocking=True)
    np.testing.assert_array_equal(out[4:14], x[4:14] * np.float32(0.5))
    np.testing.assert_array_equal(out[:4], x[:4])
    np.testing.assert_array_equal(out[14:], x[14:])


@needs_mpi
def test_gpu_list_spawns_ranks_and_resume(workdir):
    """`--gpu 0,0` (two ranks sharing the CPU device) re-launches through
    mpiexec; `--snapshot` resumes both ranks from rank 0's state (the data
    readers start again from the first record, as Caffe's)."""
    par = write_solver(workdir, "g", 4, 4, snap=2)
    p = run_ranks([sys.executable, "-m", "caffe_ocl", "train", f"--solver={par}",
                   "--gpu=0,0"])
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Data-parallel training: 2 ranks" in p.stderr
    assert (workdir / "g_iter_4.caffemodel").exists()
    dump = workdir / "dump"
    dump.mkdir()
    state = workdir / "g_iter_2.solverstate"
    p = run_ranks(MPIEXEC_CMD + ["-n", "2", sys.executable, "-m", "caffe_ocl", "train",
                   f"--solver={par}", f"--snapshot={state}"],
                  env={"CAFFE_OCL_PARALLEL_DUMP": str(dump)})
    assert p.returncode == 0, p.stderr[-3000:]
    got = weights_of(workdir / "g_iter_4.caffemodel")
    r1 = weights_of(dump / "rank1.caffemodel")
    s = training.train(str(write_solver(workdir, "one", 8, 4)), snapshot=str(state),
                        progress=False)
    for name in got:
        for b, c, ref in zip(got[name], r1[name], s.net.params[name]):
            np.testing.assert_array_equal(b, c)
            np.testing.assert_allclose(b, ref.data, rtol=1e-5, atol=1e-6)


@needs_mpi
def test_ranks_that_disagree_on_the_net(workdir):
    a = write_solver(workdir, "a", 4, 2)
    b = write_solver(workdir, "b", 4, 2, hidden=6)
    p = run_ranks(MPIEXEC_CMD + ["-n", "1", sys.executable, "-m", "caffe_ocl", "train",
                   f"--solver={a}", ":", "-n", "1", sys.executable, "-m", "caffe_ocl",
                   "train", f"--solver={b}"], timeout=90)
    assert p.returncode != 0
    assert "ranks disagree on the net: rank 1 differs from rank 0" in p.stderr
    assert "'ip1'" in p.stderr


def _rank_pids(pattern):
    pids = []
    for x in subprocess.run(["pgrep", "-f", pattern], capture_output=True,
                            text=True).stdout.split():
        try:
            with open(f"/proc/{x}/environ", "rb") as f:
                env = f.read()
            if b"PMI_RANK=" in env or b"OMPI_COMM_WORLD_RANK=" in env:
                pids.append(int(x))
        except OSError:
            pass
    return pids


@needs_mpi
def test_killed_rank_ends_the_job_and_snapshots_stay_intact(workdir):
    par = write_solver(workdir, "k", 4, 100000, snap=3)
    e = child_env(base=launcher_env(), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "caffe_ocl", "train", f"--solver={par}",
                             "--gpu=0,0"], cwd=str(ROOT), env=e,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not (workdir / "k_iter_6.solverstate").exists():
            time.sleep(0.2)
        assert (workdir / "k_iter_6.solverstate").exists(), "training did not reach iter 6"
        ranks = _rank_pids(f"caffe_ocl train --solver={par}")
        assert len(ranks) == 2, ranks
        os.kill(ranks[-1], signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode != 0
    # the launcher's own report: MPICH's Hydra, or Open MPI's mpirun
    assert any(m in out + err for m in ("BAD TERMINATION", "exited on signal",
                                        "noticed that process rank")), (out + err)[-2000:]
    assert "2-rank training ended abnormally" in err and "Snapshots written so far are " \
        "intact; resume with --snapshot=" in err, err[-2000:]
    assert not _rank_pids(f"caffe_ocl train --solver={par}")   # no rank left behind
    # every snapshot that exists is complete and loads
    states = sorted(workdir.glob("k_iter_*.solverstate"))
    assert states
    for st in states:
        model = st.with_suffix(".caffemodel")
        assert weights_of(model)["ip1"][0].shape == (5, C * H * W)
    assert not list(workdir.glob("*.tmp*"))


def test_dead_ranks_partial_snapshots_removed(workdir):
    """After a multi-rank job ends abnormally the launcher deletes the
    temporary files of snapshots whose writer was killed mid-write (no
    chance to clean up under SIGKILL); a live writer's file, finished
    snapshots and other files stay. (CI once found such a file after
    test_killed_rank_ends_the_job_and_snapshots_stay_intact.)"""
    from caffe_ocl.parallel import launch
    par = write_solver(workdir, "t", 4, 10, snap=3)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead, alive = gone.pid, os.getpid()
    files = {f"t_iter_9.solverstate.tmp-{dead}": False,
             f"t_iter_9.caffemodel.tmp-{dead}": False,
             f"t_iter_9.solverstate.tmp-{alive}": True,
             "t_iter_6.solverstate": True, "t_iter_6.caffemodel": True,
             f"other_iter_9.solverstate.tmp-{dead}": True}
    for name in files:
        (workdir / name).write_bytes(b"x")
    launch._remove_dead_ranks_partial_snapshots(str(par))
    assert {n: (workdir / n).exists() for n in files} == files


def test_spawned_mpiexec_may_run_as_root(monkeypatch):
    """As root, the mpiexec that `--gpu a,b` starts gets Open MPI's two
    run-as-root variables (Open MPI refuses root without them: every
    --gpu run in a root container failed); a user's own values are kept,
    and other users' environments are left alone."""
    from caffe_ocl.parallel import launch
    monkeypatch.setattr(launch.os, "geteuid", lambda: 0)
    env = launch.launcher_env({"PATH": "/bin", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "0"})
    assert env == {"PATH": "/bin", "OMPI_ALLOW_RUN_AS_ROOT": "1",
                   "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "0"}
    monkeypatch.setattr(launch.os, "geteuid", lambda: 1000)
    assert launch.launcher_env({"PATH": "/bin"}) == {"PATH": "/bin"}

    seen = {}
    monkeypatch.setattr(launch.os, "geteuid", lambda: 0)
    monkeypatch.setattr(launch, "mpi_available", lambda: True)
    monkeypatch.setattr(launch, "find_mpiexec", lambda: ["mpiexec"])
    monkeypatch.setattr(launch, "launched_size", lambda: 0)
    monkeypatch.setattr(launch.subprocess, "call",
                        lambda cmd, env: seen.update(cmd=cmd, env=env) or 0)
    assert launch.maybe_spawn(["--solver=s.prototxt", "--gpu=0,1"], [0, 1]) == 0
    assert seen["cmd"][:3] == ["mpiexec", "-n", "2"]
    assert seen["env"]["OMPI_ALLOW_RUN_AS_ROOT"] == "1"
    assert seen["env"]["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    assert seen["env"][launch.SPAWNED] == "1"
