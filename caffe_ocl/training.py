"""Training and scoring as Caffe's tools/caffe.cpp does them: the library
side of `caffe_ocl train` and `caffe_ocl test` (caffe_ocl/commands/train.py,
score.py), for Python callers too (the demo uses ``train()``).

``train(solver, weights, snapshot, gpu=..., ...)``: the solver set-up,
fine-tuning or resuming, the SIGINT/SIGHUP effects, a progress bar on a
terminal, data-parallel ranks; ``score(model, weights, iterations)``: Caffe's
``caffe test`` loop and its log lines; ``select_device(gpu_flag)``.
"""
import logging
import os
import signal
import sys
import threading
import time

import numpy as np

from . import config
from . import device as D
from . import net as N
from .device import parse_device_ids
from .errors import FlagError, SolverError, naming
from .parallel import launch as par
from .parallel.data_parallel import DataParallel
from .proto import caffe_pb2
from .solvers import read_solver, solver_class
from .solvers.solver import g_format, load_net_weights, output_loss_weights

log = logging.getLogger("caffe_ocl")

EFFECTS = ("stop", "snapshot", "none")



# --------------------------------------------------------------------------
# Signals (Caffe's SignalHandler): the handler only sets a flag; the solver
# polls it between iterations.
# --------------------------------------------------------------------------

class SignalHandler:
    def __init__(self, sigint_effect="stop", sighup_effect="snapshot"):
        for name, v in (("sigint_effect", sigint_effect), ("sighup_effect", sighup_effect)):
            if v not in EFFECTS:
                raise FlagError(f'Invalid signal effect "{v}" was specified for --{name} '
                                f"(stop, snapshot or none)")
        self.effects = {"int": sigint_effect, "hup": sighup_effect}
        self.got = {"int": False, "hup": False}
        self._old = {}

    def _handler(self, signum, frame):
        self.got["hup" if signum == getattr(signal, "SIGHUP", None) else "int"] = True

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            sigs = [signal.SIGINT] + ([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])
            for s in sigs:
                self._old[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old = {}

    def action(self):
        for k in ("int", "hup"):
            if self.got[k]:
                self.got[k] = False
                return self.effects[k]
        return "none"


# --------------------------------------------------------------------------
# Progress bar (stderr, only when it is a terminal)
# --------------------------------------------------------------------------

class _ClearLine(logging.Filter):
    def __init__(self, bar):
        super().__init__()
        self.bar = bar

    def filter(self, record):
        if self.bar.shown:
            self.bar.stream.write("\r\x1b[K")
            self.bar.shown = False
        return True


class ProgressBar:
    def __init__(self, solver, total, stream=None):
        self.solver, self.total = solver, max(int(total), 1)
        self.stream = stream or sys.stderr
        self.shown, self.last = False, 0.0
        self.filter = _ClearLine(self)
        logging.getLogger("caffe_ocl").addFilter(self.filter)

    def update(self):
        now = time.time()
        if now - self.last < 0.2:
            return
        self.last = now
        it = self.solver.iter
        frac = min(it / self.total, 1.0)
        n = int(frac * 30)
        self.stream.write(f"\r[{'=' * n}{' ' * (30 - n)}] {it}/{self.total} iters")
        self.stream.flush()
        self.shown = True

    def close(self):
        logging.getLogger("caffe_ocl").removeFilter(self.filter)
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


# --------------------------------------------------------------------------
# Device choice from --gpu / solver_mode
# --------------------------------------------------------------------------

def select_device(gpu_flag, solver_param=None):
    """Caffe: --gpu wins; else solver_mode GPU uses device_id. Only the
    first id is used (multi-device training is not supported yet)."""
    ids = parse_device_ids(gpu_flag)
    if gpu_flag.strip() == "all":
        log.info("--gpu=all: using the first OpenCL device (multi-device training is "
                 "not yet supported)")
    if not ids and solver_param is not None and solver_param.HasField("solver_mode") and \
            solver_param.solver_mode == caffe_pb2.SolverParameter.GPU:
        ids = [solver_param.device_id]
    if len(ids) > 1:
        log.warning("Several devices given (%s): multi-device training is not yet "
                    "supported; using device %d", ",".join(map(str, ids)), ids[0])
    if ids:
        want = ids[0]
        devices = D.list_devices()
        info, _ = D.choose_device(devices, want, "gpu")
        if info["is_gpu"]:
            log.info("Using GPUs %d", ids[0])
        else:     # Caffe would stop here; caffe_ocl runs on the CPU driver and says so
            log.info("No OpenCL GPU: %s asks for GPU %d; using the CPU device %s (%s)",
                     "--gpu" if parse_device_ids(gpu_flag) else "solver_mode: GPU", want,
                     info["name"], info["platform_name"])
        cur = D.current_device()
        if cur is None or cur.cl_device != info["device"]:
            D.set_mode_gpu()
            D.set_device(want)
    else:
        log.info("Use default OpenCL device (CAFFE_OCL_DEVICE to choose).")
    return ids


def stages_of(flag):
    """``--stage a,b`` -> ["a", "b"]."""
    return [s for s in (flag or "").split(",") if s]


# --------------------------------------------------------------------------
# train
# --------------------------------------------------------------------------

def train(solver_path, weights=None, snapshot=None, *, gpu="", level=0, stages=(),
          sigint_effect="stop", sighup_effect="snapshot", progress=None):
    """Train as `caffe_ocl train` does; returns the solver after solve().

    ``weights``: a .caffemodel path or comma-separated list (fine-tuning);
    ``snapshot``: a .solverstate to resume. ``progress``: None = a bar on
    stderr when stderr is a terminal."""
    if not solver_path:
        raise SolverError("Need a solver definition to train.")
    if snapshot and weights:
        raise SolverError("Give a snapshot to resume training or weights to finetune "
                          "but not both.")
    handler = SignalHandler(sigint_effect, sighup_effect)
    param = read_solver(solver_path)
    param.train_state.level = int(level)
    for s in stages:
        param.train_state.stage.append(s)
    group = par.group_for_train()         # one of N MPI ranks? (else None)
    if group is None:
        select_device(gpu or "", param)
    else:
        group.quiet_non_root()
        group.select_device(gpu or "", param)
        with group.guard():
            return _train_rank(group, param, solver_path, weights, snapshot, handler)
    if snapshot:
        del param.weights[:]
    elif weights:
        del param.weights[:]
        param.weights.append(weights)
    with naming(str(solver_path)):
        cls = solver_class(param.type)
    solver = cls(param, source=str(solver_path))
    solver.set_action_function(handler.action)
    if snapshot:
        log.info("Resuming from %s", snapshot)
        solver.restore(snapshot)
    bar = None
    if progress or (progress is None and sys.stderr.isatty()):
        bar = ProgressBar(solver, param.max_iter)
        solver.add_callback(bar.update, lambda: None)
    log.info("Starting Optimization")
    try:
        with handler:
            solver.solve()
    finally:
        if bar is not None:
            bar.close()
    log.info("Optimization Done.")
    return solver


def _train_rank(group, param, solver_path, weights, snapshot, handler):
    """One rank of data-parallel training (caffe_ocl.parallel)."""
    if snapshot:
        del param.weights[:]
    elif weights:
        del param.weights[:]
        param.weights.append(weights)
    with naming(str(solver_path)):
        cls = solver_class(param.type)
    solver = cls(param, source=str(solver_path))
    solver.set_action_function(handler.action)
    if snapshot and group.rank == 0:
        log.info("Resuming from %s", snapshot)
        solver.restore(snapshot)
    dp = DataParallel(solver, group)      # check nets, broadcast rank 0, hooks
    log.info("Starting Optimization")
    try:
        with handler:
            solver.solve()
    finally:
        dp.close()
    dp.log_stats()
    _dump_weights(solver, group)
    log.info("Optimization Done.")
    return solver


def _dump_weights(solver, group):
    """CAFFE_OCL_PARALLEL_DUMP=dir: every rank writes its final weights to
    dir/rank<r>.caffemodel (to check that ranks agree)."""
    d = config.get("PARALLEL_DUMP")
    if d:
        solver.net.save(os.path.join(d, f"rank{group.rank}.caffemodel"))


# --------------------------------------------------------------------------
# test
# --------------------------------------------------------------------------

def score(model, weights, iterations=50, *, gpu="", level=0, stages=()):
    """`caffe test`: returns (mean loss, [(output name, mean score), ...])."""
    if not model:
        raise SolverError("Need a model definition to score (--model=...).")
    if not weights:
        raise SolverError("Need model weights to score (--weights=...).")
    select_device(gpu or "")
    net = N.Net(model, phase=N.TEST, level=level, stages=stages)
    load_net_weights(net, weights)
    log.info("Running for %d iterations.", iterations)
    names = net.outputs
    scores, ids, loss = [], [], np.float32(0)
    net.mark_label_passes(lambda k: f"batch {k}")
    for i in range(iterations):
        net.forward_from_to(0, len(net.layers) - 1)
        net.check_labels()
        loss = np.float32(loss + np.float32(net.loss()))
        idx = 0
        for j, name in enumerate(names):
            for v in net.blobs[name].host_data().ravel():
                v = np.float32(v)
                if i == 0:
                    scores.append(v)
                    ids.append(j)
                else:
                    scores[idx] = np.float32(scores[idx] + v)
                log.info("Batch %d, %s = %s", i, name, g_format(v))
                idx += 1
    loss = loss / np.float32(max(iterations, 1))
    log.info("Loss: %s", g_format(loss))
    weights_of = output_loss_weights(net)
    out = []
    for s, j in zip(scores, ids):
        name = names[j]
        w = weights_of.get(name, 0.0)
        mean = np.float32(s / np.float32(iterations))
        extra = f" (* {g_format(w)} = {g_format(np.float32(w) * mean)} loss)" if w else ""
        log.info("%s = %s%s", name, g_format(mean), extra)
        out.append((name, float(mean)))
    return float(loss), out
