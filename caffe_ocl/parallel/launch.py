"""`caffe_ocl train` under MPI: decide whether this process is one rank of
a group, and turn `--gpu 0,1` on one machine into `mpiexec -n 2 ...`."""
import logging
import os
import shlex
import shutil
import subprocess
import sys

from .. import config
from ..solvers import read_solver
from .comm import INSTALL_HINT, Group, ParallelError, launched_size, mpi_available

log = logging.getLogger("caffe_ocl")

SPAWNED = "CAFFE_OCL_SPAWNED"


def group_for_train():
    """The rank group when started by mpiexec with several ranks (or with
    CAFFE_OCL_MPI=1), else None. Sets solver_count/solver_rank."""
    n = launched_size()
    if n == 0 or n == 1:
        return None
    try:
        g = Group()
    except ParallelError as e:
        raise ParallelError(f"caffe_ocl train was started as one of {n if n > 0 else 'N'} "
                            f"MPI ranks: {e}") from None
    if g.size == 1:
        return None
    return g.install()


def find_mpiexec():
    """The launcher as a command list: ``$CAFFE_OCL_MPIEXEC`` (options
    allowed, e.g. "mpirun --allow-run-as-root"), else ``mpiexec`` beside
    Python or on PATH, else ``mpirun``; None when there is none."""
    exe = (config.get("MPIEXEC") or "").strip()
    if exe:
        return shlex.split(exe)
    here = os.path.dirname(sys.executable)
    found = shutil.which("mpiexec", path=here + os.pathsep + os.environ.get("PATH", "")) \
        or shutil.which("mpirun")
    return [found] if found else None


# Open MPI's mpiexec refuses to start as root unless both are set (MPICH
# ignores them); the Docker containers GPUs are rented in run as root.
_OMPI_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def launcher_env(env=None):
    """``env`` (default: this process's) for the ``mpiexec`` that
    ``--gpu a,b`` starts: as root, with Open MPI's two run-as-root
    variables set (a user's own values kept), since the user asked
    caffe_ocl, not mpiexec, to run as root."""
    env = dict(os.environ if env is None else env)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        for k, v in _OMPI_ROOT.items():
            env.setdefault(k, v)
    return env


def _snapshot_prefix(solver_path):
    try:
        return read_solver(solver_path).snapshot_prefix
    except Exception:
        return None


def _remove_dead_ranks_partial_snapshots(solver_path):
    """Delete ``<prefix>_iter_*.tmp-<pid>`` files whose writer no longer
    runs: a rank the launcher killed while it wrote a snapshot (SIGKILL
    leaves no chance to clean up) leaves its half-written temporary file;
    the snapshots themselves are only ever renamed into place whole."""
    import glob
    import re
    prefix = _snapshot_prefix(solver_path)
    if not prefix:
        return
    for f in glob.glob(glob.escape(prefix) + "_iter_*.tmp-*"):
        m = re.search(r"\.tmp-(\d+)$", f)
        if not m:
            continue
        try:
            os.kill(int(m.group(1)), 0)
            continue                    # its writer still runs
        except ProcessLookupError:
            pass
        except OSError:
            continue                    # exists, not ours to signal
        try:
            os.unlink(f)
        except OSError:
            pass


def _last_snapshot(solver_path):
    import glob
    import re
    prefix = _snapshot_prefix(solver_path)
    if not prefix:
        return None
    found = []
    for f in glob.glob(glob.escape(prefix) + "_iter_*.solverstate*"):
        m = re.search(r"_iter_(\d+)\.solverstate(\.h5)?$", f)
        if m:
            found.append((int(m.group(1)), f))
    return max(found)[1] if found else None


def maybe_spawn(argv, gpu_ids, solver_path=None):
    """`--gpu a,b,...` in a process not started by mpiexec: re-run this
    command as ``mpiexec -n len(ids) python -m caffe_ocl train ...`` (each
    rank takes the id at its local rank). Returns the exit code, or None
    when no spawning is needed."""
    if len(gpu_ids) < 2 or launched_size() != 0 or config.get("SPAWNED"):
        return None
    n = len(gpu_ids)
    if not mpi_available():
        raise ParallelError(f"--gpu {','.join(map(str, gpu_ids))} asks for {n} devices: "
                            "multi-device training runs one process per device through "
                            f"MPI, and mpi4py is not installed: {INSTALL_HINT}")
    exe = find_mpiexec()
    if not exe:
        raise ParallelError(f"--gpu asks for {n} devices but no mpiexec was found on PATH: "
                            f"{INSTALL_HINT} (or set CAFFE_OCL_MPIEXEC)")
    cmd = exe + ["-n", str(n), sys.executable, "-m", "caffe_ocl", "train"] + list(argv)
    log.info("Starting %d ranks: %s", n, " ".join(cmd))
    env = dict(launcher_env(), **{SPAWNED: "1"})
    try:
        rc = subprocess.call(cmd, env=env)
    except KeyboardInterrupt:
        rc = 130
    if rc != 0:
        if solver_path:
            _remove_dead_ranks_partial_snapshots(solver_path)
        last = _last_snapshot(solver_path) if solver_path else None
        sys.stderr.write(
            f"caffe_ocl: {n}-rank training ended abnormally (mpiexec exit status {rc}): "
            "a rank failed or was killed and MPI stopped the others. Snapshots written "
            "so far are intact" + (f"; resume with --snapshot={last}" if last else "") +
            "\n")
        sys.stderr.flush()
    return rc
