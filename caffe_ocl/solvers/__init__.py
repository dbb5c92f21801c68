"""Caffe's solvers (pycaffe names): SGDSolver, NesterovSolver, AdaGradSolver,
RMSPropSolver, AdaDeltaSolver, AdamSolver and ``get_solver(path)``, which
picks the class from the solver's ``type`` (the legacy ``solver_type`` enum
is upgraded to ``type`` when the file is read).

    solver = caffe_ocl.get_solver("lenet_solver.prototxt")
    solver.step(100); solver.snapshot(); solver.solve()
"""
from ..errors import SolverError
from ..proto import caffe_pb2
from .solver import Solver, read_solver, share_trained_layers  # noqa: F401


class SGDSolver(Solver):
    kind = "SGD"


class NesterovSolver(Solver):
    kind = "Nesterov"


class AdaGradSolver(Solver):
    kind = "AdaGrad"

    def check_param(self, p):
        if p.momentum != 0:
            raise SolverError(f"{self.source}: Momentum cannot be used with AdaGrad.")


class RMSPropSolver(Solver):
    kind = "RMSProp"

    def check_param(self, p):
        if p.momentum != 0:
            raise SolverError(f"{self.source}: Momentum cannot be used with RMSProp.")
        if not 0 <= p.rms_decay < 1:
            raise SolverError(f"{self.source}: rms_decay should lie between 0 and 1, "
                              f"got {p.rms_decay}")


class AdaDeltaSolver(Solver):
    kind = "AdaDelta"
    n_history = 2


class AdamSolver(Solver):
    kind = "Adam"
    n_history = 2

    def _rate_factor(self):
        """sqrt(1 - beta2^t) / (1 - beta1^t), t = iter + 1 (AdamSolver)."""
        import numpy as np
        p, t = self.param, self.iter + 1
        b1, b2 = np.float32(p.momentum), np.float32(p.momentum2)
        return np.float32(np.sqrt(np.float32(1) - b2 ** t) / (np.float32(1) - b1 ** t))


SOLVERS = {c.kind: c for c in (SGDSolver, NesterovSolver, AdaGradSolver, RMSPropSolver,
                               AdaDeltaSolver, AdamSolver)}


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
    return solver_class(param.type)(param, source=str(path_or_param))


__all__ = ["Solver", "SGDSolver", "NesterovSolver", "AdaGradSolver", "RMSPropSolver",
           "AdaDeltaSolver", "AdamSolver", "get_solver", "SOLVERS"]
