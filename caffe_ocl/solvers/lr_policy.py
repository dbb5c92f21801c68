"""Learning-rate policies (Caffe's SGDSolver::GetLearningRate):
fixed, step, exp, inv, multistep, poly, sigmoid.

``learning_rate(param, iter, current_step)`` gives the rate of iteration
``iter`` (as a float32 value, as Caffe computes it in Dtype) and the
possibly advanced ``current_step`` (step / multistep keep it; snapshots
save it). ``check(param, source)`` raises SolverError for a policy or a
parameter Caffe would reject.
"""
import logging

import numpy as np

from ..errors import SolverError

log = logging.getLogger("caffe_ocl")

LR_POLICIES = ("fixed", "step", "exp", "inv", "multistep", "poly", "sigmoid")


def check(p, source):
    """The checks Caffe's solver makes on the policy's parameters."""
    if p.lr_policy not in LR_POLICIES:
        raise SolverError(f"{source}: unknown learning rate policy {p.lr_policy!r} "
                          f"(known: {', '.join(LR_POLICIES)})")
    if p.lr_policy in ("step", "sigmoid") and p.stepsize <= 0:
        raise SolverError(f"{source}: lr_policy {p.lr_policy!r} needs stepsize > 0")
    if p.lr_policy == "poly" and p.max_iter <= 0:
        raise SolverError(f"{source}: lr_policy 'poly' needs max_iter > 0")
    if p.lr_policy != "fixed" and p.gamma < 0:
        raise SolverError(f"{source}: gamma must be >= 0, got {p.gamma}")


def learning_rate(p, it, current_step):
    """(rate, current_step) at iteration ``it`` under SolverParameter ``p``."""
    pol = p.lr_policy
    if pol == "fixed":
        rate = p.base_lr
    elif pol == "step":
        current_step = it // p.stepsize
        rate = p.base_lr * p.gamma ** current_step
    elif pol == "exp":
        rate = p.base_lr * p.gamma ** it
    elif pol == "inv":
        rate = p.base_lr * (1.0 + p.gamma * it) ** (-p.power)
    elif pol == "multistep":
        if current_step < len(p.stepvalue) and it >= p.stepvalue[current_step]:
            current_step += 1
            log.info("MultiStep Status: Iteration %d, step = %d", it, current_step)
        rate = p.base_lr * p.gamma ** current_step
    elif pol == "poly":
        rate = p.base_lr * (1.0 - float(it) / p.max_iter) ** p.power
    elif pol == "sigmoid":
        rate = p.base_lr * (1.0 / (1.0 + np.exp(-p.gamma * (float(it) - p.stepsize))))
    else:
        raise SolverError(f"Unknown learning rate policy: {pol}")
    return float(np.float32(rate)), current_step
