"""Data-parallel training over several devices and machines, through MPI.

    mpiexec -n 4 caffe_ocl train --solver S         # one rank per device
    caffe_ocl train --solver S --gpu 0,1            # re-launches itself with mpiexec

Each rank runs a whole solver on its own device; the initial weights (or the
``--weights`` / ``--snapshot`` state) are broadcast from rank 0; each rank's
TRAIN Data layers read every ``solver_count``-th record starting at its rank
(Caffe's DataLayer::Skip); parameter gradients are summed across ranks in
buckets while the backward pass still runs and divided by the number of
ranks (Caffe's NCCL::run / on_gradients_ready), so the update is Caffe's
multi-GPU one: effective batch = ranks x batch_size. Only rank 0 logs,
tests and snapshots.

pycaffe-style use (one process per rank, started by mpiexec)::

    from caffe_ocl import parallel
    group = parallel.init()                 # MPI, solver_count/rank, device
    solver = caffe_ocl.get_solver("solver.prototxt")
    sync = parallel.DataParallel(solver, group)   # broadcast + reduction hooks
    solver.add_callback(on_start, on_gradients)   # runs after each reduction
    solver.step(100)

Nothing here imports mpi4py until a group is asked for.
"""
from .. import ranks as _state
from ..ranks import root_solver  # noqa: F401
from .comm import Group, ParallelError, init, launched_size, mpi_available  # noqa: F401
from .data_parallel import DataParallel  # noqa: F401


def set_solver_count(n):
    """pycaffe's caffe.set_solver_count (before creating the solver)."""
    _state.solver_count = int(n)


def set_solver_rank(r):
    """pycaffe's caffe.set_solver_rank (before creating the solver)."""
    _state.solver_rank = int(r)


def solver_count():
    return _state.solver_count


def solver_rank():
    return _state.solver_rank

