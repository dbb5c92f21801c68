"""The update rules (Caffe's sgd_solver.cpp, nesterov_solver.cpp,
adagrad_solver.cpp, rmsprop_solver.cpp, adadelta_solver.cpp,
adam_solver.cpp): ``SGDSolver`` holds the history blobs and the bound
update, gradient-clearing and clipping launches (one fused kernel per
learnable blob, kernels/solvers.cl, or one launch over the parameter arena,
solvers/param_arena.py); the other rules are SGDSolver subclasses, as in
Caffe and pycaffe, that name their rule (``kind``, a key of
``ops.solver.SOLVER_KINDS``) and check their parameters as Caffe's
constructors do.
"""
import logging

import numpy as np

from ..blob import Blob, refresh_kept
from ..errors import SolverError
from ..ops import pointwise
from ..ops import solver as sops
from .solver import Solver, g_format

log = logging.getLogger("caffe_ocl")


class SGDSolver(Solver):
    """Caffe's SGDSolver: momentum SGD, and the base of every other rule."""
    kind = "SGD"
    n_history = 1        # history blobs per learnable param

    def setup_update(self):
        """History blobs and the bound update/clip launches."""
        net, dev = self.net, self.dev
        params = net.graph.learnable_params
        self.history = [Blob(b.shape, name=f"history[{i}]", device=dev)
                        for k in range(self.n_history) for i, b in enumerate(params)]
        self._history_arenas = []
        if self._arena is not None:
            index = {id(b): i for i, b in enumerate(params)}
            for k in range(self.n_history):
                buf, subs = self._arena.companion()
                self._history_arenas.append(buf)
                for b, sub in zip(self._arena.blobs, subs):
                    self.history[k * len(params) + index[id(b)]].data_mem.adopt_buffer(sub)
        for h in self.history:
            h.data_mem.zero_device()
        self._clip_buf = dev.alloc(8)
        pointwise.fill(dev, self._clip_buf, 2, 1.0)
        self._build_param_launches()

    def _build_param_launches(self):
        """The update, gradient-clearing and clipping launches, bound to the
        parameters' current buffers: one launch each over the arena
        (caffe_ocl/solvers/param_arena.py) when there is one, else one per blob."""
        p, net, dev = self.param, self.net, self.dev
        params = net.graph.learnable_params
        self._updates, self._lr_mults, self._clears = [], [], []
        accum_norm = float(np.float32(1) / np.float32(p.iter_size))
        momentum, momentum2, delta = p.momentum, p.momentum2, p.delta
        if self.kind == "RMSProp":
            momentum2 = p.rms_decay
        nparams = len(params)
        decays = []
        for i, (b, lr_mult, decay_mult) in enumerate(zip(params, net.graph.params_lr,
                                                         net.graph.params_weight_decay)):
            local_decay = float(np.float32(p.weight_decay) * np.float32(decay_mult))
            self._lr_mults.append(np.float32(lr_mult))
            decays.append(local_decay)
            if self._arena is not None:      # the arena's two launches serve all
                continue
            reg = p.regularization_type if local_decay else None
            h = self.history[i]
            h2 = self.history[i + nparams] if self.n_history > 1 else h
            self._updates.append(sops.update(
                dev, self.kind, b.count, b.data_buffer(), b.diff_buffer(), h.data_buffer(),
                h2.data_buffer(), self._clip_buf, accum_norm=accum_norm,
                local_decay=local_decay, reg=reg, clip=p.clip_gradients >= 0,
                momentum=momentum, momentum2=momentum2, delta=delta))
            self._clears.append(pointwise.fill_launch(dev, b.diff_buffer(), b.count, 0.0))
        self._clip_launches = []
        if p.clip_gradients >= 0 and params:
            total = sum(sops.sumsq_groups(dev, b.count) for b in params)
            self._partials = dev.alloc(4 * total)
            off = 0
            for b in params:
                self._clip_launches.append(sops.sumsq_partial(dev, b.count, b.diff_buffer(),
                                                              self._partials, off))
                off += sops.sumsq_groups(dev, b.count)
            self._clip_launches.append(sops.clip_scale(dev, total, self._partials,
                                                       self._clip_buf, p.clip_gradients))
        if self._arena is not None:
            a = self._arena
            self._lr_mults_buf = dev.alloc(4 * len(params))
            self._decays = dev.alloc(4 * len(params))
            dev.upload(self._lr_mults_buf, np.asarray(self._lr_mults, np.float32))
            dev.upload(self._decays, np.asarray(decays, np.float32))
            h2 = self._history_arenas[1] if self.n_history > 1 else self._history_arenas[0]
            self._update_all = sops.update_blocks(
                dev, self.kind, a.nblocks, a.blocks, self._lr_mults_buf, self._decays, a.data,
                a.diff, self._history_arenas[0], h2, self._clip_buf, accum_norm=accum_norm,
                reg=p.regularization_type if any(decays) else None,
                clip=p.clip_gradients >= 0, momentum=momentum, momentum2=momentum2,
                delta=delta)
            self._clear_all = sops.fill_blocks(dev, a.nblocks, a.blocks, a.diff, 0.0)

    def _arena_ok(self):
        """Whether the one-launch path applies; a parameter that left the
        arena (a pycaffe reshape gave it new storage) ends it for good."""
        if self._arena is None:
            return False
        if self._arena.valid():
            return True
        log.info("A parameter blob left the parameter arena: per-blob updates from now on")
        self._arena = None
        self._build_param_launches()
        return False

    def _rate_factor(self):
        """Extra factor on local_rate (Adam's bias correction)."""
        return np.float32(1)

    # ---- the update ------------------------------------------------------------
    def apply_update(self):
        """SGDSolver::ApplyUpdate: lr, clip, normalize, regularize, update,
        Net::Update -- all in device kernels."""
        p = self.param
        rate = self.get_learning_rate()
        display = p.display and self.iter % p.display == 0
        if display:
            log.info("Iteration %d, lr = %s", self.iter, g_format(rate))
        q = self.dev.queue
        params = self.net.graph.learnable_params
        for b in params:
            b.data_mem.to_device()
            b.diff_mem.to_device()
        for h in self.history:
            h.data_mem.to_device()
        for launch in self._clip_launches:
            launch.run(q)
        factor = self._rate_factor()
        if self._arena_ok():
            # the kernel forms (rate * lr_mult) * factor in float32, as below
            self._update_all.set_arg(sops.ARG_BLOCKS_RATE, np.float32(rate))
            self._update_all.set_arg(sops.ARG_BLOCKS_FACTOR, np.float32(factor))
            self._update_all.run(q)
        else:
            for launch, mult in zip(self._updates, self._lr_mults):
                launch.set_arg(sops.ARG_LOCAL_RATE, np.float32(rate) * mult * factor)
                launch.run(q)
        for b in params:
            b.data_mem.device_written()
            b.diff_mem.device_written()
        for h in self.history:
            h.data_mem.device_written()
        refresh_kept()          # arrays Python keeps show the new values
        if display and self._clip_launches:
            out = np.empty(2, np.float32)
            self.dev.download(out, self._clip_buf)
            if out[1] > p.clip_gradients:
                log.info("Gradient clipping: scaling down gradients (L2 norm %s > %s) by "
                         "scale factor %s", g_format(out[1]), g_format(p.clip_gradients), g_format(out[0]))

    def clear_param_diffs(self):
        q = self.dev.queue
        if self._arena_ok():
            self._clear_all.run(q)
            for b in self.net.graph.learnable_params:
                b.diff_mem.device_written()
            return
        for launch, b in zip(self._clears, self.net.graph.learnable_params):
            launch.run(q)
            b.diff_mem.device_written()


class NesterovSolver(SGDSolver):
    kind = "Nesterov"


class AdaGradSolver(SGDSolver):
    kind = "AdaGrad"

    def check_param(self, p):
        if p.momentum != 0:
            raise SolverError(f"{self.source}: Momentum cannot be used with AdaGrad.")


class RMSPropSolver(SGDSolver):
    kind = "RMSProp"

    def check_param(self, p):
        if p.momentum != 0:
            raise SolverError(f"{self.source}: Momentum cannot be used with RMSProp.")
        if not 0 <= p.rms_decay < 1:
            raise SolverError(f"{self.source}: rms_decay should lie between 0 and 1, "
                              f"got {p.rms_decay}")


class AdaDeltaSolver(SGDSolver):
    kind = "AdaDelta"
    n_history = 2


class AdamSolver(SGDSolver):
    kind = "Adam"
    n_history = 2

    def _rate_factor(self):
        """sqrt(1 - beta2^t) / (1 - beta1^t), t = iter + 1 (AdamSolver)."""
        p, t = self.param, self.iter + 1
        b1, b2 = np.float32(p.momentum), np.float32(p.momentum2)
        return np.float32(np.sqrt(np.float32(1) - b2 ** t) / (np.float32(1) - b1 ** t))


SOLVERS = {c.kind: c for c in (SGDSolver, NesterovSolver, AdaGradSolver, RMSPropSolver,
                               AdaDeltaSolver, AdamSolver)}
