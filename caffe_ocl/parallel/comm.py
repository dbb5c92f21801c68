"""MPI for data-parallel training: launch detection, the rank group, the
collectives the solver needs (on host float32 arrays), device choice per rank
and ending the whole job when one rank fails.

mpi4py is optional (``pip install mpi4py mpich`` brings an MPI that needs no
system packages); it is imported only when a group is created.
"""
import contextlib
import logging
import os
import socket
import sys

from .. import config
from .. import device as D
from ..errors import CaffeOclError
from .. import ranks as state

log = logging.getLogger("caffe_ocl")

# Variables the common launchers set in every rank's environment:
# MPICH/Hydra and Intel MPI (PMI_SIZE), Open MPI, MVAPICH2, PMIx launchers.
SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "PMIX_SIZE")
INSTALL_HINT = ("install MPI for Python with `pip install mpi4py mpich` (a working MPI "
                "without system packages), or build mpi4py against your cluster's MPI")


class ParallelError(CaffeOclError):
    """Data-parallel training cannot start or went wrong across ranks."""


def launched_size():
    """Number of ranks the launcher started (0: not started by mpiexec)."""
    for v in SIZE_VARS:
        s = os.environ.get(v)
        if s:
            try:
                return int(s)
            except ValueError:
                continue
    if config.get("MPI"):
        return -1          # explicitly asked for: ask MPI itself
    return 0


def mpi_available():
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return True


def _import_mpi(why):
    try:
        import mpi4py
    except ImportError:
        raise ParallelError(f"{why}, but mpi4py is not installed: {INSTALL_HINT}") from None
    mpi4py.rc.thread_level = "multiple"   # the reduction thread makes MPI calls
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError, OSError) as e:
        raise ParallelError(f"{why}, but the MPI library cannot be loaded ({e}): "
                            f"{INSTALL_HINT}") from None
    return MPI


class Group:
    """The ranks training together. ``rank``/``size`` over all machines,
    ``local_rank``/``local_size`` among the ranks on this machine."""

    def __init__(self, comm=None):
        MPI = _import_mpi("data-parallel training needs MPI")
        self.MPI = MPI
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.host = socket.gethostname()
        try:
            local = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
            self.local_rank, self.local_size = local.Get_rank(), local.Get_size()
            local.Free()
        except Exception:   # pragma: no cover - MPI-1 style libraries
            self.local_rank = int(os.environ.get("MPI_LOCALRANKID",
                                                 os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK",
                                                                self.rank)))
            self.local_size = int(os.environ.get("MPI_LOCALNRANKS",
                                                 os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE",
                                                                self.size)))
        if MPI.Query_thread() < MPI.THREAD_SERIALIZED:
            raise ParallelError("the MPI library gives no thread support "
                                "(MPI_THREAD_SERIALIZED or better is needed for the "
                                "gradient reduction thread)")
        self.thread_level = MPI.Query_thread()

    # ---- collectives on host arrays ------------------------------------------
    def allreduce_sum(self, arr):
        """In-place sum over ranks of a float32 array."""
        self.comm.Allreduce(self.MPI.IN_PLACE, arr, op=self.MPI.SUM)

    def bcast(self, arr, root=0):
        self.comm.Bcast(arr, root=root)

    def allgather(self, obj):
        return self.comm.allgather(obj)

    def barrier(self):
        self.comm.Barrier()

    def abort(self, message, code=1):
        sys.stderr.write(message.rstrip("\n") + "\n")
        sys.stderr.flush()
        self.comm.Abort(code)

    # ---- set-up of this process -----------------------------------------------
    def install(self):
        """Set Caffe's solver_count/solver_rank for the solver about to be made."""
        state.solver_count, state.solver_rank = self.size, self.rank
        return self

    def quiet_non_root(self):
        """Only rank 0 logs (Caffe: LOG_IF(INFO, Caffe::root_solver()))."""
        if self.rank != 0:
            logging.getLogger("caffe_ocl").setLevel(logging.WARNING)

    def select_device(self, gpu_flag="", solver_param=None):
        """Local rank i uses --gpu's i-th id, or CAFFE_OCL_DEVICE's i-th
        comma-separated entry, or the i-th GPU; with fewer devices than local
        ranks, devices are shared round-robin (e.g. the one CPU device)."""
        i = self.local_rank
        env = config.get("DEVICE") or ""
        if "," in env:
            entries = [e.strip() for e in env.split(",") if e.strip()]
            config.set("DEVICE", entries[i % len(entries)])
            log.info("Rank %d uses CAFFE_OCL_DEVICE=%s", self.rank, entries[i % len(entries)])
            return
        ids = [] if (gpu_flag or "").strip() == "all" else D.parse_device_ids(gpu_flag)
        if not ids and not env:
            gpus = [d["index"] for d in D.list_devices()
                    if d["is_gpu"] and not D.is_simulator(d)]
            if len(gpus) >= self.local_size:
                ids = gpus
        if ids:
            want = ids[i % len(ids)]
            log.info("Rank %d (local rank %d on %s) uses device %d", self.rank, i,
                     self.host, want)
            D.set_mode_gpu()
            D.set_device(want)
        else:
            log.info("Ranks on %s share the default OpenCL device (set --gpu or "
                     "CAFFE_OCL_DEVICE=a,b,... to give each its own)", self.host)

    @contextlib.contextmanager
    def guard(self):
        """A rank that fails ends the whole job (MPI_Abort) with a message
        naming it, instead of leaving the others blocked in a reduction."""
        try:
            yield self
        except BaseException as e:
            if self.size > 1 and not getattr(e, "collective", False):
                what = str(e) if isinstance(e, CaffeOclError) else \
                    f"{type(e).__name__}: {e}"
                self.abort(f"caffe_ocl: rank {self.rank} of {self.size} (host {self.host}, "
                           f"pid {os.getpid()}) failed: {what}\ncaffe_ocl: aborting the "
                           "whole MPI job; snapshots written so far are intact")
            raise


def init(gpu="", solver_param=None, select_device=True):
    """Create the group of ranks, set solver_count/solver_rank and pick this
    rank's device. Call before creating the solver."""
    g = Group().install()
    if select_device:
        g.select_device(gpu, solver_param)
    return g
