"""Process-wide data-parallel state (Caffe's ``Caffe::solver_count()`` /
``Caffe::solver_rank()``), with no imports so layers and solvers can read it.

``solver_count`` is the number of solvers training together (MPI ranks) and
``solver_rank`` this process's place among them; both are set by
``caffe_ocl.parallel`` (``mpiexec ... caffe_ocl train`` or
``parallel.set_solver_count`` / ``set_solver_rank`` from Python) *before* the
solver is created: the TRAIN-phase Data layers shard their records by them
and only rank 0 builds test nets, tests and snapshots.
"""

solver_count = 1
solver_rank = 0
multiprocess = False     # pycaffe's set_multiprocess: ranks are processes (train.py)


def root_solver():
    return solver_rank == 0
