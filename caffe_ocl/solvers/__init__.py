"""Caffe's solvers (pycaffe names): SGDSolver, NesterovSolver, AdaGradSolver,
RMSPropSolver, AdaDeltaSolver, AdamSolver and ``get_solver(path)``, which
picks the class from the solver's ``type`` (the legacy ``solver_type`` enum
is upgraded to ``type`` when the file is read).

Layout, as Caffe's: solver.py the loop (Solver), updates.py the update
rules (SGDSolver and its subclasses), lr_policy.py the learning-rate
policies, snapshot.py snapshot/restore, param_arena.py the parameters' one
buffer.

    solver = caffe_ocl.get_solver("lenet_solver.prototxt")
    solver.step(100); solver.snapshot(); solver.solve()
"""
from ..errors import SolverError, naming
from ..proto import caffe_pb2
from .solver import Solver, read_solver  # noqa: F401
from .updates import (SOLVERS, AdaDeltaSolver, AdaGradSolver, AdamSolver,  # noqa: F401
                      NesterovSolver, RMSPropSolver, SGDSolver)


def solver_class(type_name):
    cls = SOLVERS.get(type_name)
    if cls is None:
        raise SolverError(f"Unknown solver type: {type_name!r} (known types: "
                          f"{', '.join(SOLVERS)})")
    return cls


def get_solver(path_or_param):
    """pycaffe's get_solver: a solver of the class named by ``type``."""
    if isinstance(path_or_param, caffe_pb2.SolverParameter):
        return solver_class(path_or_param.type)(path_or_param)
    param = read_solver(path_or_param)
    with naming(str(path_or_param)):       # an unknown type names the solver file
        cls = solver_class(param.type)
    return cls(param, source=str(path_or_param))


__all__ = ["Solver", "SGDSolver", "NesterovSolver", "AdaGradSolver", "RMSPropSolver",
           "AdaDeltaSolver", "AdamSolver", "get_solver", "SOLVERS"]
